//! The mount table (/proc/PID/mountinfo), parsed in one place.
//!
//! Three users read it: the CLI finds txfs mounts by file system type and
//! source ([`find`], [`resolve`]); the daemon finds its own mount's device
//! by its source `txfs:BACKING` ([`source_dev`]) and whether a `txfs run`
//! tree's namespace has the shared mount uncovered ([`uncovered`]); `txfs
//! umount` looks for bind mounts and mounts inside the one it detaches.
//! Each line is one [`Entry`]; fields are unescaped once, here
//! ([`unescape`]: the kernel writes a space in a path as `\040`).

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

pub const FSTYPE: &str = "fuse.txfs";

/// One mount: a line of mountinfo (proc(5)), with its paths and source
/// unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub parent: u64,
    /// The device (major, minor) of the mounted file system.
    pub major: u32,
    pub minor: u32,
    /// Where the mount is, as the reader of this mountinfo sees it.
    pub point: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl Entry {
    pub fn dev(&self) -> u64 {
        libc::makedev(self.major, self.minor)
    }

    /// A line of mountinfo; `None` if it does not parse. Fields: mount
    /// id, parent id, major:minor, root, mount point, options, optional
    /// fields, then past " - ": file system type, source, options.
    pub fn parse(line: &str) -> Option<Entry> {
        let (head, tail) = line.split_once(" - ")?;
        let f: Vec<&str> = head.split(' ').collect();
        let (major, minor) = f.get(2)?.split_once(':')?;
        let mut t = tail.split(' ');
        Some(Entry {
            id: f.first()?.parse().ok()?,
            parent: f.get(1)?.parse().ok()?,
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
            point: PathBuf::from(std::ffi::OsString::from_vec(unescape_bytes(f.get(4)?))),
            fstype: t.next()?.to_string(),
            source: unescape(t.next()?),
        })
    }
}

/// The mounts of a mountinfo text, skipping lines that do not parse.
pub fn entries(mountinfo: &str) -> impl Iterator<Item = Entry> + '_ {
    mountinfo.lines().filter_map(Entry::parse)
}

/// A txfs mount: where it is and what it serves.
#[derive(Debug, Clone)]
pub struct Mount {
    pub point: PathBuf,
    /// The `fsname` (`txfs:BACKING`).
    pub source: String,
}

impl Mount {
    pub fn backing(&self) -> Option<PathBuf> {
        self.source.strip_prefix("txfs:").map(PathBuf::from)
    }
}

/// Decodes mountinfo's octal escapes (`\040` for a space); anything else,
/// including a backslash not followed by an octal byte, is kept as it is.
/// Lossy where the bytes are not UTF-8 (see [`unescape_bytes`]).
pub fn unescape(field: &str) -> String {
    String::from_utf8_lossy(&unescape_bytes(field)).into_owned()
}

/// [`unescape`], byte for byte: a path need not be UTF-8.
pub fn unescape_bytes(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|o| b[i] == b'\\' && o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct.and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok()) {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// A mountinfo text as ASCII: every byte past 0x7f (paths need not be
/// UTF-8) is written as the octal escape the kernel uses for a space, so
/// that [`unescape_bytes`] gives the path back byte for byte and one odd
/// name does not hide the whole table.
pub fn ascii(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for &c in raw {
        if c.is_ascii() {
            out.push(c as char);
        } else {
            out.push_str(&format!("\\{c:03o}"));
        }
    }
    out
}

/// The txfs mounts of a mountinfo text (also those mounted as plain
/// "fuse" with source `txfs:BACKING`).
pub fn parse(mountinfo: &str) -> Vec<Mount> {
    entries(mountinfo)
        .filter(|e| e.fstype == FSTYPE || (e.fstype == "fuse" && e.source.starts_with("txfs:")))
        .map(|e| Mount { point: e.point, source: e.source })
        .collect()
}

/// The device of the first mount in this mountinfo text whose source is
/// `source`.
pub fn source_dev(mountinfo: &str, source: &str) -> Option<u64> {
    entries(mountinfo).find(|e| e.source == source).map(|e| e.dev())
}

/// A mount of `dev` in this mountinfo text that no other mount covers
/// (mounted on its root at its mount point), or a line that does not
/// parse: where and why.
pub fn uncovered(mountinfo: &str, dev: u64) -> Option<String> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        match Entry::parse(line) {
            Some(m) => mounts.push(m),
            None => return Some(format!("a mountinfo line that does not parse: {line:?}")),
        }
    }
    for m in &mounts {
        if m.dev() == dev && !mounts.iter().any(|o| o.parent == m.id && o.point == m.point) {
            return Some(format!("this mount is also reachable at {}", m.point.display()));
        }
    }
    None
}

/// This process's mount table (empty if it cannot be read).
pub fn own() -> String {
    std::fs::read("/proc/self/mountinfo").map(|b| ascii(&b)).unwrap_or_default()
}

pub fn all() -> Vec<Mount> {
    parse(&own())
}

pub fn find(point: &Path) -> Option<Mount> {
    let want = point.canonicalize().unwrap_or_else(|_| point.to_path_buf());
    all().into_iter().find(|m| m.point == want)
}

/// `$TXFS_MOUNT`, else the only txfs mount, else the one holding the
/// current directory, else the one the command's absolute path arguments
/// (`args`) are in; failing that, the candidates are listed.
pub fn resolve(explicit: Option<&Path>, args: &[std::ffi::OsString]) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("TXFS_MOUNT") {
        return Ok(PathBuf::from(p));
    }
    let points: Vec<PathBuf> = all().into_iter().filter(|m| m.backing().is_some()).map(|m| m.point).collect();
    let cwd = std::env::current_dir().ok();
    choose(&points, cwd.as_deref(), args)
}

/// The mount [`resolve`] picks among `points`, given the working directory
/// and the command's arguments.
pub fn choose(points: &[PathBuf], cwd: Option<&Path>, args: &[std::ffi::OsString]) -> Result<PathBuf, String> {
    match points {
        [] => return Err("no txfs mount found (mount one, or set TXFS_MOUNT)".into()),
        [one] => return Ok(one.clone()),
        _ => {}
    }
    // The deepest mount holding `p` (a mount inside another wins).
    let holding = |p: &Path| points.iter().filter(|m| p.starts_with(m)).max_by_key(|m| m.as_os_str().len()).cloned();
    if let Some(m) = cwd.and_then(holding) {
        return Ok(m);
    }
    let mut by_args: Vec<PathBuf> =
        args.iter().map(Path::new).filter(|a| a.is_absolute()).filter_map(holding).collect();
    by_args.dedup();
    if by_args.len() == 1 {
        return Ok(by_args.remove(0));
    }
    let list = points.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let why = if by_args.is_empty() {
        "neither the current directory nor the command's paths are in one of them"
    } else {
        "the command's paths are in more than one"
    };
    Err(format!("{} txfs mounts ({list}): {why}; say which with --mount or TXFS_MOUNT", points.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_txfs_mounts_with_escaped_names() {
        let info = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw\n\
                    40 22 0:45 / /tmp/my\\040mnt rw,nosuid - fuse.txfs txfs:/srv/back\\040ing rw,user_id=0\n";
        let m = parse(info);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].point, PathBuf::from("/tmp/my mnt"));
        assert_eq!(m[0].backing(), Some(PathBuf::from("/srv/back ing")));
    }

    /// Only a mount of the device with nothing mounted on it at its own
    /// mount point is a way in.
    #[test]
    fn a_covered_mount_is_no_way_in() {
        let dev = libc::makedev(0, 63);
        let shared = "24 1 0:63 / /mnt/t rw - fuse.txfs txfs:/b rw\n";
        let view = "31 24 0:70 / /mnt/t rw - fuse.txfs txfs rw\n";
        let other = "25 1 8:1 / /home rw - ext4 /dev/sda1 rw\n";
        assert_eq!(uncovered(&format!("{other}{shared}{view}"), dev), None);
        assert!(uncovered(&format!("{other}{shared}"), dev).unwrap().contains("/mnt/t"));
        // A bind mount of it elsewhere, or a mount over a subdirectory only.
        let bind = "40 1 0:63 /sub /srv/x rw - fuse.txfs txfs:/b rw\n";
        assert!(uncovered(&format!("{shared}{view}{bind}"), dev).unwrap().contains("/srv/x"));
        let below = "31 24 0:70 / /mnt/t/sub rw - fuse.txfs txfs rw\n";
        assert!(uncovered(&format!("{shared}{below}"), dev).is_some());
        assert!(uncovered("garbage\n", dev).is_some());
    }

    /// With several mounts, `txfs run` takes the one holding the working
    /// directory (the deepest), else the one its path arguments are in, else
    /// lists them.
    #[test]
    fn run_chooses_the_mount_by_directory_then_arguments() {
        let points = [PathBuf::from("/mnt/a"), PathBuf::from("/mnt/b"), PathBuf::from("/mnt/a/inner")];
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let one = choose(&points[..1], Some(Path::new("/elsewhere")), &[]).unwrap();
        assert_eq!(one, PathBuf::from("/mnt/a"), "the only mount");
        let cwd = choose(&points, Some(Path::new("/mnt/b/x")), &args(&["cp", "/mnt/a/f"])).unwrap();
        assert_eq!(cwd, PathBuf::from("/mnt/b"), "the working directory first");
        let deep = choose(&points, Some(Path::new("/mnt/a/inner/d")), &[]).unwrap();
        assert_eq!(deep, PathBuf::from("/mnt/a/inner"), "the deepest mount");
        let by_arg = choose(&points, Some(Path::new("/home")), &args(&["cp", "x", "/mnt/b/f", "/mnt/b/g"])).unwrap();
        assert_eq!(by_arg, PathBuf::from("/mnt/b"), "the arguments' mount");
        let e = choose(&points, Some(Path::new("/home")), &args(&["cp", "/mnt/a/f", "/mnt/b/f"])).unwrap_err();
        assert!(e.contains("/mnt/a, /mnt/b, /mnt/a/inner") && e.contains("--mount"), "lists them: {e}");
        let e = choose(&points, None, &[]).unwrap_err();
        assert!(e.contains("3 txfs mounts") && e.contains("/mnt/b"), "lists them: {e}");
        assert!(choose(&[], None, &[]).is_err());
    }

    /// The daemon finds its own mount by source, with mountinfo's escapes.
    #[test]
    fn a_mount_is_found_by_its_source() {
        let info = "24 1 0:63 / /mnt/t rw - fuse.txfs txfs:/var/a\\040b rw\n\
                    25 1 0:64 / /mnt/u rw - fuse.txfs txfs:/var/a rw\n";
        assert_eq!(source_dev(info, "txfs:/var/a b"), Some(libc::makedev(0, 63)));
        assert_eq!(source_dev(info, "txfs:/var/a"), Some(libc::makedev(0, 64)));
        assert_eq!(source_dev(info, "txfs:/var/c"), None);
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
    }

    /// A mount point that is not UTF-8 is found byte for byte, and does not
    /// hide the rest of the table.
    #[test]
    fn a_mount_point_need_not_be_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let raw = b"24 1 0:63 / /mnt/t\xff rw - fuse.txfs txfs:/b rw\n25 1 0:64 / /mnt/u rw - fuse.txfs txfs:/c rw\n";
        let m = parse(&ascii(raw));
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point.as_os_str().as_bytes(), b"/mnt/t\xff");
        assert_eq!(m[1].point, PathBuf::from("/mnt/u"));
    }
}
