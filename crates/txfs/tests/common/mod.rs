//! Harness of the real-mount integration tests: a [`Mount`] guard that runs
//! `txfs mount BACKING MNT -f` over temporary directories and always tears
//! the mount down (even when the test panics), the transaction ioctls for the
//! calling thread, and a Python "agent" process that acts from outside the
//! test's transactions while holding file descriptors.
//!
//! Robustness: a FUSE mount left behind (a killed test run) would break what
//! comes after it, so the first mount of each test binary lazily unmounts
//! dead txfs mounts left under our temp prefix, every mount has a watchdog
//! that kills its daemon (which aborts the FUSE connection, so no syscall of
//! the test hangs forever) when the test overruns, and every test has its own
//! backing directory and mount point.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

pub const TXFS: &str = env!("CARGO_BIN_EXE_txfs");

/// Prefix of every temp directory these tests make (see [`sweep_stale_mounts`]).
pub const PREFIX: &str = "txfs-it-";

/// How long one mount may live before the watchdog kills its daemon
/// (unless the test chose another time: [`Mount::with_watchdog`]). It
/// covers a whole test, so it is far from what a healthy test takes even
/// on a loaded machine: only a hang reaches it.
pub const WATCHDOG: Duration = Duration::from_secs(300);

// The ioctls of clients/c/txfs.h.
pub const IOC_BEGIN: u32 = 0x4008_e701;
pub const IOC_COMMIT: u32 = 0x4008_e702;
pub const IOC_ABORT: u32 = 0x4008_e703;
pub const IOC_SYNC: u32 = 0x4008_e704;
pub const IOC_STATUS: u32 = 0x8040_e706;
pub const COMMIT_ORDERED: u32 = 1;

/// The errno of an `io::Result`, or a panic naming what succeeded.
#[track_caller]
pub fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// Asserts that `r` failed with `want`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected errno {} ({}), got Ok({v:?})", want, errname(want)),
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(want), "{what}: expected errno {} ({}), got {e}", want, errname(want))
        }
    }
}

pub fn errname(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a child with a deadline; kills it when the deadline passes
/// (and then waits at most 5 s more: a process stuck in a dead FUSE request
/// may not die until its connection is aborted).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let reaped = Instant::now() + Duration::from_secs(5);
            while Instant::now() < reaped {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The FUSE connection number (the minor device number) of a mount point.
fn fuse_conn(point: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mp = f.nth(1)?;
        (Path::new(mp) == point).then(|| dev.split_once(':')?.1.parse().ok()).flatten()
    })
}

/// Aborts FUSE connection `conn` through fusectl (mounting fusectl at
/// /sys/fs/fuse/connections if needed): every request waiting on it fails,
/// even when the daemon is stuck in the kernel and cannot be killed.
pub fn abort_fuse_conn(conn: u32) -> bool {
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(conn.to_string()).exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    std::fs::write(dir.join(conn.to_string()).join("abort"), "1").is_ok()
}

/// Mount points (field 5 of /proc/self/mountinfo) of txfs mounts.
fn txfs_mounts() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let ours = fstype == "fuse.txfs" || post.split(' ').nth(1).is_some_and(|s| s.starts_with("txfs:"));
            let point = pre.split(' ').nth(4)?;
            ours.then(|| PathBuf::from(point.replace("\\040", " ")))
        })
        .collect()
}

pub fn is_mounted(point: &Path) -> bool {
    txfs_mounts().iter().any(|m| m == point)
}

fn umount_cmd(point: &Path, lazy: bool) -> bool {
    let mut c = Command::new("umount");
    if lazy {
        c.arg("-l");
    }
    c.arg(point).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Lazily unmounts txfs mounts under our temp prefix whose daemon is dead
/// (ENOTCONN): leftovers of an earlier, killed test run. Live mounts may be
/// another test binary's, running concurrently: they are left alone.
pub fn sweep_stale_mounts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let tmp = std::env::temp_dir();
        for m in txfs_mounts() {
            let ours =
                m.starts_with(&tmp) && m.components().any(|c| c.as_os_str().to_string_lossy().starts_with(PREFIX));
            if !ours {
                continue;
            }
            if let Err(e) = std::fs::metadata(&m) {
                if e.raw_os_error() == Some(libc::ENOTCONN) {
                    eprintln!("harness: unmounting a stale txfs mount left behind: {}", m.display());
                    umount_cmd(&m, true);
                }
            }
        }
    });
}

/// Each thread of `pid`: its name, state and kernel stack (root only).
pub fn kernel_stacks(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return format!("  (pid {pid} gone)\n") };
    for t in tasks.flatten() {
        let d = t.path();
        let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
        let state = read("status").lines().find(|l| l.starts_with("State:")).unwrap_or("").to_string();
        out += &format!("  {} {} {}\n", t.file_name().to_string_lossy(), read("comm").trim(), state);
        for l in read("stack").lines().take(12) {
            out += &format!("      {l}\n");
        }
    }
    out
}

/// `python3`: the system one if present (it must run as other users too).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A running `txfs mount -f` over temporary BACKING and MNT directories.
pub struct Mount {
    tmp: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    log: PathBuf,
    opts: Vec<String>,
    /// Extra environment of the daemon.
    env: Vec<(String, String)>,
    daemon: Option<Child>,
    daemon_pid: Arc<AtomicI32>,
    /// The FUSE connection number of the current mount (0: none).
    conn: Arc<AtomicU32>,
    ctl: Mutex<Option<Arc<File>>>,
    watchdog: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Mount {
    /// An empty backing directory, mounted.
    pub fn new() -> Mount {
        Mount::start_with(&[], |_| {})
    }

    /// A backing directory filled by `populate` before the mount.
    pub fn with_backing(populate: impl FnOnce(&Path)) -> Mount {
        Mount::start_with(&[], populate)
    }

    /// Mount options (`-o`) and a backing directory filled by `populate`.
    pub fn start_with(opts: &[&str], populate: impl FnOnce(&Path)) -> Mount {
        Mount::start_with_watchdog(opts, WATCHDOG, populate)
    }

    /// An empty backing directory, mounted, for a test that may take longer
    /// than [`WATCHDOG`] (its watchdog fires after `watchdog`).
    pub fn with_watchdog(watchdog: Duration) -> Mount {
        Mount::start_with_watchdog(&[], watchdog, |_| {})
    }

    fn start_with_watchdog(opts: &[&str], watchdog: Duration, populate: impl FnOnce(&Path)) -> Mount {
        sweep_stale_mounts();
        let tmp = tempfile::Builder::new().prefix(PREFIX).tempdir().expect("temp dir");
        // Traversable by other users (permission tests run as nobody).
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        let backing = tmp.path().join("backing");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&backing).expect("backing dir");
        std::fs::create_dir(&mnt).expect("mount point");
        std::fs::set_permissions(&backing, std::fs::Permissions::from_mode(0o755)).expect("chmod backing");
        populate(&backing);
        let log = tmp.path().join("daemon.log");
        let daemon_pid = Arc::new(AtomicI32::new(0));
        let conn = Arc::new(AtomicU32::new(0));
        let (tx, rx) = mpsc::channel::<()>();
        let (wd_pid, wd_conn) = (daemon_pid.clone(), conn.clone());
        let wd_mnt = mnt.clone();
        let watchdog = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(watchdog) {
                let pid = wd_pid.load(Ordering::SeqCst);
                eprintln!(
                    "harness: WATCHDOG: the mount {} lived longer than {watchdog:?} (a hung daemon?): aborting \
                     its FUSE connection and killing its daemon {pid}",
                    wd_mnt.display()
                );
                let c = wd_conn.load(Ordering::SeqCst);
                if c != 0 {
                    abort_fuse_conn(c);
                }
                if pid > 0 {
                    // SAFETY: the pid is our unreaped child (Drop cancels us first).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                umount_cmd(&wd_mnt, true);
            }
        });
        let mut m = Mount {
            tmp,
            backing,
            mnt,
            log,
            opts: opts.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            daemon: None,
            daemon_pid,
            conn,
            ctl: Mutex::new(None),
            watchdog: Some((tx, watchdog)),
        };
        m.start();
        m
    }

    /// Restarts the daemon (unmounted cleanly first) with `key=value` in its
    /// environment.
    pub fn restart_with_env(&mut self, key: &str, value: &str) {
        self.umount_clean();
        self.env.push((key.into(), value.into()));
        self.start();
    }

    /// Starts the daemon again (unmounted cleanly first if it runs) with
    /// these mount options (`-o`) instead of the ones it had.
    pub fn restart_with_opts(&mut self, opts: &[&str]) {
        if self.daemon.is_some() {
            self.umount_clean();
        }
        self.opts = opts.iter().map(|s| s.to_string()).collect();
        self.start();
    }

    /// Forgets the environment given by `restart_with_env` (for the next start).
    pub fn clear_env(&mut self) {
        self.env.clear();
    }

    /// Starts the daemon over the same BACKING and MNT (a remount).
    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "the daemon is already running");
        assert!(!is_mounted(&self.mnt), "{} is still mounted", self.mnt.display());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("daemon log");
        let mut cmd = Command::new(TXFS);
        cmd.arg("mount").arg(&self.backing).arg(&self.mnt).arg("-f");
        for o in &self.opts {
            cmd.arg("-o").arg(o);
        }
        cmd.env("TXFS_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("spawning txfs mount");
        self.daemon_pid.store(child.id() as i32, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if is_mounted(&self.mnt) {
                self.conn.store(fuse_conn(&self.mnt).unwrap_or(0), Ordering::SeqCst);
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("txfs mount exited ({st}) before mounting; log:\n{}", self.log_text());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not show up in mountinfo within 10 s; log:\n{}", self.mnt.display(), self.log_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.daemon = Some(child);
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// A scratch directory outside the mount (in the test's temp dir).
    pub fn scratch(&self) -> PathBuf {
        let p = self.tmp.path().join("scratch");
        std::fs::create_dir_all(&p).expect("scratch dir");
        p
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|c| c.id())
    }

    /// `txfs umount MNT` (checkpoints, unmounts), then waits for the daemon
    /// to exit, and asserts both went well.
    pub fn umount_clean(&mut self) {
        self.ctl.lock().unwrap().take();
        let mut child = self.daemon.take().expect("no daemon running");
        // `txfs umount` waits until the daemon's pid is gone; the daemon is
        // our child, so reap it meanwhile (a zombie still answers kill 0).
        let mut um = Command::new(TXFS)
            .arg("umount")
            .arg(&self.mnt)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("txfs umount");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut st = None;
        let um_st = loop {
            if st.is_none() {
                st = child.try_wait().expect("wait for the daemon");
            }
            if let Some(s) = um.try_wait().expect("wait for txfs umount") {
                break s;
            }
            if Instant::now() >= deadline {
                // Where everyone waits, for the next person to read.
                let diag = format!(
                    "still mounted: {}\ntxfs umount:\n{}\ndaemon:\n{}",
                    is_mounted(&self.mnt),
                    kernel_stacks(um.id()),
                    kernel_stacks(child.id())
                );
                self.abort_connection();
                let _ = child.kill();
                wait_timeout(&mut child, Duration::from_secs(5));
                wait_timeout(&mut um, Duration::from_secs(5));
                let mut um_err = String::new();
                let _ = um.stderr.take().map(|mut e| std::io::Read::read_to_string(&mut e, &mut um_err));
                panic!(
                    "txfs umount did not finish within 30 s (its stderr: {um_err:?})\n{diag}\nlog:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut err = String::new();
        let _ = um.stderr.take().map(|mut e| std::io::Read::read_to_string(&mut e, &mut err));
        assert!(um_st.success(), "txfs umount failed ({um_st}): {err}\nlog:\n{}", self.log_text());
        let st = match st {
            Some(s) => Some(s),
            None => wait_timeout(&mut child, Duration::from_secs(30)),
        };
        self.daemon_pid.store(0, Ordering::SeqCst);
        self.conn.store(0, Ordering::SeqCst);
        assert!(!is_mounted(&self.mnt), "still mounted after txfs umount");
        match st {
            Some(st) => assert!(st.success(), "the daemon exited with {st}; log:\n{}", self.log_text()),
            None => panic!("the daemon did not exit within 30 s of txfs umount; log:\n{}", self.log_text()),
        }
    }

    /// Sends `sig` to the daemon (as Ctrl-C, systemd or a hangup would) and
    /// waits up to `timeout` for it to exit; `None` if it did not.
    pub fn signal_daemon(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        self.ctl.lock().unwrap().take();
        let mut child = self.daemon.take().expect("no daemon running");
        // SAFETY: our child, not reaped yet.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = wait_timeout(&mut child, timeout);
        self.daemon_pid.store(0, Ordering::SeqCst);
        if st.is_some() {
            self.conn.store(0, Ordering::SeqCst);
        }
        st
    }

    /// SIGKILLs the daemon (a crash) and detaches the dead mount (`umount -l`).
    pub fn kill_daemon(&mut self) {
        self.ctl.lock().unwrap().take();
        let mut child = self.daemon.take().expect("no daemon running");
        let _ = child.kill(); // it may be dead already (see `sigkill`)
        if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
            // Stuck in the kernel (a deadlocked request): abort the connection.
            self.abort_connection();
            assert!(wait_timeout(&mut child, Duration::from_secs(5)).is_some(), "the daemon cannot be killed");
        }
        self.daemon_pid.store(0, Ordering::SeqCst);
        self.conn.store(0, Ordering::SeqCst);
        if is_mounted(&self.mnt) {
            assert!(umount_cmd(&self.mnt, true), "umount -l {} failed", self.mnt.display());
        }
        assert!(!is_mounted(&self.mnt));
    }

    /// Aborts this mount's FUSE connection (for a test that found the
    /// daemon hung): every waiting request fails with ENOTCONN.
    pub fn abort_connection(&self) -> bool {
        let c = self.conn.load(Ordering::SeqCst);
        c != 0 && abort_fuse_conn(c)
    }

    /// SIGKILLs the daemon from any thread; `kill_daemon` then cleans up.
    pub fn sigkill(&self) {
        let pid = self.daemon_pid.load(Ordering::SeqCst);
        assert!(pid > 0, "no daemon running");
        // SAFETY: our child, not reaped yet (only `&mut self` methods reap).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    /// A file descriptor of the mount root for the ioctls, opened once (so
    /// that opening it does not happen inside a transaction).
    fn ctl_file(&self) -> std::io::Result<Arc<File>> {
        let mut g = self.ctl.lock().unwrap();
        if g.is_none() {
            *g = Some(Arc::new(File::open(&self.mnt)?));
        }
        Ok(g.as_ref().unwrap().clone())
    }

    fn ioctl(&self, cmd: u32, flags: u32) -> std::io::Result<()> {
        let arg: [u32; 2] = [flags, 0];
        let f = self.ctl_file()?;
        // SAFETY: the _IOW commands read 8 bytes from `arg`.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg.as_ptr()) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Any ioctl of the wire protocol with an argument buffer (read and
    /// written by the kernel per the number's direction bits and size).
    pub fn ioctl_buf(&self, cmd: u32, buf: &mut [u8]) -> std::io::Result<()> {
        assert_eq!(buf.len(), ((cmd >> 16) & 0x3fff) as usize, "the size the ioctl number encodes");
        let f = self.ctl_file()?;
        // SAFETY: the buffer is as large as the number says.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Begins a transaction of the calling thread.
    pub fn begin(&self) -> std::io::Result<()> {
        self.ioctl(IOC_BEGIN, 0)
    }

    /// Durable commit of the calling thread's transaction.
    pub fn commit(&self) -> std::io::Result<()> {
        self.ioctl(IOC_COMMIT, 0)
    }

    pub fn commit_ordered(&self) -> std::io::Result<()> {
        self.ioctl(IOC_COMMIT, COMMIT_ORDERED)
    }

    pub fn abort(&self) -> std::io::Result<()> {
        self.ioctl(IOC_ABORT, 0)
    }

    pub fn sync(&self) -> std::io::Result<()> {
        self.ioctl(IOC_SYNC, 0)
    }

    /// `txfs status MNT --json`.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(TXFS).arg("status").arg(&self.mnt).arg("--json").output().expect("txfs status");
        assert!(out.status.success(), "txfs status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("txfs status --json prints JSON")
    }

    pub fn live_txs(&self) -> u64 {
        self.status()["live_txs"].as_u64().expect("live_txs")
    }

    /// A `txfs` command (`txfs run --mount MNT ...` etc.) with MNT as cwd.
    pub fn txfs(&self) -> Command {
        let mut c = Command::new(TXFS);
        c.current_dir(&self.mnt).env("TXFS_MOUNT", &self.mnt);
        c
    }

    /// `txfs run --mount MNT [args] -- CMD...` as a Command (cwd MNT).
    pub fn run_cmd(&self, args: &[&str], cmd: &[&str]) -> Command {
        let mut c = self.txfs();
        c.arg("run").arg("--mount").arg(&self.mnt).args(args).arg("--").args(cmd);
        c
    }

    /// `sh -c SCRIPT` in MNT, not in any transaction.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("sh").arg("-c").arg(script).current_dir(&self.mnt).output().expect("sh")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- txfs daemon log ({}) ----\n{}---- end of log ----", self.log.display(), self.log_text());
        }
        if let Some((tx, h)) = self.watchdog.take() {
            drop(tx);
            let _ = h.join();
        }
        self.ctl.lock().map(|mut g| g.take()).ok();
        if is_mounted(&self.mnt) && !umount_cmd(&self.mnt, false) {
            umount_cmd(&self.mnt, true);
        }
        if let Some(mut child) = self.daemon.take() {
            // After a clean umount the daemon checkpoints and exits by itself.
            if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
                eprintln!("harness: the daemon did not exit after umount: aborting its connection, killing it");
                self.abort_connection();
                if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
                    eprintln!("harness: the daemon {} cannot be reaped: leaving it", child.id());
                }
            }
        }
        if is_mounted(&self.mnt) {
            umount_cmd(&self.mnt, true);
        }
    }
}

/// A Python process outside the test's transactions, driven line by line:
/// each command is Python code run in one persistent namespace (with `os`,
/// `M` = the mount point) that may set `out`; the reply is `out` as JSON, or
/// the errno of an OSError. It can hold file descriptors across commands.
pub struct Agent {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

const AGENT: &str = r#"
import os, sys, json, stat, fcntl, struct, traceback
M = sys.argv[1]
g = {'os': os, 'M': M, 'stat': stat, 'fcntl': fcntl, 'struct': struct, 'json': json}
print(json.dumps({'ready': os.getpid()}), flush=True)
for line in sys.stdin:
    code = json.loads(line)
    g['out'] = None
    try:
        exec(code, g)
        r = {'ok': g['out']}
    except OSError as e:
        r = {'errno': e.errno, 'err': str(e)}
    except Exception as e:
        r = {'exc': traceback.format_exc()}
    print(json.dumps(r), flush=True)
"#;

/// The reply of an agent command: `Ok(out)` or `Err(errno)`.
pub type AgentResult = Result<serde_json::Value, i32>;

impl Agent {
    pub fn spawn(mnt: &Path) -> Agent {
        Agent::spawn_cmd(Command::new(python()), mnt)
    }

    /// The agent run by `cmd` (a python3 Command, e.g. with uid/gid set).
    pub fn spawn_cmd(mut cmd: Command, mnt: &Path) -> Agent {
        let mut child = cmd
            .arg("-u")
            .arg("-c")
            .arg(AGENT)
            .arg(mnt)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the python agent");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).expect("agent hello");
        assert!(line.contains("ready"), "agent did not start: {line:?}");
        Agent { child, stdin, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `code`; `Ok(out)` or `Err(errno)`. Panics on other exceptions.
    pub fn run(&mut self, code: &str) -> AgentResult {
        let line = serde_json::to_string(code).unwrap();
        writeln!(self.stdin, "{line}").expect("agent stdin");
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).expect("agent stdout");
        if reply.is_empty() {
            let st = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
            panic!("the agent died ({st}) running {code:?}");
        }
        let v: serde_json::Value =
            serde_json::from_str(&reply).unwrap_or_else(|e| panic!("agent reply {reply:?}: {e} (code: {code})"));
        if let Some(ok) = v.get("ok") {
            return Ok(ok.clone());
        }
        if let Some(e) = v.get("errno") {
            return Err(e.as_i64().unwrap_or(-1) as i32);
        }
        panic!("agent exception running {code:?}:\n{}", v["exc"].as_str().unwrap_or(&reply));
    }

    /// Runs `code` and expects success.
    #[track_caller]
    pub fn ok(&mut self, code: &str) -> serde_json::Value {
        match self.run(code) {
            Ok(v) => v,
            Err(e) => panic!("agent: {code:?} failed with errno {e} ({})", errname(e)),
        }
    }

    /// Runs `code` and expects it to fail with `errno`.
    #[track_caller]
    pub fn fails(&mut self, code: &str, errno: i32) {
        match self.run(code) {
            Ok(v) => panic!("agent: {code:?} should fail with {} but returned {v}", errname(errno)),
            Err(e) => assert_eq!(e, errno, "agent: {code:?}: got {} instead of {}", errname(e), errname(errno)),
        }
    }

    /// Sends `code` (which should end the agent, e.g. `os._exit(n)`) and
    /// waits up to `timeout` for the agent's process — or the command that
    /// runs it, such as `txfs run` — to exit.
    pub fn finish(&mut self, code: &str, timeout: Duration) -> Option<ExitStatus> {
        let line = serde_json::to_string(code).unwrap();
        let _ = writeln!(self.stdin, "{line}");
        wait_timeout(&mut self.child, timeout)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a tree holds, for comparisons: relative path -> description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        target: PathBuf,
    },
    /// A fifo, socket or device: its type (`S_IFMT` bits), mode and device
    /// number (never opened: a fifo would block).
    Special {
        kind: u32,
        mode: u32,
        rdev: u64,
    },
}

/// Every entry under `root` (not following symlinks), skipping `.txfs` at
/// the top level.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").file_name())
            .collect();
        names.sort();
        for n in names {
            if dir == root && n == OsStr::new(".txfs") {
                continue;
            }
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let md = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            let mode = md.mode() & 0o7777;
            if md.file_type().is_symlink() {
                out.insert(rel, Entry::Symlink { target: std::fs::read_link(&p).unwrap() });
            } else if md.is_dir() {
                out.insert(rel, Entry::Dir { mode });
                walk(root, &p, out);
            } else if !md.is_file() {
                out.insert(rel, Entry::Special { kind: md.mode() & libc::S_IFMT, mode, rdev: md.rdev() });
            } else {
                let data = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                out.insert(rel, Entry::File { mode, data });
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Sorted names of a directory.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Asserts a command succeeded, showing its output otherwise; returns stdout.
#[track_caller]
pub fn check_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- raw directory reads (getdents64) ---------------------------------------

/// One getdents64 call on `fd` with a `buf`-byte buffer: the names it gave
/// (without "." and ".."); empty at the end.
pub fn getdents(fd: libc::c_int, buf: usize) -> Vec<String> {
    let mut b = vec![0u8; buf];
    // SAFETY: `b` is writable for `buf` bytes.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, b.as_mut_ptr(), buf) };
    assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < n as usize {
        let reclen = u16::from_ne_bytes([b[at + 16], b[at + 17]]) as usize;
        let name = &b[at + 19..at + reclen];
        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
        let name = String::from_utf8_lossy(name).into_owned();
        if name != "." && name != ".." {
            out.push(name);
        }
        at += reclen;
    }
    out
}

pub fn open_dir(p: &Path) -> libc::c_int {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL in a path");
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {}: {}", p.display(), std::io::Error::last_os_error());
    fd
}

/// Voluntary context switches of the daemon's `/dev/fuse` threads (named
/// `fuser-N`; ring threads are `fuser-ring-…`): each wake-up from a read,
/// or each pause between polls, is one.
pub fn dev_fuse_switches(pid: u32) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Some(k) = comm.trim().strip_prefix("fuser-") else { continue };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let v = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"));
        n += v.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    }
    n
}

/// Who holds a transaction in tests that run the same case both ways: a
/// thread transaction (an agent that sent BEGIN) or a `txfs run` without a
/// view (`TXFS_RUN_VIEW=0`, what a non-root user gets).
#[derive(Clone, Copy, Debug)]
pub enum Side {
    Thread,
    NonViewRun,
}

pub const SIDES: [Side; 2] = [Side::Thread, Side::NonViewRun];

/// An agent in a transaction of `side` on `m`.
pub fn agent_in_transaction(m: &Mount, side: Side) -> Agent {
    match side {
        Side::Thread => {
            let mut a = Agent::spawn(m.mnt());
            a.ok(&format!("root = os.open(M, os.O_RDONLY); fcntl.ioctl(root, {IOC_BEGIN}, bytes(8))"));
            a
        }
        Side::NonViewRun => {
            let mut run = m.run_cmd(&[], &[python()]);
            run.env("TXFS_RUN_VIEW", "0");
            Agent::spawn_cmd(run, m.mnt())
        }
    }
}

/// Ends the transaction of an agent from [`agent_in_transaction`]: commit
/// or abort (`txfs run` commits when its command exits 0).
pub fn end_transaction(mut a: Agent, side: Side, commit: bool) {
    match side {
        Side::Thread => {
            let cmd = if commit { IOC_COMMIT } else { IOC_ABORT };
            a.ok(&format!("fcntl.ioctl(root, {cmd}, bytes(8))"));
        }
        Side::NonViewRun => {
            let code = if commit { 0 } else { 1 };
            let st = a.finish(&format!("os._exit({code})"), Duration::from_secs(60)).expect("txfs run did not end");
            assert_eq!(st.code(), Some(code), "txfs run's exit");
        }
    }
}
