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

use crate::ioctl;
use crate::txmap::{self, TxMap};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use txfs_engine::{Attr, DirEntry, Durability, Engine, Error, FileKind, ObjId, SetAttr, Timestamp, TxId};

/// Entries and attributes while a transaction is live: never cached.
const TTL: Duration = Duration::ZERO;
/// Entries and attributes while the cache gate is open (no live transaction).
const CACHE_TTL: Duration = Duration::from_secs(1);
/// Entries and attributes of a transaction view: they change only through it.
const VIEW_TTL: Duration = Duration::from_secs(3600);

/// Kernel caching of entries and attributes, allowed only while no
/// transaction is live (DESIGN §9, "The cache gate"). The kernel's dentry
/// and attribute caches are shared by every process and a cached answer
/// never reaches the daemon, so while any transaction is live every lookup
/// and attribute is answered uncached (its reads must enter its read set,
/// its view differs from everyone else's). While none is, the committed
/// state is the only view and the mount caches like any FUSE file system.
/// The first begin closes the gate: with the write lock held (no cacheable
/// reply is being sent), it bumps the kernel's entry epoch
/// (`FUSE_NOTIFY_INC_EPOCH`: every cached dentry, and every lookup answered
/// before it, is revalidated) and drops the attributes of every node given
/// a nonzero TTL; only then does the transaction exist. The gate reopens
/// when the last transaction ends.
#[derive(Default)]
pub struct CacheGate {
    /// A transaction view (`txfs run`'s own mount): everything it is told
    /// is its transaction's and only it can ask, so it always caches.
    view: bool,
    /// Open or not, and a generation that changes at every close and
    /// reopen: a reply computed from state read under another generation
    /// is not cached (a commit may have changed it since).
    state: parking_lot::RwLock<(bool, u64)>,
    /// Node ids answered with a nonzero attribute TTL since the gate opened
    /// (in a view: every node id it handed out).
    cached: Mutex<std::collections::HashSet<u64>>,
    /// A duplicate of the session's `/dev/fuse` descriptor, set when the
    /// kernel accepted `FUSE_NOTIFY_INC_EPOCH`; without it the gate stays shut.
    dev: std::sync::OnceLock<std::os::fd::OwnedFd>,
    /// Held from closing the gate until the transaction exists, and by a
    /// reopen: no reopen between a close and its transaction. The
    /// invalidations run under it, not under `state`, so replies (which
    /// only read `state`) never wait for the kernel.
    closing: Mutex<()>,
    /// The epoch could not be bumped once: never cache again.
    broken: std::sync::atomic::AtomicBool,
    /// Transactions that leave the gate open: `txfs run` views whose
    /// process tree had no way into this mount but requests when it began
    /// (DESIGN §9, "Views leave the gate open"). The gate reopens once
    /// every live transaction is one of these; an id may outlive its
    /// transaction briefly (it goes when the run ends here). Lock order:
    /// `closing`, `state`, `free`.
    free: Mutex<std::collections::HashSet<TxId>>,
    /// `free` is not empty: the fast path of every request.
    any_free: std::sync::atomic::AtomicBool,
    /// Replies sent with a nonzero TTL, and gate closes that dropped
    /// something (`txfs status`).
    cached_replies: AtomicU64,
    closes: AtomicU64,
}

/// What the shared mount keeps of a transaction view it serves: enough to
/// drop what the view's kernel caches.
pub struct ViewLink {
    notifier: fuser::Notifier,
    /// A duplicate of the view's `/dev/fuse` descriptor (for the epoch).
    dev: std::os::fd::OwnedFd,
    /// The view's gate: every node id it handed out.
    gate: Arc<CacheGate>,
}

type Views = Arc<Mutex<HashMap<TxId, ViewLink>>>;

impl ViewLink {
    /// Something the view's transaction changed through the shared mount
    /// (a descriptor opened before the run): the view must not answer from
    /// what it cached. `o`: drop that file's pages and attributes; always
    /// bump the view's epoch (names may have changed).
    fn changed(&self, o: Option<ObjId>) {
        let _ = inc_epoch(&self.dev);
        if let Some(o) = o {
            let _ = self.notifier.inval_inode(INodeNo(o.0), 0, 0);
        }
    }

    /// The transaction ended: whatever still runs in the view must not be
    /// served its cached pages (after an abort: data that never existed).
    /// Requests reaching the daemon then fail.
    fn end(self) {
        let _ = std::thread::Builder::new().name("txfs-view-end".into()).spawn(move || {
            let _ = inc_epoch(&self.dev);
            for ino in std::mem::take(&mut *self.gate.cached.lock()) {
                let _ = self.notifier.inval_inode(INodeNo(ino), 0, 0);
            }
        });
    }
}

/// `FUSE_NOTIFY_INC_EPOCH` (kernel 6.16+, include/uapi/linux/fuse.h).
const FUSE_NOTIFY_INC_EPOCH: i32 = 8;

impl CacheGate {
    /// Probes `dev` (the session's `/dev/fuse`) for `FUSE_NOTIFY_INC_EPOCH`
    /// and opens the gate if the kernel has it.
    pub fn enable(&self, dev: std::os::fd::OwnedFd) -> bool {
        if inc_epoch(&dev).is_err() {
            return false;
        }
        let _ = self.dev.set(dev);
        self.state.write().0 = true;
        true
    }

    /// The generation to pass to [`CacheGate::reply`]; take it before reading.
    fn ticket(&self) -> u64 {
        self.state.read().1
    }

    /// Runs `send(ttl)` with the TTL a reply about node `ino` for `tx` may
    /// carry, holding the gate so that it cannot close in between.
    fn reply<R>(&self, tx: Option<TxId>, ino: u64, ticket: u64, send: impl FnOnce(&Duration) -> R) -> R {
        if self.view {
            self.cached.lock().insert(ino);
            return send(&VIEW_TTL);
        }
        let g = self.state.read();
        if g.0 && g.1 == ticket && tx.is_none() && ino < PRIVATE_BASE {
            self.cached.lock().insert(ino);
            self.cached_replies.fetch_add(1, Ordering::Relaxed);
            let r = send(&CACHE_TTL);
            drop(g);
            return r;
        }
        send(&TTL)
    }

    /// Closes the gate (if open), then runs `begin`: the transaction exists
    /// only once nothing cached can answer for it.
    fn close_then<T>(&self, notifier: Option<&fuser::Notifier>, begin: impl FnOnce() -> T) -> T {
        let _closing = self.closing.lock();
        self.close_locked(notifier);
        begin()
    }

    /// Closes the gate if open (the caller holds `closing`).
    fn close_locked(&self, notifier: Option<&fuser::Notifier>) {
        let was_open = {
            // No cacheable reply is being sent once this is held.
            let mut g = self.state.write();
            let was = g.0;
            if was {
                *g = (false, g.1 + 1);
            }
            was
        };
        if was_open {
            self.invalidate(notifier);
        }
    }

    /// Begins a transaction that leaves the gate as it is (a view whose
    /// tree cannot reach this mount but by requests, which [`pin`] it).
    /// Under `closing`: no reopen counts the live transactions between the
    /// begin and its entry in `free`.
    ///
    /// [`pin`]: CacheGate::pin
    fn begin_free(&self, begin: impl FnOnce() -> TxId) -> TxId {
        let _closing = self.closing.lock();
        let tx = begin();
        self.free.lock().insert(tx);
        self.any_free.store(true, Ordering::SeqCst);
        tx
    }

    /// From now on `tx` keeps the gate shut like any transaction: one of
    /// its processes sent a request to this mount (what it read from the
    /// kernel's caches would miss its read set, and what it changes must
    /// not be cached for others), or it commits (everything cached of
    /// what it changed must go before anyone can read the change). Closes
    /// the gate first if it is open.
    fn pin(&self, tx: TxId, notifier: Option<&fuser::Notifier>) {
        if !self.any_free.load(Ordering::SeqCst) || !self.free.lock().contains(&tx) {
            return;
        }
        let _closing = self.closing.lock();
        // Again under `closing`: an abort that ended `tx` meanwhile (its
        // reopen saw the gate open) must not leave it shut with nothing live.
        if self.free.lock().contains(&tx) {
            self.close_locked(notifier);
            self.unfree(tx);
        }
    }

    /// `tx` is no longer one that leaves the gate open (pinned, or ended).
    fn unfree(&self, tx: TxId) {
        let mut f = self.free.lock();
        if f.remove(&tx) {
            self.any_free.store(!f.is_empty(), Ordering::SeqCst);
        }
    }

    /// Open or shut, replies cached and closes so far (`txfs status`).
    fn counters(&self) -> [u64; 3] {
        let open = self.state.read().0 && !self.broken.load(Ordering::SeqCst);
        [u64::from(open), self.cached_replies.load(Ordering::Relaxed), self.closes.load(Ordering::Relaxed)]
    }

    /// Drops every entry (the epoch) and attribute the kernel may cache.
    /// Every cacheable reply names its node in `cached`, so when that is
    /// empty nothing was cached since the gate opened (what was, before the
    /// last close, that close's epoch already voids): nothing to drop. A
    /// thread committing one transaction after another (W9) then saves the
    /// epoch write, and the kernel keeps nothing it would re-look up.
    fn invalidate(&self, notifier: Option<&fuser::Notifier>) {
        let cached = std::mem::take(&mut *self.cached.lock());
        if cached.is_empty() {
            return;
        }
        self.closes.fetch_add(1, Ordering::Relaxed);
        if let Some(dev) = self.dev.get() {
            if let Err(e) = inc_epoch(dev) {
                tracing::error!("FUSE_NOTIFY_INC_EPOCH failed ({e}): no more kernel caching on this mount");
                self.broken.store(true, Ordering::SeqCst);
            }
        }
        if let Some(n) = notifier {
            for ino in cached {
                // Offset -1: attributes only, no page-cache work. ENOENT:
                // the kernel has forgotten the node.
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
            }
        }
    }

    /// Reopens the gate if every live transaction leaves it open.
    fn reopen(&self, engine: &Engine) {
        if self.dev.get().is_none() || self.broken.load(Ordering::SeqCst) {
            return;
        }
        let _closing = self.closing.lock();
        let mut g = self.state.write();
        // Membership, not a count: an id may stay in `free` after its
        // transaction ended (aborted through a view, whose gate is its own,
        // or between the engine's end and `unfree`).
        let free = self.free.lock();
        if !g.0 && engine.all_live(|t| free.contains(&t)) {
            *g = (true, g.1 + 1);
        }
    }
}

fn inc_epoch(dev: &std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // struct fuse_out_header { len: u32, error: i32 (the notify code), unique: u64 = 0 }
    let mut hdr = [0u8; 16];
    hdr[0..4].copy_from_slice(&16u32.to_ne_bytes());
    hdr[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_ne_bytes());
    // SAFETY: writes 16 bytes from a live buffer to an open descriptor.
    let n = unsafe { libc::write(dev.as_raw_fd(), hdr.as_ptr().cast(), hdr.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

struct Handle {
    obj: ObjId,
    /// The transaction the opener was in: used when a request carries no
    /// caller (pid 0).
    tx: Option<TxId>,
    append: bool,
    /// Opened for writing (`TXFS_IOC_BATCH` needs it).
    writable: bool,
    /// A batch handle (`TXFS_IOC_BATCH`): each WRITE through it carries
    /// several writes to its file ([`parse_batch`]).
    batch: bool,
}

/// The layout of a batch WRITE (`TXFS_IOC_BATCH`, clients/c/txfs.h): the
/// magic, the whole batch's length (so a WRITE the kernel split is refused,
/// not half applied), then records of (offset u64, length u32, 0 u32, bytes).
const BATCH_MAGIC: &[u8; 8] = b"TXFSBAT1";

/// The writes of a batch WRITE, or EINVAL if `data` is not exactly one.
fn parse_batch(data: &[u8]) -> Result<Vec<(u64, &[u8])>, Errno> {
    let bad = || Errno::from_i32(libc::EINVAL);
    if data.len() < 16 || &data[..8] != BATCH_MAGIC || ioctl::u64_at(data, 8) != data.len() as u64 {
        return Err(bad());
    }
    let mut out = Vec::new();
    let mut at = 16;
    while at < data.len() {
        let hdr = data.get(at..at + 16).ok_or_else(bad)?;
        let (off, len) = (ioctl::u64_at(hdr, 0), ioctl::u32_at(hdr, 8) as usize);
        if ioctl::u32_at(hdr, 12) != 0 || len == 0 || off.checked_add(len as u64).is_none_or(|e| e > i64::MAX as u64) {
            return Err(bad());
        }
        out.push((off, data.get(at + 16..at + 16 + len).ok_or_else(bad)?));
        at += 16 + len;
    }
    Ok(out)
}

pub struct TxFs {
    pub engine: Arc<Engine>,
    pub txs: Arc<TxMap>,
    backing: PathBuf,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Open directory handles: the listing as the opener saw it, and whose view.
    dirs: Mutex<HashMap<u64, DirSnapshot>>,
    next_fh: AtomicU64,
    /// Set once the session exists; used to drop stale kernel pages.
    pub notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    invalidator: Mutex<std::sync::mpsc::Sender<Deferred>>,
    private: Arc<Mutex<Private>>,
    /// Kernel caching while no transaction is live.
    pub gate: Arc<CacheGate>,
    /// `Some(tx)`: this is the transaction view of a `txfs run` (its own
    /// FUSE connection, mounted over the mount point in the command's mount
    /// namespace): every request on it is `tx`'s, whoever sends it.
    view: Option<TxId>,
    /// The transaction views this (shared) mount serves.
    views: Views,
    /// Node ids whose pages the kernel may cache (see [`Paged`]).
    paged: Arc<Paged>,
    /// Where this (shared) mount is mounted, as the daemon sees it.
    pub point: std::sync::OnceLock<PathBuf>,
    /// LOOKUP and GETATTR requests served (`txfs status`).
    attr_requests: AtomicU64,
    /// This mount's device (`way_in`).
    dev: std::sync::OnceLock<u64>,
    /// In a view: the shared mount's gate (what `txfs status` reports).
    shared_gate: Option<Arc<CacheGate>>,
}

/// The node ids of the shared mount that may have pages in the kernel's
/// page cache. Handles there are `FOPEN_DIRECT_IO`, so a page is only ever
/// filled by a READ without a lock owner (a mapping's fault) or by a
/// mapping's write-back; a node is added before that READ touches the
/// engine, and never removed. A change to any other node has no pages to
/// drop, so its reply is sent at once instead of after a hand-off to the
/// invalidation thread (which costs a thread switch per plain write and per
/// commit). A node added after a commit's check read the committed data.
#[derive(Default)]
struct Paged(Mutex<std::collections::HashSet<u64>>);

impl Paged {
    fn add(&self, ino: u64) {
        self.0.lock().insert(ino);
    }

    fn keep(&self, mut objs: Vec<ObjId>) -> Vec<ObjId> {
        let set = self.0.lock();
        objs.retain(|o| set.contains(&o.0));
        objs
    }
}

/// An open directory's transaction (of the opener) and its listing, taken at
/// the first readdir. NB: not at opendir: the client libraries open the
/// mount root to send every ioctl, and a listing read there would enter the
/// transaction's read set (a spurious conflict with any create in the root)
/// and fail in a doomed transaction (so its ABORT could never be sent).
type DirSnapshot = (Option<TxId>, Option<Arc<Vec<DirEntry>>>);

/// Files whose cached pages must go, and the reply to send after.
type Deferred = (Vec<ObjId>, Box<dyn FnOnce() + Send>);

fn all_ids(private: &Mutex<Private>, objs: Vec<ObjId>) -> Vec<ObjId> {
    let p = private.lock();
    let mut out = Vec::with_capacity(objs.len());
    for o in objs {
        out.extend(p.of_obj.get(&o).into_iter().flatten().map(|k| ObjId(*k)));
        out.push(o);
    }
    out
}

/// Ends `tx` — commits it with `Some(durability)`, else aborts it — and
/// returns the node ids whose cached pages must go before anyone hears of
/// it: every id of the files a commit changed, and the transaction's own
/// private nodes either way (their pages hold its view).
/// A transaction that left the gate open shuts it for its commit (`notifier`
/// drops the attributes cached meanwhile).
fn end_tx(
    engine: &Engine,
    private: &Mutex<Private>,
    gate: &CacheGate,
    notifier: Option<&fuser::Notifier>,
    views: &Mutex<HashMap<TxId, ViewLink>>,
    tx: TxId,
    commit: Option<Durability>,
) -> (Result<(), Error>, Vec<ObjId>) {
    let own: Vec<ObjId> = private.lock().of_tx.remove(&tx).unwrap_or_default().into_iter().map(ObjId).collect();
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
    if let Some(v) = views.lock().remove(&tx) {
        v.end();
    }
    let mut pages = all_ids(private, changed);
    pages.extend(own.iter().copied());
    // Private ids the kernel does not hold (any more) go now; the others
    // when it forgets them (`forget`).
    let mut p = private.lock();
    for k in own {
        if !p.nlookup.contains_key(&k.0) {
            p.remove(k.0);
        }
    }
    drop(p);
    (r, pages)
}

fn invalidator(notifier: Arc<std::sync::OnceLock<fuser::Notifier>>, jobs: std::sync::mpsc::Receiver<Deferred>) {
    for (objs, reply) in jobs {
        if let Some(n) = notifier.get() {
            for o in objs {
                // ENOENT: the kernel has no inode for it, nothing to drop.
                let _ = n.inval_inode(INodeNo(o.0), 0, 0);
            }
        }
        reply();
    }
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
        Err(e) => {
            let d = e.duration();
            Timestamp { secs: -(d.as_secs() as i64) - 1, nanos: 1_000_000_000 - d.subsec_nanos() }
        }
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Other => FileType::RegularFile,
    }
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
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// Node ids from here up are transaction-private (see [`Private`]).
const PRIVATE_BASE: u64 = 1 << 62;

/// Transaction-private node ids: a transaction that changed an existing
/// file gets its own kernel inode for it, so the pages its mappings fault
/// in live in a page cache nobody else reaches (SPEC §6).
#[derive(Default)]
struct Private {
    owner: HashMap<u64, (TxId, ObjId)>,
    by_pair: HashMap<(TxId, ObjId), u64>,
    of_obj: HashMap<ObjId, Vec<u64>>,
    of_tx: HashMap<TxId, Vec<u64>>,
    /// Lookups of a private id the kernel counts (entry replies) and has
    /// not forgotten: an id is dropped once its transaction has ended and
    /// this is zero, so the maps (and `all_ids`) do not grow with every
    /// transaction the daemon ever served.
    nlookup: HashMap<u64, u64>,
    next: u64,
}

impl Private {
    fn remove(&mut self, k: u64) {
        if let Some((t, o)) = self.owner.remove(&k) {
            self.by_pair.remove(&(t, o));
            if let Some(v) = self.of_obj.get_mut(&o) {
                v.retain(|x| *x != k);
                if v.is_empty() {
                    self.of_obj.remove(&o);
                }
            }
        }
        self.nlookup.remove(&k);
        tracing::trace!(node = k, "private node id dropped");
    }
}

impl TxFs {
    pub fn new(engine: Arc<Engine>, backing: PathBuf) -> TxFs {
        let notifier = Arc::new(std::sync::OnceLock::new());
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
        std::thread::Builder::new()
            .name("txfs-reaper".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(250));
                for dead in t.reap() {
                    tracing::info!(tx = %dead, "owner exited with the transaction open: aborting it");
                    let (_, pages) = end_tx(&e, &p, &g, None, &vs, dead, None);
                    let _ = inval.send((pg.keep(pages), Box::new(|| {})));
                }
            })
            .expect("spawning the reaper thread");
        TxFs {
            engine,
            txs,
            backing,
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            notifier,
            invalidator: Mutex::new(tx),
            private,
            gate,
            view: None,
            views,
            paged,
            point: std::sync::OnceLock::new(),
            attr_requests: AtomicU64::new(0),
            dev: std::sync::OnceLock::new(),
            shared_gate: None,
        }
    }

    /// The transaction view of `tx`: the same engine, its own handles and
    /// node ids, no private ids, no invalidation (nothing but the
    /// transaction changes what it shows).
    fn new_view(&self, tx: TxId) -> TxFs {
        let (dead_end, _) = std::sync::mpsc::channel();
        TxFs {
            engine: self.engine.clone(),
            txs: self.txs.clone(),
            backing: self.backing.clone(),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            notifier: Arc::new(std::sync::OnceLock::new()),
            invalidator: Mutex::new(dead_end),
            private: Arc::default(),
            gate: Arc::new(CacheGate { view: true, ..CacheGate::default() }),
            view: Some(tx),
            views: Arc::default(),
            paged: Arc::default(),
            point: std::sync::OnceLock::new(),
            attr_requests: AtomicU64::new(0),
            dev: std::sync::OnceLock::new(),
            shared_gate: Some(self.gate.clone()),
        }
    }

    /// Serves the transaction view of `tx` on the `/dev/fuse` descriptor
    /// `devfd` of process `caller` (`txfs run`, whose child mounted it over
    /// the mount point in its own mount namespace before asking).
    fn serve_view(&self, caller: u32, devfd: i32, tx: TxId) -> std::io::Result<()> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let sys = |r: libc::c_long| -> std::io::Result<OwnedFd> {
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a descriptor the kernel just gave us.
            Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
        };
        // SAFETY: plain syscalls on integers.
        let pidfd = sys(unsafe { libc::syscall(libc::SYS_pidfd_open, caller as libc::pid_t, 0) })?;
        // SAFETY: as above.
        let dev = sys(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), devfd, 0) })?;
        // It must be /dev/fuse (10:229), mounted already: INIT is waiting.
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(dev.as_raw_fd(), &mut st) } != 0 || st.st_rdev != libc::makedev(10, 229) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut pfd = libc::pollfd { fd: dev.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 5000) } != 1 {
            return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        let mut config = fuser::Config::default();
        config.n_threads = Some(2);
        config.acl = fuser::SessionACL::All;
        // Over io_uring when the kernel offers it, as the shared mount: a
        // view's round trip is then ~25 µs shorter (`git add -A` of 20 000
        // empty files under `txfs run`: 95 → 34 µs per file, bench/NOTES.md
        // item 35). Two ring threads per CPU; `TXFS_URING_THREADS=0` (the
        // shared mount's knob) keeps views on /dev/fuse too. A view never
        // answers late (it has no invalidation thread), so its queues need
        // no pump and no mount point.
        config.uring_threads = Some(env_count("TXFS_URING_THREADS", 2).min(2));
        let dev2 = dev.try_clone()?;
        let view = self.new_view(tx);
        let gate = view.gate.clone();
        let session = fuser::Session::from_fd(view, dev, fuser::SessionACL::All, config)?;
        let uring = session.io_uring();
        self.views.lock().insert(tx, ViewLink { notifier: session.notifier(), dev: dev2, gate });
        std::thread::Builder::new().name(format!("txfs-view-{}", tx.0)).spawn(move || {
            // Ends when the last process of the command's namespace is gone.
            if let Err(e) = session.run() {
                tracing::debug!(%tx, "transaction view ended: {e}");
            }
        })?;
        let transport = if uring { "io_uring" } else { "/dev/fuse" };
        tracing::info!(%tx, caller, "serving a transaction view over {transport}");
        Ok(())
    }

    /// Ends `tx` (see [`end_tx`]) on the gate of [`TxFs::end_gate`].
    fn end_tx(&self, tx: TxId, commit: Option<Durability>) -> (Result<(), Error>, Vec<ObjId>) {
        end_tx(&self.engine, &self.private, self.end_gate(), self.notifier.get(), &self.views, tx, commit)
    }

    /// The gate a transaction ended here leaves: the shared mount's, also
    /// in a view (a process of the run that begins and aborts through its
    /// view ends the run's transaction).
    fn end_gate(&self) -> &CacheGate {
        self.shared_gate.as_deref().unwrap_or(&self.gate)
    }

    /// How process `pid` (a `txfs run` child about to exec, its view
    /// mounted) could reach this mount other than by requests: `None` if it
    /// cannot (see [`txmap::way_into`]), else why it can.
    fn way_in(&self, pid: u32) -> Option<String> {
        let Some(point) = self.point.get() else { return Some("mount point unknown".into()) };
        // Read once (the first run), from what the daemon's own mount table
        // says of the mount it named `txfs:BACKING`, whatever is mounted
        // over its mount point since.
        let dev = match self.dev.get() {
            Some(d) => *d,
            None => match txmap::dev_of_source(&format!("txfs:{}", self.backing.display())) {
                Ok(d) => *self.dev.get_or_init(|| d),
                Err(e) => return Some(format!("/proc/self/mountinfo: {e}")),
            },
        };
        txmap::way_into(pid, dev, point)
    }

    /// A change by `tx` through this (shared) mount: if `tx` is a `txfs run`
    /// with a view, the view drops what it cached of it (`o`: that file).
    fn view_saw(&self, tx: Option<TxId>, o: Option<ObjId>) {
        if let Some(t) = tx {
            if let Some(v) = self.views.lock().get(&t) {
                v.changed(o);
            }
        }
    }

    /// The engine object behind a kernel node id.
    fn obj(&self, ino: INodeNo) -> ObjId {
        if ino.0 >= PRIVATE_BASE {
            if let Some((_, o)) = self.private.lock().owner.get(&ino.0) {
                return *o;
            }
        }
        ObjId(ino.0)
    }

    /// The transaction whose private node `ino` is, if it is one: `Some(None)`
    /// once that transaction has ended (then everyone's committed view).
    fn private_owner(&self, ino: INodeNo) -> Option<Option<TxId>> {
        if ino.0 < PRIVATE_BASE {
            return None;
        }
        let t = self.private.lock().owner.get(&ino.0).map(|(t, _)| *t)?;
        Some(Some(t).filter(|t| self.engine.is_live(*t)))
    }

    /// The view for a request on node `ino`: a private node's owner, else
    /// the caller's transaction.
    fn tx_at(&self, req: &Request, ino: INodeNo) -> Option<TxId> {
        if self.view.is_some() {
            return self.view;
        }
        match self.private_owner(ino) {
            Some(owner) => owner,
            None => self.tx(req),
        }
    }

    /// The node id `tx` should know `o` by: a transaction knows every
    /// existing regular file it looks up by a private id, so the pages its
    /// mappings fault in (its view) stay in a page cache only it reaches.
    /// Files it created are reachable by nobody else anyway.
    fn node_id(&self, tx: Option<TxId>, o: ObjId, kind: FileKind) -> u64 {
        let Some(t) = tx.filter(|_| self.view.is_none()) else { return o.0 };
        // Not directories: a lookup answered with another node id than the
        // kernel's dentry has makes it d_invalidate that dentry, which
        // unhashes other processes' working directories (getcwd: ENOENT)
        // and detaches mounts below it. An uncommitted rmdir therefore
        // kills the shared inode (README "Known limits").
        if kind != FileKind::File {
            return o.0;
        }
        if let Some(k) = self.private.lock().by_pair.get(&(t, o)) {
            return *k;
        }
        if self.engine.created_by(t, o) {
            return o.0;
        }
        let mut p = self.private.lock();
        p.next += 1;
        let k = PRIVATE_BASE + p.next;
        p.owner.insert(k, (t, o));
        p.by_pair.insert((t, o), k);
        p.of_obj.entry(o).or_default().push(k);
        p.of_tx.entry(t).or_default().push(k);
        k
    }

    /// Attributes for an entry reply, under the node id `tx` knows them by.
    /// Attributes for an entry reply (the kernel counts a lookup of the
    /// node id it names).
    fn entry_attr(&self, tx: Option<TxId>, a: &Attr) -> FileAttr {
        let mut f = fattr(a);
        f.ino = INodeNo(self.node_id(tx, a.obj, a.kind));
        if f.ino.0 >= PRIVATE_BASE {
            *self.private.lock().nlookup.entry(f.ino.0).or_default() += 1;
        }
        f
    }

    /// Every node id of these objects: the shared one and private ones.
    fn all_ids(&self, objs: Vec<ObjId>) -> Vec<ObjId> {
        all_ids(&self.private, objs)
    }

    /// Sends `reply` once the cached pages of `objs` are gone (on the
    /// invalidation thread; see the module docs).
    fn after(&self, objs: Vec<ObjId>, reply: impl FnOnce() + Send + 'static) {
        let objs = if self.view.is_none() { self.paged.keep(objs) } else { objs };
        if objs.is_empty() || self.notifier.get().is_none() {
            return reply();
        }
        if let Err(std::sync::mpsc::SendError((_, reply))) = self.invalidator.lock().send((objs, Box::new(reply))) {
            reply();
        }
    }

    /// What a content change must invalidate before it is answered: plain
    /// changes commit at once; a transaction's stay private until commit.
    fn committed_now(&self, tx: Option<TxId>, o: ObjId) -> Vec<ObjId> {
        if tx.is_none() {
            self.all_ids(vec![o])
        } else {
            Vec::new()
        }
    }

    fn tx(&self, req: &Request) -> Option<TxId> {
        if self.view.is_some() {
            return self.view;
        }
        let tx = self.txs.of(req.pid());
        if let Some(t) = tx {
            // A `txfs run` whose view left the gate open came in here.
            self.gate.pin(t, self.notifier.get());
        }
        tx
    }

    /// The caller's transaction, or for caller-less requests the handle's.
    fn tx_fh(&self, req: &Request, fh: FileHandle) -> Option<TxId> {
        if self.view.is_some() {
            return self.view;
        }
        if req.pid() == 0 {
            return self.handles.lock().get(&fh.0).and_then(|h| h.tx);
        }
        self.tx(req)
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// The transaction thread `tid` is in and its depth (0: joined to a
    /// tree without a begin of its own, or none).
    fn state_of(&self, tid: u32) -> (Option<TxId>, u32) {
        match self.txs.thread(tid) {
            Some((tx, depth, _)) => (Some(tx), depth),
            None => (self.txs.of(tid), 0),
        }
    }

    /// `struct txfs_ioc_state` for thread `tid`.
    fn state_bytes(&self, tid: u32) -> Vec<u8> {
        let (tx, depth) = self.state_of(tid);
        let mut out = vec![0u8; 16];
        out[0..8].copy_from_slice(&tx.map_or(0, |t| t.0).to_le_bytes());
        out[8..12].copy_from_slice(&depth.to_le_bytes());
        out
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
        let Some((tx, list)) = self.dirs.lock().get(&fh.0).cloned() else { return Err(Errno::EBADF) };
        if let Some(list) = list.filter(|_| offset != 0) {
            return Ok((tx, list));
        }
        let list = Arc::new(self.engine.readdir(tx, self.obj(ino)).map_err(|e| errno(&e))?);
        if let Some(d) = self.dirs.lock().get_mut(&fh.0) {
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
        if let Some(h) = self.handles.lock().get(&fh.0) {
            return Some((h.obj, h.append, h.batch));
        }
        (self.view.is_some() && fh.0 == 0).then(|| (self.obj(ino), flags & libc::O_APPEND != 0, false))
    }

    /// Opens a handle (always direct I/O: see the module docs).
    fn open_handle(&self, o: ObjId, tx: Option<TxId>, flags: i32) -> Result<(u64, FopenFlags), Error> {
        self.engine.open_obj(o)?;
        let fh = self.new_fh();
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.handles
            .lock()
            .insert(fh, Handle { obj: o, tx, append: flags & libc::O_APPEND != 0, writable, batch: false });
        // A view's pages are its transaction's: the kernel may keep them.
        let mut fopen = if self.view.is_some() { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::FOPEN_DIRECT_IO };
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

    /// Runs one ioctl; returns the reply data and the files whose cached
    /// pages must go before the reply.
    fn ioctl_cmd(&self, req: &Request, ino: INodeNo, cmd: u32, data: &[u8]) -> Result<(Vec<u8>, Vec<ObjId>), Errno> {
        let tid = req.pid();
        let e = |r: Result<(), Error>| r.map_err(|e| errno(&e));
        // A process of a `txfs run` whose view left the gate open: shut it.
        let _ = self.tx(req);
        match cmd {
            ioctl::BEGIN | ioctl::BEGIN_STATE | ioctl::BEGIN_FILE => {
                // BEGIN_STATE only, before the begin: how the caller's
                // transaction of its own that it asks about (0: its last)
                // ended, and the transaction it was in (a `txfs run` tree's
                // or view's too, which it joins at depth 1 without owning).
                let before = (cmd != ioctl::BEGIN).then(|| {
                    let ask = ioctl::u64_at(data, 16);
                    let last = self.txs.outcome(tid, (ask != 0).then_some(TxId(ask)));
                    (last, self.view.or(self.state_of(tid).0))
                });
                if let Some(view) = self.view {
                    // Nests into the view's transaction, whoever asks.
                    self.txs.join(tid, view);
                } else {
                    let engine = &self.engine;
                    let tx = self.gate.close_then(self.notifier.get(), || self.txs.begin(tid, || engine.begin()));
                    tracing::debug!(tid, %tx, "begin");
                }
                let Some((last, prior)) = before else { return Ok((Vec::new(), Vec::new())) };
                // struct txfs_ioc_begin_state: the state (as STATE), last_committed, last_tx, prior_tx.
                let mut out = self.state_bytes(tid);
                out.resize(32, 0);
                if let Some(p) = prior {
                    out[24..32].copy_from_slice(&p.0.to_le_bytes());
                }
                if let Some((tx, committed)) = last {
                    out[12..16].copy_from_slice(&u32::from(committed).to_le_bytes());
                    out[16..24].copy_from_slice(&tx.0.to_le_bytes());
                }
                if cmd == ioctl::BEGIN_FILE {
                    // struct txfs_ioc_begin_file: then size, bytes 24..40 and
                    // whether they are there (a regular file at least 40
                    // bytes long, read without error). Read in the new
                    // transaction, so both are in its read set, exactly as
                    // the GETATTR and READ they replace would be.
                    out.resize(64, 0);
                    let tx = self.tx(req);
                    let o = self.obj(ino);
                    if let Ok(a) = self.engine.getattr(tx, o) {
                        if a.kind == FileKind::File && a.size >= 40 {
                            if let Ok(head) = self.engine.read(tx, o, 24, 16) {
                                if head.len() == 16 {
                                    out[32..40].copy_from_slice(&a.size.to_le_bytes());
                                    out[40..56].copy_from_slice(&head);
                                    out[56..60].copy_from_slice(&1u32.to_le_bytes());
                                }
                            }
                        }
                    }
                }
                Ok((out, Vec::new()))
            }
            ioctl::COMMIT | ioctl::COMMIT_IF => {
                let flags = ioctl::u32_at(data, 0);
                let durability =
                    if flags & ioctl::COMMIT_ORDERED != 0 { Durability::Ordered } else { Durability::Durable };
                match self.txs.thread(tid) {
                    None if cmd == ioctl::COMMIT_IF => return Err(Errno::from_i32(libc::ESTALE)),
                    None => return Err(Errno::from_i32(libc::EINVAL)),
                    // Not the transaction the caller's level lived in (it
                    // ended, and another began): leave it alone.
                    Some((tx, _, _)) if cmd == ioctl::COMMIT_IF && tx.0 != ioctl::u64_at(data, 8) => {
                        return Err(Errno::from_i32(libc::ESTALE))
                    }
                    Some(_) => {}
                }
                match self.txs.end(tid) {
                    Some((tx, true)) => {
                        let (r, pages) = self.end_tx(tx, Some(durability));
                        self.txs.ended(tid, tx, r.is_ok());
                        match r {
                            Ok(()) => Ok((Vec::new(), pages)),
                            Err(err) => {
                                tracing::info!(tid, %tx, "commit failed: {err}");
                                self.after(pages, || {});
                                Err(errno(&err))
                            }
                        }
                    }
                    _ => Ok((Vec::new(), Vec::new())),
                }
            }
            ioctl::ABORT => match self.txs.drop_thread(tid) {
                Some((tx, owned)) => {
                    // Inside a tree transaction an abort dooms the whole tree.
                    let (_, pages) = self.end_tx(tx, None);
                    if owned {
                        self.txs.ended(tid, tx, false);
                    }
                    Ok((Vec::new(), pages))
                }
                None => Err(Errno::from_i32(libc::EINVAL)),
            },
            ioctl::SYNC => e(self.engine.sync()).map(|_| (Vec::new(), Vec::new())),
            ioctl::RUN => {
                let pid = ioctl::u32_at(data, 0);
                let op = ioctl::u32_at(data, 4);
                let flags = ioctl::u32_at(data, 8);
                let caller = txmap::process_of(tid).ok_or(Errno::from_i32(libc::ESRCH))?;
                match op {
                    ioctl::RUN_BEGIN => {
                        // Only the parent may make a process tree a transaction.
                        if txmap::parent_of(pid) != Some(caller) {
                            return Err(Errno::from_i32(libc::EPERM));
                        }
                        if self.txs.tree(pid).is_some() {
                            return Err(Errno::from_i32(libc::EEXIST));
                        }
                        if self.view.is_some() {
                            // `txfs run` inside `txfs run`: the view is already one transaction.
                            return Err(Errno::from_i32(libc::EBUSY));
                        }
                        let Some(starts) = txmap::tree_starts(pid, caller) else {
                            tracing::warn!(pid, caller, "cannot read the start times of a process tree in /proc");
                            return Err(Errno::from_i32(libc::EAGAIN));
                        };
                        // TXFS_NO_VIEWS=1: serve none (as daemons before views did).
                        // Only for root: a view is served without the daemon
                        // checking permissions (the kernel does, by the mount's
                        // default_permissions, which only root's mount guarantees).
                        let views_allowed = std::env::var_os("TXFS_NO_VIEWS").is_none_or(|v| v != "1");
                        let with_view = flags & ioctl::RUN_VIEW != 0 && req.uid() == 0 && views_allowed;
                        // A tree that reaches this mount only through its view
                        // (or by requests, which pin the gate) leaves it open.
                        let escape = if with_view { self.way_in(pid) } else { Some("no view".into()) };
                        let begin = || {
                            let tx = self.engine.begin();
                            self.txs.add_tree(pid, caller, tx, starts);
                            tx
                        };
                        let tx = match &escape {
                            None => self.gate.begin_free(begin),
                            Some(_) => self.gate.close_then(self.notifier.get(), begin),
                        };
                        if let Some(why) = escape.as_deref().filter(|_| with_view) {
                            tracing::info!(pid, %tx, "the kernel stops caching while this run lives: {why}");
                        }
                        if with_view {
                            let devfd = ioctl::u32_at(data, 12) as i32;
                            if let Err(e) = self.serve_view(caller, devfd, tx) {
                                tracing::warn!(pid, %tx, "cannot serve a transaction view: {e}");
                                self.txs.remove_tree(pid);
                                let (_, pages) = self.end_tx(tx, None);
                                self.after(pages, || {});
                                return Err(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)));
                            }
                        }
                        tracing::info!(pid, %tx, "process tree transaction begins");
                        Ok((Vec::new(), Vec::new()))
                    }
                    ioctl::RUN_COMMIT | ioctl::RUN_ABORT if self.view.is_some() => Err(Errno::from_i32(libc::EBUSY)),
                    ioctl::RUN_COMMIT | ioctl::RUN_ABORT => {
                        let (tx, owner) = self.txs.tree(pid).ok_or(Errno::from_i32(libc::ENOENT))?;
                        if owner != caller {
                            return Err(Errno::from_i32(libc::EPERM));
                        }
                        self.txs.remove_tree(pid);
                        if op == ioctl::RUN_ABORT {
                            // EDEADLK tells `txfs run` that the command failed
                            // because it lost a conflict: worth a rerun.
                            let doomed = self.engine.is_doomed(tx);
                            let (_, pages) = self.end_tx(tx, None);
                            tracing::info!(pid, %tx, doomed, "process tree transaction aborted");
                            // NB: the pages are dropped before the reply only on success.
                            self.after(pages, || {});
                            return if doomed {
                                Err(Errno::from_i32(libc::EDEADLK))
                            } else {
                                Ok((Vec::new(), Vec::new()))
                            };
                        }
                        let d =
                            if flags & ioctl::COMMIT_ORDERED != 0 { Durability::Ordered } else { Durability::Durable };
                        let (r, pages) = self.end_tx(tx, Some(d));
                        match r {
                            Ok(()) => {
                                tracing::info!(pid, %tx, "process tree transaction committed");
                                Ok((Vec::new(), pages))
                            }
                            Err(err) => {
                                tracing::info!(pid, %tx, "process tree commit failed: {err}");
                                self.after(pages, || {});
                                Err(errno(&err))
                            }
                        }
                    }
                    _ => Err(Errno::EINVAL),
                }
            }
            ioctl::STATUS => {
                let s = self.engine.stats();
                let mut out = Vec::with_capacity(64);
                for v in [
                    s.commits,
                    s.aborts,
                    s.conflicts,
                    s.live_txs,
                    s.journal_bytes,
                    s.journal_syncs,
                    s.checkpoints,
                    s.last_seq,
                ] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Ok((out, Vec::new()))
            }
            ioctl::CACHE => {
                let [open, cached, closes] = self.shared_gate.as_ref().unwrap_or(&self.gate).counters();
                let asked = self.attr_requests.load(Ordering::Relaxed);
                Ok(([open, cached, closes, asked].iter().flat_map(|v| v.to_le_bytes()).collect(), Vec::new()))
            }
            ioctl::STATE => Ok((self.state_bytes(tid), Vec::new())),
            _ => Err(Errno::from_i32(libc::ENOTTY)),
        }
    }
}

impl Filesystem for TxFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        // mmap of direct-I/O files (module docs); kernels before 6.6 refuse
        // shared mappings instead.
        if config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_err() {
            tracing::warn!("kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: shared mappings will fail with ENODEV");
        }
        // A view always lists with attributes (`readdirplus`; not the
        // adaptive mode, which asks for them only at offset 0 and after a
        // lookup, while git lists a whole directory before it stats it).
        if self.view.is_some() {
            let plus = fuser::InitFlags::FUSE_DO_READDIRPLUS;
            if config.add_capabilities(plus).is_err() {
                tracing::debug!("kernel lacks READDIRPLUS: a view looks every listed name up");
            }
        }
        tracing::info!(backing = %self.backing.display(), "mounted");
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(tx) = self.view {
            tracing::debug!(%tx, "transaction view unmounted");
            return;
        }
        tracing::info!("unmounting: checkpointing");
        if let Err(e) = self.engine.shutdown() {
            tracing::error!("final checkpoint failed: {e}");
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 < PRIVATE_BASE || self.view.is_some() {
            return;
        }
        let mut p = self.private.lock();
        let Some(n) = p.nlookup.get_mut(&ino.0) else { return };
        *n = n.saturating_sub(nlookup);
        if *n > 0 {
            return;
        }
        p.nlookup.remove(&ino.0);
        // Its transaction still live: it may look the file up again (and
        // gets the same id); `end_tx` drops it.
        let live = p.owner.get(&ino.0).is_some_and(|(t, _)| self.engine.is_live(*t));
        if !live {
            p.remove(ino.0);
            drop(p);
            self.paged.0.lock().remove(&ino.0);
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.attr_requests.fetch_add(1, Ordering::Relaxed);
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.lookup(tx, self.obj(parent), name) {
            Ok(a) => {
                let fa = self.entry_attr(tx, &a);
                self.gate.reply(tx, fa.ino.0, ticket, |ttl| reply.entry(ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr_requests.fetch_add(1, Ordering::Relaxed);
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = match fh {
            Some(fh) => self.tx_fh(req, fh),
            None => self.tx_at(req, ino),
        };
        // NB: the client libraries open the mount root to send ABORT, and the
        // kernel asks for its attributes first: a doomed transaction must get
        // that far, so the root's attributes come from the committed state.
        let tx = match tx {
            Some(t) if ino.0 == 1 && self.engine.is_doomed(t) => None,
            tx => tx,
        };
        match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) => self.gate.reply(tx, ino.0, ticket, |ttl| reply.attr(ttl, &FileAttr { ino, ..fattr(&a) })),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Sent by access(2) and chdir(2) only on a mount without
    /// `default_permissions` (root's own mount, see `txfs mount --help`),
    /// whose callers are all root: root may do anything but execute
    /// something other than a directory that has no execute bit.
    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let tx = self.tx_at(req, ino).filter(|t| !(ino.0 == 1 && self.engine.is_doomed(*t)));
        match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) if mask.contains(fuser::AccessFlags::X_OK) && a.kind != FileKind::Dir && a.mode & 0o111 == 0 => {
                reply.error(Errno::EACCES)
            }
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Before changing: the new attributes may be cached only if the gate
        // stayed open (in a view: always; git's utime of every object it
        // finds again is otherwise followed by a GETATTR).
        let ticket = self.gate.ticket();
        let tx = match fh {
            Some(fh) => self.tx_fh(req, fh),
            None => self.tx_at(req, ino),
        };
        let set = SetAttr { mode, uid, gid, size, atime: atime.map(stamp), mtime: mtime.map(stamp) };
        match self.engine.setattr(tx, self.obj(ino), &set) {
            Ok(a) => {
                self.view_saw(tx, Some(self.obj(ino)));
                let inval = if size.is_some() { self.committed_now(tx, self.obj(ino)) } else { Vec::new() };
                let gate = self.gate.clone();
                self.after(inval, move || {
                    gate.reply(tx, ino.0, ticket, |ttl| reply.attr(ttl, &FileAttr { ino, ..fattr(&a) }))
                })
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.engine.readlink(self.tx_at(req, ino), self.obj(ino)) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Devices, fifos and sockets are not supported (README).
            return reply.error(Errno::EPERM);
        }
        let tx = self.tx(req);
        match self.engine.create(tx, self.obj(parent), name, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => {
                let fa = self.entry_attr(tx, &a);
                self.view_saw(tx, None);
                self.gate.reply(tx, fa.ino.0, ticket, |ttl| reply.entry(ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.mkdir(tx, self.obj(parent), name, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => {
                let fa = self.entry_attr(tx, &a);
                self.view_saw(tx, None);
                self.gate.reply(tx, fa.ino.0, ticket, |ttl| reply.entry(ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let tx = self.tx(req);
        match self.engine.unlink(tx, self.obj(parent), name) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let tx = self.tx(req);
        match self.engine.rmdir(tx, self.obj(parent), name) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.symlink(tx, self.obj(parent), link_name, target.as_os_str(), req.uid(), req.gid()) {
            Ok(a) => {
                let fa = self.entry_attr(tx, &a);
                self.view_saw(tx, None);
                self.gate.reply(tx, fa.ino.0, ticket, |ttl| reply.entry(ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(fuser::RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let f = txfs_engine::RenameFlags {
            noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        let tx = self.tx(req);
        match self.engine.rename(tx, self.obj(parent), name, self.obj(newparent), newname, f) {
            Ok(()) => {
                self.view_saw(tx, None);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        match self.engine.link(tx, self.obj(ino), self.obj(newparent), newname) {
            Ok(a) => {
                let fa = self.entry_attr(tx, &a);
                self.view_saw(tx, None);
                self.gate.reply(tx, fa.ino.0, ticket, |ttl| reply.entry(ttl, &fa, Generation(0)))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // A view's kernel opens files itself after this (no OPEN, RELEASE
        // or handle: file handle 0, pages kept): two round trips less per
        // open(2). What a handle did for it, `handle_of` does.
        if self.view.is_some() {
            return reply.error(Errno::ENOSYS);
        }
        let tx = self.tx_at(req, ino);
        if flags.0 & libc::O_TRUNC != 0 {
            if let Err(e) = self.engine.truncate(tx, self.obj(ino), 0) {
                return reply.error(errno(&e));
            }
        }
        let inval = if flags.0 & libc::O_TRUNC != 0 {
            self.view_saw(tx, Some(self.obj(ino)));
            self.committed_now(tx, self.obj(ino))
        } else {
            Vec::new()
        };
        match self.open_handle(self.obj(ino), tx, flags.0) {
            Ok((fh, fopen)) => self.after(inval, move || reply.opened(FileHandle(fh), fopen)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some((o, _, _)) = self.handle_of(ino, fh, 0) else {
            return reply.error(Errno::EBADF);
        };
        // The kernel names a lock owner on direct reads only; a read without
        // one fills the page cache of this node for a mapping. A private
        // node's pages are its transaction's; a shared node's pages are
        // everyone's, so they hold committed data — except for an object
        // the caller's transaction created, which nobody else can reach.
        let tx = if lock_owner.is_some() || self.view.is_some() {
            self.tx_fh(req, fh)
        } else {
            self.paged.add(ino.0);
            match self.private_owner(ino) {
                Some(owner) => owner,
                None => self.tx_fh(req, fh).filter(|t| self.engine.created_by(*t, o)),
            }
        };
        match self.engine.read(tx, o, offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Write-back of a shared writable mapping: applied as a plain write
        // (module docs), never into whichever transaction happens to be near.
        // In a transaction view even a write-back is the transaction's.
        let tx = if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) && self.view.is_none() {
            self.paged.add(ino.0);
            None
        } else {
            self.tx_fh(req, fh)
        };
        let Some((o, append, batch)) = self.handle_of(ino, fh, _flags.0) else {
            return reply.error(Errno::EBADF);
        };
        let batch = batch && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // O_APPEND appends at the end of the file as this transaction sees it.
        // A write-back carries its offset (the kernel picks any writable
        // handle for it, maybe an O_APPEND one).
        let r = if batch {
            // Checked whole before anything is applied; then in order.
            // Only inside a transaction: outside one each record would be a
            // transaction of its own, and a batch could land half.
            if tx.is_none() {
                return reply.error(Errno::EINVAL);
            }
            match parse_batch(data) {
                Ok(writes) => writes
                    .into_iter()
                    .try_for_each(|(off, d)| self.engine.write(tx, o, off, d).map(|_| ()))
                    .map(|()| data.len()),
                Err(e) => return reply.error(e),
            }
        } else if append && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            self.engine.append(tx, o, data).map(|_| data.len())
        } else {
            self.engine.write(tx, o, offset, data)
        };
        // A write-back's data comes from the page cache: nothing to drop (and
        // dropping would wait for this very write-back).
        let inval =
            if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) { Vec::new() } else { self.committed_now(tx, o) };
        match r {
            Ok(n) => {
                self.view_saw(tx, Some(o));
                self.after(inval, move || reply.written(n as u32))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing to do here (the kernel writes dirty pages back before it
        // asks); a view's kernel stops asking.
        if self.view.is_some() {
            return reply.error(Errno::ENOSYS);
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(h) = self.handles.lock().remove(&fh.0) {
            self.engine.release(h.obj);
        }
        reply.ok();
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.engine.fsync(self.tx_fh(req, fh)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let tx = self.tx(req);
        let fh = self.new_fh();
        self.dirs.lock().insert(fh, (tx, None));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let (tx, list) = match self.dir_listing(ino, fh, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut i = offset as usize;
        loop {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(ino, 2, FileType::Directory, ".."),
                _ => match list.get(i - 2) {
                    Some(e) => reply.add(INodeNo(self.node_id(tx, e.obj, e.kind)), i as u64 + 1, kind(e.kind), &e.name),
                    None => break,
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    /// Asked for only by a transaction view's kernel (`init`): the listing
    /// with each entry's attributes, which the view may cache — so a program
    /// that lists a directory and then stats or opens every name in it (git
    /// add, find, rsync) costs no LOOKUP per name. Each entry the kernel
    /// links counts as a lookup of its node, like a LOOKUP reply.
    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (tx, list) = match self.dir_listing(ino, fh, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let ticket = self.gate.ticket();
        let here = match self.engine.getattr(tx, self.obj(ino)) {
            Ok(a) => FileAttr { ino, ..fattr(&a) },
            Err(e) => return reply.error(errno(&e)),
        };
        let mut i = offset as usize;
        loop {
            // The kernel links no entry for "." and "..": their attributes
            // are only filler.
            let full = match i {
                0 => reply.add(ino, 1, ".", &TTL, &here, Generation(0)),
                1 => reply.add(ino, 2, "..", &TTL, &here, Generation(0)),
                _ => match list.get(i - 2) {
                    Some(e) => match self.engine.getattr(tx, e.obj) {
                        Ok(a) => {
                            let fa = self.entry_attr(tx, &a);
                            self.gate.reply(tx, fa.ino.0, ticket, |ttl| {
                                reply.add(fa.ino, i as u64 + 1, &e.name, ttl, &fa, Generation(0))
                            })
                        }
                        // Gone since the listing was taken: left out (fuser
                        // takes the entry's node id and type from the
                        // attributes, so there is no "plain" entry to send).
                        Err(err) if matches!(err.errno(), libc::ENOENT | libc::ESTALE) => false,
                        Err(err) => return reply.error(errno(&err)),
                    },
                    None => break,
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.engine.fsync(self.tx(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = match std::ffi::CString::new(self.backing.as_os_str().as_bytes()) {
            Ok(c) => c,
            Err(_) => return reply.error(Errno::EIO),
        };
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `s` a valid out-pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(Errno::from(std::io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            txfs_engine::NAME_MAX as u32,
            s.f_frsize as u32,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let create = flags & libc::XATTR_CREATE != 0;
        let replace = flags & libc::XATTR_REPLACE != 0;
        match self.engine.setxattr(self.tx_at(req, ino), self.obj(ino), name, Some(value), create, replace) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.engine.getxattr(self.tx_at(req, ino), self.obj(ino), name) {
            Ok(Some(v)) => {
                if size == 0 {
                    reply.size(v.len() as u32)
                } else if v.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&v)
                }
            }
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.engine.listxattr(self.tx_at(req, ino), self.obj(ino)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.engine.setxattr(self.tx_at(req, ino), self.obj(ino), name, None, false, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // Before reading: a reply may be cached only if the gate stayed open.
        let ticket = self.gate.ticket();
        let tx = self.tx(req);
        let attr = match self.engine.create(tx, self.obj(parent), name, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        match self.open_handle(attr.obj, tx, flags) {
            Ok((fh, fopen)) => {
                self.view_saw(tx, None);
                let fa = fattr(&attr);
                self.gate
                    .reply(tx, fa.ino.0, ticket, |ttl| reply.created(ttl, &fa, Generation(0), FileHandle(fh), fopen))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd == ioctl::BATCH {
            // Makes the handle it is issued on a batch handle. Not in a view:
            // its handles are not direct I/O, so the kernel would keep the
            // batch's raw bytes as the file's pages.
            if self.view.is_some() {
                return reply.error(Errno::EINVAL);
            }
            return match self.handles.lock().get_mut(&_fh.0) {
                Some(h) if h.writable => {
                    h.batch = true;
                    reply.ioctl(0, &[])
                }
                Some(_) => reply.error(Errno::EBADF),
                None => reply.error(Errno::EINVAL),
            };
        }
        match self.ioctl_cmd(req, _ino, cmd, in_data) {
            Ok((out, inval)) => self.after(inval, move || reply.ioctl(0, &out)),
            Err(e) => reply.error(e),
        }
    }
}

/// A count from the environment (`TXFS_THREADS`, `TXFS_URING_THREADS`), or
/// `default` when unset or not a number.
pub(crate) fn env_count(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
