//! Recycled journals (journal.rs, "Recycled journals"): a checkpoint keeps
//! the journal it retires as `.txfs/journal-spare`, and the next epoch's
//! journal is that file with a new header, so the bytes after the new
//! epoch's last record are the old epoch's. These tests build journals
//! whose old records line up exactly where the next new record is
//! expected, then crash, tear and damage them.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::journal::{FILE_HEADER_LEN, REC_HEADER_LEN, REC_MAGIC};
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, META_DIR};

fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

fn spare() -> std::path::PathBuf {
    Path::new(META_DIR).join("journal-spare")
}

fn write_f(engine: &Engine, f: ObjId, byte: u8) {
    let tx = engine.begin();
    engine.write(Some(tx), f, 0, &[byte; 4096]).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
}

fn content(engine: &Engine) -> u8 {
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup f");
    let d = engine.read(None, f.obj, 0, 4096).expect("read f");
    assert!(d.iter().all(|b| *b == d[0]), "f is not one byte repeated");
    d[0]
}

fn open_content(img: MemFs, ctx: &str) -> u8 {
    let engine = Engine::open(Arc::new(img), opts()).unwrap_or_else(|e| panic!("{ctx}: recovery failed: {e}"));
    content(&engine)
}

/// `txfs check` finds no damage after a power cut that keeps everything,
/// and that cut and `seeds` random ones all recover f = `want`.
fn recovers_to(fs: &CrashFs, want: char, seeds: u64, ctx: &str) {
    let img = fs.crash(&mut CrashPlan::keep_all());
    let rep = txfs_engine::check(&img).expect("check");
    assert!(rep.problems.is_empty(), "{ctx}: check reports damage: {:?}", rep.problems);
    assert_eq!(open_content(img, ctx) as char, want, "{ctx}: keep_all");
    for seed in 0..seeds {
        let c = format!("{ctx}: power cut CrashPlan::random({seed})");
        assert_eq!(open_content(fs.crash(&mut CrashPlan::random(seed)), &c) as char, want, "{c}");
    }
}

/// Epoch 1: f = 'A' (created, checkpointed). Epoch 2: 'B'..'E', four records
/// of one size. Epoch 3 (epoch 1's file): 'F'. Epoch 4 (epoch 2's file):
/// 'G', 'H' — after them lies epoch 2's third record, exactly where a
/// third record of epoch 4 would start. No close: the journal stays.
fn fixture() -> (CrashFs, Vec<u64>) {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).expect("create").obj;
    engine.write(Some(tx), f, 0, &[b'A'; 4096]).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
    let mut sizes = Vec::new();
    let jlen = |fs: &CrashFs| {
        let (p, _, _) = common::journal_records(fs);
        fs.lstat(&p).expect("journal").size
    };
    engine.checkpoint().expect("checkpoint 1");
    assert!(fs.lstat(&spare()).is_ok(), "the retired journal of epoch 1 is not kept as the spare");
    for b in *b"BCDE" {
        write_f(&engine, f, b);
    }
    sizes.push(jlen(&fs));
    engine.checkpoint().expect("checkpoint 2");
    write_f(&engine, f, b'F');
    engine.checkpoint().expect("checkpoint 3");
    // Epoch 4's journal is epoch 2's file: as long, before any record.
    let (jp, recs, _) = common::journal_records(&*fs);
    assert!(recs.is_empty(), "a new epoch starts with no record of its own: {recs:?}");
    assert_eq!(fs.lstat(&jp).unwrap().size, sizes[0], "epoch 4 did not reuse epoch 2's journal");
    write_f(&engine, f, b'G');
    write_f(&engine, f, b'H');
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    (fs, sizes)
}

#[test]
fn old_records_after_the_last_new_one_end_the_journal() {
    let (fs, _) = fixture();
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, recs, end) = common::journal_records(&img);
    assert_eq!(recs.len(), 2, "{recs:?}");
    // The scenario: a whole old record starts right where a third new
    // record would, with an older sequence number. The writer zeros the
    // rest of the last record's page (journal.rs, DataSink::finish), which
    // wipes the start of epoch 2's third record there; so epoch 2's fourth
    // record (one record length further, whole) is put where a third new
    // one would start, as a crash that kept only the old page would leave it.
    let len = recs[1].1 - recs[1].0;
    let mut old = vec![0u8; len as usize];
    img.read_at(&jp, end + len, &mut old).unwrap();
    assert_eq!(
        u32::from_le_bytes(old[0..4].try_into().unwrap()),
        REC_MAGIC,
        "epoch 2's fourth record at {}",
        end + len
    );
    let mut zeros = [1u8; 16];
    img.read_at(&jp, end, &mut zeros).unwrap();
    assert!(zeros.iter().all(|b| *b == 0), "zeros after the last record, to its page's end");
    img.write_at(&jp, end, &old).unwrap();
    let fs = CrashFs::new(img);
    // Every commit was acknowledged durable: any power cut keeps them all.
    recovers_to(&fs, 'H', 40, "healthy recycled journal");
}

#[test]
fn a_torn_last_record_in_a_recycled_journal_is_cut_not_damage() {
    let (fs, _) = fixture();
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (_, recs, _) = common::journal_records(&img);
    let (start, end) = recs[1];
    drop(img);
    // Old records after the torn one say "durable up to" offsets of their
    // own epoch, past the tear: they must not make it look like damage.
    for off in [0, 9, 20, REC_HEADER_LEN + 3, (end - start) / 2, end - start - 1] {
        let ctx = format!("byte {off} of the last record flipped");
        let img = fs.crash(&mut CrashPlan::keep_all());
        let (jp, _, _) = common::journal_records(&img);
        let mut b = [0u8; 1];
        img.read_at(&jp, start + off, &mut b).unwrap();
        b[0] ^= 0x80;
        img.write_at(&jp, start + off, &b).unwrap();
        assert_eq!(open_content(img, &ctx) as char, 'G', "{ctx}");
    }
    // Damage before a later new record that says it was durable is still
    // damage.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, _, _) = common::journal_records(&img);
    let (s0, _) = recs[0];
    let mut b = [0u8; 1];
    img.read_at(&jp, s0 + REC_HEADER_LEN + 5, &mut b).unwrap();
    b[0] ^= 0x01;
    img.write_at(&jp, s0 + REC_HEADER_LEN + 5, &b).unwrap();
    match Engine::open(Arc::new(img), opts()) {
        Err(txfs_engine::Error::Corrupt { .. }) => {}
        Ok(e) => panic!("damage to the first of two durable records recovered to {:?}", content(&e) as char),
        Err(e) => panic!("expected Error::Corrupt, got {e}"),
    }
}

#[test]
fn a_spare_that_names_the_live_journal_after_a_crash_is_not_reused() {
    // A rename cut short by a power cut can leave the spare's name and the
    // journal's on one file (ext4 commits both directories' changes in one
    // transaction, but a copy or another file system may not). Recovery
    // must drop the spare before anything writes a header into it.
    let (fs, _) = fixture();
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, _, _) = common::journal_records(&img);
    let _ = img.unlink(&spare());
    img.link(&jp, &spare()).expect("link");
    let fs = Arc::new(CrashFs::new(img));
    let engine = Engine::open(fs.clone(), opts()).expect("recovery");
    assert_eq!(content(&engine) as char, 'H');
    // Opening checkpointed the replayed records: the live journal is a new
    // epoch's, and a spare (the retired one) may exist, but never as another
    // name of the live journal, whose records the next checkpoint would
    // overwrite with a new header and then with new records while it still
    // reads them.
    let (live, _, _) = common::journal_records(&*fs);
    let live_ino = fs.lstat(&live).expect("live journal").ino;
    if let Ok(m) = fs.lstat(&spare()) {
        assert_ne!(m.ino, live_ino, "the spare is the live journal {}", live.display());
    }
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup").obj;
    for (i, b) in b"IJKL".iter().enumerate() {
        write_f(&engine, f, *b);
        if i % 2 == 1 {
            engine.checkpoint().expect("checkpoint");
        }
    }
    write_f(&engine, f, b'M');
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    let img = fs.crash(&mut CrashPlan::keep_all());
    let rep = txfs_engine::check(&img).expect("check");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(open_content(img, "after recovery and two checkpoints") as char, 'M');
}

#[test]
fn close_leaves_no_spare() {
    let (fs, _) = fixture();
    let img = fs.crash(&mut CrashPlan::keep_all());
    let fs = Arc::new(CrashFs::new(img));
    let engine = Engine::open(fs.clone(), opts()).expect("recovery");
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup").obj;
    write_f(&engine, f, b'I');
    engine.checkpoint().expect("checkpoint");
    write_f(&engine, f, b'J');
    assert!(fs.lstat(&spare()).is_ok(), "a running engine keeps a spare after its checkpoints");
    engine.close().expect("close");
    assert!(fs.lstat(&spare()).is_err(), "close left the spare journal behind");
    let (jp, recs, _) = common::journal_records(&*fs);
    assert!(recs.is_empty());
    assert_eq!(fs.lstat(&jp).unwrap().size, FILE_HEADER_LEN, "close's checkpoint started a fresh journal");
    // ...keyed, like every journal this version writes.
    let mut h = [0u8; 8];
    fs.read_at(&jp, 0, &mut h).unwrap();
    assert_eq!(&h, txfs_engine::journal::FILE_MAGIC_KEYED, "close left an unkeyed journal");
    // And this binary goes on from it.
    let engine = Engine::open(fs.clone(), opts()).expect("reopen");
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup").obj;
    write_f(&engine, f, b'K');
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    assert_eq!(open_content(fs.crash(&mut CrashPlan::keep_all()), "after reopen") as char, 'K');
}

/// A tree last closed by a version without the nonce holds an empty
/// `TXFSJNL1` journal. Recovery keys it before anything is appended, so no
/// epoch after an upgrade writes unkeyed records.
#[test]
fn an_empty_unkeyed_journal_from_an_older_version_is_keyed_at_mount() {
    // An older version's clean close: an empty unkeyed journal of the epoch.
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).expect("create").obj;
    engine.write(Some(tx), f, 0, &[b'A'; 4096]).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
    engine.close().expect("close");
    let (jp, _, _) = common::journal_records(&*fs);
    let mut h = [0u8; FILE_HEADER_LEN as usize];
    fs.read_at(&jp, 0, &mut h).unwrap();
    let epoch = txfs_engine::Epoch(u64::from_le_bytes(h[8..16].try_into().unwrap()));
    let prev = txfs_engine::Seq(u64::from_le_bytes(h[16..24].try_into().unwrap()));
    fs.write_at(&jp, 0, &txfs_engine::journal::file_header(epoch, prev, 0)).unwrap();
    // An older version wrote no high-water mark either.
    fs.unlink(&txfs_engine::mark_path()).unwrap();
    let mut m = [0u8; 8];
    fs.read_at(&jp, 0, &mut m).unwrap();
    assert_eq!(&m, txfs_engine::journal::FILE_MAGIC);

    let engine = Engine::open(fs.clone(), opts()).expect("mount after the upgrade");
    fs.read_at(&jp, 0, &mut m).unwrap();
    assert_eq!(&m, txfs_engine::journal::FILE_MAGIC_KEYED, "the mount went on with an unkeyed journal");
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup f").obj;
    write_f(&engine, f, b'B');
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    recovers_to(&fs, 'B', 20, "after the upgrade");
}

/// `txfs check` after a kill (the page cache kept everything) of a mount
/// whose journal was recycled: the old bytes after the last record are
/// told apart from a torn tail (issue 28: "torn tail (bad record magic)"
/// after ordinary kills made that message meaningless); garbage after the
/// records of a journal that was never recycled is still a torn tail.
#[test]
fn check_tells_a_recycled_journals_old_bytes_from_a_torn_tail() {
    let (fs, _) = fixture();
    let img = fs.crash(&mut CrashPlan::keep_all());
    let rep = txfs_engine::check(&img).expect("check");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let (at, why) = rep.journals[0].cut.clone().expect("old bytes follow the records");
    assert!(why.starts_with(txfs_engine::journal::STALE_END), "at {at}: {why}");
    assert_eq!(open_content(img, "recycled") as char, 'H');
    // The last record's magic flipped: damage or a tear of this epoch's
    // record (its seq is the next one), not old bytes, though old records
    // follow.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, recs, _) = common::journal_records(&img);
    let mut b = [0u8; 1];
    img.read_at(&jp, recs[1].0, &mut b).unwrap();
    img.write_at(&jp, recs[1].0, &[b[0] ^ 1]).unwrap();
    let rep = txfs_engine::check(&img).expect("check");
    let (_, why) = rep.journals[0].cut.clone().expect("a torn tail");
    assert!(!why.starts_with(txfs_engine::journal::STALE_END), "{why}");

    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).expect("create").obj;
    engine.write(Some(tx), f, 0, &[b'A'; 4096]).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
    write_f(&engine, f, b'B');
    drop(engine);
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, _, end) = common::journal_records(&img);
    img.write_at(&jp, end + 100, &[0x5a; 3000]).unwrap();
    let rep = txfs_engine::check(&img).expect("check");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let (_, why) = rep.journals[0].cut.clone().expect("a torn tail");
    assert!(!why.starts_with(txfs_engine::journal::STALE_END), "{why}");
}
