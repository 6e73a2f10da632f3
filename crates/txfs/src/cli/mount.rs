//! `txfs mount`: recover BACKING, then serve it at MOUNTPOINT until
//! unmounted (checkpointing on the way out). Without `-f` it starts itself
//! with `-f` in the background and returns once the mount serves.

use super::{init_logs, lock_backing};
use crate::attribution::mountinfo;
use crate::config::Config;
use crate::fuse;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use txfs_engine::storage::RealFs;
use txfs_engine::{Engine, Options};

/// Raises the soft descriptor limit to the hard one. The daemon holds an
/// io_uring and an eventfd per ring thread (8 per CPU for the mount, 2 per
/// CPU for each `txfs run` view), plus the engine's files: with many CPUs
/// and concurrent runs the usual soft limit of 1024 is near.
fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: get/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("raising RLIMIT_NOFILE: {}", std::io::Error::last_os_error());
            }
        }
    }
}

pub fn mount(backing: &Path, point: &Path, foreground: bool, options: &[String]) -> Result<(), String> {
    let backing = backing.canonicalize().map_err(|e| format!("{}: {e}", backing.display()))?;
    let point = mount_point(point)?;
    check_layout(&backing, &point)?;
    // Before the daemon starts: a wrong option is told at once.
    parse_options(&backing, options)?;
    if !foreground {
        return daemonize(&backing, &point, options);
    }
    init_logs();
    raise_nofile();
    // Before any thread starts, so that every thread inherits the mask and
    // only `stop_on_signals` ever sees them.
    let stage = stop_signals::watch(backing.clone(), point.clone());
    let lock = lock_backing(&backing)?;
    let pid_file = PidFile::write(&backing)?;
    let knobs = Arc::new(Config::from_env());
    let storage = RealFs::open(&backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    #[cfg(any(feature = "testing", debug_assertions))]
    let (storage, armed) = crate::failpoint::wrap(Arc::new(storage))?;
    #[cfg(not(any(feature = "testing", debug_assertions)))]
    let storage: Arc<dyn txfs_engine::storage::Storage> = {
        if std::env::var_os("TXFS_FAILPOINT").is_some() {
            return Err("TXFS_FAILPOINT needs a debug build or one with the `testing` feature".into());
        }
        Arc::new(storage)
    };
    let (mut mopts, acl, permissions, engine_opts) = parse_options(&backing, options)?;
    let engine = Arc::new(
        Engine::open(storage, knobs.engine_options(engine_opts)).map_err(|e| format!("{}: {e}", backing.display()))?,
    );
    #[cfg(any(feature = "testing", debug_assertions))]
    if let Some(a) = &armed {
        a.opened();
    }
    let notifier_slot = Arc::new(std::sync::OnceLock::new());
    let txfs = fuse::TxFs::new(engine.clone(), backing.clone(), point.clone(), notifier_slot.clone(), knobs.clone());
    let gate = txfs.gate.clone();
    // The kernel checks permissions (and, to do so, asks for the attributes
    // of every directory on a path whose cached attributes expired: inside
    // a transaction, every one) unless only root can reach the mount: root
    // passes those checks anyway (a root process without CAP_DAC_OVERRIDE is
    // then not held back by file modes: -o default_permissions keeps them).
    // SAFETY: geteuid has no preconditions.
    let root_only = matches!(acl, fuser::SessionACL::Owner) && unsafe { libc::geteuid() } == 0;
    if permissions || !root_only {
        mopts.push(fuser::MountOption::DefaultPermissions);
    }
    let mut config = fuser::Config::default();
    config.mount_options = mopts;
    config.acl = acl;
    // Threads reading /dev/fuse; over io_uring (below) a single one, for FORGETs.
    config.n_threads = Some(knobs.mount_threads());
    // FUSE over io_uring when the kernel offers it (6.14+, the fuse module's
    // enable_uring parameter): threads per CPU, pinned, so a request and its
    // reply do not wake another CPU (on the machines measured, a round trip
    // takes half as long as over /dev/fuse).
    config.uring_threads = Some(knobs.mount_uring_threads());
    // Held while mounting: a stop signal meanwhile waits for the mount.
    let mut stage_now = stage.lock();
    let session = fuser::Session::new(fuse::Fs(Arc::new(txfs)), &point, &config)
        .map_err(|e| format!("mount {}: {e}", point.display()))?;
    *stage_now = stop_signals::Stage::Mounted { engine: engine.clone(), device: stop_signals::device(&session)? };
    drop(stage_now);
    // The kernel's INIT is answered: requests queue until `run` serves them.
    sd_notify("READY=1");
    let _ = notifier_slot.set(session.notifier());
    // Kernel caching while no transaction is live needs FUSE_NOTIFY_INC_EPOCH.
    let caching = gate.enable(session.notifier());
    if caching {
        tracing::info!("kernel caches entries and attributes while no transaction is live");
    } else {
        tracing::warn!("kernel lacks FUSE_NOTIFY_INC_EPOCH (6.16+): entries and attributes are never cached");
    }
    if session.io_uring() {
        tracing::info!("requests arrive over io_uring, one queue per CPU");
    } else if std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "N") {
        tracing::info!(
            "requests arrive on /dev/fuse (FUSE over io_uring is off: /sys/module/fuse/parameters/enable_uring)"
        );
    }
    tracing::info!(backing = %backing.display(), mountpoint = %point.display(), "serving");
    session.run().map_err(|e| format!("FUSE session: {e}"))?;
    tracing::info!("unmounted");
    drop(pid_file);
    drop(lock);
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP end the daemon as they end libfuse's file
/// systems: the mount is detached (`umount2(MNT_DETACH)`, as `txfs umount`
/// and `fusermount3 -u -z` do), the session ends, the daemon checkpoints
/// on its way out (`destroy`) and exits 0. Nothing is left behind that
/// answers "Transport endpoint is not connected".
///
/// NB: no thread of the daemon may make a syscall into its own mount (see
/// `healer` in fuse/mod.rs): detaching walks only to the mount point, and
/// whether the session has ended is read from a duplicate of the
/// connection's `/dev/fuse` descriptor (POLLERR once the kernel ended it).
mod stop_signals {
    use super::mountinfo;
    use parking_lot::Mutex;
    use std::os::fd::{AsFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use txfs_engine::Engine;

    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    /// How long processes still holding the detached mount (a working
    /// directory, an open file) may keep it before the connection is ended
    /// under them, as libfuse's file systems end theirs at once.
    const GRACE: Duration = Duration::from_secs(2);

    pub enum Stage {
        /// Recovering, not mounted yet: a signal ends the process.
        Starting,
        Mounted {
            engine: Arc<Engine>,
            device: Device,
        },
    }

    /// A duplicate of the session's `/dev/fuse` descriptor.
    pub struct Device(OwnedFd);

    pub fn device<T: AsFd>(session: &T) -> Result<Device, String> {
        session.as_fd().try_clone_to_owned().map(Device).map_err(|e| format!("/dev/fuse: {e}"))
    }

    impl Device {
        /// The kernel has ended the connection (unmounted, or aborted).
        fn ended(&self) -> bool {
            use std::os::fd::AsRawFd;
            let mut p = libc::pollfd { fd: self.0.as_raw_fd(), events: 0, revents: 0 };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            n == 1 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
        }

        fn wait_ended(&self, within: Duration) -> bool {
            let t0 = Instant::now();
            while !self.ended() {
                if t0.elapsed() >= within {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        }
    }

    fn name(sig: libc::c_int) -> &'static str {
        match sig {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            _ => "SIGHUP",
        }
    }

    /// Blocks the stop signals in this thread (and so in every thread it
    /// starts afterwards) and starts the thread that waits for them.
    pub fn watch(backing: PathBuf, point: PathBuf) -> Arc<Mutex<Stage>> {
        // SAFETY: a sigset_t we own, filled by sigemptyset/sigaddset.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in SIGNALS {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        let stage = Arc::new(Mutex::new(Stage::Starting));
        let st = stage.clone();
        std::thread::Builder::new()
            .name("txfs-signals".into())
            .spawn(move || {
                let mut sig = 0;
                // SAFETY: a valid set, blocked in every thread.
                while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
                stop(name(sig), &backing, &point, &st);
            })
            .expect("spawning the signal thread");
        stage
    }

    fn stop(sig: &str, backing: &Path, point: &Path, stage: &Mutex<Stage>) {
        let stage = stage.lock();
        let Stage::Mounted { engine, device } = &*stage else {
            eprintln!("txfs mount: {sig} before {} was mounted: stopping", point.display());
            std::process::exit(1);
        };
        tracing::info!("{sig}: unmounting {}", point.display());
        super::sd_notify("STOPPING=1");
        // The connection's number, for fusectl, while the mount still shows.
        let source = format!("txfs:{}", backing.display());
        let conn = mountinfo::source_dev(&mountinfo::own(), &source).map(|d| libc::minor(d as libc::dev_t));
        if let Err(e) = detach(point) {
            tracing::warn!("detaching {}: {e}", point.display());
        }
        if device.wait_ended(GRACE) {
            return; // The session ends; `destroy` checkpoints, then main exits.
        }
        // Still held (a working directory, an open file): end the connection
        // as `txfs umount` does a stuck one; its holders get ENOTCONN.
        tracing::info!("the detached mount is still in use after {GRACE:?}: ending its connection");
        if let Some(conn) = conn {
            let _ = std::fs::write(crate::cli::umount::fusectl_dir(conn).join("abort"), "1");
        }
        if device.wait_ended(GRACE) {
            return;
        }
        // fusectl out of reach (not root): checkpoint here; exiting closes
        // /dev/fuse, which ends the connection.
        tracing::info!("cannot end the connection through fusectl: checkpointing and exiting");
        let r = engine.shutdown();
        let _ = std::fs::remove_file(backing.join(".txfs/daemon.pid"));
        if let Err(e) = r {
            tracing::error!("final checkpoint failed: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }

    /// `umount2(point, MNT_DETACH)`, else (not root) `fusermount3 -u -z`.
    fn detach(point: &Path) -> Result<(), String> {
        let c = std::ffi::CString::new(point.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EPERM) {
            let ok = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(point)
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
        }
        Err(err.to_string())
    }
}

/// BACKING/.txfs/daemon.pid while the daemon runs: removed on every way
/// out, so that a pid left there names no process that is not a daemon.
struct PidFile(std::path::PathBuf);

impl PidFile {
    fn write(backing: &Path) -> Result<PidFile, String> {
        let p = backing.join(".txfs/daemon.pid");
        std::fs::write(&p, format!("{}\n", std::process::id())).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(PidFile(p))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Tells `$NOTIFY_SOCKET` (systemd's `Type=notify`, or `txfs mount`
/// waiting for its daemon) `msg`, as sd_notify(3) does.
fn sd_notify(msg: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let b = path.as_bytes();
    let addr = match b.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|a| UnixDatagram::unbound()?.send_to_addr(msg.as_bytes(), &a));
    if let Err(e) = sent {
        tracing::warn!("telling NOTIFY_SOCKET {msg}: {e}");
    }
}

/// MOUNTPOINT, canonical. A dead txfs mount there (its daemon died: no
/// process holds its BACKING/.txfs/lock, and accesses fail with ENOTCONN,
/// or are still answered from the kernel's caches for a moment) is
/// detached first, as `fusermount3 -u -z` would; a dead mount of another
/// file system is left to its owner, and a live txfs mount is not stacked
/// on.
fn mount_point(point: &Path) -> Result<std::path::PathBuf, String> {
    let shown = point.display();
    let abs = match point.canonicalize() {
        Ok(p) => p,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECANCELED)) => {
            // The path up to the dead mount is alive: resolve it without it.
            let name = point.file_name().ok_or_else(|| format!("{shown}: {e}"))?;
            let parent = match point.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            parent.canonicalize().map_err(|e| format!("{}: {e}", parent.display()))?.join(name)
        }
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    let top = mountinfo::entries(&mountinfo::own()).filter(|m| m.point == abs).last();
    let Some(top) = top else { return Ok(abs) };
    let Some(backing) = top.source.strip_prefix("txfs:").map(std::path::PathBuf::from) else {
        let dead = std::fs::metadata(&abs).err().filter(|e| e.raw_os_error() == Some(libc::ENOTCONN));
        if let Some(e) = dead {
            return Err(format!(
                "{}: a dead {} mount (its daemon exited: {e}); detach it first: fusermount3 -u -z {}",
                abs.display(),
                top.fstype,
                abs.display()
            ));
        }
        return Ok(abs);
    };
    let daemons = super::lock_holders(&backing.join(".txfs/lock"));
    if !daemons.is_empty() {
        return Err(format!(
            "{} is a txfs mount already ({}): mounting another on top would hide it; txfs umount {} first",
            abs.display(),
            top.source,
            abs.display()
        ));
    }
    let c = std::ffi::CString::new(abs.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = std::io::Error::last_os_error();
        let ok = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&abs)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!(
                "{}: a dead txfs mount (its daemon exited) that cannot be detached ({err}): fusermount3 -u -z {}",
                abs.display(),
                abs.display()
            ));
        }
    }
    eprintln!("txfs mount: detached a dead txfs mount at {} ({})", abs.display(), top.source);
    point.canonicalize().map_err(|e| format!("{shown}: {e}"))
}

/// The FUSE mount options, who may reach the mount, whether
/// default_permissions was asked for, and the engine's options, from `-o`
/// options.
type Parsed = (Vec<fuser::MountOption>, fuser::SessionACL, bool, Options);

/// A size as mount options give it: bytes, or with a suffix K, M, G (KiB,
/// MiB, GiB; `k`, `m`, `g` and a trailing `i`/`iB`/`B` too).
fn parse_size(key: &str, v: &str) -> Result<u64, String> {
    let t = v.trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (
            &t[..i],
            match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{key}={v}: not a size (a number, with K, M, G or T)")),
            },
        ),
        _ => (t, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{key}={v}: not a size (a positive number, with K, M, G or T)"))
}

fn parse_options(backing: &Path, options: &[String]) -> Result<Parsed, String> {
    let mut mopts = vec![
        fuser::MountOption::FSName(format!("txfs:{}", backing.display())),
        fuser::MountOption::CUSTOM("subtype=txfs".into()),
    ];
    let mut acl = fuser::SessionACL::Owner;
    let mut permissions = false;
    let mut engine = Options::default();
    for o in options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        if let Some((key, v)) = o.split_once('=') {
            match key {
                "tx_mem" => {
                    engine.tx_mem = parse_size(key, v)?;
                    continue;
                }
                "mount_tx_mem" => {
                    engine.mount_tx_mem = parse_size(key, v)?;
                    continue;
                }
                "tx_reads" => {
                    engine.tx_reads =
                        v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            format!("tx_reads={v}: not a count (a positive number of read-set entries)")
                        })?;
                    continue;
                }
                _ => {}
            }
        }
        match o {
            "allow_other" => acl = fuser::SessionACL::All,
            "allow_root" => acl = fuser::SessionACL::RootAndOwner,
            "ro" => mopts.push(fuser::MountOption::RO),
            "rw" => mopts.push(fuser::MountOption::RW),
            "default_permissions" => permissions = true,
            // For mount(8) and fstab, not for the file system (sshfs
            // ignores them too).
            "defaults" | "nonempty" | "auto" | "noauto" | "nofail" | "user" | "nouser" | "users" | "nousers"
            | "owner" | "noowner" | "group" | "nogroup" | "_netdev" => {}
            o if o.starts_with("comment=") || o.starts_with("x-") => {}
            "dev" => mopts.push(fuser::MountOption::Dev),
            "nodev" => mopts.push(fuser::MountOption::NoDev),
            "suid" => mopts.push(fuser::MountOption::Suid),
            "nosuid" => mopts.push(fuser::MountOption::NoSuid),
            "exec" => mopts.push(fuser::MountOption::Exec),
            "noexec" => mopts.push(fuser::MountOption::NoExec),
            "atime" | "noatime" | "relatime" => {}
            other => {
                return Err(format!(
                    "unknown mount option {other:?} (see txfs mount --help for the options txfs takes)"
                ))
            }
        }
    }
    Ok((mopts, acl, permissions, engine))
}

/// Refuses layouts in which the daemon would reach its own mount through
/// BACKING (every access there would wait on a request it serves itself),
/// or hide BACKING under the mount, or keep its journal on a txfs mount.
/// Both paths are canonical.
fn check_layout(backing: &Path, point: &Path) -> Result<(), String> {
    let (b, p) = (backing.display(), point.display());
    if point == backing {
        return Err(format!("{p}: the mount point is the backing directory; mount it elsewhere"));
    }
    if point.starts_with(backing) {
        return Err(format!(
            "{p} is inside the backing directory {b}: the mount would serve itself (accesses there hang); \
             choose a mount point outside {b}"
        ));
    }
    if backing.starts_with(point) {
        return Err(format!(
            "the backing directory {b} is inside the mount point {p}: the mount would hide it; \
             choose a mount point that does not contain {b}"
        ));
    }
    for m in mountinfo::parse(&mountinfo::own()) {
        if backing.starts_with(&m.point) {
            return Err(format!(
                "the backing directory {b} is inside the txfs mount at {} ({}): txfs keeps its journal on an \
                 ordinary file system, not on a txfs mount",
                m.point.display(),
                m.source,
            ));
        }
    }
    Ok(())
}

/// Starts `txfs mount -f` in the background and returns once its own
/// connection answers: the daemon tells it so once the kernel's INIT is
/// answered (sd_notify's READY=1 on a socket of our own), and a stat of
/// the mount point, served by the daemon, shows the device of its mount.
fn daemonize(backing: &Path, point: &Path, options: &[String]) -> Result<(), String> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    std::fs::create_dir_all(backing.join(".txfs")).map_err(|e| format!("{}: {e}", backing.display()))?;
    let log_path = backing.join(".txfs/daemon.log");
    let mut log = open_log(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    if log.metadata().map(|m| m.len()).unwrap_or(0) >= super::log_cap() {
        log = super::rotate_log(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    }
    // Only this start's lines are shown if it fails.
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("txfs-mount-{}-{nanos}", std::process::id());
    let ready = SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixDatagram::bind_addr(&a))
        .map_err(|e| format!("readiness socket: {e}"))?;
    ready.set_read_timeout(Some(Duration::from_millis(20))).map_err(|e| format!("readiness socket: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg(backing).arg(point).arg("-f");
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.env("NOTIFY_SOCKET", format!("@{name}")).env(super::DAEMON_LOG, &log_path);
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting the daemon: {e}"))?;
    let failed = |why: String| {
        use std::io::{Read, Seek};
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&log_path) {
            let _ = f.seek(std::io::SeekFrom::Start(log_start));
            let _ = f.take(1 << 20).read_to_string(&mut text);
        }
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
        format!("{why}; its log ({}):\n{tail}", log_path.display())
    };
    // Recovery may take long: wait as long as the daemon lives.
    let mut buf = [0u8; 256];
    loop {
        if let Ok(n) = ready.recv(&mut buf) {
            if buf[..n].split(|&c| c == b'\n').any(|l| l == b"READY=1") {
                break;
            }
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(failed(format!("the daemon exited ({st}) before serving {}", point.display())));
        }
    }
    // Served by the daemon (it answers this stat), and its mount is the one there.
    let source = format!("txfs:{}", backing.display());
    let answer = std::fs::metadata(point).map_err(|e| e.to_string()).and_then(|m| {
        let ours =
            mountinfo::entries(&mountinfo::own()).any(|e| e.point == point && e.source == source && e.dev() == m.dev());
        if ours {
            Ok(())
        } else {
            Err(format!("another file system answers there (device {:#x})", m.dev()))
        }
    });
    if let Err(e) = answer {
        // SAFETY: our child, not reaped: it unmounts and exits on SIGTERM.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        return Err(failed(format!("{} does not answer as the daemon's mount: {e}", point.display())));
    }
    Ok(())
}

/// The daemon log, for appending, readable by root only: it names paths
/// inside directories other users may not list. A log left by an older
/// version with wider permissions is narrowed; a symlink is refused.
pub(super) fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if log.metadata()?.permissions().mode() & 0o7777 != 0o600 {
        log.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(log)
}
