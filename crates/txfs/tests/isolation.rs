//! Isolation through the kernel (SPEC §2, §3): what a thread's transaction
//! does is invisible to every other process until commit, visible to itself
//! at once, conflicts abort exactly the loser, and a transaction whose thread
//! or process dies is aborted.

mod common;

use common::*;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn cmd_out(prog: &str, args: &[&str], cwd: &Path) -> (bool, String, String) {
    let o = Command::new(prog).args(args).current_dir(cwd).output().unwrap_or_else(|e| panic!("{prog}: {e}"));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// What a separate process sees, through coreutils and a fresh python3.
fn outside_view(mnt: &Path) -> serde_json::Value {
    const PY: &str = r#"
import os, sys, json
M = sys.argv[1]
v = {'root': sorted(os.listdir(M)), 'files': {}, 'dirs': {}}
for n in v['root']:
    p = os.path.join(M, n)
    st = os.lstat(p)
    if os.path.isdir(p):
        v['dirs'][n] = sorted(os.listdir(p))
    else:
        with open(p, 'rb') as f:
            v['files'][n] = [st.st_size, f.read().decode('latin-1')]
print(json.dumps(v))
"#;
    let o = Command::new(python()).arg("-c").arg(PY).arg(mnt).output().expect("python3");
    assert!(o.status.success(), "python3 -c: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

#[test]
fn transaction_is_invisible_to_other_processes_until_commit() {
    let m = Mount::with_backing(|b| {
        std::fs::write(b.join("held"), "HELD-ORIGINAL").unwrap();
        std::fs::write(b.join("old_rename"), "R").unwrap();
        std::fs::write(b.join("victim"), "V").unwrap();
        std::fs::write(b.join("trunc"), "0123456789").unwrap();
    });
    let mnt = m.mnt().to_path_buf();
    let before = outside_view(&mnt);
    assert_eq!(before["root"], json!(["held", "old_rename", "trunc", "victim"]));

    // A process that opened files before the transaction and holds them;
    // it has also read them once, so the kernel had every chance to cache.
    let mut agent = Agent::spawn(&mnt);
    agent.ok("held = os.open(M + '/held', os.O_RDONLY); trunc = os.open(M + '/trunc', os.O_RDONLY)");
    agent.ok("out = [os.pread(held, 100, 0).decode(), os.pread(trunc, 100, 0).decode()]");
    agent.ok("out = [os.stat(M + '/' + n).st_size for n in sorted(os.listdir(M))]");

    m.begin().expect("begin");
    let mut f = File::create(m.path("new.txt")).expect("create in tx");
    f.write_all(b"hello new").unwrap();
    drop(f);
    let h = OpenOptions::new().write(true).open(m.path("held")).unwrap();
    h.write_all_at(b"HELD-MODIFIED-AND-LONGER", 0).unwrap();
    drop(h);
    std::fs::rename(m.path("old_rename"), m.path("renamed")).expect("rename in tx");
    std::fs::remove_file(m.path("victim")).expect("unlink in tx");
    OpenOptions::new().write(true).open(m.path("trunc")).unwrap().set_len(3).expect("truncate in tx");
    std::fs::create_dir(m.path("newdir")).expect("mkdir in tx");
    std::fs::write(m.path("newdir/inner"), "in").unwrap();
    std::fs::write(m.path("ephemeral"), "now you see me").unwrap();

    // Nothing of it from outside: coreutils ...
    for name in ["new.txt", "renamed", "newdir", "newdir/inner", "ephemeral"] {
        let (ok, _, err) = cmd_out("stat", &[name], &mnt);
        assert!(!ok && err.contains("No such file"), "stat {name} from outside during the tx: {err}");
    }
    let (ok, out, _) = cmd_out("ls", &["-a"], &mnt);
    assert!(ok);
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), [".", "..", "held", "old_rename", "trunc", "victim"]);
    assert_eq!(cmd_out("cat", &["held"], &mnt).1, "HELD-ORIGINAL");
    assert_eq!(cmd_out("cat", &["victim"], &mnt).1, "V");
    assert_eq!(cmd_out("cat", &["old_rename"], &mnt).1, "R");
    assert_eq!(cmd_out("stat", &["-c", "%s", "trunc"], &mnt).1.trim(), "10");
    let (ok, _, err) = cmd_out("cat", &["new.txt"], &mnt);
    assert!(!ok && err.contains("No such file"), "{err}");
    // ... a fresh python3 ...
    assert_eq!(outside_view(&mnt), before, "a separate process saw the open transaction");
    // ... and file descriptors opened before the transaction began.
    assert_eq!(agent.ok("out = os.pread(held, 100, 0).decode()"), "HELD-ORIGINAL");
    assert_eq!(agent.ok("out = os.fstat(held).st_size"), 13);
    assert_eq!(agent.ok("out = os.pread(trunc, 100, 0).decode()"), "0123456789");
    assert_eq!(agent.ok("out = os.fstat(trunc).st_size"), 10);
    agent.fails("os.stat(M + '/ephemeral')", libc::ENOENT);
    agent.fails("os.open(M + '/ephemeral', os.O_RDONLY)", libc::ENOENT);
    agent.fails("os.listdir(M + '/newdir')", libc::ENOENT);

    // Created and deleted inside the transaction: never visible.
    std::fs::remove_file(m.path("ephemeral")).unwrap();
    agent.fails("os.stat(M + '/ephemeral')", libc::ENOENT);

    m.commit().expect("commit");

    // All of it, at once.
    let after = outside_view(&mnt);
    assert_eq!(after["root"], json!(["held", "new.txt", "newdir", "renamed", "trunc"]));
    assert_eq!(after["files"]["new.txt"], json!([9, "hello new"]));
    assert_eq!(after["files"]["held"], json!([24, "HELD-MODIFIED-AND-LONGER"]));
    assert_eq!(after["files"]["renamed"], json!([1, "R"]));
    assert_eq!(after["files"]["trunc"], json!([3, "012"]));
    assert_eq!(after["dirs"]["newdir"], json!(["inner"]));
    assert_eq!(cmd_out("cat", &["newdir/inner"], &mnt).1, "in");
    let (ok, _, err) = cmd_out("stat", &["victim"], &mnt);
    assert!(!ok && err.contains("No such file"), "{err}");
    assert_eq!(agent.ok("out = os.pread(held, 100, 0).decode()"), "HELD-MODIFIED-AND-LONGER");
    assert_eq!(agent.ok("out = os.fstat(held).st_size"), 24);
    assert_eq!(agent.ok("out = os.pread(trunc, 100, 0).decode()"), "012");
    agent.fails("os.stat(M + '/ephemeral')", libc::ENOENT);

    // Abort leaves no trace.
    let snap = snapshot(&mnt);
    m.begin().expect("begin 2");
    std::fs::write(m.path("aborted"), "nope").unwrap();
    OpenOptions::new().write(true).open(m.path("held")).unwrap().write_all_at(b"XXXX", 0).unwrap();
    std::fs::remove_file(m.path("trunc")).unwrap();
    std::fs::rename(m.path("renamed"), m.path("newdir/moved")).unwrap();
    std::fs::create_dir(m.path("adir")).unwrap();
    std::fs::set_permissions(m.path("new.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(m.path("newdir/inner")).unwrap();
    assert_errno(std::fs::remove_dir(m.path("newdir")), libc::ENOTEMPTY, "rmdir of a dir holding a moved file");
    assert_eq!(outside_view(&mnt), after, "the second transaction leaked before abort");
    m.abort().expect("abort");
    assert_eq!(snapshot(&mnt), snap, "abort left a trace (seen by the aborting thread)");
    assert_eq!(outside_view(&mnt), after, "abort left a trace (seen from outside)");
    assert_eq!(agent.ok("out = os.pread(held, 100, 0).decode()"), "HELD-MODIFIED-AND-LONGER");
    assert_eq!(m.live_txs(), 0);
}

#[test]
fn transaction_sees_its_own_changes_at_once() {
    let m = Mount::with_backing(|b| {
        std::fs::write(b.join("f"), "original-content").unwrap();
        std::fs::write(b.join("g"), "gg").unwrap();
        std::fs::write(b.join("h"), "hh").unwrap();
    });
    // Warm every cache the kernel might keep, and keep an fd from before.
    let mut pre = OpenOptions::new().read(true).write(true).open(m.path("f")).unwrap();
    let mut s = String::new();
    pre.read_to_string(&mut s).unwrap();
    for n in ["f", "g", "h"] {
        std::fs::metadata(m.path(n)).unwrap();
    }
    assert_eq!(names(m.mnt()), ["f", "g", "h"]);
    let mut agent = Agent::spawn(m.mnt());

    m.begin().unwrap();
    // write, then read back: same fd, new fd, fd opened before the tx.
    let mut f = OpenOptions::new().read(true).write(true).open(m.path("f")).unwrap();
    f.write_all(b"NEW").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "NEWginal-content", "read back through the writing fd");
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "NEWginal-content", "through a new fd");
    // appending, then stat
    let mut a = OpenOptions::new().append(true).open(m.path("f")).unwrap();
    a.write_all(b"+tail").unwrap();
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 21);
    assert_eq!(f.metadata().unwrap().len(), 21, "fstat");
    // truncate, then stat size
    f.set_len(5).unwrap();
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().len(), 5, "stat after truncate");
    assert_eq!(pre.metadata().unwrap().len(), 5, "fstat of the old fd after truncate");
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"NEWgi");
    f.set_len(100).unwrap();
    let data = std::fs::read(m.path("f")).unwrap();
    assert_eq!(data.len(), 100);
    assert_eq!(&data[..5], b"NEWgi");
    assert!(data[5..].iter().all(|&b| b == 0), "extended by truncate: zeros");
    // rename, then open the new name; the old name is gone
    std::fs::rename(m.path("g"), m.path("g2")).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("g2")).unwrap(), "gg");
    assert_errno(std::fs::metadata(m.path("g")), libc::ENOENT, "stat old name after rename");
    assert_errno(File::open(m.path("g")), libc::ENOENT, "open old name after rename");
    // unlink, then stat -> ENOENT
    std::fs::remove_file(m.path("h")).unwrap();
    assert_errno(std::fs::metadata(m.path("h")), libc::ENOENT, "stat after unlink");
    assert_errno(File::open(m.path("h")), libc::ENOENT, "open after unlink");
    assert_errno(std::fs::remove_file(m.path("h")), libc::ENOENT, "unlink twice");
    // create, mkdir, rmdir, chmod
    std::fs::write(m.path("n"), "nn").unwrap();
    assert_eq!(std::fs::metadata(m.path("n")).unwrap().len(), 2);
    std::fs::create_dir(m.path("dd")).unwrap();
    std::fs::write(m.path("dd/x"), "x").unwrap();
    assert_eq!(names(&m.path("dd")), ["x"]);
    assert_errno(std::fs::remove_dir(m.path("dd")), libc::ENOTEMPTY, "rmdir of a non-empty dir");
    std::fs::remove_file(m.path("dd/x")).unwrap();
    std::fs::remove_dir(m.path("dd")).unwrap();
    assert_errno(std::fs::metadata(m.path("dd")), libc::ENOENT, "stat after rmdir");
    std::fs::set_permissions(m.path("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.path("f")).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(names(m.mnt()), ["f", "g2", "n"]);

    // Meanwhile, outside: the old state.
    assert_eq!(agent.ok("out = sorted(os.listdir(M))"), json!(["f", "g", "h"]));
    assert_eq!(agent.ok("out = open(M + '/f').read()"), "original-content");
    assert_eq!(agent.ok("out = os.stat(M + '/f').st_mode & 0o7777"), 0o644);

    m.commit().unwrap();
    assert_eq!(agent.ok("out = sorted(os.listdir(M))"), json!(["f", "g2", "n"]));
    assert_eq!(agent.ok("out = os.stat(M + '/f').st_size"), 100);
    assert_eq!(agent.ok("out = os.stat(M + '/f').st_mode & 0o7777"), 0o600);
    assert_eq!(agent.ok("out = open(M + '/g2').read()"), "gg");
}

#[derive(Debug, Clone, PartialEq)]
enum Attempt {
    Committed,
    /// Failed with this errno at this step ("read", "write", "commit").
    Failed(&'static str, i32),
}

fn bump_once(m: &Mount, barrier: Option<&std::sync::Barrier>) -> Attempt {
    m.begin().expect("begin");
    let fail = |step: &'static str, e: std::io::Error| {
        let errno = e.raw_os_error().unwrap_or(-1);
        if step != "commit" {
            // A doomed transaction fails every later operation the same way.
            assert_errno(std::fs::read(m.path("c")), errno, "a read after the conflict");
            assert_errno(m.commit(), errno, "commit after the conflict");
        }
        // After a failed commit the transaction may already be gone.
        match m.abort() {
            Ok(()) => {}
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "abort after a conflict: {e}"),
        }
        Attempt::Failed(step, errno)
    };
    let v: u64 = match std::fs::read_to_string(m.path("c")) {
        Ok(s) => s.trim().parse().unwrap(),
        Err(e) => return fail("read", e),
    };
    if let Some(b) = barrier {
        b.wait();
    }
    if let Err(e) = std::fs::write(m.path("c"), format!("{}\n", v + 1)) {
        return fail("write", e);
    }
    match m.commit() {
        Ok(()) => Attempt::Committed,
        Err(e) => fail("commit", e),
    }
}

#[test]
fn conflicting_read_modify_writes_exactly_one_commits() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    for round in 0..3u64 {
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<(Attempt, Vec<Attempt>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let first = bump_once(&m, Some(&barrier));
                        let mut retries = Vec::new();
                        if first != Attempt::Committed {
                            for _ in 0..10 {
                                let a = bump_once(&m, None);
                                retries.push(a.clone());
                                if a == Attempt::Committed {
                                    break;
                                }
                            }
                        }
                        (first, retries)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("worker panicked")).collect()
        });
        eprintln!("round {round}: {results:?}");
        let wins = results.iter().filter(|(a, _)| *a == Attempt::Committed).count();
        assert_eq!(wins, 1, "round {round}: exactly one of two conflicting transactions commits: {results:?}");
        for (first, retries) in &results {
            if let Attempt::Failed(step, errno) = first {
                assert_eq!(*errno, libc::EDEADLK, "round {round}: the loser failed at {step} with {}", errname(*errno));
                assert_eq!(retries.last(), Some(&Attempt::Committed), "round {round}: the retry commits: {retries:?}");
            }
        }
        assert_eq!(
            std::fs::read_to_string(m.path("c")).unwrap().trim(),
            format!("{}", 2 * (round + 1)),
            "round {round}: a lost update"
        );
    }
    assert!(m.status()["conflicts"].as_u64().unwrap() >= 3, "status counts conflicts: {}", m.status());
    assert_eq!(m.live_txs(), 0);
}

/// How long the daemon may take to notice a dead thread's or process's
/// transaction and abort it. Not a speed limit: a transaction that is
/// never reaped stays live for good.
const REAPED: Duration = Duration::from_secs(60);

#[test]
fn thread_or_process_exiting_in_a_transaction_aborts_it() {
    let m = Mount::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            m.begin().unwrap();
            std::fs::write(m.path("orphan"), "x").unwrap();
            std::fs::create_dir(m.path("odir")).unwrap();
            assert_eq!(m.live_txs(), 1, "the thread's transaction is live");
            // The thread returns with the transaction open.
        });
    });
    assert_errno(std::fs::metadata(m.path("orphan")), libc::ENOENT, "the dead thread's file");
    assert!(wait_until(REAPED, || m.live_txs() == 0), "not reaped: {}", m.status());
    assert_errno(std::fs::metadata(m.path("orphan")), libc::ENOENT, "after the abort");
    assert_errno(std::fs::metadata(m.path("odir")), libc::ENOENT, "after the abort");
    assert!(names(m.mnt()).is_empty());
    // The names are free again.
    std::fs::write(m.path("orphan"), "y").unwrap();
    std::fs::create_dir(m.path("odir")).unwrap();

    // A process killed in the middle of its transaction.
    let mut agent = Agent::spawn(m.mnt());
    agent.ok("fd = os.open(M, os.O_RDONLY); fcntl.ioctl(fd, 0x4008e701, struct.pack('II', 0, 0))");
    agent.ok("open(M + '/orphan', 'w').write('from the dead'); open(M + '/p', 'w').write('p')");
    assert_eq!(m.live_txs(), 1);
    assert_eq!(std::fs::read_to_string(m.path("orphan")).unwrap(), "y");
    agent.kill();
    assert!(wait_until(REAPED, || m.live_txs() == 0), "not reaped: {}", m.status());
    assert_eq!(std::fs::read_to_string(m.path("orphan")).unwrap(), "y");
    assert_errno(std::fs::metadata(m.path("p")), libc::ENOENT, "the killed process's file");
    assert_eq!(names(m.mnt()), ["odir", "orphan"]);
}

/// Read-only mappings share the kernel's page cache: a transaction's pages
/// must not reach another process's mapping, and a transaction must see its
/// own writes through a mapping made before it began.
#[test]
fn mmap_reads_are_isolated_both_ways() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), vec![b'A'; 8192]).unwrap());
    let mut agent = Agent::spawn(m.mnt());
    agent.ok("import mmap; fd = os.open(M + '/f', os.O_RDONLY)");
    agent.ok("keep = mmap.mmap(fd, 8192, prot=mmap.PROT_READ, flags=mmap.MAP_PRIVATE); out = keep[:4].decode()");
    let peek = "out = [keep[:4].decode(), keep[4096:4100].decode()]";
    assert_eq!(agent.ok(peek), json!(["AAAA", "AAAA"]));

    let pre = OpenOptions::new().read(true).write(true).open(m.path("f")).unwrap();
    let map = |f: &File| -> Vec<u8> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a read-only private mapping of 8192 bytes of a file that long, unmapped below.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            let s = std::slice::from_raw_parts(p as *const u8, 8192);
            let v = [&s[..4], &s[4096..4100]].concat();
            libc::munmap(p, 8192);
            v
        }
    };
    assert_eq!(map(&pre), b"AAAAAAAA");
    m.begin().unwrap();
    pre.write_all_at(b"BBBB", 0).unwrap();
    pre.write_all_at(b"CCCC", 4096).unwrap();
    // Documented limit (README): a descriptor opened before the transaction
    // began is on the shared node, whose pages hold committed data only.
    assert_eq!(map(&pre), b"AAAAAAAA", "a mapping of a descriptor from before the transaction");
    assert_eq!(agent.ok(peek), json!(["AAAA", "AAAA"]), "another process's live mapping");
    let fresh = File::open(m.path("f")).unwrap();
    assert_eq!(map(&fresh), b"BBBBCCCC", "the transaction maps its own writes (new fd)");
    assert_eq!(agent.ok(peek), json!(["AAAA", "AAAA"]), "another process's live mapping, after the tx mapped");
    assert_eq!(agent.ok("out = os.pread(fd, 4, 4096).decode()"), "AAAA");
    assert_eq!(
        agent.ok(
            "m2 = mmap.mmap(fd, 8192, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED); out = m2[:4].decode(); m2.close()"
        ),
        "AAAA",
        "a new shared read-only mapping in another process"
    );
    m.abort().unwrap();
    assert_eq!(map(&pre), b"AAAAAAAA", "after abort, the aborting thread");
    assert_eq!(agent.ok(peek), json!(["AAAA", "AAAA"]));

    m.begin().unwrap();
    pre.write_all_at(b"DDDD", 4096).unwrap();
    // `fresh` was opened in the earlier transaction: from before this one.
    assert_eq!(map(&fresh), b"AAAAAAAA", "a descriptor from before this transaction maps committed data");
    let again = File::open(m.path("f")).unwrap();
    assert_eq!(map(&again), b"AAAADDDD", "the transaction maps its own writes");
    m.commit().unwrap();
    assert_eq!(agent.ok(peek), json!(["AAAA", "DDDD"]), "after commit, the old mapping sees the new data");
    assert_eq!(map(&pre), b"AAAADDDD");
}

/// A non-transactional writer never waits for or fails because of a
/// transaction; the transaction that read the data it changed loses.
#[test]
fn non_transactional_writer_beats_a_reader_transaction() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    let mut agent = Agent::spawn(m.mnt());
    m.begin().unwrap();
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "0\n");
    // A writer that waited for the transaction would wait for good (this
    // thread commits only below): the bound catches that, not slowness.
    // How fast it is goes to the timing tier (tests/timing.rs).
    let t0 = std::time::Instant::now();
    agent.ok("open(M + '/c', 'w').write('100\\n')");
    agent.ok("open(M + '/other', 'w').write('o')");
    assert!(t0.elapsed() < Duration::from_secs(60), "the non-transactional write waited {:?}", t0.elapsed());
    assert_eq!(agent.ok("out = open(M + '/c').read()"), "100\n");
    // Repeatable read: the transaction still sees what it read, or is doomed.
    match std::fs::read_to_string(m.path("c")) {
        Ok(s) => assert_eq!(s, "0\n", "a transaction saw a newer value than it read before"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EDEADLK), "{e}"),
    }
    let w = std::fs::write(m.path("c"), "1\n");
    let c = w.and_then(|_| m.commit());
    assert_errno(c, libc::EDEADLK, "the transaction that read c before the outside write");
    let _ = m.abort();
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "100\n", "the outside write survives");
    assert_eq!(m.live_txs(), 0);
}

/// SPEC §3/§6: "a transaction must never be served a stale cached view of its
/// own changes". A read-only descriptor opened before the transaction began
/// is a page-cache handle in this daemon (fuse/mod.rs documents that it keeps
/// showing the committed state).
#[test]
fn read_only_fd_opened_before_the_transaction_reads_its_writes() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), "original-content").unwrap());
    let ro = File::open(m.path("f")).unwrap();
    let mut buf = vec![0u8; 64];
    let n = ro.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"original-content");
    m.begin().unwrap();
    OpenOptions::new().write(true).open(m.path("f")).unwrap().write_all_at(b"NEW", 0).unwrap();
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "NEWginal-content", "through a new fd");
    let n = ro.read_at(&mut buf, 0).unwrap();
    let got = String::from_utf8_lossy(&buf[..n]).into_owned();
    m.abort().unwrap();
    assert_eq!(got, "NEWginal-content", "read(2) in the transaction through a read-only fd opened before it");
}

/// A transaction's private mappings fill the shared page cache on a page
/// fault; a process reading through a page-cache (read-only) descriptor or a
/// shared mapping at the same time must never see those pages, and the
/// transaction's mapping must never show the committed pages other readers
/// bring into the cache. Both sides are separate processes, so that a hung
/// daemon (found by a deadline; the connection is then aborted) fails the
/// test instead of the test binary.
#[test]
fn private_mappings_in_a_transaction_race_page_cache_readers() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), vec![b'A'; 8192]).unwrap());
    let mut reader = Agent::spawn(m.mnt());
    reader.ok("import mmap, time; fd = os.open(M + '/f', os.O_RDONLY); \
         sm = mmap.mmap(fd, 8192, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED)");
    let mut writer = Agent::spawn(m.mnt());
    writer.ok("import mmap, time; ctl = os.open(M, os.O_RDONLY); \
         fcntl.ioctl(ctl, 0x4008e701, struct.pack('II', 0, 0)); \
         fd = os.open(M + '/f', os.O_RDWR); os.pwrite(fd, b'BBBB', 0)");
    const READ_LOOP: &str = "n = bad = badm = 0\n\
        end = time.time() + 1.5\n\
        while time.time() < end or n < 1000:\n    \
            bad += os.pread(fd, 4, 0) != b'AAAA'\n    \
            badm += sm[:4] != b'AAAA'\n    \
            n += 1\n\
        out = [n, bad, badm]";
    const MAP_LOOP: &str = "n = stale = 0\n\
        end = time.time() + 1.5\n\
        while time.time() < end or n < 100:\n    \
            pm = mmap.mmap(fd, 8192, prot=mmap.PROT_READ, flags=mmap.MAP_PRIVATE)\n    \
            stale += pm[:4] != b'BBBB'\n    \
            pm.close()\n    \
            n += 1\n\
        out = [n, stale]";
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (mut hung, mut results) = (false, Vec::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = [(reader, READ_LOOP), (writer, MAP_LOOP)]
            .into_iter()
            .map(|(mut a, code)| {
                let done = done_tx.clone();
                s.spawn(move || {
                    let r = a.run(code);
                    let _ = done.send(());
                    r
                })
            })
            .collect();
        // The loops run 1.5 s and at least 1000 and 100 rounds, however
        // slow the machine: only a deadlock takes two minutes.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        for _ in 0..2 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if done_rx.recv_timeout(left).is_err() {
                hung = true;
                m.abort_connection();
                break;
            }
        }
        results = hs.into_iter().map(|h| h.join().map_err(|_| "agent died")).collect();
    });
    assert!(
        !hung,
        "the daemon deadlocked (no progress for 120 s; its connection was aborted): a transaction's private \
         mappings faulting while another process reads the file through the page cache ({results:?})"
    );
    let (rd, wr) = (results[0].clone().unwrap().unwrap(), results[1].clone().unwrap().unwrap());
    let (n, bad, badm) = (rd[0].as_u64().unwrap(), rd[1].as_u64().unwrap(), rd[2].as_u64().unwrap());
    let (rounds, stale) = (wr[0].as_u64().unwrap(), wr[1].as_u64().unwrap());
    assert!(n > 1000 && rounds > 100, "too few rounds to mean anything ({n}, {rounds})");
    assert_eq!(
        (bad, badm),
        (0, 0),
        "another process saw the transaction's uncommitted bytes: {bad} of {n} pread(2)s and {badm} reads of a \
         shared mapping (while the transaction faulted in {rounds} private mappings)"
    );
    assert_eq!(stale, 0, "{stale} of {rounds} private mappings in the transaction showed committed data");
}

#[test]
fn api_edges_nesting_no_transaction_and_free_fsync() {
    let m = Mount::new();
    assert_errno(m.commit(), libc::EINVAL, "commit without a transaction");
    assert_errno(m.abort(), libc::EINVAL, "abort without a transaction");
    // Nested begins flatten: only the outermost commit commits.
    m.begin().unwrap();
    m.begin().unwrap();
    std::fs::write(m.path("nested"), "n").unwrap();
    m.commit().unwrap();
    let mut agent = Agent::spawn(m.mnt());
    agent.fails("os.stat(M + '/nested')", libc::ENOENT);
    assert_eq!(m.live_txs(), 1, "the inner commit ended the transaction");
    // fsync inside a transaction is free: no journal sync.
    let syncs = m.status()["journal_syncs"].as_u64().unwrap();
    let f = File::create(m.path("synced")).unwrap();
    (&f).write_all(b"s").unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    assert_eq!(m.status()["journal_syncs"].as_u64().unwrap(), syncs, "fsync in a transaction did I/O");
    agent.fails("os.stat(M + '/synced')", libc::ENOENT);
    m.commit().unwrap();
    assert_eq!(agent.ok("out = sorted(os.listdir(M))"), json!(["nested", "synced"]));
    assert_eq!(m.live_txs(), 0);
    // Writes through a shared writable mapping are documented as not
    // transactional: written back, they land as plain writes, and an abort
    // does not take them back — never half inside the transaction.
    use std::os::unix::io::AsRawFd;
    m.begin().unwrap();
    let rw = OpenOptions::new().read(true).write(true).open(m.path("synced")).unwrap();
    // SAFETY: a 4096-byte shared mapping of a 1-byte file: only byte 0 is touched, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            rw.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "shared writable mmap: {}", std::io::Error::last_os_error());
        *(p as *mut u8) = b'M';
        assert_eq!(libc::msync(p, 4096, libc::MS_SYNC), 0);
        libc::munmap(p, 4096);
    }
    m.abort().unwrap();
    // The mapping was made in the transaction: its write-back (msync) was
    // the transaction's, and the abort took it back (mapped_writes.rs).
    assert_eq!(agent.ok("out = open(M + '/synced').read()"), "s", "an aborted transaction's mapped write stayed");
}

/// Four transactions each create their own names in one directory with
/// `what`, then commit together: none may conflict (SPEC §3).
fn distinct_names_in_one_dir(what: &str, make: fn(&Mount, &str)) {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::write(b.join("target"), "t").unwrap();
    });
    let barrier = std::sync::Barrier::new(4);
    let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let (m, barrier) = (&m, &barrier);
                s.spawn(move || {
                    m.begin().unwrap();
                    for i in 0..3 {
                        make(m, &format!("d/t{t}-{i}"));
                    }
                    barrier.wait();
                    let r = m.commit();
                    if r.is_err() {
                        let _ = m.abort();
                    }
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let failed: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| e.to_string())).collect();
    assert!(failed.is_empty(), "{what} of distinct names in one directory conflicted: {failed:?}");
    assert_eq!(names(&m.path("d")).len(), 12);
}

#[test]
fn creating_different_names_in_one_directory_does_not_conflict() {
    distinct_names_in_one_dir("create/symlink/link", |m, p| {
        std::fs::write(m.path(p), "x").unwrap();
        std::os::unix::fs::symlink("x", m.path(format!("{p}-sym"))).unwrap();
        std::fs::hard_link(m.path("target"), m.path(format!("{p}-hard"))).unwrap();
        std::fs::remove_file(m.path(format!("{p}-sym"))).unwrap();
        std::fs::remove_file(m.path(format!("{p}-hard"))).unwrap();
    });
}

#[test]
fn mkdir_of_different_names_in_one_directory_does_not_conflict() {
    distinct_names_in_one_dir("mkdir", |m, p| std::fs::create_dir(m.path(p)).unwrap());
}

/// While no transaction is live the kernel caches entries and attributes
/// (the cache gate, DESIGN §9). A transaction that begins afterwards must
/// still reach the daemon for every lookup and stat, or its reads would
/// miss its read set: here the size it read is changed by a plain append
/// before it commits, so its commit must conflict. Also, the kernel must
/// not answer it from what it cached for others before it began.
#[test]
fn attributes_cached_before_a_transaction_do_not_hide_its_reads() {
    let m = Mount::with_backing(|b| {
        std::fs::write(b.join("log"), "one\n").unwrap();
        std::fs::write(b.join("seen"), "x").unwrap();
    });
    let mnt = m.mnt().to_path_buf();
    let mut agent = Agent::spawn(&mnt);
    for round in 0..3 {
        // Warm every cache from outside and from this thread, no transaction live.
        for _ in 0..3 {
            agent.ok("out = [os.stat(M + '/log').st_size, os.stat(M + '/seen').st_mode]");
            let _ = std::fs::metadata(m.path("log")).unwrap();
            let _ = std::fs::metadata(m.path("gone")).is_err();
        }
        m.begin().expect("begin");
        let size = std::fs::metadata(m.path("log")).unwrap().len();
        std::fs::set_permissions(m.path("seen"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(m.path("gone"), "made in the tx").unwrap();
        // The agent's cached view must not have taken the transaction's changes.
        assert_eq!(agent.ok("out = os.stat(M + '/seen').st_mode & 0o777"), 0o644, "round {round}");
        agent.fails("os.stat(M + '/gone')", libc::ENOENT);
        // A plain append changes what the transaction read.
        agent.ok("f = open(M + '/log', 'a'); f.write('two\\n'); f.close(); out = 0");
        std::fs::write(m.path("summary"), format!("log had {size} bytes")).unwrap();
        assert_errno(m.commit(), libc::EDEADLK, "commit of a transaction whose stat was overtaken");
        let _ = m.abort();
        assert!(std::fs::metadata(m.path("summary")).is_err(), "round {round}: a conflicting commit left a trace");
        assert!(std::fs::metadata(m.path("gone")).is_err(), "round {round}");
        // Back to caching: the committed state, fresh, for everyone.
        assert_eq!(agent.ok("out = os.stat(M + '/seen').st_mode & 0o777"), 0o644);
        assert_eq!(std::fs::metadata(m.path("log")).unwrap().len(), size + 4);
    }
    assert_eq!(m.live_txs(), 0);
}

// ---- listings and the kernel's readdir cache --------------------------------
//
// A daemon that answered OPENDIR with ENOSYS (to save two round trips per
// client transaction) made the kernel open directories with
// FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE: one cached listing per directory,
// served to every reader and checked only against mtime and i_version.
// These fail against that build (DESIGN §9, "Directories keep handles").

/// Every name of the directory open at `fd`, read from offset 0 (as
/// rewinddir does), sorted.
fn ls_fd(fd: libc::c_int) -> Vec<String> {
    // SAFETY: our descriptor.
    unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
    let mut out = Vec::new();
    loop {
        let names = getdents(fd, 32768);
        if names.is_empty() {
            break;
        }
        out.extend(names);
    }
    out.sort();
    out
}

/// A plain thread's open directory, rewound after a transaction listed the
/// directory, must not get the transaction's uncommitted name — during the
/// transaction or after its abort.
#[test]
fn a_rewound_plain_descriptor_never_lists_a_live_transactions_name() {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::write(b.join("d/a"), "").unwrap();
    });
    let fd = open_dir(&m.path("d"));
    let other = |fd: libc::c_int| std::thread::spawn(move || ls_fd(fd)).join().unwrap();
    assert_eq!(other(fd), ["a"]);
    m.begin().unwrap();
    std::fs::write(m.path("d/secret"), "").unwrap();
    assert_eq!(names(&m.path("d")), ["a", "secret"]);
    let during = other(fd);
    m.abort().unwrap();
    let after = other(fd);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    assert_eq!(during, ["a"], "a plain thread saw the transaction's uncommitted name");
    assert_eq!(after, ["a"], "after the abort");
}

/// A transaction that puts the directory's mtime back after creating in it
/// (rsync -t, tar, shutil.copystat do) and lists it: a plain listing by
/// another thread (glibc's opendir fstat()s first) must not see the name.
#[test]
fn a_plain_listing_never_sees_a_live_transactions_name_after_it_restores_the_mtime() {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::write(b.join("d/a"), "").unwrap();
    });
    let other = |p: std::path::PathBuf| std::thread::spawn(move || names(&p)).join().unwrap();
    assert_eq!(other(m.path("d")), ["a"]);
    let md = std::fs::metadata(m.path("d")).unwrap();
    m.begin().unwrap();
    std::fs::write(m.path("d/secret"), "").unwrap();
    let f = File::open(m.path("d")).unwrap();
    f.set_modified(md.modified().unwrap()).unwrap();
    drop(f);
    assert_eq!(names(&m.path("d")), ["a", "secret"]);
    let during = other(m.path("d"));
    m.abort().unwrap();
    let after = other(m.path("d"));
    assert_eq!(during, ["a"], "a plain listing saw the transaction's uncommitted name");
    assert_eq!(after, ["a"], "after the abort");
}

/// A listing a transaction reads must enter its read set even when another
/// process listed the directory just before: a plain create there afterwards
/// makes its commit lose.
#[test]
fn a_listing_read_after_someone_elses_is_still_validated_at_commit() {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::write(b.join("d/a"), "").unwrap();
    });
    m.begin().unwrap();
    let fd = open_dir(&m.path("d"));
    let other = |fd: libc::c_int| std::thread::spawn(move || ls_fd(fd)).join().unwrap();
    let ofd = std::thread::spawn({
        let p = m.path("d");
        move || open_dir(&p)
    })
    .join()
    .unwrap();
    assert_eq!(other(ofd), ["a"]);
    let n = ls_fd(fd).len();
    std::thread::spawn({
        let p = m.path("d/y");
        move || std::fs::write(p, "").unwrap()
    })
    .join()
    .unwrap();
    std::fs::write(m.path("summary"), format!("d had {n}")).unwrap();
    let r = m.commit();
    let _ = m.abort();
    // SAFETY: our descriptors.
    unsafe {
        libc::close(fd);
        libc::close(ofd);
    }
    assert_errno(r, libc::EDEADLK, "commit of a transaction whose listing was overtaken");
}

/// rewinddir (a read from offset 0 again) shows the directory as it is now:
/// after a commit, its names.
#[test]
fn a_rewound_descriptor_lists_what_a_commit_added() {
    let m = Mount::with_backing(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
        std::fs::write(b.join("d/a"), "").unwrap();
    });
    let mut agent = Agent::spawn(m.mnt());
    const LS_FD: &str = "os.lseek(dfd, 0, 0); out = sorted(n for n in os.listdir(dfd))";
    agent.ok("dfd = os.open(M + '/d', os.O_RDONLY | os.O_DIRECTORY); out = 0");
    m.begin().unwrap();
    std::fs::write(m.path("d/x"), "").unwrap();
    assert_eq!(agent.ok(LS_FD), json!(["a"]));
    m.commit().unwrap();
    assert_eq!(agent.ok(LS_FD), json!(["a", "x"]), "rewinddir after the commit");
}
