//! Transaction views: `txfs run`'s own FUSE connection.
//!
//! As root, `txfs run` mounts a second FUSE connection over the mount
//! point in the command's own mount namespace and hands its `/dev/fuse`
//! descriptor to the daemon (TXFS_IOC_RUN with `RUN_VIEW`). The daemon
//! serves it as a session of its own ([`TxFs::serve_view`]) whose every
//! request is the run's transaction, whoever sends it: nobody else can
//! reach it, so its kernel may cache entries, attributes and pages for as
//! long as the transaction lives. The shared mount keeps a [`ViewLink`] to
//! each view it serves, to drop what the view cached when the transaction
//! changes something through the shared mount, and when it ends.
//!
//! A run whose process tree cannot reach the shared mount but through its
//! view leaves the shared mount's cache gate open ([`TxFs::way_in`]).

use super::cache_gate::CacheGate;
use super::{Role, TxFs};
use crate::attribution::procfs;
use fuser::INodeNo;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use txfs_engine::{ObjId, TxId};

/// What the shared mount keeps of a transaction view it serves: enough to
/// drop what the view's kernel caches.
pub struct ViewLink {
    notifier: fuser::Notifier,
    /// The view's gate: every node id it handed out.
    gate: Arc<CacheGate>,
}

pub(super) type Views = Arc<Mutex<HashMap<TxId, ViewLink>>>;

impl ViewLink {
    /// Something the view's transaction changed through the shared mount
    /// (a descriptor opened before the run): the view must not answer from
    /// what it cached. `o`: drop that file's pages and attributes; always
    /// bump the view's epoch (names may have changed).
    pub(super) fn changed(&self, o: Option<ObjId>) {
        let _ = self.notifier.inc_epoch();
        if let Some(o) = o {
            let _ = self.notifier.inval_inode(INodeNo(o.0), 0, 0);
        }
    }

    /// The transaction ended: whatever still runs in the view must not be
    /// served its cached pages (after an abort: data that never existed).
    /// Requests reaching the daemon then fail.
    pub(super) fn end(self) {
        let _ = std::thread::Builder::new().name("txfs-view-end".into()).spawn(move || {
            let _ = self.notifier.inc_epoch();
            for ino in std::mem::take(&mut *self.gate.cached.lock()) {
                let _ = self.notifier.inval_inode(ino, 0, 0);
            }
        });
    }
}

impl TxFs {
    /// The transaction view of `tx`: the same engine, its own handles and
    /// node ids, no private ids, no invalidation (nothing but the
    /// transaction changes what it shows).
    pub(super) fn new_view(&self, tx: TxId) -> TxFs {
        TxFs {
            engine: self.engine.clone(),
            txs: self.txs.clone(),
            backing: self.backing.clone(),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            gate: Arc::new(CacheGate::for_view()),
            role: Role::View { tx, shared_gate: self.gate.clone() },
            attr_requests: AtomicU64::new(0),
            config: self.config.clone(),
            listings: self.listings.clone(),
        }
    }

    /// Serves the transaction view of `tx` on the `/dev/fuse` descriptor
    /// `devfd` of process `caller` (`txfs run`, whose child mounted it over
    /// the mount point in its own mount namespace before asking).
    pub(super) fn serve_view(&self, caller: u32, devfd: i32, tx: TxId) -> std::io::Result<()> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // Only the shared mount serves views (a run inside a run is refused
        // before this).
        let Some(shared) = self.shared_mount() else { return Err(std::io::Error::from_raw_os_error(libc::EBUSY)) };
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
        // view's round trip is then ~25 µs shorter, which a command making
        // one request per file (`git add -A` of many small files) pays
        // thousands of times. Two ring threads per CPU; `TXFS_URING_THREADS=0` (the
        // shared mount's knob) keeps views on /dev/fuse too. A view never
        // answers late (it has no invalidation thread), so its queues need
        // no pump and no mount point.
        config.uring_threads = Some(self.config.view_uring_threads());
        let view = self.new_view(tx);
        let gate = view.gate.clone();
        let session = fuser::Session::from_fd(super::Fs(Arc::new(view)), dev, fuser::SessionACL::All, config)?;
        let uring = session.io_uring();
        shared.views.lock().insert(tx, ViewLink { notifier: session.notifier(), gate });
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

    /// How process `pid` (a `txfs run` child about to exec, its view
    /// mounted) could reach this mount other than by requests: `None` if it
    /// cannot (see [`procfs::way_into`]), else why it can.
    pub(super) fn way_in(&self, pid: u32) -> Option<String> {
        let Some(s) = self.shared_mount() else { return Some("not the shared mount".into()) };
        let point = &s.point;
        // Read once (the first run), from what the daemon's own mount table
        // says of the mount it named `txfs:BACKING`, whatever is mounted
        // over its mount point since.
        let dev = match s.dev.get() {
            Some(d) => *d,
            None => match procfs::dev_of_source(&format!("txfs:{}", self.backing.display())) {
                Ok(d) => *s.dev.get_or_init(|| d),
                Err(e) => return Some(format!("/proc/self/mountinfo: {e}")),
            },
        };
        procfs::way_into(pid, dev, point)
    }

    /// A change by `tx` through this (shared) mount: if `tx` is a `txfs run`
    /// with a view, the view drops what it cached of it (`o`: that file).
    pub(super) fn view_saw(&self, tx: Option<TxId>, o: Option<ObjId>) {
        if let (Some(t), Some(s)) = (tx, self.shared_mount()) {
            if let Some(v) = s.views.lock().get(&t) {
                v.changed(o);
            }
        }
    }
}
