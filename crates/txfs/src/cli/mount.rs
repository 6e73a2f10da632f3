//! `txfs mount`: recover BACKING, then serve it at MOUNTPOINT until
//! unmounted (checkpointing on the way out). Without `-f` it starts itself
//! with `-f` in the background and returns once the mount serves.

use super::{init_logs, lock_backing};
use crate::attribution::mountinfo;
use crate::config::Config;
use crate::fuse;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    let point = point.canonicalize().map_err(|e| format!("{}: {e}", point.display()))?;
    if !foreground {
        return daemonize(&backing, &point, options);
    }
    init_logs();
    raise_nofile();
    let lock = lock_backing(&backing)?;
    std::fs::write(backing.join(".txfs/daemon.pid"), format!("{}\n", std::process::id()))
        .map_err(|e| format!("pid file: {e}"))?;
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
    let engine = Arc::new(
        Engine::open(storage, knobs.engine_options(Options::default()))
            .map_err(|e| format!("{}: {e}", backing.display()))?,
    );
    #[cfg(any(feature = "testing", debug_assertions))]
    if let Some(a) = &armed {
        a.opened();
    }
    let notifier_slot = Arc::new(std::sync::OnceLock::new());
    let txfs = fuse::TxFs::new(engine.clone(), backing.clone(), point.clone(), notifier_slot.clone(), knobs.clone());
    let gate = txfs.gate.clone();
    let mut mopts = vec![
        fuser::MountOption::FSName(format!("txfs:{}", backing.display())),
        fuser::MountOption::CUSTOM("subtype=txfs".into()),
    ];
    let mut acl = fuser::SessionACL::Owner;
    let mut permissions = false;
    for o in options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        match o {
            "allow_other" => acl = fuser::SessionACL::All,
            "allow_root" => acl = fuser::SessionACL::RootAndOwner,
            "ro" => mopts.push(fuser::MountOption::RO),
            "rw" => mopts.push(fuser::MountOption::RW),
            "default_permissions" => permissions = true,
            "nonempty" | "auto" | "noauto" | "user" | "nouser" | "_netdev" => {}
            "dev" => mopts.push(fuser::MountOption::Dev),
            "nodev" => mopts.push(fuser::MountOption::NoDev),
            "suid" => mopts.push(fuser::MountOption::Suid),
            "nosuid" => mopts.push(fuser::MountOption::NoSuid),
            "exec" => mopts.push(fuser::MountOption::Exec),
            "noexec" => mopts.push(fuser::MountOption::NoExec),
            "atime" | "noatime" | "relatime" => {}
            other => return Err(format!("unknown mount option {other:?}")),
        }
    }
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
    let session = fuser::Session::new(fuse::Fs(Arc::new(txfs)), &point, &config)
        .map_err(|e| format!("mount {}: {e}", point.display()))?;
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
    let _ = std::fs::remove_file(backing.join(".txfs/daemon.pid"));
    drop(lock);
    Ok(())
}

/// Starts `txfs mount -f` in the background and waits until it serves.
fn daemonize(backing: &Path, point: &Path, options: &[String]) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    std::fs::create_dir_all(backing.join(".txfs")).map_err(|e| format!("{}: {e}", backing.display()))?;
    let log_path = backing.join(".txfs/daemon.log");
    let log = open_log(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg(backing).arg(point).arg("-f");
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if mountinfo::find(point).is_some() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            return Err(format!(
                "the daemon exited ({st}); last log lines ({}):\n{}",
                log_path.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{} did not appear as a mount within 60 s (see {})", point.display(), log_path.display()))
}

/// The daemon log, for appending, readable by root only: it names paths
/// inside directories other users may not list. A log left by an older
/// version with wider permissions is narrowed; a symlink is refused.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
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
