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
    let (tx, depth, ok, last, _) = begin_full(m, ask);
    (tx, depth, ok, last)
}

/// All of it: `(tx, depth, last_committed, last_tx, prior_tx)`.
fn begin_full(m: &Mount, ask: u64) -> (u64, u32, u32, u64, u64) {
    let mut b = [0u8; 32];
    b[16..24].copy_from_slice(&ask.to_le_bytes());
    m.ioctl_buf(IOC_BEGIN_STATE, &mut b).expect("BEGIN_STATE");
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    (u64_at(0), u32_at(8), u32_at(12), u64_at(16), u64_at(24))
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
    let (t1, depth, _, last, prior) = begin_full(&m, 0);
    assert!(t1 != 0 && depth == 1 && last == 0 && prior == 0, "a first transaction: {t1} {depth} {last} {prior}");
    let (t, depth, _, _, prior) = begin_full(&m, 0);
    assert_eq!((t, depth, prior), (t1, 2, t1), "a nested begin names the same transaction, and the one before");
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

const IOC_BATCH: u32 = 0x4008_e70a;

fn batch(records: &[(u64, &[u8])]) -> Vec<u8> {
    let mut b = b"TXFSBAT1".to_vec();
    b.extend_from_slice(&[0; 8]);
    for (off, data) in records {
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(data);
    }
    let len = b.len() as u64;
    b[8..16].copy_from_slice(&len.to_le_bytes());
    b
}

fn ioctl_on(f: &std::fs::File, cmd: u32) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let arg = [0u32; 2];
    // SAFETY: an _IOW command reading 8 bytes.
    if unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// TXFS_IOC_BATCH (the SQLite VFS's V9): writes through a batch descriptor
/// carry several writes to its file, applied in order inside the writer's
/// transaction; a malformed or split batch is refused whole; only a
/// descriptor open for writing can become one; other descriptors of the
/// file keep plain writes.
#[test]
fn a_batch_descriptor_applies_several_writes_in_one_request_or_none() {
    use std::os::unix::fs::FileExt;
    let m = Mount::new();
    std::fs::write(m.path("f"), vec![b'.'; 20000]).unwrap();
    let ro = std::fs::File::open(m.path("f")).unwrap();
    assert_eq!(errno_of(ioctl_on(&ro, IOC_BATCH)), libc::EBADF, "a read-only descriptor");
    let plain = std::fs::OpenOptions::new().write(true).open(m.path("f")).unwrap();
    let b = std::fs::OpenOptions::new().write(true).open(m.path("f")).unwrap();
    ioctl_on(&b, IOC_BATCH).expect("TXFS_IOC_BATCH");
    m.begin().unwrap();
    let good = batch(&[(0, b"AAAA"), (8192, b"BB"), (19998, b"CCCC"), (2, b"aa")]);
    assert_eq!(b.write_at(&good, 0).unwrap(), good.len());
    plain.write_at(b"plain", 100).unwrap();
    // Refused whole: a wrong length (as a split WRITE would carry), a bad
    // magic, a record running past the batch.
    let mut short = batch(&[(0, b"XXXX"), (4096, b"YYYY")]);
    short.truncate(short.len() - 2);
    let mut magic = batch(&[(0, b"XXXX")]);
    magic[0] = b'X';
    let mut over = batch(&[(0, b"XXXX")]);
    over[16 + 8] = 200;
    for bad in [&short, &magic, &over] {
        assert_eq!(b.write_at(bad, 0).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }
    // The transaction sees its writes; another thread sees none of them.
    assert_eq!(&std::fs::read(m.path("f")).unwrap()[..4], b"AAaa");
    let path = m.path("f");
    let outside = std::thread::spawn(move || std::fs::read(path).unwrap()).join().unwrap();
    assert_eq!((&outside[..4], outside.len()), (&b"...."[..], 20000), "seen outside before the commit");
    m.commit().unwrap();
    let got = std::fs::read(m.path("f")).unwrap();
    assert_eq!(got.len(), 20002, "the last record grew the file");
    assert_eq!(&got[..4], b"AAaa", "records apply in order");
    assert_eq!(&got[100..105], b"plain");
    assert_eq!(&got[8192..8194], b"BB");
    assert_eq!(&got[19998..], b"CCCC");
    assert!(!got.contains(&b'X') && !got.contains(&b'Y'), "a refused batch left nothing");
    // Outside a transaction a batch could not be atomic: refused.
    let out = batch(&[(0, b"ZZ"), (10, b"ZZ")]);
    assert_eq!(b.write_at(&out, 0).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert!(!std::fs::read(m.path("f")).unwrap().contains(&b'Z'));
}
