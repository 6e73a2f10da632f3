//! Issue 23 on a shared (`allow_other`) mount: setuid and setgid bits go
//! exactly when ext4 drops them — a write, truncation, fallocate or chown by each kind
//! of caller, in and out of transactions, compared with the same operation
//! on a file of the real disk — and the daemon log is private.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// The unprivileged caller: nobody, in its own group only (not the group
/// of the files, which are root's).
const NOBODY: u32 = 65534;

/// What each case runs, as a caller: `python3 -c OP PATH TX MNT` where TX is
/// "" (no transaction), "commit" or "abort" (a thread transaction begun on
/// MNT around the operation). Prints the mode seen inside, if any.
const OP: &str = r#"
import os, sys, fcntl, struct
path, op, tx, mnt = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
BEGIN, COMMIT, ABORT = 0x4008e701, 0x4008e702, 0x4008e703
if tx:
    ctl = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.ioctl(ctl, BEGIN, struct.pack("Q", 0))
if op == "append":
    fd = os.open(path, os.O_WRONLY | os.O_APPEND); os.write(fd, b"more"); os.close(fd)
elif op == "pwrite":
    fd = os.open(path, os.O_RDWR); os.pwrite(fd, b"y", 1); os.close(fd)
elif op == "empty-write":
    fd = os.open(path, os.O_WRONLY); os.write(fd, b""); os.close(fd)
elif op == "truncate":
    os.truncate(path, 1)
elif op == "ftruncate":
    fd = os.open(path, os.O_WRONLY); os.ftruncate(fd, 3); os.close(fd)
elif op == "otrunc":
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC); os.write(fd, b"z"); os.close(fd)
elif op in ("fallocate", "fallocate-keep", "punch"):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    mode = {"fallocate": 0, "fallocate-keep": 1, "punch": 3}[op]
    fd = os.open(path, os.O_RDWR)
    if libc.fallocate(fd, mode, 1, 8192) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
    os.close(fd)
elif op == "chown":
    os.chown(path, 65534, -1)
elif op == "chgrp-self":
    os.chown(path, -1, os.getgid())
else:
    raise SystemExit("unknown op " + op)
inside = oct(os.stat(path).st_mode & 0o7777)
if tx:
    fcntl.ioctl(ctl, COMMIT if tx == "commit" else ABORT, struct.pack("Q", 0))
print(inside)
"#;

#[derive(Clone, Copy, Debug)]
enum Caller {
    Root,
    /// nobody, in no group of the file.
    Nobody,
    /// nobody with the file's group (root's, 0) among its supplementary
    /// groups.
    NobodyInGroup,
}

/// Runs `op` on `path` as `who`; the mode the caller saw right after it.
fn run_as(who: Caller, op: &str, path: &Path, tx: &str, mnt: &Path) -> String {
    let mut cmd = match who {
        Caller::Root => Command::new(python()),
        Caller::Nobody | Caller::NobodyInGroup => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={NOBODY}")).arg(format!("--regid={NOBODY}"));
            match who {
                Caller::NobodyInGroup => c.arg(format!("--groups=0,{NOBODY}")),
                _ => c.arg("--clear-groups"),
            };
            c.arg(python());
            c
        }
    };
    let out = cmd.arg("-c").arg(OP).arg(path).arg(op).arg(tx).arg(mnt).output().expect("running the case");
    assert!(
        out.status.success(),
        "{op} on {} as {who:?} (tx {tx:?}) failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

/// A fresh file of root's, group root, `mode`, in `dir`; chown cases start
/// from a file nobody owns (so its owner may chgrp it).
fn fresh(dir: &Path, name: &str, mode: u32, owner: u32) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, b"data").expect("write");
    std::os::unix::fs::chown(&p, Some(owner), Some(0)).expect("chown");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    assert_eq!(mode_of(&p), mode, "set up {}", p.display());
    p
}

const MODES: [u32; 8] = [0o4777, 0o2777, 0o2767, 0o6777, 0o6767, 0o4766, 0o2677, 0o0777];

/// Every case on ext4 and on the mount, compared; `tx` as in [`OP`].
fn compare_with_ext4(m: &Mount, tx: &str) {
    let disk = m.scratch().join(format!("disk-{}", if tx.is_empty() { "plain" } else { tx }));
    let onmnt = m.path(format!("mnt-{}", if tx.is_empty() { "plain" } else { tx }));
    for d in [&disk, &onmnt] {
        std::fs::create_dir(d).expect("case dir");
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).expect("chmod case dir");
    }
    let mut diffs = Vec::new();
    let mut n = 0;
    for who in [Caller::Root, Caller::Nobody, Caller::NobodyInGroup] {
        for op in [
            "append",
            "pwrite",
            "empty-write",
            "truncate",
            "ftruncate",
            "otrunc",
            "fallocate",
            "fallocate-keep",
            "punch",
            "chown",
            "chgrp-self",
        ] {
            // Only root may give a file away; only the owner may chgrp it.
            let owner = match (op, who) {
                ("chown", Caller::Root) => 0,
                ("chown", _) => continue,
                ("chgrp-self", Caller::Root) => continue,
                ("chgrp-self", _) => NOBODY,
                _ => 0,
            };
            for mode in MODES {
                let name = format!("{op}-{who:?}-{mode:o}");
                let want_file = fresh(&disk, &name, mode, owner);
                let got_file = fresh(&onmnt, &name, mode, owner);
                let want_inside = run_as(who, op, &want_file, "", &disk);
                let got_inside = run_as(who, op, &got_file, tx, m.mnt());
                let want = mode_of(&want_file);
                let got = mode_of(&got_file);
                // An aborted transaction leaves the mode as it was; inside
                // it the caller saw what ext4 shows.
                let want_after = if tx == "abort" { mode } else { want };
                if got != want_after || got_inside != want_inside {
                    diffs.push(format!(
                        "{name}: ext4 {want:o}, txfs {got:o} after (want {want_after:o}); inside: ext4 {want_inside}, \
                         txfs {got_inside}"
                    ));
                }
                n += 1;
            }
        }
    }
    assert!(diffs.is_empty(), "{} of {n} cases differ from ext4 (tx {tx:?}):\n{}", diffs.len(), diffs.join("\n"));
}

#[test]
fn setuid_and_setgid_go_as_on_ext4_outside_transactions() {
    let m = Mount::start_with(&["allow_other"], |_| {});
    std::fs::set_permissions(m.mnt(), std::fs::Permissions::from_mode(0o777)).expect("chmod mount root");
    compare_with_ext4(&m, "");
}

#[test]
fn setuid_and_setgid_go_as_on_ext4_inside_committed_transactions() {
    let m = Mount::start_with(&["allow_other"], |_| {});
    std::fs::set_permissions(m.mnt(), std::fs::Permissions::from_mode(0o777)).expect("chmod mount root");
    compare_with_ext4(&m, "commit");
}

#[test]
fn an_aborted_transaction_gives_setuid_and_setgid_back() {
    let m = Mount::start_with(&["allow_other"], |_| {});
    std::fs::set_permissions(m.mnt(), std::fs::Permissions::from_mode(0o777)).expect("chmod mount root");
    compare_with_ext4(&m, "abort");
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

/// `txfs run` serves its command a transaction view, whose kernel writes
/// through its page cache and never marks a write for the daemon: a command
/// that drops to another user still leaves committed modes as ext4 would
/// (what it stats inside the view may stay stale; see `ops.rs`).
#[test]
fn a_write_in_a_transaction_view_drops_setuid_and_setgid_as_on_ext4() {
    let m = Mount::start_with(&["allow_other"], |_| {});
    std::fs::set_permissions(m.mnt(), std::fs::Permissions::from_mode(0o777)).expect("chmod mount root");
    let disk = m.scratch();
    std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o777)).expect("chmod scratch");
    let mut diffs = Vec::new();
    for mode in MODES {
        let name = format!("view-{mode:o}");
        let want_file = fresh(&disk, &name, mode, 0);
        let got_file = fresh(m.mnt(), &name, mode, 0);
        run_as(Caller::Nobody, "append", &want_file, "", &disk);
        let script = format!("echo more >> {}", got_file.display());
        let drop = [format!("--reuid={NOBODY}"), format!("--regid={NOBODY}"), "--clear-groups".into()];
        let out =
            m.run_cmd(&[], &["setpriv", &drop[0], &drop[1], &drop[2], "sh", "-c", &script]).output().expect("txfs run");
        assert!(out.status.success(), "txfs run: {}", String::from_utf8_lossy(&out.stderr));
        let (want, got) = (mode_of(&want_file), mode_of(&got_file));
        if want != got {
            diffs.push(format!("{name}: ext4 {want:o}, txfs {got:o}"));
        }
    }
    assert!(m.log_text().contains("serving a transaction view"), "the runs were served views");
    assert!(diffs.is_empty(), "modes differ from ext4 after a write in a view:\n{}", diffs.join("\n"));
}
