//! The ioctl transport exactly as the client libraries use it: every call
//! opens the mount root afresh (`open(MNT, O_RDONLY|O_DIRECTORY)`), issues
//! one ioctl, closes. Found by `reliability/isolation.py` (issue 4).

mod common;

use common::*;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// One ioctl through a fresh handle of the mount root, as libtxfs and the
/// Python package do it.
fn client_ioctl(mnt: &Path, cmd: u32) -> std::io::Result<()> {
    let f = File::open(mnt)?;
    let arg: [u32; 2] = [0, 0];
    // SAFETY: the _IOW commands read 8 bytes from `arg`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Story: a transaction lost a conflict in its body (a read after a
/// non-transactional writer changed the file). The client then opened the
/// mount root to send ABORT — and opening a directory read its listing in
/// the doomed transaction, which failed with EDEADLK. The abort could never
/// be delivered: the thread stayed in the doomed transaction for good and
/// every later operation of it, `stat` included, failed with EDEADLK.
#[test]
fn a_doomed_transaction_can_be_aborted_through_a_fresh_root_handle() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    let mut agent = Agent::spawn(m.mnt());
    client_ioctl(m.mnt(), IOC_BEGIN).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "0\n");
    agent.ok("open(M + '/c', 'w').write('100\\n')");
    // doomed now (or at commit at the latest)
    let _ = std::fs::read_to_string(m.path("c"));
    client_ioctl(m.mnt(), IOC_ABORT).expect("ABORT through a fresh handle of the mount root");
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "100\n", "the thread is out of the transaction");
    assert_eq!(m.live_txs(), 0);
    client_ioctl(m.mnt(), IOC_BEGIN).expect("a new transaction");
    std::fs::write(m.path("c"), "2\n").unwrap();
    client_ioctl(m.mnt(), IOC_COMMIT).expect("commit");
    assert_eq!(agent.ok("out = open(M + '/c').read()"), "2\n");
}

/// Story: committing through a fresh handle of the mount root read the
/// root's listing inside the transaction; any name another process created
/// in the root after the transaction began then made the commit fail with
/// a conflict, though the transaction never looked at the root.
#[test]
fn opening_the_root_for_commit_does_not_read_its_listing() {
    let m = Mount::with_backing(|b| std::fs::create_dir(b.join("sub")).unwrap());
    let mut agent = Agent::spawn(m.mnt());
    client_ioctl(m.mnt(), IOC_BEGIN).unwrap();
    std::fs::write(m.path("sub/x"), "x").unwrap();
    agent.ok("open(M + '/other', 'w').write('o')");
    client_ioctl(m.mnt(), IOC_COMMIT).expect("an unrelated create in the root is no conflict");
    assert_eq!(agent.ok("out = open(M + '/sub/x').read()"), "x");
    // Listing a directory inside a transaction still counts as reading it.
    client_ioctl(m.mnt(), IOC_BEGIN).unwrap();
    assert_eq!(names(m.mnt()), ["other", "sub"]);
    std::fs::write(m.path("sub/y"), "y").unwrap();
    agent.ok("open(M + '/third', 'w').write('t')");
    assert_errno(client_ioctl(m.mnt(), IOC_COMMIT), libc::EDEADLK, "the listing read went stale");
    let _ = client_ioctl(m.mnt(), IOC_ABORT);
    assert_eq!(m.live_txs(), 0);
}
