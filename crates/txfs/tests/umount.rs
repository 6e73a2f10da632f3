//! `txfs umount` and the descriptors libtxfs keeps between transactions.
//!
//! libtxfs (clients/c/txfs.c) keeps, per thread, the descriptor of the
//! mount root its last transaction used, opened `O_RDONLY|O_DIRECTORY|
//! O_DSYNC` as a mark. Such descriptors keep the mount busy; `txfs umount`
//! detaches the mount when they are all that hold it and no transaction is
//! live, and refuses (naming the holders) otherwise. The agents here hold
//! exactly such a descriptor.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Python for the agent: keep a marked descriptor of the mount root in `K`.
const KEEP: &str = "K = os.open(M, os.O_RDONLY | os.O_DIRECTORY | os.O_DSYNC)";

fn ioc(cmd: u32) -> String {
    format!("fcntl.ioctl(K, {cmd:#x}, struct.pack('II', 0, 0))")
}

/// `txfs umount MNT`: (success, stderr).
fn txfs_umount(m: &Mount) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_txfs")).arg("umount").arg(m.mnt()).output().expect("txfs umount");
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Story: a mail client linked with libtxfs commits, then sits idle with its
/// kept descriptor; the admin's `txfs umount` must still unmount (after the
/// checkpoint), and the client's next transaction must fail cleanly, not
/// reach a daemon that is gone.
#[test]
fn umount_detaches_a_mount_held_only_by_kept_descriptors() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok(&ioc(IOC_BEGIN));
    agent.ok("open(M + '/mail', 'w').write('kept')");
    agent.ok(&ioc(IOC_COMMIT));
    m.umount_clean();
    assert_eq!(std::fs::read_to_string(m.backing().join("mail")).unwrap(), "kept", "committed and checkpointed");
    match agent.run(&ioc(IOC_BEGIN)) {
        Err(e) => assert!(
            [libc::ENOTCONN, libc::ECONNABORTED, libc::ENODEV].contains(&e),
            "a begin on the kept descriptor of the gone mount: {}",
            errname(e)
        ),
        Ok(v) => panic!("a begin on the kept descriptor of an unmounted txfs succeeded ({v})"),
    }
}

/// Story: someone has a shell in the mount. `txfs umount` must refuse as
/// umount(8) does, and say who holds it, although a kept descriptor is
/// there too.
#[test]
fn umount_refuses_while_a_process_works_in_the_mount() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok("os.chdir(M)");
    let (ok, err) = txfs_umount(&m);
    assert!(!ok, "txfs umount detached a mount that a process works in");
    assert!(is_mounted(m.mnt()), "still mounted after the refusal");
    let who = format!("pid {}", agent.pid());
    assert!(err.contains("busy") && err.contains(&who) && err.contains("cwd"), "the error names the holder: {err}");
    agent.ok("os.chdir('/')");
    m.umount_clean();
}

/// Story: a thread is inside a transaction (its descriptor carries the same
/// mark). Unmounting then would abort work in progress: refuse, and succeed
/// once it committed.
#[test]
fn umount_refuses_while_a_transaction_is_live() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok(&ioc(IOC_BEGIN));
    agent.ok("open(M + '/half', 'w').write('x')");
    let (ok, err) = txfs_umount(&m);
    assert!(!ok, "txfs umount detached a mount with a live transaction");
    assert!(err.contains("live transaction"), "the error says why: {err}");
    assert!(is_mounted(m.mnt()));
    agent.ok(&ioc(IOC_COMMIT));
    m.umount_clean();
    assert_eq!(std::fs::read_to_string(m.backing().join("half")).unwrap(), "x");
}

/// Story: the mount is also bind-mounted elsewhere (a container's view of
/// it). Detaching and ending the connection would cut off the other mount
/// too: refuse and say so.
#[test]
fn umount_refuses_when_the_mount_is_also_mounted_elsewhere() {
    let mut m = Mount::new();
    let other = m.scratch().join("bind");
    std::fs::create_dir_all(&other).unwrap();
    let st = Command::new("mount").arg("--bind").arg(m.mnt()).arg(&other).status().unwrap();
    assert!(st.success(), "mount --bind");
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    let (ok, err) = txfs_umount(&m);
    let _ = Command::new("umount").arg(&other).status();
    assert!(!ok, "txfs umount detached a mount that is bind-mounted elsewhere");
    assert!(err.contains("also mounted at"), "the error says where: {err}");
    m.umount_clean();
}

/// Whether process `pid` is sleeping in nanosleep or clock_nanosleep.
fn in_nanosleep(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| {
        let nr = s.split_whitespace().next().and_then(|n| n.parse::<libc::c_long>().ok());
        nr.is_some_and(|n| n == libc::SYS_nanosleep || n == libc::SYS_clock_nanosleep)
    })
}

/// Story: between `txfs umount`'s look at the holders and its detach, a
/// program opens a file in the mount and goes on writing it. Ending the
/// connection then would fail its writes (ENOTCONN) and tear its file:
/// the mount is detached but left alive until the program lets go.
#[test]
fn a_file_opened_during_the_umount_is_not_cut_off() {
    let m = Mount::new();
    let mut idle = Agent::spawn(m.mnt());
    idle.ok(KEEP);
    let mut writer = Agent::spawn(m.mnt());
    let um = Command::new(env!("CARGO_BIN_EXE_txfs"))
        .arg("umount")
        .arg(m.mnt())
        .env("TXFS_TEST_UMOUNT_PAUSE_MS", "5000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The window: txfs umount has looked at the holders and sleeps before
    // its detach (its only sleep when no transaction is live).
    let paused = wait_until(std::time::Duration::from_secs(60), || in_nanosleep(um.id()));
    assert!(paused, "txfs umount never reached its pause before the detach");
    writer.ok("W = open(M + '/log', 'w'); W.write('a'); W.flush()");
    let out = um.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "txfs umount: {err}");
    assert!(!is_mounted(m.mnt()), "detached");
    assert!(err.contains("in use again"), "says the mount lives on: {err}");
    writer.ok("W.write('b\\n'); W.close()");
    drop(writer);
    drop(idle);
    let b = m.backing().to_path_buf();
    assert!(
        wait_until(std::time::Duration::from_secs(60), || std::fs::read_to_string(b.join("log"))
            .is_ok_and(|s| s == "ab\n")),
        "the writer's file, whole, once everybody let go: {:?}",
        std::fs::read_to_string(b.join("log"))
    );
}

/// Story: an administrator stops the daemon the way every FUSE file system
/// is stopped: Ctrl-C on `txfs mount -f`, `systemctl stop` (SIGTERM), a
/// closed terminal (SIGHUP). Like libfuse's file systems it must unmount,
/// checkpoint and exit 0, leaving no dead mount ("Transport endpoint is
/// not connected") behind.
#[test]
fn a_stop_signal_unmounts_checkpoints_and_exits_0() {
    let mut m = Mount::new();
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        // A committed transaction: it waits in the journal until a checkpoint.
        m.begin().unwrap();
        std::fs::write(m.path("f"), name).unwrap();
        m.commit().unwrap();
        let st = m.signal_daemon(sig, std::time::Duration::from_secs(30));
        let st = st.unwrap_or_else(|| panic!("the daemon did not exit within 30 s of {name}"));
        assert!(st.success(), "{name}: the daemon exited with {st}; log:\n{}", m.log_text());
        assert!(!is_mounted(m.mnt()), "{name}: still mounted");
        let md = std::fs::metadata(m.mnt());
        assert!(md.is_ok(), "{name}: the mount point is not a plain directory again: {md:?}");
        assert_eq!(std::fs::read_to_string(m.backing().join("f")).unwrap(), name, "{name}: checkpointed");
        assert!(!m.backing().join(".txfs/daemon.pid").exists(), "{name}: daemon.pid left behind");
        m.start();
    }
}

/// Story: someone's shell sits in the mount when systemd stops the daemon.
/// libfuse's file systems go anyway (the shell then gets ENOTCONN); so does
/// txfs, after a short grace, and still checkpoints and exits 0.
#[test]
fn a_stop_signal_ends_the_mount_even_while_a_process_holds_it() {
    let mut m = Mount::new();
    std::fs::write(m.path("g"), "kept").unwrap();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok("os.chdir(M)");
    let st = m.signal_daemon(libc::SIGTERM, std::time::Duration::from_secs(30));
    let st = st.expect("the daemon did not exit within 30 s of SIGTERM while a process held the mount");
    assert!(st.success(), "the daemon exited with {st}; log:\n{}", m.log_text());
    assert!(!is_mounted(m.mnt()), "still mounted");
    assert_eq!(std::fs::read_to_string(m.backing().join("g")).unwrap(), "kept", "checkpointed");
    let e = agent.run("os.listdir('.')");
    assert!(e.is_err(), "the holder still reads a mount whose daemon exited: {e:?}");
}

/// A backing directory and a mount point for `txfs mount` in the
/// background (the daemon is not the test's child); on drop, whatever is
/// mounted there is detached and the daemon killed.
struct Background {
    tmp: tempfile::TempDir,
}

impl Background {
    fn new() -> Background {
        sweep_stale_mounts();
        let tmp = tempfile::Builder::new().prefix(PREFIX).tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("b")).unwrap();
        std::fs::create_dir(tmp.path().join("m")).unwrap();
        Background { tmp }
    }
    fn b(&self) -> PathBuf {
        self.tmp.path().join("b")
    }
    fn m(&self) -> PathBuf {
        self.tmp.path().join("m")
    }
    fn txfs(&self, args: &[&str]) -> std::process::Output {
        let mut c = Command::new(TXFS);
        c.args(args).env("TXFS_LOG", "info");
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let st = wait_timeout(&mut child, Duration::from_secs(60));
        let out = child.wait_with_output().unwrap();
        assert!(st.is_some(), "txfs {args:?} did not finish within 60 s: {}", String::from_utf8_lossy(&out.stderr));
        out
    }
    fn mount(&self) -> std::process::Output {
        let (b, m) = (self.b(), self.m());
        self.txfs(&["mount", b.to_str().unwrap(), m.to_str().unwrap()])
    }
    fn daemon_pid(&self) -> i32 {
        let p = std::fs::read_to_string(self.b().join(".txfs/daemon.pid")).expect("daemon.pid");
        p.trim().parse().unwrap()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(p) = std::fs::read_to_string(self.b().join(".txfs/daemon.pid")) {
            if let Ok(pid) = p.trim().parse::<i32>() {
                // SAFETY: plain kill(2); SIGCONT first in case a test stopped it.
                unsafe {
                    libc::kill(pid, libc::SIGCONT);
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
        let m = self.m();
        wait_until(Duration::from_secs(10), || !is_mounted(&m));
        if is_mounted(&m) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

fn dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
}

/// Story: the daemon was killed (OOM killer, kill -9): the mount point is
/// left answering ENOTCONN. `txfs mount` (and so systemd's restart) must
/// clear it and serve again, reporting success only once its own daemon
/// answers — not because a line for the mount point is in mountinfo.
/// Then again at once after a kill, as systemd's restart would.
#[test]
fn mount_over_a_dead_mount_clears_it_and_serves() {
    let t = Background::new();
    let out = t.mount();
    assert!(out.status.success(), "first mount: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(t.m().join("f"), "before").unwrap();
    let pid = t.daemon_pid();
    // SAFETY: plain kill(2) of the daemon.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || dead(pid)), "the daemon did not die");
    // (ECANCELED while the kernel tears down the dead daemon's io_uring.)
    let m = t.m();
    let enotconn = || std::fs::metadata(&m).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN);
    assert!(wait_until(Duration::from_secs(10), enotconn), "a dead mount: {:?}", std::fs::metadata(&m));
    let out = t.mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mount over the dead mount: {err}");
    assert!(err.contains("dead txfs mount"), "says it cleared the dead mount: {err}");
    let pid2 = t.daemon_pid();
    assert_ne!(pid, pid2, "a new daemon");
    assert_eq!(std::fs::read_to_string(t.m().join("f")).unwrap(), "before", "served by the new daemon");
    // SAFETY: as above.
    unsafe { libc::kill(pid2, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || dead(pid2)), "the daemon did not die");
    let out = t.mount();
    assert!(out.status.success(), "mount right after a kill: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(t.m().join("f")).unwrap(), "before", "served again");
    let out = t.txfs(&["umount", t.m().to_str().unwrap()]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&t.m()));
}

/// Story: a second `txfs mount` of another backing on a mounted txfs mount
/// point would hide the first (and one `txfs umount` would then remove
/// both): refused, saying what is mounted there.
#[test]
fn mount_refuses_to_stack_on_a_txfs_mount() {
    let t = Background::new();
    assert!(t.mount().status.success());
    let other = t.tmp.path().join("b2");
    std::fs::create_dir(&other).unwrap();
    let out = t.txfs(&["mount", other.to_str().unwrap(), t.m().to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stacked a txfs mount on a txfs mount");
    assert!(err.contains("txfs mount already") && err.contains("txfs umount"), "says why and how: {err}");
    let tops = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let m = t.m();
    let n = tops.lines().filter(|l| l.split(' ').nth(4) == m.to_str()).count();
    assert_eq!(n, 1, "one mount at the mount point");
    assert!(t.txfs(&["umount", m.to_str().unwrap()]).status.success());
}

/// Story: daemon.pid names a process that is no daemon (a stale file, a
/// reused pid). `txfs umount` waits for the daemon that holds the backing,
/// not for whatever process has that pid.
#[test]
fn umount_is_not_fooled_by_a_stale_pid_file() {
    let mut m = Mount::new();
    std::fs::write(m.path("f"), "x").unwrap();
    let mut other = Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(m.backing().join(".txfs/daemon.pid"), format!("{}\n", other.id())).unwrap();
    m.umount_clean();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(std::fs::read_to_string(m.backing().join("f")).unwrap(), "x");
}

/// Story: the daemon does not finish its final checkpoint (stopped, or
/// hung). `txfs umount` must not exit 0 as if BACKING held the committed
/// state: it gives up with an error naming the daemon.
#[test]
fn umount_exits_nonzero_when_it_gives_up_on_the_daemon() {
    let mut m = Mount::new();
    let pid = m.daemon_pid().unwrap() as i32;
    // SAFETY: plain kill(2) of our child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let mut um = Command::new(TXFS)
        .arg("umount")
        .arg(m.mnt())
        .env("TXFS_TEST_UMOUNT_WAIT_S", "3")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_timeout(&mut um, Duration::from_secs(60));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let out = um.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let st = st.expect("txfs umount still waits for a stopped daemon after 60 s");
    assert!(!st.success(), "txfs umount exited 0 without the daemon's checkpoint: {err}");
    assert!(err.contains("gave up") && err.contains(&format!("pid {pid}")), "says why: {err}");
    let st = m.signal_daemon(0, Duration::from_secs(30)).expect("the daemon exits once continued");
    assert!(st.success(), "the daemon: {st}");
}

/// Story: a typo or a bad idea in the mount command. A mount point equal
/// to, inside or above the backing directory makes the daemon serve its own
/// mount (accesses hang until the connection is aborted) or hides the
/// backing; a backing inside a txfs mount puts a journal on a journal. Each
/// is refused before anything is mounted, saying what is wrong.
#[test]
fn mount_refuses_dangerous_layouts() {
    let t = Background::new();
    let (b, m) = (t.b(), t.m());
    std::fs::create_dir(b.join("sub")).unwrap();
    let cases = [
        (b.clone(), b.clone(), "is the backing directory"),
        (b.clone(), b.join("sub"), "inside the backing directory"),
        (b.join("sub"), b.clone(), "inside the mount point"),
    ];
    for (backing, point, says) in cases {
        let out = t.txfs(&["mount", backing.to_str().unwrap(), point.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mounted {} at {}", backing.display(), point.display());
        assert!(err.contains(says), "{} at {}: says why: {err}", backing.display(), point.display());
        assert!(!is_mounted(&point), "{} got mounted", point.display());
    }
    assert!(t.mount().status.success());
    std::fs::create_dir(m.join("inner")).unwrap();
    let m2 = t.tmp.path().join("m2");
    std::fs::create_dir(&m2).unwrap();
    let out = t.txfs(&["mount", "-f", m.join("inner").to_str().unwrap(), m2.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted a backing inside a txfs mount");
    assert!(err.contains("inside the txfs mount"), "says why: {err}");
    assert!(!is_mounted(&m2));
    assert!(t.txfs(&["umount", m.to_str().unwrap()]).status.success());
}

/// Story: `txfs check /srv/dta` (a typo) must not report a healthy
/// backing, and `txfs recover` of it must not make it one.
#[test]
fn check_and_recover_refuse_a_directory_that_is_not_a_backing() {
    let t = Background::new();
    let plain = t.b();
    std::fs::write(plain.join("file"), "x").unwrap();
    for sub in ["check", "recover"] {
        let out = t.txfs(&[sub, plain.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "txfs {sub} of a plain directory exited 0");
        assert!(err.contains("not a txfs backing"), "txfs {sub} says why: {err}");
        assert!(!plain.join(".txfs").exists(), "txfs {sub} created .txfs/");
    }
}

/// Story: an fstab line `BACKING MNT fuse.txfs defaults,nofail,...`. mount(8)
/// runs the helper (`mount.fuse.txfs`, or mount.fuse3's `txfs BACKING MNT
/// -o opts`) with every option of the line: those meant for mount(8)
/// itself are ignored, as sshfs does, and the mount serves; an option
/// nobody knows is still refused, before any daemon starts.
#[test]
fn mount_takes_fstab_options_and_the_mount_helper_form() {
    let t = Background::new();
    let (b, m) = (t.b(), t.m());
    let fstab = "rw,defaults,nofail,noauto,auto,user,users,nouser,_netdev,comment=systemd.automount,\
                 x-systemd.requires-mounts-for=/srv,x-gvfs-hide,relatime";
    let out = t.txfs(&[b.to_str().unwrap(), m.to_str().unwrap(), "-o", fstab]);
    assert!(out.status.success(), "txfs BACKING MNT -o {fstab}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(m.join("f"), "served").unwrap();
    assert!(t.txfs(&["umount", m.to_str().unwrap()]).status.success());
    assert_eq!(std::fs::read_to_string(b.join("f")).unwrap(), "served");
    let out = t.txfs(&["mount", b.to_str().unwrap(), m.to_str().unwrap(), "-o", "defaults,bogus"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unknown option was accepted");
    assert!(err.contains("unknown mount option \"bogus\""), "names it: {err}");
    assert!(!is_mounted(&m));
}

/// Story: an administrator reads BACKING/.txfs/daemon.log after a clean
/// start and stop: plain text (no terminal colour codes), and no warning
/// for what went well.
#[test]
fn daemon_log_is_plain_text_without_warnings_for_a_clean_unmount() {
    let t = Background::new();
    assert!(t.mount().status.success());
    std::fs::write(t.m().join("f"), "x").unwrap();
    let out = t.txfs(&["umount", t.m().to_str().unwrap()]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(t.b().join(".txfs/daemon.log")).unwrap();
    assert!(log.contains("unmounted"), "the log covers the unmount:\n{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escape codes in daemon.log:\n{log}");
    // From the moment it serves (a kernel without a feature is warned of
    // before that).
    let served = log.lines().skip_while(|l| !l.contains("serving"));
    let warned: Vec<&str> = served.filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(warned.is_empty(), "warnings on a clean mount and unmount: {warned:#?}");
}

/// Story: a mount point whose name is not UTF-8 (a Latin-1 file name). It
/// mounts at once, serves, and `txfs umount` finds it: mountinfo is read
/// byte for byte.
#[test]
fn a_mount_point_that_is_not_utf8_mounts_and_unmounts() {
    use std::os::unix::ffi::OsStrExt;
    let t = Background::new();
    let m = t.tmp.path().join(std::ffi::OsStr::from_bytes(b"m\xe9"));
    std::fs::create_dir(&m).unwrap();
    let txfs = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new(TXFS).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        assert!(wait_timeout(&mut c, Duration::from_secs(30)).is_some(), "txfs {args:?} took over 30 s");
        c.wait_with_output().unwrap()
    };
    let out = txfs(&["mount".as_ref(), t.b().as_os_str(), m.as_os_str()]);
    assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(m.join("f"), "latin").unwrap();
    let out = txfs(&["umount".as_ref(), m.as_os_str()]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(t.b().join("f")).unwrap(), "latin", "checkpointed");
}

/// Story: a second `txfs mount` of a backing that is already mounted. It
/// fails saying where the backing is mounted, and shows this start's log
/// lines only, not old lines of an earlier session.
#[test]
fn a_failed_start_says_where_the_backing_is_mounted_and_shows_only_its_own_log() {
    let t = Background::new();
    assert!(t.mount().status.success());
    let log = t.b().join(".txfs/daemon.log");
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, b"AN OLD LINE OF AN EARLIER SESSION\n").unwrap();
    let m2 = t.tmp.path().join("m2");
    std::fs::create_dir(&m2).unwrap();
    let out = t.txfs(&["mount", t.b().to_str().unwrap(), m2.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted a backing twice");
    assert!(err.contains(&format!("mounted at {}", t.m().display())), "says where: {err}");
    assert!(!err.contains("AN OLD LINE"), "shows old log lines: {err}");
    assert!(!is_mounted(&m2));
    assert!(t.txfs(&["umount", t.m().to_str().unwrap()]).status.success());
}

/// Story: systemd runs `txfs mount -f` as `Type=notify`. READY=1 must come
/// only once the mount answers, and STOPPING=1 when it is told to stop.
#[test]
fn the_foreground_daemon_tells_systemd_ready_and_stopping() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let t = Background::new();
    let name = format!("txfs-test-notify-{}", std::process::id());
    let sock = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut daemon = Command::new(TXFS)
        .arg("mount")
        .arg("-f")
        .arg(t.b())
        .arg(t.m())
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s");
    assert_eq!(&buf[..n], b"READY=1");
    assert!(is_mounted(&t.m()), "READY=1 before the mount");
    std::fs::write(t.m().join("f"), "ready").expect("the mount answers once READY=1 came");
    // SAFETY: plain kill(2) of our child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let n = sock.recv(&mut buf).expect("STOPPING=1 within 30 s");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let st = wait_timeout(&mut daemon, Duration::from_secs(30)).expect("the daemon exits");
    assert!(st.success(), "{st}");
    assert_eq!(std::fs::read_to_string(t.b().join("f")).unwrap(), "ready");
}

/// Story: a daemon that runs for months with debug logging on. Its log is
/// capped: past TXFS_LOG_MAX_BYTES it becomes daemon.log.1 (one old file is
/// kept), and both stay readable by root only.
#[test]
fn daemon_log_is_capped_and_rotated() {
    use std::os::unix::fs::PermissionsExt;
    let t = Background::new();
    let (b, m) = (t.b(), t.m());
    let out = Command::new(TXFS)
        .arg("mount")
        .arg(&b)
        .arg(&m)
        .env("TXFS_LOG", "debug")
        .env("TXFS_LOG_MAX_BYTES", "4096")
        .output()
        .unwrap();
    assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
    for i in 0..100 {
        std::fs::write(m.join(format!("f{i}")), "x").unwrap();
    }
    assert!(t.txfs(&["umount", m.to_str().unwrap()]).status.success());
    let (log, old) = (b.join(".txfs/daemon.log"), b.join(".txfs/daemon.log.1"));
    for f in [&log, &old] {
        let md = std::fs::metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(md.len() < 4096 + 2048, "{} grew past the cap: {} bytes", f.display(), md.len());
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{}", f.display());
    }
    assert!(std::fs::read_to_string(&log).unwrap().contains("unmounted"), "the current log goes on to the end");
}

/// Story (issue 28, seen in review): the daemon's final checkpoint fails —
/// an I/O error on the backing (here `TXFS_FAILPOINT=...:eio`). `txfs
/// umount` must say so and exit non-zero, and `txfs check` exit 1, until
/// `txfs recover` has put the commit (safe in the journal) into BACKING.
#[test]
fn umount_and_check_fail_when_the_final_checkpoint_failed() {
    let mut m = Mount::new();
    // Counted from the end of recovery: the final checkpoint's first op.
    m.restart_with_env("TXFS_FAILPOINT", "ckpt:1:eio");
    std::fs::write(m.path("f"), "kept").unwrap();
    let (ok, err) = txfs_umount(&m);
    assert!(!ok, "txfs umount exited 0 after the final checkpoint failed; log:\n{}", m.log_text());
    assert!(err.contains("final checkpoint failed") && err.contains("txfs recover"), "{err}");
    assert!(m.log_text().contains("txfs failpoint: EIO"), "the failpoint was not reached: {}", m.log_text());
    let txfs = env!("CARGO_BIN_EXE_txfs");
    let check = Command::new(txfs).arg("check").arg(m.backing()).output().expect("txfs check");
    let out = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "txfs check after a failed final checkpoint: {out}");
    assert!(out.contains("final checkpoint failed"), "{out}");
    let rec = Command::new(txfs).arg("recover").arg(m.backing()).output().expect("txfs recover");
    assert!(rec.status.success(), "{}", String::from_utf8_lossy(&rec.stderr));
    assert_eq!(std::fs::read_to_string(m.backing().join("f")).unwrap(), "kept");
    let check = Command::new(txfs).arg("check").arg(m.backing()).output().expect("txfs check");
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}
