//! Isolation, one anomaly per test, as short scripts.
//!
//! Each test opens with its story. `T1`, `T2`, ... are transactions;
//! "plain" is an operation outside any transaction (a transaction of one
//! operation). Helpers take slash-separated paths and resolve them with one
//! `lookup` per component, as the FUSE layer does.

mod common;

use common::{dump_engine, dump_storage, leftovers, Node, Tree};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::MemFs;
use txfs_engine::{Durability, Engine, Error, ObjId, Options, RenameFlags, SetAttr, TxId, ECONFLICT};

// ----- helpers --------------------------------------------------------------

fn opts() -> Options {
    Options { flush_interval: None, ..Default::default() }
}

fn engine() -> (Engine, Arc<MemFs>) {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).expect("open");
    (e, fs)
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The object at `path` (no symlinks followed).
fn obj(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<ObjId> {
    let mut cur = ObjId::ROOT;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = e.lookup(tx, cur, os(c))?.obj;
    }
    Ok(cur)
}

/// The directory of `path` and its last name.
fn parent<'a>(e: &Engine, tx: Option<TxId>, path: &'a str) -> txfs_engine::Result<(ObjId, &'a str)> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    Ok((obj(e, tx, dir)?, name))
}

fn create(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<ObjId> {
    let (d, n) = parent(e, tx, path)?;
    Ok(e.create(tx, d, os(n), 0o644, 0, 0)?.obj)
}

fn mkdir(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<ObjId> {
    let (d, n) = parent(e, tx, path)?;
    Ok(e.mkdir(tx, d, os(n), 0o755, 0, 0)?.obj)
}

/// Replaces the whole content of `path`.
fn put(e: &Engine, tx: Option<TxId>, path: &str, data: &[u8]) -> txfs_engine::Result<()> {
    let o = obj(e, tx, path)?;
    e.truncate(tx, o, 0)?;
    e.write(tx, o, 0, data)?;
    Ok(())
}

/// A new file with this content, outside any transaction.
fn seed(e: &Engine, path: &str, data: &[u8]) {
    create(e, None, path).expect("create");
    put(e, None, path, data).expect("write");
}

/// The whole content of `path`.
fn get(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<Vec<u8>> {
    let o = obj(e, tx, path)?;
    let size = e.getattr(tx, o)?.size;
    e.read(tx, o, 0, size as usize)
}

fn names(e: &Engine, tx: Option<TxId>, dir: &str) -> txfs_engine::Result<Vec<String>> {
    let o = obj(e, tx, dir)?;
    Ok(e.readdir(tx, o)?.into_iter().map(|d| d.name.to_string_lossy().into_owned()).collect())
}

fn errno<T: std::fmt::Debug>(r: txfs_engine::Result<T>) -> i32 {
    r.expect_err("expected an error").errno()
}

fn is_conflict<T>(r: &txfs_engine::Result<T>) -> bool {
    matches!(r, Err(e) if e.is_conflict())
}

/// `r` is the old value or a conflict — never anything else.
fn old_or_conflict(r: txfs_engine::Result<Vec<u8>>, old: &[u8]) {
    match r {
        Ok(v) => assert_eq!(v, old, "a transaction saw a value committed after it began"),
        Err(e) => assert!(e.is_conflict(), "expected the old value or a conflict, got {e}"),
    }
}

fn commit(e: &Engine, tx: TxId) -> txfs_engine::Result<()> {
    e.commit(tx, Durability::Durable)
}

// ----- the anomalies --------------------------------------------------------

/// Dirty read: T1 writes x; neither T2 nor a plain reader sees the write
/// until T1 commits; T2, which began before that commit, never sees it.
#[test]
fn dirty_read_is_impossible() {
    let (e, _) = engine();
    seed(&e, "x", b"old");
    let t1 = e.begin();
    let t2 = e.begin();
    put(&e, Some(t1), "x", b"new!").unwrap();
    assert_eq!(get(&e, Some(t1), "x").unwrap(), b"new!");
    assert_eq!(get(&e, None, "x").unwrap(), b"old");
    assert_eq!(get(&e, Some(t2), "x").unwrap(), b"old");
    assert_eq!(e.getattr(None, obj(&e, None, "x").unwrap()).unwrap().size, 3, "size leaked");
    commit(&e, t1).unwrap();
    assert_eq!(get(&e, None, "x").unwrap(), b"new!");
    old_or_conflict(get(&e, Some(t2), "x"), b"old");
    let t3 = e.begin();
    assert_eq!(get(&e, Some(t3), "x").unwrap(), b"new!");
    commit(&e, t3).unwrap();
}

/// Non-repeatable read: T1 reads x, T2 commits a change to x, T1 reads x
/// again and gets the old value or a conflict — never the new value; T1,
/// having read what T2 changed, cannot commit (reads are validated at commit).
#[test]
fn non_repeatable_read_is_impossible() {
    let (e, _) = engine();
    seed(&e, "x", b"one");
    let t1 = e.begin();
    assert_eq!(get(&e, Some(t1), "x").unwrap(), b"one");
    let t2 = e.begin();
    put(&e, Some(t2), "x", b"two").unwrap();
    commit(&e, t2).unwrap();
    old_or_conflict(get(&e, Some(t1), "x"), b"one");
    let r = commit(&e, t1);
    assert!(is_conflict(&r), "T1 read a value T2 then changed, yet committed: {r:?}");
    assert_eq!(get(&e, None, "x").unwrap(), b"two");
}

/// Read skew: A and B always hold the same value. T1 reads A; T2 changes
/// both and commits; T1 reads B: the old B or a conflict, never a mix.
#[test]
fn read_skew_is_impossible() {
    let (e, _) = engine();
    seed(&e, "A", b"1");
    seed(&e, "B", b"1");
    let t1 = e.begin();
    assert_eq!(get(&e, Some(t1), "A").unwrap(), b"1");
    let t2 = e.begin();
    put(&e, Some(t2), "A", b"2").unwrap();
    put(&e, Some(t2), "B", b"2").unwrap();
    commit(&e, t2).unwrap();
    old_or_conflict(get(&e, Some(t1), "B"), b"1");
    old_or_conflict(get(&e, Some(t1), "A"), b"1");
}

/// Lost update: T1 and T2 both read counter = 0 and write 1. Exactly one
/// commits; the other gets a conflict, so no increment is lost silently.
#[test]
fn lost_update_is_impossible() {
    let (e, _) = engine();
    seed(&e, "counter", b"0");
    let t1 = e.begin();
    let t2 = e.begin();
    for t in [t1, t2] {
        let n: u32 = String::from_utf8(get(&e, Some(t), "counter").unwrap()).unwrap().parse().unwrap();
        put(&e, Some(t), "counter", (n + 1).to_string().as_bytes()).unwrap();
    }
    let r1 = commit(&e, t1);
    let r2 = commit(&e, t2);
    assert!(r1.is_ok(), "the first committer must win: {r1:?}");
    assert!(is_conflict(&r2), "the second read-modify-write must conflict: {r2:?}");
    assert_eq!(get(&e, None, "counter").unwrap(), b"1");
}

/// Write skew: two doctors on call (A and B both "1"); each transaction
/// checks that the other is still on call and takes itself off. If both
/// committed, nobody would be on call: they must not both commit.
#[test]
fn write_skew_is_impossible() {
    let (e, _) = engine();
    seed(&e, "A", b"1");
    seed(&e, "B", b"1");
    let t1 = e.begin();
    let t2 = e.begin();
    assert_eq!(get(&e, Some(t1), "B").unwrap(), b"1");
    put(&e, Some(t1), "A", b"0").unwrap();
    assert_eq!(get(&e, Some(t2), "A").unwrap(), b"1");
    put(&e, Some(t2), "B", b"0").unwrap();
    let r1 = commit(&e, t1);
    let r2 = commit(&e, t2);
    assert!(!(r1.is_ok() && r2.is_ok()), "write skew: both committed");
    assert!(r1.is_ok(), "the first committer has nothing to conflict with: {r1:?}");
    let (a, b) = (get(&e, None, "A").unwrap(), get(&e, None, "B").unwrap());
    assert!(a == b"1" || b == b"1", "nobody on call: A={a:?} B={b:?}");
}

/// Phantom: T1 lists d, T2 creates d/new and commits, T1 lists d again:
/// the same listing or a conflict; T1 writes a summary of what it saw and
/// cannot commit (its listing is stale).
#[test]
fn phantom_is_impossible() {
    let (e, _) = engine();
    mkdir(&e, None, "d").unwrap();
    seed(&e, "d/one", b"1");
    seed(&e, "d/two", b"2");
    let t1 = e.begin();
    let first = names(&e, Some(t1), "d").unwrap();
    assert_eq!(first, ["one", "two"]);
    let t2 = e.begin();
    create(&e, Some(t2), "d/new").unwrap();
    commit(&e, t2).unwrap();
    match names(&e, Some(t1), "d") {
        Ok(again) => assert_eq!(again, first, "T1 saw a phantom"),
        Err(err) => assert!(err.is_conflict(), "{err}"),
    }
    let _ = create(&e, Some(t1), "count").and_then(|_| put(&e, Some(t1), "count", b"2"));
    let r = commit(&e, t1);
    assert!(is_conflict(&r), "T1's listing is stale, yet it committed: {r:?}");
    assert_eq!(names(&e, None, "d").unwrap(), ["new", "one", "two"]);
    assert!(obj(&e, None, "count").is_err(), "nothing of T1 survives");
}

/// A name found absent: T1 looks x up (ENOENT), T2 creates x and commits,
/// T1 creates x. T1 must not see EEXIST (that is T2's state) and must not
/// commit: its creation would silently replace T2's file.
#[test]
fn name_found_absent_then_created_elsewhere() {
    let (e, _) = engine();
    let t1 = e.begin();
    assert_eq!(errno(obj(&e, Some(t1), "x")), libc::ENOENT);
    let t2 = e.begin();
    let x2 = create(&e, Some(t2), "x").unwrap();
    e.write(Some(t2), x2, 0, b"T2").unwrap();
    commit(&e, t2).unwrap();
    match create(&e, Some(t1), "x") {
        Ok(x1) => {
            e.write(Some(t1), x1, 0, b"T1").unwrap();
            let r = commit(&e, t1);
            assert!(is_conflict(&r), "T1 created a name T2 created after T1 found it absent: {r:?}");
        }
        Err(err) => {
            assert!(err.is_conflict(), "expected a conflict, got {err}");
            assert!(is_conflict(&commit(&e, t1)));
        }
    }
    assert_eq!(get(&e, None, "x").unwrap(), b"T2");
}

/// Two transactions create different files in one directory (each looks
/// the directory up first, as a path walk does): both commit.
#[test]
fn creating_different_files_in_one_directory_is_no_conflict() {
    let (e, _) = engine();
    mkdir(&e, None, "d").unwrap();
    let t1 = e.begin();
    let t2 = e.begin();
    let f1 = create(&e, Some(t1), "d/one").unwrap();
    let f2 = create(&e, Some(t2), "d/two").unwrap();
    e.write(Some(t1), f1, 0, b"1").unwrap();
    e.write(Some(t2), f2, 0, b"2").unwrap();
    commit(&e, t1).unwrap();
    commit(&e, t2).unwrap();
    assert_eq!(names(&e, None, "d").unwrap(), ["one", "two"]);
    assert_eq!(get(&e, None, "d/one").unwrap(), b"1");
    assert_eq!(get(&e, None, "d/two").unwrap(), b"2");
}

/// T1 makes a subdirectory in d while T2 creates a file and T3 a symlink
/// in d, and T4 removes another subdirectory of d: all commit (SPEC §3:
/// creating different names in one directory is not a conflict, whatever
/// kind of object the name is). No path walks: every transaction knows d
/// already, so only the operations themselves can clash.
#[test]
fn creating_different_kinds_of_names_in_one_directory_is_no_conflict() {
    let (e, _) = engine();
    let d = mkdir(&e, None, "d").unwrap();
    mkdir(&e, None, "d/old").unwrap();
    let t: Vec<TxId> = (0..4).map(|_| e.begin()).collect();
    let t = |i: usize| Some(t[i]);
    e.mkdir(t(0), d, os("sub"), 0o755, 0, 0).unwrap();
    e.create(t(1), d, os("file"), 0o644, 0, 0).unwrap();
    e.symlink(t(2), d, os("link"), os("sub"), 0, 0).unwrap();
    e.rmdir(t(3), d, os("old")).unwrap();
    let results: Vec<_> = (0..4).map(|i| commit(&e, t(i).unwrap()).map_err(|e| e.to_string())).collect();
    assert!(results.iter().all(|r| r.is_ok()), "{results:#?}");
    assert_eq!(names(&e, None, "d").unwrap(), ["file", "link", "sub"]);
    assert_eq!(e.getattr(None, d).unwrap().nlink, 3);
}

/// A plain write to data a live transaction read never fails or waits; the
/// transaction loses instead, at its commit (our documented policy, I4).
/// A plain write to a file the transaction only blind-wrote does not hurt
/// it: the transaction commits after the plain write, and its bytes win.
#[test]
fn plain_writes_never_fail_because_of_a_transaction() {
    let (e, _) = engine();
    seed(&e, "read-by-tx", b"before");
    seed(&e, "written-by-tx", b"before");
    let x = obj(&e, None, "written-by-tx").unwrap();
    let t1 = e.begin();
    assert_eq!(get(&e, Some(t1), "read-by-tx").unwrap(), b"before");
    e.write(Some(t1), x, 0, b"T1").unwrap();
    // Plain operations on both files, while T1 is live: none fails.
    put(&e, None, "read-by-tx", b"plain").unwrap();
    e.write(None, x, 0, b"pl").unwrap();
    e.setattr(None, x, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    let r = commit(&e, t1);
    assert!(is_conflict(&r), "T1 read data a plain write then changed, yet committed: {r:?}");
    assert_eq!(get(&e, None, "read-by-tx").unwrap(), b"plain");
    assert_eq!(get(&e, None, "written-by-tx").unwrap(), b"plfore");

    // The same, with T2 only writing blind: it commits, after the plain write.
    let t2 = e.begin();
    e.write(Some(t2), x, 0, b"T2").unwrap();
    e.write(None, x, 0, b"PL").unwrap();
    e.truncate(None, x, 4).unwrap();
    commit(&e, t2).unwrap();
    assert_eq!(get(&e, None, "written-by-tx").unwrap(), b"T2fo");
}

/// Blind writes: T1 writes page 0 and T2 writes page 2 of the same file,
/// and T3 writes past its end; none reads anything. All commit, and every
/// write survives.
#[test]
fn blind_writes_to_different_pages_all_commit() {
    let (e, fs) = engine();
    seed(&e, "f", &vec![b'.'; 3 * 4096]);
    let f = obj(&e, None, "f").unwrap();
    let t1 = e.begin();
    let t2 = e.begin();
    let t3 = e.begin();
    e.write(Some(t1), f, 0, b"one").unwrap();
    e.write(Some(t2), f, 2 * 4096, b"two").unwrap();
    e.write(Some(t3), f, 5 * 4096, b"three").unwrap();
    commit(&e, t2).unwrap();
    commit(&e, t1).unwrap();
    commit(&e, t3).unwrap();
    let mut want = vec![b'.'; 3 * 4096];
    want[..3].copy_from_slice(b"one");
    want[2 * 4096..2 * 4096 + 3].copy_from_slice(b"two");
    want.resize(5 * 4096, 0);
    want.extend_from_slice(b"three");
    assert_eq!(get(&e, None, "f").unwrap(), want);
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs)[Path::new("f")], Node::File { data: want, mode: 0o644 });
}

/// The way SQLite (or any program opening a file by name) writes: each
/// transaction looks the file up — reading its attributes — and writes its
/// own pages inside it. A write that leaves the size unchanged does not
/// change what the lookup read, so both commit.
#[test]
fn lookups_then_writes_inside_the_file_do_not_conflict() {
    let (e, _fs) = engine();
    seed(&e, "db", &vec![b'.'; 4 * 4096]);
    let (t1, t2) = (e.begin(), e.begin());
    let f1 = obj(&e, Some(t1), "db").unwrap();
    let f2 = obj(&e, Some(t2), "db").unwrap();
    e.write(Some(t1), f1, 0, b"one").unwrap();
    e.write(Some(t2), f2, 3 * 4096, b"two").unwrap();
    commit(&e, t1).unwrap();
    commit(&e, t2).expect("a write inside the file is not a conflict");
    let got = get(&e, None, "db").unwrap();
    assert_eq!((&got[..3], &got[3 * 4096..3 * 4096 + 3], got.len()), (&b"one"[..], &b"two"[..], 4 * 4096));
    // Growing the file does change what a lookup read: that one conflicts.
    let (t3, t4) = (e.begin(), e.begin());
    let f3 = obj(&e, Some(t3), "db").unwrap();
    obj(&e, Some(t4), "db").unwrap();
    e.write(Some(t3), f3, 4 * 4096, b"grow").unwrap();
    commit(&e, t3).unwrap();
    let f4 = obj(&e, Some(t4), "db");
    let late = f4.and_then(|f| e.write(Some(t4), f, 0, b"x")).and_then(|_| commit(&e, t4));
    assert!(matches!(late, Err(Error::Conflict { .. })), "t4 read the old size: {late:?}");
}

/// Directories moved into each other: T1 moves a into b (b/a), T2 moves b
/// into a (a/b). Both committing would make a cycle cut off from the root:
/// at most one commits, and the tree stays a tree.
#[test]
fn directories_moved_into_each_other_cannot_both_commit() {
    let (e, fs) = engine();
    mkdir(&e, None, "a").unwrap();
    mkdir(&e, None, "b").unwrap();
    seed(&e, "a/fa", b"A");
    seed(&e, "b/fb", b"B");
    let t1 = e.begin();
    let t2 = e.begin();
    let root = ObjId::ROOT;
    let b_seen_by_t1 = obj(&e, Some(t1), "b").unwrap();
    let a_seen_by_t2 = obj(&e, Some(t2), "a").unwrap();
    let r1 = e.rename(Some(t1), root, os("a"), b_seen_by_t1, os("a"), RenameFlags::default());
    let r2 = e.rename(Some(t2), root, os("b"), a_seen_by_t2, os("b"), RenameFlags::default());
    assert!(r1.is_ok() && r2.is_ok(), "each move alone is fine: {r1:?} {r2:?}");
    let c1 = commit(&e, t1);
    let c2 = commit(&e, t2);
    assert!(!(c1.is_ok() && c2.is_ok()), "both moves committed: a cycle");
    assert!(c1.is_ok());
    let want: Vec<&str> = vec!["b", "b/a", "b/a/fa", "b/fb"];
    let tree = dump_engine(&e, None);
    assert_eq!(tree.keys().map(|p| p.to_str().unwrap()).collect::<Vec<_>>(), want);
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs), tree);
}

/// Read-your-writes, for every kind of operation: inside T1 each change is
/// visible at once; outside, none of it is, until commit.
#[test]
fn a_transaction_reads_its_own_writes() {
    let (e, _) = engine();
    seed(&e, "old", b"old data");
    mkdir(&e, None, "gone").unwrap();
    let before = dump_engine(&e, None);
    let tx = e.begin();
    let t = Some(tx);

    let f = create(&e, t, "f").unwrap();
    assert_eq!(e.getattr(t, f).unwrap().size, 0);
    assert_eq!(names(&e, t, "").unwrap(), ["f", "gone", "old"]);
    e.write(t, f, 0, b"hello").unwrap();
    assert_eq!(get(&e, t, "f").unwrap(), b"hello");
    e.write(t, f, 10, b"sparse").unwrap();
    assert_eq!(get(&e, t, "f").unwrap(), b"hello\0\0\0\0\0sparse");
    assert_eq!(e.append(t, f, b"!").unwrap(), 16);
    assert_eq!(e.getattr(t, f).unwrap().size, 17);
    e.truncate(t, f, 4).unwrap();
    assert_eq!(get(&e, t, "f").unwrap(), b"hell");
    e.truncate(t, f, 6).unwrap();
    assert_eq!(get(&e, t, "f").unwrap(), b"hell\0\0");

    let d = mkdir(&e, t, "d").unwrap();
    assert_eq!(e.getattr(t, d).unwrap().nlink, 2);
    assert_eq!(e.getattr(t, ObjId::ROOT).unwrap().nlink, e.getattr(None, ObjId::ROOT).unwrap().nlink + 1);
    let l = e.symlink(t, d, os("l"), os("../f"), 0, 0).unwrap().obj;
    assert_eq!(e.readlink(t, l).unwrap(), "../f");
    e.link(t, f, d, os("f2")).unwrap();
    assert_eq!(e.getattr(t, f).unwrap().nlink, 2);
    assert_eq!(get(&e, t, "d/f2").unwrap(), b"hell\0\0");
    e.rename(t, ObjId::ROOT, os("f"), d, os("f3"), RenameFlags::default()).unwrap();
    assert_eq!(names(&e, t, "d").unwrap(), ["f2", "f3", "l"]);
    assert_eq!(errno(obj(&e, t, "f")), libc::ENOENT);
    e.unlink(t, d, os("f2")).unwrap();
    assert_eq!(e.getattr(t, f).unwrap().nlink, 1);
    e.setattr(t, f, &SetAttr { mode: Some(0o640), ..Default::default() }).unwrap();
    assert_eq!(e.getattr(t, f).unwrap().mode, 0o640);
    e.setxattr(t, f, os("user.k"), Some(b"v"), true, false).unwrap();
    assert_eq!(e.getxattr(t, f, os("user.k")).unwrap(), Some(b"v".to_vec()));
    assert_eq!(e.listxattr(t, f).unwrap(), [os("user.k")]);
    e.setxattr(t, f, os("user.k"), None, false, false).unwrap();
    assert_eq!(e.getxattr(t, f, os("user.k")).unwrap(), None);
    e.setxattr(t, f, os("user.k"), Some(b"w"), false, false).unwrap();
    let old = obj(&e, t, "old").unwrap();
    put(&e, t, "old", b"new").unwrap();
    assert_eq!(get(&e, t, "old").unwrap(), b"new");
    e.rmdir(t, ObjId::ROOT, os("gone")).unwrap();
    assert_eq!(errno(obj(&e, t, "gone")), libc::ENOENT);
    assert_eq!(names(&e, t, "").unwrap(), ["d", "old"]);

    // Outside, nothing moved.
    assert_eq!(dump_engine(&e, None), before);
    assert_eq!(e.getxattr(None, old, os("user.k")).unwrap(), None);
    let inside = dump_engine(&e, t);
    commit(&e, tx).unwrap();
    assert_eq!(dump_engine(&e, None), inside);
    assert_eq!(e.getxattr(None, f, os("user.k")).unwrap(), Some(b"w".to_vec()));
    let want: Vec<&str> = vec!["d", "d/f3", "d/l", "old"];
    assert_eq!(inside.keys().map(|p| p.to_str().unwrap()).collect::<Vec<_>>(), want);
}

/// O_APPEND inside a transaction appends at the end of the file as the
/// transaction sees it, not as others do.
#[test]
fn append_goes_to_the_end_the_transaction_sees() {
    let (e, _) = engine();
    seed(&e, "log", b"a");
    let log = obj(&e, None, "log").unwrap();
    let t = e.begin();
    assert_eq!(e.append(Some(t), log, b"b").unwrap(), 1);
    assert_eq!(e.append(Some(t), log, b"c").unwrap(), 2);
    assert_eq!(get(&e, Some(t), "log").unwrap(), b"abc");
    assert_eq!(get(&e, None, "log").unwrap(), b"a");
    assert_eq!(e.append(None, log, b"X").unwrap(), 1);
    // T read the size the plain append changed: it cannot commit.
    assert!(is_conflict(&commit(&e, t)));
    assert_eq!(get(&e, None, "log").unwrap(), b"aX");
}

/// Everything at once: T1 changes many things; outside, nothing is visible
/// before the commit and everything right after it; T2, which began before
/// the commit, sees none of it (old values or conflicts).
#[test]
fn commit_makes_everything_visible_at_once() {
    let (e, _) = engine();
    seed(&e, "x", b"x0");
    seed(&e, "y", b"y0");
    mkdir(&e, None, "d").unwrap();
    let before = dump_engine(&e, None);
    let t2 = e.begin();
    assert_eq!(get(&e, Some(t2), "x").unwrap(), b"x0");
    let t1 = e.begin();
    put(&e, Some(t1), "x", b"x1").unwrap();
    e.unlink(Some(t1), ObjId::ROOT, os("y")).unwrap();
    let n = create(&e, Some(t1), "d/new").unwrap();
    e.write(Some(t1), n, 0, b"n1").unwrap();
    e.rename(Some(t1), ObjId::ROOT, os("d"), ObjId::ROOT, os("e"), RenameFlags::default()).unwrap();
    let inside = dump_engine(&e, Some(t1));
    assert_eq!(dump_engine(&e, None), before);
    commit(&e, t1).unwrap();
    assert_eq!(dump_engine(&e, None), inside);
    old_or_conflict(get(&e, Some(t2), "x"), b"x0");
    old_or_conflict(get(&e, Some(t2), "y"), b"y0");
    assert!(matches!(obj(&e, Some(t2), "e/new"), Err(ref err) if err.is_conflict() || err.errno() == libc::ENOENT));
}

/// Abort leaves no trace: new files (also ones created and deleted again,
/// and ones big enough to spill to disk), new directories, changed and
/// removed old ones — after abort and close, the backing store is as before
/// and `.txfs/` holds nothing of the transaction.
#[test]
fn abort_leaves_no_trace() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { spill_threshold: 1024, ..opts() }).unwrap();
    seed(&e, "keep", b"kept");
    mkdir(&e, None, "dir").unwrap();
    e.checkpoint().unwrap();
    let before = dump_engine(&e, None);
    let journal_before = e.stats().journal_bytes;
    let tx = e.begin();
    let t = Some(tx);
    let big = create(&e, t, "big").unwrap();
    e.write(t, big, 0, &vec![7u8; 64 * 1024]).unwrap();
    let tmp = create(&e, t, "dir/tmp").unwrap();
    e.write(t, tmp, 0, &vec![8u8; 8 * 1024]).unwrap();
    e.unlink(t, obj(&e, t, "dir").unwrap(), os("tmp")).unwrap();
    mkdir(&e, t, "newdir").unwrap();
    create(&e, t, "newdir/inner").unwrap();
    put(&e, t, "keep", &vec![9u8; 5000]).unwrap();
    e.rename(t, ObjId::ROOT, os("dir"), ObjId::ROOT, os("moved"), RenameFlags::default()).unwrap();
    e.unlink(t, ObjId::ROOT, os("keep")).unwrap();
    assert!(!leftovers(&*fs).is_empty(), "64 KiB over a 1 KiB threshold should have spilled");
    e.abort(tx).unwrap();
    assert!(!e.is_live(tx));
    assert_eq!(dump_engine(&e, None), before);
    assert_eq!(leftovers(&*fs), Vec::<std::path::PathBuf>::new(), "abort must delete the spill file");
    assert_eq!(e.stats().journal_bytes, journal_before, "an aborted transaction writes no journal");
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs), before);
    assert!(leftovers(&*fs).is_empty());
}

/// A file created, written and deleted inside one transaction costs no
/// journal bytes for its data (SPEC §5): such a transaction journals the
/// same number of bytes whether the file held nothing, 4 KiB or 1 MiB
/// (what remains is the directory's times), and a transaction that also
/// writes elsewhere journals that write and nothing of the file.
#[test]
fn created_and_deleted_file_costs_no_journal_bytes() {
    let (e, _) = engine();
    mkdir(&e, None, "d").unwrap();
    seed(&e, "x", b"x");
    let x = obj(&e, None, "x").unwrap();
    let cost = |tmp_bytes: Option<usize>, write_x: bool| -> u64 {
        let before = e.stats().journal_bytes;
        let tx = e.begin();
        let t = Some(tx);
        if write_x {
            e.write(t, x, 0, b"y").unwrap();
        }
        if let Some(n) = tmp_bytes {
            let tmp = create(&e, t, "d/tmp").unwrap();
            e.write(t, tmp, 0, &vec![1u8; n]).unwrap();
            e.setxattr(t, tmp, os("user.k"), Some(b"v"), false, false).unwrap();
            e.unlink(t, obj(&e, t, "d").unwrap(), os("tmp")).unwrap();
        }
        commit(&e, tx).unwrap();
        e.stats().journal_bytes - before
    };
    let empty = cost(Some(0), false);
    assert_eq!(cost(Some(4096), false), empty, "4 KiB of a deleted file reached the journal");
    assert_eq!(cost(Some(1 << 20), false), empty, "1 MiB of a deleted file reached the journal");
    assert!(empty < 512, "creating and deleting an empty file journaled {empty} bytes");
    let only_x = cost(None, true);
    let x_and_tmp = cost(Some(256 * 1024), true);
    assert!(x_and_tmp < only_x + 256, "journal: {x_and_tmp} bytes with the temporary file, {only_x} without");
}

/// The conflict error: errno ECONFLICT (EDEADLK, which FUSE passes
/// through), a message that says to retry; once doomed, every later
/// operation fails the same way, commit fails, and nothing survives.
#[test]
fn conflict_errno_message_and_doom() {
    let (e, _) = engine();
    seed(&e, "x", b"0");
    let x = obj(&e, None, "x").unwrap();
    let t = e.begin();
    e.write(Some(t), x, 1, b"t").unwrap();
    create(&e, Some(t), "mine").unwrap();
    put(&e, None, "x", b"plain").unwrap();
    let err = e.read(Some(t), x, 0, 1).expect_err("x changed after T began");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(err.errno(), ECONFLICT);
    assert_eq!(ECONFLICT, libc::EDEADLK);
    assert!(err.to_string().contains("retry"), "message should say what to do: {err}");
    // Doomed: every later operation fails the same way.
    for r in [
        e.getattr(Some(t), ObjId::ROOT).map(drop),
        e.readdir(Some(t), ObjId::ROOT).map(drop),
        e.write(Some(t), x, 0, b"z").map(drop),
        create(&e, Some(t), "other").map(drop),
        e.fsync(Some(t)).and_then(|_| e.getattr(Some(t), x)).map(drop),
    ] {
        let err: Error = r.expect_err("doomed transaction");
        assert_eq!(err.errno(), ECONFLICT, "{err}");
    }
    assert!(e.is_live(t), "a doomed transaction lives until commit or abort");
    let r = commit(&e, t);
    assert_eq!(r.as_ref().map_err(|e| e.errno()), Err(ECONFLICT));
    assert!(!e.is_live(t));
    assert_eq!(errno(e.abort(t)), libc::EINVAL, "the failed commit ended the transaction");
    assert_eq!(get(&e, None, "x").unwrap(), b"plain");
    assert_eq!(errno(obj(&e, None, "mine")), libc::ENOENT);
}

/// A commit with nothing in between never conflicts, however much the
/// transaction read; a read-only transaction with nothing in between
/// commits too.
#[test]
fn no_conflict_without_a_concurrent_commit() {
    let (e, _) = engine();
    seed(&e, "x", b"x");
    mkdir(&e, None, "d").unwrap();
    let t1 = e.begin();
    let t2 = e.begin();
    for t in [t1, t2] {
        get(&e, Some(t), "x").unwrap();
        names(&e, Some(t), "d").unwrap();
        names(&e, Some(t), "").unwrap();
    }
    put(&e, Some(t1), "x", b"t1").unwrap();
    create(&e, Some(t1), "d/new").unwrap();
    commit(&e, t1).unwrap();
    // T2 read everything T1 changed: it conflicts...
    assert!(is_conflict(&commit(&e, t2)));
    // ...while a transaction with no commit in between does not.
    let t3 = e.begin();
    get(&e, Some(t3), "x").unwrap();
    names(&e, Some(t3), "d").unwrap();
    e.checkpoint().unwrap();
    get(&e, Some(t3), "d/new").unwrap();
    commit(&e, t3).unwrap();
}

/// fsync inside a transaction is free: it returns at once and syncs nothing.
#[test]
fn fsync_inside_a_transaction_does_no_io() {
    let (e, _) = engine();
    seed(&e, "x", b"x");
    let syncs = e.stats().journal_syncs;
    let t = e.begin();
    put(&e, Some(t), "x", b"y").unwrap();
    e.fsync(Some(t)).unwrap();
    assert_eq!(e.stats().journal_syncs, syncs);
    assert_eq!(get(&e, None, "x").unwrap(), b"x", "fsync inside a transaction published nothing");
    commit(&e, t).unwrap();
}

/// N threads each add 1 to a counter K times, each increment a transaction
/// retried on conflict: no increment is lost, none counted twice.
#[test]
fn concurrent_increments_with_retry() {
    const N: usize = 8;
    const K: usize = 25;
    let (e, fs) = engine();
    seed(&e, "counter", b"0");
    let retries = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..N {
            s.spawn(|| {
                for _ in 0..K {
                    loop {
                        let t = e.begin();
                        let r = (|| {
                            let v = get(&e, Some(t), "counter")?;
                            let n: u64 = String::from_utf8(v).unwrap().parse().unwrap();
                            put(&e, Some(t), "counter", (n + 1).to_string().as_bytes())?;
                            e.commit(t, Durability::Ordered)
                        })();
                        match r {
                            Ok(()) => break,
                            Err(err) if err.is_conflict() => {
                                retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                if e.is_live(t) {
                                    e.abort(t).unwrap();
                                }
                            }
                            Err(err) => panic!("increment failed: {err}"),
                        }
                    }
                }
            });
        }
    });
    assert_eq!(get(&e, None, "counter").unwrap(), (N * K).to_string().as_bytes());
    let st = e.stats();
    assert_eq!(st.live_txs, 0);
    assert!(st.commits >= (N * K) as u64);
    e.close().unwrap();
    let tree: Tree = dump_storage(&*fs);
    assert_eq!(tree[Path::new("counter")], Node::File { data: (N * K).to_string().into_bytes(), mode: 0o644 });
    eprintln!("{} retries for {} increments", retries.into_inner(), N * K);
}

/// Story: T1 creates a file. Nobody else can name it, but an object id can
/// leak (a stale kernel cache, a bug in an adapter): used from outside T1,
/// the id must lead nowhere — not to a zero-filled phantom through
/// getattr/read, and never to a write that commits.
#[test]
fn objects_of_a_live_transaction_are_unreachable_by_id() {
    let (e, _) = engine();
    let t1 = e.begin();
    let x = create(&e, Some(t1), "x").unwrap();
    e.write(Some(t1), x, 0, b"private").unwrap();
    let t2 = e.begin();
    let seen = [
        ("plain getattr", e.getattr(None, x).map(drop)),
        ("plain read", e.read(None, x, 0, 10).map(drop)),
        ("T2 getattr", e.getattr(Some(t2), x).map(drop)),
        ("T2 write", e.write(Some(t2), x, 0, b"intruder").map(drop)),
        ("plain write", e.write(None, x, 0, b"plain").map(drop)),
    ];
    let reachable: Vec<_> = seen.iter().filter(|(_, r)| r.is_ok()).map(|(w, _)| *w).collect();
    assert!(reachable.is_empty(), "T1's private object is reachable through: {reachable:?}");
}

/// Story: a program creates and writes a file inside a transaction; the
/// transaction aborts; the program keeps writing to its open descriptor,
/// now outside any transaction; then the machine crashes. The write must
/// fail (the file never existed), and recovery must work: the engine
/// committed a journal record naming an object no record creates, and
/// recovery then refused the whole journal as damaged.
#[test]
fn writes_to_the_file_of_an_aborted_transaction_do_not_break_recovery() {
    let (e, fs) = engine();
    seed(&e, "keep", b"kept");
    let t = e.begin();
    let x = create(&e, Some(t), "x").unwrap();
    e.write(Some(t), x, 0, b"tx").unwrap();
    e.abort(t).unwrap();
    let late = e.write(None, x, 0, b"late");
    drop(e); // a crash: no checkpoint, the journal is replayed at open
    let reopened = Engine::open(fs.clone(), opts());
    let e = match reopened {
        Ok(e) => e,
        Err(err) => panic!("recovery refused the journal: {err} (the late write returned {late:?})"),
    };
    assert_eq!(get(&e, None, "keep").unwrap(), b"kept");
    assert_eq!(errno(obj(&e, None, "x")), libc::ENOENT);
    assert!(late.is_err(), "a write to a file that never existed succeeded");
}

/// Eight threads each create twenty files of their own in one directory,
/// one durable transaction per file (a path walk, a create, a write): no
/// transaction ever conflicts, and every file is there with its content.
#[test]
fn concurrent_creates_of_different_names_never_conflict() {
    const N: usize = 8;
    const K: usize = 20;
    let (e, fs) = engine();
    mkdir(&e, None, "d").unwrap();
    std::thread::scope(|s| {
        for i in 0..N {
            let e = &e;
            s.spawn(move || {
                for k in 0..K {
                    let t = e.begin();
                    let name = format!("d/f{i}-{k}");
                    let f = create(e, Some(t), &name).unwrap_or_else(|err| panic!("{name}: {err}"));
                    e.write(Some(t), f, 0, name.as_bytes()).unwrap();
                    e.commit(t, Durability::Durable).unwrap_or_else(|err| panic!("{name}: {err}"));
                }
            });
        }
    });
    assert_eq!(e.stats().conflicts, 0);
    assert_eq!(names(&e, None, "d").unwrap().len(), N * K);
    e.close().unwrap();
    let tree = dump_storage(&*fs);
    for i in 0..N {
        for k in 0..K {
            let name = format!("d/f{i}-{k}");
            assert_eq!(tree[Path::new(&name)], Node::File { data: name.clone().into_bytes(), mode: 0o644 });
        }
    }
}

/// Bank: eight accounts of 100. Six threads move money between random
/// pairs in transactions (retried on conflict), while two auditors sum
/// all accounts in read-only transactions and plain readers read single
/// accounts — with the background flusher and frequent background
/// checkpoints running. An auditor whose reads all succeed sees exactly
/// 800 (a snapshot, never half a transfer); a plain reader never sees a
/// transfer's intermediate state (an empty, truncated file); the total
/// ends at 800, in the engine and in the backing store.
#[test]
fn bank_transfers_keep_the_total() {
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    const ACCOUNTS: usize = 8;
    const WRITERS: usize = 6;
    const TRANSFERS: usize = 40;
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(
        fs.clone(),
        Options {
            flush_interval: Some(std::time::Duration::from_millis(2)),
            checkpoint_bytes: 4096,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..ACCOUNTS {
        seed(&e, &format!("acct{i}"), b"100");
    }
    let balance = |t: Option<TxId>, i: usize| -> txfs_engine::Result<u64> {
        let v = get(&e, t, &format!("acct{i}"))?;
        Ok(String::from_utf8(v.clone())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("account {i}: {v:?}")))
    };
    let done = AtomicBool::new(false);
    let (audits, conflicts) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (e, balance, conflicts) = (&e, &balance, &conflicts);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(w as u64);
                    for _ in 0..TRANSFERS {
                        let (from, to) = (rng.gen_range(0..ACCOUNTS), rng.gen_range(0..ACCOUNTS));
                        let amount = rng.gen_range(1..30);
                        loop {
                            let t = e.begin();
                            let r = (|| {
                                let (a, b) = (balance(Some(t), from)?, balance(Some(t), to)?);
                                if from != to && a >= amount {
                                    put(e, Some(t), &format!("acct{from}"), (a - amount).to_string().as_bytes())?;
                                    put(e, Some(t), &format!("acct{to}"), (b + amount).to_string().as_bytes())?;
                                }
                                e.commit(t, if rng.gen_bool(0.5) { Durability::Durable } else { Durability::Ordered })
                            })();
                            match r {
                                Ok(()) => break,
                                Err(err) if err.is_conflict() => {
                                    conflicts.fetch_add(1, Relaxed);
                                    if e.is_live(t) {
                                        e.abort(t).unwrap();
                                    }
                                }
                                Err(err) => panic!("transfer failed: {err}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            s.spawn(|| {
                while !done.load(Relaxed) {
                    let t = e.begin();
                    let sum: txfs_engine::Result<u64> = (0..ACCOUNTS).map(|i| balance(Some(t), i)).sum();
                    match sum {
                        Ok(sum) => {
                            assert_eq!(sum, 800, "an auditor saw half a transfer");
                            audits.fetch_add(1, Relaxed);
                            let _ = e.commit(t, Durability::Ordered);
                        }
                        Err(err) => {
                            assert!(err.is_conflict(), "{err}");
                            e.abort(t).unwrap();
                        }
                    }
                }
            });
        }
        s.spawn(|| {
            while !done.load(Relaxed) {
                for i in 0..ACCOUNTS {
                    balance(None, i).unwrap();
                }
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Relaxed);
    });
    let total: u64 = (0..ACCOUNTS).map(|i| balance(None, i).unwrap()).sum();
    assert_eq!(total, 800);
    let st = e.stats();
    assert_eq!(st.live_txs, 0);
    eprintln!(
        "{} audits, {} transfer conflicts, {} checkpoints, {} journal syncs",
        audits.into_inner(),
        conflicts.into_inner(),
        st.checkpoints,
        st.journal_syncs
    );
    e.close().unwrap();
    let stored: u64 = dump_storage(&*fs)
        .values()
        .map(|n| match n {
            Node::File { data, .. } => String::from_utf8(data.clone()).unwrap().parse::<u64>().unwrap(),
            other => panic!("unexpected {other:?}"),
        })
        .sum();
    assert_eq!(stored, 800);
    assert!(leftovers(&*fs).is_empty());
}

/// SQLite run by root fchowns its -wal and -shm to their own owner each time
/// it opens them. T1 (holding such a connection) has read the -shm's
/// attributes; another connection's open chowns and chmods the file to what
/// it already is. Nothing changed, so T1 commits. A chown or chmod that does
/// change something still dooms it.
#[test]
fn a_chown_or_chmod_to_what_is_already_there_dooms_no_reader() {
    let (e, _) = engine();
    seed(&e, "db-shm", b"index");
    let f = obj(&e, None, "db-shm").unwrap();
    let t1 = e.begin();
    let a = e.getattr(Some(t1), f).unwrap();
    put(&e, Some(t1), "db-shm", b"index'").unwrap();
    let same = SetAttr { uid: Some(a.uid), gid: Some(a.gid), mode: Some(a.mode), ..Default::default() };
    e.setattr(None, f, &same).unwrap();
    commit(&e, t1).unwrap();
    assert_eq!(get(&e, None, "db-shm").unwrap(), b"index'");

    let t2 = e.begin();
    e.getattr(Some(t2), f).unwrap();
    put(&e, Some(t2), "db-shm", b"lost").unwrap();
    e.setattr(None, f, &SetAttr { uid: Some(a.uid + 1), ..Default::default() }).unwrap();
    assert!(is_conflict(&commit(&e, t2)), "a real chown must doom a reader of the attributes");
    let t3 = e.begin();
    e.getattr(Some(t3), f).unwrap();
    put(&e, Some(t3), "db-shm", b"lost").unwrap();
    e.setattr(None, f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    assert!(is_conflict(&commit(&e, t3)), "a real chmod must doom a reader of the attributes");
    assert_eq!(get(&e, None, "db-shm").unwrap(), b"index'");
    assert_eq!(e.getattr(None, f).unwrap().mode, 0o600);
}
