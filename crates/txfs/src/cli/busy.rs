//! Who keeps a mount busy, for `txfs umount` (DESIGN §9, "libtxfs keeps one
//! descriptor per thread; `txfs umount` knows it").
//!
//! Everything is matched by the mount's device, not by path: a file opened
//! through a bind mount, or by a process in another root, names another
//! path but the same device. Stats use `AT_STATX_DONT_SYNC`, so looking
//! never sends a request to any FUSE daemon (ours, or a hung one).

use crate::attribution::{mountinfo, procfs};
use std::path::Path;

/// The mount's device and its root's inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub major: u32,
    pub minor: u32,
    pub root_ino: u64,
}

/// Device and inode of `path`, as the kernel has them cached.
fn ident_of(path: &Path) -> Option<(u32, u32, u64)> {
    procfs::dev_ino(path).ok()
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

impl Holders {
    /// Nobody visible holds the mount.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.other.is_empty()
    }
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
        let Ok(pid_n) = pid.parse::<u32>() else { continue };
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
        if let Ok(fds) = procfs::fds(pid_n) {
            for name in fds.flatten() {
                let path = base.join("fd").join(&name);
                let Some((_, _, ino)) = ours(&path) else { continue };
                let target = std::fs::read_link(&path).unwrap_or_default();
                if ino == id.root_ino && procfs::fd_flags(pid_n, &name).is_some_and(kept_mark) {
                    h.kept.push(path);
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
fn kept_mark(flags: u32) -> bool {
    let mark = (libc::O_DSYNC | libc::O_DIRECTORY) as u32;
    flags & mark == mark && flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32
}

/// Other mounts that a detach of `point` would take along or cut off: the
/// same device mounted elsewhere (bind mounts), and mounts inside it.
pub fn entangled_mounts(point: &Path, id: Ident) -> Vec<String> {
    let info = mountinfo::own();
    let mut out = Vec::new();
    for m in mountinfo::entries(&info) {
        let at = m.point.as_path();
        if at == point {
            continue;
        }
        if (m.major, m.minor) == (id.major, id.minor) {
            out.push(format!("it is also mounted at {}", at.display()));
        } else if at.starts_with(point) {
            out.push(format!("{} is mounted inside it", at.display()));
        }
    }
    out
}
