//! The command line: one file per subcommand, and what they share.
//!
//! `txfs mount` ([`mount`]) is the daemon; `umount`, `status` and `run`
//! talk to a mounted daemon through its root directory (unmount, ioctls);
//! `recover` and `check` work offline on a backing directory. This module
//! holds the argument grammar (clap), the dispatch, and the helpers more
//! than one subcommand uses: the backing directory's lock, logging, the
//! progress line and byte counts for humans.

mod busy;
mod changes;
mod check;
mod mount;
mod recover;
mod run;
mod status;
mod umount;

use clap::{CommandFactory, Parser, Subcommand};
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
  daemon.pid         the daemon's pid;  daemon.log  its log when started without -f (0600),
                     daemon.log.1 past 16 MiB ($TXFS_LOG_MAX_BYTES)"
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
        "Without -f, returns once the daemon's own connection answers. A dead txfs\n",
        "mount at MOUNTPOINT (its daemon was killed: ENOTCONN) is detached first;\n",
        "a live one is not mounted over. Refused: MOUNTPOINT equal to, inside or\n",
        "above BACKING, and BACKING inside a txfs mount.\n",
        "SIGINT, SIGTERM or SIGHUP to the daemon unmount (lazily), checkpoint and\n",
        "exit 0, as for any FUSE file system; processes still in the mount get\n",
        "ENOTCONN after 2 s.\n\n",
        "Exit status: 0 mounted (or, with -f, unmounted cleanly); 1 on any error.\n\n",
    ), after_long_help = concat!(
        "Examples:\n",
        "  txfs mount /srv/data /mnt/data\n",
        "  txfs mount -f -o allow_other /srv/data /mnt/data     # foreground, for systemd\n",
        "  mount -t fuse.txfs /srv/data /mnt/data               # once /sbin/mount.fuse.txfs -> txfs\n",
        "  fstab:  /srv/data  /mnt/data  fuse.txfs  defaults,allow_other  0 0\n\n",
        "Without -f, returns once the daemon's own connection answers. A dead txfs\n",
        "mount at MOUNTPOINT (its daemon was killed: ENOTCONN) is detached first;\n",
        "a live one is not mounted over. Refused: MOUNTPOINT equal to, inside or\n",
        "above BACKING, and BACKING inside a txfs mount.\n",
        "SIGINT, SIGTERM or SIGHUP to the daemon unmount (lazily), checkpoint and\n",
        "exit 0, as for any FUSE file system; processes still in the mount get\n",
        "ENOTCONN after 2 s.\n\n",
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
        /// (what fstab and mount(8) pass for mount(8) itself is accepted and
        /// ignored, as sshfs does: defaults, auto, noauto, nofail, user,
        /// nouser, users, owner, group, _netdev, comment=..., x-..., the
        /// atime options, nonempty). Device nodes on the mount open only
        /// with dev (nodev is FUSE's default, as for every FUSE mount). The kernel checks file modes unless
        /// root mounts without allow_other/allow_root: then only root can
        /// reach the mount and the checks (a round trip per directory on a
        /// path, inside a transaction) are skipped; default_permissions
        /// keeps them (for root processes without CAP_DAC_OVERRIDE,
        /// CAP_FOWNER, CAP_CHOWN or CAP_FSETID, e.g. in containers).
        /// Limits: tx_mem=SIZE (memory one transaction may hold in the
        /// daemon, default 128M), mount_tx_mem=SIZE (all live transactions
        /// together, default 192M), tx_reads=N (read-set entries of one
        /// transaction, default 1048576); past one, the operation fails
        /// with ENOSPC and the transaction can only be aborted.
        #[arg(short = 'o')]
        options: Vec<String>,
        /// As a mount helper (mount.fuse.txfs): mount(8)'s -n, -s and -v,
        /// ignored.
        #[arg(short = 'n', hide = true)]
        no_mtab: bool,
        #[arg(short = 's', hide = true)]
        sloppy: bool,
        #[arg(short = 'v', hide = true)]
        verbose: bool,
    },
    /// Checkpoint, then unmount.
    ///
    /// Unmounts, then waits until the daemon has applied the journal to
    /// BACKING and exited: afterwards BACKING holds exactly the committed
    /// state as plain files. Live transactions are aborted.
    #[command(
        after_help = "Example:\n  txfs umount /mnt/data\n\nExit status: 0 unmounted and checkpointed; 1 not a txfs mount, busy, or\nthe daemon still held BACKING/.txfs/lock 600 s after the unmount."
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
    /// Then the live transactions, oldest first: the process that began
    /// each (a thread's begin) or the `txfs run` that owns it, its uid, age,
    /// bytes written so far and read-set entries (what its commit validates);
    /// in JSON, "transactions". Last, a FAULT line if the mount stopped
    /// acknowledging anything (a failed journal write or sync, a checkpoint
    /// that failed half way: its reason, and whether plain reads go on); in
    /// JSON, "fault" (null while healthy).
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs status /mnt/data\n",
        "  txfs status /mnt/data --json | jq .conflicts\n",
        "  txfs status /mnt/data --watch 1        # one line a second, with rates\n",
        "  txfs status /mnt/data --json --watch 5 # NDJSON, one object every 5 s\n\n",
        "Exit status: 0; 1 if MOUNTPOINT is not a txfs mount, or the mount has a fault\n",
        "(it acknowledges nothing until it is mounted again; --watch goes on).",
    ))]
    Status {
        mountpoint: PathBuf,
        /// One JSON object; with --watch, one a line (NDJSON), each with
        /// its "time" (seconds since the epoch).
        #[arg(long)]
        json: bool,
        /// Print one line every SECONDS (rates, with the time of day in
        /// UTC) until interrupted or until its reader goes.
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
        "Exit status: CMD's own; 127 if CMD was not found, 126 if it could not be\n",
        "run (the reason goes to stderr); 75 if it still conflicted after the\n",
        "retries (nothing of it survived); 70 if txfs itself failed.",
    ))]
    Run {
        /// Reruns after a lost conflict.
        #[arg(long, default_value_t = 3)]
        retries: u32,
        /// The mount (default: $TXFS_MOUNT, or the only txfs mount, or the
        /// one holding the current directory, or the one CMD's absolute
        /// path arguments are in).
        #[arg(long)]
        mount: Option<PathBuf>,
        /// Ordered commit: return once the order is fixed, durable later.
        #[arg(long)]
        ordered: bool,
        /// Run CMD, print what it changed, and abort it all: nothing is
        /// committed, whatever CMD's exit status (which is passed on).
        #[arg(long, conflicts_with = "confirm")]
        dry_run: bool,
        /// After CMD exits 0, print what it changed and commit only on "y"
        /// from the terminal (stdin); anything else aborts it.
        #[arg(long)]
        confirm: bool,
        /// With --confirm: commit without asking (the changes are printed).
        #[arg(long, requires = "confirm")]
        yes: bool,
        #[command(flatten)]
        show: ShowArgs,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Print what the current transaction changed (in a shell under
    /// `txfs run`): per path, created, deleted, modified, renamed, ...
    ///
    /// Lists the caller's own transaction on the mount: run it in a shell
    /// started by `txfs run -- bash`, from any process of such a run, or
    /// from a program's thread inside fs_tx_begin() (system, subprocess).
    /// Listing records nothing: it cannot make the transaction conflict.
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs run -- bash            # then, in that shell, after some changes:\n",
        "  txfs diff                   # one line a path, like git status\n",
        "  txfs diff --diff            # and unified diffs of text files, paged\n",
        "  txfs diff --json | jq '.changes[] | select(.status == \"deleted\") | .path'\n\n",
        "Exit status: 0; 1 if not in a transaction on a txfs mount.",
    ))]
    Diff {
        /// The mount (default: $TXFS_MOUNT, or the only txfs mount, or the
        /// one holding the current directory).
        #[arg(long)]
        mount: Option<PathBuf>,
        #[command(flatten)]
        show: ShowArgs,
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
        "Exit status: 0 recovered; 1 on error (damage before the journal's tail, a journal\n",
        "missing commits the high-water mark .txfs/mark says were durable (see --accept-loss),\n",
        "BACKING in use by a mount, BACKING not a txfs backing: no .txfs/).\n\n",
    ), after_long_help = concat!(
        "Example:\n  txfs recover /srv/data && rsync -a /srv/data/ backup/\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 recovered; 1 on error (damage before the journal's tail, a journal\n",
        "missing commits the high-water mark .txfs/mark says were durable (see --accept-loss),\n",
        "BACKING in use by a mount, BACKING not a txfs backing: no .txfs/).\n\n",
     files_help!()))]
    Recover {
        backing: PathBuf,
        /// Print a progress line to stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
        /// Go on past a journal that lost commits the durable high-water
        /// mark (.txfs/mark) says were durable — truncated, shortened,
        /// replaced or deleted — keeping what survives. What is lost is
        /// logged to stderr and .txfs/daemon.log; data files no surviving
        /// record names are kept in .txfs/lost+found/.
        #[arg(long)]
        accept_loss: bool,
    },
    /// Offline: verify the journal and its references into BACKING;
    /// exits 1 on damage. Changes nothing.
    ///
    /// Reports each journal file's committed records, a torn tail that
    /// recovery will cut, an interrupted checkpoint, and any damage.
    #[command(after_help = concat!(
        "Example:\n  txfs check /srv/data || echo damaged\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 no damage (a torn tail is not damage); 1 damage or error\n",
        "(also: BACKING is not a txfs backing, it has no .txfs/).\n\n",
    ), after_long_help = concat!(
        "Example:\n  txfs check /srv/data || echo damaged\n\n",
        "A progress line goes to stderr when it is a terminal, or with --progress.\n",
        "Exit status: 0 no damage (a torn tail is not damage); 1 damage or error\n",
        "(also: BACKING is not a txfs backing, it has no .txfs/).\n\n",
     files_help!()))]
    Check {
        backing: PathBuf,
        /// Print a progress line to stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell) on stdout.
    #[command(after_help = concat!(
        "Examples:\n",
        "  txfs completions bash > /usr/share/bash-completion/completions/txfs\n",
        "  txfs completions zsh > /usr/share/zsh/vendor-completions/_txfs\n",
        "  txfs completions fish > /usr/share/fish/vendor_completions.d/txfs.fish\n\n",
        "Exit status: 0; 1 if stdout cannot be written.",
    ))]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// For packagers: the man page txfs(1) in roff on stdout; with DIR,
    /// txfs.1 and one txfs-SUBCOMMAND.1 per subcommand written there.
    #[command(hide = true, name = "__man")]
    Man { dir: Option<PathBuf> },
    /// The daemon's helper (not for users): looks up the NUL-separated
    /// paths below MOUNTPOINT read from stdin, as a process in no
    /// transaction, until stdin ends. See `healer` in fuse/mod.rs.
    #[command(hide = true, name = "__heal")]
    Heal { mountpoint: PathBuf },
}

/// How `txfs diff`, `run --dry-run` and `run --confirm` print a change set.
#[derive(clap::Args)]
struct ShowArgs {
    /// One JSON document (schema: docs/CHANGES.md) instead of lines.
    #[arg(long)]
    json: bool,
    /// Also unified diffs of changed text files (binary ones summarized).
    #[arg(long)]
    diff: bool,
    /// Also every path below a created or deleted directory.
    #[arg(long)]
    all: bool,
}

impl From<ShowArgs> for changes::Show {
    fn from(a: ShowArgs) -> Self {
        changes::Show { json: a.json, diff: a.diff, all: a.all }
    }
}

/// Parses the command line (also as `mount.fuse.txfs`, which `mount -t
/// fuse.txfs BACKING MNT -o opts` runs) and runs the subcommand.
pub fn main() -> ExitCode {
    // `mount -t fuse.txfs BACKING MNT -o opts` runs `mount.fuse.txfs BACKING MNT -o opts`.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    // And mount.fuse3 (`mount -t fuse.txfs` without the mount.fuse.txfs
    // link, or `txfs#BACKING` in fstab) runs `txfs BACKING MNT -o opts`.
    let first = std::env::args_os().nth(1);
    let subcommands =
        ["mount", "umount", "status", "run", "diff", "recover", "check", "completions", "help", "__man", "__heal"];
    let helper_form =
        first.as_ref().is_some_and(|a| !a.as_bytes().starts_with(b"-") && !subcommands.iter().any(|s| a == *s))
            && std::env::args_os().len() >= 3;
    let cli = if helper_form || Path::new(&argv0).file_name().is_some_and(|n| n == "mount.fuse.txfs") {
        let mut args: Vec<std::ffi::OsString> = vec!["txfs".into(), "mount".into()];
        args.extend(std::env::args_os().skip(1));
        Cli::parse_from(args)
    } else {
        Cli::parse()
    };
    let r = match cli.cmd {
        Cmd::Mount { backing, mountpoint, foreground, options, .. } => {
            mount::mount(&backing, &mountpoint, foreground, &options)
        }
        Cmd::Umount { mountpoint } => umount::umount(&mountpoint),
        Cmd::Status { mountpoint, json, watch } => status::status(&mountpoint, json, watch),
        Cmd::Run { retries, mount, ordered, dry_run, confirm, yes, show, cmd } => {
            let show = show.into();
            let review = match (dry_run, confirm) {
                (true, _) => run::Review::DryRun(show),
                (_, true) => run::Review::Confirm { show, yes },
                _ => run::Review::None,
            };
            return run::run(mount.as_deref(), retries, ordered, review, &cmd);
        }
        Cmd::Diff { mount, show } => changes::diff_cmd(mount.as_deref(), show.into()),
        Cmd::Recover { backing, progress, accept_loss } => recover::recover(&backing, progress, accept_loss),
        Cmd::Check { backing, progress } => match check::check(&backing, progress) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Cmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut visible_command(), "txfs", &mut out);
            write_stdout(&out)
        }
        Cmd::Man { dir } => man(dir.as_deref()),
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

/// `bytes` on stdout; a reader that went (`| head`) is no error.
fn write_stdout(bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

/// The argument grammar without its hidden subcommands (`__heal`,
/// `__man`), which neither completions nor man pages offer.
fn visible_command() -> clap::Command {
    let full = Cli::command();
    let visible: Vec<clap::Command> = full.get_subcommands().filter(|c| !c.is_hide_set()).cloned().collect();
    let mut cmd =
        clap::Command::new("txfs").version(env!("CARGO_PKG_VERSION")).subcommand_required(true).subcommands(visible);
    if let Some(a) = full.get_about() {
        cmd = cmd.about(a.clone());
    }
    cmd
}

/// `txfs __man [DIR]`: the man pages, generated from the argument grammar.
fn man(dir: Option<&Path>) -> Result<(), String> {
    let cmd = visible_command();
    match dir {
        Some(d) => clap_mangen::generate_to(cmd, d).map_err(|e| format!("{}: {e}", d.display())),
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out).map_err(|e| e.to_string())?;
            write_stdout(&out)
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
    // Colours only on a terminal: daemon.log and journald get plain text.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi);
    // Started by `txfs mount` (no -f): stderr is BACKING/.txfs/daemon.log.
    let _ = match std::env::var_os(DAEMON_LOG) {
        Some(path) => fmt.with_writer(RotatingLog::new(PathBuf::from(path))).try_init(),
        None => fmt.with_writer(std::io::stderr).try_init(),
    };
}

/// The environment variable by which `txfs mount` tells its daemon that
/// stderr is this log file (to be rotated).
pub(crate) const DAEMON_LOG: &str = "TXFS_DAEMON_LOG";

/// How large daemon.log grows before it becomes daemon.log.1 (the one
/// before is dropped): `$TXFS_LOG_MAX_BYTES`, else 16 MiB.
pub(crate) fn log_cap() -> u64 {
    std::env::var("TXFS_LOG_MAX_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(16 << 20).max(1024)
}

/// stderr, which is daemon.log: past [`log_cap`] bytes, the file becomes
/// daemon.log.1 and a new daemon.log (0600) takes over descriptor 2 (so
/// that anything else written to stderr follows).
pub(crate) struct RotatingLog {
    path: PathBuf,
    cap: u64,
    /// Bytes in the current file.
    size: parking_lot::Mutex<u64>,
}

impl RotatingLog {
    fn new(path: PathBuf) -> RotatingLog {
        let size = std::fs::metadata("/proc/self/fd/2").map(|m| m.len()).unwrap_or(0);
        RotatingLog { path, cap: log_cap(), size: parking_lot::Mutex::new(size) }
    }
}

/// Renames `path` to `path.1` (replacing it) and opens a new one, 0600.
pub(crate) fn rotate_log(path: &Path) -> std::io::Result<std::fs::File> {
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    std::fs::rename(path, &old)?;
    mount::open_log(path)
}

/// One write to the log, under the size lock.
pub(crate) struct LogWrite<'a>(&'a RotatingLog);

impl std::io::Write for LogWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut size = self.0.size.lock();
        std::io::stderr().write_all(buf)?;
        *size += buf.len() as u64;
        if *size >= self.0.cap {
            if let Ok(f) = rotate_log(&self.0.path) {
                // SAFETY: dup2 of a descriptor we own onto stderr.
                unsafe { libc::dup2(f.as_raw_fd(), 2) };
                *size = 0;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RotatingLog {
    type Writer = LogWrite<'a>;
    fn make_writer(&'a self) -> LogWrite<'a> {
        LogWrite(self)
    }
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
        let source = format!("txfs:{}", backing.display());
        let at = crate::attribution::mountinfo::entries(&crate::attribution::mountinfo::own())
            .find(|m| m.source == source)
            .map(|m| m.point);
        return Err(match at {
            Some(p) => format!("{} is in use: mounted at {}", backing.display(), p.display()),
            None => format!("{} is in use (by a daemon starting or stopping, or txfs recover)", backing.display()),
        });
    }
    Ok(f)
}

/// The pids holding a flock on `file`, from /proc/locks (lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF`, device in hex).
pub(crate) fn lock_holders(file: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(file) else { return Vec::new() };
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(md.dev() as libc::dev_t),
        libc::minor(md.dev() as libc::dev_t),
        md.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Held locks only, not waiters ("->").
            if f.get(1) != Some(&"FLOCK") || f.get(5) != Some(&want.as_str()) {
                return None;
            }
            f.get(4)?.parse().ok()
        })
        .collect()
}

/// Refuses a directory that holds no txfs state (no `.txfs/`): `check`
/// and `recover` of a wrong path must not succeed silently, nor create it.
pub(crate) fn require_backing(backing: &Path) -> Result<(), String> {
    if !backing.is_dir() {
        return Err(format!("{}: not a directory", backing.display()));
    }
    if !backing.join(txfs_engine::META_DIR).is_dir() {
        return Err(format!(
            "{}: not a txfs backing directory (it has no {}/; txfs mount makes one)",
            backing.display(),
            txfs_engine::META_DIR
        ));
    }
    Ok(())
}

pub(crate) fn open_engine(backing: &Path, opts: Options) -> Result<Engine, String> {
    let fs = RealFs::open(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
    Engine::open(Arc::new(fs), opts).map_err(|e| format!("{}: {e}", backing.display()))
}
