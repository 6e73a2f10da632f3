//! `txfs run -- CMD`: CMD and every process it forks are one transaction.
//!
//! The child is forked, registered with the daemon as the root of a
//! process-tree transaction (TXFS_IOC_RUN), and only then allowed to exec
//! CMD, so its very first file-system request is already transactional.

use crate::{ioctl, mounts};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;

const EX_TEMPFAIL: u8 = 75;
const EX_SOFTWARE: u8 = 70;

fn run_ioctl(mount: &std::fs::File, pid: u32, op: u32, flags: u32) -> std::io::Result<()> {
    let mut arg = [0u8; 16];
    arg[0..4].copy_from_slice(&pid.to_le_bytes());
    arg[4..8].copy_from_slice(&op.to_le_bytes());
    arg[8..12].copy_from_slice(&flags.to_le_bytes());
    // SAFETY: RUN reads 16 bytes from arg.
    if unsafe { libc::ioctl(mount.as_raw_fd(), ioctl::RUN as _, arg.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn run(mount: Option<&Path>, retries: u32, ordered: bool, cmd: &[OsString]) -> ExitCode {
    let point = match mounts::resolve(mount) {
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
    let flags = if ordered { ioctl::COMMIT_ORDERED } else { 0 };
    for attempt in 0..=retries {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid 2-element array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
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
            // SAFETY: child side: wait for the go byte, then exec.
            unsafe {
                libc::close(fds[1]);
                let mut b = 0u8;
                let n = libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
                if n != 1 || b != b'g' {
                    libc::_exit(EX_SOFTWARE as i32);
                }
                libc::execvp(ptrs[0], ptrs.as_ptr());
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copy of the read end.
        unsafe { libc::close(fds[0]) };
        let registered = run_ioctl(&dir, pid as u32, ioctl::RUN_BEGIN, 0);
        let go: u8 = if registered.is_ok() { b'g' } else { b'x' };
        // SAFETY: writing one byte to our pipe end, then closing it.
        unsafe {
            libc::write(fds[1], (&go as *const u8).cast(), 1);
            libc::close(fds[1]);
        }
        let mut status = 0i32;
        // SAFETY: waiting for our own child.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
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
        if code != 0 {
            let lost = run_ioctl(&dir, pid as u32, ioctl::RUN_ABORT, 0)
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
            eprintln!("txfs run: command exited with status {code}: transaction aborted");
            return ExitCode::from(code as u8);
        }
        match run_ioctl(&dir, pid as u32, ioctl::RUN_COMMIT, flags) {
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
                eprintln!("txfs run: commit failed: {e}: nothing of the command survived");
                return ExitCode::from(EX_SOFTWARE);
            }
        }
    }
    ExitCode::from(EX_TEMPFAIL)
}
