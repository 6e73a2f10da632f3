//! Shared helpers for the engine's integration tests: a canonical dump of
//! a file tree, taken either through the engine (what users see) or
//! straight from a `Storage` (what the backing directory holds).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use txfs_engine::storage::Storage;
use txfs_engine::{Engine, FileKind, ObjId, TxId, META_DIR};

/// One object of a dumped tree. Hard links appear once per name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File { data: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Symlink { target: OsString },
}

pub type Tree = BTreeMap<PathBuf, Node>;

/// Everything visible through `engine` (inside `tx`, or committed if `None`).
pub fn dump_engine(engine: &Engine, tx: Option<TxId>) -> Tree {
    let mut out = Tree::new();
    walk_engine(engine, tx, ObjId::ROOT, PathBuf::new(), &mut out);
    out
}

fn walk_engine(engine: &Engine, tx: Option<TxId>, dir: ObjId, at: PathBuf, out: &mut Tree) {
    for e in engine.readdir(tx, dir).expect("readdir") {
        let path = at.join(&e.name);
        let a = engine.getattr(tx, e.obj).expect("getattr");
        match e.kind {
            FileKind::Dir => {
                out.insert(path.clone(), Node::Dir { mode: a.mode });
                walk_engine(engine, tx, e.obj, path, out);
            }
            FileKind::File => {
                let data = engine.read(tx, e.obj, 0, a.size as usize + 1).expect("read");
                assert_eq!(data.len() as u64, a.size, "size of {} disagrees with its content", path.display());
                out.insert(path, Node::File { data, mode: a.mode });
            }
            FileKind::Symlink => {
                out.insert(path, Node::Symlink { target: engine.readlink(tx, e.obj).expect("readlink") });
            }
            FileKind::Other => {}
        }
    }
}

/// Everything in the backing store except txfs's own folder.
pub fn dump_storage(s: &dyn Storage) -> Tree {
    let mut out = Tree::new();
    walk_storage(s, Path::new(""), &mut out);
    out
}

fn walk_storage(s: &dyn Storage, at: &Path, out: &mut Tree) {
    let mut entries = s.read_dir(at).expect("read_dir");
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, _) in entries {
        if at.as_os_str().is_empty() && name.as_bytes() == META_DIR.as_bytes() {
            continue;
        }
        let path = at.join(&name);
        let m = s.lstat(&path).expect("lstat");
        match m.kind {
            FileKind::Dir => {
                out.insert(path.clone(), Node::Dir { mode: m.mode });
                walk_storage(s, &path, out);
            }
            FileKind::File => {
                let mut data = vec![0u8; m.size as usize];
                let mut got = 0;
                while got < data.len() {
                    let n = s.read_at(&path, got as u64, &mut data[got..]).expect("read");
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                data.truncate(got);
                out.insert(path, Node::File { data, mode: m.mode });
            }
            FileKind::Symlink => {
                out.insert(path.clone(), Node::Symlink { target: s.readlink(&path).expect("readlink") });
            }
            FileKind::Other => {}
        }
    }
}

/// Leftovers in `.txfs/` that must be empty after a clean close or recovery.
pub fn leftovers(s: &dyn Storage) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for sub in ["stage", "data", "orphans"] {
        let p = Path::new(META_DIR).join(sub);
        if let Ok(list) = s.read_dir(&p) {
            for (n, _) in list {
                v.push(p.join(n));
            }
        }
    }
    v
}

/// The one journal file under `.txfs/journal`, its records' `(start, end)`
/// offsets, and where they end: at a record header of zeros (the runway,
/// journal.rs) or where no whole header fits.
pub fn journal_records(s: &dyn Storage) -> (PathBuf, Vec<(u64, u64)>, u64) {
    use txfs_engine::journal::{FILE_HEADER_LEN, REC_HEADER_LEN};
    let jdir = Path::new(META_DIR).join("journal");
    let list = s.read_dir(&jdir).expect("journal dir");
    assert_eq!(list.len(), 1, "one journal file expected: {list:?}");
    let path = jdir.join(&list[0].0);
    let len = s.lstat(&path).unwrap().size;
    let mut at = FILE_HEADER_LEN;
    let mut v = Vec::new();
    while at + REC_HEADER_LEN <= len {
        let mut h = [0u8; REC_HEADER_LEN as usize];
        assert_eq!(s.read_at(&path, at, &mut h).unwrap(), h.len());
        if h.iter().all(|b| *b == 0) {
            break;
        }
        let meta_len = u32::from_le_bytes(h[24..28].try_into().unwrap()) as u64;
        let data_len = u64::from_le_bytes(h[32..40].try_into().unwrap());
        let end = at + REC_HEADER_LEN + meta_len + data_len;
        v.push((at, end));
        at = end;
    }
    (path, v, at)
}
