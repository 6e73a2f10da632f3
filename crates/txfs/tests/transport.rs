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

const IOC_BEGIN_FILE: u32 = 0xc040_e70b;

/// TXFS_IOC_BEGIN_FILE on `f`: `(tx, depth, size, bytes 24..40, file_valid)`.
fn begin_file(f: &std::fs::File) -> (u64, u32, u64, Vec<u8>, u32) {
    use std::os::unix::io::AsRawFd;
    let mut b = [0u8; 64];
    // SAFETY: an _IOWR command of 64 bytes on a 64-byte buffer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), IOC_BEGIN_FILE as _, b.as_mut_ptr()) };
    assert_eq!(r, 0, "BEGIN_FILE: {}", std::io::Error::last_os_error());
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    (u64_at(0), u32_at(8), u64_at(32), b[40..56].to_vec(), u32_at(56))
}

/// The SQLite VFS's V10: a begin issued on a file also answers that file's
/// size and bytes 24..40 as the new transaction sees them, and both enter
/// its read set (a plain change to either afterwards makes its commit lose).
#[test]
fn begin_file_answers_size_and_change_counter_and_reads_them_in_the_transaction() {
    let m = Mount::start_with(&[], |b| {
        let mut db = vec![b'.'; 100];
        db[24..40].copy_from_slice(b"0123456789abcdef");
        std::fs::write(b.join("db"), db).unwrap();
        std::fs::write(b.join("short"), "0123456789").unwrap();
    });
    let mut agent = Agent::spawn(m.mnt());
    let db = std::fs::File::open(m.path("db")).unwrap();

    // Outside a transaction: it begins one and answers the committed file.
    let (tx, depth, size, head, valid) = begin_file(&db);
    assert!(tx != 0 && depth == 1 && valid == 1, "tx {tx} depth {depth} valid {valid}");
    assert_eq!((size, head.as_slice()), (100, &b"0123456789abcdef"[..]));
    // The bytes were read in it: a plain write to them makes the commit lose.
    std::fs::write(m.path("mine"), "m").unwrap();
    agent.ok("fd = os.open(M + '/db', os.O_WRONLY); os.pwrite(fd, b'XY', 30); os.close(fd); out = 0");
    assert_errno(m.commit(), libc::EDEADLK, "commit after the change counter it read was overwritten");
    let _ = m.abort();

    // The size too: a plain append past byte 40 makes the commit lose.
    let (_, _, size, _, valid) = begin_file(&db);
    assert_eq!((size, valid), (100, 1));
    std::fs::write(m.path("mine"), "m").unwrap();
    agent.ok("fd = os.open(M + '/db', os.O_WRONLY | os.O_APPEND); os.write(fd, b'tail'); os.close(fd); out = 0");
    assert_errno(m.commit(), libc::EDEADLK, "commit after the size it read changed");
    let _ = m.abort();

    // Nested in a transaction that wrote the file: its own view.
    m.begin().unwrap();
    let w = std::fs::OpenOptions::new().write(true).open(m.path("db")).unwrap();
    use std::os::unix::fs::FileExt;
    w.write_all_at(b"ZZZZZZZZZZZZZZZZ", 24).unwrap();
    w.write_all_at(b"end", 197).unwrap();
    let (_, depth, size, head, valid) = begin_file(&db);
    assert_eq!((depth, size, head.as_slice(), valid), (2, 200, &b"ZZZZZZZZZZZZZZZZ"[..], 1));
    // Outside, nothing of it.
    assert_eq!(agent.ok("out = os.stat(M + '/db').st_size"), 104);
    m.abort().unwrap();

    // Not there: a file shorter than 40 bytes, or a directory.
    let short = std::fs::File::open(m.path("short")).unwrap();
    let (_, _, _, _, valid) = begin_file(&short);
    assert_eq!(valid, 0, "a 10-byte file has no bytes 24..40");
    m.abort().unwrap();
    let root = std::fs::File::open(m.mnt()).unwrap();
    let (_, depth, _, _, valid) = begin_file(&root);
    assert_eq!((depth, valid), (1, 0), "a directory");
    m.abort().unwrap();
    assert_eq!(m.live_txs(), 0);
}
