//! Shadows (DESIGN §2a): an existing file that a transaction rewrites from
//! its start, past the transaction's memory, gets a data file that holds
//! the new bytes at their own offsets. When that data file is all of the
//! committed content, the checkpoint renames it over the file instead of
//! copying its bytes a second time. These tests check that the rename
//! happens only when it is exact (one link, every byte from the shadow),
//! that the file keeps what it had besides its bytes (mode, owner, xattrs,
//! times), and that a checkpoint killed at every step recovers to the
//! committed state.

mod common;

use common::{dump_engine, dump_storage, leftovers, Node, Tree};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Persistence, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, META_DIR};

/// Transactions keep 8 KiB in memory; no background thread, no automatic
/// checkpoint. Files are a few MiB: a rewrite gets its shadow at 1 MiB.
fn opts() -> Options {
    Options { spill_threshold: 8 << 10, flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A backing tree with `f` (2.5 MiB, mode 0640, owner 1000:2000, an xattr),
/// `g` and its second link `g2`, and `h`.
fn initial() -> MemFs {
    let m = MemFs::new();
    let p = Path::new;
    for (name, seed) in [("f", 1u8), ("g", 2), ("h", 3)] {
        m.create_file(p(name), 0o644).unwrap();
        m.write_at(p(name), 0, &bytes(40 << 16, seed)).unwrap();
    }
    m.set_mode(p("f"), 0o640).unwrap();
    m.set_owner(p("f"), 1000, 2000).unwrap();
    m.set_xattr(p("f"), OsStr::new("user.tag"), b"kept").unwrap();
    m.link(p("g"), p("g2")).unwrap();
    m
}

/// Rewrites `o` from offset 0 with `len` bytes, in 4 KiB writes.
fn rewrite(engine: &Engine, tx: txfs_engine::TxId, o: ObjId, len: usize, seed: u8) -> Vec<u8> {
    let data = bytes(len, seed);
    for (i, chunk) in data.chunks(4096).enumerate() {
        engine.write(Some(tx), o, (i * 4096) as u64, chunk).unwrap();
    }
    data
}

fn obj(engine: &Engine, name: &str) -> ObjId {
    engine.lookup(None, ObjId::ROOT, OsStr::new(name)).unwrap().obj
}

fn data_files(s: &dyn Storage) -> usize {
    s.read_dir(&Path::new(META_DIR).join("data")).map(|v| v.len()).unwrap_or(0)
}

#[test]
fn a_file_rewritten_whole_is_its_shadow_renamed_and_keeps_its_attributes() {
    let fs = Arc::new(initial());
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let p = Path::new;
    let ino = |name: &str| fs.lstat(p(name)).unwrap().ino;
    let (f0, g0, h0) = (ino("f"), ino("g"), ino("h"));
    let (f, g, h) = (obj(&engine, "f"), obj(&engine, "g"), obj(&engine, "h"));

    let tx = engine.begin();
    // f: rewritten whole, and longer. g: the same, but it has two links.
    // h: rewritten from the start but only half of it.
    let fdata = rewrite(&engine, tx, f, 56 << 16, 10);
    let gdata = rewrite(&engine, tx, g, 48 << 16, 20);
    let mut hdata = bytes(40 << 16, 3);
    hdata[..20 << 16].copy_from_slice(&rewrite(&engine, tx, h, 20 << 16, 30));
    // The shadows exist before the commit (the transaction's bytes left
    // memory): f, g and h each have one.
    // The spill file (the first MiB of each file, until its rewrite reached
    // SHADOW_MIN; all of g, which has two links) and the shadows of f and h.
    assert_eq!(data_files(&*fs), 3, "a spill file and shadows of f and h");
    assert_eq!(engine.read(Some(tx), f, 0, 8 << 20).unwrap(), fdata, "the transaction reads its shadow");
    engine.commit(tx, Durability::Durable).unwrap();
    let before = engine.getattr(None, f).unwrap();
    engine.checkpoint().unwrap();

    // f is a new inode (its shadow) with the old one's owner, mode, xattr.
    let m = fs.lstat(p("f")).unwrap();
    assert_ne!(m.ino, f0, "f was not replaced by its shadow: its bytes were copied a second time");
    assert_eq!((m.mode, m.uid, m.gid, m.size), (0o640, 1000, 2000, 56 << 16));
    assert_eq!(m.mtime, before.mtime, "the committed mtime");
    assert_eq!(fs.get_xattr(p("f"), OsStr::new("user.tag")).unwrap().as_deref(), Some(&b"kept"[..]));
    // g has two names: both must show the new content, so it is copied.
    assert_eq!(ino("g"), g0, "a file with two links must not be replaced");
    assert_eq!(ino("h"), h0, "a half-rewritten file must not be replaced");
    let want: Tree = [
        ("f", Node::File { data: fdata.clone(), mode: 0o640 }),
        ("g", Node::File { data: gdata.clone(), mode: 0o644 }),
        ("g2", Node::File { data: gdata, mode: 0o644 }),
        ("h", Node::File { data: hdata, mode: 0o644 }),
    ]
    .into_iter()
    .map(|(n, v)| (p(n).to_path_buf(), v))
    .collect();
    assert_eq!(dump_storage(&*fs), want);
    assert_eq!(dump_engine(&engine, None), want);
    // Every data file is retired; f's old inode stays as a spare.
    let dir = Path::new(META_DIR).join("data");
    let left = fs.read_dir(&dir).unwrap();
    assert_eq!(left.len(), 1, "one spare: {left:?}");
    assert_eq!(fs.lstat(&dir.join(&left[0].0)).unwrap().ino, f0, "the spare is f's old inode");

    // The engine still knows f by its new inode: a lookup finds the same
    // object, and a second whole rewrite replaces it again, with the spare
    // as its shadow (its allocated blocks are overwritten).
    assert_eq!(obj(&engine, "f"), f);
    let tx = engine.begin();
    let again = rewrite(&engine, tx, f, 24 << 16, 40);
    engine.truncate(Some(tx), f, 24 << 16).unwrap();
    engine.commit(tx, Durability::Durable).unwrap();
    let f1 = ino("f");
    engine.checkpoint().unwrap();
    assert_ne!(ino("f"), f1, "the second rewrite (shorter, so truncated) was not replaced");
    assert_eq!(ino("f"), f0, "the second shadow was not the spare");
    assert_eq!(fs.lstat(p("f")).unwrap().size, 24 << 16);
    assert_eq!(engine.read(None, f, 0, 8 << 20).unwrap(), again);
    engine.close().unwrap();
    assert!(leftovers(&*fs).is_empty(), "close drops the spares: {:?}", leftovers(&*fs));
}

#[test]
fn a_later_partial_write_keeps_the_copy() {
    // A shadow committed, then a plain write to the same file before the
    // checkpoint: the committed content is no longer only the shadow.
    let fs = Arc::new(initial());
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let f = obj(&engine, "f");
    let f0 = fs.lstat(Path::new("f")).unwrap().ino;
    let tx = engine.begin();
    let mut want = rewrite(&engine, tx, f, 40 << 16, 50);
    engine.commit(tx, Durability::Durable).unwrap();
    engine.write(None, f, 100, b"plain").unwrap();
    want[100..105].copy_from_slice(b"plain");
    engine.checkpoint().unwrap();
    assert_eq!(fs.lstat(Path::new("f")).unwrap().ino, f0);
    assert_eq!(engine.read(None, f, 0, 8 << 20).unwrap(), want);
    engine.close().unwrap();
    assert_eq!(fs.read_at(Path::new("f"), 0, &mut vec![0; 8 << 20]).unwrap(), want.len());
}

#[test]
fn an_aborted_rewrite_leaves_no_shadow() {
    let fs = Arc::new(initial());
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let f = obj(&engine, "f");
    let tx = engine.begin();
    rewrite(&engine, tx, f, 40 << 16, 60);
    assert_eq!(data_files(&*fs), 2, "its spill file (the first MiB) and its shadow");
    engine.abort(tx).unwrap();
    assert_eq!(data_files(&*fs), 0);
    assert_eq!(engine.read(None, f, 0, 8 << 20).unwrap(), bytes(40 << 16, 1));
}

/// The checkpoint that replaces `f`, killed after each of its storage
/// operations, then power-cut in several ways: recovery lands on the
/// committed state, with `f`'s owner and xattr. The shadow is a spare (an
/// older inode of f) and longer than the final content, so its cut must be
/// durable before the rename is.
#[test]
fn a_replacing_checkpoint_killed_at_every_step() {
    replacing_checkpoint_killed_at_every_step(Persistence::Ordered);
}

/// The same on a backing that does not order metadata (issue 28): the
/// commits' records name shadows and a spare whose names only an fsync of
/// `.txfs/data` makes durable; without it a power cut after the plan kept
/// the record, lost the shadow's name, and the replay took the missing
/// shadow for "already renamed", keeping f's old bytes.
#[test]
fn a_replacing_checkpoint_killed_at_every_step_conservative() {
    replacing_checkpoint_killed_at_every_step(Persistence::Conservative);
}

fn replacing_checkpoint_killed_at_every_step(model: Persistence) {
    let mut n = 0u64;
    let mut replaced_seen = false;
    loop {
        let fs = Arc::new(CrashFs::with_persistence(initial(), model));
        let engine = Engine::open(fs.clone(), opts()).unwrap();
        let f = obj(&engine, "f");
        // A first rewrite leaves f's old inode as a spare (old bytes in all
        // of its 2.5 MiB); the second takes it as its shadow.
        let tx = engine.begin();
        rewrite(&engine, tx, f, 40 << 16, 69);
        engine.commit(tx, Durability::Durable).unwrap();
        if n == 0 {
            // The record names the shadow: a power cut now keeps both.
            let want = dump_engine(&engine, None);
            for mut plan in [CrashPlan::drop_all(), CrashPlan::random(1), CrashPlan::random(2)] {
                let ctx = format!("[replace {model:?}] power cut after the first commit, {plan:?}");
                let img = Arc::new(fs.crash(&mut plan));
                let e = Engine::open(img, opts()).unwrap_or_else(|e| panic!("{ctx}: recovery: {e}"));
                assert_eq!(dump_engine(&e, None), want, "{ctx}");
            }
        }
        engine.checkpoint().unwrap();
        let tx = engine.begin();
        rewrite(&engine, tx, f, 44 << 16, 70);
        // Shorter in the end: the shadow holds bytes past the final size.
        engine.truncate(Some(tx), f, 30 << 16).unwrap();
        engine.commit(tx, Durability::Durable).unwrap();
        let want = dump_engine(&engine, None);
        let f0 = fs.lstat(Path::new("f")).unwrap().ino;
        fs.set_fail_after(Some(n));
        let done = engine.checkpoint().is_ok();
        replaced_seen |= fs.lstat(Path::new("f")).unwrap().ino != f0;
        drop(engine);
        let mut plans =
            vec![("keep_all".to_string(), CrashPlan::keep_all()), ("drop_all".into(), CrashPlan::drop_all())];
        plans.extend((0..16u64).map(|s| (format!("random({s})"), CrashPlan::random(s))));
        for (label, mut plan) in plans {
            let ctx = format!("[replace {model:?}] checkpoint killed after {n} storage ops, then CrashPlan::{label}");
            let img = Arc::new(fs.crash(&mut plan));
            let engine = Engine::open(img.clone(), opts()).unwrap_or_else(|e| panic!("{ctx}: recovery: {e}"));
            assert_eq!(dump_engine(&engine, None), want, "{ctx}");
            engine.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
            assert_eq!(dump_storage(&*img), want, "{ctx}: backing after close");
            let m = img.lstat(Path::new("f")).unwrap();
            assert_eq!((m.uid, m.gid), (1000, 2000), "{ctx}: owner");
            let x = img.get_xattr(Path::new("f"), OsStr::new("user.tag")).unwrap();
            assert_eq!(x.as_deref(), Some(&b"kept"[..]), "{ctx}: xattr");
            assert!(leftovers(&*img).is_empty(), "{ctx}: leftovers");
        }
        if done {
            break;
        }
        n += 1;
    }
    assert!(replaced_seen, "no run replaced f: the test did not exercise the rename");
}

#[test]
fn a_new_file_rewritten_before_its_checkpoint_is_its_shadow_renamed() {
    // Created and filled by plain writes (journaled, not yet in the tree),
    // then rewritten whole by a transaction: the checkpoint places the
    // shadow under the new name; the journaled bytes are never copied.
    let fs = Arc::new(MemFs::new());
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let n = engine.create(None, ObjId::ROOT, OsStr::new("n"), 0o600, 0, 0).unwrap().obj;
    engine.write(None, n, 0, &bytes(40 << 16, 5)).unwrap();
    engine.link(None, n, ObjId::ROOT, OsStr::new("n2")).unwrap();
    let tx = engine.begin();
    let want = rewrite(&engine, tx, n, 40 << 16, 6);
    engine.commit(tx, Durability::Durable).unwrap();
    let dir = Path::new(META_DIR).join("data");
    // The plain write spilled (8 KiB of memory), so did the rewrite's
    // first MiB, until its shadow took those bytes (the commit then
    // dropped the transaction's spill file, which nothing named).
    let mut files: Vec<_> = fs.read_dir(&dir).unwrap().into_iter().map(|(n, _)| n).collect();
    files.sort();
    assert_eq!(files.len(), 2, "the plain write's spill file and the rewrite's shadow");
    let shadow_ino = fs.lstat(&dir.join(&files[1])).unwrap().ino;
    engine.checkpoint().unwrap();
    let m = fs.lstat(Path::new("n")).unwrap();
    assert_eq!(m.ino, shadow_ino, "n is not its shadow renamed: its bytes were copied a second time");
    assert_eq!((m.mode, m.nlink), (0o600, 2));
    assert_eq!(fs.lstat(Path::new("n2")).unwrap().ino, shadow_ino, "both names are one inode");
    assert_eq!(engine.read(None, n, 0, 8 << 20).unwrap(), want);
    engine.close().unwrap();
    let mut buf = vec![0; 8 << 20];
    let k = fs.read_at(Path::new("n2"), 0, &mut buf).unwrap();
    assert_eq!(&buf[..k], &want[..]);
}

#[test]
fn a_spare_brings_none_of_its_old_files_xattrs() {
    // f (with user.tag) is replaced; its old inode is a spare; h (no
    // xattrs, same size) is rewritten next and takes that spare.
    let fs = Arc::new(initial());
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let (f, h) = (obj(&engine, "f"), obj(&engine, "h"));
    let f0 = fs.lstat(Path::new("f")).unwrap().ino;
    for (o, seed) in [(f, 80u8), (h, 81)] {
        let tx = engine.begin();
        rewrite(&engine, tx, o, 40 << 16, seed);
        engine.commit(tx, Durability::Durable).unwrap();
        engine.checkpoint().unwrap();
    }
    let m = fs.lstat(Path::new("h")).unwrap();
    assert_eq!(m.ino, f0, "h's shadow was not f's old inode: the test did not reuse the spare");
    assert_eq!((m.mode, m.uid, m.gid), (0o644, 0, 0), "h has f's old owner or mode");
    assert_eq!(fs.list_xattrs(Path::new("h")).unwrap(), Vec::<std::ffi::OsString>::new(), "h has f's xattrs");
    assert_eq!(engine.listxattr(None, h).unwrap(), Vec::<std::ffi::OsString>::new());
    engine.close().unwrap();
}

/// A backing file system where the daemon may not chown (not root, NFS
/// root_squash) nor make hard links.
struct NoChown {
    inner: MemFs,
}

impl Storage for NoChown {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, mkdir, symlink, mknod, readlink, rename, unlink, rmdir, set_mode, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn set_owner(&self, _: &Path, _: u32, _: u32) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EPERM))
    }
    fn link(&self, _: &Path, _: &Path) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EPERM))
    }
}

#[test]
fn a_shadow_that_cannot_take_the_owner_is_copied_and_nothing_is_poisoned() {
    let fs = Arc::new(NoChown { inner: initial() });
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let f = obj(&engine, "f");
    let f0 = fs.lstat(Path::new("f")).unwrap().ino;
    let tx = engine.begin();
    let want = rewrite(&engine, tx, f, 40 << 16, 90);
    engine.commit(tx, Durability::Durable).unwrap();
    engine.checkpoint().expect("a checkpoint that cannot chown the shadow copies it instead");
    let m = fs.lstat(Path::new("f")).unwrap();
    assert_eq!((m.ino, m.uid, m.gid, m.mode), (f0, 1000, 2000, 0o640), "f was copied into, in place");
    assert_eq!(engine.read(None, f, 0, 8 << 20).unwrap(), want);
    engine.write(None, f, 0, b"still healthy").unwrap();
    engine.close().unwrap();
    assert!(leftovers(&*fs).is_empty());
}

/// A shadow holds its bytes where the committed delta points once the
/// transaction commits, so a write of the transaction still copying into it
/// (another thread's, outside the engine lock) must land before the commit,
/// never after: a late one would change committed content without being
/// durable (a power cut then shows other bytes than readers saw). The
/// commit waits for such writes.
#[test]
fn a_write_still_copying_when_its_transaction_commits_lands_before_the_commit() {
    for round in 0..40u64 {
        let fs = Arc::new(CrashFs::new(initial()));
        let engine = Engine::open(fs.clone(), opts()).unwrap();
        let f = obj(&engine, "f");
        let tx = engine.begin();
        rewrite(&engine, tx, f, 40 << 16, 1);
        let seen = std::thread::scope(|sc| {
            let writer = sc.spawn(|| {
                for i in 0u64.. {
                    if engine.write(Some(tx), f, 0, &bytes(1 << 20, i as u8)).is_err() {
                        break;
                    }
                }
            });
            std::thread::sleep(std::time::Duration::from_micros(200 + round * 37));
            engine.commit(tx, Durability::Durable).unwrap();
            writer.join().unwrap();
            engine.read(None, f, 0, 8 << 20).unwrap()
        });
        drop(engine);
        let img = Arc::new(fs.crash(&mut CrashPlan::drop_all()));
        let engine = Engine::open(img, opts()).unwrap();
        let f = obj(&engine, "f");
        let got = engine.read(None, f, 0, 8 << 20).unwrap();
        assert!(got == seen, "round {round}: a power cut after the durable commit shows other bytes than readers saw");
    }
}

/// A daemon that is not root: a shadow given a mode like 0200 could not be
/// opened again by the plan that renames it, so shadows are copied.
struct Unprivileged {
    inner: MemFs,
}

impl Storage for Unprivileged {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn privileged(&self) -> bool {
        false
    }
}

#[test]
fn an_unprivileged_daemon_copies_shadows() {
    let fs = Arc::new(Unprivileged { inner: initial() });
    fs.set_mode(Path::new("f"), 0o200).unwrap();
    let engine = Engine::open(fs.clone(), opts()).unwrap();
    let f = obj(&engine, "f");
    let f0 = fs.lstat(Path::new("f")).unwrap().ino;
    let tx = engine.begin();
    let want = rewrite(&engine, tx, f, 40 << 16, 95);
    engine.commit(tx, Durability::Durable).unwrap();
    assert_eq!(data_files(&*fs), 1, "the rewrite has its shadow");
    engine.checkpoint().unwrap();
    assert_eq!(fs.lstat(Path::new("f")).unwrap().ino, f0, "replaced although the daemon is not root");
    assert_eq!(engine.read(None, f, 0, 8 << 20).unwrap(), want);
    engine.close().unwrap();
}
