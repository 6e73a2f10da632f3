//! Finding txfs mounts in /proc/self/mountinfo.

use std::path::{Path, PathBuf};

pub const FSTYPE: &str = "fuse.txfs";

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

/// Decodes mountinfo's octal escapes (`\040` for a space).
pub(crate) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push(((b[i + 1] - b'0') << 6) | ((b[i + 2] - b'0') << 3) | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse(mountinfo: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else { continue };
        let point = pre.split(' ').nth(4);
        let mut rest = post.split(' ');
        let (fstype, source) = (rest.next(), rest.next());
        let ours = fstype == Some(FSTYPE) || (fstype == Some("fuse") && source.is_some_and(|s| s.starts_with("txfs:")));
        if let (true, Some(p), Some(src)) = (ours, point, source) {
            out.push(Mount { point: PathBuf::from(unescape(p)), source: unescape(src) });
        }
    }
    out
}

pub fn all() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|s| parse(&s)).unwrap_or_default()
}

pub fn find(point: &Path) -> Option<Mount> {
    let want = point.canonicalize().unwrap_or_else(|_| point.to_path_buf());
    all().into_iter().find(|m| m.point == want)
}

/// `$TXFS_MOUNT`, else the only txfs mount.
pub fn resolve(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("TXFS_MOUNT") {
        return Ok(PathBuf::from(p));
    }
    let all = all();
    match all.len() {
        1 => Ok(all[0].point.clone()),
        0 => Err("no txfs mount found (mount one, or set TXFS_MOUNT)".into()),
        n => Err(format!("{n} txfs mounts: say which with --mount or TXFS_MOUNT")),
    }
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
}
