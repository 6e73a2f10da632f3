//! Work per operation must not grow with the size of a transaction or of a
//! directory (issue 5, W12: removing 20 000 files in one transaction).
//!
//! No timing assertions: the backing store counts what the engine asks of
//! it (calls, and directory entries handed back by `read_dir`), and the
//! journal's byte count stands for the size of the commit record. A
//! per-operation listing of the directory, a per-operation walk of the
//! transaction's removals that touches the store, or a commit record that
//! grows faster than its entries shows up as a count that breaks a
//! per-entry bound. A per-operation scan that stays in memory shows up as
//! this test taking minutes instead of seconds (20 000² steps).

mod common;

use common::{dump_engine, dump_storage, leftovers};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use txfs_engine::storage::{FileKind, MemFs, Meta, Storage, StoredFile, Timestamp};
use txfs_engine::{Durability, Engine, ObjId, Options};

const N: usize = 20_000;

/// A MemFs that counts the calls made to it and the entries `read_dir`
/// returns.
#[derive(Default)]
struct Counting {
    inner: MemFs,
    calls: AtomicU64,
    listed: AtomicU64,
    /// The largest checkpoint plan written (its size when put in place).
    plan: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
struct Count {
    calls: u64,
    listed: u64,
    journal: u64,
}

impl Counting {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

fn count(fs: &Counting, e: &Engine) -> Count {
    Count {
        calls: fs.calls.load(Ordering::Relaxed),
        listed: fs.listed.load(Ordering::Relaxed),
        journal: e.stats().journal_bytes,
    }
}

/// What happened between two counts, per entry of a phase of `n` entries.
fn per_entry(what: &str, a: Count, b: Count, n: usize, max_calls: f64, max_listed: f64, max_journal: f64) {
    let calls = (b.calls - a.calls) as f64 / n as f64;
    let listed = (b.listed - a.listed) as f64 / n as f64;
    let journal = b.journal.saturating_sub(a.journal) as f64 / n as f64;
    if n % 5000 == 0 || n < 1000 {
        eprintln!("{what}: {calls:.2} store calls, {listed:.2} listed entries, {journal:.1} journal bytes per entry");
    }
    assert!(calls <= max_calls, "{what}: {calls:.2} store calls per entry (at most {max_calls})");
    assert!(listed <= max_listed, "{what}: {listed:.2} listed entries per entry (at most {max_listed})");
    assert!(journal <= max_journal, "{what}: {journal:.1} journal bytes per entry (at most {max_journal})");
}

impl Storage for Counting {
    fn lstat(&self, p: &Path) -> io::Result<Meta> {
        self.tick();
        self.inner.lstat(p)
    }
    fn read_dir(&self, p: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        self.tick();
        let v = self.inner.read_dir(p)?;
        self.listed.fetch_add(v.len() as u64, Ordering::Relaxed);
        Ok(v)
    }
    fn read_at(&self, p: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.tick();
        self.inner.read_at(p, off, buf)
    }
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.tick();
        self.inner.write_at(p, off, data)
    }
    fn set_len(&self, p: &Path, len: u64) -> io::Result<()> {
        self.tick();
        self.inner.set_len(p, len)
    }
    fn create_file(&self, p: &Path, mode: u32) -> io::Result<()> {
        self.tick();
        self.inner.create_file(p, mode)
    }
    fn mkdir(&self, p: &Path, mode: u32) -> io::Result<()> {
        self.tick();
        self.inner.mkdir(p, mode)
    }
    fn symlink(&self, t: &OsStr, p: &Path) -> io::Result<()> {
        self.tick();
        self.inner.symlink(t, p)
    }
    fn mknod(&self, p: &Path, k: FileKind, mode: u32, rdev: u64) -> io::Result<()> {
        self.tick();
        self.inner.mknod(p, k, mode, rdev)
    }
    fn readlink(&self, p: &Path) -> io::Result<OsString> {
        self.tick();
        self.inner.readlink(p)
    }
    fn rename(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.tick();
        if b.extension() == Some(OsStr::new("plan")) {
            self.plan.fetch_max(self.inner.lstat(a)?.size, Ordering::Relaxed);
        }
        self.inner.rename(a, b)
    }
    fn link(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.tick();
        self.inner.link(a, b)
    }
    fn unlink(&self, p: &Path) -> io::Result<()> {
        self.tick();
        self.inner.unlink(p)
    }
    fn rmdir(&self, p: &Path) -> io::Result<()> {
        self.tick();
        self.inner.rmdir(p)
    }
    fn set_mode(&self, p: &Path, m: u32) -> io::Result<()> {
        self.tick();
        self.inner.set_mode(p, m)
    }
    fn set_owner(&self, p: &Path, u: u32, g: u32) -> io::Result<()> {
        self.tick();
        self.inner.set_owner(p, u, g)
    }
    fn set_times(&self, p: &Path, a: Timestamp, m: Timestamp) -> io::Result<()> {
        self.tick();
        self.inner.set_times(p, a, m)
    }
    fn get_xattr(&self, p: &Path, n: &OsStr) -> io::Result<Option<Vec<u8>>> {
        self.tick();
        self.inner.get_xattr(p, n)
    }
    fn list_xattrs(&self, p: &Path) -> io::Result<Vec<OsString>> {
        self.tick();
        self.inner.list_xattrs(p)
    }
    fn set_xattr(&self, p: &Path, n: &OsStr, v: &[u8]) -> io::Result<()> {
        self.tick();
        self.inner.set_xattr(p, n, v)
    }
    fn remove_xattr(&self, p: &Path, n: &OsStr) -> io::Result<()> {
        self.tick();
        self.inner.remove_xattr(p, n)
    }
    fn fsync(&self, p: &Path) -> io::Result<()> {
        self.tick();
        self.inner.fsync(p)
    }
    fn sync_all(&self) -> io::Result<()> {
        self.tick();
        self.inner.sync_all()
    }
    fn open_file(&self, p: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        self.tick();
        self.inner.open_file(p, create)
    }
}

fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Options::default() }
}

fn names() -> Vec<OsString> {
    (0..N).map(|i| OsString::from(format!("f{i}"))).collect()
}

/// Creates `dir/f0..f{N-1}` (and a file that stays) as plain operations;
/// with `checkpoint`, they are in the backing tree before the removal,
/// else only in the committed delta (the W12 driver's case).
fn populate(e: &Engine, checkpoint: bool) -> ObjId {
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("rm"), 0o755, 0, 0).expect("mkdir").obj;
    for n in names() {
        e.create(None, d, &n, 0o644, 0, 0).expect("create");
    }
    let keep = e.create(None, ObjId::ROOT, OsStr::new("keep"), 0o644, 0, 0).expect("create keep").obj;
    e.write(None, keep, 0, b"stays").expect("write keep");
    if checkpoint {
        e.checkpoint().expect("checkpoint");
    }
    d
}

/// Removes every file of `dir` in one transaction and checks the result,
/// the work each phase asked of the store, and the state after recovery.
fn remove_all(checkpointed: bool) {
    let fs = Arc::new(Counting::default());
    let e = Engine::open(fs.clone(), opts()).expect("open");
    let d = populate(&e, checkpointed);

    let tx = e.begin();
    let c0 = count(&fs, &e);
    // A lookup of a base file is one lstat (its node); nothing lists the
    // directory. Checked as it goes (after 1, 10, 100, then every 1000
    // removals), so a per-removal listing fails at once, not after 20 000
    // listings of 20 000 entries.
    for (i, n) in names().iter().enumerate() {
        e.unlink(Some(tx), d, n).expect("unlink");
        let done = i + 1;
        if matches!(done, 1 | 10 | 100) || done % 1000 == 0 {
            let c = count(&fs, &e);
            let at = format!("unlink (first {done})");
            per_entry(&at, c0, c, done, 3.0, 0.0, 0.0);
        }
    }
    assert!(e.readdir(Some(tx), d).expect("readdir in tx").is_empty());
    assert_eq!(e.readdir(None, d).expect("readdir outside").len(), N, "removals leaked out of the transaction");

    let c2 = count(&fs, &e);
    e.commit(tx, Durability::Durable).expect("commit");
    let c3 = count(&fs, &e);
    // The record names each removed entry once (name, reference, times):
    // about 70 bytes here; quadratic growth would be thousands.
    per_entry("commit", c2, c3, N, 2.0, 0.0, 160.0);
    e.checkpoint().expect("checkpoint");
    let c4 = count(&fs, &e);
    // Base files: stage, remove, a few lstats each; files that never
    // reached the backing tree: an lstat at most.
    per_entry("checkpoint", c3, c4, N, 12.0, 1.0, f64::INFINITY);

    assert!(e.readdir(None, d).expect("readdir").is_empty());
    let tree = dump_engine(&e, None);
    e.close().expect("close");
    let on_disk = dump_storage(&*fs);
    assert_eq!(on_disk, tree, "backing tree differs from the engine's view");
    assert_eq!(on_disk.len(), 2, "only rm/ and keep remain: {:?}", on_disk.keys().take(5).collect::<Vec<_>>());
    assert!(leftovers(&*fs).is_empty(), "leftovers: {:?}", leftovers(&*fs));
    let e = Engine::open(fs.clone(), opts()).expect("reopen");
    assert_eq!(dump_engine(&e, None), tree, "recovered state differs");
}

/// Files created before the transaction and already checkpointed.
#[test]
fn removing_20k_base_files_in_one_transaction_is_linear() {
    remove_all(true);
}

/// Files created (as plain operations) since the last checkpoint: the W12
/// driver's case, names only in the committed delta.
#[test]
fn removing_20k_new_files_in_one_transaction_is_linear() {
    remove_all(false);
}

/// A tree as deep as a user can make it, of the longest names: the
/// checkpoint's plan and the journal grow with its names, not with the
/// square of its depth. Named by full paths, 1500 levels of 255-byte
/// names made a plan of 290 MB (the daemon's peak: 1.7 GB; issue 23).
#[test]
fn a_deep_tree_of_long_names_costs_the_checkpoint_its_names() {
    const LEVELS: usize = 600;
    let name = OsString::from("n".repeat(255));
    let names_bytes = (LEVELS * 256) as u64;
    let fs = Arc::new(Counting::default());
    let e = Engine::open(fs.clone(), opts()).expect("open");
    let mut dirs = Vec::new();
    let mut dir = ObjId::ROOT;
    for _ in 0..LEVELS {
        dir = e.mkdir(None, dir, &name, 0o755, 0, 0).expect("mkdir").obj;
        dirs.push(dir);
    }
    e.checkpoint().expect("checkpoint of the new tree");
    let plan = fs.plan.swap(0, Ordering::Relaxed);
    eprintln!("new tree: plan {plan} bytes for {names_bytes} bytes of names");
    assert!(plan < 2 * names_bytes, "plan of {plan} bytes for {names_bytes} bytes of names");

    // The tree is in the backing now: a file in every directory, and a
    // change to every directory's mode, in one transaction.
    let tx = e.begin();
    for d in &dirs {
        let f = e.create(Some(tx), *d, OsStr::new("f"), 0o644, 0, 0).expect("create").obj;
        e.write(Some(tx), f, 0, b"x").expect("write");
        let set = txfs_engine::SetAttr { mode: Some(0o700), ..Default::default() };
        e.setattr(Some(tx), *d, &set).expect("chmod");
    }
    let j1 = e.stats().journal_bytes;
    e.commit(tx, Durability::Durable).expect("commit");
    let record = e.stats().journal_bytes - j1;
    eprintln!("record of {record} bytes for {LEVELS} levels");
    assert!(record < 8 * names_bytes, "a record of {record} bytes for {names_bytes} bytes of names");
    e.checkpoint().expect("checkpoint of the changes in the tree");
    let plan = fs.plan.swap(0, Ordering::Relaxed);
    eprintln!("changes: plan {plan} bytes");
    assert!(plan < 4 * names_bytes, "plan of {plan} bytes for {names_bytes} bytes of names");

    let tree = dump_engine(&e, None);
    assert_eq!(tree.len(), 2 * LEVELS);
    e.close().expect("close");
    assert_eq!(dump_storage(&*fs), tree, "backing tree differs from the engine's view");
    let e = Engine::open(fs.clone(), opts()).expect("reopen");
    assert_eq!(dump_engine(&e, None), tree, "recovered state differs");
}
