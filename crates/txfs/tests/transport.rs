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

const IOC_BEGIN_STATE: u32 = 0xc020_e708;
const IOC_COMMIT_IF: u32 = 0x4010_e709;

/// `(tx, depth, last_committed, last_tx)` from TXFS_IOC_BEGIN_STATE.
fn begin_state(m: &Mount) -> (u64, u32, u32, u64) {
    begin_asking(m, 0)
}

/// The same, asking how transaction `ask` ended (0: the thread's last).
fn begin_asking(m: &Mount, ask: u64) -> (u64, u32, u32, u64) {
    let mut b = [0u8; 32];
    b[16..24].copy_from_slice(&ask.to_le_bytes());
    m.ioctl_buf(IOC_BEGIN_STATE, &mut b).expect("BEGIN_STATE");
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    (u64_at(0), u32_at(8), u32_at(12), u64_at(16))
}

fn commit_if(m: &Mount, tx: u64) -> std::io::Result<()> {
    let mut b = [0u8; 16];
    b[8..16].copy_from_slice(&tx.to_le_bytes());
    m.ioctl_buf(IOC_COMMIT_IF, &mut b)
}

/// The SQLite VFS's two-ioctl levels (V7 in txfs_vfs.c): a begin answers
/// the state after it and how the thread's previous own transaction ended;
/// a conditional commit leaves a level only of the transaction named.
#[test]
fn begin_state_reports_the_level_and_the_last_outcome_and_commit_if_checks_the_transaction() {
    let m = Mount::new();
    let (t1, depth, _, last) = begin_state(&m);
    assert!(t1 != 0 && depth == 1 && last == 0, "a first transaction: {t1} {depth} {last}");
    let (t, depth, _, _) = begin_state(&m);
    assert_eq!((t, depth), (t1, 2), "a nested begin names the same transaction");
    assert_eq!(errno_of(commit_if(&m, t1 + 1000)), libc::ESTALE, "another transaction's level is left alone");
    commit_if(&m, t1).expect("leaving our own level");
    std::fs::write(m.path("f"), "x").unwrap();
    commit_if(&m, t1).expect("the outermost commit");
    assert!(m.path("f").exists());
    let (t2, depth, ok, last) = begin_state(&m);
    assert_eq!((depth, ok, last), (1, 1, t1), "t1 committed");
    assert_ne!(t2, t1);
    m.abort().unwrap();
    let (t3, _, ok, last) = begin_state(&m);
    assert_eq!((ok, last), (0, t2), "t2 was aborted");
    m.commit().unwrap();
    assert_eq!(errno_of(commit_if(&m, t3)), libc::ESTALE, "no transaction left: nothing to commit");
    let (t4, _, ok, last) = begin_state(&m);
    assert_eq!((ok, last), (1, t3), "t3 committed through the plain COMMIT");
    m.abort().unwrap();
    // Older outcomes, asked by name: t1 committed, t2 aborted; t4 is
    // remembered as aborted; an unknown one, or a live one, is not known.
    for (ask, want) in [(t1, (1, t1)), (t2, (0, t2)), (t4, (0, t4)), (t4 + 1000, (0, 0))] {
        let (now, _, ok, last) = begin_asking(&m, ask);
        assert_eq!((ok, last), want, "asking about {ask}");
        let (_, _, ok, last) = begin_asking(&m, now);
        assert_eq!((ok, last), (0, 0), "the live transaction has no outcome yet");
        m.abort().unwrap();
        m.abort().expect_err("both levels went with the first abort");
    }
}

fn errno_of(r: std::io::Result<()>) -> i32 {
    r.expect_err("must fail").raw_os_error().unwrap_or(0)
}
