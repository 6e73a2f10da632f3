//! The cache gate: kernel caching of entries and attributes, allowed only
//! while no transaction is live (DESIGN §9, "The cache gate").
//!
//! The kernel's dentry and attribute caches are shared by every process
//! and a cached answer never reaches the daemon, so while any transaction
//! is live every lookup and attribute is answered uncached (its reads must
//! enter its read set, its view differs from everyone else's). While none
//! is, the committed state is the only view and the mount caches like any
//! FUSE file system. The first begin closes the gate: with the write lock
//! held (no cacheable reply is being sent), it bumps the kernel's entry
//! epoch (`FUSE_NOTIFY_INC_EPOCH`: every cached dentry, and every lookup
//! answered before it, is revalidated) and drops the attributes of every
//! node given a nonzero TTL; only then does the transaction exist. The
//! gate reopens when the last transaction ends.
//!
//! A transaction view (`txfs run`) has a gate of its own that is always
//! open: everything it is told is its transaction's and only it can ask.

use super::nodes::is_private;
use fuser::INodeNo;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use txfs_engine::{Engine, TxId};

/// Entries and attributes while a transaction is live: never cached.
pub(super) const TTL: Duration = Duration::ZERO;
/// Entries and attributes while the cache gate is open (no live transaction).
pub(super) const CACHE_TTL: Duration = Duration::from_secs(1);
/// Entries and attributes of a transaction view: they change only through it.
pub(super) const VIEW_TTL: Duration = Duration::from_secs(3600);

/// Kernel caching of entries and attributes (see the module docs).
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
    pub(super) cached: Mutex<std::collections::HashSet<INodeNo>>,
    /// The session's notifier, set when the kernel accepted
    /// `FUSE_NOTIFY_INC_EPOCH`; without it the gate stays shut.
    epoch: std::sync::OnceLock<fuser::Notifier>,
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

impl CacheGate {
    /// The gate of a transaction view: always open, remembering every node
    /// id it hands out (for [`super::views::ViewLink`]'s end).
    pub(super) fn for_view() -> CacheGate {
        CacheGate { view: true, ..CacheGate::default() }
    }

    /// Probes the session of `notifier` for `FUSE_NOTIFY_INC_EPOCH` (kernel
    /// 6.16+) and opens the gate if the kernel has it.
    pub fn enable(&self, notifier: fuser::Notifier) -> bool {
        if notifier.inc_epoch().is_err() {
            return false;
        }
        let _ = self.epoch.set(notifier);
        self.state.write().0 = true;
        true
    }

    /// The generation to pass to [`CacheGate::reply`]; take it before reading.
    pub(super) fn ticket(&self) -> u64 {
        self.state.read().1
    }

    /// Runs `send(ttl)` with the TTL a reply about node `ino` for `tx` may
    /// carry, holding the gate so that it cannot close in between.
    pub(super) fn reply<R>(&self, tx: Option<TxId>, ino: INodeNo, ticket: u64, send: impl FnOnce(&Duration) -> R) -> R {
        if self.view {
            self.cached.lock().insert(ino);
            return send(&VIEW_TTL);
        }
        let g = self.state.read();
        if g.0 && g.1 == ticket && tx.is_none() && !is_private(ino) {
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
    pub(super) fn close_then<T>(&self, notifier: Option<&fuser::Notifier>, begin: impl FnOnce() -> T) -> T {
        let _closing = self.closing.lock();
        self.close_locked(notifier);
        begin()
    }

    /// Closes the gate if open (the caller holds `closing`).
    pub(super) fn close_locked(&self, notifier: Option<&fuser::Notifier>) {
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
    pub(super) fn begin_free(&self, begin: impl FnOnce() -> TxId) -> TxId {
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
    pub(super) fn pin(&self, tx: TxId, notifier: Option<&fuser::Notifier>) {
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
    pub(super) fn unfree(&self, tx: TxId) {
        let mut f = self.free.lock();
        if f.remove(&tx) {
            self.any_free.store(!f.is_empty(), Ordering::SeqCst);
        }
    }

    /// Open or shut, replies cached and closes so far (`txfs status`).
    pub(super) fn counters(&self) -> [u64; 3] {
        let open = self.state.read().0 && !self.broken.load(Ordering::SeqCst);
        [u64::from(open), self.cached_replies.load(Ordering::Relaxed), self.closes.load(Ordering::Relaxed)]
    }

    /// Drops every entry (the epoch) and attribute the kernel may cache.
    /// Every cacheable reply names its node in `cached`, so when that is
    /// empty nothing was cached since the gate opened (what was, before the
    /// last close, that close's epoch already voids): nothing to drop. A
    /// thread committing one small transaction after another then saves
    /// the epoch write, and the kernel keeps nothing it would re-look up.
    pub(super) fn invalidate(&self, notifier: Option<&fuser::Notifier>) {
        let cached = std::mem::take(&mut *self.cached.lock());
        if cached.is_empty() {
            return;
        }
        self.closes.fetch_add(1, Ordering::Relaxed);
        if let Some(epoch) = self.epoch.get() {
            if let Err(e) = epoch.inc_epoch() {
                tracing::error!("FUSE_NOTIFY_INC_EPOCH failed ({e}): no more kernel caching on this mount");
                self.broken.store(true, Ordering::SeqCst);
            }
        }
        if let Some(n) = notifier {
            for ino in cached {
                // Offset -1: attributes only, no page-cache work. ENOENT:
                // the kernel has forgotten the node.
                let _ = n.inval_inode(ino, -1, 0);
            }
        }
    }

    /// Reopens the gate if every live transaction leaves it open.
    pub(super) fn reopen(&self, engine: &Engine) {
        if self.epoch.get().is_none() || self.broken.load(Ordering::SeqCst) {
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
