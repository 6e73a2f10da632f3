//! Engine regressions, each opening with its story: what broke, how it was
//! found, and the commit that fixed it. Bugs found by the model's random
//! runs are pinned in model_regressions.rs.

use std::ffi::OsStr;
use std::sync::Arc;
use txfs_engine::storage::MemFs;
use txfs_engine::{Durability, Engine, Error, ObjId, Options, TxId};

fn opts() -> Options {
    Options { flush_interval: None, ..Default::default() }
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Story: an open-but-unlinked file survives a checkpoint in
/// .txfs/orphans/; a write through its handle is journaled naming
/// `.txfs/orphans/N`; closing it used to unlink that file outside any plan
/// (breaking J1), so a crash before the next checkpoint left a journal that
/// recovery refused as corrupt. Found in review; fixed in 20f2d89
/// ("Fixes from review: ... orphan release ...").
#[test]
fn releasing_an_orphan_keeps_the_journal_recoverable() {
    let fs = Arc::new(MemFs::new());
    {
        let e = Engine::open(fs.clone(), opts()).unwrap();
        let f = e.create(None, ObjId::ROOT, os("tmp"), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, b"one").unwrap();
        e.checkpoint().unwrap();
        e.open_obj(f).unwrap();
        e.unlink(None, ObjId::ROOT, os("tmp")).unwrap();
        e.checkpoint().unwrap(); // tmp -> .txfs/orphans/N
        e.write(None, f, 0, b"two").unwrap(); // names .txfs/orphans/N
        e.sync().unwrap();
        e.release(f);
        drop(e); // crash: no checkpoint
    }
    let e = Engine::open(fs.clone(), opts()).expect("recovery");
    assert!(e.readdir(None, ObjId::ROOT).unwrap().is_empty());
    e.close().unwrap();
}

/// Story: a transaction creates D/x; meanwhile a plain rmdir removes D (it
/// cannot see x, so D looks empty). The transaction used to commit, and
/// then no checkpoint could place x: the engine was poisoned, and reopening
/// failed the same way. The transaction read that D exists; D's removal
/// changes that: it must lose. Found in review; fixed in 20f2d89
/// ("Fixes from review: removed target directories ...").
#[test]
fn creating_in_a_directory_removed_meanwhile_conflicts() {
    let fs = Arc::new(MemFs::new());
    {
        let e = Engine::open(fs.clone(), opts()).unwrap();
        let d = e.mkdir(None, ObjId::ROOT, os("D"), 0o755, 0, 0).unwrap().obj;
        e.checkpoint().unwrap();
        let t = e.begin();
        let x = e.create(Some(t), d, os("x"), 0o644, 0, 0).unwrap().obj;
        e.write(Some(t), x, 0, b"data").unwrap();
        e.rmdir(None, ObjId::ROOT, os("D")).unwrap();
        let c = e.commit(t, Durability::Durable);
        assert!(matches!(c, Err(Error::Conflict { .. })), "commit into a removed directory: {c:?}");
        e.checkpoint().expect("checkpoint after the conflict");
        drop(e);
    }
    let e = Engine::open(fs, opts()).expect("reopen");
    assert!(e.readdir(None, ObjId::ROOT).unwrap().is_empty());
}

/// Story: creating different names in one directory must not conflict —
/// also not with a directory created or removed next to them. Written with
/// the fix of the test above (20f2d89), which must not make neighbouring
/// names conflict.
#[test]
fn mkdir_and_rmdir_next_to_a_create_do_not_conflict() {
    let e = Engine::open(Arc::new(MemFs::new()), opts()).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, os("D"), 0o755, 0, 0).unwrap().obj;
    e.mkdir(None, d, os("old"), 0o755, 0, 0).unwrap();
    let (t1, t2, t3) = (e.begin(), e.begin(), e.begin());
    e.create(Some(t1), d, os("f"), 0o644, 0, 0).unwrap();
    e.mkdir(Some(t2), d, os("sub"), 0o755, 0, 0).unwrap();
    e.rmdir(Some(t3), d, os("old")).unwrap();
    for t in [t2, t3, t1] {
        e.commit(t, Durability::Ordered).expect("different names in one directory");
    }
}

/// Story: two processes create the same xattr with XATTR_CREATE outside
/// transactions. The check and the change used to take the lock twice, so
/// both could succeed. Exactly one must. Found in review; fixed in aee19e8
/// (setxattr: the checks and the change in one lock hold).
#[test]
fn xattr_create_is_atomic() {
    let e = Arc::new(Engine::open(Arc::new(MemFs::new()), opts()).unwrap());
    let f = e.create(None, ObjId::ROOT, os("f"), 0o644, 0, 0).unwrap().obj;
    for round in 0..200 {
        let name = format!("user.k{round}");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2u8)
            .map(|i| {
                let (e, b, n) = (e.clone(), barrier.clone(), name.clone());
                std::thread::spawn(move || {
                    b.wait();
                    e.setxattr(None, f, OsStr::new(&n), Some(&[i]), true, false).is_ok()
                })
            })
            .collect();
        let won = racers.into_iter().map(|h| h.join().unwrap()).filter(|ok| *ok).count();
        assert_eq!(won, 1, "round {round}: XATTR_CREATE succeeded {won} times");
    }
}

/// Story: RealFs keeps read descriptors of recently read files (readahead,
/// 3d31485). A cache keyed by path would read through a descriptor of the
/// file that used to be there: a path renamed over, unlinked and recreated,
/// or moved with its directory must read as a fresh resolution would, never
/// the file the descriptor was for. Pinned with the cache itself (3d31485).
#[test]
fn real_fs_read_descriptors_follow_renames_and_unlinks() {
    use txfs_engine::storage::{RealFs, Storage};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/a"), "AAAA").unwrap();
    std::fs::write(dir.path().join("d/b"), "BBBB").unwrap();
    std::fs::write(dir.path().join("c"), "CCCC").unwrap();
    let fs = RealFs::open(dir.path()).unwrap();
    let read = |p: &str| {
        let mut buf = [0u8; 4];
        let n = fs.read_at(std::path::Path::new(p), 0, &mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(read("d/a"), "AAAA");
    assert_eq!(read("d/a"), "AAAA");
    fs.rename("d/b".as_ref(), "d/a".as_ref()).unwrap();
    assert_eq!(read("d/a"), "BBBB", "renamed over");
    fs.unlink("d/a".as_ref()).unwrap();
    std::fs::write(dir.path().join("d/a"), "NEW!").unwrap();
    assert_eq!(read("d/a"), "NEW!", "unlinked and created again");
    assert_eq!(read("c"), "CCCC");
    fs.rename("d".as_ref(), "e".as_ref()).unwrap();
    fs.mkdir("d".as_ref(), 0o755).unwrap();
    fs.rename("c".as_ref(), "d/a".as_ref()).unwrap();
    assert_eq!(read("d/a"), "CCCC", "a new directory under the old name");
    assert_eq!(read("e/a"), "NEW!");
}

/// Story: SPEC §5 says files created and deleted inside one transaction
/// cost no durable I/O; such a transaction still journaled the parent
/// directory's bumped times. Fixed in 8916857 (a transaction whose files
/// were created and removed inside it writes nothing). Times the
/// transaction set itself, and real changes, are still committed.
#[test]
fn a_file_created_and_removed_in_a_transaction_costs_no_journal_write() {
    let e = Engine::open(Arc::new(MemFs::new()), Options { flush_interval: None, ..Default::default() }).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap().obj;
    e.sync().unwrap();
    let bytes = || e.stats().journal_bytes;
    let before = bytes();
    for i in 0..5 {
        let tx = e.begin();
        let name = format!("tmp{i}");
        let f = e.create(Some(tx), d, OsStr::new(&name), 0o644, 0, 0).unwrap().obj;
        e.write(Some(tx), f, 0, b"scratch").unwrap();
        let sub = e.mkdir(Some(tx), d, OsStr::new("sub"), 0o755, 0, 0).unwrap().obj;
        let _ = sub;
        e.rmdir(Some(tx), d, OsStr::new("sub")).unwrap();
        e.unlink(Some(tx), d, OsStr::new(&name)).unwrap();
        e.commit(tx, Durability::Durable).unwrap();
    }
    assert_eq!(bytes(), before, "create+unlink transactions wrote to the journal");

    // Explicitly set times survive next to a created-and-removed file.
    let tx = e.begin();
    let f = e.create(Some(tx), d, OsStr::new("t"), 0o644, 0, 0).unwrap().obj;
    let _ = f;
    e.unlink(Some(tx), d, OsStr::new("t")).unwrap();
    let when = txfs_engine::storage::Timestamp { secs: 1_000_000, nanos: 0 };
    e.setattr(Some(tx), d, &txfs_engine::SetAttr { mtime: Some(when), ..Default::default() }).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    assert!(bytes() > before, "an explicit utimes was dropped");
    assert_eq!(e.getattr(None, d).unwrap().mtime, when);
    e.close().unwrap();
}

/// Resolves a slash-separated path from the root, in `tx`.
fn obj(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<ObjId> {
    let mut cur = ObjId::ROOT;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = e.lookup(tx, cur, os(c))?.obj;
    }
    Ok(cur)
}

/// Story (found by the daemon crash campaign, reliability/crash_campaign.py,
/// whose workers saw ENOENT inside transactions for files their snapshot
/// held): T1 begins and sees d/x/f. T2 removes f and the directory x and
/// commits. T1 then walks d/x/f (looking each name up again, as the kernel
/// does with zero-TTL entries) and writes f. It must either see its
/// snapshot or fail with a conflict: never ENOENT for a file its snapshot
/// holds (SPEC: every read sees the state as of begin, or conflicts). The
/// engine passed when this was pinned (ab63e31): the cause was the kernel's
/// caches, pinned on a real mount by
/// `uncommitted_rmdir_does_not_hide_a_directory_from_others` in
/// crates/txfs/tests/regressions.rs.
#[test]
fn a_directory_removed_after_begin_is_a_conflict_not_enoent() {
    for looked_up_before in [false, true] {
        let e = Engine::open(Arc::new(MemFs::new()), opts()).expect("open");
        let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
        let x = e.mkdir(None, d, os("x"), 0o755, 0, 0).unwrap().obj;
        let f = e.create(None, x, os("f"), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, b"hello").unwrap();
        let t1 = e.begin();
        if looked_up_before {
            obj(&e, Some(t1), "d/x/f").unwrap();
        } else {
            obj(&e, Some(t1), "d").unwrap();
        }
        let t2 = e.begin();
        e.unlink(Some(t2), x, os("f")).unwrap();
        e.rmdir(Some(t2), d, os("x")).unwrap();
        e.commit(t2, Durability::Durable).unwrap();
        let r = obj(&e, Some(t1), "d/x/f").and_then(|f| e.write(Some(t1), f, 0, b"HELLO").map(|_| ()));
        match r {
            Ok(()) | Err(Error::Conflict { .. }) => eprintln!("looked up before: {looked_up_before}: {r:?}"),
            Err(other) => {
                panic!("looked up before: {looked_up_before}: T1 got {other:?}, want its snapshot or a conflict")
            }
        }
        let _ = e.abort(t1);
    }
}

/// Story (issue 24 review, found by an adversarial tester): since a
/// transaction's rmdir removes a private kernel inode, a process that held
/// the directory (a descriptor, a working directory) still reaches the
/// engine through the shared one, and a plain mkdir there succeeded: the
/// engine made a name in a removed directory, the checkpoint failed on it
/// ("no such object") and the backing could no longer be mounted. Linux
/// answers ENOENT in a removed directory; so does the engine now, for every
/// way of making a name there (create, mkdir, symlink, mknod, link, rename
/// into it), inside transactions and out, while the directory's own
/// removal is still the transaction's (its view) or once committed.
#[test]
fn nothing_is_made_in_a_removed_directory() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
    let f = e.create(None, ObjId::ROOT, os("f"), 0o644, 0, 0).unwrap().obj;
    e.checkpoint().unwrap();
    let tries = |e: &Engine, tx: Option<TxId>| {
        vec![
            e.create(tx, d, os("a"), 0o644, 0, 0).map(|_| ()),
            e.mkdir(tx, d, os("b"), 0o755, 0, 0).map(|_| ()),
            e.symlink(tx, d, os("c"), os("f"), 0, 0).map(|_| ()),
            e.link(tx, f, d, os("e")).map(|_| ()),
            e.rename(tx, ObjId::ROOT, os("f"), d, os("g"), Default::default()),
        ]
    };
    // The removal still the transaction's: in its view d is gone.
    let t = e.begin();
    e.rmdir(Some(t), ObjId::ROOT, os("d")).unwrap();
    for (i, r) in tries(&e, Some(t)).into_iter().enumerate() {
        assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT), "try {i} inside the removing transaction");
    }
    e.commit(t, Durability::Durable).unwrap();
    // Committed: nobody makes anything there.
    for (i, r) in tries(&e, None).into_iter().enumerate() {
        assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT), "try {i} outside any transaction");
    }
    let u = e.begin();
    for (i, r) in tries(&e, Some(u)).into_iter().enumerate() {
        assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT), "try {i} in a later transaction");
    }
    e.abort(u).unwrap();
    e.checkpoint().expect("the checkpoint has nothing it cannot apply");
    drop(e);
    Engine::open(fs, opts()).expect("the backing opens again");
}

/// Story (the crash campaign, the first run after the fix above): a
/// transaction that began before another committed the removal of a
/// directory got ENOENT renaming into it, though its snapshot holds the
/// directory: the liveness check read the link count, which shows current
/// values, not the snapshot's. Such a transaction must lose a conflict (it
/// read what the removal changed), never see the removal.
#[test]
fn a_removal_committed_after_begin_is_a_conflict_not_enoent() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs, opts()).unwrap();
    e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap();
    let d = e.lookup(None, ObjId::ROOT, os("d")).unwrap().obj;
    e.create(None, ObjId::ROOT, os("f"), 0o644, 0, 0).unwrap();
    let t1 = e.begin();
    let t2 = e.begin();
    e.rmdir(Some(t2), ObjId::ROOT, os("d")).unwrap();
    e.commit(t2, Durability::Durable).unwrap();
    let r = e.rename(Some(t1), ObjId::ROOT, os("f"), d, os("g"), Default::default());
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let t3 = e.begin();
    let r = e.create(Some(t3), d, os("h"), 0o644, 0, 0);
    assert_eq!(r.map(|_| ()).map_err(|e| e.errno()), Err(libc::ENOENT), "a transaction begun after the removal");
}
