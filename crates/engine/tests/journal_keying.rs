//! Journal keying across shutdown and remount: every journal a mount
//! writes is keyed (its records' checksums carry the nonce of its header),
//! shutdown cuts and keeps the keyed journal rather than leave an unkeyed
//! one, recovery keys an older version's empty unkeyed journal, and the
//! spare space reserved for commits survives ENOSPC races.
//!
//! Written as a review of 8997dfa, 48c7b3b and 21a1438 (spare space, keyed
//! journals, the unkeyed journal left by shutdown). The first two tests
//! demonstrated defects of 21a1438 (they failed on it; fixed in 7cf5c5d:
//! shutdown keeps the keyed journal, cut, and recovery keys an older
//! version's empty journal); the others check properties that were found
//! to hold.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use txfs_engine::journal::{file_header, FILE_MAGIC_KEYED, REC_HEADER_LEN};
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, Epoch, Error, ObjId, Options, Seq};

fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

fn magic(s: &dyn Storage) -> [u8; 8] {
    let (jp, _, _) = common::journal_records(s);
    let mut h = [0u8; 8];
    s.read_at(&jp, 0, &mut h).unwrap();
    h
}

fn write(engine: &Engine, f: ObjId, data: &[u8]) -> txfs_engine::Result<()> {
    let tx = engine.begin();
    engine.write(Some(tx), f, 0, data)?;
    engine.commit(tx, Durability::Durable)
}

fn lookup(engine: &Engine, name: &str) -> ObjId {
    engine.lookup(None, ObjId::ROOT, OsStr::new(name)).expect("lookup").obj
}

fn read(engine: &Engine, name: &str) -> Vec<u8> {
    engine.read(None, lookup(engine, name), 0, 1 << 20).expect("read")
}

fn unwrap_fs(fs: Arc<CrashFs>) -> CrashFs {
    Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"))
}

/// A tree with "f" and "h"; if `remount`, cleanly closed and opened again
/// (21a1438 left an unkeyed TXFSJNL1 journal there; now it is keyed like
/// every other), else left in its first, keyed epoch.
fn setup(remount: bool) -> (Arc<CrashFs>, Engine) {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    for n in ["f", "h"] {
        let o = engine.create(Some(tx), ObjId::ROOT, OsStr::new(n), 0o644, 0, 0).expect("create").obj;
        engine.write(Some(tx), o, 0, b"before").expect("write");
    }
    engine.commit(tx, Durability::Durable).expect("commit");
    if !remount {
        return (fs, engine);
    }
    engine.close().expect("close");
    let engine = Engine::open(fs.clone(), opts()).expect("reopen");
    (fs, engine)
}

/// Story (21a1438 reopened what 48c7b3b closed; fixed in 7cf5c5d):
/// shutdown left an unkeyed journal, and the next mount appended to it
/// unkeyed until its first checkpoint. A user's file content that is a
/// whole unkeyed record claiming durability was then again taken by J3's
/// probe for "a later durable record" when that user's own commit was torn
/// by a power cut (header not yet written): mount and `txfs check` refused
/// a healthy tree.
/// The same commit in a keyed epoch is cut as a torn tail.
#[test]
fn user_data_cannot_fake_damage_in_the_epoch_after_a_remount() {
    let fake = common::unkeyed_record(u64::MAX / 2, u64::MAX, &[], 0, &[]);
    let mut payload = vec![b'x'; 5000];
    payload.extend_from_slice(&fake);
    payload.extend_from_slice(&[b'y'; 5000]);
    let mut outcome = Vec::new();
    for remount in [false, true] {
        let mut refused = Vec::new();
        let mut torn_cases = 0;
        for k in 0..100u64 {
            let (fs, engine) = setup(remount);
            assert_eq!(&magic(&*fs), FILE_MAGIC_KEYED, "remount={remount}: an unkeyed journal");
            let f = lookup(&engine, "f");
            // The process dies (power cut) k mutating calls into the commit.
            fs.set_fail_after(Some(k));
            let committed = write(&engine, f, &payload).is_ok();
            drop(engine);
            let fs = unwrap_fs(fs);
            if committed {
                break;
            }
            torn_cases += 1;
            let img = fs.crash(&mut CrashPlan::keep_all());
            let rep = txfs_engine::check(&img).expect("check");
            match Engine::open(Arc::new(img), opts()) {
                // Before, or the whole commit (its record was whole when the process died).
                Ok(e) => {
                    let got = read(&e, "f");
                    assert!(got == b"before" || got == payload, "k={k}: f is neither")
                }
                Err(e) => refused.push(format!("k={k}: open: {e}; check: {:?}", rep.problems)),
            }
        }
        assert!(torn_cases > 0);
        outcome.push((remount, refused));
    }
    for (remount, refused) in &outcome {
        eprintln!("remounted (unkeyed journal) = {remount}: {} refusals", refused.len());
        for r in refused {
            eprintln!("   {r}");
        }
    }
    assert!(outcome[0].1.is_empty(), "keyed epoch: a torn commit refused");
    assert!(
        outcome[1].1.is_empty(),
        "after a clean unmount and remount, a torn commit of a user's file content makes the tree unmountable"
    );
}

/// Story (21a1438; fixed in 7cf5c5d): plain_empty_journal renamed its new
/// file over the live journal and only then synced the folders; if a sync fails, it
/// returns the error with the engine still appending to the old file,
/// which no name reaches any more. `shutdown` says "later operations still
/// work": commits acknowledged durable after it go to the unlinked file
/// and are lost at the next power cut.
#[test]
fn a_failed_shutdown_leaves_the_engine_writing_the_live_journal() {
    let mut lost = Vec::new();
    let mut tried = 0;
    for k in 0..40u64 {
        let fs = Arc::new(CrashFs::new(MemFs::new()));
        let engine = Engine::open(fs.clone(), opts()).expect("open");
        let tx = engine.begin();
        let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).expect("create").obj;
        engine.write(Some(tx), f, 0, b"A").expect("write");
        engine.commit(tx, Durability::Durable).expect("commit");
        engine.checkpoint().expect("checkpoint");
        fs.set_fail_after(Some(k));
        let r = engine.shutdown();
        fs.set_fail_after(None);
        if r.is_ok() {
            break;
        }
        // Shutdown failed (an fsync error, say); the engine goes on.
        if write(&engine, f, b"B").is_err() {
            continue; // poisoned: nothing acknowledged
        }
        tried += 1;
        drop(engine);
        let fs = unwrap_fs(fs);
        for (name, mut plan) in [("keep_all", CrashPlan::keep_all()), ("drop_all", CrashPlan::drop_all())] {
            let img = fs.crash(&mut plan);
            let got = match Engine::open(Arc::new(img), opts()) {
                Ok(e) => String::from_utf8_lossy(&read(&e, "f")).into_owned(),
                Err(e) => format!("open failed: {e}"),
            };
            if got != "B" {
                lost.push(format!("shutdown failed at call {k} ({r:?}), {name}: f = {got:?}"));
            }
        }
    }
    assert!(tried > 0);
    for l in &lost {
        eprintln!("{l}");
    }
    assert!(lost.is_empty(), "an acknowledged durable commit after a failed shutdown was lost");
}

/// (3) Commits racing shutdown from other threads, then more commits after
/// it, then crashes: every acknowledged durable commit survives, and the
/// recovered state is one of the acknowledged values or a later one.
#[test]
fn commits_racing_and_after_shutdown_survive() {
    for round in 0..20u64 {
        let fs = Arc::new(CrashFs::new(MemFs::new()));
        let engine = Arc::new(Engine::open(fs.clone(), opts()).expect("open"));
        let mut objs = Vec::new();
        for i in 0..3 {
            let tx = engine.begin();
            let o = engine.create(Some(tx), ObjId::ROOT, OsStr::new(&format!("f{i}")), 0o644, 0, 0).unwrap().obj;
            engine.write(Some(tx), o, 0, &1u64.to_le_bytes()).unwrap();
            engine.commit(tx, Durability::Durable).unwrap();
            objs.push(o);
        }
        // Recycle: two checkpoints with commits, so the live journal is a spare.
        for _ in 0..2 {
            write(&engine, objs[0], &1u64.to_le_bytes()).unwrap();
            engine.checkpoint().unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Vec<_> = (0..3)
            .map(|i| {
                let (e, stop, o) = (engine.clone(), stop.clone(), objs[i]);
                std::thread::spawn(move || {
                    let mut n = 1u64;
                    while !stop.load(Ordering::Relaxed) && n < 200 {
                        n += 1;
                        let d = if i == 2 { Durability::Ordered } else { Durability::Durable };
                        let tx = e.begin();
                        e.write(Some(tx), o, 0, &n.to_le_bytes()).unwrap();
                        e.commit(tx, d).unwrap();
                    }
                    n
                })
            })
            .collect();
        if round % 2 == 0 {
            std::thread::yield_now();
        }
        engine.shutdown().expect("shutdown");
        stop.store(true, Ordering::Relaxed);
        let last: Vec<u64> = acked.into_iter().map(|h| h.join().unwrap()).collect();
        engine.sync().unwrap();
        // Later operations still work, through a checkpoint.
        write(&engine, objs[1], &1000u64.to_le_bytes()).unwrap();
        if round % 3 == 0 {
            engine.checkpoint().unwrap();
            write(&engine, objs[1], &1001u64.to_le_bytes()).unwrap();
        }
        let want1 = if round % 3 == 0 { 1001 } else { 1000 };
        drop(Arc::try_unwrap(engine).ok().expect("engine shared"));
        let fs = unwrap_fs(fs);
        for seed in 0..8u64 {
            let img = fs.crash(&mut CrashPlan::random(round * 100 + seed));
            let rep = txfs_engine::check(&img).expect("check");
            assert!(rep.problems.is_empty(), "{:?}", rep.problems);
            let e = Engine::open(Arc::new(img), opts()).expect("recovery");
            let v = |n: &str| u64::from_le_bytes(read(&e, n)[..8].try_into().unwrap());
            assert_eq!(v("f0"), last[0], "round {round} seed {seed}");
            assert_eq!(v("f1"), want1, "round {round} seed {seed}");
            assert_eq!(v("f2"), last[2], "round {round} seed {seed} (synced after)");
        }
    }
}

/// (2) Header parsing: TXFSJNL2 with nonce 0 is refused (mount and check);
/// TXFSJNL1 with junk in 28..32 reads as before (unkeyed, records kept);
/// J3 still reports damage before a later durable record in TXFSJNL1.
#[test]
fn journal_headers_parse_and_unkeyed_journals_keep_j3() {
    // A remounted tree with two durable records, rewritten as an older
    // version would have written them: TXFSJNL1, checksums unkeyed.
    let (fs, engine) = setup(true);
    let f = lookup(&engine, "f");
    let h = lookup(&engine, "h");
    write(&engine, f, &[b'1'; 3000]).unwrap();
    write(&engine, h, &[b'2'; 3000]).unwrap();
    drop(engine);
    let keyed = unwrap_fs(fs);
    let base = keyed.crash(&mut CrashPlan::keep_all());
    let (jp, recs, _) = common::journal_records(&base);
    assert_eq!(recs.len(), 2);
    let mut hdr = [0u8; 32];
    base.read_at(&jp, 0, &mut hdr).unwrap();
    assert_eq!(&hdr[0..8], FILE_MAGIC_KEYED);
    let epoch = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
    let prev = u64::from_le_bytes(hdr[16..24].try_into().unwrap());
    base.write_at(&jp, 0, &file_header(Epoch(epoch), Seq(prev), 0)).unwrap();
    for &(start, end) in &recs {
        let mut r = vec![0u8; (end - start) as usize];
        base.read_at(&jp, start, &mut r).unwrap();
        r[44..48].fill(0);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&r[0..40]), &r[REC_HEADER_LEN as usize..]);
        r[40..44].copy_from_slice(&crc.to_le_bytes());
        base.write_at(&jp, start, &r[..REC_HEADER_LEN as usize]).unwrap();
    }
    // An older version wrote no high-water mark either.
    base.unlink(&txfs_engine::mark_path()).unwrap();
    let fs = CrashFs::new(base);
    assert!(txfs_engine::check(&fs.crash(&mut CrashPlan::keep_all())).unwrap().problems.is_empty());

    // TXFSJNL1, bytes 28..32 non-zero: unkeyed as before.
    let img = fs.crash(&mut CrashPlan::keep_all());
    img.write_at(&jp, 28, &0xdead_beefu32.to_le_bytes()).unwrap();
    assert!(txfs_engine::check(&img).unwrap().problems.is_empty());
    let e = Engine::open(Arc::new(img), opts()).expect("TXFSJNL1 with junk in its reserved word");
    assert_eq!(read(&e, "h"), vec![b'2'; 3000]);

    // TXFSJNL2 with nonce 0 (checksum right for that format): refused.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let mut k = file_header(Epoch(epoch), Seq(prev), 1);
    k[28..32].copy_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&k[0..24]), &k[28..32]);
    k[24..28].copy_from_slice(&crc.to_le_bytes());
    img.write_at(&jp, 0, &k).unwrap();
    assert!(!txfs_engine::check(&img).unwrap().problems.is_empty());
    assert!(matches!(Engine::open(Arc::new(img), opts()), Err(Error::Corrupt { .. })));

    // TXFSJNL1: damage in the first record, the second says durable past it.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let mut b = [0u8; 1];
    let at = recs[0].0 + REC_HEADER_LEN + 100;
    img.read_at(&jp, at, &mut b).unwrap();
    b[0] ^= 1;
    img.write_at(&jp, at, &b).unwrap();
    assert!(!txfs_engine::check(&img).unwrap().problems.is_empty());
    assert!(matches!(Engine::open(Arc::new(img), opts()), Err(Error::Corrupt { .. })));
    // ...and damage in its last record is a cut, as before.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let at = recs[1].0 + REC_HEADER_LEN + 100;
    img.read_at(&jp, at, &mut b).unwrap();
    b[0] ^= 1;
    img.write_at(&jp, at, &b).unwrap();
    let e = Engine::open(Arc::new(img), opts()).expect("cut");
    assert_eq!(read(&e, "h"), b"before");
}

/// (3) Crash at every step of shutdown (power cut after k mutating calls):
/// recovery opens, `check` is clean, and the state is the committed one.
#[test]
fn a_crash_at_every_step_of_shutdown_recovers() {
    for k in 0..60u64 {
        let (fs, engine) = setup(false);
        let f = lookup(&engine, "f");
        write(&engine, f, b"last11").unwrap();
        engine.checkpoint().unwrap();
        write(&engine, f, b"last22").unwrap();
        engine.checkpoint().unwrap(); // the live journal is now recycled
        fs.set_fail_after(Some(k));
        let done = engine.shutdown().is_ok();
        drop(engine);
        let fs = unwrap_fs(fs);
        for seed in 0..6u64 {
            let mut plan = if seed == 0 { CrashPlan::keep_all() } else { CrashPlan::random(k * 31 + seed) };
            let img = fs.crash(&mut plan);
            let rep = txfs_engine::check(&img).expect("check");
            assert!(rep.problems.is_empty(), "k={k} seed={seed}: {:?}", rep.problems);
            let e = Engine::open(Arc::new(img), opts()).unwrap_or_else(|e| panic!("k={k} seed={seed}: {e}"));
            assert_eq!(read(&e, "f"), b"last22", "k={k} seed={seed}");
        }
        if done {
            break;
        }
    }
}

/// A CrashFs whose disk holds `left` more bytes (as limits.rs's SmallDisk:
/// growth costs, cutting, unlinking and renaming over a file give back).
struct SmallCrash {
    inner: Arc<CrashFs>,
    left: Arc<std::sync::atomic::AtomicU64>,
}

fn take(left: &std::sync::atomic::AtomicU64, n: u64) -> std::io::Result<()> {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(n))
        .map(|_| ())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOSPC))
}

fn give(left: &std::sync::atomic::AtomicU64, n: u64) {
    let _ = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some(l.saturating_add(n)));
}

struct SmallCrashFile {
    inner: Arc<dyn txfs_engine::storage::StoredFile>,
    left: Arc<std::sync::atomic::AtomicU64>,
}

impl txfs_engine::storage::StoredFile for SmallCrashFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> std::io::Result<()> {
        take(&self.left, (off + data.len() as u64).saturating_sub(self.inner.len()?))?;
        self.inner.write_at(off, data)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let was = self.inner.len()?;
        take(&self.left, len.saturating_sub(was))?;
        self.inner.set_len(len)?;
        give(&self.left, was.saturating_sub(len));
        Ok(())
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

impl Storage for SmallCrash {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, link, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all);
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> std::io::Result<()> {
        take(&self.left, (off + data.len() as u64).saturating_sub(self.inner.lstat(p)?.size))?;
        self.inner.write_at(p, off, data)
    }
    fn set_len(&self, p: &Path, len: u64) -> std::io::Result<()> {
        let was = self.inner.lstat(p)?.size;
        take(&self.left, len.saturating_sub(was))?;
        self.inner.set_len(p, len)?;
        give(&self.left, was.saturating_sub(len));
        Ok(())
    }
    fn open_file(&self, p: &Path, create: bool) -> std::io::Result<Arc<dyn txfs_engine::storage::StoredFile>> {
        let inner = self.inner.open_file(p, create)?;
        Ok(Arc::new(SmallCrashFile { inner, left: self.left.clone() }))
    }
    fn free_bytes(&self) -> std::io::Result<Option<u64>> {
        Ok(Some(self.left.load(Ordering::SeqCst)))
    }
    fn unlink(&self, p: &Path) -> std::io::Result<()> {
        let size = self.inner.lstat(p)?.size;
        self.inner.unlink(p)?;
        give(&self.left, size);
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let over = self.inner.lstat(to).map(|m| m.size).unwrap_or(0);
        self.inner.rename(from, to)?;
        give(&self.left, over);
        Ok(())
    }
}

/// (4, 5) Commits that run out of space (and drop the spare under the
/// engine lock) while checkpoints retire journals into the spare outside
/// it: every commit acknowledged durable survives any power cut, and a
/// running engine's live journal is never the spare.
#[test]
fn enospc_commits_racing_checkpoints_keep_durable_commits() {
    for round in 0..6u64 {
        let crash = Arc::new(CrashFs::new(MemFs::new()));
        let left = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let disk = Arc::new(SmallCrash { inner: crash.clone(), left: left.clone() });
        let o = Options { stage_threshold: u64::MAX, spill_threshold: 64 << 20, ..opts() };
        let engine = Arc::new(Engine::open(disk.clone(), o.clone()).expect("open"));
        let mut objs = Vec::new();
        for i in 0..2 {
            let tx = engine.begin();
            let c = engine.create(Some(tx), ObjId::ROOT, OsStr::new(&format!("c{i}")), 0o644, 0, 0).unwrap().obj;
            let p = engine.create(Some(tx), ObjId::ROOT, OsStr::new(&format!("p{i}")), 0o644, 0, 0).unwrap().obj;
            engine.write(Some(tx), c, 0, &0u64.to_le_bytes()).unwrap();
            engine.write(Some(tx), p, 0, &vec![7u8; 3 << 20]).unwrap();
            engine.commit(tx, Durability::Durable).unwrap();
            objs.push((c, p));
        }
        engine.checkpoint().unwrap();
        let spare = Path::new(txfs_engine::META_DIR).join("journal-spare");
        assert!(crash.lstat(&spare).is_ok(), "no spare");
        left.store(5 << 20, Ordering::SeqCst);
        let stop = Arc::new(AtomicBool::new(false));
        let committers: Vec<_> = objs
            .iter()
            .enumerate()
            .map(|(i, &(c, p))| {
                let (e, stop) = (engine.clone(), stop.clone());
                std::thread::spawn(move || {
                    let (mut acked, mut enospc) = (0u64, 0u32);
                    for n in 1..=60u64 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let tx = e.begin();
                        let r = e
                            .write(Some(tx), c, 0, &n.to_le_bytes())
                            .and_then(|_| e.write(Some(tx), p, 0, &vec![n as u8; (1 + (n as usize + i) % 3) << 19]))
                            .and_then(|_| e.commit(tx, Durability::Durable));
                        match r {
                            Ok(()) => acked = n,
                            Err(err) if err.errno() == libc::ENOSPC => enospc += 1,
                            Err(err) => return (acked, enospc, Some(err.to_string())),
                        }
                    }
                    (acked, enospc, None)
                })
            })
            .collect();
        let ck = {
            let (e, stop, crash) = (engine.clone(), stop.clone(), crash.clone());
            std::thread::spawn(move || {
                let mut errs = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Err(err) = e.checkpoint() {
                        if err.errno() != libc::ENOSPC {
                            errs.push(err.to_string());
                            break;
                        }
                    }
                    // The live journal is never a second name of the spare.
                    // (Only its name: committers append to it meanwhile, and
                    // an append cut short by ENOSPC shrinks it back, so its
                    // records cannot be read here without racing them.)
                    let jdir = Path::new(txfs_engine::META_DIR).join("journal");
                    let list = crash.read_dir(&jdir).expect("journal dir");
                    assert_eq!(list.len(), 1, "one journal file expected: {list:?}");
                    let jp = jdir.join(&list[0].0);
                    if let (Ok(a), Ok(b)) = (crash.lstat(&jp), crash.lstat(&spare)) {
                        assert_ne!(a.ino, b.ino, "the spare is the live journal");
                    }
                    std::thread::yield_now();
                }
                errs
            })
        };
        let res: Vec<_> = committers.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        let ck_errs = ck.join().unwrap();
        eprintln!("round {round}: committers (acked, enospc, err) {res:?}; checkpoint errors {ck_errs:?}");
        drop(Arc::try_unwrap(engine).ok().expect("engine shared"));
        drop(disk);
        let crash = unwrap_fs(crash);
        for seed in 0..6u64 {
            let mut plan = if seed == 0 { CrashPlan::drop_all() } else { CrashPlan::random(round * 10 + seed) };
            let img = crash.crash(&mut plan);
            let rep = txfs_engine::check(&img).expect("check");
            assert!(rep.problems.is_empty(), "{:?}", rep.problems);
            let e = Engine::open(Arc::new(img), o.clone()).expect("recovery");
            for (i, (acked, _, _)) in res.iter().enumerate() {
                let v = u64::from_le_bytes(read(&e, &format!("c{i}"))[..8].try_into().unwrap());
                assert!(v >= *acked, "round {round} seed {seed}: c{i} = {v}, acknowledged {acked}");
            }
        }
    }
}
