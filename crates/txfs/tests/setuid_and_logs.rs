//! Issue 23 on a shared mount: the daemon log is private.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

/// A daemon started without `-f` logs to BACKING/.txfs/daemon.log, which
/// names paths of every user: readable by root only, also when a log
/// of an older version left it wider.
#[test]
fn the_daemon_log_is_private() {
    sweep_stale_mounts();
    let tmp = tempfile::Builder::new().prefix(PREFIX).tempdir().expect("temp dir");
    let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
    std::fs::create_dir_all(backing.join(".txfs")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let log = backing.join(".txfs/daemon.log");
    std::fs::write(&log, b"an old line\n").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(TXFS).arg("mount").arg(&backing).arg(&mnt).output().expect("txfs mount");
    let mounted = is_mounted(&mnt);
    let mode = mode_of(&log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if mounted {
        let st = Command::new(TXFS).arg("umount").arg(&mnt).status().expect("txfs umount");
        assert!(st.success(), "txfs umount");
    }
    assert!(out.status.success() && mounted, "txfs mount: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode, 0o600, "the daemon log's mode");
    assert!(text.starts_with("an old line\n") && text.len() > 12, "the log is appended to: {text:?}");
}
