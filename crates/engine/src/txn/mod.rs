//! Transactions: the [`Engine`] facade over the transaction layer.
//!
//! ## State
//! The committed state is the backing tree as of the last checkpoint
//! (*base*) with the *committed delta* on top: everything committed since.
//! A live transaction adds its own delta on top of that. All of it sits
//! behind one lock ([`state::State`]); journal `fdatasync` runs outside it
//! (group commit), so durable committers do not serialize on the disk.
//!
//! ## The state machine of a transaction, and who performs each step
//! ```text
//!   --begin()--------------------------------> Live       [Engine::begin]
//!   Live --an operation----------------------> Live       [Engine::run: read.rs, write.rs,
//!          (reads are checked and recorded: I2)                namespace.rs]
//!   Live --a read meets a newer stamp--------> Doomed     [State::conflict]
//!   Live --commit(): sync its data files,
//!          wait for its copies in flight-----> Committing [Engine::commit_changes]
//!   Committing --read set stale (I3)---------> gone, Conflict   [commit_locked]
//!   Committing --append the record (J2),
//!          compose into the committed delta,
//!          stamp what it changed (I2)--------> Committed  [commit_locked, stamp]
//!   Committed --Durable: one shared sync (J4)> Durable    [SyncState::wait_durable]
//!   Doomed --commit()------------------------> gone, Conflict   [commit_locked]
//!   Live, Doomed --abort() / drop of owner---> gone, nothing written
//!                                                         [Engine::abort, State::discard_tx]
//! ```
//! An operation outside a transaction (`tx: None`) runs the whole machine
//! within one lock hold: [`Engine::run`] makes a transaction, runs the
//! operation and commits it before it lets go (I4).
//!
//! Isolation rules (numbered in docs/DESIGN.md), and tests that exercise
//! them (`tests/isolation.rs` unless named otherwise):
//! * I1: a transaction's delta is reachable only through its `TxId`
//!   (`dirty_read_is_impossible`,
//!   `objects_of_a_live_transaction_are_unreachable_by_id`).
//! * I2: a read of an item stamped after the transaction's start fails with
//!   Conflict instead of returning a newer value: every read sees the
//!   committed state as of `begin()` (`non_repeatable_read_is_impossible`,
//!   `read_skew_is_impossible`; `tests/unlocked_reads.rs` for reads that
//!   run without the lock).
//! * I3: commit re-validates the whole read set; it holds the lock from
//!   validation to publication, so commits are totally ordered
//!   (`lost_update_is_impossible`, `write_skew_is_impossible`,
//!   `phantom_is_impossible`).
//! * I4: an operation outside a transaction runs as a transaction of one
//!   operation, validated and committed under the same lock hold: it never
//!   conflicts. A transaction that read what it changed fails later (the
//!   documented policy: the transaction, not the plain writer, loses)
//!   (`plain_writes_never_fail_because_of_a_transaction`).
//!
//! ## Rooms
//! * `api.rs`: the values the API takes and returns ([`Options`], [`Attr`], ...).
//! * `state.rs`: [`state::State`], the one locked structure: nodes, the
//!   committed delta, live transactions, the journal writer, data files.
//! * `read.rs`: what a transaction sees, and the reads it records (I2).
//! * `namespace.rs`: create, link, unlink, rename into a transaction's delta.
//! * `write.rs`: file data: in memory, spilled, staged, shadowed.
//! * `commit.rs`: commit and abort; the record a commit journals.
//! * `isolation.rs`: commit stamps and read sets (I2, I3).
//! * `info.rs`: a read-only snapshot of live transactions (`txfs status`).
//! * `changes.rs`: a live transaction's change set, path by path (`txfs diff`).
//!
//! ## Layers
//! `storage`, `delta` and `log` know nothing of transactions. `state.rs`,
//! `isolation.rs` and `api.rs` use only those; the other rooms add methods
//! to `State`, and to `Engine` for the operations that let go of the lock
//! part way (an unlocked read, a spilled write, a commit). Checkpoint and
//! recovery work on a `State` (they import `txn::state` and `txn::api`,
//! never this facade). This file sits on top: it opens the engine through
//! recovery and calls the checkpoint, and it is the only module of the
//! transaction layer that names them — so the imports have no circle.
//! The facade stays in `txn/` rather than a file above it because it *is*
//! the transaction layer's public face: `begin`, `run`, `commit`, `abort`
//! are the state machine above.

use crate::checkpoint;
use crate::error::{Error, IoContext, Result};
use crate::ids::{ObjId, Seq, TxId};
use crate::log::files::META_DIR;
use crate::log::journal::SyncState;
use crate::storage::{FileKind, Storage, Timestamp};
pub use api::{
    Attr, DirEntry, Durability, Fault, Options, RenameFlags, SetAttr, Stats, IDLE_CHECKPOINT_MAX_NAMES, NAME_MAX,
};
pub use changes::{what, Change};
use commit::commit_locked;
pub use info::TxInfo;
use namespace::{check_name, reserved};
use parking_lot::{Condvar, Mutex, MutexGuard};
use state::{State, Tx, ORPHANS_OBJ};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(crate) mod api;
mod budget;
mod changes;
mod commit;
mod info;
pub(crate) mod isolation;
mod namespace;
mod read;
pub(crate) mod state;
mod write;
pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub sync: SyncState,
    pub opts: Options,
    pub stop: AtomicBool,
    pub ckpt_lock: Mutex<()>,
    pub flushes: AtomicU64,
    /// Signalled, with the state lock held, when a write copying outside
    /// the lock ends (`Tx::inflight` drops) and when a transaction leaves
    /// the table: a commit waiting for its copies waits on this.
    pub copied: Condvar,
}

/// A transactional file system over a backing directory, in-process.
///
/// Dropping the engine stops its background thread; call [`Engine::close`]
/// to checkpoint first so the backing tree holds plain committed files.
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    bg: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Engine {
    /// Opens (and, if needed, initializes and recovers) the backing store.
    /// Recovery replays the journal and checkpoints it, so afterwards the
    /// backing tree holds exactly the committed state as plain files.
    pub fn open(storage: Arc<dyn Storage>, opts: Options) -> Result<Engine> {
        let state = crate::recovery::recover(storage, &opts)?;
        let sync =
            SyncState::new(state.journal.epoch, state.journal.file.clone(), state.journal.end, state.poison_latch());
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            sync,
            opts: opts.clone(),
            stop: AtomicBool::new(false),
            ckpt_lock: Mutex::new(()),
            flushes: AtomicU64::new(0),
            copied: Condvar::new(),
        });
        let engine = Engine { shared, bg: Mutex::new(None) };
        engine.checkpoint()?;
        // Orphans (files unlinked while open) were needed until the
        // journal naming them was checkpointed; no handle survives a restart.
        crate::recovery::clear_orphans(&engine.lock())?;
        // The first open of a backing without a mark writes one; after an
        // accepted loss it is rewritten whole.
        write_mark(&engine.shared, true)?;
        crate::recovery::clear_checkpoint_failed(&**engine.lock().storage())?;
        if let Some(iv) = opts.flush_interval {
            let sh = engine.shared.clone();
            *engine.bg.lock() = Some(
                std::thread::Builder::new()
                    .name("txfs-flush".into())
                    .spawn(move || background(sh, iv))
                    .map_err(|e| Error::io("spawn", "background flusher", e))?,
            );
        }
        Ok(engine)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock()
    }

    pub fn begin(&self) -> TxId {
        self.begin_owned(None)
    }

    /// [`Engine::begin`] for the user `uid:gid`: the files the engine keeps
    /// for the transaction (spilled data, staged new files, shadows) are
    /// theirs while it lives, so that the backing's disk quotas count them
    /// (SPEC §4a). Root's (0:0) stay the daemon's.
    pub fn begin_as(&self, uid: u32, gid: u32) -> TxId {
        self.begin_owned(Some((uid, gid)).filter(|o| *o != (0, 0)))
    }

    fn begin_owned(&self, owner: Option<(u32, u32)>) -> TxId {
        let mut st = self.lock();
        st.next_tx += 1;
        let id = TxId(st.next_tx);
        let start = st.seq;
        let mut t = Tx::new(id, start);
        t.owner = owner;
        st.txs.insert(id, t);
        st.stats.live_txs = st.txs.len() as u64;
        id
    }

    /// Runs `f` inside `tx`, or as a one-operation transaction committed
    /// (ordered) before the lock is released (I4).
    fn run<T>(&self, tx: Option<TxId>, f: impl FnOnce(&mut State, &mut Tx) -> Result<T>) -> Result<T> {
        let mut st = self.lock();
        // Poisoned: nothing more is acknowledged; a plain read goes on if
        // the state in memory is still exact (see `Poison`).
        let poisoned = st.poisoned();
        if let Some(p) = &poisoned {
            if tx.is_some() || !st.poisoned.reads_ok() {
                return Err(Error::Poisoned(p.clone()));
            }
        }
        match tx {
            Some(id) => {
                let mut t = st.txs.remove(&id).ok_or(Error::NoSuchTx(id))?;
                let res = match &t.doomed {
                    Some(d) => Err(d.error(id)),
                    None => {
                        t.ops += 1;
                        let r = f(&mut st, &mut t);
                        // Past a cap the operation fails, whatever it did
                        // (a conflict it met stays the reason: a rerun may
                        // succeed). A commit waiting for this one's copies
                        // must look again: it no longer waits for a doomed one.
                        match st.charge(&mut t) {
                            Some(e) => {
                                self.shared.copied.notify_all();
                                match r {
                                    Err(c) if c.is_conflict() => Err(c),
                                    _ => Err(e),
                                }
                            }
                            None => r,
                        }
                    }
                };
                if let Err(Error::Conflict { .. }) = &res {
                    st.stats.conflicts += 1;
                }
                st.txs.insert(id, t);
                budget::unlock(st);
                res
            }
            None => {
                st.next_tx += 1;
                let mut t = Tx::new(TxId(st.next_tx), st.seq);
                t.mem_bytes = 0;
                let out = match f(&mut st, &mut t) {
                    Ok(v) => {
                        if let Some(p) = poisoned.filter(|_| !t.delta.is_empty()) {
                            st.discard_tx(&mut t);
                            Err(Error::Poisoned(p))
                        } else if !t.delta.is_empty() {
                            commit_locked(&mut st, &self.shared.sync, t, false).map(|_| v)
                        } else {
                            Ok(v)
                        }
                    }
                    Err(e) => {
                        st.discard_tx(&mut t);
                        Err(e)
                    }
                };
                // A plain write of many MiB is freed without the lock too.
                budget::unlock(st);
                out
            }
        }
    }
    /// True if `o` was created by the live transaction `tx` (nobody else
    /// can reach it).
    pub fn created_by(&self, tx: TxId, o: ObjId) -> bool {
        self.lock().txs.get(&tx).is_some_and(|t| t.delta.created.contains_key(&o))
    }

    /// The live transaction that created `o`, if one did (nobody else can
    /// reach it until that one commits).
    pub fn creator_of(&self, o: ObjId) -> Option<TxId> {
        self.lock().txs.iter().find(|(_, t)| t.delta.created.contains_key(&o)).map(|(id, _)| *id)
    }

    /// Which of `objs` the live transaction `tx` created: by whichever of
    /// the two sets is smaller.
    pub fn created_among(&self, tx: TxId, objs: &std::collections::HashSet<ObjId>) -> Vec<ObjId> {
        let st = self.lock();
        let Some(t) = st.txs.get(&tx) else { return Vec::new() };
        if t.delta.created.len() < objs.len() {
            t.delta.created.keys().filter(|o| objs.contains(o)).copied().collect()
        } else {
            objs.iter().filter(|o| t.delta.created.contains_key(o)).copied().collect()
        }
    }

    /// Dooms `tx` (it can only abort; its commit fails with a conflict):
    /// for what the caller could not apply to it, such as the write-back of
    /// a mapping the kernel had already taken from the program.
    pub fn doom(&self, tx: TxId, why: String) {
        if let Some(t) = self.lock().txs.get_mut(&tx) {
            t.doomed.get_or_insert(budget::Doom::Conflict(why));
        }
    }

    /// True if `tx` lost a conflict or went past a cap: it can only abort.
    pub fn is_doomed(&self, tx: TxId) -> bool {
        self.lock().txs.get(&tx).is_some_and(|t| t.doomed.is_some())
    }

    /// True if `tx` lost a conflict (a rerun may succeed), as opposed to
    /// going past a cap (a rerun would not).
    pub fn lost_conflict(&self, tx: TxId) -> bool {
        self.lock().txs.get(&tx).is_some_and(|t| matches!(t.doomed, Some(budget::Doom::Conflict(_))))
    }

    /// How many transactions are live.
    pub fn live_txs(&self) -> usize {
        self.lock().txs.len()
    }

    /// True if every live transaction satisfies `f` (none live: true).
    pub fn all_live(&self, mut f: impl FnMut(TxId) -> bool) -> bool {
        self.lock().txs.keys().all(|t| f(*t))
    }

    /// True if `tx` is live.
    pub fn is_live(&self, tx: TxId) -> bool {
        self.lock().txs.contains_key(&tx)
    }

    pub fn lookup(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<Attr> {
        check_name(name)?;
        self.run(tx, |st, t| {
            st.expect_dir(t, parent)?;
            let o = st
                .lookup(t, parent, name)?
                .ok_or_else(|| Error::posix("lookup", format!("{name:?} in {parent}"), libc::ENOENT))?;
            st.attr(t, o)
        })
    }

    pub fn getattr(&self, tx: Option<TxId>, o: ObjId) -> Result<Attr> {
        self.run(tx, |st, t| st.attr(t, o))
    }

    pub fn setattr(&self, tx: Option<TxId>, o: ObjId, set: &SetAttr) -> Result<Attr> {
        // A time the backing's utimensat refuses would fail the checkpoint
        // (issue 23): nanoseconds are 0..1e9, as utimensat wants them.
        if [set.atime, set.mtime].iter().flatten().any(|t| t.nanos >= 1_000_000_000) {
            return Err(Error::posix("utimens", format!("{o}: nanoseconds out of range"), libc::EINVAL));
        }
        self.run(tx, |st, t| {
            let cur = st.attr(t, o)?;
            let (uid, gid) = (set.uid.unwrap_or(cur.uid), set.gid.unwrap_or(cur.gid));
            if (set.uid.is_some() || set.gid.is_some()) && !st.storage.may_own(uid, gid) {
                // The checkpoint could not give it that owner (issue 23).
                return Err(Error::posix("chown", format!("{o} to {uid}:{gid}"), libc::EPERM));
            }
            if let Some(s) = set.size {
                st.truncate(t, o, s)?;
            }
            // Linux cannot chmod a symlink itself: the mode stays 0o777.
            let mut mode = set.mode.map(|m| m & 0o7777).filter(|_| cur.kind != FileKind::Symlink);
            let chown_drops = cur.kind == FileKind::File || cur.kind.is_special();
            if (set.uid.is_some() || set.gid.is_some()) && mode.is_none() && chown_drops {
                // As Linux (even for root): chown drops setuid, and setgid
                // when group-execute is set (of any non-directory).
                let mut m = cur.mode & !libc::S_ISUID;
                if cur.mode & libc::S_IXGRP != 0 {
                    m &= !libc::S_ISGID;
                }
                if m != cur.mode {
                    mode = Some(m);
                }
            }
            t.explicit.insert(o);
            if (set.atime.is_some() || set.mtime.is_some()) && set.size.is_none() {
                t.timed.insert(o);
            }
            // A chmod or chown to what the object already has changes only
            // its ctime (not validated): it is not recorded as a change, so
            // it dooms no transaction that read the attributes — SQLite run
            // by root fchowns its -wal and -shm to their own owner on every
            // open.
            let a = &mut t.delta.obj(o).attr;
            a.mode = mode.filter(|&m| m != cur.mode).or(a.mode);
            a.uid = set.uid.filter(|&u| u != cur.uid).or(a.uid);
            a.gid = set.gid.filter(|&g| g != cur.gid).or(a.gid);
            a.atime = set.atime.or(a.atime);
            a.mtime = set.mtime.or(a.mtime);
            a.ctime = Some(Timestamp::now());
            st.attr_unrecorded(Some(t), o)
        })
    }

    pub fn truncate(&self, tx: Option<TxId>, o: ObjId, size: u64) -> Result<()> {
        self.run(tx, |st, t| st.truncate(t, o, size))
    }

    /// Creates a regular file; `EEXIST` if the name is taken.
    pub fn create(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::File, mode, (uid, gid), None, 0))
    }

    pub fn mkdir(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::Dir, mode, (uid, gid), None, 0))
    }

    /// `mknod(2)`: a fifo, socket, character or block device (`rdev` is a
    /// device's number, as `st_rdev` gives it: glibc's `makedev`; ignored
    /// for the others), or a regular file. As Linux: `EPERM` for a
    /// directory, `EINVAL` for a symlink or an unknown kind; `EEXIST` if the
    /// name is taken. A device is refused with `EPERM` when the backing
    /// could not make it at the checkpoint ([`Storage::may_mknod`]); whether
    /// the *caller* may make one is the caller's business (the mount lets
    /// the kernel's `CAP_MKNOD` check stand).
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        tx: Option<TxId>,
        parent: ObjId,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        match kind {
            FileKind::File => return self.create(tx, parent, name, mode, uid, gid),
            FileKind::Dir => return Err(Error::posix("mknod", format!("{name:?}: a directory"), libc::EPERM)),
            k if k.is_special() => {}
            _ => return Err(Error::posix("mknod", format!("{name:?}: not a kind mknod makes"), libc::EINVAL)),
        }
        self.run(tx, |st, t| st.create(t, parent, name, kind, mode, (uid, gid), None, rdev))
    }

    pub fn symlink(
        &self,
        tx: Option<TxId>,
        parent: ObjId,
        name: &OsStr,
        target: &OsStr,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(Error::posix(
                "symlink",
                format!("target of {name:?}"),
                if target.is_empty() { libc::ENOENT } else { libc::ENAMETOOLONG },
            ));
        }
        self.run(tx, |st, t| st.create(t, parent, name, FileKind::Symlink, 0o777, (uid, gid), Some(target), 0))
    }

    pub fn readlink(&self, tx: Option<TxId>, o: ObjId) -> Result<OsString> {
        self.run(tx, |st, t| {
            if st.kind_in(Some(t), o)? != FileKind::Symlink {
                return Err(Error::posix("readlink", o.to_string(), libc::EINVAL));
            }
            st.read_meta(t, o)?;
            st.readlink_view(t, o)
        })
    }

    pub fn link(&self, tx: Option<TxId>, o: ObjId, parent: ObjId, name: &OsStr) -> Result<Attr> {
        self.run(tx, |st, t| {
            check_name(name)?;
            st.expect_live_dir(t, parent)?;
            if st.kind_in(Some(t), o)? == FileKind::Dir {
                return Err(Error::posix("link", format!("{o} is a directory"), libc::EPERM));
            }
            if reserved(parent, name) {
                return Err(Error::posix("link", format!("{META_DIR} is reserved for txfs"), libc::EPERM));
            }
            let a = st.attr(t, o)?;
            if a.nlink == 0 {
                return Err(Error::posix("link", format!("{o} was removed"), libc::ENOENT));
            }
            if st.max_links.is_some_and(|max| a.nlink >= max) {
                // As the backing answers: the checkpoint could not make it.
                return Err(Error::posix("link", format!("{o} has {} names", a.nlink), libc::EMLINK));
            }
            st.read_meta(t, parent)?;
            if st.lookup(t, parent, name)?.is_some() {
                return Err(Error::posix("link", format!("{name:?} exists"), libc::EEXIST));
            }
            t.set_entry(parent, name, Some(o));
            t.delta.obj(o).attr.nlink += 1;
            State::touch(t, o, false);
            State::touch(t, parent, true);
            st.attr_unrecorded(Some(t), o)
        })
    }

    pub fn unlink(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<()> {
        self.run(tx, |st, t| st.unlink_entry(t, parent, name, false))
    }

    pub fn rmdir(&self, tx: Option<TxId>, parent: ObjId, name: &OsStr) -> Result<()> {
        self.run(tx, |st, t| st.unlink_entry(t, parent, name, true))
    }

    pub fn rename(
        &self,
        tx: Option<TxId>,
        from_dir: ObjId,
        from: &OsStr,
        to_dir: ObjId,
        to: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        self.run(tx, |st, t| st.rename(t, from_dir, from, to_dir, to, flags))
    }

    pub fn readdir(&self, tx: Option<TxId>, dir: ObjId) -> Result<Vec<DirEntry>> {
        self.run(tx, |st, t| {
            st.expect_dir(t, dir)?;
            st.readdir(t, dir)
        })
    }

    /// The committed path of directory `dir` below the root, as everyone
    /// outside a transaction reaches it (`None` if it is not a committed
    /// directory). The mount uses it to give others' kernel dentries back
    /// after a transaction's removal or move of a directory displaced them.
    /// Walks up the parents, one committed listing per level.
    pub fn committed_dir_path(&self, dir: ObjId) -> Option<PathBuf> {
        self.run(None, |st, t| {
            let mut parts = Vec::new();
            let mut cur = dir;
            while cur != ObjId::ROOT && parts.len() <= state::MAX_DEPTH {
                let parent = st.parent_of(t, cur).ok_or(Error::Stale(cur))?;
                let name = st.readdir(t, parent)?.into_iter().find(|e| e.obj == cur).ok_or(Error::Stale(cur))?.name;
                parts.push(name);
                cur = parent;
            }
            Ok((cur == ObjId::ROOT).then(|| parts.iter().rev().collect::<PathBuf>()))
        })
        .ok()
        .flatten()
    }

    pub fn getxattr(&self, tx: Option<TxId>, o: ObjId, name: &OsStr) -> Result<Option<Vec<u8>>> {
        self.run(tx, |st, t| st.xattr(t, o, name))
    }

    pub fn listxattr(&self, tx: Option<TxId>, o: ObjId) -> Result<Vec<OsString>> {
        self.run(tx, |st, t| {
            st.kind_in(Some(t), o)?;
            st.read_meta(t, o)?;
            let mut names: BTreeMap<OsString, bool> = BTreeMap::new();
            if !st.is_created(t, o) {
                let p = st.base_path(o).ok_or(Error::Stale(o))?;
                for n in st.storage.list_xattrs(&p).ctx("listxattr", || p.display().to_string())? {
                    names.insert(n, true);
                }
            }
            for d in [st.frozen.as_ref(), Some(&st.committed), Some(&t.delta)].into_iter().flatten() {
                if let Some(od) = d.objs.get(&o) {
                    for (k, v) in &od.attr.xattrs {
                        names.insert(k.clone(), v.is_some());
                    }
                }
            }
            Ok(names.into_iter().filter(|(_, p)| *p).map(|(k, _)| k).collect())
        })
    }

    /// Sets (`Some`) or removes (`None`) an extended attribute. `create` and
    /// `replace` are XATTR_CREATE / XATTR_REPLACE.
    pub fn setxattr(
        &self,
        tx: Option<TxId>,
        o: ObjId,
        name: &OsStr,
        value: Option<&[u8]>,
        create: bool,
        replace: bool,
    ) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::posix("setxattr", format!("{name:?}"), libc::ERANGE));
        }
        if value.is_some_and(|v| v.len() > 65536) {
            return Err(Error::posix("setxattr", format!("{name:?}"), libc::E2BIG));
        }
        // Checks and change in one lock hold: XATTR_CREATE is atomic.
        self.run(tx, |st, t| {
            let kind = st.kind_in(Some(t), o)?;
            if !matches!(kind, FileKind::File | FileKind::Dir) && name.as_bytes().starts_with(b"user.") {
                // As Linux: user.* attributes only on files and directories.
                return Err(Error::posix("setxattr", format!("{name:?} on a {kind:?}"), libc::EPERM));
            }
            let exists = st.xattr(t, o, name)?.is_some();
            if value.is_none() && !exists {
                return Err(Error::posix("removexattr", format!("{name:?}"), libc::ENODATA));
            }
            if create && exists {
                return Err(Error::posix("setxattr", format!("{name:?}"), libc::EEXIST));
            }
            if replace && !exists {
                return Err(Error::posix("setxattr", format!("{name:?}"), libc::ENODATA));
            }
            if let Some(v) = value {
                st.probe_xattrs(t, o, kind, name, v)?;
            }
            t.delta.obj(o).attr.xattrs.insert(name.to_owned(), value.map(|v| v.to_vec()));
            State::touch(t, o, false);
            Ok(())
        })
    }

    /// fsync: a no-op inside a transaction (the commit makes it durable);
    /// outside, every commit so far becomes durable.
    pub fn fsync(&self, tx: Option<TxId>) -> Result<()> {
        if tx.is_some() {
            return Ok(());
        }
        self.sync()
    }

    /// Makes every commit so far durable.
    pub fn sync(&self) -> Result<()> {
        let target = *self.shared.sync.written.lock();
        self.shared.sync.wait_durable(target)
    }

    /// Marks an object open (an open file handle); an open object that is
    /// unlinked stays readable until [`Engine::release`].
    pub fn open_obj(&self, o: ObjId) -> Result<()> {
        let mut st = self.lock();
        let n = st.nodes.get_mut(&o).ok_or(Error::Stale(o))?;
        n.open += 1;
        Ok(())
    }

    pub fn release(&self, o: ObjId) {
        let mut st = self.lock();
        let orphan = match st.nodes.get_mut(&o) {
            Some(n) => {
                n.open = n.open.saturating_sub(1);
                n.open == 0 && n.base.as_ref().is_some_and(|b| b.parent == ORPHANS_OBJ)
            }
            None => false,
        };
        if orphan {
            // The journal may still name .txfs/orphans/N (J1: only a plan
            // changes the backing tree): the file goes after the next
            // checkpoint, or at the next start.
            if let Some(n) = st.nodes.get_mut(&o) {
                n.gone = true;
            }
            st.released_orphans.push(o);
        }
    }

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        let mut s = st.stats.clone();
        s.journal_bytes = st.journal.end;
        s.last_seq = st.seq.0;
        s.live_txs = st.txs.len() as u64;
        s.tx_mem = st.live_mem;
        s.stamps = st.ver.len() as u64;
        s.journal_syncs = self.shared.sync.syncs.load(Ordering::Relaxed);
        s
    }

    /// Writes everything committed into the backing tree and empties the
    /// journal (see `checkpoint/mod.rs`).
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self.shared.ckpt_lock.lock();
        self.sync()?;
        checkpoint::run(&self.shared.state, &self.shared.sync)?;
        write_mark(&self.shared, true)
    }

    /// Why the engine stopped acknowledging anything (a failed journal write
    /// or sync, a checkpoint that failed in its namespace phases), and
    /// whether plain reads are still served — which lasts until the engine
    /// is opened again, whose recovery finishes what failed; or a
    /// checkpoint that failed writing contents and is retried while
    /// everything goes on (`retried`). `None` while healthy.
    pub fn fault(&self) -> Option<Fault> {
        let st = self.shared.state.lock();
        if let Some((why, reads_go_on)) = st.poison_latch().fault() {
            return Some(Fault { why, reads_go_on, retried: false });
        }
        st.unfinished.as_ref().map(|u| Fault { why: u.why.clone(), reads_go_on: true, retried: true })
    }

    /// What recovery accepted to lose at this open (`Options::accept_loss`);
    /// empty if nothing.
    pub fn accepted_losses(&self) -> Vec<String> {
        self.lock().losses.clone()
    }

    /// Records the durable high-water mark (`.txfs/mark`) now: every commit
    /// so far is made durable first. The engine does this at each open and
    /// checkpoint, and the background thread at most once a second.
    pub fn write_mark(&self) -> Result<()> {
        write_mark(&self.shared, true)
    }

    fn maybe_checkpoint(&self) {
        if self.bg.lock().is_none() {
            let big = self.lock().uncheckpointed() > self.shared.opts.checkpoint_bytes;
            if big {
                if let Err(e) = self.checkpoint() {
                    tracing::warn!("checkpoint failed: {e}");
                }
            }
        }
    }

    /// Checkpoints and stops the background thread: the backing directory
    /// then holds exactly the committed state as plain files.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// [`Engine::close`] for a shared engine: stops the background thread
    /// and checkpoints. Later operations still work (without a flusher).
    pub fn shutdown(&self) -> Result<()> {
        self.stop_bg();
        // An unmounted tree keeps no spare journal (disk space), and its
        // journal has nothing after its records: the last checkpoint starts
        // a fresh one, and the journal it retires is deleted.
        let storage = self.lock().storage.clone();
        let res = crate::log::files::drop_spare(&*storage).and_then(|()| self.checkpoint());
        if let Err(e) = res {
            // `txfs umount` and `txfs check` report it (exit non-zero)
            // until a recovery succeeds.
            crate::recovery::note_checkpoint_failed(&*storage, &e);
            return Err(e);
        }
        let _one = self.shared.ckpt_lock.lock();
        crate::log::files::drop_spare(&*storage)?;
        self.lock().drop_spares();
        // A checkpoint with nothing to do leaves the journal as it is: if it
        // is a recycled one, its old bytes go now (nothing is committed, so
        // nothing follows the header). The same file goes on, keyed: a
        // failure here leaves the engine writing where recovery looks.
        let st = self.lock();
        if st.committed.is_empty() && st.frozen.is_none() {
            let j = &st.journal;
            if j.file.len().ctx("journal stat", || j.path.display().to_string())? > j.end {
                j.file.set_len(j.end).ctx("journal cut", || j.path.display().to_string())?;
                j.file.sync_data().ctx("journal cut", || j.path.display().to_string())?;
            }
        }
        Ok(())
    }

    fn stop_bg(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.bg.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_bg();
    }
}

/// Writes the durable high-water mark for what is durable now. With
/// `sync`, everything appended so far is made durable first; without, the
/// mark is written only if that is so already (the background thread's
/// lazy update, right after its flush: no sync of the journal of its own).
fn write_mark(sh: &Shared, sync: bool) -> Result<()> {
    let (v, upto, mark, storage, force) = {
        let mut st = sh.state.lock();
        if st.poisoned().is_some() {
            return Ok(());
        }
        let j = &st.journal;
        let v = crate::log::mark::MarkValue { epoch: j.epoch, seq: st.seq, end: j.end, nonce: j.nonce };
        let force = std::mem::take(&mut st.loss_accepted);
        (v, *sh.sync.written.lock(), st.mark.clone(), st.storage.clone(), force)
    };
    if sh.sync.synced() < upto {
        if !sync {
            return Ok(());
        }
        sh.sync.wait_durable(upto)?;
    }
    mark.write(&*storage, v, force)
}

/// How often the background thread updates the mark at most.
const MARK_EVERY: Duration = Duration::from_secs(1);
/// The pause before an unfinished checkpoint's first retry; it doubles
/// with each failure, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);

pub(super) fn background(sh: Arc<Shared>, iv: Duration) {
    let step = Duration::from_millis(10).min(iv);
    let mut waited = Duration::ZERO;
    let mut since_mark = Duration::ZERO;
    let mut postponed = false;
    let mut since_retry = Duration::ZERO;
    // The last commit seen and how long ago it was first seen.
    let (mut seen, mut idle) = (Seq(0), Duration::ZERO);
    while !sh.stop.load(Ordering::Relaxed) {
        std::thread::sleep(step);
        waited += step;
        if waited < iv {
            continue;
        }
        waited = Duration::ZERO;
        let target = *sh.sync.written.lock();
        if sh.sync.synced() < target {
            if let Err(e) = sh.sync.wait_durable(target) {
                tracing::error!("background journal flush failed: {e}");
            }
            sh.flushes.fetch_add(1, Ordering::Relaxed);
        }
        since_mark += iv;
        if since_mark >= MARK_EVERY {
            since_mark = Duration::ZERO;
            if let Err(e) = write_mark(&sh, false) {
                tracing::warn!("durable high-water mark not updated: {e}");
            }
        }
        // What an idle checkpoint may take: not a poisoned engine's (it
        // commits nothing more and refuses checkpoints: idleness would only
        // log that every `idle_checkpoint`), not many names (counted up to
        // the bound, under the lock).
        let (big, pending, seq) = {
            let st = sh.state.lock();
            let few_names = st
                .committed
                .dirs
                .values()
                .try_fold(0usize, |n, d| Some(n + d.len()).filter(|&n| n <= IDLE_CHECKPOINT_MAX_NAMES))
                .is_some();
            let pending = !st.committed.is_empty() && st.poisoned().is_none() && few_names;
            (st.uncheckpointed() > sh.opts.checkpoint_bytes, pending, st.seq)
        };
        if seq != seen {
            (seen, idle) = (seq, Duration::ZERO);
        } else {
            idle += iv;
        }
        let quiet = pending && sh.opts.idle_checkpoint.is_some_and(|d| idle >= d);
        // An unfinished checkpoint (its contents failed) is tried again
        // after a pause that doubles up to a minute; a big journal waits
        // for it too.
        let unfinished = sh.state.lock().unfinished.as_ref().map(|u| u.tries);
        if let Some(tries) = unfinished {
            since_retry += iv;
            if since_retry < RETRY_FIRST.saturating_mul(1 << tries.min(7)).min(RETRY_MAX) {
                continue;
            }
            since_retry = Duration::ZERO;
        }
        if big || quiet || unfinished.is_some() {
            idle = Duration::ZERO;
            let _one = sh.ckpt_lock.lock();
            let target = *sh.sync.written.lock();
            if let Err(e) = sh.sync.wait_durable(target) {
                tracing::error!("journal flush before checkpoint failed: {e}");
                continue;
            }
            match checkpoint::run(&sh.state, &sh.sync) {
                Ok(()) => {
                    postponed = false;
                    if let Err(e) = write_mark(&sh, true) {
                        tracing::warn!("durable high-water mark not updated after a checkpoint: {e}");
                    }
                }
                // Its contents failed: retried later (above), said each
                // time with the count.
                Err(e) if sh.state.lock().unfinished.is_some() => {
                    tracing::error!("background checkpoint failed writing contents, to be retried: {e}");
                }
                // Not started (no room): retried every interval, said once.
                Err(e) if sh.state.lock().poisoned().is_none() => {
                    if !postponed {
                        tracing::error!("background checkpoint postponed: {e}");
                    }
                    postponed = true;
                }
                Err(e) => tracing::error!("background checkpoint failed: {e}"),
            }
        }
    }
}

/// Reads the committed state, for tests and tools: `None` if absent.
impl Engine {
    /// Resolves a slash-separated path in the committed state (no symlinks
    /// followed).
    pub fn resolve(&self, tx: Option<TxId>, path: &Path) -> Result<ObjId> {
        let mut cur = ObjId::ROOT;
        for c in path.components() {
            match c {
                std::path::Component::Normal(n) => cur = self.lookup(tx, cur, n)?.obj,
                std::path::Component::RootDir | std::path::Component::CurDir => {}
                _ => return Err(Error::posix("resolve", path.display().to_string(), libc::EINVAL)),
            }
        }
        Ok(cur)
    }
}
