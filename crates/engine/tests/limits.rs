//! Big transactions and full disks (SPEC §4): a transaction is bounded by
//! disk, not RAM, and one that cannot be journaled fails whole.

mod common;

use common::{dump_engine, dump_storage, leftovers, Node};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use txfs_engine::storage::{MemFs, Storage, StoredFile};
use txfs_engine::{Durability, Engine, ObjId, Options, META_DIR};

/// A MemFs whose disk holds `left` more bytes, then says ENOSPC. Like a real
/// disk, only growing a file takes space (overwrites are free) and cutting
/// or unlinking one gives it back (every file here has one name).
struct SmallDisk {
    inner: MemFs,
    left: Arc<AtomicU64>,
}

fn take(left: &AtomicU64, n: u64) -> io::Result<()> {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(n))
        .map(|_| ())
        .map_err(|_| io::Error::from_raw_os_error(libc::ENOSPC))
}

/// Charges a write of `n` bytes at `off` to a file now `len` long.
fn take_growth(left: &AtomicU64, len: u64, off: u64, n: usize) -> io::Result<()> {
    take(left, (off + n as u64).saturating_sub(len))
}

/// Gives back what cutting a file from `len` to `to` frees.
fn give_back(left: &AtomicU64, len: u64, to: u64) {
    if to < len {
        let _ = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some(l.saturating_add(len - to)));
    }
}

struct SmallFile {
    inner: Arc<dyn StoredFile>,
    left: Arc<AtomicU64>,
}

impl StoredFile for SmallFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        take_growth(&self.left, self.inner.len()?, off, data.len())?;
        self.inner.write_at(off, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let was = self.inner.len()?;
        take(&self.left, len.saturating_sub(was))?;
        self.inner.set_len(len)?;
        give_back(&self.left, was, len);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
}

impl Storage for SmallDisk {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all);
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        take_growth(&self.left, self.inner.lstat(p)?.size, off, data.len())?;
        self.inner.write_at(p, off, data)
    }
    fn set_len(&self, p: &Path, len: u64) -> io::Result<()> {
        let was = self.inner.lstat(p)?.size;
        take(&self.left, len.saturating_sub(was))?;
        self.inner.set_len(p, len)?;
        give_back(&self.left, was, len);
        Ok(())
    }
    fn open_file(&self, p: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        let inner = self.inner.open_file(p, create)?;
        Ok(Arc::new(SmallFile { inner, left: self.left.clone() }))
    }
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.left.load(Ordering::SeqCst)))
    }
    fn unlink(&self, p: &Path) -> io::Result<()> {
        let size = self.inner.lstat(p)?.size;
        self.inner.unlink(p)?;
        give_back(&self.left, size, 0);
        Ok(())
    }
}

fn opts(spill: u64) -> Options {
    Options { spill_threshold: spill, flush_interval: None, ..Default::default() }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn data_bytes(fs: &MemFs) -> u64 {
    let dir = Path::new(META_DIR).join("data");
    fs.read_dir(&dir).unwrap().iter().map(|(n, _)| fs.lstat(&dir.join(n)).unwrap().size).sum()
}

fn assert_all_chunks(fs: &MemFs, name: &str, chunk: &[u8], n: usize) {
    let tree = dump_storage(fs);
    let Node::File { data, .. } = &tree[Path::new(name)] else { panic!("{name} is not a file") };
    assert_eq!(data.len(), n * chunk.len());
    assert!(data.chunks(chunk.len()).all(|c| c == chunk), "{name}: wrong content");
}

/// Story: a transaction creates a 24 MiB file. Its content is staged in a
/// data file of its own while the transaction runs (not in memory), the
/// commit syncs that file and journals only a reference to it, and the
/// checkpoint renames it into place: the bytes are written once. The
/// engine is dropped without a checkpoint (a crash after the commit):
/// recovery finds the data file through the record.
#[test]
fn a_big_new_file_is_written_once_not_journaled() {
    let fs = Arc::new(MemFs::new());
    let staging = || Options { stage_threshold: 256 << 10, ..opts(256 << 10) };
    let e = Engine::open(fs.clone(), staging()).unwrap();
    let journal_before = e.stats().journal_bytes;
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("big"), 0o644, 0, 0).unwrap().obj;
    let chunk = pattern(1 << 20, 7);
    for i in 0..24u64 {
        e.write(Some(tx), f, i << 20, &chunk).unwrap();
    }
    assert_eq!(data_bytes(&fs), 24 << 20, "the new file's content is staged on disk");
    assert_eq!(e.read(Some(tx), f, (23 << 20) + 5, 3).unwrap(), chunk[5..8].to_vec());
    e.commit(tx, Durability::Durable).unwrap();
    let journaled = e.stats().journal_bytes - journal_before;
    assert!(journaled < 4096, "a staged file's bytes are not journaled: {journaled} journal bytes");
    assert_eq!(e.getattr(None, f).unwrap().size, 24 << 20);
    assert_eq!(e.read(None, f, (17 << 20) + 100, 50).unwrap(), chunk[100..150].to_vec());
    drop(e);
    let e = Engine::open(fs.clone(), staging()).unwrap();
    assert_eq!(data_bytes(&fs), 0, "the checkpoint at open placed the data file");
    e.close().unwrap();
    assert_all_chunks(&fs, "big", &chunk, 24);
    assert!(leftovers(&*fs).is_empty());
}

/// Story: a staged new file is committed ordered, then a later commit
/// overwrites its middle and truncates its tail before any checkpoint. The
/// ordered commit names its synced data file too; the checkpoint cannot
/// rename that file any more (it is not the content) and copies from it
/// under the later changes. Reopening after a crash gives the same bytes.
#[test]
fn a_staged_file_changed_by_a_later_commit_is_copied_not_renamed() {
    let fs = Arc::new(MemFs::new());
    let staging = || Options { stage_threshold: 64 << 10, checkpoint_bytes: u64::MAX, ..opts(64 << 20) };
    let e = Engine::open(fs.clone(), staging()).unwrap();
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o640, 0, 0).unwrap().obj;
    let mut want = pattern(300 << 10, 3);
    e.write(Some(tx), f, 0, &want).unwrap();
    e.commit(tx, Durability::Ordered).unwrap();
    assert_eq!(data_bytes(&fs), 300 << 10, "an ordered commit keeps the staged file, named");
    let tx = e.begin();
    e.write(Some(tx), f, 100 << 10, b"middle").unwrap();
    e.truncate(Some(tx), f, 200 << 10).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    want[(100 << 10)..(100 << 10) + 6].copy_from_slice(b"middle");
    want.truncate(200 << 10);
    assert_eq!(e.read(None, f, 0, 400 << 10).unwrap(), want);
    drop(e);
    let e = Engine::open(fs.clone(), staging()).unwrap();
    let f = e.resolve(None, Path::new("f")).unwrap();
    assert_eq!(e.read(None, f, 0, 400 << 10).unwrap(), want);
    e.close().unwrap();
    let tree = dump_storage(&*fs);
    let Node::File { data, .. } = &tree[Path::new("f")] else { panic!("f is not a file") };
    assert_eq!(data, &want);
    assert!(leftovers(&*fs).is_empty());
}

/// Story: a transaction overwrites an existing 24 MiB file with a 256 KiB
/// memory budget. Past the budget its bytes go to a shadow data file (at
/// their own offsets), the commit names that file instead of copying it
/// into the journal, and after a crash the checkpoint at open renames it
/// over the file; the old inode stays as the one spare data file.
#[test]
fn a_big_overwrite_spills_to_a_data_file_and_checkpoints() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts(256 << 10)).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("big"), 0o644, 0, 0).unwrap().obj;
    let old = pattern(1 << 20, 1);
    for i in 0..24u64 {
        e.write(None, f, i << 20, &old).unwrap();
    }
    e.checkpoint().unwrap();
    let journal_before = e.stats().journal_bytes;
    let tx = e.begin();
    let chunk = pattern(1 << 20, 7);
    for i in 0..24u64 {
        e.write(Some(tx), f, i << 20, &chunk).unwrap();
    }
    assert!(data_bytes(&fs) >= 23 << 20, "the data past the budget is on disk: {} bytes", data_bytes(&fs));
    assert_eq!(e.read(None, f, 5, 3).unwrap(), old[5..8].to_vec(), "isolated");
    e.commit(tx, Durability::Durable).unwrap();
    let journaled = e.stats().journal_bytes - journal_before;
    assert!(journaled < (1 << 20), "only the in-memory part is journaled: {journaled} bytes");
    assert_eq!(e.read(None, f, (17 << 20) + 100, 50).unwrap(), chunk[100..150].to_vec());
    drop(e);
    let e = Engine::open(fs.clone(), opts(256 << 10)).unwrap();
    assert_eq!(data_bytes(&fs), 24 << 20, "the checkpoint at open renamed the shadow and kept one spare");
    e.close().unwrap();
    assert_all_chunks(&fs, "big", &chunk, 24);
    assert!(leftovers(&*fs).is_empty());
}

/// Story: the disk fills up while a commit is journaled. The commit fails
/// with ENOSPC and changes nothing; the engine keeps working, and once
/// space is freed the same work commits. Reopening shows no trace of the
/// failed attempt.
#[test]
fn a_commit_that_does_not_fit_fails_whole_with_enospc() {
    let left = Arc::new(AtomicU64::new(u64::MAX));
    let disk = Arc::new(SmallDisk { inner: MemFs::new(), left: left.clone() });
    // Journaled, not staged: the record itself does not fit.
    let journaled = || Options { stage_threshold: u64::MAX, ..opts(64 << 20) };
    let e = Engine::open(disk.clone(), journaled()).unwrap();
    let keep = e.create(None, ObjId::ROOT, OsStr::new("keep"), 0o644, 0, 0).unwrap().obj;
    e.write(None, keep, 0, b"committed before").unwrap();
    e.sync().unwrap();
    let before = dump_engine(&e, None);

    left.store(1 << 20, Ordering::SeqCst); // 1 MiB of disk left
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("huge"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), f, 0, &pattern(4 << 20, 1)).unwrap();
    e.write(Some(tx), keep, 0, b"overwritten").unwrap();
    let err = e.commit(tx, Durability::Durable).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("journal"), "the error says where: {err}");
    assert_eq!(dump_engine(&e, None), before, "a failed commit changes nothing");

    // Still working: small commits fit, and after freeing space the big one too.
    e.write(None, keep, 0, b"COMMITTED").unwrap();
    left.store(u64::MAX, Ordering::SeqCst);
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("huge"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), f, 0, &pattern(4 << 20, 1)).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    let after = dump_engine(&e, None);
    drop(e); // a crash: recovery must replay exactly the successful commits
    let e = Engine::open(disk.clone(), journaled()).unwrap();
    assert_eq!(dump_engine(&e, None), after);
    assert_eq!(e.read(None, e.resolve(None, Path::new("keep")).unwrap(), 0, 9).unwrap(), b"COMMITTED");
    e.close().unwrap();
}

/// Story: the disk fills up while a transaction writes a big new file. The
/// write into its staged data file fails with ENOSPC naming that file; the
/// transaction aborts and leaves nothing, neither in the tree nor in
/// `.txfs/data`.
#[test]
fn a_staged_write_that_does_not_fit_fails_with_enospc_and_aborts_clean() {
    let left = Arc::new(AtomicU64::new(u64::MAX));
    let disk = Arc::new(SmallDisk { inner: MemFs::new(), left: left.clone() });
    let e = Engine::open(disk.clone(), Options { stage_threshold: 256 << 10, ..opts(64 << 20) }).unwrap();
    let before = dump_engine(&e, None);
    left.store(1 << 20, Ordering::SeqCst);
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("huge"), 0o644, 0, 0).unwrap().obj;
    let err = e.write(Some(tx), f, 0, &pattern(4 << 20, 1)).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains(".txfs/data/"), "the error says where: {err}");
    e.abort(tx).unwrap();
    assert_eq!(dump_engine(&e, None), before);
    assert_eq!(data_bytes(&disk.inner), 0, "abort removes the data file");
    left.store(u64::MAX, Ordering::SeqCst);
    e.close().unwrap();
    assert!(leftovers(&disk.inner).is_empty());
}

/// Story: the disk is too full for a checkpoint. The checkpoint is not
/// started (the backing tree is untouched), fails with ENOSPC, and the
/// engine keeps working — reads, plain writes and commits that fit the
/// journal — instead of poisoning itself; once space is freed the next
/// checkpoint runs and the backing tree holds everything.
#[test]
fn a_checkpoint_that_does_not_fit_is_postponed_not_poisoned() {
    let left = Arc::new(AtomicU64::new(u64::MAX));
    let disk = Arc::new(SmallDisk { inner: MemFs::new(), left: left.clone() });
    let e = Engine::open(disk.clone(), opts(64 << 20)).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &pattern(2 << 20, 3)).unwrap();
    e.sync().unwrap();
    let backing_before = dump_storage(&disk.inner);

    left.store(1 << 20, Ordering::SeqCst); // less than the 2 MiB the checkpoint writes
    let err = e.checkpoint().unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("bytes free"), "the error says why: {err}");
    assert_eq!(dump_storage(&disk.inner), backing_before, "a postponed checkpoint touched the backing tree");

    // Still working.
    assert_eq!(e.read(None, f, 0, 2 << 20).unwrap(), pattern(2 << 20, 3));
    e.write(None, f, 0, b"later").unwrap();
    let tx = e.begin();
    let g = e.create(Some(tx), ObjId::ROOT, OsStr::new("g"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), g, 0, b"in a transaction").unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    let state = dump_engine(&e, None);

    left.store(u64::MAX, Ordering::SeqCst);
    e.checkpoint().expect("the checkpoint runs once there is room");
    assert_eq!(dump_engine(&e, None), state);
    e.close().unwrap();
    let e = Engine::open(disk.clone(), opts(64 << 20)).unwrap();
    assert_eq!(dump_engine(&e, None), state, "the backing tree holds everything");
    assert_eq!(e.read(None, e.resolve(None, Path::new("g")).unwrap(), 0, 16).unwrap(), b"in a transaction");
    e.close().unwrap();
}

/// Story: big writes past the memory budget are copied into the spill file
/// without the engine lock. Two threads of one transaction and a second
/// transaction write 1 MiB pieces at once, some overlapping (the last
/// write of a range wins, as the transaction sees it); every byte lands
/// where it was written, in the transaction's view, after commit and after
/// a crash and recovery.
#[test]
fn concurrent_spilled_writes_land_whole() {
    let fs = Arc::new(MemFs::new());
    let e = Arc::new(Engine::open(fs.clone(), opts(64 << 10)).unwrap());
    let a = e.create(None, ObjId::ROOT, OsStr::new("a"), 0o644, 0, 0).unwrap().obj;
    let b = e.create(None, ObjId::ROOT, OsStr::new("b"), 0o644, 0, 0).unwrap().obj;
    e.write(None, a, 0, &[0u8; 1]).unwrap();
    let (ta, tb) = (e.begin(), e.begin());
    let handles: Vec<_> = (0..3u8)
        .map(|k| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..8u64 {
                    // Thread k writes pieces k, k+3, ... of a (two threads)
                    // or of b (the other transaction).
                    let (tx, f, seed) = if k < 2 { (ta, a, k) } else { (tb, b, 9) };
                    let piece = if k < 2 { i * 2 + k as u64 } else { i };
                    e.write(Some(tx), f, piece << 20, &pattern(1 << 20, seed + piece as u8)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Overlap: rewrite piece 3 of a from this thread.
    e.write(Some(ta), a, 3 << 20, &pattern(1 << 20, 77)).unwrap();
    let want_a: Vec<u8> =
        (0..16u64).flat_map(|p| pattern(1 << 20, if p == 3 { 77 } else { (p % 2) as u8 + p as u8 })).collect();
    let want_b: Vec<u8> = (0..8u64).flat_map(|p| pattern(1 << 20, 9 + p as u8)).collect();
    assert_eq!(e.read(Some(ta), a, 0, 16 << 20).unwrap(), want_a);
    assert_eq!(e.read(None, a, 0, 16 << 20).unwrap(), vec![0u8; 1], "isolated until commit");
    e.commit(ta, Durability::Durable).unwrap();
    e.commit(tb, Durability::Durable).unwrap();
    drop(Arc::try_unwrap(e).ok().expect("engine still shared"));
    let e = Engine::open(fs.clone(), opts(64 << 10)).unwrap();
    let (a, b) = (e.resolve(None, Path::new("a")).unwrap(), e.resolve(None, Path::new("b")).unwrap());
    assert_eq!(e.read(None, a, 0, 16 << 20).unwrap(), want_a);
    assert_eq!(e.read(None, b, 0, 8 << 20).unwrap(), want_b);
    e.close().unwrap();
    assert!(leftovers(&*fs).is_empty());
}

/// A small disk whose engine checkpointed a 3 MiB journal into the spare
/// (journal.rs, "Recycled journals"): the bytes left, the disk, the
/// options, the engine, the file "f", the spare's path.
#[allow(clippy::type_complexity)]
fn with_spare() -> (Arc<AtomicU64>, Arc<SmallDisk>, fn() -> Options, Engine, ObjId, std::path::PathBuf) {
    fn o() -> Options {
        Options { stage_threshold: u64::MAX, checkpoint_bytes: u64::MAX, ..opts(64 << 20) }
    }
    let left = Arc::new(AtomicU64::new(u64::MAX));
    let disk = Arc::new(SmallDisk { inner: MemFs::new(), left: left.clone() });
    let e = Engine::open(disk.clone(), o()).unwrap();
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), f, 0, &pattern(3 << 20, 1)).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    e.checkpoint().unwrap();
    (left, disk, o, e, f, Path::new(META_DIR).join("journal-spare"))
}

/// Story: a checkpoint kept the journal it retired as the spare (to become
/// a later epoch's journal, journal.rs "Recycled journals"); then the disk
/// fills up. The commit that does not fit fails whole, and gives the
/// spare's space back, so its retry fits.
#[test]
fn a_full_disk_gets_the_spare_journal_back() {
    let (left, disk, o, e, f, spare) = with_spare();
    assert!(disk.lstat(&spare).is_ok_and(|m| m.size > 3 << 20), "no 3 MiB spare after the checkpoint");

    left.store(1 << 20, Ordering::SeqCst); // 1 MiB of disk left
    let write2 = || {
        let tx = e.begin();
        e.write(Some(tx), f, 0, &pattern(2 << 20, 2)).unwrap();
        e.commit(tx, Durability::Durable)
    };
    let err = write2().unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(disk.lstat(&spare).is_err(), "the failed commit kept the spare journal");
    write2().expect("the retry fits once the spare is gone");
    assert_eq!(e.read(None, f, 0, 2 << 20).unwrap(), pattern(2 << 20, 2));
    drop(e); // a crash; recovery's checkpoint needs room again
    left.store(u64::MAX, Ordering::SeqCst);
    let e = Engine::open(disk.clone(), o()).unwrap();
    assert_eq!(e.read(None, e.resolve(None, Path::new("f")).unwrap(), 0, 2 << 20).unwrap(), pattern(2 << 20, 2));
}

/// Story: the disk fills up while a spare journal is kept; the next
/// checkpoint needs more room than is free, but not more than the spare
/// holds: it gives the spare back and runs, instead of being postponed.
#[test]
fn a_checkpoint_short_of_space_gets_the_spare_journal_back() {
    let (left, disk, _, e, f, spare) = with_spare();
    assert!(disk.lstat(&spare).is_ok(), "no spare after the checkpoint");
    let tx = e.begin();
    e.write(Some(tx), f, 0, &pattern(1 << 20, 2)).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    left.store(3 << 19, Ordering::SeqCst); // 1.5 MiB left: the checkpoint asks for ~2 MiB
    e.checkpoint().expect("the checkpoint gives the spare back and runs");
    let mut head = vec![0u8; 1 << 20];
    disk.inner.read_at(Path::new("f"), 0, &mut head).unwrap();
    assert_eq!(head, pattern(1 << 20, 2), "the backing file holds the checkpointed overwrite");
}

/// A MemFs whose journal files fail one `fdatasync` with EIO once armed
/// (the bytes stay: only the sync reports the fault).
struct FailingSync {
    inner: Arc<MemFs>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

struct FailingSyncFile {
    inner: Arc<dyn StoredFile>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl StoredFile for FailingSyncFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(off, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn sync_data(&self) -> io::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_data()
    }
}

impl Storage for FailingSync {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all);
    fn open_file(&self, p: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        let inner = self.inner.open_file(p, create)?;
        if !p.starts_with(Path::new(META_DIR).join("journal")) {
            return Ok(inner);
        }
        Ok(Arc::new(FailingSyncFile { inner, armed: self.armed.clone() }))
    }
}

/// Story (issue 23, one poison latch): the journal's `fdatasync` fails once
/// with EIO. From then on nothing is acknowledged — not a durable wait, not
/// a plain write, not an ordered commit, not a durable one — until the
/// engine is reopened (plain reads of what memory holds go on); recovery
/// then gives a prefix of the commits.
#[test]
fn a_failed_journal_sync_stops_every_acknowledgement() {
    let mem = Arc::new(MemFs::new());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fs = Arc::new(FailingSync { inner: mem.clone(), armed: armed.clone() });
    let e = Engine::open(fs.clone(), opts(64 << 20)).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"one").unwrap();
    e.sync().unwrap();
    assert_eq!(e.fault(), None);

    armed.store(true, Ordering::SeqCst);
    e.write(None, f, 0, b"two").unwrap(); // appended before the fault is known
    let err = e.sync().unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(!armed.load(Ordering::SeqCst), "the injected fault was not met");

    let err = e.write(None, f, 0, b"three").expect_err("a plain write acknowledged after a failed journal sync");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    for durability in [Durability::Ordered, Durability::Durable] {
        let r = (|| {
            let tx = e.begin();
            e.write(Some(tx), f, 0, b"four")?;
            e.commit(tx, durability)
        })();
        let err = r.expect_err("a commit acknowledged after a failed journal sync");
        assert_eq!(err.errno(), libc::EIO, "{durability:?}: {err}");
    }
    assert!(e.sync().is_err(), "a later durable wait succeeded");
    let fault = e.fault().expect("txfs status reports the fault");
    assert!(fault.why.contains("journal fdatasync") && fault.reads_go_on, "{fault:?}");
    // What memory holds is what was appended: plain reads go on.
    assert_eq!(e.read(None, f, 0, 16).unwrap(), b"two");
    drop(e);

    let e = Engine::open(mem.clone(), opts(64 << 20)).unwrap();
    let f = e.resolve(None, Path::new("f")).unwrap();
    let got = e.read(None, f, 0, 16).unwrap();
    assert!(got == b"one" || got == b"two", "not a prefix of the commits: {:?}", String::from_utf8_lossy(&got));
}

/// A MemFs whose backing tree (everything outside `.txfs/`) refuses
/// content writes with EIO while armed: a disk going bad under the
/// checkpoint's contents phase.
struct FailingTree {
    inner: Arc<MemFs>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl FailingTree {
    fn check(&self, p: &Path) -> io::Result<()> {
        if self.armed.load(Ordering::SeqCst) && !p.starts_with(META_DIR) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

impl Storage for FailingTree {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.check(p)?;
        self.inner.write_at(p, off, data)
    }
    fn set_len(&self, p: &Path, len: u64) -> io::Result<()> {
        self.check(p)?;
        self.inner.set_len(p, len)
    }
}

/// An engine on a [`FailingTree`] (disarmed) whose next checkpoint has
/// contents to write: "new" over the checkpointed "old contents" of `f`.
fn contents_fault_ahead() -> (Arc<MemFs>, Arc<std::sync::atomic::AtomicBool>, Engine, ObjId) {
    let mem = Arc::new(MemFs::new());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fs = Arc::new(FailingTree { inner: mem.clone(), armed: armed.clone() });
    let e = Engine::open(fs, opts(64 << 20)).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"old contents").unwrap();
    e.checkpoint().unwrap();
    e.write(None, f, 0, b"new").unwrap();
    e.sync().unwrap();
    (mem, armed, e, f)
}

/// Story (issue 23): the checkpoint's contents phase meets EIO on the
/// backing tree (a disk going bad, or one that filled after the estimate).
/// The mount used to stop: first every request, then every
/// acknowledgement until it was mounted again. Now everything goes on —
/// plain reads see the committed contents, writes and commits are
/// acknowledged (into the next journal) — `fault()` says a checkpoint is
/// being retried, and the next checkpoint, once the disk answers, finishes
/// it and then checkpoints what came after.
#[test]
fn a_checkpoint_that_fails_writing_contents_is_retried_and_nothing_stops() {
    let (mem, armed, e, f) = contents_fault_ahead();
    armed.store(true, Ordering::SeqCst);
    let err = e.checkpoint().expect_err("the checkpoint met EIO");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"new contents", "plain reads go on, exact");
    assert_eq!(e.getattr(None, f).unwrap().size, 12);
    let fault = e.fault().expect("txfs status reports the fault");
    assert!(fault.why.contains("checkpoint failed writing contents") && fault.retried, "{fault:?}");
    // Acknowledgements go on: a plain write, a durable transaction.
    e.write(None, f, 0, b"NEW").unwrap();
    let tx = e.begin();
    let g = e.create(Some(tx), ObjId::ROOT, OsStr::new("g"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), g, 0, b"after the fault").unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    e.sync().unwrap();
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"NEW contents");
    // Still failing: tried again, counted, nothing lost.
    let err = e.checkpoint().expect_err("the disk still fails");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(e.fault().unwrap().why.contains("2 attempts"), "{:?}", e.fault());
    armed.store(false, Ordering::SeqCst);
    e.checkpoint().expect("the retried checkpoint, and the next, once the disk answers");
    assert_eq!(e.fault(), None, "healthy again");
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"NEW contents");
    e.close().unwrap();
    let mut got = vec![0u8; 12];
    mem.read_at(Path::new("f"), 0, &mut got).unwrap();
    assert_eq!(got, b"NEW contents", "the tree holds both checkpoints");
    let mut got = vec![0u8; 15];
    mem.read_at(Path::new("g"), 0, &mut got).unwrap();
    assert_eq!(got, b"after the fault");
}

/// The same fault, then a crash (the engine dropped, never closed) while
/// the checkpoint waits for its retry: the next open finishes it, and what
/// was acknowledged after the fault is there.
#[test]
fn a_crash_while_a_failed_checkpoint_waits_loses_nothing_acknowledged() {
    let (mem, armed, e, f) = contents_fault_ahead();
    armed.store(true, Ordering::SeqCst);
    e.checkpoint().expect_err("the checkpoint met EIO");
    e.write(None, f, 3, b"-and-after").unwrap();
    e.sync().unwrap();
    drop(e);
    armed.store(false, Ordering::SeqCst);
    let e = Engine::open(mem.clone(), opts(64 << 20)).unwrap();
    let f = e.resolve(None, Path::new("f")).unwrap();
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"new-and-after");
    e.close().unwrap();
    let mut got = vec![0u8; 13];
    mem.read_at(Path::new("f"), 0, &mut got).unwrap();
    assert_eq!(got, b"new-and-after");
}

/// A MemFs that fails, once each while armed, the unlink of a checkpoint
/// marker (`retire`'s second step: the old journal's name is gone already)
/// and every content write to the backing tree (not truncates).
struct FailingRetire {
    inner: Arc<MemFs>,
    marker: Arc<std::sync::atomic::AtomicBool>,
    writes: Arc<std::sync::atomic::AtomicBool>,
}

impl Storage for FailingRetire {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file, set_len);
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        if self.writes.load(Ordering::SeqCst) && !p.starts_with(META_DIR) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_at(p, off, data)
    }
    fn unlink(&self, p: &Path) -> io::Result<()> {
        let marker = p.extension().is_some_and(|x| x.to_string_lossy().starts_with('p'))
            && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ckpt-"));
        if marker && self.marker.swap(false, Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.unlink(p)
    }
}

/// Story (review of the retry): a checkpoint's contents are written and
/// synced, then its retirement fails half way — the old journal's name is
/// gone, the marker's unlink meets EIO. The retry used to write the
/// contents again (truncate, then extents); interrupted (here by EIO on the
/// writes, then a crash), it left a file cut short, and recovery, finding
/// no journal, took the plan as done: the bytes were lost. A retry after a
/// failed retirement only retires.
#[test]
fn a_checkpoint_whose_retirement_failed_is_only_retired_again() {
    use std::sync::atomic::AtomicBool;
    let mem = Arc::new(MemFs::new());
    let (marker, writes) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let fs = Arc::new(FailingRetire { inner: mem.clone(), marker: marker.clone(), writes: writes.clone() });
    let e = Engine::open(fs.clone(), opts(64 << 20)).unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"old contents, longer").unwrap();
    e.checkpoint().unwrap();
    e.truncate(None, f, 0).unwrap();
    e.write(None, f, 0, b"new contents").unwrap();
    e.sync().unwrap();
    marker.store(true, Ordering::SeqCst);
    let err = e.checkpoint().expect_err("the retirement met EIO");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(!marker.load(Ordering::SeqCst), "the injected fault was not met");
    assert!(e.fault().is_some_and(|f| f.retried), "{:?}", e.fault());
    writes.store(true, Ordering::SeqCst);
    e.checkpoint().expect("a retirement retried alone writes no contents");
    assert_eq!(e.fault(), None);
    drop(e);
    writes.store(false, Ordering::SeqCst);
    let mut got = vec![0u8; 12];
    mem.read_at(Path::new("f"), 0, &mut got).unwrap();
    assert_eq!(got, b"new contents");
    let e = Engine::open(mem.clone(), opts(64 << 20)).unwrap();
    let f = e.resolve(None, Path::new("f")).unwrap();
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"new contents");
}

/// A MemFs with a fixed number of free inodes (as ext4 has) and, while
/// `mkdir_fails` is above 0, that many `mkdir`s in the backing tree
/// failing with EIO (a disk that hiccups under phase 2).
struct FewInodes {
    inner: Arc<MemFs>,
    inodes: Arc<AtomicU64>,
    mkdir_fails: Arc<AtomicU64>,
}

impl Storage for FewInodes {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn mkdir(&self, p: &Path, mode: u32) -> io::Result<()> {
        let fail = !p.starts_with(META_DIR)
            && self.mkdir_fails.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if fail {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.mkdir(p, mode)
    }
    fn free_inodes(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.inodes.load(Ordering::SeqCst)))
    }
}

fn few_inodes() -> (Arc<FewInodes>, Engine) {
    let fs = Arc::new(FewInodes {
        inner: Arc::new(MemFs::new()),
        inodes: Arc::new(AtomicU64::new(u64::MAX)),
        mkdir_fails: Arc::new(AtomicU64::new(0)),
    });
    let e = Engine::open(fs.clone(), opts(64 << 20)).unwrap();
    for i in 0..100 {
        let d = e.mkdir(None, ObjId::ROOT, OsStr::new(&format!("d{i}")), 0o755, 0, 0).unwrap().obj;
        let f = e.create(None, d, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, format!("file {i}").as_bytes()).unwrap();
    }
    e.sync().unwrap();
    (fs, e)
}

/// Story (issue 23): a user's many small files use up the backing's
/// inodes (ext4 has a fixed number). The checkpoint's creates would fail
/// half-way through phase 2 and stop the mount; it is not started instead
/// (ENOSPC, saying so), everything goes on, and it runs once inodes are
/// free again.
#[test]
fn a_checkpoint_that_would_run_out_of_inodes_is_postponed_not_poisoned() {
    let (fs, e) = few_inodes();
    let before = dump_storage(&*fs.inner);
    fs.inodes.store(150, Ordering::SeqCst); // 200 objects to create
    let err = e.checkpoint().expect_err("too few inodes");
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("inodes free"), "the error says why: {err}");
    assert_eq!(dump_storage(&*fs.inner), before, "a postponed checkpoint touched the backing tree");
    let f = e.resolve(None, Path::new("d7/f")).unwrap();
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"file 7");
    e.write(None, f, 0, b"FILE").unwrap();
    e.sync().unwrap();
    let state = dump_engine(&e, None);
    fs.inodes.store(1 << 20, Ordering::SeqCst);
    e.checkpoint().expect("the checkpoint runs once inodes are free");
    e.close().unwrap();
    let e = Engine::open(fs.clone(), opts(64 << 20)).unwrap();
    assert_eq!(dump_engine(&e, None), state, "the backing tree holds everything");
}

/// Story (issue 23): a disk that answers one `mkdir` of the checkpoint's
/// phase 2 with EIO. Past phase 1 the tree is half-way through the plan,
/// so the engine used to stop (every read EIO until a remount); the
/// namespace phases are idempotent and are run again at once: the
/// checkpoint succeeds and nothing reports a fault. A disk that keeps
/// failing still stops the mount, and recovery finishes the plan.
#[test]
fn an_io_error_in_the_namespace_phases_is_retried_at_once() {
    let (fs, e) = few_inodes();
    fs.mkdir_fails.store(1, Ordering::SeqCst);
    e.checkpoint().expect("one EIO in phase 2 is retried");
    assert_eq!(fs.mkdir_fails.load(Ordering::SeqCst), 0, "the fault was met");
    assert_eq!(e.fault(), None);
    let f = e.resolve(None, Path::new("d42/f")).unwrap();
    assert_eq!(e.read(None, f, 0, 64).unwrap(), b"file 42");
    let state = dump_engine(&e, None);
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs.inner).len(), state.len());
    drop(state);

    // Failing more often than it is retried: stopped, then recovered.
    let (fs, e) = few_inodes();
    let state = dump_engine(&e, None);
    fs.mkdir_fails.store(u64::MAX, Ordering::SeqCst);
    let err = e.checkpoint().expect_err("a disk that keeps failing");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(e.fault().is_some());
    drop(e);
    fs.mkdir_fails.store(0, Ordering::SeqCst);
    let e = Engine::open(fs.clone(), opts(64 << 20)).unwrap();
    assert_eq!(dump_engine(&e, None), state, "recovery finished the plan");
}
