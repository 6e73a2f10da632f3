//! Who keeps a mount busy, for `txfs umount` (DESIGN §9, "libtxfs keeps one
//! descriptor per thread; `txfs umount` knows it").
//!
//! Everything is matched by the mount's device, not by path: a file opened
//! through a bind mount, or by a process in another root, names another
//! path but the same device. Stats use `AT_STATX_DONT_SYNC`, so looking
//! never sends a request to any FUSE daemon (ours, or a hung one).

use std::ffi::CString;
use std::path::Path;

/// The mount's device and its root's inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub major: u32,
    pub minor: u32,
    pub root_ino: u64,
}

/// Device and inode of `path` (following links, as /proc's magic links
/// are followed), as the kernel has them cached.
fn ident_of(path: &Path) -> Option<(u32, u32, u64)> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid C string; statx fills `st`.
    let r =
        unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_STATX_DONT_SYNC, libc::STATX_INO, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: statx succeeded.
    let st = unsafe { st.assume_init() };
    Some((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
}

pub fn ident(point: &Path) -> Option<Ident> {
    ident_of(point).map(|(major, minor, root_ino)| Ident { major, minor, root_ino })
}

/// What holds the mount: descriptors libtxfs keeps between transactions
/// (the root, opened `O_RDONLY|O_DIRECTORY|O_DSYNC`; clients/c/txfs.c), and
/// everything else, described for an error message.
#[derive(Debug, Default)]
pub struct Holders {
    /// `/proc/PID/fd/N` of each kept descriptor.
    pub kept: Vec<std::path::PathBuf>,
    pub other: Vec<String>,
}

pub fn scan(id: Ident) -> Holders {
    let mut h = Holders::default();
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else { return h };
    let dev_hex = format!("{:02x}:{:02x}", id.major, id.minor);
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let base = p.path();
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        let who = |what: String| format!("pid {pid} ({}): {what}", comm.trim());
        let ours = |path: &Path| ident_of(path).filter(|(ma, mi, _)| *ma == id.major && *mi == id.minor);
        for link in ["cwd", "root"] {
            if ours(&base.join(link)).is_some() {
                let target = std::fs::read_link(base.join(link)).unwrap_or_default();
                h.other.push(who(format!("{link} {}", target.display())));
            }
        }
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            for fd in fds.flatten() {
                let Some((_, _, ino)) = ours(&fd.path()) else { continue };
                let name = fd.file_name().to_string_lossy().into_owned();
                let target = std::fs::read_link(fd.path()).unwrap_or_default();
                if ino == id.root_ino && kept_mark(&base.join("fdinfo").join(&name)) {
                    h.kept.push(fd.path());
                } else {
                    h.other.push(who(format!("descriptor {name} ({})", target.display())));
                }
            }
        }
        if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
            // address perms offset dev inode path
            if let Some(l) = maps.lines().find(|l| l.split_whitespace().nth(3) == Some(dev_hex.as_str())) {
                let path = l.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
                h.other.push(who(format!("mapped {path}")));
            }
        }
    }
    h
}

/// The descriptor's flags (fdinfo) carry libtxfs's mark: read-only,
/// O_DIRECTORY, O_DSYNC.
fn kept_mark(fdinfo: &Path) -> bool {
    let flags = std::fs::read_to_string(fdinfo)
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("flags:").map(|v| i64::from_str_radix(v.trim(), 8))))
        .and_then(Result::ok);
    let mark = (libc::O_DSYNC | libc::O_DIRECTORY) as i64;
    flags.is_some_and(|f| f & mark == mark && f & libc::O_ACCMODE as i64 == libc::O_RDONLY as i64)
}

/// Other mounts that a detach of `point` would take along or cut off: the
/// same device mounted elsewhere (bind mounts), and mounts inside it.
pub fn entangled_mounts(point: &Path, id: Ident) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let dev = format!("{}:{}", id.major, id.minor);
    let mut out = Vec::new();
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        let at = crate::attribution::mountinfo::unescape(f[4]);
        let at = Path::new(&at);
        if at == point {
            continue;
        }
        if f[2] == dev {
            out.push(format!("it is also mounted at {}", at.display()));
        } else if at.starts_with(point) {
            out.push(format!("{} is mounted inside it", at.display()));
        }
    }
    out
}
