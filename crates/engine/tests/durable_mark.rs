//! The durable high-water mark (`.txfs/mark`, log/mark.rs; issue 28,
//! "nothing lost silently"): a journal that lost commits the mark says were
//! durable — truncated at a record boundary or inside a record, deleted, an
//! epoch-1 journal cut to 0 or 16 bytes, replaced — is refused by `check`
//! and recovery instead of being cut or started afresh; `accept_loss` goes
//! on with what survives; recovery keeps data files it cannot account for
//! in `.txfs/lost+found/`; a final checkpoint that failed is reported.

mod common;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, Error, ObjId, Options, META_DIR};

fn opts() -> Options {
    Options { flush_interval: None, idle_checkpoint: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

fn accept() -> Options {
    Options { accept_loss: true, ..opts() }
}

fn set(engine: &Engine, name: &str, data: &[u8]) {
    let tx = engine.begin();
    let f = match engine.lookup(Some(tx), ObjId::ROOT, OsStr::new(name)) {
        Ok(a) => a.obj,
        Err(_) => engine.create(Some(tx), ObjId::ROOT, OsStr::new(name), 0o644, 0, 0).expect("create").obj,
    };
    engine.truncate(Some(tx), f, 0).expect("truncate");
    engine.write(Some(tx), f, 0, data).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
}

fn get(engine: &Engine, name: &str) -> Option<Vec<u8>> {
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new(name)).ok()?.obj;
    Some(engine.read(None, f, 0, 1 << 26).expect("read"))
}

/// A backing killed (no close) after `n` durable commits of f = "v1".."vn",
/// the mark written after the last one; returns the image as a kill leaves
/// it, and the journal's records.
fn killed_after(n: usize) -> (MemFs, PathBuf, Vec<(u64, u64)>) {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    for i in 1..=n {
        set(&engine, "f", format!("v{i}").as_bytes());
    }
    engine.write_mark().expect("mark");
    drop(engine);
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, recs, _) = common::journal_records(&img);
    assert_eq!(recs.len(), n);
    (img, jp, recs)
}

fn refused(img: MemFs, ctx: &str) -> MemFs {
    let rep = txfs_engine::check(&img).expect("check");
    assert!(!rep.problems.is_empty(), "{ctx}: check finds nothing");
    let img = Arc::new(img);
    match Engine::open(img.clone(), opts()) {
        Err(Error::Lost(why)) => assert!(why.contains("seq") || why.contains("journal"), "{ctx}: {why}"),
        Err(e) => panic!("{ctx}: refused, but not as a loss: {e}"),
        Ok(_) => panic!("{ctx}: recovery went on without the lost commits"),
    }
    Arc::try_unwrap(img).unwrap_or_else(|_| panic!("engine holds the fs"))
}

/// After `accept_loss`, the backing opens without it again, and `check` is clean.
fn accepted(img: MemFs, want: Option<&[u8]>, ctx: &str) -> MemFs {
    let img = Arc::new(img);
    let engine = Engine::open(img.clone(), accept()).unwrap_or_else(|e| panic!("{ctx}: accept_loss: {e}"));
    assert!(!engine.accepted_losses().is_empty(), "{ctx}: nothing said about the loss");
    assert_eq!(get(&engine, "f").as_deref(), want, "{ctx}: what survives");
    set(&engine, "g", b"after");
    engine.close().expect("close");
    let rep = txfs_engine::check(&*img).expect("check");
    assert!(rep.problems.is_empty(), "{ctx}: after accept_loss: {:?}", rep.problems);
    let engine = Engine::open(img.clone(), opts()).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
    assert_eq!(get(&engine, "g").as_deref(), Some(&b"after"[..]), "{ctx}");
    drop(engine);
    Arc::try_unwrap(img).unwrap_or_else(|_| panic!("engine holds the fs"))
}

#[test]
fn a_journal_truncated_at_a_record_boundary_is_refused() {
    for keep in [0, 1, 5, 9] {
        let (img, jp, recs) = killed_after(10);
        let at = if keep == 0 { txfs_engine::journal::FILE_HEADER_LEN } else { recs[keep - 1].1 };
        img.set_len(&jp, at).unwrap();
        let img = refused(img, &format!("cut after {keep} records"));
        let want = (keep > 0).then(|| format!("v{keep}").into_bytes());
        accepted(img, want.as_deref(), &format!("cut after {keep} records"));
    }
}

#[test]
fn a_journal_truncated_inside_a_record_is_refused() {
    for rec in [0, 4, 9] {
        let (img, jp, recs) = killed_after(10);
        let (start, end) = recs[rec];
        img.set_len(&jp, start + (end - start) / 2).unwrap();
        let img = refused(img, &format!("cut inside record {rec}"));
        let want = (rec > 0).then(|| format!("v{rec}").into_bytes());
        accepted(img, want.as_deref(), &format!("cut inside record {rec}"));
    }
}

#[test]
fn an_epoch_1_journal_cut_to_0_or_16_bytes_is_refused() {
    for len in [0, 16] {
        let (img, jp, _) = killed_after(3);
        assert!(jp.ends_with("0000000000000001"), "{}", jp.display());
        img.set_len(&jp, len).unwrap();
        let img = refused(img, &format!("cut to {len} bytes"));
        accepted(img, None, &format!("cut to {len} bytes"));
    }
}

#[test]
fn a_deleted_journal_is_refused_and_its_data_files_are_kept() {
    // One staged file (a data file the record names) among the commits.
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let o = Options { stage_threshold: 64 << 10, ..opts() };
    let engine = Engine::open(fs.clone(), o.clone()).expect("open");
    set(&engine, "f", b"v1");
    engine.checkpoint().expect("checkpoint");
    let big: Vec<u8> = (0..200u32 << 10).map(|i| (i % 251) as u8).collect();
    set(&engine, "big", &big);
    set(&engine, "f", b"v2");
    engine.write_mark().expect("mark");
    drop(engine);
    let img = fs.crash(&mut CrashPlan::keep_all());
    let data = Path::new(META_DIR).join("data");
    assert_eq!(img.read_dir(&data).unwrap().len(), 1, "the staged file");
    let (jp, _, _) = common::journal_records(&img);
    img.unlink(&jp).unwrap();
    let img = refused(img, "journal deleted");
    assert_eq!(img.read_dir(&data).unwrap().len(), 1, "a refused recovery changed data/");
    let img = accepted(img, Some(b"v1"), "journal deleted");
    let lf = txfs_engine::lost_found();
    let kept = img.read_dir(&lf).expect("lost+found");
    assert_eq!(kept.len(), 1, "{kept:?}");
    let mut got = vec![0u8; big.len() + 1];
    let n = img.read_at(&lf.join(&kept[0].0), 0, &mut got).unwrap();
    assert!(got[..n] == big[..], "the kept data file is not the staged bytes");
    let rep = txfs_engine::check(&img).expect("check");
    assert_eq!(rep.lost_found.len(), 1, "check names what is kept");
}

#[test]
fn a_replaced_journal_or_a_damaged_mark_is_refused() {
    // The journal file of the mark's epoch replaced by another (new nonce).
    let (img, jp, _) = killed_after(3);
    let mut h = [0u8; 32];
    img.read_at(&jp, 0, &mut h).unwrap();
    let epoch = txfs_engine::Epoch(u64::from_le_bytes(h[8..16].try_into().unwrap()));
    img.set_len(&jp, 0).unwrap();
    img.write_at(&jp, 0, &txfs_engine::journal::file_header(epoch, txfs_engine::Seq(0), 0x1234_5678)).unwrap();
    let img = refused(img, "replaced journal");
    accepted(img, None, "replaced journal");

    // Both slots of the mark damaged.
    let (img, _, _) = killed_after(3);
    let m = txfs_engine::mark_path();
    img.write_at(&m, 20, &[0xff]).unwrap();
    img.write_at(&m, 4096 + 20, &[0xff]).unwrap();
    assert!(!txfs_engine::check(&img).unwrap().problems.is_empty());
    assert!(matches!(Engine::open(Arc::new(img), opts()), Err(Error::Lost(_))));
    // One slot damaged, either one: the other is a true mark (older, or the
    // latest).
    for slot in [0u64, 4096] {
        let (img, _, _) = killed_after(3);
        img.write_at(&m, slot + 20, &[0xff]).unwrap();
        let rep = txfs_engine::check(&img).unwrap();
        assert!(rep.problems.is_empty(), "slot at {slot}: {:?}", rep.problems);
        let engine = Engine::open(Arc::new(img), opts()).expect("one slot left");
        assert_eq!(get(&engine, "f").as_deref(), Some(&b"v3"[..]));
    }
}

/// Without the mark (a backing of an older version), a truncated journal
/// reads as before, and the first open writes a mark.
#[test]
fn a_backing_without_a_mark_opens_and_gets_one() {
    let (img, jp, recs) = killed_after(4);
    img.unlink(&txfs_engine::mark_path()).unwrap();
    img.set_len(&jp, recs[1].1).unwrap();
    let img = Arc::new(img);
    let engine = Engine::open(img.clone(), opts()).expect("open without a mark");
    assert_eq!(get(&engine, "f").as_deref(), Some(&b"v2"[..]));
    assert!(img.lstat(&txfs_engine::mark_path()).is_ok(), "no mark written at the first open");
}

/// A mark that lags (commits after it) never refuses a journal that holds
/// everything: every power cut of a run whose mark lags recovers.
#[test]
fn a_lagging_mark_refuses_no_power_cut() {
    let fs = Arc::new(CrashFs::with_persistence(MemFs::new(), txfs_engine::storage::Persistence::Conservative));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    for i in 1..=6 {
        set(&engine, "f", format!("v{i}").as_bytes());
        if i % 2 == 0 {
            engine.write_mark().expect("mark");
        }
        if i == 3 {
            engine.checkpoint().expect("checkpoint");
        }
    }
    let tx = engine.begin();
    let f = engine.lookup(Some(tx), ObjId::ROOT, OsStr::new("f")).unwrap().obj;
    engine.write(Some(tx), f, 0, b"v7").unwrap();
    engine.commit(tx, Durability::Ordered).unwrap();
    drop(engine);
    for seed in 0..200 {
        let img = fs.crash(&mut CrashPlan::random(seed));
        let rep = txfs_engine::check(&img).expect("check");
        assert!(rep.problems.is_empty(), "seed {seed}: {:?}", rep.problems);
        let e = Engine::open(Arc::new(img), opts()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let v = get(&e, "f").unwrap();
        assert!(v == b"v6" || v == b"v7", "seed {seed}: {}", String::from_utf8_lossy(&v));
    }
}

/// A data file no record names, left by a crash whose journal verifies
/// against the mark and was not cut (an uncommitted transaction's spill),
/// is accounted for and removed; one left where a torn tail was cut may
/// hold a lost commit's bytes and is kept.
#[test]
fn recovery_deletes_only_the_data_files_it_can_account_for() {
    let o = Options { stage_threshold: 64 << 10, ..opts() };
    let big: Vec<u8> = vec![7u8; 100 << 10];
    // An uncommitted transaction's staged file.
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), o.clone()).expect("open");
    set(&engine, "f", b"v1");
    let tx = engine.begin();
    let g = engine.create(Some(tx), ObjId::ROOT, OsStr::new("g"), 0o644, 0, 0).unwrap().obj;
    engine.write(Some(tx), g, 0, &big).unwrap();
    engine.write_mark().expect("mark");
    drop(engine);
    let img = Arc::new(fs.crash(&mut CrashPlan::keep_all()));
    let data = Path::new(META_DIR).join("data");
    assert_eq!(img.read_dir(&data).unwrap().len(), 1);
    let e = Engine::open(img.clone(), o.clone()).expect("recover");
    drop(e);
    assert!(img.read_dir(&data).unwrap().is_empty());
    assert!(img.read_dir(&txfs_engine::lost_found()).is_err(), "an uncommitted transaction's file kept");

    // A committed staged file whose record is then torn (the commit's
    // record header damaged: a torn tail): its data file is kept.
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), o.clone()).expect("open");
    set(&engine, "f", b"v1");
    engine.write_mark().expect("mark");
    set(&engine, "g", &big);
    drop(engine);
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jp, recs, _) = common::journal_records(&img);
    let (start, end) = recs[1];
    img.set_len(&jp, end - 1).unwrap();
    let _ = start;
    let img = Arc::new(img);
    let e = Engine::open(img.clone(), o).expect("a torn tail past the mark is cut");
    assert_eq!(get(&e, "g"), None);
    drop(e);
    let kept = img.read_dir(&txfs_engine::lost_found()).expect("lost+found");
    assert_eq!(kept.len(), 1, "{kept:?}");
}

/// A storage whose `syncfs` fails once armed: the final checkpoint fails.
struct FailingSyncfs {
    inner: Arc<MemFs>,
    armed: Arc<AtomicBool>,
}

impl Storage for FailingSyncfs {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, open_file);
    fn sync_all(&self) -> io::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_all()
    }
}

#[test]
fn a_failed_final_checkpoint_is_reported_by_check_until_recovered() {
    let mem = Arc::new(MemFs::new());
    let armed = Arc::new(AtomicBool::new(false));
    let fs = Arc::new(FailingSyncfs { inner: mem.clone(), armed: armed.clone() });
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    set(&engine, "f", b"v1");
    armed.store(true, Ordering::SeqCst);
    assert!(engine.shutdown().is_err(), "the final checkpoint did not fail");
    drop(engine);
    let rep = txfs_engine::check(&*mem).expect("check");
    assert!(
        rep.problems.iter().any(|p| p.contains("final checkpoint failed")),
        "check says nothing of the failed checkpoint: {:?}",
        rep.problems
    );
    armed.store(false, Ordering::SeqCst);
    let engine = Engine::open(fs, opts()).expect("recover");
    assert_eq!(get(&engine, "f").as_deref(), Some(&b"v1"[..]));
    engine.close().expect("close");
    let rep = txfs_engine::check(&*mem).expect("check");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}
