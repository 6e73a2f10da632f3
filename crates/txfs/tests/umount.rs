//! `txfs umount` and the descriptors libtxfs keeps between transactions.
//!
//! libtxfs (clients/c/txfs.c) keeps, per thread, the descriptor of the
//! mount root its last transaction used, opened `O_RDONLY|O_DIRECTORY|
//! O_DSYNC` as a mark. Such descriptors keep the mount busy; `txfs umount`
//! detaches the mount when they are all that hold it and no transaction is
//! live, and refuses (naming the holders) otherwise. The agents here hold
//! exactly such a descriptor.

mod common;

use common::*;
use std::process::Command;

/// Python for the agent: keep a marked descriptor of the mount root in `K`.
const KEEP: &str = "K = os.open(M, os.O_RDONLY | os.O_DIRECTORY | os.O_DSYNC)";

fn ioc(cmd: u32) -> String {
    format!("fcntl.ioctl(K, {cmd:#x}, struct.pack('II', 0, 0))")
}

/// `txfs umount MNT`: (success, stderr).
fn txfs_umount(m: &Mount) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_txfs")).arg("umount").arg(m.mnt()).output().expect("txfs umount");
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Story: a mail client linked with libtxfs commits, then sits idle with its
/// kept descriptor; the admin's `txfs umount` must still unmount (after the
/// checkpoint), and the client's next transaction must fail cleanly, not
/// reach a daemon that is gone.
#[test]
fn umount_detaches_a_mount_held_only_by_kept_descriptors() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok(&ioc(IOC_BEGIN));
    agent.ok("open(M + '/mail', 'w').write('kept')");
    agent.ok(&ioc(IOC_COMMIT));
    m.umount_clean();
    assert_eq!(std::fs::read_to_string(m.backing().join("mail")).unwrap(), "kept", "committed and checkpointed");
    match agent.run(&ioc(IOC_BEGIN)) {
        Err(e) => assert!(
            [libc::ENOTCONN, libc::ECONNABORTED, libc::ENODEV].contains(&e),
            "a begin on the kept descriptor of the gone mount: {}",
            errname(e)
        ),
        Ok(v) => panic!("a begin on the kept descriptor of an unmounted txfs succeeded ({v})"),
    }
}

/// Story: someone has a shell in the mount. `txfs umount` must refuse as
/// umount(8) does, and say who holds it, although a kept descriptor is
/// there too.
#[test]
fn umount_refuses_while_a_process_works_in_the_mount() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok("os.chdir(M)");
    let (ok, err) = txfs_umount(&m);
    assert!(!ok, "txfs umount detached a mount that a process works in");
    assert!(is_mounted(m.mnt()), "still mounted after the refusal");
    let who = format!("pid {}", agent.pid());
    assert!(err.contains("busy") && err.contains(&who) && err.contains("cwd"), "the error names the holder: {err}");
    agent.ok("os.chdir('/')");
    m.umount_clean();
}

/// Story: a thread is inside a transaction (its descriptor carries the same
/// mark). Unmounting then would abort work in progress: refuse, and succeed
/// once it committed.
#[test]
fn umount_refuses_while_a_transaction_is_live() {
    let mut m = Mount::new();
    let mut agent = Agent::spawn(m.mnt());
    agent.ok(KEEP);
    agent.ok(&ioc(IOC_BEGIN));
    agent.ok("open(M + '/half', 'w').write('x')");
    let (ok, err) = txfs_umount(&m);
    assert!(!ok, "txfs umount detached a mount with a live transaction");
    assert!(err.contains("live transaction"), "the error says why: {err}");
    assert!(is_mounted(m.mnt()));
    agent.ok(&ioc(IOC_COMMIT));
    m.umount_clean();
    assert_eq!(std::fs::read_to_string(m.backing().join("half")).unwrap(), "x");
}
