//! A live transaction's change set (`Engine::changes`, issue 29): every
//! kind of change, against a committed state that is partly checkpointed
//! (base files) and partly in the committed delta, as on a real mount.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use txfs_engine::storage::MemFs;
use txfs_engine::{what, Change, Durability, Engine, ObjId, Options, RenameFlags, SetAttr, Timestamp, TxId};

fn engine() -> Engine {
    Engine::open(Arc::new(MemFs::new()), Options { flush_interval: None, ..Default::default() }).expect("open")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn obj(e: &Engine, tx: Option<TxId>, path: &str) -> ObjId {
    e.resolve(tx, Path::new(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

fn parent<'a>(e: &Engine, tx: Option<TxId>, path: &'a str) -> (ObjId, &'a str) {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    (obj(e, tx, dir), name)
}

fn put(e: &Engine, tx: Option<TxId>, path: &str, data: &[u8]) {
    let (d, n) = parent(e, tx, path);
    let o = match e.lookup(tx, d, os(n)) {
        Ok(a) => a.obj,
        Err(_) => e.create(tx, d, os(n), 0o644, 0, 0).unwrap().obj,
    };
    e.truncate(tx, o, 0).unwrap();
    e.write(tx, o, 0, data).unwrap();
}

fn mkdir(e: &Engine, tx: Option<TxId>, path: &str) {
    let (d, n) = parent(e, tx, path);
    e.mkdir(tx, d, os(n), 0o755, 0, 0).unwrap();
}

fn rename(e: &Engine, tx: Option<TxId>, from: &str, to: &str) {
    let (fd, fname) = parent(e, tx, from);
    let (td, tname) = parent(e, tx, to);
    e.rename(tx, fd, os(fname), td, os(tname), RenameFlags::default()).unwrap();
}

fn unlink(e: &Engine, tx: Option<TxId>, path: &str) {
    let (d, n) = parent(e, tx, path);
    e.unlink(tx, d, os(n)).unwrap();
}

fn rmdir(e: &Engine, tx: Option<TxId>, path: &str) {
    let (d, n) = parent(e, tx, path);
    e.rmdir(tx, d, os(n)).unwrap();
}

/// The change at `path`, which must be there once.
fn at<'a>(set: &'a [Change], path: &str) -> &'a Change {
    let hits: Vec<&Change> = set.iter().filter(|c| c.path == Path::new(path)).collect();
    assert_eq!(hits.len(), 1, "{path} in {:#?}", set.iter().map(|c| (&c.path, c.what)).collect::<Vec<_>>());
    hits[0]
}

fn paths(set: &[Change]) -> Vec<String> {
    set.iter().map(|c| c.path.display().to_string()).collect()
}

/// `a` (checkpointed: a base file), `d/b` (in the committed delta only),
/// `keep/x`, `tree/{1,2,sub/3}`.
fn seeded() -> Engine {
    let e = engine();
    put(&e, None, "a", b"hello\n");
    mkdir(&e, None, "keep");
    put(&e, None, "keep/x", b"x");
    mkdir(&e, None, "tree");
    mkdir(&e, None, "tree/sub");
    for p in ["tree/1", "tree/2", "tree/sub/3"] {
        put(&e, None, p, b"t");
    }
    e.checkpoint().unwrap();
    mkdir(&e, None, "d");
    put(&e, None, "d/b", b"bee");
    e
}

#[test]
fn every_kind_of_change_is_listed_once_with_its_details() {
    let e = seeded();
    let t = e.begin();
    put(&e, Some(t), "a", b"hello, world\n");
    put(&e, Some(t), "new", b"12345");
    rename(&e, Some(t), "d/b", "d/c");
    let x = obj(&e, Some(t), "keep/x");
    e.setattr(Some(t), x, &SetAttr { mode: Some(0o600), uid: Some(7), ..Default::default() }).unwrap();
    e.setxattr(Some(t), x, os("user.tag"), Some(b"v"), false, false).unwrap();
    let (k, _) = parent(&e, Some(t), "keep/x");
    e.symlink(Some(t), k, os("ln"), os("../a"), 0, 0).unwrap();
    e.link(Some(t), x, ObjId::ROOT, os("hard")).unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(paths(&set), ["a", "d/c", "hard", "keep/ln", "keep/x", "new"]);

    let a = at(&set, "a");
    assert_eq!(a.what, what::MODIFIED);
    assert_eq!((a.old.as_ref().unwrap().size, a.new.as_ref().unwrap().size), (6, 13));
    assert_eq!(a.bytes, 13);

    let c = at(&set, "d/c");
    assert_eq!(c.what, what::RENAMED);
    assert_eq!(c.from.as_deref(), Some(Path::new("d/b")));

    // The new name is a link; the object's own changes stay at its name.
    assert_eq!(at(&set, "hard").what, what::LINKED);
    let ln = at(&set, "keep/ln");
    assert_eq!((ln.what, ln.target.as_deref()), (what::CREATED, Some(os("../a"))));

    let kx = at(&set, "keep/x");
    assert_eq!(kx.what, what::MODE | what::OWNER | what::XATTR);
    assert_eq!(kx.new.as_ref().unwrap().mode & 0o7777, 0o600);
    assert_eq!(kx.xattrs, [os("user.tag")]);

    let n = at(&set, "new");
    assert_eq!((n.what, n.bytes), (what::CREATED, 5));
    assert!(n.old.is_none());
    e.commit(t, Durability::Durable).unwrap();
}

#[test]
fn deletions_and_whole_directories_are_counted() {
    let e = seeded();
    let t = e.begin();
    for p in ["tree/sub/3", "tree/1", "tree/2"] {
        unlink(&e, Some(t), p);
    }
    rmdir(&e, Some(t), "tree/sub");
    rmdir(&e, Some(t), "tree");
    mkdir(&e, Some(t), "made");
    mkdir(&e, Some(t), "made/in");
    put(&e, Some(t), "made/in/f", b"f");
    put(&e, Some(t), "made/g", b"g");
    let set = e.changes(t).unwrap();
    assert_eq!(
        paths(&set),
        ["made", "made/g", "made/in", "made/in/f", "tree", "tree/1", "tree/2", "tree/sub", "tree/sub/3"]
    );
    let tree = at(&set, "tree");
    assert_eq!((tree.what, tree.files, tree.dirs), (what::DELETED, 3, 1));
    let made = at(&set, "made");
    assert_eq!((made.what, made.files, made.dirs), (what::CREATED, 2, 1));
    assert_eq!((at(&set, "made/in").files, at(&set, "tree/sub").files), (1, 1));
    e.abort(t).unwrap();
}

#[test]
fn what_is_created_and_deleted_again_is_absent() {
    let e = seeded();
    let t = e.begin();
    put(&e, Some(t), "tmp", b"scratch");
    mkdir(&e, Some(t), "tmpdir");
    put(&e, Some(t), "tmpdir/f", b"f");
    unlink(&e, Some(t), "tmp");
    unlink(&e, Some(t), "tmpdir/f");
    rmdir(&e, Some(t), "tmpdir");
    // Renamed away and back: nothing either.
    rename(&e, Some(t), "a", "a2");
    rename(&e, Some(t), "a2", "a");
    assert_eq!(e.changes(t).unwrap(), Vec::new());
    e.abort(t).unwrap();
}

#[test]
fn a_file_saved_over_the_old_one_is_a_modification() {
    // How editors and config writers save: a new file, renamed over.
    let e = seeded();
    let t = e.begin();
    put(&e, Some(t), ".a.swp", b"bye\n");
    rename(&e, Some(t), ".a.swp", "a");
    // And `mv keep/x d/b`: a rename that replaces.
    rename(&e, Some(t), "keep/x", "d/b");
    let set = e.changes(t).unwrap();
    // keep/x is where d/b came from, not a deletion of its own.
    assert_eq!(paths(&set), ["a", "d/b"]);
    let a = at(&set, "a");
    assert_eq!(a.what, what::MODIFIED | what::REPLACED);
    assert_eq!((a.old.as_ref().unwrap().size, a.new.as_ref().unwrap().size), (6, 4));
    let b = at(&set, "d/b");
    assert_eq!(b.what, what::RENAMED | what::REPLACED);
    assert_eq!(b.from.as_deref(), Some(Path::new("keep/x")));
    assert_eq!(b.old.as_ref().unwrap().size, 1, "old: the renamed file as it was");
    e.abort(t).unwrap();
}

#[test]
fn nested_directory_renames_name_both_sides_in_their_own_state() {
    let e = seeded();
    let t = e.begin();
    // tree/sub out of tree, then tree itself moved into keep, then a
    // change inside the moved directory.
    rename(&e, Some(t), "tree/sub", "sub2");
    rename(&e, Some(t), "tree", "keep/tree");
    put(&e, Some(t), "keep/tree/1", b"changed");
    let set = e.changes(t).unwrap();
    assert_eq!(paths(&set), ["keep/tree", "keep/tree/1", "sub2"]);
    assert_eq!(at(&set, "keep/tree").from.as_deref(), Some(Path::new("tree")));
    assert_eq!(at(&set, "sub2").from.as_deref(), Some(Path::new("tree/sub")));
    assert_eq!(at(&set, "keep/tree/1").what, what::MODIFIED);
    e.abort(t).unwrap();
}

#[test]
fn explicit_times_are_listed_and_write_times_are_not() {
    let e = seeded();
    let t = e.begin();
    let x = obj(&e, Some(t), "keep/x");
    let when = Timestamp { secs: 1_000_000, nanos: 0 };
    e.setattr(Some(t), x, &SetAttr { mtime: Some(when), atime: Some(when), ..Default::default() }).unwrap();
    put(&e, Some(t), "d/b", b"bee2");
    // As open(O_TRUNC) does: a setattr of the size and mtime, then writes.
    let a = obj(&e, Some(t), "a");
    let now = Timestamp { secs: 2_000_000_000, nanos: 0 };
    e.setattr(Some(t), a, &SetAttr { size: Some(0), mtime: Some(now), ..Default::default() }).unwrap();
    e.write(Some(t), a, 0, b"new").unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(at(&set, "keep/x").what, what::TIMES);
    assert_eq!(at(&set, "d/b").what, what::MODIFIED);
    assert_eq!(at(&set, "a").what, what::MODIFIED, "a truncate's mtime is not an explicit time");
    e.abort(t).unwrap();
}

#[test]
fn listing_records_no_read_and_both_sides_can_be_read() {
    let e = seeded();
    let t = e.begin();
    // A blind write: the transaction never read `a`.
    let a = obj(&e, None, "a");
    e.write(Some(t), a, 0, b"HE").unwrap();
    let set = e.changes(t).unwrap();
    let c = at(&set, "a");
    let (old, new) = (c.old.as_ref().unwrap().obj, c.new.as_ref().unwrap().obj);
    assert_eq!(e.read_change(t, old, false, 0, 100).unwrap().1, b"hello\n");
    assert_eq!(e.read_change(t, new, true, 0, 100).unwrap().1, b"HEllo\n");
    // Someone else changes `d/b` and `a`'s metadata; listing read neither,
    // so the transaction still commits.
    put(&e, None, "d/b", b"other");
    e.setattr(None, a, &SetAttr { mode: Some(0o640), ..Default::default() }).unwrap();
    e.commit(t, Durability::Durable).expect("listing changes made the transaction conflict");
    assert_eq!(e.read(None, a, 0, 100).unwrap(), b"HEllo\n");
}

#[test]
fn a_hundred_thousand_paths_are_listed_in_sorted_order() {
    let e = engine();
    let t = e.begin();
    mkdir(&e, Some(t), "many");
    let dir = obj(&e, Some(t), "many");
    for i in 0..100_000u32 {
        e.create(Some(t), dir, os(&format!("f{i:06}")), 0o644, 0, 0).unwrap();
    }
    let set = e.changes(t).unwrap();
    assert_eq!(set.len(), 100_001);
    assert_eq!(set[0].files, 100_000);
    let want: Vec<PathBuf> = (0..100_000u32).map(|i| PathBuf::from(format!("many/f{i:06}"))).collect();
    assert!(set[1..].iter().map(|c| &c.path).eq(want.iter()));
    e.abort(t).unwrap();
}

#[test]
fn a_truncate_grown_back_to_the_old_size_is_a_modification() {
    let e = seeded();
    let t = e.begin();
    let a = obj(&e, Some(t), "a");
    e.truncate(Some(t), a, 0).unwrap();
    e.truncate(Some(t), a, 6).unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(at(&set, "a").what, what::MODIFIED, "its bytes are zeros now");
    e.abort(t).unwrap();
}

#[test]
fn a_path_another_object_takes_through_a_moved_directory_is_no_replacement() {
    // rm a/x; mv a a_old; mv b a: the deletion is of the old a/x, listed
    // where it was; the new a/x is b/x, moved with its directory (and
    // changed): two changes, never one "replaced" pairing unrelated files.
    let e = engine();
    for d in ["a", "b"] {
        mkdir(&e, None, d);
    }
    put(&e, None, "a/x", b"A\n");
    put(&e, None, "b/x", b"B\n");
    e.checkpoint().unwrap();
    let t = e.begin();
    unlink(&e, Some(t), "a/x");
    rename(&e, Some(t), "a", "a_old");
    rename(&e, Some(t), "b", "a");
    put(&e, Some(t), "a/x", b"B\nmore\n");
    let set = e.changes(t).unwrap();
    let list: Vec<(String, u32)> = set.iter().map(|c| (c.path.display().to_string(), c.what)).collect();
    let want = [("a", what::RENAMED), ("a/x", what::DELETED), ("a/x", what::MODIFIED), ("a_old", what::RENAMED)];
    assert_eq!(list, want.map(|(p, w)| (p.to_string(), w)));
    let moved = &set[2];
    assert_eq!(moved.from.as_deref(), Some(Path::new("b/x")), "where it was");
    let old = moved.old.as_ref().unwrap().obj;
    assert_eq!(e.read_change(t, old, false, 0, 100).unwrap().1, b"B\n", "its own old side");
    assert_eq!(set[1].old.as_ref().unwrap().size, 2);
    e.abort(t).unwrap();
}

#[test]
fn a_name_taken_over_by_a_rename_while_its_object_moves_on_is_two_renames() {
    // mv keep/x keep/y; mv d/b keep/x: keep/x is not replaced (its object
    // lives on at keep/y).
    let e = seeded();
    let t = e.begin();
    rename(&e, Some(t), "keep/x", "keep/y");
    rename(&e, Some(t), "d/b", "keep/x");
    let set = e.changes(t).unwrap();
    let list: Vec<(String, u32, Option<PathBuf>)> =
        set.iter().map(|c| (c.path.display().to_string(), c.what, c.from.clone())).collect();
    assert_eq!(
        list,
        [
            ("keep/x".to_string(), what::RENAMED, Some(PathBuf::from("d/b"))),
            ("keep/y".to_string(), what::RENAMED, Some(PathBuf::from("keep/x"))),
        ]
    );
    e.abort(t).unwrap();
}

#[test]
fn a_hard_linked_file_changed_in_place_is_listed_at_a_name_it_keeps() {
    let e = seeded();
    let x = obj(&e, None, "keep/x");
    e.link(None, x, ObjId::ROOT, os("h")).unwrap();
    // Renamed away and back, then chmod: at keep/x or h, never "from" the other.
    let t = e.begin();
    rename(&e, Some(t), "keep/x", "keep/x2");
    rename(&e, Some(t), "keep/x2", "keep/x");
    e.setattr(Some(t), x, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(set.len(), 1, "{set:#?}");
    assert_eq!((set[0].what, set[0].from.as_deref()), (what::MODE, None));
    e.abort(t).unwrap();
    // One name removed, the file changed through the other: the removal,
    // and the change at the name it kept (which never moved).
    let t = e.begin();
    unlink(&e, Some(t), "keep/x");
    e.setattr(Some(t), x, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    let set = e.changes(t).unwrap();
    let list: Vec<(String, u32, Option<PathBuf>)> =
        set.iter().map(|c| (c.path.display().to_string(), c.what, c.from.clone())).collect();
    assert_eq!(list, [("h".to_string(), what::MODE, None), ("keep/x".to_string(), what::DELETED, None)]);
    e.abort(t).unwrap();
}

#[test]
fn a_chmod_of_a_directory_whose_entries_change_lists_no_times() {
    let e = seeded();
    let t = e.begin();
    let keep = obj(&e, Some(t), "keep");
    e.setattr(Some(t), keep, &SetAttr { mode: Some(0o700), ..Default::default() }).unwrap();
    put(&e, Some(t), "keep/new", b"n");
    // A truncate to the size a file has (open with O_TRUNC of an empty
    // file) carries an mtime too: no times either.
    let a = obj(&e, Some(t), "d/b");
    let now = Timestamp { secs: 2_000_000_000, nanos: 0 };
    e.setattr(Some(t), a, &SetAttr { size: Some(3), mtime: Some(now), ..Default::default() }).unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(at(&set, "keep").what, what::MODE);
    assert!(set.iter().all(|c| c.path != Path::new("d/b")), "{set:#?}");
    e.abort(t).unwrap();
}

#[test]
fn a_tree_deeper_than_any_walk_bound_is_listed_whole() {
    // 4200 levels: past the 4096 that walks up the tree once stopped at.
    let e = engine();
    let t = e.begin();
    let mut dir = ObjId::ROOT;
    for _ in 0..4200 {
        dir = e.mkdir(Some(t), dir, os("d"), 0o755, 0, 0).unwrap().obj;
    }
    e.create(Some(t), dir, os("leaf"), 0o644, 0, 0).unwrap();
    let set = e.changes(t).unwrap();
    assert_eq!(set.len(), 4201);
    assert_eq!((set[0].path.as_os_str().len(), set[0].files, set[0].dirs), (1, 1, 4199));
    assert_eq!(set[4200].path.components().count(), 4201, "the leaf, at its whole path");
    e.abort(t).unwrap();
}

#[test]
fn a_tree_deeper_than_4096_levels_checkpoints() {
    // The checkpoint's walk up the tree stopped at 4096 levels: the
    // objects below were "stale", the checkpoint failed, and the engine
    // refused everything after (issue 23: a user could brick the mount).
    let e = engine();
    let mut dir = ObjId::ROOT;
    for _ in 0..4200 {
        dir = e.mkdir(None, dir, os("d"), 0o755, 0, 0).unwrap().obj;
    }
    e.create(None, dir, os("leaf"), 0o644, 0, 0).unwrap();
    e.checkpoint().expect("a tree of 4200 levels checkpoints");
    let leaf = e.lookup(None, dir, os("leaf")).expect("the leaf after the checkpoint");
    assert_eq!(leaf.size, 0);
}

#[test]
fn a_directory_cannot_move_into_its_own_subtree_however_deep() {
    // Below 4096 levels the walk up from the target used to stop looking,
    // and the rename went through: a cycle cut off from the root.
    let e = engine();
    let top = e.mkdir(None, ObjId::ROOT, os("top"), 0o755, 0, 0).unwrap().obj;
    let mut dir = top;
    for _ in 0..4200 {
        dir = e.mkdir(None, dir, os("d"), 0o755, 0, 0).unwrap().obj;
    }
    let r = e.rename(None, ObjId::ROOT, os("top"), dir, os("loop"), RenameFlags::default());
    assert_eq!(r.expect_err("a move into its own subtree").errno(), libc::EINVAL);
}
