//! Memory caps on a real mount (issue 23, SPEC §4a): `-o tx_mem=SIZE`
//! stops a transaction that holds too much with ENOSPC, the transaction
//! can then only be aborted, `txfs run` does not rerun it, and everyone
//! else is served throughout.
mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::process::Command;

/// One-byte writes with gaps in a thread transaction under tx_mem=2M: the
/// write that crosses the cap fails with ENOSPC, so do the transaction's
/// later operations and its commit; nothing of it is visible, and plain
/// writes and new transactions go on.
#[test]
fn a_thread_transaction_past_tx_mem_fails_with_enospc_and_only_aborts() {
    let m = Mount::start_with(&["tx_mem=2M"], |b| std::fs::write(b.join("f"), "committed").unwrap());
    let f = std::fs::OpenOptions::new().read(true).write(true).open(m.path("f")).unwrap();
    m.begin().unwrap();
    let mut n = 0u64;
    let err = loop {
        match f.write_at(b"x", 100 + 2 * n) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 200_000, "no cap after {n} writes");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(n > 2_000, "stopped after only {n} writes");
    assert_errno(f.write_at(b"y", 0), libc::ENOSPC, "a write after the cap");
    assert_errno(std::fs::metadata(m.path("g")), libc::ENOSPC, "a lookup after the cap");
    // STATE does not call it a lost conflict (clients rerun those: this
    // one would fail the same way again).
    let mut st = [0u8; 16];
    m.ioctl_buf(0x8010_e707, &mut st).expect("STATE");
    assert_ne!(u64::from_le_bytes(st[0..8].try_into().unwrap()), 0, "the transaction lives on");
    assert_eq!(u32::from_le_bytes(st[12..16].try_into().unwrap()) & 1, 0, "STATE says doomed by a conflict");
    assert_errno(m.commit(), libc::ENOSPC, "the commit");
    // The failed commit ended it: this thread is plain again.
    let mut got = vec![0u8; 9];
    f.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b"committed");
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 9, "none of its writes");
    f.write_at(b"C", 0).unwrap();
    m.begin().unwrap();
    f.write_at(b"o", 1).unwrap();
    m.commit().unwrap();
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"Committed");
    assert_eq!(m.live_txs(), 0);
    let log = m.log_text();
    assert!(log.contains("over tx_mem=2.0 MiB"), "daemon.log names the cap:\n{log}");
}

/// A command under `txfs run --retries 3` that makes more files than its
/// cap allows fails once, with its own exit status, and is not rerun (a
/// rerun would meet the same cap); nothing of it survives.
#[test]
fn txfs_run_does_not_rerun_a_transaction_past_its_cap() {
    let m = Mount::start_with(&["tx_mem=1M"], |_| {});
    let runs = m.scratch().join("runs");
    let script = format!(
        "echo run >> {runs}; mkdir d || exit 9; i=0; while [ $i -lt 20000 ]; do true > d/f$i || exit 7; i=$((i+1)); done",
        runs = runs.display()
    );
    let out = m.run_cmd(&["--retries", "3"], &["sh", "-c", &script]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "the command's own status: {err}");
    assert!(err.contains("No space left on device"), "the shell says why: {err}");
    assert!(!err.contains("retrying"), "not rerun: {err}");
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n", "one run");
    assert!(!m.path("d").exists(), "nothing of it survives");
    // And one that swallows the error: its commit fails and says why.
    let script = "mkdir e; i=0; while [ $i -lt 20000 ]; do true > e/f$i 2>/dev/null; i=$((i+1)); done; exit 0";
    let out = m.run_cmd(&[], &["sh", "-c", script]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a commit past the cap failed");
    assert!(err.contains("tx_mem"), "txfs run names the limits: {err}");
    assert!(!m.path("e").exists());
    assert_eq!(m.live_txs(), 0);
}

/// A cap that is no size is refused before any daemon starts.
#[test]
fn a_bad_cap_is_refused_at_mount() {
    let t = tempfile::tempdir().unwrap();
    let (b, mnt) = (t.path().join("b"), t.path().join("m"));
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    for (opt, says) in
        [("tx_mem=lots", "tx_mem=lots"), ("mount_tx_mem=0", "mount_tx_mem=0"), ("tx_reads=-1", "tx_reads")]
    {
        let out = Command::new(TXFS).args(["mount", "-o", opt]).arg(&b).arg(&mnt).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "-o {opt} was accepted");
        assert!(err.contains(says), "names it: {err}");
        assert!(!is_mounted(&mnt));
    }
}

/// The files txfs keeps for an unprivileged user's transaction (here a new
/// file's staged content) are that user's while it lives, so that disk
/// quotas count them; after the commit the file has its own owner.
#[test]
fn data_files_of_a_users_transaction_are_that_users() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    let mut m = Mount::start_with(&["allow_other"], |b| {
        std::fs::create_dir(b.join("pub")).unwrap();
        std::fs::set_permissions(b.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    });
    m.restart_with_env("TXFS_STAGE_BYTES", "65536");
    let mut cmd = Command::new(python());
    cmd.uid(NOBODY).gid(NOBODY);
    let mut a = Agent::spawn_cmd(cmd, m.mnt());
    a.ok(&format!(
        "root = os.open(M, os.O_RDONLY); fcntl.ioctl(root, {IOC_BEGIN}, bytes(8))\n\
         f = os.open(M + '/pub/big', os.O_WRONLY | os.O_CREAT, 0o644)\n\
         os.write(f, b'z' * 300000); os.close(f)"
    ));
    let owners: Vec<(u32, u64)> = std::fs::read_dir(m.backing().join(".txfs/data"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .map(|md| (md.uid(), md.len()))
        .collect();
    assert!(owners.iter().any(|(uid, len)| *uid == NOBODY && *len >= 300_000), "data files: {owners:?}");
    a.ok(&format!("fcntl.ioctl(root, {IOC_COMMIT}, bytes(8))"));
    let md = std::fs::metadata(m.path("pub/big")).unwrap();
    assert_eq!((md.uid(), md.len()), (NOBODY, 300_000));
    a.ok("os.close(root)");
    drop(a);
    m.umount_clean();
    let md = std::fs::metadata(m.backing().join("pub/big")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (NOBODY, NOBODY, 0o644));
}
