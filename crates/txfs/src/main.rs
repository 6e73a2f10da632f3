//! `txfs`: mount a transactional file system over a backing directory, and
//! run programs as transactions. See `txfs --help` and SPEC §1.

mod attribution;
mod busy;
mod failpoint;
mod fuse;
mod mounts;
mod run;
mod wire;

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

/// The files section of the long help of the subcommands that use BACKING.
macro_rules! files_help {
    () => {
        "Files (under BACKING/.txfs/, hidden from the mount):
  journal/EPOCH      the redo journal: committed transactions not yet checkpointed
  ckpt-EPOCH.plan    a checkpoint in progress (finished by the next mount or recover)
  journal-spare      a retired journal kept (while mounted) to become the next one
  data/              data files: large transactions' data (past 64 MiB) and new
                     files' content (from 16 MiB), written once, not journaled
  lock               held by the daemon or by recover: one user at a time
  daemon.pid         the daemon's pid;  daemon.log  its log when started without -f"
    };
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING at MOUNTPOINT (recovers BACKING first).
    ///
    /// BACKING is an ordinary directory, possibly full of data; txfs keeps
    /// its journal under BACKING/.txfs/ and hides it from the mount. Without
    /// -f the daemon detaches once the mount serves; its log goes to
    /// BACKING/.txfs/daemon.log (TXFS_LOG=debug for more).
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs mount /srv/data /mnt/data\n",
        "  txfs mount -f -o allow_other /srv/data /mnt/data     # foreground, for systemd\n",
        "  mount -t fuse.txfs /srv/data /mnt/data               # once /sbin/mount.fuse.txfs -> txfs\n",
        "  fstab:  /srv/data  /mnt/data  fuse.txfs  defaults,allow_other  0 0\n\n",
        "Exit status: 0 mounted (or, with -f, unmounted cleanly); 1 on any error.\n\n",
    ), after_long_help = concat!(
        "Examples:\n",
        "  txfs mount /srv/data /mnt/data\n",
        "  txfs mount -f -o allow_other /srv/data /mnt/data     # foreground, for systemd\n",
        "  mount -t fuse.txfs /srv/data /mnt/data               # once /sbin/mount.fuse.txfs -> txfs\n",
        "  fstab:  /srv/data  /mnt/data  fuse.txfs  defaults,allow_other  0 0\n\n",
        "Exit status: 0 mounted (or, with -f, unmounted cleanly); 1 on any error.\n\n",
     files_help!()))]
    Mount {
        backing: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground (logs go to stderr).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Mount options, comma-separated: allow_other, allow_root, ro, rw,
        /// dev, nodev, suid, nosuid, exec, noexec, default_permissions
        /// (fstab's defaults, auto, noauto, user, _netdev and atime options
        /// are accepted and ignored). The kernel checks file modes unless
        /// root mounts without allow_other/allow_root: then only root can
        /// reach the mount and the checks (a round trip per directory on a
        /// path, inside a transaction) are skipped; default_permissions
        /// keeps them (for root processes without CAP_DAC_OVERRIDE,
        /// CAP_FOWNER, CAP_CHOWN or CAP_FSETID, e.g. in containers).
        #[arg(short = 'o')]
        options: Vec<String>,
    },
    /// Checkpoint, then unmount.
    ///
    /// Unmounts, then waits until the daemon has applied the journal to
    /// BACKING and exited: afterwards BACKING holds exactly the committed
    /// state as plain files. Live transactions are aborted.
    #[command(
        after_help = "Example:\n  txfs umount /mnt/data\n\nExit status: 0 unmounted; 1 not a txfs mount, or busy."
    )]
    Umount { mountpoint: PathBuf },
    /// Live transactions, journal use and counters of a mount.
    ///
    /// Counters since the mount: commits (every non-transactional operation
    /// is a one-operation commit too), aborts, conflicts (transactions that
    /// lost), journal_syncs (fdatasyncs of the journal, shared by group
    /// commit), checkpoints. Gauges: live_txs, journal_bytes (size of the
    /// current journal file), checkpoint_lag (committed bytes in the journal
    /// not yet applied to BACKING; a checkpoint starts past
    /// checkpoint_threshold), last_seq (sequence number of the last commit).
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs status /mnt/data\n",
        "  txfs status /mnt/data --json | jq .conflicts\n",
        "  txfs status /mnt/data --watch 1        # one line a second, with rates\n\n",
        "Exit status: 0; 1 if MOUNTPOINT is not a txfs mount.",
    ))]
    Status {
        mountpoint: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// Print one line every SECONDS until interrupted.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<f64>,
    },
    /// Run CMD and all its descendants as one transaction: commit if it
    /// exits 0, abort otherwise; rerun on conflict up to --retries times.
    ///
    /// Every thread of CMD and of every process it forks belongs to the
    /// transaction; their changes on the mount are invisible to others until
    /// CMD exits 0, then visible at once and durable. If CMD fails, is
    /// killed, or the machine crashes first, nothing of it survives. A
    /// conflict with a concurrent writer aborts the run and runs CMD again
    /// (CMD must be safe to rerun). Files outside the mount are not part of
    /// the transaction.
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs run -- sh -c 'cp -r build/* /mnt/data/site/ && ./update-index'\n",
        "  txfs run --mount /mnt/data -- git commit -am 'all or nothing'\n",
        "  txfs run --ordered --retries 10 -- ./import.sh\n\n",
        "Exit status: CMD's own; 75 if it still conflicted after the retries\n",
        "(nothing of it survived); 70 if txfs itself failed.",
    ))]
    Run {
        /// Reruns after a lost conflict.
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
    ///
    /// For a BACKING that is not mounted (after a crash, before copying or
    /// backing it up). Replays every committed transaction, finishes an
    /// interrupted checkpoint, cuts a torn journal tail, removes staging
    /// files. Idempotent: a crash during recovery is recovered again.
    #[command(after_help = concat!(
        "Example:\n  txfs recover /srv/data && rsync -a /srv/data/ backup/\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 recovered; 1 on error (damage before the journal's tail,\n",
        "BACKING in use by a mount).\n\n",
    ), after_long_help = concat!(
        "Example:\n  txfs recover /srv/data && rsync -a /srv/data/ backup/\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 recovered; 1 on error (damage before the journal's tail,\n",
        "BACKING in use by a mount).\n\n",
     files_help!()))]
    Recover {
        backing: PathBuf,
        /// Print a progress line to stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Offline: verify the journal and its references into BACKING;
    /// exits 1 on damage. Changes nothing.
    ///
    /// Reports each journal file's committed records, a torn tail that
    /// recovery will cut, an interrupted checkpoint, and any damage.
    #[command(after_help = concat!(
        "Example:\n  txfs check /srv/data || echo damaged\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 no damage (a torn tail is not damage); 1 damage or error.\n\n",
    ), after_long_help = concat!(
        "Example:\n  txfs check /srv/data || echo damaged\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 no damage (a torn tail is not damage); 1 damage or error.\n\n",
     files_help!()))]
    Check {
        backing: PathBuf,
        /// Print a progress line to stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
}

/// A progress line on stderr for a long offline run: elapsed time and how
/// much journal there is to go through (the engine reports no finer steps).
/// Shown only on a terminal, or when asked for.
struct Progress {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(what: &'static str, backing: &Path, forced: bool) -> Progress {
        use std::io::IsTerminal;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if !forced && !std::io::stderr().is_terminal() {
            return Progress { stop, thread: None };
        }
        let journal: u64 = std::fs::read_dir(backing.join(txfs_engine::META_DIR).join("journal"))
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let t = Instant::now();
            let mut shown = false;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                // Quiet for the first half second: short runs print nothing.
                if t.elapsed() > Duration::from_millis(500) {
                    eprint!("\rtxfs {what}: {} of journal, {:.1} s ", human(journal), t.elapsed().as_secs_f64());
                    shown = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if shown {
                eprintln!("\rtxfs {what}: {} of journal, done in {:.1} s", human(journal), t.elapsed().as_secs_f64());
            }
        });
        Progress { stop, thread: Some(thread) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=1023 => format!("{bytes} B"),
        1024..=1048575 => format!("{:.1} KiB", b / 1024.0),
        1048576..=1073741823 => format!("{:.1} MiB", b / 1048576.0),
        _ => format!("{:.2} GiB", b / 1073741824.0),
    }
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

fn mount(backing: &Path, point: &Path, foreground: bool, options: &[String]) -> Result<(), String> {
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
    let storage = RealFs::open(&backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    let (storage, armed) = failpoint::wrap(Arc::new(storage))?;
    let engine = Arc::new(
        Engine::open(storage, failpoint::tune(Options::default()))
            .map_err(|e| format!("{}: {e}", backing.display()))?,
    );
    if let Some(a) = &armed {
        a.opened();
    }
    let txfs = fuse::TxFs::new(engine.clone(), backing.clone());
    let _ = txfs.point.set(point.clone());
    let notifier_slot = txfs.notifier.clone();
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
    config.n_threads = Some(fuse::env_count("TXFS_THREADS", 16));
    // FUSE over io_uring when the kernel offers it (6.14+, the fuse module's
    // enable_uring parameter): threads per CPU, pinned, so a request and its
    // reply do not wake another CPU (bench/NOTES.md item 25).
    config.uring_threads = Some(fuse::env_count("TXFS_URING_THREADS", 8));
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
    // The mount's device; its minor is the FUSE connection's number.
    let id = busy::ident(&m.point);
    let conn = id.map(|i| i.minor);
    let mut detached = false;
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        let err = std::io::Error::last_os_error();
        // Not root: fusermount3 may unmount what we may not.
        let done = err.raw_os_error() != Some(libc::EBUSY) && fusermount3(&["-u"], &m.point);
        if !done {
            let busy = matches!(err.raw_os_error(), Some(libc::EBUSY) | Some(libc::EPERM));
            if let (true, Some(id)) = (busy, id) {
                detached = detach_if_only_kept(&m.point, id, &c)?;
            }
            if !detached {
                return Err(format!("umount {}: {err}", m.point.display()));
            }
        }
    }
    // The daemon checkpoints when the kernel ends the session. A non-lazy
    // unmount leaves nobody who could still use the connection, yet in
    // about one run of ten (tests/durability.rs, kernel 6.18, with entries
    // cached) the kernel kept it — and the daemon waiting — with no mount,
    // no open file and no request left. End it then, as `fusermount -u`
    // of a dead mount would: the daemon still checkpoints on its way out.
    // A mount detached because only libtxfs's kept descriptors held it is
    // ended at once (they would keep it alive for good) — unless something
    // else got hold of it meanwhile: then it ends when they let go.
    let abort_now = detached && id.is_some_and(|id| nothing_else_after_detach(&m.point, id));
    if detached && !abort_now {
        return Ok(());
    }
    if let Some(conn) = conn {
        let ctl = Path::new("/sys/fs/fuse/connections");
        if std::fs::read_dir(ctl).is_ok_and(|mut d| d.next().is_none()) {
            // fusectl not mounted (root only; otherwise nothing to look at).
            // SAFETY: constant C strings.
            unsafe {
                libc::mount(
                    c"fusectl".as_ptr(),
                    c"/sys/fs/fuse/connections".as_ptr(),
                    c"fusectl".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
        }
        let dir = ctl.join(conn.to_string());
        let t0 = Instant::now();
        while !abort_now && dir.exists() && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if abort_now {
            if std::fs::write(dir.join("abort"), "1").is_err() {
                eprintln!(
                    "txfs umount: detached {}; could not end FUSE connection {conn} (fusectl): the daemon \
                     checkpoints and exits when the processes holding libtxfs descriptors exit",
                    m.point.display()
                );
                return Ok(());
            }
        } else if dir.exists() {
            eprintln!("txfs umount: the kernel kept FUSE connection {conn} after the unmount: aborting it");
            let _ = std::fs::write(dir.join("abort"), "1");
        }
    }
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(600);
        // A zombie (exited, not yet reaped by its parent) is done too.
        let running = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                .unwrap_or(false)
        };
        let mut said = false;
        let t0 = Instant::now();
        while running(pid) && Instant::now() < deadline {
            if !said && t0.elapsed() > Duration::from_secs(5) {
                eprintln!("txfs umount: waiting for the daemon (pid {pid}) to finish its final checkpoint");
                said = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// `fusermount3 ARGS POINT` succeeded.
fn fusermount3(args: &[&str], point: &Path) -> bool {
    std::process::Command::new("fusermount3").args(args).arg(point).status().map(|s| s.success()).unwrap_or(false)
}

/// Live transactions of the mount, through `dir` (a descriptor of its root).
fn live_txs(dir: &std::fs::File, point: &Path) -> Result<u64, String> {
    Ok(read_status(dir, point)?.iter().find(|(n, _)| *n == "live_txs").map_or(0, |(_, v)| *v))
}

/// After a busy unmount: detaches the mount if descriptors libtxfs keeps
/// between transactions are all that hold it (busy.rs), no other mount
/// shares it and no transaction is live. Ok(false): not detached, nothing
/// to add to the busy error (holders we cannot see, e.g. in another mount
/// namespace). Err: refused, saying why.
fn detach_if_only_kept(point: &Path, id: busy::Ident, c: &std::ffi::CStr) -> Result<bool, String> {
    let refuse = |why: &[String]| {
        let more = if why.len() > 8 { format!(" and {} more", why.len() - 8) } else { String::new() };
        Err(format!("umount {}: busy ({}{more})", point.display(), why[..why.len().min(8)].join("; ")))
    };
    let tangled = busy::entangled_mounts(point, id);
    if !tangled.is_empty() {
        return refuse(&tangled);
    }
    let h = busy::scan(id);
    if !h.other.is_empty() {
        return refuse(&h.other);
    }
    if h.kept.is_empty() {
        return Ok(false);
    }
    // A thread inside a transaction holds its (marked) descriptor too.
    // Plain operations run as short transactions: look a few times.
    let dir = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let mut live = 0;
    for _ in 0..20 {
        live = live_txs(&dir, point)?;
        if live == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    drop(dir);
    if live > 0 {
        return refuse(&[format!(
            "{live} live transaction(s): their threads hold the mount until they commit or abort"
        )]);
    }
    // For tests/umount.rs only: a window in which others get hold of it.
    if let Some(ms) = std::env::var("TXFS_TEST_UMOUNT_PAUSE_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    // SAFETY: valid C string.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r != 0 && !fusermount3(&["-u", "-z"], point) {
        return Err(format!("umount {} (detach): {}", point.display(), std::io::Error::last_os_error()));
    }
    Ok(true)
}

/// After the detach: whether ending the connection now cuts off nobody
/// but idle libtxfs descriptors. Between the scan before the detach and
/// the detach, a process may have opened a file or begun a transaction;
/// after it, nothing new can reach the mount by a path (and libtxfs sees
/// the path's device change and does not use its kept descriptor), so a
/// second look settles it. Otherwise the detached mount lives on until its
/// holders let go, said on stderr.
fn nothing_else_after_detach(point: &Path, id: busy::Ident) -> bool {
    // Let path walks that began before the detach finish their open.
    std::thread::sleep(Duration::from_millis(50));
    let h = busy::scan(id);
    let mut why = h.other;
    if let Some(k) = h.kept.first() {
        // A kept descriptor reaches the detached mount: ask through it.
        match std::fs::File::open(k).map_err(|e| e.to_string()).and_then(|d| live_txs(&d, point)) {
            Ok(0) => {}
            Ok(n) => why.push(format!("{n} transaction(s) began meanwhile")),
            Err(e) => why.push(format!("its transactions could not be counted ({e})")),
        }
    }
    if why.is_empty() {
        return true;
    }
    eprintln!(
        "txfs umount: detached {}, but it is in use again ({}): the daemon checkpoints and exits when they let go",
        point.display(),
        why.join("; ")
    );
    false
}

const STATUS_NAMES: [&str; 8] =
    ["commits", "aborts", "conflicts", "live_txs", "journal_bytes", "journal_syncs", "checkpoints", "last_seq"];

/// The mount's counters (TXFS_IOC_STATUS), plus what follows from them.
fn read_status(dir: &std::fs::File, point: &Path) -> Result<Vec<(&'static str, u64)>, String> {
    let mut buf = [0u8; 64];
    // SAFETY: STATUS writes 64 bytes into buf.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), wire::STATUS as _, buf.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("{}: not a txfs mount? ({})", point.display(), std::io::Error::last_os_error()));
    }
    let mut out: Vec<(&'static str, u64)> = STATUS_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8"))))
        .collect();
    // The journal file starts with its header; the rest is committed
    // records that the next checkpoint applies to BACKING (it starts a
    // new, empty journal file).
    let journal = out[4].1;
    out.push(("checkpoint_lag", journal.saturating_sub(txfs_engine::journal::FILE_HEADER_LEN)));
    out.push(("checkpoint_threshold", Options::default().checkpoint_bytes));
    // The kernel cache gate (daemons before it answer ENOTTY: left out).
    let mut cache = [0u8; 32];
    // SAFETY: CACHE writes 32 bytes into cache.
    if unsafe { libc::ioctl(dir.as_raw_fd(), wire::CACHE as _, cache.as_mut_ptr()) } == 0 {
        let at = |i: usize| u64::from_le_bytes(cache[i * 8..i * 8 + 8].try_into().expect("8"));
        out.push(("kernel_cache_open", at(0)));
        out.push(("cached_replies", at(1)));
        out.push(("cache_closes", at(2)));
        out.push(("lookup_getattr_requests", at(3)));
    }
    Ok(out)
}

fn status(point: &Path, json: bool, watch: Option<f64>) -> Result<(), String> {
    let dir = std::fs::File::open(point).map_err(|e| format!("{}: {e}", point.display()))?;
    let vals = read_status(&dir, point)?;
    if json {
        let obj: serde_json::Map<String, serde_json::Value> =
            vals.iter().map(|(n, v)| (n.to_string(), serde_json::Value::from(*v))).collect();
        println!("{}", serde_json::Value::Object(obj));
    } else if watch.is_none() {
        println!("{}", point.display());
        for (n, v) in &vals {
            let unit = if n.contains("bytes") || n.starts_with("checkpoint_") {
                format!("  ({})", human(*v))
            } else {
                String::new()
            };
            println!("  {n:<21}{v}{unit}");
        }
    }
    let Some(every) = watch else { return Ok(()) };
    let every = Duration::from_secs_f64(every.max(0.05));
    println!(
        "{:>10} {:>9} {:>8} {:>9} {:>5} {:>11} {:>11}",
        "commits/s", "aborts/s", "confl/s", "syncs/s", "live", "ckpt_lag", "checkpoints"
    );
    let mut prev = vals;
    loop {
        std::thread::sleep(every);
        let now = read_status(&dir, point)?;
        let rate = |i: usize| (now[i].1.saturating_sub(prev[i].1)) as f64 / every.as_secs_f64();
        println!(
            "{:>10.0} {:>9.0} {:>8.0} {:>9.0} {:>5} {:>11} {:>11}",
            rate(0),
            rate(1),
            rate(2),
            rate(5),
            now[3].1,
            human(now[8].1),
            now[6].1
        );
        prev = now;
    }
}

fn recover(backing: &Path, progress: bool) -> Result<(), String> {
    init_logs();
    let _lock = lock_backing(backing)?;
    let _progress = Progress::start("recover", backing, progress);
    let engine = open_engine(backing, Options { flush_interval: None, ..Default::default() })?;
    engine.close().map_err(|e| format!("{}: {e}", backing.display()))?;
    println!("{}: recovered; it holds the committed state as plain files", backing.display());
    Ok(())
}

fn check(backing: &Path, progress: bool) -> Result<bool, String> {
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    let rep = {
        let _progress = Progress::start("check", backing, progress);
        txfs_engine::check(&fs).map_err(|e| e.to_string())?
    };
    for j in &rep.journals {
        println!("{}: {} committed records, {} bytes", j.path.display(), j.records, j.valid_bytes);
        if let Some((at, why)) = &j.cut {
            if why.starts_with(txfs_engine::journal::STALE_END) {
                println!("  records end at offset {at} ({why}): recovery will cut it there");
            } else {
                println!("  torn tail at offset {at} ({why}): recovery will cut it there");
            }
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
        Cmd::Status { mountpoint, json, watch } => status(&mountpoint, json, watch),
        Cmd::Run { retries, mount, ordered, cmd } => return run::run(mount.as_deref(), retries, ordered, &cmd),
        Cmd::Recover { backing, progress } => recover(&backing, progress),
        Cmd::Check { backing, progress } => match check(&backing, progress) {
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
