//! `txfs run -- CMD`: CMD and every process it forks are one transaction.
//!
//! The child is forked, registered with the daemon as the root of a
//! process-tree transaction (TXFS_IOC_RUN), and only then allowed to exec
//! CMD, so its very first file-system request is already transactional.
//!
//! The transaction view (as root; `TXFS_RUN_VIEW=0` turns it off): the
//! child enters a mount namespace of its own and mounts a second FUSE
//! connection over the mount point, which the daemon serves as nothing but
//! this transaction (DESIGN §9). The kernel may then cache the command's
//! entries, attributes and pages for as long as it likes — nobody else can
//! reach them — instead of asking the daemon at every path component.
//! Other processes keep seeing the shared mount. Without the view (not
//! root, an old daemon) requests are attributed by the process tree.

use super::changes::{print, Show, Source};
use crate::attribution::mountinfo;
use crate::wire;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;

const EX_TEMPFAIL: u8 = 75;
const EX_SOFTWARE: u8 = 70;

/// The running CMD, for [`relay`].
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// While CMD runs, a termination signal sent to `txfs run` (by `kill`, a
/// supervisor, `timeout`) is passed on to CMD: `txfs run` then sees CMD
/// end by it and aborts the transaction, instead of dying itself and
/// leaving CMD running on (re-parented to init, in a view whose
/// transaction is gone). Signals the kernel makes (a terminal's Ctrl-C or
/// hangup) reach CMD's process group directly: not sent twice.
extern "C" fn relay(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    let child = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if code <= 0 && child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, sig) };
    }
}

const RELAYED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Installs [`relay`] for the termination signals, CMD being `pid`; with
/// `None`, the default dispositions again (CMD has been reaped: its pid
/// may belong to someone else now).
fn relay_signals_to(pid: Option<libc::pid_t>) {
    CHILD.store(pid.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = relay;
    for sig in RELAYED {
        // SAFETY: a zeroed sigaction with a valid SA_SIGINFO handler or SIG_DFL.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = if pid.is_some() { handler as usize } else { libc::SIG_DFL };
            sa.sa_flags = if pid.is_some() { libc::SA_SIGINFO | libc::SA_RESTART } else { 0 };
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn run_ioctl(mount: &std::fs::File, pid: u32, op: u32, flags: u32, devfd: i32) -> std::io::Result<()> {
    let arg = wire::Run { pid, op, flags, view_fd: devfd as u32 }.encode();
    // SAFETY: RUN reads its argument's size from arg, which is that long.
    if unsafe { libc::ioctl(mount.as_raw_fd(), wire::RUN as _, arg.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The `/dev/fuse` descriptor of a transaction view, its mount options and
/// flags.
struct View {
    dev: i32,
    opts: CString,
    flags: libc::c_ulong,
}

impl View {
    /// `nodev`: whether the shared mount is `nodev` (FUSE's default): device
    /// nodes open on the view exactly when they open on the shared mount
    /// (`-o dev`). Setuid bits never count on a view.
    fn open(nodev: bool) -> Option<View> {
        // SAFETY: open(2) of a constant path.
        let dev = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev < 0 {
            return None;
        }
        // SAFETY: getegid cannot fail.
        let gid = unsafe { libc::getegid() };
        let opts = format!("fd={dev},rootmode=40000,user_id=0,group_id={gid},allow_other,default_permissions");
        let flags = libc::MS_NOSUID | if nodev { libc::MS_NODEV } else { 0 };
        Some(View { dev, opts: CString::new(opts).expect("no NUL"), flags })
    }

    /// In the forked child: a mount namespace of its own, the view mounted
    /// over `point`. Async-signal-safe.
    unsafe fn mount_in_child(&self, point: &CString) -> bool {
        // SAFETY: syscalls on valid C strings (the caller is the forked child).
        unsafe {
            libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
                && libc::mount(
                    c"txfs-view".as_ptr(),
                    point.as_ptr(),
                    c"fuse.txfs-view".as_ptr(),
                    self.flags,
                    self.opts.as_ptr().cast(),
                ) == 0
        }
    }
}

impl View {
    /// Whether a daemon took the connection: it answered the kernel's INIT,
    /// which is no longer waiting to be read.
    fn served(&self) -> bool {
        let mut p = libc::pollfd { fd: self.dev, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 0 }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: our descriptor (the daemon holds its own copy by now).
        unsafe { libc::close(self.dev) };
    }
}

/// What `txfs run` does with the change set before it ends the transaction.
#[derive(Clone, Copy, Default)]
pub(super) enum Review {
    /// Commit when CMD exits 0, as always.
    #[default]
    None,
    /// `--dry-run`: print the change set, then abort whatever CMD did.
    DryRun(Show),
    /// `--confirm`: print it after CMD exits 0, then commit only on "y"
    /// from the terminal, or at once with `--yes`.
    Confirm { show: Show, yes: bool },
}

/// Asks on the terminal whether to commit; false unless "y" or "yes".
fn confirmed() -> bool {
    eprint!("txfs run: commit these changes? [y/N] ");
    let mut answer = String::new();
    if std::io::stdin().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

pub(super) fn run(mount: Option<&Path>, retries: u32, ordered: bool, review: Review, cmd: &[OsString]) -> ExitCode {
    use std::io::IsTerminal;
    if let Review::Confirm { yes: false, .. } = review {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "txfs run: --confirm asks on the terminal, and stdin is not one (add --yes to commit without asking)"
            );
            return ExitCode::from(EX_SOFTWARE);
        }
    }
    let point = match mountinfo::resolve(mount, cmd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("txfs run: {e}");
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    let dir = match std::fs::File::open(&point) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("txfs run: {}: {e}", point.display());
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    let argv: Vec<CString> = match cmd.iter().map(|a| CString::new(a.as_bytes())).collect() {
        Ok(v) => v,
        Err(_) => {
            eprintln!("txfs run: an argument contains a NUL byte");
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let flags = if ordered { wire::COMMIT_ORDERED } else { 0 };
    let want_view = std::env::var_os("TXFS_RUN_VIEW").is_none_or(|v| v != "0")
        // SAFETY: geteuid cannot fail.
        && unsafe { libc::geteuid() } == 0;
    let point_c = CString::new(point.as_os_str().as_bytes()).expect("a mount point has no NUL");
    let cwd_c = std::env::current_dir().ok().and_then(|d| CString::new(d.as_os_str().as_bytes()).ok());
    // A child that mounted a view but may not have left the shared mount
    // behind (its working directory could not be entered through the view,
    // or is still on the shared mount: a bind mount of it elsewhere; or the
    // view was taken away again) sends the daemon a request on the shared
    // mount before it runs the command: the daemon then stops the kernel
    // caching there while this run lives (DESIGN §9, "Views leave the gate
    // open"). If it cannot send it, it does not run the command.
    let shared_dev = {
        use std::os::unix::fs::MetadataExt;
        dir.metadata().map(|m| m.dev()).ok()
    };
    let dir_fd = dir.as_raw_fd();
    let nodev = {
        // SAFETY: fstatvfs into a zeroed struct on our own descriptor.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        let failed = unsafe { libc::fstatvfs(dir_fd, &mut v) } != 0;
        failed || v.f_flag & libc::ST_NODEV != 0
    };
    let mut state_buf = [0u8; wire::State::SIZE];
    const NO_PIN: &[u8] = b"txfs run: cannot tell the daemon that the command may reach the shared mount\n";
    for attempt in 0..=retries {
        let view = if want_view { View::open(nodev) } else { None };
        let mut go = [0i32; 2];
        let mut ready = [0i32; 2];
        // The child's errno if its exec fails (closed by a successful exec).
        let mut exec_err = [0i32; 2];
        // SAFETY: valid 2-element arrays.
        if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0
            || unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) } != 0
            || unsafe { libc::pipe2(exec_err.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        {
            eprintln!("txfs run: pipe: {}", std::io::Error::last_os_error());
            return ExitCode::from(EX_SOFTWARE);
        }
        // SAFETY: the child only calls async-signal-safe functions before exec.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            eprintln!("txfs run: fork: {}", std::io::Error::last_os_error());
            return ExitCode::from(EX_SOFTWARE);
        }
        if pid == 0 {
            // SAFETY: child side: async-signal-safe syscalls only, then exec.
            unsafe {
                libc::close(go[1]);
                libc::close(ready[0]);
                libc::close(exec_err[0]);
                let mounted = view.as_ref().is_some_and(|v| v.mount_in_child(&point_c));
                if let Some(v) = &view {
                    // Only the daemon may hold the connection: if it never
                    // serves it, the parent's close aborts it, and a request
                    // gets ENOTCONN instead of waiting for INIT forever.
                    libc::close(v.dev);
                }
                let r: u8 = if mounted { b'v' } else { b'r' };
                libc::write(ready[1], (&r as *const u8).cast(), 1);
                libc::close(ready[1]);
                let mut b = 0u8;
                let n = libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                let mut in_view = mounted;
                if n == 1 && b == b'u' {
                    // The daemon would not serve the view: take it away again.
                    in_view = false;
                    libc::umount2(point_c.as_ptr(), libc::MNT_DETACH);
                    let n = libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                    if n != 1 {
                        libc::_exit(EX_SOFTWARE as i32);
                    }
                }
                if b != b'g' {
                    libc::_exit(EX_SOFTWARE as i32);
                }
                if mounted {
                    // Re-resolve the working directory through the view: once
                    // that succeeded it is in the view or outside the mount.
                    let mut entered = in_view && cwd_c.as_ref().is_some_and(|c| libc::chdir(c.as_ptr()) == 0);
                    let mut st: libc::stat = std::mem::zeroed();
                    entered &= libc::stat(c".".as_ptr(), &mut st) == 0 && shared_dev.is_some_and(|d| d != st.st_dev);
                    if !entered && libc::ioctl(dir_fd, wire::STATE as _, state_buf.as_mut_ptr()) != 0 {
                        libc::write(2, NO_PIN.as_ptr().cast(), NO_PIN.len());
                        libc::_exit(EX_SOFTWARE as i32);
                    }
                }
                libc::execvp(ptrs[0], ptrs.as_ptr());
                // As shells do: 127 for a command not found, 126 for one
                // that cannot be run; the parent prints why.
                let e = *libc::__errno_location();
                libc::write(exec_err[1], (&e as *const i32).cast(), 4);
                libc::_exit(if e == libc::ENOENT || e == libc::ENOTDIR { 127 } else { 126 });
            }
        }
        relay_signals_to(Some(pid));
        // SAFETY: closing our copies of the child's ends.
        unsafe {
            libc::close(go[0]);
            libc::close(ready[1]);
            libc::close(exec_err[1]);
        }
        let mut r = 0u8;
        // SAFETY: one byte into a local.
        let n = unsafe { libc::read(ready[0], (&mut r as *mut u8).cast(), 1) };
        // SAFETY: our end.
        unsafe { libc::close(ready[0]) };
        let send = |b: u8| {
            // SAFETY: one byte to our pipe end.
            unsafe { libc::write(go[1], (&b as *const u8).cast(), 1) };
        };
        let mut registered = Err(std::io::Error::from_raw_os_error(libc::ECHILD));
        if n == 1 && r == b'v' {
            let devfd = view.as_ref().map_or(-1, |v| v.dev);
            registered = run_ioctl(&dir, pid as u32, wire::RUN_BEGIN, wire::RUN_VIEW, devfd);
            if registered.is_err() {
                send(b'u');
            } else if !view.as_ref().is_some_and(View::served) {
                // A daemon that predates views began a plain tree transaction
                // and ignored the flag: take the view away, keep the transaction.
                send(b'u');
            }
        }
        drop(view);
        if n == 1 && registered.is_err() {
            registered = run_ioctl(&dir, pid as u32, wire::RUN_BEGIN, 0, -1);
        }
        send(if registered.is_ok() { b'g' } else { b'x' });
        // SAFETY: our end.
        unsafe { libc::close(go[1]) };
        let mut status = 0i32;
        // SAFETY: waiting for our own child.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        relay_signals_to(None);
        let mut e = [0u8; 4];
        // SAFETY: 4 bytes into a local; every write end is closed by now.
        let got = unsafe { libc::read(exec_err[0], e.as_mut_ptr().cast(), 4) };
        // SAFETY: our end.
        unsafe { libc::close(exec_err[0]) };
        let exec_failed = (got == 4).then(|| std::io::Error::from_raw_os_error(i32::from_ne_bytes(e)));
        if let Err(e) = registered {
            eprintln!("txfs run: could not start a transaction on {}: {e}", point.display());
            return ExitCode::from(EX_SOFTWARE);
        }
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            EX_SOFTWARE as i32
        };
        let src = Source { mount: &dir, pid: pid as u32 };
        let listing = match review {
            Review::DryRun(_) => Some(src.list()),
            Review::Confirm { .. } if code == 0 => Some(src.list()),
            _ => None,
        };
        let changes = |show: Show| match listing.as_ref().map(|l| l.as_ref().map_err(|e| e.to_string())) {
            Some(Ok(l)) => match print(&src, l, show) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("txfs run: cannot print the changes: {e}");
                    false
                }
            },
            Some(Err(e)) => {
                eprintln!("txfs run: cannot list the changes: {e}");
                false
            }
            None => false,
        };
        // A command that failed because it lost a conflict is rerun, as
        // always; its changes are not worth showing.
        let lost_first = code != 0 && matches!(&listing, Some(Ok(l)) if l.lost);
        if let (Review::DryRun(show), false) = (review, lost_first) {
            let listed = changes(show);
            let _ = run_ioctl(&dir, pid as u32, wire::RUN_ABORT, 0, -1);
            eprintln!("txfs run: dry run: nothing of the command was committed");
            return ExitCode::from(if listed { code as u8 } else { EX_SOFTWARE });
        }
        if let (Review::Confirm { show, yes }, 0) = (review, code) {
            if !changes(show) || !(yes || confirmed()) {
                let _ = run_ioctl(&dir, pid as u32, wire::RUN_ABORT, 0, -1);
                eprintln!("txfs run: not committed: nothing of the command survived");
                return ExitCode::from(1);
            }
            return match run_ioctl(&dir, pid as u32, wire::RUN_COMMIT, flags, -1) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.raw_os_error() == Some(libc::EDEADLK) => {
                    // Not rerun: the answer was about these changes.
                    eprintln!(
                        "txfs run: conflict: another commit changed what the command read while you decided; \
                         nothing of the command survived"
                    );
                    ExitCode::from(EX_TEMPFAIL)
                }
                Err(e) => {
                    eprintln!("txfs run: commit failed: {e}: nothing of the command survived");
                    ExitCode::from(EX_SOFTWARE)
                }
            };
        }
        if code != 0 {
            let lost = run_ioctl(&dir, pid as u32, wire::RUN_ABORT, 0, -1)
                .is_err_and(|e| e.raw_os_error() == Some(libc::EDEADLK));
            if lost {
                // It failed because an operation lost a conflict: rerun it.
                if attempt < retries {
                    eprintln!("txfs run: conflict during the command; retrying ({}/{retries})", attempt + 1);
                    continue;
                }
                eprintln!("txfs run: conflict after {retries} retries: nothing of the command survived");
                return ExitCode::from(EX_TEMPFAIL);
            }
            match &exec_failed {
                Some(e) => eprintln!("txfs run: {}: {e}: transaction aborted", cmd[0].to_string_lossy()),
                None => eprintln!("txfs run: command exited with status {code}: transaction aborted"),
            }
            return ExitCode::from(code as u8);
        }
        match run_ioctl(&dir, pid as u32, wire::RUN_COMMIT, flags, -1) {
            Ok(()) => return ExitCode::SUCCESS,
            Err(e) if e.raw_os_error() == Some(libc::EDEADLK) => {
                if attempt < retries {
                    eprintln!("txfs run: conflict; retrying ({}/{retries})", attempt + 1);
                    continue;
                }
                eprintln!("txfs run: conflict after {retries} retries: nothing of the command survived");
                return ExitCode::from(EX_TEMPFAIL);
            }
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ENOSPC) => {
                        " (the transaction went past a limit of the mount, tx_mem, mount_tx_mem or tx_reads, \
                         as BACKING/.txfs/daemon.log says; or BACKING is full)"
                    }
                    _ => "",
                };
                eprintln!("txfs run: commit failed: {e}{why}: nothing of the command survived");
                return ExitCode::from(EX_SOFTWARE);
            }
        }
    }
    ExitCode::from(EX_TEMPFAIL)
}
