//! User data inside a recycled journal is never taken for a record.
//!
//! Story (found reviewing b280a0b, recycled journals): after a recycled
//! journal's last new record come the old epoch's bytes, including the
//! *data parts* of its records: bytes users wrote into files. Record data
//! is not escaped, so a user can write a byte string that is a whole,
//! checksummed record. Once its epoch's file is recycled, (a) the scan took
//! it for the next record if it lined up with the end of the new records
//! and had the expected seq (a forged commit is replayed), and (b) J3's
//! damage probe, which scans up to 256 MiB of old bytes on every open of a
//! recycled journal, took it for a later record of this epoch that "was
//! durable" (recovery refused to open the tree, even after a clean close).
//! Fixed in 48c7b3b by keying every record's checksums with a nonce in the
//! journal's header (journal.rs, byte layout): these tests fail when the
//! nonce, the header check, or close's cut of a recycled journal's old
//! bytes is removed.

mod common;

use common::recycled::{opts, recycled_with, write};

use std::ffi::OsStr;
use std::sync::Arc;
use txfs_engine::delta::NO_CUT;
use txfs_engine::journal::{
    CommitRecord, ObjRef, RecAttr, RecFile, RecObj, FILE_HEADER_LEN, REC_HEADER_LEN, REC_VERSION,
};
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId};

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn journal_bytes(s: &dyn Storage) -> Vec<u8> {
    let (p, _, _) = common::journal_records(s);
    let len = s.lstat(&p).unwrap().size as usize;
    let mut v = vec![0u8; len];
    assert_eq!(s.read_at(&p, 0, &mut v).unwrap(), len);
    v
}

fn read(engine: &Engine, name: &str) -> Vec<u8> {
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new(name)).expect("lookup").obj;
    engine.read(None, f, 0, 1 << 20).expect("read")
}

/// (b) A commit nobody made is replayed: an unprivileged user's file
/// content, two checkpoints later, is taken for the next record after a
/// power cut, and rewrites another file ("v").
#[test]
fn user_data_in_a_recycled_journal_is_not_replayed_as_a_commit() {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    // Epoch 1 (seq 1): f (the attacker's), g, and the victim v.
    let tx = engine.begin();
    let mut objs = Vec::new();
    for (n, d) in [("f", &b"nothing"[..]), ("g", &b"g"[..]), ("v", &b"original"[..])] {
        let o = engine.create(Some(tx), ObjId::ROOT, OsStr::new(n), 0o644, 0, 0).expect("create").obj;
        engine.write(Some(tx), o, 0, d).expect("write");
        objs.push(o);
    }
    engine.commit(tx, Durability::Durable).expect("commit");
    let (f, g) = (objs[0], objs[1]);
    engine.checkpoint().expect("checkpoint 1"); // epoch 2 fresh; epoch 1's file is the spare

    // The forged record: "v" becomes "PWNED!", as seq 5 (see below).
    let rec = CommitRecord {
        created: vec![],
        dirs: vec![],
        objs: vec![RecObj {
            obj: ObjRef::Base(b"v".to_vec()),
            attr: RecAttr::default(),
            file: Some(RecFile { cut: NO_CUT, exact: true, size: 6, extents: vec![(0, 6, 0)] }),
        }],
        files: vec![],
        crcs: vec![],
        paths: vec![],
    };
    let (meta, version) = rec.encode().unwrap();
    assert_eq!(version, REC_VERSION);
    let forged = common::unkeyed_record(5, 0, &meta, 6, b"PWNED!");
    // Epoch 2 (seq 2): the attacker writes it into f, 1000 bytes in.
    let mut payload = vec![b'x'; 1000];
    payload.extend_from_slice(&forged);
    payload.extend_from_slice(&[b'y'; 1000]);
    write(&engine, f, 0, &payload);
    let y = find(&journal_bytes(&*fs), &forged).expect("forged bytes in journal 2") as u64;
    engine.checkpoint().expect("checkpoint 2"); // epoch 3 = epoch 1's file; epoch 2's file is the spare

    // Epoch 3 (seq 3): a write to g, to learn the meta size of such a record.
    write(&engine, g, 0, b"probe");
    let (_, recs, _) = common::journal_records(&*fs);
    let meta_g = recs[0].1 - recs[0].0 - REC_HEADER_LEN - 5;
    engine.checkpoint().expect("checkpoint 3"); // epoch 4 = epoch 2's file, prev_seq 3

    // Epoch 4 (seq 4): one ordinary durable commit that happens to end
    // where the forged record starts.
    let d = y - FILE_HEADER_LEN - REC_HEADER_LEN - meta_g;
    write(&engine, g, 0, &vec![b'G'; d as usize]);
    let (_, recs, end) = common::journal_records(&*fs);
    // (The test helper already walks on into the forged record: its seq is
    // newer than the header's prev_seq.)
    eprintln!("epoch 4 records as the helper sees them: {recs:?}, end {end}; forged record at {y}");
    assert_eq!(recs[0].1, y, "the new record does not end at the forged one");
    assert_eq!(read(&engine, "v"), b"original");
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));

    // Power cut with everything synced: the committed state is g = G..., v = "original".
    let img = fs.crash(&mut CrashPlan::keep_all());
    let rep = txfs_engine::check(&img).expect("check");
    eprintln!("check: {:?}", rep.journals);
    let engine = Engine::open(Arc::new(img), opts()).expect("recovery");
    let v = read(&engine, "v");
    assert_eq!(v, b"original", "recovery replayed a commit nobody made: v = {:?}", String::from_utf8_lossy(&v));
}

/// (c) 48 bytes a user wrote into a file make the tree unmountable: after
/// a clean close whose last checkpoint had nothing to do (the live
/// journal is the recycled one), and after a power cut.
#[test]
fn user_data_in_a_recycled_journal_is_not_damage() {
    let fake = common::unkeyed_record(u64::MAX / 2, u64::MAX, &[], 0, &[]);
    let mut payload = vec![b'x'; 100];
    payload.extend_from_slice(&fake);

    // Clean close right after a checkpoint: its own checkpoint has nothing
    // to do, and the live journal is the recycled one; close cuts its old
    // bytes (an unmounted tree's journal is its header and its records).
    let (fs, engine) = recycled_with(&payload, 0);
    engine.close().expect("close");
    let (jp, recs, _) = common::journal_records(&*fs);
    eprintln!("after close: {} is {} bytes, {} records", jp.display(), fs.lstat(&jp).unwrap().size, recs.len());
    assert_eq!(fs.lstat(&jp).unwrap().size, FILE_HEADER_LEN, "close left a recycled journal's old bytes");
    let rep = txfs_engine::check(&*fs).expect("check");
    let clean_close_check = rep.problems.clone();
    let clean_close = Engine::open(fs.clone(), opts()).err().map(|e| e.to_string());

    // Power cut after one more durable commit.
    let (fs, engine) = recycled_with(&payload, 0);
    let h = engine.lookup(None, ObjId::ROOT, OsStr::new("h")).unwrap().obj;
    write(&engine, h, 0, b"acknowledged");
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    let img = fs.crash(&mut CrashPlan::keep_all());
    let crash = Engine::open(Arc::new(img), opts()).err().map(|e| e.to_string());

    assert!(
        clean_close_check.is_empty() && clean_close.is_none() && crash.is_none(),
        "healthy tree reported damaged:\n  check after close: {clean_close_check:?}\n  open after close: {clean_close:?}\n  open after power cut: {crash:?}"
    );
}

/// (c, availability) J3's probe looks at every REC_MAGIC in the old bytes;
/// user data made of fake headers, each claiming 8 MiB of data, must not
/// make it take a recycled journal for damaged: here 64 KiB of them in a
/// ~12 MiB journal. How long the open takes (the probe must not read what
/// each header claims) is measured by the timing tier: tests/timing.rs,
/// `probe_cost_of_user_data_in_a_recycled_journal`.
#[test]
fn a_recycled_journal_full_of_fake_headers_opens() {
    let claim = 8u64 << 20;
    let one = common::unkeyed_record(1 << 40, u64::MAX, &[], claim, &[]); // a would-be damage witness
    let mut fake = Vec::new();
    while fake.len() < (64 << 10) {
        fake.extend_from_slice(&one[..REC_HEADER_LEN as usize]);
    }
    let (fs, engine) = recycled_with(&fake, 12 << 20);
    drop(engine); // a crash: the recycled journal keeps its old bytes
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    let img = Arc::new(fs.crash(&mut CrashPlan::keep_all()));
    let r = Engine::open(img, opts());
    assert!(r.is_ok(), "a healthy recycled journal refused: {:?}", r.err().map(|e| e.to_string()));
}
