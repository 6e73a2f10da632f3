//! Engine bugs found by the model's random runs (model.rs), each pinned by
//! a test opening with its story. All were found when the model suite was
//! written and fixed in the same commit, 97ec64b ("Model and isolation
//! suites; ..."). While a bug is open its test is `#[ignore]`d and its
//! `KNOWN_BUG_*` switch in model.rs keeps the random runs away from it.

mod common;

use common::{dump_storage, leftovers, Node};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::{MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, SetAttr};

const EPERM: i32 = libc::EPERM;

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Story: a user sets a `user.*` xattr on a symlink. Linux refuses that
/// with EPERM; the engine accepted it, and the next checkpoint then failed
/// on the backing store's EPERM and poisoned the whole engine.
#[test]
fn xattr_writes_on_symlinks_are_refused() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { flush_interval: None, ..Default::default() }).unwrap();
    let l = e.symlink(None, ObjId::ROOT, os("l"), os("target"), 0, 0).unwrap().obj;
    e.checkpoint().unwrap();
    let r = e.setxattr(None, l, os("user.k"), Some(b"v"), false, false);
    let removed = e.setxattr(None, l, os("user.k"), None, false, false);
    let ckpt = e.checkpoint();
    assert!(ckpt.is_ok(), "checkpoint after setxattr on a symlink: {ckpt:?}");
    assert_eq!(r.map_err(|e| e.errno()), Err(EPERM));
    assert_eq!(removed.map_err(|e| e.errno()), Err(EPERM));
}

/// A MemFs holding a file `a` hard-linked as `d1/b`, and an engine on it.
fn hard_linked_base() -> (Arc<MemFs>, Engine) {
    let fs = Arc::new(MemFs::new());
    fs.mkdir(Path::new("d1"), 0o755).unwrap();
    fs.create_file(Path::new("a"), 0o644).unwrap();
    fs.write_at(Path::new("a"), 0, b"base").unwrap();
    fs.link(Path::new("a"), Path::new("d1/b")).unwrap();
    let e = Engine::open(fs.clone(), Options { flush_interval: None, ..Default::default() }).unwrap();
    (fs, e)
}

/// Story: `a` and `d1/b` are one file. A program writes through `a`, then
/// removes the name `a`; it still holds the object (an open file). After
/// the checkpoint the object id read as an empty file: the checkpoint
/// marked the object dead because one of its backing names went away,
/// and `d1/b` came back as a new object. (An earlier version also lost
/// the write itself; the last two checks guard that.)
#[test]
fn checkpoint_keeps_changes_of_a_file_that_lost_one_of_two_names() {
    let (fs, e) = hard_linked_base();
    let a = e.lookup(None, ObjId::ROOT, os("a")).unwrap().obj;
    e.write(None, a, 0, b"NEW!").unwrap();
    e.setattr(None, a, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    e.unlink(None, ObjId::ROOT, os("a")).unwrap();
    let d1 = e.lookup(None, ObjId::ROOT, os("d1")).unwrap().obj;
    let b = e.lookup(None, d1, os("b")).unwrap();
    assert_eq!((b.obj, b.nlink, b.mode), (a, 1, 0o600));
    e.checkpoint().unwrap();
    let mut wrong = Vec::new();
    let old_id = e.read(None, b.obj, 0, 10).map_err(|e| e.errno());
    if old_id != Ok(b"NEW!".to_vec()) {
        wrong.push(format!("reading by the old object id: {old_id:?}"));
    }
    let b = e.lookup(None, d1, os("b")).unwrap();
    let by_name = e.read(None, b.obj, 0, 10).unwrap();
    if by_name != b"NEW!" || b.mode != 0o600 {
        wrong.push(format!("d1/b after the checkpoint: {:?}, mode {:o}", String::from_utf8_lossy(&by_name), b.mode));
    }
    e.close().unwrap();
    let stored = dump_storage(&*fs).get(Path::new("d1/b")).cloned();
    if stored != Some(Node::File { data: b"NEW!".to_vec(), mode: 0o600 }) {
        wrong.push(format!("d1/b in the backing store: {stored:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Story: `a` and `d1/b` are one file. A plain unlink removes `a`; then T
/// (begun after it) unlinks `d1/b`; a checkpoint runs; T's commit failed
/// with ESTALE ("no such object") although nothing conflicts with it.
#[test]
fn transaction_survives_checkpoint_of_a_file_that_lost_one_of_two_names() {
    let (fs, e) = hard_linked_base();
    e.unlink(None, ObjId::ROOT, os("a")).unwrap();
    let t = e.begin();
    let d1 = e.lookup(Some(t), ObjId::ROOT, os("d1")).unwrap().obj;
    e.unlink(Some(t), d1, os("b")).unwrap();
    e.checkpoint().unwrap();
    let r = e.commit(t, Durability::Durable);
    assert!(r.is_ok(), "commit: {r:?}");
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs).keys().collect::<Vec<_>>(), [Path::new("d1")]);
}

/// Story: `a` and `d1/b` are one file. T writes through `d1/b`; a plain
/// unlink removes `a` and a checkpoint runs. T reading `d1/b` again must
/// see its own write (it saw the base content: a new object id).
#[test]
fn read_your_writes_survive_checkpoint_of_a_file_that_lost_one_of_two_names() {
    let (_fs, e) = hard_linked_base();
    let t = Some(e.begin());
    let d1 = e.lookup(t, ObjId::ROOT, os("d1")).unwrap().obj;
    let b = e.lookup(t, d1, os("b")).unwrap().obj;
    e.write(t, b, 0, b"mine").unwrap();
    e.unlink(None, ObjId::ROOT, os("a")).unwrap();
    e.checkpoint().unwrap();
    match e.lookup(t, d1, os("b")) {
        Ok(a) => {
            assert_eq!(a.obj, b, "the same name now leads to another object");
            assert_eq!(e.read(t, a.obj, 0, 10).unwrap(), b"mine");
        }
        Err(err) => assert!(err.is_conflict(), "{err}"),
    }
}

/// Story: a program opens `f`, another removes the name; `fstat` on the
/// open descriptor says `st_nlink == 0` on Linux (SQLite checks exactly
/// this to warn about a database unlinked while open). After a checkpoint
/// moved the file to `.txfs/orphans/`, the engine reported that internal
/// link: nlink 1.
#[test]
fn open_unlinked_file_has_no_links_after_checkpoint() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { flush_interval: None, ..Default::default() }).unwrap();
    let f = e.create(None, ObjId::ROOT, os("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"data").unwrap();
    e.open_obj(f).unwrap();
    e.unlink(None, ObjId::ROOT, os("f")).unwrap();
    assert_eq!(e.getattr(None, f).unwrap().nlink, 0, "before the checkpoint");
    e.checkpoint().unwrap();
    assert_eq!(e.read(None, f, 0, 10).unwrap(), b"data", "an open file stays readable");
    assert_eq!(e.getattr(None, f).unwrap().nlink, 0, "after the checkpoint");
    e.release(f);
    e.close().unwrap();
    assert!(leftovers(&*fs).is_empty());
}

/// Story: `stat` on a new directory says size 0 and, once a checkpoint has
/// run, 4096; `chmod` on a symlink shows the new mode until a checkpoint
/// silently drops it. A checkpoint must be invisible.
#[test]
fn checkpoint_does_not_change_attributes() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { flush_interval: None, ..Default::default() }).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
    let l = e.symlink(None, ObjId::ROOT, os("l"), os("d"), 0, 0).unwrap().obj;
    let chmod = e.setattr(None, l, &SetAttr { mode: Some(0o600), ..Default::default() }).map(|a| a.mode);
    let before = (e.getattr(None, d).unwrap().size, e.getattr(None, l).unwrap().mode);
    e.checkpoint().unwrap();
    let after = (e.getattr(None, d).unwrap().size, e.getattr(None, l).unwrap().mode);
    assert_eq!(before, after, "(dir size, symlink mode) before and after the checkpoint; chmod said {chmod:?}");
}

/// Story: a setuid program is chowned. Linux drops the setuid bit (and
/// setgid, with group-exec), even for root; the engine kept both, until a
/// checkpoint replayed the chown on the backing store, which dropped them:
/// the mode changed at a moment nobody chose.
#[test]
fn chown_drops_setuid_like_linux() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), Options { flush_interval: None, ..Default::default() }).unwrap();
    let f = e.create(None, ObjId::ROOT, os("prog"), 0o6755, 0, 0).unwrap().obj;
    e.checkpoint().unwrap();
    let chown = SetAttr { uid: Some(1000), gid: Some(100), ..Default::default() };
    let now = e.setattr(None, f, &chown).unwrap().mode;
    e.checkpoint().unwrap();
    let later = e.getattr(None, f).unwrap().mode;
    assert_eq!((now, later), (0o755, 0o755), "mode right after chown, and after the checkpoint");
}
