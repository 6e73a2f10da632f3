//! The FUSE adapter: kernel requests in, engine calls out.
//!
//! ## Kernel caches (SPEC §6): the policy of this version
//! Correctness first. While any transaction is live, every entry and
//! attribute is returned with a zero TTL, so every stat and path walk
//! reaches the daemon and gets the view of the caller's transaction (and
//! enters its read set). While none is live, the committed state is the
//! only view and entries and attributes are cached for a second
//! ([`CacheGate`]; the first begin drops them all before it returns).
//! Every handle is `FOPEN_DIRECT_IO`: `read` and
//! `write` always reach the daemon, which answers with the caller's view,
//! so a transaction reads its own writes through any descriptor, even one
//! opened before it began.
//!
//! The page cache is used only by `mmap` (`FUSE_DIRECT_IO_ALLOW_MMAP`),
//! and isolation there comes from node ids ([`Private`]): a transaction
//! knows every existing regular file it looks up by a *private* node id,
//! so the kernel keeps a separate inode — and page cache — for it that no
//! other process can reach. Page faults on a private node get its
//! transaction's view (it maps its own writes; git maps files it has just
//! written); faults on a shared node get the committed state (told apart
//! from direct reads by the lock owner the kernel attaches to direct reads
//! only), except for files the faulting transaction created, which nobody
//! else can reach. Commits drop the cached pages of every node id of the
//! files they changed, and a transaction's end drops its private nodes'
//! pages, before the caller is answered.
//!
//! Consequences (README "Known limits"):
//! * a descriptor opened *before* a transaction began is on a node of
//!   another view: its mappings show the committed state (its `read(2)`
//!   still sees the transaction's writes);
//! * inside a transaction, `st_ino` of existing files differs from the
//!   one other processes see (a private node id);
//! * writes through a shared writable mapping are not transactional: the
//!   kernel writes them back later (`FUSE_WRITE_CACHE`), and they are
//!   applied then as plain writes — never into a transaction.
//!
//! Invalidation never runs on a request thread: `inval_inode` locks the
//! file's folios, and a page fault holds one while its READ waits for a
//! free worker. A dedicated thread invalidates, then sends the reply.
//!
//! POSIX byte-range locks and flock are left to the kernel (no lock
//! handlers), which implements them locally as on any file system.
//!
//! ## Rooms
//! * [`ops`]: the `Filesystem` implementation, one kernel request each;
//!   every one asks this module whose view it is ([`TxFs::tx`]) and
//!   answers through the cache gate.
//! * [`cache_gate`]: when the kernel may cache entries and attributes.
//! * [`nodes`]: kernel node ids, the transaction-private ones among them.
//! * [`views`]: `txfs run`'s transaction views, each served as a session
//!   of its own.
//! * [`control`]: the ioctl control plane (begin, commit, abort, run,
//!   status), decoding and encoding [`crate::wire`].
//!
//! This module holds what they share: the [`TxFs`] state, the end of a
//! transaction ([`end_tx`]) and the invalidation thread that drops cached
//! pages before a reply is sent.
mod cache_gate;
mod changes;
mod control;
mod nodes;
mod ops;
mod views;

pub use cache_gate::CacheGate;
use cache_gate::TTL;
use nodes::{all_ids, is_private, shared_id, Paged, Private};
use views::{ViewLink, Views};

use crate::attribution::txmap::{Caller, Claim, TxMap};
use crate::config::Config;
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, INodeNo, Request, TimeOrNow};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use txfs_engine::{Attr, DirEntry, Durability, Engine, Error, FileKind, ObjId, Timestamp, TxId};
struct Handle {
    obj: ObjId,
    /// The transaction the opener was in: used when a request carries no
    /// caller (pid 0).
    tx: Option<TxId>,
    append: bool,
    /// Opened for writing (`TXFS_IOC_BATCH` needs it).
    writable: bool,
    /// Opened for reading (`TXFS_IOC_BEGIN_FILE` needs it).
    readable: bool,
    /// A batch handle (`TXFS_IOC_BATCH`): each WRITE through it carries
    /// several writes to its file ([`crate::wire::parse_batch`]).
    batch: bool,
}

/// Which session a [`TxFs`] serves.
enum Role {
    /// The mount everyone shares: a request is its caller's transaction's,
    /// or a private node's owner's, or plain.
    Shared(SharedMount),
    /// The transaction view of a `txfs run` (its own FUSE connection,
    /// mounted over the mount point in the command's mount namespace):
    /// every request on it is `tx`'s, whoever sends it. `shared_gate` is
    /// the shared mount's cache gate.
    View { tx: TxId, shared_gate: Arc<CacheGate> },
}

/// What only the shared mount has. A view has no private node ids (every
/// node is its transaction's), serves no views, and never invalidates
/// (nothing but its transaction changes what it shows).
struct SharedMount {
    /// Set once the session exists; used to drop stale kernel pages.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    invalidator: Mutex<std::sync::mpsc::Sender<Deferred>>,
    private: Arc<Mutex<Private>>,
    /// The transaction views this mount serves.
    views: Views,
    /// Node ids whose pages the kernel may cache (see [`Paged`]).
    paged: Arc<Paged>,
    /// Where this mount is mounted, as the daemon sees it.
    point: PathBuf,
    /// This mount's device (`way_in`), read at the first run.
    dev: std::sync::OnceLock<u64>,
    /// Removals and moves of directories let through once: see
    /// [`TxFs::dir_change_may_proceed`].
    passes: Mutex<HashMap<(TxId, ObjId, std::ffi::OsString), std::time::Instant>>,
    /// Paths below the mount point to look up as nobody's transaction
    /// (see [`healer`]).
    healer: Mutex<std::sync::mpsc::SyncSender<Vec<PathBuf>>>,
}

/// What fuser serves: a [`TxFs`] shared with the replies sent later from
/// other threads (a commit that first has the kernel write back the
/// transaction's mapped pages, see [`TxFs::flush_then`]).
pub struct Fs(pub Arc<TxFs>);

impl std::ops::Deref for Fs {
    type Target = TxFs;
    fn deref(&self) -> &TxFs {
        &self.0
    }
}

/// One FUSE session's file system: the shared mount, or a `txfs run`
/// transaction view of it ([`Role`]). Both serve the same engine.
pub struct TxFs {
    pub engine: Arc<Engine>,
    pub txs: Arc<TxMap>,
    backing: PathBuf,
    handles: Mutex<HashMap<FileHandle, Handle>>,
    /// Open directory handles: the listing as the opener saw it, and whose view.
    dirs: Mutex<HashMap<FileHandle, DirSnapshot>>,
    next_fh: AtomicU64,
    /// Kernel caching while no transaction is live.
    pub gate: Arc<CacheGate>,
    /// The shared mount, or a `txfs run` transaction view.
    role: Role,
    /// LOOKUP and GETATTR requests served (`txfs status`).
    attr_requests: AtomicU64,
    /// The daemon's knobs, read once at its start.
    config: Arc<Config>,
    /// The latest change set listing of each transaction (CHANGES).
    listings: Arc<changes::Listings>,
}

/// An open directory's transaction (of the opener) and its listing, taken at
/// the first readdir. NB: not at opendir: the client libraries open the
/// mount root to send every ioctl, and a listing read there would enter the
/// transaction's read set (a spurious conflict with any create in the root)
/// and fail in a doomed transaction (so its ABORT could never be sent).
type DirSnapshot = (Option<TxId>, Option<Arc<Vec<DirEntry>>>);

/// Nodes whose cached pages must go, and the reply to send after.
type Deferred = (Vec<INodeNo>, Box<dyn FnOnce() + Send>);

/// Ends `tx` — commits it with `Some(durability)`, else aborts it — and
/// returns the node ids whose cached pages must go before anyone hears of
/// it: every id of the files a commit changed, and the transaction's own
/// private nodes either way (their pages hold its view).
/// A transaction that left the gate open shuts it for its commit (`notifier`
/// drops the attributes cached meanwhile).
/// `private` and `views` are the shared mount's (`None` in a view).
fn end_tx(
    engine: &Engine,
    private: Option<&Mutex<Private>>,
    gate: &CacheGate,
    notifier: Option<&fuser::Notifier>,
    views: Option<&Mutex<HashMap<TxId, ViewLink>>>,
    tx: TxId,
    commit: Option<Durability>,
) -> (Result<(), Error>, Vec<INodeNo>, Heal) {
    let (own, moved) = match private {
        Some(p) => {
            let mut p = p.lock();
            let own = p.of_tx.remove(&tx).unwrap_or_default();
            if commit.is_none() {
                // Before the abort: a write-back racing it must not land as
                // a plain write once the owner is gone.
                p.discard.extend(own.iter().copied());
            }
            (own, p.moved.remove(&tx).unwrap_or_default())
        }
        None => Default::default(),
    };
    let (r, changed) = match commit {
        Some(d) => {
            gate.pin(tx, notifier);
            match engine.commit_changes(tx, d) {
                Ok(changed) => (Ok(()), changed),
                Err(e) => (Err(e), Vec::new()),
            }
        }
        None => {
            gate.unfree(tx);
            (engine.abort(tx), Vec::new())
        }
    };
    gate.unfree(tx);
    gate.reopen(engine);
    if let Some(v) = views.and_then(|v| v.lock().remove(&tx)) {
        v.end();
    }
    // Directories the transaction removed or moved, now committed: the
    // shared dentries of their old names go, and their new names are
    // looked up (see `TxFs::heal`), so that others follow the change.
    let heal = match &r {
        Ok(()) if commit.is_some() => Heal {
            slots: moved.iter().map(|m| m.slot.clone()).collect(),
            paths: moved.iter().filter_map(|m| engine.committed_dir_path(m.obj)).collect(),
        },
        _ => Heal::default(),
    };
    let Some(private) = private else { return (r, changed.into_iter().map(shared_id).collect(), heal) };
    let mut pages = all_ids(private, changed);
    pages.extend(own.iter().copied());
    // Private ids the kernel does not hold (any more) go now; the others
    // when it forgets them (`forget`).
    let mut p = private.lock();
    if r.is_err() {
        p.discard.extend(own.iter().copied());
    }
    for k in own {
        if !p.nlookup.contains_key(&k) {
            p.remove(k);
        }
    }
    drop(p);
    (r, pages, heal)
}

/// What a commit that removed or moved directories leaves to do for
/// others' kernel dentries: slots (parent node, name) whose shared dentry
/// must leave the hash, then paths to look up (`TxFs::heal_after_commit`).
#[derive(Default)]
struct Heal {
    slots: Vec<(INodeNo, std::ffi::OsString)>,
    paths: Vec<PathBuf>,
}

fn invalidator(notifier: Arc<std::sync::OnceLock<fuser::Notifier>>, jobs: std::sync::mpsc::Receiver<Deferred>) {
    for (nodes, reply) in jobs {
        if let Some(n) = notifier.get() {
            for ino in nodes {
                // ENOENT: the kernel has no inode for it, nothing to drop.
                let _ = n.inval_inode(ino, 0, 0);
            }
        }
        reply();
    }
}

/// Has each path below the mount point `at` looked up by a process in no
/// transaction: a transaction's removal or move of a directory displaced
/// the kernel's shared dentry of it (unhashed, so the working directories
/// of others who hold it answer `getcwd` with ENOENT), and a lookup
/// answered with the shared node id hashes that dentry again (the kernel
/// keeps one dentry per directory inode and reuses it). Sent after the
/// change was answered: its caller holds the parent's lock until then.
///
/// NB: by a child process (`txfs __heal`), never a thread of the daemon. A
/// thread waiting in a request to its own mount cannot be killed once the
/// request was sent: a daemon killed then would never finish exiting, and
/// so never close `/dev/fuse`, and the mount would hang for good. The
/// child's lookup fails instead when the daemon dies, and it exits when its
/// input ends.
fn healer(at: PathBuf, jobs: std::sync::mpsc::Receiver<Vec<PathBuf>>) {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    let spawn = || {
        std::process::Command::new("/proc/self/exe")
            .arg("__heal")
            .arg(&at)
            .current_dir("/")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
    };
    let mut child: Option<std::process::Child> = None;
    for paths in jobs {
        let mut batch = Vec::new();
        for p in &paths {
            batch.extend_from_slice(p.as_os_str().as_bytes());
            batch.push(0);
        }
        for _ in 0..2 {
            if child.is_none() {
                child = spawn().map_err(|e| tracing::warn!("cannot start the dentry healer: {e}")).ok();
            }
            let Some(c) = child.as_mut() else { break };
            match c.stdin.as_mut().map(|i| i.write_all(&batch)) {
                Some(Ok(())) => break,
                _ => {
                    // It died: reap it and start another.
                    let _ = c.kill();
                    let _ = c.wait();
                    child = None;
                }
            }
        }
    }
}

/// Who sent `req`: the thread and credentials the kernel put in its header.
fn caller(req: &Request) -> Caller {
    Caller { tid: req.pid(), uid: req.uid(), gid: req.gid() }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn sys_time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::new(t.secs.unsigned_abs(), 0) + Duration::new(0, t.nanos)
    }
}

fn stamp(t: TimeOrNow) -> Timestamp {
    let st = match t {
        TimeOrNow::Now => SystemTime::now(),
        TimeOrNow::SpecificTime(s) => s,
    };
    match st.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
        // Before the epoch: whole seconds down, nanoseconds up (0..1e9).
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => Timestamp { secs: -(d.as_secs() as i64), nanos: 0 },
                n => Timestamp { secs: -(d.as_secs() as i64) - 1, nanos: 1_000_000_000 - n },
            }
        }
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
        // A type Linux does not have today: nothing better to say.
        FileKind::Other => FileType::RegularFile,
    }
}

/// A device number as FUSE carries it (the kernel's 32-bit
/// `new_encode_dev`: 12 bits of major, 20 of minor) from `st_rdev` as
/// userspace has it (glibc's `makedev`). The two agree for every number
/// that fits; a larger one cannot be told to the kernel whole.
fn fuse_rdev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev as libc::dev_t) as u64, libc::minor(rdev as libc::dev_t) as u64);
    ((minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)) as u32
}

/// `st_rdev` (glibc's `makedev`) from the device number a FUSE request
/// carries (the kernel's `new_encode_dev`).
fn dev_from_fuse(rdev: u32) -> u64 {
    let (major, minor) = ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
    libc::makedev(major, minor) as u64
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.obj.0),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: sys_time(a.atime),
        mtime: sys_time(a.mtime),
        ctime: sys_time(a.ctime),
        crtime: sys_time(a.ctime),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink.min(u32::MAX as u64) as u32,
        uid: a.uid,
        gid: a.gid,
        rdev: fuse_rdev(a.rdev),
        blksize: 4096,
        flags: 0,
    }
}

impl TxFs {
    /// The shared mount of `backing` at `point`. `notifier` is set once
    /// the session exists.
    pub fn new(
        engine: Arc<Engine>,
        backing: PathBuf,
        point: PathBuf,
        notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
        config: Arc<Config>,
    ) -> TxFs {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = notifier.clone();
        std::thread::Builder::new()
            .name("txfs-inval".into())
            .spawn(move || invalidator(n, rx))
            .expect("spawning the invalidation thread");
        // Abort transactions whose thread or `txfs run` owner has died.
        let private: Arc<Mutex<Private>> = Arc::default();
        let txs: Arc<TxMap> = Arc::default();
        let gate: Arc<CacheGate> = Arc::default();
        let views: Views = Arc::default();
        let paged: Arc<Paged> = Arc::default();
        let (e, t, p, g, inval) = (engine.clone(), txs.clone(), private.clone(), gate.clone(), tx.clone());
        let (vs, pg) = (views.clone(), paged.clone());
        let listings: Arc<changes::Listings> = Arc::default();
        let ls = listings.clone();
        std::thread::Builder::new()
            .name("txfs-reaper".into())
            .spawn(move || loop {
                // Woken at once when a request found a dead owner's transaction.
                t.nap(Duration::from_millis(250));
                for dead in t.reap() {
                    tracing::info!(tx = %dead, "owner exited with the transaction open: aborting it");
                    let (_, pages, _) = end_tx(&e, Some(&p), &g, None, Some(&vs), dead, None);
                    t.forget(dead);
                    ls.forget(dead);
                    let _ = inval.send((pg.keep(pages), Box::new(|| {})));
                }
            })
            .expect("spawning the reaper thread");
        // Bounded: a transaction renaming directories in a loop must not
        // grow the daemon; a heal left out only leaves others' `getcwd`
        // failing until their next walk there.
        let (heal_tx, heal_rx) = std::sync::mpsc::sync_channel(1024);
        let at = point.clone();
        std::thread::Builder::new()
            .name("txfs-healer".into())
            .spawn(move || healer(at, heal_rx))
            .expect("spawning the healer thread");
        TxFs {
            engine,
            txs,
            backing,
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            gate,
            role: Role::Shared(SharedMount {
                notifier,
                invalidator: Mutex::new(tx),
                private,
                views,
                paged,
                point,
                dev: std::sync::OnceLock::new(),
                passes: Mutex::default(),
                healer: Mutex::new(heal_tx),
            }),
            attr_requests: AtomicU64::new(0),
            config,
            listings,
        }
    }

    /// In a transaction view, its transaction: every request on it is
    /// that transaction's, whoever sends it.
    fn view(&self) -> Option<TxId> {
        match &self.role {
            Role::Shared(_) => None,
            Role::View { tx, .. } => Some(*tx),
        }
    }

    /// What only the shared mount has; `None` in a view.
    fn shared_mount(&self) -> Option<&SharedMount> {
        match &self.role {
            Role::Shared(s) => Some(s),
            Role::View { .. } => None,
        }
    }

    /// The shared mount's notifier, once its session exists.
    fn notifier(&self) -> Option<&fuser::Notifier> {
        self.shared_mount().and_then(|s| s.notifier.get())
    }

    /// Ends `tx` (see [`end_tx`]) on the gate of [`TxFs::shared_gate`].
    fn end_tx(&self, tx: TxId, commit: Option<Durability>) -> (Result<(), Error>, Vec<INodeNo>) {
        let s = self.shared_mount();
        let (private, views) = (s.map(|s| &*s.private), s.map(|s| &*s.views));
        let (r, pages, heal) = end_tx(&self.engine, private, self.shared_gate(), self.notifier(), views, tx, commit);
        self.txs.forget(tx);
        self.listings.forget(tx);
        self.heal_after_commit(heal);
        (r, pages)
    }

    /// After a commit that removed or moved directories: on the
    /// invalidation thread (before the commit's own reply, queued after
    /// this), the shared dentries of their old names leave the kernel's
    /// hash — a process whose working directory is a removed one then gets
    /// ENOENT from `getcwd`, as on ext4, also below it — and the helper
    /// looks their new names up, where a moved one's dentry goes.
    fn heal_after_commit(&self, heal: Heal) {
        let Some(s) = self.shared_mount() else { return };
        if heal.slots.is_empty() && heal.paths.is_empty() {
            return;
        }
        let (notifier, healer) = (s.notifier.clone(), s.healer.lock().clone());
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            if let Some(n) = notifier.get() {
                for (parent, name) in &heal.slots {
                    // ENOENT: the kernel has no dentry there.
                    let _ = n.inval_entry(*parent, name);
                }
            }
            if !heal.paths.is_empty() {
                let _ = healer.try_send(heal.paths);
            }
        });
        if let Err(std::sync::mpsc::SendError((_, job))) = s.invalidator.lock().send((Vec::new(), job)) {
            job();
        }
    }

    /// The shared mount's gate, also in a view: the gate a transaction
    /// ended here leaves (a process of the run that begins and aborts
    /// through its view ends the run's transaction), and the one `txfs
    /// status` reports.
    fn shared_gate(&self) -> &CacheGate {
        match &self.role {
            Role::Shared(_) => &self.gate,
            Role::View { shared_gate, .. } => shared_gate,
        }
    }

    /// Sends `reply` once the cached pages of `nodes` are gone (on the
    /// invalidation thread; see the module docs).
    fn after(&self, nodes: Vec<INodeNo>, reply: impl FnOnce() + Send + 'static) {
        // A view has no invalidation thread: nothing but its transaction
        // changes what it shows.
        let Some(s) = self.shared_mount() else { return reply() };
        let nodes = s.paged.keep(nodes);
        if nodes.is_empty() || s.notifier.get().is_none() {
            return reply();
        }
        if let Err(std::sync::mpsc::SendError((_, reply))) = s.invalidator.lock().send((nodes, Box::new(reply))) {
            reply();
        }
    }

    /// What a content change must invalidate before it is answered: plain
    /// changes commit at once; a transaction's stay private until commit.
    fn committed_now(&self, tx: Option<TxId>, o: ObjId) -> Vec<INodeNo> {
        if tx.is_none() {
            self.all_ids(vec![o])
        } else {
            Vec::new()
        }
    }

    fn tx(&self, req: &Request) -> Option<TxId> {
        self.tx_of(caller(req))
    }

    /// [`TxFs::tx`] of a caller.
    fn tx_of(&self, c: Caller) -> Option<TxId> {
        if self.view().is_some() {
            return self.view();
        }
        let tx = self.txs.of(c);
        if let Some(t) = tx {
            // A `txfs run` whose view left the gate open came in here.
            self.gate.pin(t, self.notifier());
        }
        tx
    }

    /// The caller's transaction, or for caller-less requests the handle's.
    fn tx_fh(&self, req: &Request, fh: FileHandle) -> Option<TxId> {
        if self.view().is_some() {
            return self.view();
        }
        if req.pid() == 0 {
            return self.handles.lock().get(&fh).and_then(|h| h.tx);
        }
        self.tx(req)
    }

    fn new_fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    /// The transaction the caller is in and its depth (0: joined to a
    /// tree without a begin of its own, or none). A thread whose
    /// transaction was begun with other credentials is in none.
    fn state_of(&self, c: Caller) -> (Option<TxId>, u32) {
        match self.txs.claim(c) {
            Claim::Own(_) => match self.txs.thread(c.tid) {
                Some((tx, depth, _)) => (Some(tx), depth),
                None => (self.txs.of(c), 0),
            },
            Claim::Foreign => (None, 0),
            Claim::None => (self.txs.of(c), 0),
        }
    }

    /// The listing behind directory handle `fh` (taken at a read from
    /// offset 0 — the first, or after rewinddir/seek to 0, which must see
    /// the directory as it is now — and kept for the reads that follow, so
    /// offsets stay stable), and whose view it is.
    fn dir_listing(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
    ) -> Result<(Option<TxId>, Arc<Vec<DirEntry>>), Errno> {
        let Some((tx, list)) = self.dirs.lock().get(&fh).cloned() else { return Err(Errno::EBADF) };
        if let Some(list) = list.filter(|_| offset != 0) {
            return Ok((tx, list));
        }
        let list = Arc::new(self.engine.readdir(tx, self.obj(ino)).map_err(|e| errno(&e))?);
        if let Some(d) = self.dirs.lock().get_mut(&fh) {
            d.1 = Some(list.clone());
        }
        Ok((tx, list))
    }

    /// The object, O_APPEND and batch flag of handle `fh` — or, in a view, of a file
    /// its kernel opened without asking (handle 0; `flags` are the open
    /// flags the request carries). Such a file is not counted as open, and
    /// need not be: while the view's transaction lives, its own removals
    /// keep the object until it commits, and a file it looked up that
    /// anybody else removes (the name is in its read set) dooms it: it
    /// loses at its next read or at commit, and `txfs run` retries; once it
    /// has ended, its view's requests fail anyway.
    fn handle_of(&self, ino: INodeNo, fh: FileHandle, flags: i32) -> Option<(ObjId, bool, bool)> {
        if let Some(h) = self.handles.lock().get(&fh) {
            return Some((h.obj, h.append, h.batch));
        }
        (self.view().is_some() && fh.0 == 0).then(|| (self.obj(ino), flags & libc::O_APPEND != 0, false))
    }

    /// Opens a handle (always direct I/O: see the module docs).
    fn open_handle(&self, o: ObjId, tx: Option<TxId>, flags: i32) -> Result<(FileHandle, FopenFlags), Error> {
        self.engine.open_obj(o)?;
        let fh = self.new_fh();
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let readable = flags & libc::O_ACCMODE != libc::O_WRONLY;
        let append = flags & libc::O_APPEND != 0;
        self.handles.lock().insert(fh, Handle { obj: o, tx, append, writable, readable, batch: false });
        // A view's pages are its transaction's: the kernel may keep them.
        let mut fopen = if self.view().is_some() { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::FOPEN_DIRECT_IO };
        // No FLUSH at close (a round trip per close(2)) unless the handle
        // can carry a shared writable mapping (O_RDWR only: mmap needs read
        // access), whose dirty pages the kernel writes back at flush. This
        // file system does nothing else on it: no writeback cache, and POSIX
        // locks are the kernel's own.
        if flags & libc::O_ACCMODE != libc::O_RDWR {
            fopen |= FopenFlags::FOPEN_NOFLUSH;
        }
        Ok((fh, fopen))
    }
}

#[cfg(test)]
mod tests {
    use super::{dev_from_fuse, fuse_rdev};

    /// FUSE's device numbers are the kernel's `new_encode_dev` (minor's low
    /// byte, 12 bits of major, the rest of a 20-bit minor above them);
    /// `st_rdev` is glibc's `makedev`. Every number that fits goes both ways.
    #[test]
    fn device_numbers_cross_fuse_both_ways() {
        for (major, minor, wire) in [
            (1u32, 3u32, 0x103u32),
            (7, 200, 0x7c8),
            (259, 0x12345, 0x1231_0345),
            (0xfff, 0xfffff, 0xffff_ffff),
            (0, 0, 0),
        ] {
            let dev = libc::makedev(major, minor) as u64;
            assert_eq!(fuse_rdev(dev), wire, "{major}:{minor}");
            assert_eq!(dev_from_fuse(wire), dev, "{major}:{minor}");
        }
        // A major past 12 bits cannot be told to the kernel whole.
        assert_eq!(fuse_rdev(libc::makedev(0x1001, 5) as u64), fuse_rdev(libc::makedev(1, 5) as u64));
    }
}
