//! Reading /proc: process identity and ancestry, descriptors, and the
//! device a path is on — without ever asking a FUSE daemon.
//!
//! Everything the daemon learns about a caller beyond its thread id comes
//! from here: start times (a pid reused by a new process is another
//! process), parents (a `txfs run` tree), and the descriptors, root and
//! mount table of a process about to run in a transaction view
//! ([`way_into`]). `txfs umount` scans every process's descriptors the
//! same way ([`fds`], [`fd_flags`], [`dev_ino`]) to say who keeps a mount
//! busy.
//!
//! Paths are stat'ed with `AT_STATX_DONT_SYNC` ([`dev_ino`]): cached
//! attributes, the device from the superblock, so a look never sends a
//! request to any FUSE daemon (this one, serving the very mount, or a hung
//! one).

use super::mountinfo;
use std::path::Path;

/// A /proc file in one `read` where it fits: open, read, close. (std's
/// `read_to_end` also `statx`es and `lseek`s the file and reads again for
/// the end: six syscalls, on every transaction's begin.) These files are
/// produced whole by one `show`, so a read that leaves room in the buffer
/// has returned all of it.
pub(super) fn read_proc(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = f.read(&mut buf[len..])?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    // Lossy: a thread's name is copied in unchecked, and one cut inside a
    // UTF-8 sequence (names are truncated at 15 bytes) must not make the
    // thread unreadable (the reaper would take it for gone).
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// What /proc says of a thread's start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// Field 22 of /proc/PID/stat.
    Alive(u64),
    /// No such process or thread.
    Gone,
    /// Could not tell (/proc unreadable, the process hidden from us by
    /// `hidepid`, out of descriptors, a line that does not parse): nothing
    /// may be concluded.
    Unknown,
}

pub(super) fn probe(pid: u32) -> Probe {
    let s = match read_proc(&format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => {
            // `hidepid` hides other users' processes as ENOENT too; a signal
            // check is not subject to it (EPERM: there, but not ours).
            // SAFETY: signal 0 sends nothing.
            let there = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
            return if there { Probe::Unknown } else { Probe::Gone };
        }
        Err(_) => return Probe::Unknown,
    };
    // The command name may contain spaces and parentheses: split after the last ')'.
    let field = s.rfind(')').and_then(|i| s.get(i + 2..)).and_then(|rest| rest.split(' ').nth(19));
    match field.and_then(|f| f.parse().ok()) {
        Some(t) => Probe::Alive(t),
        None => Probe::Unknown,
    }
}

/// Start time of a process or thread (field 22 of /proc/PID/stat), or
/// `None` if it no longer exists (or cannot be read).
pub fn start_time(pid: u32) -> Option<u64> {
    match probe(pid) {
        Probe::Alive(t) => Some(t),
        Probe::Gone | Probe::Unknown => None,
    }
}

/// Start times of a tree's root and owner, for [`super::txmap::TxMap::add_tree`]; `None`
/// if either cannot be read. A tree registered without them would match
/// none of its members (their requests silently outside the transaction)
/// or be taken for a dead owner's and aborted.
pub fn tree_starts(root: u32, owner: u32) -> Option<(u64, u64)> {
    match (probe(root), probe(owner)) {
        (Probe::Alive(r), Probe::Alive(o)) => Some((r, o)),
        _ => None,
    }
}

/// Whether `pid`, recorded with start time `start`, is certainly not that
/// process or thread any more (gone, or its id reused). Unknown: no.
pub(super) fn certainly_gone(pid: u32, start: u64) -> bool {
    match probe(pid) {
        Probe::Alive(t) => t != start,
        Probe::Gone => true,
        Probe::Unknown => false,
    }
}

/// (Tgid, PPid) of a thread.
pub(super) fn tgid_ppid(tid: u32) -> Option<(u32, u32)> {
    let s = read_proc(&format!("/proc/{tid}/status")).ok()?;
    let mut tgid = None;
    let mut ppid = None;
    for line in s.lines() {
        if let Some(v) = line.strip_prefix("Tgid:") {
            tgid = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("PPid:") {
            ppid = v.trim().parse().ok();
        }
    }
    Some((tgid?, ppid?))
}

/// Whether every uid (real, effective, saved, file system) of process
/// `pid` is `uid` and every gid is `gid` (`false` if /proc cannot tell).
pub fn has_only_creds(pid: u32, uid: u32, gid: u32) -> bool {
    let Ok(s) = read_proc(&format!("/proc/{pid}/status")) else { return false };
    let all = |key: &str, want: u32| {
        s.lines().find_map(|l| l.strip_prefix(key)).is_some_and(|v| {
            let ids: Vec<&str> = v.split_whitespace().collect();
            ids.len() == 4 && ids.iter().all(|i| i.parse() == Ok(want))
        })
    };
    all("Uid:", uid) && all("Gid:", gid)
}

/// Whether thread `tid` has `gid` among its supplementary groups.
pub fn in_group(tid: u32, gid: u32) -> bool {
    read_proc(&format!("/proc/{tid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|v| v.split_whitespace().any(|g| g.parse() == Ok(gid)))
    })
}

/// Parent process of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    tgid_ppid(pid).map(|(_, p)| p)
}

/// Process (thread group) of thread `tid`.
pub fn process_of(tid: u32) -> Option<u32> {
    tgid_ppid(tid).map(|(t, _)| t)
}

/// Device (major, minor) and inode of `path`, following links (as /proc's
/// magic links are followed), from what the kernel has cached: no request
/// reaches a FUSE daemon (`AT_STATX_DONT_SYNC`).
pub fn dev_ino(path: &Path) -> std::io::Result<(u32, u32, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statx into a zeroed struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live struct.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_STATX_DONT_SYNC, libc::STATX_INO, &mut st) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
}

/// The descriptor numbers of process `pid` (/proc/PID/fd).
pub fn fds(pid: u32) -> std::io::Result<impl Iterator<Item = std::io::Result<String>>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd"))?;
    Ok(dir.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())))
}

/// The open flags of descriptor `fd` of process `pid` (/proc/PID/fdinfo/FD).
pub fn fd_flags(pid: u32, fd: &str) -> Option<u32> {
    read_proc(&format!("/proc/{pid}/fdinfo/{fd}"))
        .ok()
        .and_then(|info| info.lines().find_map(|l| l.strip_prefix("flags:")).map(|f| f.trim().to_string()))
        .and_then(|f| u32::from_str_radix(&f, 8).ok())
}

/// The device of the mount whose source is `source` in the daemon's own
/// mount table (`txfs:BACKING`: only one daemon serves a backing directory).
pub fn dev_of_source(source: &str) -> std::io::Result<u64> {
    let info = read_proc("/proc/self/mountinfo")?;
    mountinfo::source_dev(&info, source).ok_or_else(|| std::io::Error::other(format!("no mount of {source}")))
}

/// How process `pid` could reach the file system of device `dev`, mounted
/// at `point` (as the daemon sees it), other than through a mount of it
/// that another mount covers (a `txfs run` child whose view is mounted over
/// the shared mount): a descriptor that survives `exec` (not `O_CLOEXEC`)
/// on it or below its mount point (`..` climbs out of a mount stacked on
/// it), its root directory, or a mount of `dev` in its mount namespace with
/// nothing mounted over it. `None` if none of these; what it found
/// otherwise. Its working directory is not looked at: the child enters it
/// again through the view before `exec`, and if that still leaves it on
/// the shared mount, it sends a request there first (which closes the
/// gate). Anything /proc cannot tell counts as a way in.
pub fn way_into(pid: u32, dev: u64, point: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let inside = |link: &str| -> Result<bool, String> {
        let (major, minor, _) = dev_ino(Path::new(link)).map_err(|e| format!("{link}: {e}"))?;
        if libc::makedev(major, minor) == dev {
            return Ok(true);
        }
        let target = std::fs::read_link(link).map_err(|e| format!("{link}: {e}"))?;
        Ok(target.starts_with(point) && target.as_os_str().as_bytes().first() == Some(&b'/'))
    };
    let fds = match fds(pid) {
        Ok(d) => d,
        Err(e) => return Some(format!("/proc/{pid}/fd: {e}")),
    };
    for fd in fds {
        let n = match fd {
            Ok(n) => n,
            Err(e) => return Some(format!("/proc/{pid}/fd: {e}")),
        };
        match fd_flags(pid, &n) {
            Some(f) if f & libc::O_CLOEXEC as u32 != 0 => continue,
            Some(_) => {}
            None => return Some(format!("/proc/{pid}/fdinfo/{n}: no flags")),
        }
        match inside(&format!("/proc/{pid}/fd/{n}")) {
            Ok(false) => {}
            Ok(true) => return Some(format!("it inherits descriptor {n} on this mount")),
            Err(e) => return Some(e),
        }
    }
    match inside(&format!("/proc/{pid}/root")) {
        Ok(false) => {}
        Ok(true) => return Some("its root directory is on this mount".into()),
        Err(e) => return Some(e),
    }
    let info = match read_proc(&format!("/proc/{pid}/mountinfo")) {
        Ok(t) => t,
        Err(e) => return Some(format!("/proc/{pid}/mountinfo: {e}")),
    };
    mountinfo::uncovered(&info, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_identifies_this_process() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
        assert_eq!(process_of(me), Some(me));
    }

    /// Files past the first buffer come back whole (the growth path), and
    /// /proc/PID/stat parses as before.
    #[test]
    fn read_proc_returns_whole_files() {
        let dir = std::env::temp_dir().join(format!("txfs-readproc-{}", std::process::id()));
        let want: String = (0..3000).map(|i| format!("{i} ")).collect();
        std::fs::write(&dir, &want).unwrap();
        assert!(want.len() > 8192);
        assert_eq!(read_proc(dir.to_str().unwrap()).ok().as_deref(), Some(want.as_str()));
        std::fs::remove_file(&dir).unwrap();
        let stat = read_proc("/proc/self/stat").unwrap();
        assert!(stat.ends_with('\n') && stat.starts_with(&format!("{} (", std::process::id())));
        assert!(read_proc("/proc/self/no-such-file").is_err());
    }

    /// This process's own descriptors: a pipe's ends are found, with the
    /// close-on-exec flag std sets.
    #[test]
    fn fds_and_their_flags() {
        let me = std::process::id();
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsRawFd;
        let n = f.as_raw_fd().to_string();
        assert!(fds(me).unwrap().any(|d| d.unwrap() == n));
        assert!(fd_flags(me, &n).is_some_and(|fl| fl & libc::O_CLOEXEC as u32 != 0));
        let (_, _, ino) = dev_ino(Path::new("/proc/self/stat")).unwrap();
        assert!(ino > 0);
    }
}
