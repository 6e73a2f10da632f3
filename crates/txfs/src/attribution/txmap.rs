//! Which transaction a FUSE request belongs to.
//!
//! The request header's `pid` is the calling *thread's* id (0 for some
//! requests, such as RELEASE; handles remember their transaction for
//! those). Two ways to be in a transaction:
//!
//! * **Thread transactions** (`fs_tx_begin`): the thread that issued
//!   TXFS_IOC_BEGIN. Nested begins count depth; the outermost commit
//!   commits.
//! * **Tree transactions** (`txfs run`): a process and all its descendants.
//!   A thread belongs to a tree if its process, or an ancestor of it, is the
//!   tree's root. Membership is found by walking `PPid` in /proc and cached
//!   per thread (the cache is dropped whenever a tree begins or ends).
//!
//! ## Whose transaction: proven on every request
//!
//! A thread id names a thread only while it lives: once it exits, the
//! kernel may hand the id to a thread of any process, of any user. So a
//! transaction belongs to one live thread (or one process tree) *and* to
//! the credentials it was begun with, and both are checked on every
//! request that would act in it ([`TxMap::of`], [`TxMap::claim`]):
//!
//! * **Identity.** A begin takes a pidfd of the calling thread
//!   (`pidfd_open(tid, PIDFD_THREAD)`, Linux 6.9+); each request polls it
//!   without blocking (about a microsecond). While it polls as running, the
//!   thread id is still that thread — a reused id is another thread, which
//!   this pidfd never names. Once it polls as exited, the entry is dropped
//!   on the spot (the newcomer's request is served as if no transaction
//!   existed: plain) and the dead thread's transaction handed to the reaper,
//!   which is woken to abort it at once. Without thread pidfds (older
//!   kernels, or out of descriptors) each request reads the thread's start
//!   time from /proc instead (~10 µs) and compares it with the begin's
//!   clock tick (a thread that started after the begin is another thread).
//!   Tree members are identified the same way (their cached membership is
//!   trusted only while their pidfd runs); a tree's `txfs run` owner by
//!   (pid, start time), compared at `RUN_COMMIT` and `RUN_ABORT`.
//! * **Credentials.** The request header's uid and gid (the caller's
//!   fsuid/fsgid) are recorded at the begin. A request from the same thread
//!   or tree with other credentials — a setuid or setgid program the owner
//!   executed — is *not* the transaction's: it is served outside any
//!   transaction, exactly as on a file system without transactions (its
//!   writes are plain and durable, the owner can neither see them as its own
//!   nor roll them back, and it does not see the owner's uncommitted
//!   files, not even through a descriptor the owner opened in the
//!   transaction: [`TxMap::admits`]). Its `BEGIN`, `COMMIT` and `ABORT` fail with EPERM while the
//!   owner's transaction lives (the thread id keys one entry). A
//!   transaction begun by root (uid 0) admits every credential: root could
//!   undo what a program that dropped privileges does anyway (and a
//!   transaction view, which only root gets, serves every request as its
//!   transaction's). `RUN_BEGIN` by a non-root caller refuses (EPERM) a
//!   child whose uids or gids are not all the caller's.
//!
//! A reaper also aborts, every 250 ms, transactions whose thread or whose
//! owning `txfs run` process has exited without sending another request.

use super::procfs::{certainly_gone, probe, start_time, tgid_ppid, Probe};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use txfs_engine::TxId;

#[derive(Debug)]
pub struct ThreadTx {
    pub tx: TxId,
    pub depth: u32,
    /// False if this begin only nested inside a tree transaction.
    pub owned: bool,
    pub start: Start,
    /// A pidfd of the thread that began (`PIDFD_THREAD`), when the kernel
    /// gives one: it polls readable once that thread exited.
    pub pidfd: Option<Arc<OwnedFd>>,
    /// The begin's credentials (request header uid, gid).
    pub creds: Creds,
}

/// A request header's credentials: (uid, gid), the caller's fsuid/fsgid.
pub type Creds = (u32, u32);

/// Who sent a request: the header's thread id and credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Caller {
    pub fn creds(&self) -> Creds {
        (self.uid, self.gid)
    }
}

/// Whether a request with credentials `c` may act in a transaction begun
/// with `owner`'s: the same ones, or any if root began it.
fn admits(owner: Creds, c: Creds) -> bool {
    owner.0 == 0 || owner == c
}

/// What [`TxMap::claim`] found for a caller's thread id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No transaction of this thread (a dead thread's was dropped).
    None,
    /// The caller's own transaction (thread entry, maybe nested in a tree).
    Own(TxId),
    /// The thread's transaction, but begun with other credentials: not the
    /// caller's to act in (see the module docs).
    Foreign,
}

/// Which thread a [`ThreadTx`] belongs to, for the reaper (thread ids are
/// reused): its start time, clock ticks since boot (/proc/TID/stat).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Read from /proc by the reaper.
    Known(u64),
    /// Not read yet; the boot-time tick of the begin. A begin does not read
    /// /proc on its reply path: the ~8 µs it took was long enough for the
    /// scheduler to move the waiting client to the other CPU, whose wake-up
    /// its next request then paid. The reaper reads it, and a thread that started after the begin's
    /// tick is not the thread that began.
    Pending(u64),
}

/// CLOCK_BOOTTIME in clock ticks (the unit of /proc/PID/stat's start time).
fn boot_tick() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec; sysconf has no preconditions.
    let (ok, hz) =
        unsafe { (libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) == 0, libc::sysconf(libc::_SC_CLK_TCK)) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    if !ok {
        return u64::MAX; // never "started after the begin": only a dead thread is reaped
    }
    ts.tv_sec as u64 * hz + ts.tv_nsec as u64 * hz / 1_000_000_000
}

#[derive(Clone, Debug)]
pub struct TreeTx {
    pub tx: TxId,
    pub root_start: u64,
    /// The `txfs run` process that registered the tree and ends it.
    pub owner: u32,
    pub owner_start: u64,
    /// pidfds of the root and the owner, taken when the tree was added (both
    /// were alive: the owner was asking, the root its child). Start times
    /// count clock ticks, and a pid steered into reuse within the same tick
    /// has the dead one's; a pidfd never names the newcomer.
    pub root_pidfd: Option<Arc<OwnedFd>>,
    pub owner_pidfd: Option<Arc<OwnedFd>>,
}

impl TreeTx {
    /// The owner that registered the tree has not exited.
    pub fn owner_alive(&self) -> bool {
        self.owner_pidfd.as_ref().is_none_or(|fd| still_running(fd))
    }

    fn root_alive(&self) -> bool {
        self.root_pidfd.as_ref().is_none_or(|fd| still_running(fd))
    }
}

/// A pidfd of process `pid` (Linux 5.3+).
fn process_pidfd(pid: u32) -> Option<Arc<OwnedFd>> {
    // SAFETY: a plain syscall on integers.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a descriptor the kernel just gave us.
    (r >= 0).then(|| Arc::new(unsafe { OwnedFd::from_raw_fd(r as i32) }))
}

/// A thread's cached tree membership: its start time, the tree's
/// transaction, and a pidfd of the thread itself (`PIDFD_THREAD`, 6.9+):
/// while that thread lives the tid is still it, which a `poll` tells
/// without reading /proc (an exited thread's pidfd polls readable; a reused
/// tid is another thread, which this pidfd never names).
type Member = (Option<u64>, Option<TxId>, Option<Arc<OwnedFd>>);

/// `PIDFD_THREAD` (include/uapi/linux/pidfd.h: `O_EXCL`).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// The kernel refused thread pidfds once (before 6.9: EINVAL): stop asking.
static NO_THREAD_PIDFDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A pidfd of thread `tid`, if the kernel has thread pidfds.
fn thread_pidfd(tid: u32) -> Option<Arc<OwnedFd>> {
    use std::sync::atomic::Ordering::Relaxed;
    if NO_THREAD_PIDFDS.load(Relaxed) {
        return None;
    }
    // SAFETY: a plain syscall on integers.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, PIDFD_THREAD) };
    if r < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        if matches!(e, Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            NO_THREAD_PIDFDS.store(true, Relaxed);
        }
        return None;
    }
    // SAFETY: a descriptor the kernel just gave us.
    Some(Arc::new(unsafe { OwnedFd::from_raw_fd(r as i32) }))
}

/// How many threads' memberships (and pidfds) are cached at most: 4 096,
/// or an eighth of the descriptor limit if that is less.
fn cache_max() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a live struct.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 { r.rlim_cur } else { 1024 };
    CACHE_MAX.min((cur / 8) as usize).max(16)
}

/// True while the thread of `pidfd` has not exited.
fn still_running(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) == 0 }
}

/// Past this many threads cached (see [`cache_max`]), the membership cache
/// starts over.
const CACHE_MAX: usize = 4096;

#[derive(Default)]
pub struct TxMap {
    inner: Mutex<Inner>,
    /// Wakes the reaper when a request found a dead owner's transaction.
    wake: parking_lot::Condvar,
}

#[derive(Default)]
struct Inner {
    threads: HashMap<u32, ThreadTx>,
    trees: HashMap<u32, TreeTx>,
    /// Tree membership by thread: (its start time, the tree's transaction,
    /// a pidfd of that thread when the kernel gives one).
    cache: HashMap<u32, Member>,
    /// Bumped whenever `cache` is cleared (a tree began or ended): an answer
    /// worked out from the trees before that is not cached.
    trees_gen: u64,
    /// How each thread's last transactions of its own ended (oldest first):
    /// (it, committed).
    last: HashMap<u32, std::collections::VecDeque<(TxId, bool)>>,
    /// Transactions of threads found dead by a request: the reaper aborts them.
    orphans: Vec<TxId>,
    /// The credentials each live transaction was begun with (thread or tree).
    owners: HashMap<TxId, Creds>,
    /// Who began each live transaction and when (`txfs status`).
    origins: HashMap<TxId, Origin>,
}

/// Who began a live transaction, and when: for `txfs status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The thread that began it, or the `txfs run` that registered the tree.
    pub pid: u32,
    /// True for a `txfs run` tree.
    pub run: bool,
    pub uid: u32,
    pub since: std::time::Instant,
}

/// Past this many threads remembered in `last`, it starts over (a thread
/// that finds nothing there is told "unknown", which is always safe).
const LAST_MAX: usize = 1 << 16;
/// Outcomes remembered per thread.
const LAST_PER_THREAD: usize = 64;

impl TxMap {
    /// The transaction of the caller, if any: its thread's own (only while
    /// that thread is the one that began, with the begin's credentials), or
    /// its process tree's (with the tree's credentials).
    ///
    /// No /proc read happens under the lock: while a tree is live, every
    /// request of a thread outside a thread transaction checks its tree
    /// membership here (~10 µs per /proc file; a thread seen before costs a
    /// `poll` of its pidfd instead), and holding the lock for that would
    /// serialize all requests of the mount.
    pub fn of(&self, c: Caller) -> Option<TxId> {
        let tid = c.tid;
        if tid == 0 {
            return None;
        }
        let (cached, gen) = {
            let g = self.inner.lock();
            if let Some(t) = g.threads.get(&tid) {
                let t = (t.tx, t.start, t.pidfd.clone(), t.creds, t.owned);
                drop(g);
                return match self.judge(c, t) {
                    Claim::Own(tx) => Some(tx),
                    Claim::Foreign => None,
                    // Dropped: whatever else the caller is (a tree member).
                    Claim::None => self.of(c),
                };
            }
            if g.trees.is_empty() {
                return None;
            }
            (g.cache.get(&tid).cloned(), g.trees_gen)
        };
        let found = self.member(tid, cached, gen)?;
        self.admits(found, c).then_some(found)
    }

    /// Whether transaction `tx` admits the caller's credentials (an ended
    /// one's: yes, the engine refuses it anyway). Also for requests on a
    /// transaction's private node ids (`TxFs::tx_at`): a setuid program
    /// acting through a descriptor its caller opened in the transaction.
    pub fn admits(&self, tx: TxId, c: Caller) -> bool {
        self.inner.lock().owners.get(&tx).is_none_or(|o| admits(*o, c.creds()))
    }

    /// Forgets ended transaction `tx`'s credentials.
    pub fn forget(&self, tx: TxId) {
        let mut g = self.inner.lock();
        g.owners.remove(&tx);
        g.origins.remove(&tx);
    }

    /// Who began `tx` and when, if it was begun through this map.
    pub fn origin(&self, tx: TxId) -> Option<Origin> {
        self.inner.lock().origins.get(&tx).copied()
    }

    /// Tree membership of `tid` (cached, or worked out from /proc).
    fn member(&self, tid: u32, cached: Option<Member>, gen: u64) -> Option<TxId> {
        // A thread id can be reused by an unrelated process: the cached
        // answer holds only for the same thread — its pidfd still running,
        // or (without one) the same start time.
        if let Some((_, c, Some(fd))) = &cached {
            if still_running(fd) {
                return *c;
            }
        }
        // Taken before /proc is read: if the thread exits and its tid is
        // reused meanwhile, this pidfd names the one that exited.
        let pidfd = thread_pidfd(tid);
        let start = start_time(tid);
        if let Some((s, c, _)) = cached {
            if s == start && pidfd.is_none() {
                return c;
            }
        }
        let known = self.tree_known(tid);
        let found = known.flatten();
        // Only what /proc told: an answer worked out from an unreadable
        // /proc (out of descriptors, say) is not kept for the next request.
        if known.is_none() || start.is_none() {
            return found;
        }
        let mut g = self.inner.lock();
        let mut old = HashMap::new();
        if g.trees_gen == gen {
            if g.cache.len() >= cache_max() {
                // Closed after the lock is released.
                old = std::mem::take(&mut g.cache);
            }
            g.cache.insert(tid, (start, found, pidfd));
        }
        drop(g);
        drop(old);
        found
    }

    /// What the caller's thread id has: its own live transaction, one begun
    /// with other credentials, or nothing. A transaction whose thread exited
    /// (the caller is a newcomer with its id) is dropped here and handed to
    /// the reaper to abort.
    pub fn claim(&self, c: Caller) -> Claim {
        let t = {
            let g = self.inner.lock();
            match g.threads.get(&c.tid) {
                Some(t) => (t.tx, t.start, t.pidfd.clone(), t.creds, t.owned),
                None => return Claim::None,
            }
        };
        self.judge(c, t)
    }

    /// [`TxMap::claim`] on a thread entry read under the lock; checked
    /// outside it (a /proc read without a pidfd).
    fn judge(
        &self,
        c: Caller,
        (tx, start, pidfd, creds, owned): (TxId, Start, Option<Arc<OwnedFd>>, Creds, bool),
    ) -> Claim {
        let alive = match &pidfd {
            Some(fd) => still_running(fd),
            None => match probe(c.tid) {
                Probe::Alive(s) => match start {
                    Start::Known(k) => s == k,
                    Start::Pending(begun) => s <= begun,
                },
                Probe::Gone => false,
                // Nothing may be concluded: the reaper asks again.
                Probe::Unknown => true,
            },
        };
        if alive {
            return if admits(creds, c.creds()) { Claim::Own(tx) } else { Claim::Foreign };
        }
        let mut g = self.inner.lock();
        if g.threads.get(&c.tid).is_some_and(|t| t.tx == tx && t.start == start) {
            g.threads.remove(&c.tid);
            // Its outcomes are not the newcomer's either.
            g.last.remove(&c.tid);
            if owned {
                g.orphans.push(tx);
                self.wake.notify_one();
            }
        }
        Claim::None
    }

    /// Waits up to `d` for the reaper's next round (woken early when a
    /// request found a dead thread's transaction).
    pub fn nap(&self, d: std::time::Duration) {
        let mut g = self.inner.lock();
        if g.orphans.is_empty() {
            self.wake.wait_for(&mut g, d);
        }
    }

    /// The tree `tid` belongs to, walking /proc outside the lock.
    fn tree_of(&self, tid: u32) -> Option<TxId> {
        self.tree_known(tid).flatten()
    }

    /// As [`TxMap::tree_of`], `None` when /proc could not tell.
    fn tree_known(&self, tid: u32) -> Option<Option<TxId>> {
        let trees = {
            let g = self.inner.lock();
            if g.trees.is_empty() {
                return Some(None);
            }
            g.trees.clone()
        };
        tree_of(&trees, tid)
    }

    /// Records how `tid`'s own (outermost) transaction `tx` ended.
    pub fn ended(&self, tid: u32, tx: TxId, committed: bool) {
        let mut g = self.inner.lock();
        if g.last.len() >= LAST_MAX && !g.last.contains_key(&tid) {
            g.last.clear();
        }
        let q = g.last.entry(tid).or_default();
        if q.len() == LAST_PER_THREAD {
            q.pop_front();
        }
        q.push_back((tx, committed));
    }

    /// How `tid`'s transaction `tx` of its own ended (`None`: its last one),
    /// if known.
    pub fn outcome(&self, tid: u32, tx: Option<TxId>) -> Option<(TxId, bool)> {
        let g = self.inner.lock();
        let q = g.last.get(&tid)?;
        match tx {
            None => q.back().copied(),
            Some(t) => q.iter().rev().find(|(x, _)| *x == t).copied(),
        }
    }

    /// The thread transactions (owned, not joined to a tree) of the
    /// threads of process `pid`, with their begins' credentials. /proc is
    /// read outside the lock.
    pub fn threads_of(&self, pid: u32) -> Vec<(TxId, Creds)> {
        let all: Vec<(u32, TxId, Creds)> = {
            let g = self.inner.lock();
            g.threads.iter().filter(|(_, t)| t.owned).map(|(tid, t)| (*tid, t.tx, t.creds)).collect()
        };
        all.into_iter()
            .filter(|(tid, _, _)| super::procfs::process_of(*tid) == Some(pid))
            .map(|(_, tx, c)| (tx, c))
            .collect()
    }

    pub fn thread(&self, tid: u32) -> Option<(TxId, u32, bool)> {
        self.inner.lock().threads.get(&tid).map(|t| (t.tx, t.depth, t.owned))
    }

    /// Records a begin by the caller. `make` creates a transaction when the
    /// thread is not in one yet. Returns the transaction, or EPERM if the
    /// thread is in one begun with other credentials. Only `tid` itself
    /// begins for `tid` (the ioctl comes from that thread), so nothing else
    /// adds it between the two locked sections; /proc is read between them.
    /// If a tree began or ended meanwhile (`trees_gen`), membership is
    /// worked out again: a thread must never join a tree that has ended.
    /// A tree whose credentials are not the caller's is not joined: the
    /// begin makes a transaction of the caller's own.
    pub fn begin(&self, c: Caller, make: impl FnOnce() -> TxId) -> Result<TxId, i32> {
        let tid = c.tid;
        if self.claim(c) == Claim::Foreign {
            return Err(libc::EPERM);
        }
        let mut make = Some(make);
        loop {
            let gen = {
                let mut g = self.inner.lock();
                if let Some(t) = g.threads.get_mut(&tid) {
                    if !admits(t.creds, c.creds()) {
                        return Err(libc::EPERM);
                    }
                    t.depth += 1;
                    return Ok(t.tx);
                }
                g.trees_gen
            };
            let start = Start::Pending(boot_tick());
            let in_tree = self.tree_of(tid).filter(|t| self.admits(*t, c));
            let pidfd = thread_pidfd(tid);
            let mut g = self.inner.lock();
            if g.trees_gen != gen {
                continue;
            }
            let (tx, owned) = match in_tree {
                Some(tx) => (tx, false),
                None => ((make.take().expect("made once: the loop ends here"))(), true),
            };
            if owned {
                g.owners.insert(tx, c.creds());
                let origin = Origin { pid: tid, run: false, uid: c.uid, since: std::time::Instant::now() };
                g.origins.insert(tx, origin);
            }
            g.threads.insert(tid, ThreadTx { tx, depth: 1, owned, start, pidfd, creds: c.creds() });
            return Ok(tx);
        }
    }

    /// Records a begin by the caller that nests into `tx`, which it does
    /// not own (a thread in a transaction view: everything there is the
    /// view's).
    pub fn join(&self, c: Caller, tx: TxId) {
        if self.claim(c) != Claim::None {
            if let Some(t) = self.inner.lock().threads.get_mut(&c.tid) {
                t.depth += 1;
                return;
            }
        }
        let (start, pidfd) = (Start::Pending(boot_tick()), thread_pidfd(c.tid));
        let t = ThreadTx { tx, depth: 1, owned: false, start, pidfd, creds: c.creds() };
        self.inner.lock().threads.insert(c.tid, t);
    }

    /// Ends one level of `tid`'s transaction. Returns `Some((tx, owned))`
    /// when the outermost level ended.
    pub fn end(&self, tid: u32) -> Option<(TxId, bool)> {
        let mut g = self.inner.lock();
        let t = g.threads.get_mut(&tid)?;
        if t.depth > 1 {
            t.depth -= 1;
            return None;
        }
        let t = g.threads.remove(&tid)?;
        drop(g); // its pidfd is closed outside the lock
        Some((t.tx, t.owned))
    }

    /// Drops `tid`'s transaction whatever its depth (abort).
    pub fn drop_thread(&self, tid: u32) -> Option<(TxId, bool)> {
        let t = self.inner.lock().threads.remove(&tid); // its pidfd closed outside the lock
        t.map(|t| (t.tx, t.owned))
    }

    /// Registers `root`'s process tree as transaction `tx`, ended by
    /// `owner`; `starts` from [`super::procfs::tree_starts`], read before (not under the lock).
    /// `creds`: the caller's (its child has the same); a request with
    /// others is not the tree's.
    pub fn add_tree(&self, root: u32, owner: u32, tx: TxId, starts: (u64, u64), creds: Creds) {
        let (root_pidfd, owner_pidfd) = (process_pidfd(root), process_pidfd(owner));
        let mut g = self.inner.lock();
        let t = TreeTx { tx, root_start: starts.0, owner, owner_start: starts.1, root_pidfd, owner_pidfd };
        g.trees.insert(root, t);
        g.owners.insert(tx, creds);
        g.origins.insert(tx, Origin { pid: owner, run: true, uid: creds.0, since: std::time::Instant::now() });
        let old = std::mem::take(&mut g.cache);
        g.trees_gen += 1;
        drop(g);
        drop(old); // its pidfds closed outside the lock
    }

    /// The tree of `root`: its transaction, owner and owner's start time,
    /// and whether that owner is still alive (a caller with its pid and
    /// start time is a newcomer otherwise).
    pub fn tree(&self, root: u32) -> Option<(TxId, u32, u64, bool)> {
        self.inner.lock().trees.get(&root).map(|t| (t.tx, t.owner, t.owner_start, t.owner_alive()))
    }

    pub fn remove_tree(&self, root: u32) -> Option<TxId> {
        let mut g = self.inner.lock();
        let t = g.trees.remove(&root)?;
        let old = std::mem::take(&mut g.cache);
        g.trees_gen += 1;
        g.threads.retain(|_, th| th.tx != t.tx);
        drop(g);
        drop(old); // its pidfds closed outside the lock
        Some(t.tx)
    }

    /// Transactions whose thread or `txfs run` owner has exited. /proc is
    /// read outside the lock (one file per thread in a transaction); an
    /// entry is dropped only if it is still the one that was checked.
    pub fn reap(&self) -> Vec<TxId> {
        let (threads, owners) = {
            let g = self.inner.lock();
            let threads: Vec<(u32, TxId, Start, Option<Arc<OwnedFd>>)> =
                g.threads.iter().map(|(tid, t)| (*tid, t.tx, t.start, t.pidfd.clone())).collect();
            let owners: Vec<(u32, u32, u64, bool)> =
                g.trees.iter().map(|(r, t)| (*r, t.owner, t.owner_start, t.owner_alive())).collect();
            (threads, owners)
        };
        let mut gone_threads = Vec::new();
        let mut learned = Vec::new();
        for (tid, tx, start, pidfd) in threads {
            if pidfd.is_some_and(|fd| !still_running(&fd)) {
                gone_threads.push((tid, tx, start));
                continue;
            }
            match start {
                Start::Known(s) => {
                    if certainly_gone(tid, s) {
                        gone_threads.push((tid, tx, start));
                    }
                }
                // Unknown: left pending, asked again next round.
                Start::Pending(begun) => match probe(tid) {
                    Probe::Alive(s) if s <= begun => learned.push((tid, tx, start, s)),
                    Probe::Alive(_) | Probe::Gone => gone_threads.push((tid, tx, start)),
                    Probe::Unknown => {}
                },
            }
        }
        let gone_trees: Vec<_> =
            owners.into_iter().filter(|(_, owner, start, alive)| !alive || certainly_gone(*owner, *start)).collect();
        let mut g = self.inner.lock();
        let mut dead = std::mem::take(&mut g.orphans);
        for (tid, tx, start, s) in learned {
            if let Some(t) = g.threads.get_mut(&tid).filter(|t| t.tx == tx && t.start == start) {
                t.start = Start::Known(s);
            }
        }
        for (tid, tx, start) in gone_threads {
            if g.threads.get(&tid).is_some_and(|t| t.tx == tx && t.start == start) {
                if let Some(t) = g.threads.remove(&tid) {
                    if t.owned {
                        dead.push(t.tx);
                    }
                }
            }
        }
        let mut old = HashMap::new();
        for (root, owner, start, _) in gone_trees {
            if g.trees.get(&root).is_some_and(|t| t.owner == owner && t.owner_start == start) {
                if let Some(t) = g.trees.remove(&root) {
                    dead.push(t.tx);
                    old.extend(std::mem::take(&mut g.cache));
                    g.trees_gen += 1;
                }
            }
        }
        drop(g);
        drop(old); // its pidfds closed outside the lock
        dead
    }
}

/// Walks the process ancestry of `tid` looking for a tree root: the tree
/// `tid` belongs to (`Some(None)`: none), or `None` when /proc
/// could not tell (a process on the way gone or unreadable).
fn tree_of(trees: &HashMap<u32, TreeTx>, tid: u32) -> Option<Option<TxId>> {
    let (mut pid, mut ppid) = tgid_ppid(tid)?;
    for _ in 0..256 {
        if let Some(t) = trees.get(&pid) {
            if t.root_alive() && start_time(pid)? == t.root_start {
                return Some(Some(t.tx));
            }
        }
        if ppid <= 1 {
            return Some(None);
        }
        pid = ppid;
        ppid = tgid_ppid(pid)?.1;
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::procfs::tree_starts;

    #[test]
    fn children_belong_to_a_registered_tree() {
        let map = TxMap::default();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id();
        assert_eq!(map.of(c(child.id())), None);
        map.add_tree(me, me, TxId(7), tree_starts(me, me).unwrap(), (0, 0));
        assert_eq!(map.of(c(child.id())), Some(TxId(7)), "a child of the root is in the tree");
        map.remove_tree(me);
        assert_eq!(map.of(c(child.id())), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// While a tree lives, a thread's membership is cached with a pidfd of
    /// the thread: trusted while it runs, never once it exited (its tid may
    /// name another thread by then), and a thread of the tree that exits is
    /// not taken for the process that later gets its id.
    #[test]
    fn cached_membership_is_trusted_only_while_its_thread_runs() {
        let map = TxMap::default();
        let me = std::process::id();
        let mut member = scopeguard(std::process::Command::new("sleep").arg("30").spawn().unwrap());
        map.add_tree(me, me, TxId(9), tree_starts(me, me).unwrap(), (0, 0));
        assert_eq!(map.of(c(member.id())), Some(TxId(9)));
        let cached = map.inner.lock().cache.get(&member.id()).cloned().expect("cached");
        let Some(fd) = cached.2 else {
            eprintln!("skipped: no thread pidfds (PIDFD_THREAD, Linux 6.9+)");
            return;
        };
        assert!(still_running(&fd));
        // A sentinel in the cache: answered from it while the thread runs.
        map.inner.lock().cache.get_mut(&member.id()).unwrap().1 = Some(TxId(99));
        assert_eq!(map.of(c(member.id())), Some(TxId(99)), "answered from the cache");
        member.kill().unwrap();
        member.wait().unwrap();
        assert!(!still_running(&fd), "an exited thread's pidfd must not pass for running");
        // Its id, asked again: worked out anew (gone: no tree), not the
        // sentinel of the thread that exited.
        assert_eq!(map.of(c(member.id())), None);
    }

    /// Kills and reaps the child when dropped.
    fn scopeguard(c: std::process::Child) -> impl std::ops::DerefMut<Target = std::process::Child> {
        struct G(std::process::Child);
        impl std::ops::Deref for G {
            type Target = std::process::Child;
            fn deref(&self) -> &std::process::Child {
                &self.0
            }
        }
        impl std::ops::DerefMut for G {
            fn deref_mut(&mut self) -> &mut std::process::Child {
                &mut self.0
            }
        }
        impl Drop for G {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        G(c)
    }

    /// A thread of a tree begins while the tree ends: it must not be left
    /// in the ended tree's transaction (found in review: 857 of 2000 rounds
    /// were, when membership was worked out outside the lock without a
    /// generation check).
    #[test]
    fn a_begin_racing_the_end_of_its_tree_does_not_join_the_ended_tree() {
        let map = std::sync::Arc::new(TxMap::default());
        let me = std::process::id();
        let mut stale = 0;
        for i in 0..2000u64 {
            map.add_tree(me, me, TxId(i + 1), tree_starts(me, me).unwrap(), (0, 0));
            let b = std::sync::Arc::new(std::sync::Barrier::new(2));
            let (m2, b2) = (map.clone(), b.clone());
            let t = std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u32;
                b2.wait();
                m2.begin(c(tid), || TxId(1_000_000 + i)).unwrap();
                tid
            });
            b.wait();
            std::thread::sleep(std::time::Duration::from_micros(i % 40));
            map.remove_tree(me);
            let tid = t.join().unwrap();
            if let Some((tx, _, owned)) = map.thread(tid) {
                if tx == TxId(i + 1) && !owned {
                    stale += 1;
                }
            }
            map.drop_thread(tid);
        }
        assert_eq!(stale, 0, "threads left in an ended tree's transaction");
    }

    /// A root caller on thread `tid`.
    fn c(tid: u32) -> Caller {
        Caller { tid, uid: 0, gid: 0 }
    }

    fn gettid() -> u32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::syscall(libc::SYS_gettid) as u32 }
    }

    /// A begin leaves the thread's start time to the reaper, which keeps a
    /// live thread's transaction (learning its start), aborts a dead one's,
    /// and treats a thread that started after the begin as another thread
    /// with a reused id.
    #[test]
    fn the_reaper_learns_start_times_and_reaps_dead_or_younger_threads() {
        let map = TxMap::default();
        let me = gettid();
        let tx = map.begin(c(me), || TxId(1)).unwrap();
        assert!(matches!(map.inner.lock().threads[&me].start, Start::Pending(_)), "no /proc read at the begin");
        assert_eq!(map.reap(), Vec::<TxId>::new(), "a live thread is not reaped");
        assert_eq!(map.inner.lock().threads[&me].start, Start::Known(start_time(me).unwrap()));
        assert_eq!(map.reap(), Vec::<TxId>::new());
        assert_eq!(map.thread(me).map(|t| t.0), Some(tx));

        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let m = std::sync::Arc::new(map);
        let m2 = m.clone();
        std::thread::spawn(move || {
            let tid = gettid();
            m2.begin(c(tid), || TxId(2)).unwrap();
            done_tx.send(tid).unwrap();
        })
        .join()
        .unwrap();
        let dead = done_rx.recv().unwrap();
        // join() returns when the thread's exit clears its tid, which is
        // before the kernel releases it: /proc may still show it briefly.
        let mut reaped = m.reap();
        for _ in 0..500 {
            if !reaped.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            reaped = m.reap();
        }
        assert_eq!(reaped, vec![TxId(2)], "a thread that exited in its transaction is reaped");
        assert!(m.thread(dead).is_none());

        // The same id, but a thread that started after the begin: not ours.
        m.inner.lock().threads.get_mut(&me).unwrap().start = Start::Pending(start_time(me).unwrap() - 1);
        assert_eq!(m.reap(), vec![TxId(1)], "a younger thread with the begin's id is another thread");
    }

    /// Every request proves the owner: a thread entry whose thread exited
    /// (its pidfd says so) is dropped at the next request of its id and
    /// handed to the reaper; without a pidfd, a thread that started after
    /// the begin is another one; other credentials are not the owner's
    /// (root's transactions admit any).
    #[test]
    fn a_request_proves_the_owner_thread_and_its_credentials() {
        let map = std::sync::Arc::new(TxMap::default());
        let user = |tid, uid| Caller { tid, uid, gid: uid };
        // A thread begins and exits: its id, asked again, is in nothing.
        let m2 = map.clone();
        let dead = std::thread::spawn(move || {
            let tid = gettid();
            m2.begin(user(tid, 1000), || TxId(3)).unwrap();
            tid
        })
        .join()
        .unwrap();
        if map.inner.lock().threads[&dead].pidfd.is_some() {
            // The pidfd polls readable once the thread exited, a moment
            // after join() returns.
            assert!(wait(|| map.of(user(dead, 1000)).is_none()), "a dead thread's id is in no transaction");
            assert!(map.thread(dead).is_none(), "its entry is dropped by the request");
            assert_eq!(map.reap(), vec![TxId(3)], "and its transaction handed to the reaper");
        }
        // Without a pidfd: a thread that started after the begin's tick.
        let me = gettid();
        map.begin(user(me, 1000), || TxId(4)).unwrap();
        assert_eq!(map.of(user(me, 1000)), Some(TxId(4)));
        assert_eq!(map.claim(user(me, 0)), Claim::Foreign, "root is not a user's transaction's owner");
        assert_eq!(map.of(user(me, 1001)), None, "other credentials are outside");
        assert_eq!(map.begin(user(me, 1001), || TxId(5)), Err(libc::EPERM));
        assert!(map.admits(TxId(4), user(me, 1000)) && !map.admits(TxId(4), user(me, 1001)));
        {
            let mut g = map.inner.lock();
            let t = g.threads.get_mut(&me).unwrap();
            t.pidfd = None;
            t.start = Start::Pending(start_time(me).unwrap() - 1);
        }
        assert_eq!(map.of(user(me, 1000)), None, "a younger thread with the begin's id is another thread");
        assert_eq!(map.reap(), vec![TxId(4)]);
        // Root's transaction admits every credential.
        map.begin(user(me, 0), || TxId(6)).unwrap();
        assert_eq!(map.of(user(me, 1000)), Some(TxId(6)));
        map.forget(TxId(6));
        map.drop_thread(me);
    }

    fn wait(mut f: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !f() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// A thread whose name is not valid UTF-8 (cut inside a character at 15
    /// bytes) is alive: the reaper keeps its transaction (review finding:
    /// an unreadable stat file counted as a dead thread).
    #[test]
    fn a_thread_with_a_non_utf8_name_is_not_reaped() {
        let map = std::sync::Arc::new(TxMap::default());
        let (m2, (ready_tx, ready_rx), (go_tx, go_rx)) =
            (map.clone(), std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let t = std::thread::spawn(move || {
            let name = b"worker-caf\xc3\0";
            // SAFETY: a NUL-terminated name of at most 16 bytes.
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
            let tid = gettid();
            m2.begin(c(tid), || TxId(5)).unwrap();
            ready_tx.send(tid).unwrap();
            go_rx.recv().unwrap();
        });
        let tid = ready_rx.recv().unwrap();
        assert!(std::fs::read(format!("/proc/{tid}/comm")).unwrap().contains(&0xc3));
        assert_eq!(map.reap(), Vec::<TxId>::new(), "alive, if oddly named");
        assert_eq!(map.reap(), Vec::<TxId>::new());
        assert!(map.thread(tid).is_some());
        assert!(matches!(map.inner.lock().threads[&tid].start, Start::Known(_)));
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // The join returns when the thread cleared its id, a moment before
        // the kernel removes /proc/TID: the next rounds find it gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut reaped = map.reap();
        while reaped.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            reaped = map.reap();
        }
        assert_eq!(reaped, vec![TxId(5)]);
    }
}
