//! The command line: one file per subcommand, and what they share.
//!
//! `txfs mount` ([`mount`]) is the daemon; `umount`, `status` and `run`
//! talk to a mounted daemon through its root directory (unmount, ioctls);
//! `recover` and `check` work offline on a backing directory. This module
//! holds the argument grammar (clap), the dispatch, and the helpers more
//! than one subcommand uses: the backing directory's lock, logging, the
//! progress line and byte counts for humans.

mod busy;
mod check;
mod mount;
mod recover;
mod run;
mod status;
mod umount;

use clap::{Parser, Subcommand};
use std::os::unix::ffi::OsStrExt;
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
  daemon.pid         the daemon's pid;  daemon.log  its log when started without -f (0600)"
    };
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING at MOUNTPOINT (recovers BACKING first).
    ///
    /// BACKING is an ordinary directory, possibly full of data; txfs keeps
    /// its journal under BACKING/.txfs/ and hides it from the mount. Without
    /// -f the daemon detaches once the mount serves; its log goes to
    /// BACKING/.txfs/daemon.log, readable by root only (TXFS_LOG=debug for more).
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
        /// are accepted and ignored). Device nodes on the mount open only
        /// with dev (nodev is FUSE's default, as for every FUSE mount). The kernel checks file modes unless
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
    /// The daemon's helper (not for users): looks up the NUL-separated
    /// paths below MOUNTPOINT read from stdin, as a process in no
    /// transaction, until stdin ends. See `healer` in fuse/mod.rs.
    #[command(hide = true, name = "__heal")]
    Heal { mountpoint: PathBuf },
}

/// Parses the command line (also as `mount.fuse.txfs`, which `mount -t
/// fuse.txfs BACKING MNT -o opts` runs) and runs the subcommand.
pub fn main() -> ExitCode {
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
        Cmd::Mount { backing, mountpoint, foreground, options } => {
            mount::mount(&backing, &mountpoint, foreground, &options)
        }
        Cmd::Umount { mountpoint } => umount::umount(&mountpoint),
        Cmd::Status { mountpoint, json, watch } => status::status(&mountpoint, json, watch),
        Cmd::Run { retries, mount, ordered, cmd } => return run::run(mount.as_deref(), retries, ordered, &cmd),
        Cmd::Recover { backing, progress } => recover::recover(&backing, progress),
        Cmd::Check { backing, progress } => match check::check(&backing, progress) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Cmd::Heal { mountpoint } => {
            use std::io::BufRead;
            for path in std::io::stdin().lock().split(0).map_while(Result::ok) {
                let path = Path::new(std::ffi::OsStr::from_bytes(&path));
                let _ = std::fs::symlink_metadata(mountpoint.join(path));
            }
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("txfs: {e}");
            ExitCode::from(1)
        }
    }
}

/// A progress line on stderr for a long offline run: elapsed time and how
/// much journal there is to go through (the engine reports no finer steps).
/// Shown only on a terminal, or when asked for.
pub(crate) struct Progress {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub(crate) fn start(what: &'static str, backing: &Path, forced: bool) -> Progress {
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

pub(crate) fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=1023 => format!("{bytes} B"),
        1024..=1048575 => format!("{:.1} KiB", b / 1024.0),
        1048576..=1073741823 => format!("{:.1} MiB", b / 1048576.0),
        _ => format!("{:.2} GiB", b / 1073741824.0),
    }
}

pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TXFS_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Holds BACKING/.txfs/lock: one user of a backing directory at a time.
pub(crate) fn lock_backing(backing: &Path) -> Result<std::fs::File, String> {
    let meta = backing.join(txfs_engine::META_DIR);
    if !backing.is_dir() {
        return Err(format!("{}: not a directory", backing.display()));
    }
    let made = !meta.exists();
    std::fs::create_dir_all(&meta).map_err(|e| format!("{}: {e}", meta.display()))?;
    if made {
        // The engine's open syncs BACKING too (issue 28); this keeps a lock
        // folder made here from ever being the one name not yet durable.
        std::fs::File::open(backing)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("{}: fsync: {e}", backing.display()))?;
    }
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

pub(crate) fn open_engine(backing: &Path, opts: Options) -> Result<Engine, String> {
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    Engine::open(Arc::new(fs), opts).map_err(|e| format!("{}: {e}", backing.display()))
}
