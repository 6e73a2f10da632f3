//! [`CrashFs`]: a [`MemFs`]-like storage that can be power-cut.
//!
//! ## Model
//! A `CrashFs` holds two trees: the *live* one, which every call reads and
//! changes at once (exactly as a [`MemFs`] would), and the *durable* one,
//! what the disk would show after a power cut. Between them sit the
//! operations issued but not yet durable:
//!
//! * the **metadata log**: every successful namespace or attribute change
//!   (`create_file`, `mkdir`, `symlink`, `mknod`, `rename`, `link`, `unlink`,
//!   `rmdir`, `set_mode`, `set_owner`, `set_times`, `set_xattr`,
//!   `remove_xattr`, and a creating `open_file`), in issue order;
//! * per inode (by inode number), the **pending data**: every `write_at` and
//!   `set_len`, by path or through a [`StoredFile`] handle, in issue order.
//!
//! Barriers move operations to the durable tree (replaying them there):
//! * `fsync` of a file, or `sync_data` of a handle: the whole metadata log,
//!   then that inode's pending data;
//! * `fsync` of a directory (or of a symlink): the whole metadata log;
//! * `sync_all`: everything.
//!
//! ## What survives a crash
//! (The default model, [`Persistence::Ordered`]: ext4's.)
//! [`CrashFs::crash`] builds, without touching the live state, the tree a
//! reboot would find:
//! 1. the durable tree;
//! 2. plus a **prefix** of the metadata log (any length, from none to all):
//!    namespace changes survive in issue order, as on a journaling fs;
//! 3. then, for each inode present in that tree, its pending data ops:
//!    a prefix of them applied whole; then each *write* up to (not
//!    including) the next `set_len` independently kept whole, dropped, or
//!    torn: only some of its 512-byte sectors (aligned on file offsets),
//!    chosen at random, applied; everything after is lost. A surviving
//!    write past EOF extends the file (zero-filled gap). Data of inodes
//!    absent from the tree (never created, or unlinked) is dropped.
//!
//! Every choice comes from a [`CrashPlan`]: [`CrashPlan::keep_all`] (the
//! result equals the live state, as if synced), [`CrashPlan::drop_all`]
//! (only the durable tree), or [`CrashPlan::random`] (reproducible from the
//! seed). The result is a fresh [`MemFs`] (no open handles, unlinked-but-open
//! inodes gone, inode numbers still never reused), ready for recovery or to
//! be wrapped in a new `CrashFs`.
//!
//! ## The conservative model
//! [`CrashFs::with_persistence`] with [`Persistence::Conservative`] drops
//! the ordering above (ALICE's conservative model; what POSIX promises, and
//! all a file system without a journal, like ext4 without one, gives):
//! * a namespace change (`create_file`, a creating `open_file`, `mkdir`,
//!   `symlink`, `mknod`, `rename`, `link`, `unlink`, `rmdir`) is durable once
//!   every directory it changes — both, for a rename across two — was
//!   fsynced after it; an attribute change (`set_mode`, `set_owner`,
//!   `set_times`, xattrs) once its own inode was fsynced (not by
//!   `sync_data`, which makes only data and size durable); `sync_all`
//!   makes everything durable;
//! * a power cut keeps each pending change, or loses it, independently of
//!   every other, whatever their issue order. Changes are replayed by inode
//!   number: an entry added to a directory whose own `mkdir` was lost is
//!   lost with it, a directory moved without the earlier move of an entry
//!   below it carries that entry along, and whatever is unreachable from
//!   the root afterwards is gone (a file's link count is its names);
//! * a new object's inode is durable at once (unnamed until its name is),
//!   so its data can be synced before its name;
//! * data ops behave as above, but a torn write is torn at 4 KiB pages.
//!
//! ## Process death
//! [`CrashFs::set_fail_after`] simulates the process dying at a step: after
//! `n` more mutating calls (writes, namespace changes, syncs, creating
//! opens, through paths or handles), every mutating call fails with
//! `"injected crash"` and changes nothing; reads keep working.
//!
//! Timestamps replay exactly: every operation is stamped once, when issued.
//! A data op applied after a later metadata op (possible since data becomes
//! durable per inode) does not override that op's `mtime`/`ctime`.

use super::mem::{InodeCopy, MemTree};
use super::{FileKind, MemFs, Meta, Storage, StoredFile, Timestamp};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Sector size for torn writes ([`Persistence::Ordered`]).
const SECTOR: u64 = 512;
/// Page size for torn writes ([`Persistence::Conservative`]).
const PAGE: u64 = 4096;

/// What a power cut may keep of the operations not yet made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// ext4-like (a journaling file system in `data=ordered` mode):
    /// namespace and attribute changes survive as a prefix of their issue
    /// order, and any `fsync` makes every earlier one durable; writes are
    /// torn at 512-byte sectors.
    Ordered,
    /// What POSIX promises and no more (ALICE's conservative model, a
    /// file system without a journal): a namespace change is durable only
    /// once every directory it changes (both, for a rename) was fsynced
    /// after it; an attribute change once its own inode was fsynced
    /// (`sync_data` is not enough); until then each survives or is lost
    /// independently of every other. Writes are torn at 4 KiB pages.
    Conservative,
}

/// A namespace or attribute change as [`Persistence::Conservative`]
/// replays it: by inode numbers, so that it applies whatever else
/// survived (an entry added to a directory whose own name was lost is
/// unreachable, and lost with it).
#[derive(Debug)]
enum InodeOp {
    Add { dir: u64, name: OsString, ino: u64 },
    Remove { dir: u64, name: OsString, ino: u64 },
    Rename { fdir: u64, fname: OsString, tdir: u64, tname: OsString, ino: u64 },
    Attrs { ino: u64, attrs: InodeCopy },
}

impl InodeOp {
    fn apply(&self, t: &mut MemTree, now: Timestamp) {
        match self {
            InodeOp::Add { dir, name, ino } => t.set_entry(*dir, name, *ino, now),
            InodeOp::Remove { dir, name, ino } => t.clear_entry(*dir, name, *ino, now),
            InodeOp::Rename { fdir, fname, tdir, tname, ino } => {
                t.clear_entry(*fdir, fname, *ino, now);
                t.set_entry(*tdir, tname, *ino, now);
            }
            InodeOp::Attrs { ino, attrs } => t.set_attrs(*ino, attrs),
        }
    }
}

/// A pending [`InodeOp`] and the inodes still to be fsynced before it is
/// durable.
#[derive(Debug)]
struct Pending {
    op: InodeOp,
    now: Timestamp,
    deps: Vec<u64>,
}

/// A logged namespace or attribute change. Creating ops carry the inode
/// number the live tree gave, so that replay recreates the same inode.
#[derive(Debug)]
enum MetaOp {
    CreateFile { path: PathBuf, mode: u32, ino: u64 },
    Mkdir { path: PathBuf, mode: u32, ino: u64 },
    Symlink { target: OsString, path: PathBuf, ino: u64 },
    Mknod { path: PathBuf, kind: FileKind, mode: u32, rdev: u64, ino: u64 },
    Rename { from: PathBuf, to: PathBuf },
    Link { existing: PathBuf, new: PathBuf },
    Unlink { path: PathBuf },
    Rmdir { path: PathBuf },
    SetMode { path: PathBuf, mode: u32 },
    SetOwner { path: PathBuf, uid: u32, gid: u32 },
    SetTimes { path: PathBuf, atime: Timestamp, mtime: Timestamp },
    SetXattr { path: PathBuf, name: OsString, value: Vec<u8> },
    RemoveXattr { path: PathBuf, name: OsString },
}

impl MetaOp {
    /// Applies the op; `Ok(false)` if it changed nothing (an existing file
    /// "created" again), so that it needs no logging.
    fn apply(&self, t: &mut MemTree, now: Timestamp) -> io::Result<bool> {
        match self {
            MetaOp::CreateFile { path, mode, ino } => return t.create_file(path, *mode, *ino, now),
            MetaOp::Mkdir { path, mode, ino } => t.mkdir(path, *mode, *ino, now),
            MetaOp::Symlink { target, path, ino } => t.symlink(target, path, *ino, now),
            MetaOp::Mknod { path, kind, mode, rdev, ino } => t.mknod(path, *kind, *mode, *rdev, *ino, now),
            MetaOp::Rename { from, to } => t.rename(from, to, now),
            MetaOp::Link { existing, new } => t.link(existing, new, now),
            MetaOp::Unlink { path } => t.unlink(path, now),
            MetaOp::Rmdir { path } => t.rmdir(path, now),
            MetaOp::SetMode { path, mode } => t.set_mode(path, *mode, now),
            MetaOp::SetOwner { path, uid, gid } => t.set_owner(path, *uid, *gid, now),
            MetaOp::SetTimes { path, atime, mtime } => t.set_times(path, *atime, *mtime, now),
            MetaOp::SetXattr { path, name, value } => t.set_xattr(path, name, value, now),
            MetaOp::RemoveXattr { path, name } => t.remove_xattr(path, name, now),
        }
        .map(|()| true)
    }
}

/// A pending data op of one inode.
#[derive(Debug)]
enum DataOp {
    Write { off: u64, data: Vec<u8> },
    SetLen(u64),
}

impl DataOp {
    fn apply(&self, t: &mut MemTree, ino: u64, now: Timestamp) -> io::Result<()> {
        match self {
            DataOp::Write { off, data } => t.write(ino, *off, data, now),
            DataOp::SetLen(len) => t.set_len(ino, *len, now),
        }
    }
}

struct State {
    model: Persistence,
    live: MemTree,
    durable: MemTree,
    /// [`Persistence::Ordered`]: the metadata log.
    meta: Vec<(MetaOp, Timestamp)>,
    /// [`Persistence::Conservative`]: changes not yet durable, in issue order.
    pending: Vec<Pending>,
    data: BTreeMap<u64, Vec<(DataOp, Timestamp)>>,
    /// Mutating calls so far.
    ops: u64,
    /// Mutating calls fail once `ops` reaches this.
    fail_at: Option<u64>,
}

impl State {
    /// Starts a mutating call: counts it, or refuses it past the failpoint.
    fn begin(&mut self) -> io::Result<()> {
        if self.fail_at.is_some_and(|at| self.ops >= at) {
            return Err(io::Error::other("injected crash"));
        }
        self.ops += 1;
        Ok(())
    }

    fn meta(&mut self, op: MetaOp) -> io::Result<()> {
        let now = self.live.tick();
        let before = match (&op, self.model) {
            (_, Persistence::Ordered) => None,
            (MetaOp::Unlink { path } | MetaOp::Rmdir { path }, _) => self.live.lookup(path).ok(),
            (MetaOp::Rename { from, .. }, _) => self.live.lookup(from).ok(),
            _ => None,
        };
        if op.apply(&mut self.live, now)? {
            match self.model {
                Persistence::Ordered => self.meta.push((op, now)),
                Persistence::Conservative => {
                    let (op, deps) = self.by_inode(&op, before)?;
                    self.pending.push(Pending { op, now, deps });
                }
            }
        }
        Ok(())
    }

    /// The directory holding `path`'s last name (live), and that name.
    fn dir_of(&self, path: &Path) -> io::Result<(u64, OsString)> {
        let name = path.file_name().ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok((self.live.lookup(path.parent().unwrap_or(Path::new("")))?, name.to_owned()))
    }

    /// `op`, just applied to the live tree, by inode numbers, with the
    /// inodes whose fsync makes it durable; `before`: the inode an unlink,
    /// rmdir or rename found at its source. A new object's inode is put in
    /// the durable tree at once (unreachable until its name is durable), so
    /// its data can become durable before its name.
    fn by_inode(&mut self, op: &MetaOp, before: Option<u64>) -> io::Result<(InodeOp, Vec<u64>)> {
        let gone = || io::Error::from_raw_os_error(libc::ENOENT);
        Ok(match op {
            MetaOp::CreateFile { path, .. }
            | MetaOp::Mkdir { path, .. }
            | MetaOp::Symlink { path, .. }
            | MetaOp::Mknod { path, .. } => {
                let ino = self.live.lookup(path)?;
                let fresh = self.live.fresh_copy(ino)?;
                self.durable.put_inode(ino, &fresh);
                let (dir, name) = self.dir_of(path)?;
                (InodeOp::Add { dir, name, ino }, vec![dir])
            }
            MetaOp::Link { new, .. } => {
                let ino = self.live.lookup(new)?;
                let (dir, name) = self.dir_of(new)?;
                (InodeOp::Add { dir, name, ino }, vec![dir])
            }
            MetaOp::Unlink { path } | MetaOp::Rmdir { path } => {
                let (dir, name) = self.dir_of(path)?;
                (InodeOp::Remove { dir, name, ino: before.ok_or_else(gone)? }, vec![dir])
            }
            MetaOp::Rename { from, to } => {
                let (fdir, fname) = self.dir_of(from)?;
                let (tdir, tname) = self.dir_of(to)?;
                let deps = if fdir == tdir { vec![fdir] } else { vec![fdir, tdir] };
                (InodeOp::Rename { fdir, fname, tdir, tname, ino: before.ok_or_else(gone)? }, deps)
            }
            MetaOp::SetMode { path, .. }
            | MetaOp::SetOwner { path, .. }
            | MetaOp::SetTimes { path, .. }
            | MetaOp::SetXattr { path, .. }
            | MetaOp::RemoveXattr { path, .. } => {
                let ino = self.live.lookup(path)?;
                (InodeOp::Attrs { ino, attrs: self.live.attrs(ino)? }, vec![ino])
            }
        })
    }

    /// An fsync of `ino` (`Conservative`): the pending changes that waited
    /// only for it become durable, in issue order.
    fn fsynced(&mut self, ino: u64) {
        for p in &mut self.pending {
            p.deps.retain(|d| *d != ino);
        }
        let (ready, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.deps.is_empty());
        self.pending = rest;
        for p in ready {
            p.op.apply(&mut self.durable, p.now);
        }
        self.settle();
    }

    /// With nothing pending, the durable namespace equals the live one:
    /// unreachable inodes are gone for good.
    fn settle(&mut self) {
        if self.pending.is_empty() && self.model == Persistence::Conservative {
            self.durable.collect();
            let live = &self.live;
            self.data.retain(|ino, _| live.exists(*ino));
        }
    }

    fn data(&mut self, ino: u64, op: DataOp) -> io::Result<()> {
        let now = self.live.tick();
        op.apply(&mut self.live, ino, now)?;
        if !matches!(&op, DataOp::Write { data, .. } if data.is_empty()) {
            self.data.entry(ino).or_default().push((op, now));
        }
        Ok(())
    }

    fn flush_meta(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            p.op.apply(&mut self.durable, p.now);
        }
        self.settle();
        for (op, now) in self.meta.drain(..) {
            // The durable tree plus the log so far is the live namespace as
            // it was when the op succeeded: replay cannot fail.
            let replayed = op.apply(&mut self.durable, now);
            debug_assert!(replayed.is_ok(), "replay of {op:?} failed: {replayed:?}");
        }
        // The durable namespace now equals the live one: data of inodes gone
        // from the live tree can never surface again.
        let live = &self.live;
        self.data.retain(|ino, _| live.exists(*ino));
    }

    fn flush_data(&mut self, ino: u64) {
        for (op, now) in self.data.remove(&ino).unwrap_or_default() {
            // Fails only if the inode is gone from the durable tree (an
            // unlinked file still open): its data is lost anyway.
            let _ = op.apply(&mut self.durable, ino, now);
        }
    }
}

/// A power-cuttable [`Storage`]; see the module documentation.
pub struct CrashFs {
    state: Arc<Mutex<State>>,
}

impl Default for CrashFs {
    fn default() -> Self {
        CrashFs::new(MemFs::new())
    }
}

impl CrashFs {
    /// Starts from the contents of `initial`, all of it durable.
    pub fn new(initial: MemFs) -> CrashFs {
        CrashFs::with_persistence(initial, Persistence::Ordered)
    }

    /// [`CrashFs::new`] with the given persistence model.
    pub fn with_persistence(initial: MemFs, model: Persistence) -> CrashFs {
        let mut tree = initial.snapshot();
        tree.forget_open();
        let state = State {
            model,
            live: tree.clone(),
            durable: tree,
            meta: Vec::new(),
            pending: Vec::new(),
            data: BTreeMap::new(),
            ops: 0,
            fail_at: None,
        };
        CrashFs { state: Arc::new(Mutex::new(state)) }
    }

    /// The persistence model this storage crashes with.
    pub fn persistence(&self) -> Persistence {
        self.state.lock().model
    }

    /// The state a power cut *now* would leave, as chosen by `plan`. The
    /// live state is unaffected: call it at any moment, as often as wanted.
    pub fn crash(&self, plan: &mut CrashPlan) -> MemFs {
        let s = self.state.lock();
        let mut t = s.durable.clone();
        let keep = plan.prefix(s.meta.len());
        for (op, now) in &s.meta[..keep] {
            let replayed = op.apply(&mut t, *now);
            debug_assert!(replayed.is_ok(), "replay of {op:?} failed: {replayed:?}");
        }
        for p in &s.pending {
            if plan.keep() {
                p.op.apply(&mut t, p.now);
            }
        }
        let sector = match s.model {
            Persistence::Ordered => SECTOR,
            Persistence::Conservative => PAGE,
        };
        for (&ino, ops) in &s.data {
            if !t.exists(ino) {
                continue;
            }
            let whole = plan.prefix(ops.len());
            for (op, now) in &ops[..whole] {
                let _ = op.apply(&mut t, ino, *now);
            }
            for (op, now) in &ops[whole..] {
                let DataOp::Write { off, data } = op else {
                    break;
                };
                match plan.fate() {
                    Fate::Keep => {
                        let _ = t.write(ino, *off, data, *now);
                    }
                    Fate::Drop => {}
                    Fate::Torn => {
                        let (mut pos, end) = (*off, *off + data.len() as u64);
                        while pos < end {
                            let next = ((pos / sector + 1) * sector).min(end);
                            if plan.coin() {
                                let piece = &data[(pos - off) as usize..(next - off) as usize];
                                let _ = t.write(ino, pos, piece, *now);
                            }
                            pos = next;
                        }
                    }
                }
            }
        }
        if s.model == Persistence::Conservative {
            t.collect();
        }
        // Inode numbers stay unique and times increasing across the reboot.
        (t.next_ino, t.clock) = (s.live.next_ino, s.live.clock);
        MemFs::from_tree(t)
    }

    /// Operations not yet durable (metadata log plus pending data ops).
    pub fn pending_ops(&self) -> usize {
        let s = self.state.lock();
        s.meta.len() + s.pending.len() + s.data.values().map(Vec::len).sum::<usize>()
    }

    /// After `n` more mutating calls, every mutating call fails with
    /// "injected crash" (a dead process); `None` lifts the failpoint.
    pub fn set_fail_after(&self, n: Option<u64>) {
        let mut s = self.state.lock();
        s.fail_at = n.map(|n| s.ops.saturating_add(n));
    }

    /// Mutating calls made so far (refused ones not counted).
    pub fn op_count(&self) -> u64 {
        self.state.lock().ops
    }

    fn meta(&self, op: impl FnOnce(u64) -> MetaOp) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        let op = op(s.live.next_ino);
        s.meta(op)
    }

    fn data(&self, path: &Path, op: DataOp) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        let ino = s.live.file_ino(path)?;
        s.data(ino, op)
    }
}

impl Storage for CrashFs {
    fn lstat(&self, path: &Path) -> io::Result<Meta> {
        self.state.lock().live.lstat(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        self.state.lock().live.read_dir(path)
    }
    fn read_at(&self, path: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let s = self.state.lock();
        s.live.read(s.live.file_ino(path)?, off, buf)
    }
    fn write_at(&self, path: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.data(path, DataOp::Write { off, data: data.to_vec() })
    }
    fn set_len(&self, path: &Path, len: u64) -> io::Result<()> {
        self.data(path, DataOp::SetLen(len))
    }
    fn create_file(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.meta(|ino| MetaOp::CreateFile { path: path.into(), mode, ino })
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.meta(|ino| MetaOp::Mkdir { path: path.into(), mode, ino })
    }
    fn symlink(&self, target: &OsStr, path: &Path) -> io::Result<()> {
        self.meta(|ino| MetaOp::Symlink { target: target.into(), path: path.into(), ino })
    }
    fn mknod(&self, path: &Path, kind: FileKind, mode: u32, rdev: u64) -> io::Result<()> {
        self.meta(|ino| MetaOp::Mknod { path: path.into(), kind, mode, rdev, ino })
    }
    fn readlink(&self, path: &Path) -> io::Result<OsString> {
        self.state.lock().live.readlink(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.meta(|_| MetaOp::Rename { from: from.into(), to: to.into() })
    }
    fn link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.meta(|_| MetaOp::Link { existing: existing.into(), new: new.into() })
    }
    fn unlink(&self, path: &Path) -> io::Result<()> {
        self.meta(|_| MetaOp::Unlink { path: path.into() })
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        self.meta(|_| MetaOp::Rmdir { path: path.into() })
    }
    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.meta(|_| MetaOp::SetMode { path: path.into(), mode })
    }
    fn set_owner(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        self.meta(|_| MetaOp::SetOwner { path: path.into(), uid, gid })
    }
    fn set_times(&self, path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
        self.meta(|_| MetaOp::SetTimes { path: path.into(), atime, mtime })
    }
    fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        self.state.lock().live.get_xattr(path, name)
    }
    fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        self.state.lock().live.list_xattrs(path)
    }
    fn probe_xattrs(&self, _scratch: &Path, kind: FileKind, xattrs: &[(OsString, Vec<u8>, bool)]) -> io::Result<()> {
        super::mem::probe_xattrs(kind, xattrs)
    }
    fn set_xattr(&self, path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
        self.meta(|_| MetaOp::SetXattr { path: path.into(), name: name.into(), value: value.to_vec() })
    }
    fn remove_xattr(&self, path: &Path, name: &OsStr) -> io::Result<()> {
        self.meta(|_| MetaOp::RemoveXattr { path: path.into(), name: name.into() })
    }
    fn fsync(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        let ino = s.live.lookup(path)?;
        match s.model {
            Persistence::Ordered => s.flush_meta(),
            Persistence::Conservative => s.fsynced(ino),
        }
        s.flush_data(ino);
        Ok(())
    }
    fn sync_all(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        s.flush_meta();
        let inos: Vec<u64> = s.data.keys().copied().collect();
        for ino in inos {
            s.flush_data(ino);
        }
        Ok(())
    }
    fn open_file(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        let mut s = self.state.lock();
        if create {
            s.begin()?;
        }
        if create && s.live.absent(path) {
            let ino = s.live.next_ino;
            s.meta(MetaOp::CreateFile { path: path.into(), mode: 0o600, ino })?;
        }
        let ino = s.live.file_ino(path)?;
        s.live.open(ino);
        Ok(Arc::new(CrashFile { state: self.state.clone(), ino }))
    }
}

/// A handle bound to an inode of a [`CrashFs`]'s live tree.
struct CrashFile {
    state: Arc<Mutex<State>>,
    ino: u64,
}

impl StoredFile for CrashFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.state.lock().live.read(self.ino, off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        s.data(self.ino, DataOp::Write { off, data: data.to_vec() })
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        s.data(self.ino, DataOp::SetLen(len))
    }
    fn len(&self) -> io::Result<u64> {
        self.state.lock().live.len(self.ino)
    }
    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        s.begin()?;
        // Conservative: fdatasync makes the data and size durable, not the
        // file's name nor its other attributes.
        if s.model == Persistence::Ordered {
            s.flush_meta();
        }
        s.flush_data(self.ino);
        Ok(())
    }
}

impl Drop for CrashFile {
    fn drop(&mut self) {
        self.state.lock().live.close(self.ino);
    }
}

/// What happens to one pending write beyond the surviving prefix.
#[derive(Clone, Copy)]
enum Fate {
    Keep,
    Drop,
    Torn,
}

/// The choices a [`CrashFs::crash`] makes; see the module documentation.
#[derive(Clone, Debug)]
pub struct CrashPlan(Plan);

#[derive(Clone, Debug)]
enum Plan {
    KeepAll,
    DropAll,
    /// SplitMix64 state: a fixed algorithm, so a seed gives the same crash
    /// on every platform and with every dependency version.
    Random(u64),
}

impl CrashPlan {
    /// Random choices, all reproducible from `seed`.
    pub fn random(seed: u64) -> CrashPlan {
        CrashPlan(Plan::Random(seed))
    }

    /// Everything survives, as if synced.
    pub fn keep_all() -> CrashPlan {
        CrashPlan(Plan::KeepAll)
    }

    /// Only what was durable survives.
    pub fn drop_all() -> CrashPlan {
        CrashPlan(Plan::DropAll)
    }

    /// A uniform draw in `0..n`; `n > 0`.
    fn below(&mut self, n: u64) -> u64 {
        let Plan::Random(state) = &mut self.0 else {
            return 0;
        };
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((u128::from(z) * u128::from(n)) >> 64) as u64
    }

    /// How many of `n` ordered ops survive.
    fn prefix(&mut self, n: usize) -> usize {
        match self.0 {
            Plan::KeepAll => n,
            Plan::DropAll => 0,
            Plan::Random(_) => self.below(n as u64 + 1) as usize,
        }
    }

    fn fate(&mut self) -> Fate {
        match self.0 {
            Plan::KeepAll => Fate::Keep,
            Plan::DropAll => Fate::Drop,
            Plan::Random(_) => [Fate::Keep, Fate::Drop, Fate::Torn][self.below(3) as usize],
        }
    }

    /// Whether one pending namespace or attribute change survives
    /// ([`Persistence::Conservative`]).
    fn keep(&mut self) -> bool {
        match self.0 {
            Plan::KeepAll => true,
            Plan::DropAll => false,
            Plan::Random(_) => self.coin(),
        }
    }

    /// Whether one sector of a torn write made it.
    fn coin(&mut self) -> bool {
        self.below(2) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::mem::tests::dump;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn contents(fs: &dyn Storage, path: &str) -> Option<Vec<u8>> {
        let size = fs.lstat(p(path)).ok()?.size;
        let mut buf = vec![0; size as usize];
        fs.read_at(p(path), 0, &mut buf).unwrap();
        Some(buf)
    }

    #[test]
    fn fsync_makes_data_and_names_durable() {
        let fs = CrashFs::default();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.write_at(p("f"), 0, b"hello").unwrap();
        assert_eq!(fs.pending_ops(), 2);
        fs.fsync(p("f")).unwrap();
        assert_eq!(fs.pending_ops(), 0);
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "f").unwrap(), b"hello");
        // Through a handle: sync_data.
        let h = fs.open_file(p("j"), true).unwrap();
        h.write_at(0, b"journal").unwrap();
        h.sync_data().unwrap();
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "j").unwrap(), b"journal");
    }

    #[test]
    fn unsynced_data_is_lost_by_drop_all_kept_by_keep_all() {
        let fs = CrashFs::default();
        fs.create_file(p("f"), 0o644).unwrap();
        assert!(fs.crash(&mut CrashPlan::drop_all()).lstat(p("f")).is_err());
        fs.fsync(p("")).unwrap(); // a directory fsync: names only
        fs.write_at(p("f"), 0, b"x").unwrap();
        fs.fsync(p("")).unwrap();
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "f").unwrap(), b"");
        assert_eq!(contents(&fs.crash(&mut CrashPlan::keep_all()), "f").unwrap(), b"x");
        // Another file's fsync does not carry f's data.
        fs.create_file(p("g"), 0o644).unwrap();
        fs.fsync(p("g")).unwrap();
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "f").unwrap(), b"");
        fs.sync_all().unwrap();
        assert_eq!(fs.pending_ops(), 0);
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "f").unwrap(), b"x");
    }

    #[test]
    fn metadata_survives_as_a_prefix() {
        let fs = CrashFs::default();
        fs.mkdir(p("a"), 0o755).unwrap();
        fs.mkdir(p("b"), 0o755).unwrap();
        fs.create_file(p("b/c"), 0o644).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let m = fs.crash(&mut CrashPlan::random(seed));
            let state = ["a", "b", "b/c"].map(|n| m.lstat(p(n)).is_ok());
            assert!(state == [false; 3] || state[0] && (state[1] || !state[2]), "{state:?}");
            seen.insert(state);
        }
        assert_eq!(seen.len(), 4, "every prefix shows up: {seen:?}");
    }

    #[test]
    fn rename_after_fsync() {
        let fs = CrashFs::default();
        fs.create_file(p("a"), 0o644).unwrap();
        fs.write_at(p("a"), 0, b"data").unwrap();
        fs.fsync(p("a")).unwrap();
        fs.rename(p("a"), p("b")).unwrap();
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "a").unwrap(), b"data");
        assert_eq!(contents(&fs.crash(&mut CrashPlan::keep_all()), "b").unwrap(), b"data");
        for seed in 0..50 {
            let m = fs.crash(&mut CrashPlan::random(seed));
            let (a, b) = (contents(&m, "a"), contents(&m, "b"));
            assert!(a.is_some() != b.is_some());
            assert_eq!(a.or(b).unwrap(), b"data");
        }
    }

    #[test]
    fn torn_writes_are_sector_granular() {
        let fs = CrashFs::default();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.write_at(p("f"), 0, &[b'o'; 3000]).unwrap();
        fs.fsync(p("f")).unwrap();
        fs.write_at(p("f"), 300, &[b'n'; 2000]).unwrap();
        // The write's pieces, split at 512-byte file offsets.
        let pieces = [300..512, 512..1024, 1024..1536, 1536..2048, 2048..2300];
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..100 {
            let data = contents(&fs.crash(&mut CrashPlan::random(seed)), "f").unwrap();
            assert_eq!(data.len(), 3000);
            assert!(data[..300].iter().chain(&data[2300..]).all(|&b| b == b'o'));
            let new: Vec<bool> = pieces
                .iter()
                .map(|r| {
                    let piece = &data[r.clone()];
                    assert!(piece.iter().all(|&b| b == piece[0]), "seed {seed}: torn inside a sector");
                    piece[0] == b'n'
                })
                .collect();
            kinds.insert(if new.iter().all(|&n| n) {
                "new"
            } else if new.iter().any(|&n| n) {
                "torn"
            } else {
                "old"
            });
        }
        assert_eq!(kinds.len(), 3, "{kinds:?}");
    }

    #[test]
    fn writes_after_a_pending_set_len_need_it() {
        let fs = CrashFs::default();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.fsync(p("f")).unwrap();
        fs.write_at(p("f"), 0, &[b'a'; 512]).unwrap();
        fs.set_len(p("f"), 0).unwrap();
        fs.write_at(p("f"), 512, &[b'b'; 512]).unwrap();
        for seed in 0..100 {
            let data = contents(&fs.crash(&mut CrashPlan::random(seed)), "f").unwrap();
            assert!(!(data.contains(&b'a') && data.contains(&b'b')), "seed {seed}");
        }
        let data = contents(&fs.crash(&mut CrashPlan::keep_all()), "f").unwrap();
        assert_eq!(data, [[0; 512], [b'b'; 512]].concat());
    }

    /// A workload mixing every kind of op, syncs and handles.
    fn workload(fs: &CrashFs) -> Arc<dyn StoredFile> {
        let t = Timestamp { secs: 1_000, nanos: 7 };
        fs.mkdir(p("d"), 0o755).unwrap();
        fs.create_file(p("d/a"), 0o644).unwrap();
        fs.write_at(p("d/a"), 0, &[1; 3000]).unwrap();
        fs.set_times(p("d/a"), t, t).unwrap();
        fs.fsync(p("d")).unwrap();
        fs.write_at(p("d/a"), 1000, &[2; 1500]).unwrap();
        fs.link(p("d/a"), p("hard")).unwrap();
        fs.set_xattr(p("hard"), OsStr::new("user.x"), b"1").unwrap();
        let h = fs.open_file(p("j"), true).unwrap();
        h.write_at(0, &[3; 700]).unwrap();
        fs.symlink(OsStr::new("d/a"), p("s")).unwrap();
        fs.set_owner(p("s"), 5, 6).unwrap();
        h.sync_data().unwrap();
        h.set_len(100).unwrap();
        h.write_at(4000, &[4; 600]).unwrap();
        fs.rename(p("d/a"), p("d/b")).unwrap();
        fs.create_file(p("gone"), 0o600).unwrap();
        fs.write_at(p("gone"), 0, b"bye").unwrap();
        fs.unlink(p("gone")).unwrap();
        fs.set_mode(p("d"), 0o700).unwrap();
        fs.write_at(p("d/b"), 0, &[5; 10]).unwrap();
        fs.set_times(p("hard"), t, t).unwrap();
        fs.write_at(p("d/b"), 20, &[6; 10]).unwrap();
        // Pending writes, then a newer mtime: replay must keep the latter.
        fs.set_times(p("d/b"), t, t).unwrap();
        h
    }

    #[test]
    fn keep_all_and_sync_all_reproduce_the_live_state() {
        let fs = CrashFs::default();
        let _h = workload(&fs);
        let live = dump(&fs);
        assert_eq!(dump(&fs.crash(&mut CrashPlan::keep_all())), live);
        assert_ne!(dump(&fs.crash(&mut CrashPlan::drop_all())), live);
        fs.sync_all().unwrap();
        assert_eq!(dump(&fs.crash(&mut CrashPlan::drop_all())), live);
    }

    #[test]
    fn same_seed_same_crash() {
        let fs = CrashFs::default();
        let _h = workload(&fs);
        let mut distinct = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let first = dump(&fs.crash(&mut CrashPlan::random(seed)));
            assert_eq!(dump(&fs.crash(&mut CrashPlan::random(seed))), first);
            distinct.insert(format!("{first:?}"));
        }
        assert!(distinct.len() > 10);
    }

    #[test]
    fn a_crash_result_boots_again() {
        let fs = CrashFs::default();
        let h = workload(&fs);
        let live_next = fs.lstat(p("s")).unwrap().ino + 1;
        drop(h);
        let again = CrashFs::new(fs.crash(&mut CrashPlan::random(3)));
        assert_eq!(again.pending_ops(), 0);
        again.create_file(p("new"), 0o644).unwrap();
        assert!(again.lstat(p("new")).unwrap().ino > live_next, "inode numbers are never reused");
        again.write_at(p("new"), 0, b"z").unwrap();
        again.fsync(p("new")).unwrap();
        assert_eq!(contents(&again.crash(&mut CrashPlan::drop_all()), "new").unwrap(), b"z");
    }

    #[test]
    fn unlinked_open_file_data_is_dropped() {
        let fs = CrashFs::default();
        let h = fs.open_file(p("t"), true).unwrap();
        fs.fsync(p("t")).unwrap();
        fs.unlink(p("t")).unwrap();
        h.write_at(0, b"orphan").unwrap();
        h.sync_data().unwrap();
        assert_eq!(h.len().unwrap(), 6);
        for plan in [CrashPlan::keep_all(), CrashPlan::drop_all()] {
            assert_eq!(dump(&fs.crash(&mut plan.clone())).len(), 1, "{plan:?}");
        }
        assert_eq!(fs.pending_ops(), 0);
        // Pending data of a file that is gone for good is forgotten.
        fs.create_file(p("g"), 0o644).unwrap();
        fs.write_at(p("g"), 0, b"x").unwrap();
        fs.unlink(p("g")).unwrap();
        fs.fsync(p("")).unwrap();
        assert_eq!(fs.pending_ops(), 0);
    }

    #[test]
    fn failpoint_stops_mutations_only() {
        let fs = CrashFs::default();
        fs.create_file(p("f"), 0o644).unwrap();
        let h = fs.open_file(p("f"), false).unwrap();
        assert_eq!(fs.op_count(), 1);
        fs.set_fail_after(Some(2));
        fs.write_at(p("f"), 0, b"ab").unwrap();
        fs.mkdir(p("d"), 0o755).unwrap();
        for r in [fs.fsync(p("f")), fs.mkdir(p("e"), 0o755), h.write_at(0, b"x"), h.sync_data(), fs.sync_all()] {
            assert_eq!(r.unwrap_err().to_string(), "injected crash");
        }
        assert!(fs.open_file(p("g"), true).is_err());
        assert_eq!(fs.op_count(), 3);
        assert_eq!(contents(&fs, "f").unwrap(), b"ab");
        assert!(fs.lstat(p("e")).is_err() && fs.lstat(p("g")).is_err());
        assert_eq!(fs.pending_ops(), 3);
        fs.set_fail_after(None);
        fs.fsync(p("f")).unwrap();
        assert_eq!(fs.op_count(), 4);
    }

    fn conservative() -> CrashFs {
        CrashFs::with_persistence(MemFs::new(), Persistence::Conservative)
    }

    #[test]
    fn conservative_keep_all_and_sync_all_reproduce_the_live_state() {
        let fs = conservative();
        let _h = workload(&fs);
        let live = dump(&fs);
        assert_eq!(dump(&fs.crash(&mut CrashPlan::keep_all())), live);
        assert_ne!(dump(&fs.crash(&mut CrashPlan::drop_all())), live);
        for seed in 0..50 {
            let _ = dump(&fs.crash(&mut CrashPlan::random(seed))); // every crash image is a sound tree
        }
        fs.sync_all().unwrap();
        assert_eq!(dump(&fs.crash(&mut CrashPlan::drop_all())), live);
    }

    #[test]
    fn conservative_names_need_their_directory_fsynced() {
        let fs = conservative();
        let h = fs.open_file(p("j"), true).unwrap();
        h.write_at(0, b"journal").unwrap();
        h.sync_data().unwrap();
        // The data is durable, the name is not (fdatasync, and fsync of the
        // file itself, do not write its directory).
        fs.fsync(p("j")).unwrap();
        assert!(fs.crash(&mut CrashPlan::drop_all()).lstat(p("j")).is_err());
        fs.fsync(p("")).unwrap();
        assert_eq!(contents(&fs.crash(&mut CrashPlan::drop_all()), "j").unwrap(), b"journal");
        // A file's mode is made durable by its own fsync, not by sync_data.
        fs.set_mode(p("j"), 0o640).unwrap();
        h.sync_data().unwrap();
        assert_eq!(fs.crash(&mut CrashPlan::drop_all()).lstat(p("j")).unwrap().mode, 0o600);
        fs.fsync(p("j")).unwrap();
        assert_eq!(fs.crash(&mut CrashPlan::drop_all()).lstat(p("j")).unwrap().mode, 0o640);
    }

    #[test]
    fn conservative_namespace_changes_are_lost_independently() {
        let fs = conservative();
        fs.mkdir(p("a"), 0o755).unwrap();
        fs.mkdir(p("b"), 0o755).unwrap();
        fs.create_file(p("b/c"), 0o644).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let m = fs.crash(&mut CrashPlan::random(seed));
            seen.insert(["a", "b", "b/c"].map(|n| m.lstat(p(n)).is_ok()));
        }
        assert!(seen.contains(&[false, true, true]), "b without the earlier a: {seen:?}");
        assert!(!seen.iter().any(|s| s[2] && !s[1]), "c without its directory: {seen:?}");
        // The directory's fsync makes c's name durable inside b, but b's
        // own name is still pending: a lost mkdir loses what is in it.
        fs.fsync(p("b")).unwrap();
        let m = fs.crash(&mut CrashPlan::drop_all());
        assert!(m.lstat(p("b")).is_err() && m.lstat(p("b/c")).is_err());
        fs.fsync(p("")).unwrap();
        let m = fs.crash(&mut CrashPlan::drop_all());
        assert!(m.lstat(p("a")).is_ok() && m.lstat(p("b/c")).is_ok());
    }

    #[test]
    fn conservative_rename_needs_both_directories() {
        let fs = conservative();
        fs.mkdir(p("s"), 0o755).unwrap();
        fs.mkdir(p("d"), 0o755).unwrap();
        fs.create_file(p("s/f"), 0o644).unwrap();
        fs.sync_all().unwrap();
        fs.rename(p("s/f"), p("d/f")).unwrap();
        fs.fsync(p("d")).unwrap();
        let m = fs.crash(&mut CrashPlan::drop_all());
        assert!(m.lstat(p("s/f")).is_ok() && m.lstat(p("d/f")).is_err());
        fs.fsync(p("s")).unwrap();
        let m = fs.crash(&mut CrashPlan::drop_all());
        assert!(m.lstat(p("s/f")).is_err() && m.lstat(p("d/f")).is_ok());
        // A directory moved out without the move of an entry below it (the
        // inner rename lost, the outer one kept): the entry goes with it.
        fs.mkdir(p("d/sub"), 0o755).unwrap();
        fs.create_file(p("d/sub/x"), 0o644).unwrap();
        fs.sync_all().unwrap();
        fs.rename(p("d/sub/x"), p("s/x")).unwrap();
        fs.rename(p("d"), p("s/d")).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..100 {
            let m = fs.crash(&mut CrashPlan::random(seed));
            seen.insert(["s/x", "s/d/sub/x", "d/sub/x"].map(|n| m.lstat(p(n)).is_ok()));
        }
        assert!(seen.contains(&[false, true, false]), "{seen:?}");
        assert!(seen.iter().all(|s| s.iter().filter(|x| **x).count() == 1), "{seen:?}");
    }

    #[test]
    fn conservative_torn_writes_are_page_granular() {
        let fs = conservative();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.write_at(p("f"), 0, &[b'o'; 20000]).unwrap();
        fs.sync_all().unwrap();
        fs.write_at(p("f"), 1000, &[b'n'; 15000]).unwrap();
        let mut torn = false;
        for seed in 0..100 {
            let data = contents(&fs.crash(&mut CrashPlan::random(seed)), "f").unwrap();
            for page in [1000..4096, 4096..8192, 8192..12288, 12288..16000] {
                let piece = &data[page];
                assert!(piece.iter().all(|&b| b == piece[0]), "seed {seed}: torn inside a page");
            }
            torn |= data[2000] != data[5000];
        }
        assert!(torn);
    }

    #[test]
    fn failed_ops_are_not_logged() {
        let fs = CrashFs::default();
        assert!(fs.mkdir(p("a/b"), 0o755).is_err());
        assert!(fs.write_at(p("nope"), 0, b"x").is_err());
        fs.create_file(p("f"), 0o644).unwrap();
        fs.create_file(p("f"), 0o644).unwrap(); // already there: nothing to log
        fs.write_at(p("f"), 0, b"").unwrap();
        assert_eq!((fs.pending_ops(), fs.op_count()), (1, 5));
    }
}
