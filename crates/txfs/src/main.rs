//! `txfs`: mount a transactional file system over a backing directory, and
//! run programs as transactions. See `txfs --help` and SPEC §1.

mod failpoint;
mod fs;
mod ioctl;
mod mounts;
mod run;
mod txmap;

use clap::{Parser, Subcommand};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use txfs_engine::storage::RealFs;
use txfs_engine::{Engine, Options};

#[derive(Parser)]
#[command(name = "txfs", version, about = "ACID transactions over ordinary files and directories")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING at MOUNTPOINT (recovers BACKING first).
    ///
    /// BACKING is an ordinary directory, possibly full of data; txfs keeps
    /// its journal under BACKING/.txfs/ and hides it from the mount.
    Mount {
        backing: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground (logs go to stderr).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Mount options, comma-separated: allow_other, allow_root, ro, ...
        #[arg(short = 'o')]
        options: Vec<String>,
    },
    /// Checkpoint, then unmount.
    Umount { mountpoint: PathBuf },
    /// Live transactions, journal use and counters of a mount.
    Status {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Run CMD and all its descendants as one transaction: commit if it
    /// exits 0, abort otherwise; rerun on conflict up to --retries times.
    ///
    /// Exit status: CMD's own; 75 if it still conflicted after the retries
    /// (nothing of it survived); 70 if txfs itself failed.
    Run {
        #[arg(long, default_value_t = 3)]
        retries: u32,
        /// The mount (default: $TXFS_MOUNT, or the only txfs mount).
        #[arg(long)]
        mount: Option<PathBuf>,
        /// Ordered commit: return once the order is fixed, durable later.
        #[arg(long)]
        ordered: bool,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Offline: replay the journal into BACKING, leaving plain files.
    Recover { backing: PathBuf },
    /// Offline: verify the journal and its references into BACKING;
    /// exits 1 on damage. Changes nothing.
    Check { backing: PathBuf },
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TXFS_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Holds BACKING/.txfs/lock: one user of a backing directory at a time.
fn lock_backing(backing: &Path) -> Result<std::fs::File, String> {
    let meta = backing.join(txfs_engine::META_DIR);
    if !backing.is_dir() {
        return Err(format!("{}: not a directory", backing.display()));
    }
    std::fs::create_dir_all(&meta).map_err(|e| format!("{}: {e}", meta.display()))?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(meta.join("lock"))
        .map_err(|e| format!("{}: {e}", meta.join("lock").display()))?;
    // SAFETY: flock on a valid fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!("{} is in use (mounted, or being recovered)", backing.display()));
    }
    Ok(f)
}

fn open_engine(backing: &Path, opts: Options) -> Result<Engine, String> {
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    Engine::open(Arc::new(fs), opts).map_err(|e| format!("{}: {e}", backing.display()))
}

fn mount(backing: &Path, point: &Path, foreground: bool, options: &[String]) -> Result<(), String> {
    let backing = backing.canonicalize().map_err(|e| format!("{}: {e}", backing.display()))?;
    let point = point.canonicalize().map_err(|e| format!("{}: {e}", point.display()))?;
    if !foreground {
        return daemonize(&backing, &point, options);
    }
    init_logs();
    let lock = lock_backing(&backing)?;
    std::fs::write(backing.join(".txfs/daemon.pid"), format!("{}\n", std::process::id()))
        .map_err(|e| format!("pid file: {e}"))?;
    let storage = RealFs::open(&backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    let (storage, armed) = failpoint::wrap(Arc::new(storage))?;
    let engine = Arc::new(
        Engine::open(storage, failpoint::tune(Options::default()))
            .map_err(|e| format!("{}: {e}", backing.display()))?,
    );
    if let Some(a) = &armed {
        a.opened();
    }
    let txfs = fs::TxFs::new(engine.clone(), backing.clone());
    let notifier_slot = txfs.notifier.clone();
    let gate = txfs.gate.clone();
    let mut mopts = vec![
        fuser::MountOption::FSName(format!("txfs:{}", backing.display())),
        fuser::MountOption::CUSTOM("subtype=txfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    let mut acl = fuser::SessionACL::Owner;
    for o in options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        match o {
            "allow_other" => acl = fuser::SessionACL::All,
            "allow_root" => acl = fuser::SessionACL::RootAndOwner,
            "ro" => mopts.push(fuser::MountOption::RO),
            "rw" => mopts.push(fuser::MountOption::RW),
            "default_permissions" | "nonempty" | "auto" | "noauto" | "user" | "nouser" | "_netdev" => {}
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
    let mut config = fuser::Config::default();
    config.mount_options = mopts;
    config.acl = acl;
    config.n_threads = Some(4);
    let session = fuser::Session::new(txfs, &point, &config).map_err(|e| format!("mount {}: {e}", point.display()))?;
    let _ = notifier_slot.set(session.notifier());
    // Kernel caching while no transaction is live needs FUSE_NOTIFY_INC_EPOCH.
    let caching = {
        use std::os::fd::AsFd;
        session.as_fd().try_clone_to_owned().is_ok_and(|dev| gate.enable(dev))
    };
    if caching {
        tracing::info!("kernel caches entries and attributes while no transaction is live");
    } else {
        tracing::warn!("kernel lacks FUSE_NOTIFY_INC_EPOCH (6.16+): entries and attributes are never cached");
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
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
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
        if mounts::find(point).is_some() {
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

fn umount(point: &Path) -> Result<(), String> {
    let m = mounts::find(point).ok_or_else(|| format!("{}: not a txfs mount", point.display()))?;
    let pid = m
        .backing()
        .and_then(|b| std::fs::read_to_string(b.join(".txfs/daemon.pid")).ok())
        .and_then(|s| s.trim().parse::<i32>().ok());
    let c = std::ffi::CString::new(m.point.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        let err = std::io::Error::last_os_error();
        let ok = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&m.point)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err(format!("umount {}: {err}", m.point.display()));
        }
    }
    // The daemon checkpoints when the kernel ends the session: wait for it.
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(600);
        // A zombie (exited, not yet reaped by its parent) is done too.
        let running = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                .unwrap_or(false)
        };
        while running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

fn status(point: &Path, json: bool) -> Result<(), String> {
    let dir = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let mut buf = [0u8; 64];
    // SAFETY: STATUS writes 64 bytes into buf.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), ioctl::STATUS as _, buf.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("{}: not a txfs mount? ({})", point.display(), std::io::Error::last_os_error()));
    }
    let names =
        ["commits", "aborts", "conflicts", "live_txs", "journal_bytes", "journal_syncs", "checkpoints", "last_seq"];
    let vals: Vec<u64> = (0..8).map(|i| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8"))).collect();
    if json {
        let obj: serde_json::Map<String, serde_json::Value> =
            names.iter().zip(&vals).map(|(n, v)| (n.to_string(), serde_json::Value::from(*v))).collect();
        println!("{}", serde_json::Value::Object(obj));
    } else {
        println!("{}", point.display());
        for (n, v) in names.iter().zip(&vals) {
            println!("  {n:<14} {v}");
        }
    }
    Ok(())
}

fn recover(backing: &Path) -> Result<(), String> {
    init_logs();
    let _lock = lock_backing(backing)?;
    let engine = open_engine(backing, Options { flush_interval: None, ..Default::default() })?;
    engine.close().map_err(|e| format!("{}: {e}", backing.display()))?;
    println!("{}: recovered; it holds the committed state as plain files", backing.display());
    Ok(())
}

fn check(backing: &Path) -> Result<bool, String> {
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    let rep = txfs_engine::check(&fs).map_err(|e| e.to_string())?;
    for j in &rep.journals {
        println!("{}: {} committed records, {} bytes", j.path.display(), j.records, j.valid_bytes);
        if let Some((at, why)) = &j.cut {
            println!("  torn tail at offset {at} ({why}): recovery will cut it there");
        }
    }
    if let Some(p) = &rep.plan {
        println!("{}: an interrupted checkpoint; the next mount or `txfs recover` finishes it", p.display());
    }
    for p in &rep.problems {
        println!("DAMAGE: {p}");
    }
    Ok(rep.problems.is_empty())
}

fn main() -> ExitCode {
    // `mount -t fuse.txfs BACKING MNT -o opts` runs `mount.fuse.txfs BACKING MNT -o opts`.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let cli = if Path::new(&argv0).file_name().is_some_and(|n| n == "mount.fuse.txfs") {
        let mut args: Vec<std::ffi::OsString> = vec!["txfs".into(), "mount".into()];
        args.extend(std::env::args_os().skip(1));
        Cli::parse_from(args)
    } else {
        Cli::parse()
    };
    let r = match cli.cmd {
        Cmd::Mount { backing, mountpoint, foreground, options } => mount(&backing, &mountpoint, foreground, &options),
        Cmd::Umount { mountpoint } => umount(&mountpoint),
        Cmd::Status { mountpoint, json } => status(&mountpoint, json),
        Cmd::Run { retries, mount, ordered, cmd } => return run::run(mount.as_deref(), retries, ordered, &cmd),
        Cmd::Recover { backing } => recover(&backing),
        Cmd::Check { backing } => match check(&backing) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("txfs: {e}");
            ExitCode::from(1)
        }
    }
}
