//! Shared writable mappings inside a transaction are the transaction's
//! (issue 24, item 5): what a program writes through `mmap(MAP_SHARED)`
//! in a thread transaction or a `txfs run` without a view is visible to
//! it, invisible to others until the commit — which has the kernel write
//! the dirty pages back first, so nothing is lost when the program never
//! called `msync` — and gone after an abort. Before, such writes were
//! plain writes when the kernel got round to them (visible at once, kept
//! by an abort, and making the transaction conflict with itself), and
//! those to a file the transaction created were lost.

mod common;

use common::*;

/// An agent in a transaction of `side`, with mmap imported.
fn in_transaction(m: &Mount, side: Side) -> Agent {
    let mut a = agent_in_transaction(m, side);
    a.ok("import mmap");
    a
}

/// Writes `what` at `off` of `path` through a shared mapping of its first
/// 8 KiB, without msync, and leaves the mapping (and descriptor) open in
/// the agent's variable `name`.
fn map_and_write(a: &mut Agent, name: &str, path: &str, create: bool, off: usize, what: &str) {
    let open = if create {
        format!("fd_{name} = os.open(M + '/{path}', os.O_RDWR | os.O_CREAT, 0o644); os.ftruncate(fd_{name}, 8192)")
    } else {
        format!("fd_{name} = os.open(M + '/{path}', os.O_RDWR)")
    };
    a.ok(&open);
    a.ok(&format!("m_{name} = mmap.mmap(fd_{name}, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)"));
    a.ok(&format!("m_{name}[{off}:{off} + len({what:?})] = {what:?}.encode()"));
}

fn bytes_at(path: &std::path::Path, off: usize, n: usize) -> Option<String> {
    let b = std::fs::read(path).ok()?;
    Some(String::from_utf8_lossy(&b[off.min(b.len())..(off + n).min(b.len())]).into_owned())
}

#[test]
fn mapped_writes_are_the_transaction_s_until_commit() {
    for side in SIDES {
        for commit in [true, false] {
            let m = Mount::with_backing(|b| std::fs::write(b.join("old"), vec![b'.'; 8192]).unwrap());
            let mut t = in_transaction(&m, side);
            map_and_write(&mut t, "o", "old", false, 4100, "MAPPED-OLD");
            map_and_write(&mut t, "n", "new", true, 10, "MAPPED-NEW");
            // The transaction reads its mapped writes through read(2) too
            // (msync first: a read through a descriptor is not the page cache).
            t.ok("m_o.flush(); m_n.flush()");
            let own = t.ok("out = [os.pread(fd_o, 10, 4100).decode(), os.pread(fd_n, 10, 10).decode()]");
            assert_eq!(own, serde_json::json!(["MAPPED-OLD", "MAPPED-NEW"]), "{side:?}: its own view");
            // More, never synced: the commit must have the kernel write it back.
            t.ok("m_o[0:5] = b'FIRST'; m_n[8000:8005] = b'LATER'");
            let mut other = Agent::spawn(m.mnt());
            let seen = other.run("out = open(M + '/old').read()[4100:4110]");
            assert_eq!(seen, Ok(serde_json::json!("..........")), "{side:?}: another process saw the mapped write");
            assert_eq!(other.run("os.stat(M + '/new')"), Err(libc::ENOENT), "{side:?}: the new file leaked");
            let commits = || m.status()["commits"].as_u64().unwrap();
            let before = commits();
            end_transaction(t, side, commit);
            // One commit, with the written-back pages in it — not the
            // transaction and then plain writes of what the kernel wrote
            // back after it (nothing else writes meanwhile).
            assert_eq!(commits(), before + commit as u64, "{side:?}: commits made by the end of the transaction");
            let old = m.path("old");
            if commit {
                assert_eq!(
                    bytes_at(&old, 4100, 10).as_deref(),
                    Some("MAPPED-OLD"),
                    "{side:?}: msynced write committed"
                );
                assert_eq!(bytes_at(&old, 0, 5).as_deref(), Some("FIRST"), "{side:?}: unsynced write committed");
                let new = m.path("new");
                assert_eq!(bytes_at(&new, 10, 10).as_deref(), Some("MAPPED-NEW"), "{side:?}");
                assert_eq!(bytes_at(&new, 8000, 5).as_deref(), Some("LATER"), "{side:?}: unsynced write to a new file");
            } else {
                assert_eq!(std::fs::read(&old).unwrap(), vec![b'.'; 8192], "{side:?}: the abort kept a mapped write");
                assert!(!m.path("new").exists(), "{side:?}: the aborted file exists");
            }
            // And nothing lands later: after the kernel had every chance to
            // write back (the daemon's checkpoint at unmount).
            drop(other);
            let mut m = m;
            m.umount_clean();
            let old = m.backing().join("old");
            if commit {
                assert_eq!(bytes_at(&old, 0, 5).as_deref(), Some("FIRST"), "{side:?}: after unmount");
            } else {
                assert_eq!(std::fs::read(&old).unwrap(), vec![b'.'; 8192], "{side:?}: after unmount");
            }
        }
    }
}

/// Story (issue 24, found by an adversarial review): a transaction maps a
/// file, another process writes the file, and the transaction then touches
/// the mapping. Its page fault is a read that finds the transaction lost a
/// conflict; an error there is SIGBUS, which killed a program that only
/// had to abort (SQLite with a reader in another process died within a few
/// mails). The fault now gets the committed bytes, the program lives, and
/// its commit fails with EDEADLK as any conflict does.
#[test]
fn a_fault_of_a_transaction_that_lost_a_conflict_is_no_sigbus() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("f"), vec![b'.'; 8192]).unwrap());
    let mut t = in_transaction(&m, Side::Thread);
    t.ok("fd = os.open(M + '/f', os.O_RDWR)");
    t.ok("mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)");
    let mut other = Agent::spawn(m.mnt());
    other.ok("fd = os.open(M + '/f', os.O_WRONLY); os.pwrite(fd, b'OUTSIDE', 0); os.close(fd)");
    let seen = t.run("out = [mm[0:7].decode(), mm[4096:4097].decode()]");
    assert_eq!(seen, Ok(serde_json::json!(["OUTSIDE", "."])), "the fault got an error (SIGBUS) or wrong bytes");
    t.ok("mm[100:105] = b'LOSER'");
    let cmd = format!("fcntl.ioctl(root, {IOC_COMMIT}, bytes(8))");
    assert_eq!(t.run(&cmd), Err(libc::EDEADLK), "the commit of a transaction that lost a conflict");
    assert_eq!(bytes_at(&m.path("f"), 0, 7).as_deref(), Some("OUTSIDE"));
    assert_eq!(bytes_at(&m.path("f"), 100, 5).as_deref(), Some("....."), "the loser's mapped write was kept");
}
