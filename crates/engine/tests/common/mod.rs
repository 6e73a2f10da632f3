//! Shared helpers for the engine's integration tests: a canonical dump of
//! a file tree, taken either through the engine (what users see) or
//! straight from a `Storage` (what the backing directory holds).
#![allow(dead_code)]

pub mod recycled;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use txfs_engine::storage::Storage;
use txfs_engine::{Engine, FileKind, ObjId, TxId, META_DIR};

/// One object of a dumped tree. Hard links appear once per name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: OsString,
    },
    /// A fifo, socket or device, and its number (0 but for devices).
    Special {
        kind: FileKind,
        mode: u32,
        rdev: u64,
    },
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
            k if k.is_special() => {
                assert_eq!(a.kind, k, "kind of {} in its listing and its attributes", path.display());
                out.insert(path, Node::Special { kind: k, mode: a.mode, rdev: a.rdev });
            }
            _ => {}
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
            k if k.is_special() => {
                out.insert(path, Node::Special { kind: k, mode: m.mode, rdev: m.rdev });
            }
            _ => {}
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
/// journal.rs), at a record of an earlier epoch (a recycled journal), or
/// where no whole header fits.
pub fn journal_records(s: &dyn Storage) -> (PathBuf, Vec<(u64, u64)>, u64) {
    use txfs_engine::journal::{FILE_HEADER_LEN, REC_HEADER_LEN};
    let jdir = Path::new(META_DIR).join("journal");
    let list = s.read_dir(&jdir).expect("journal dir");
    assert_eq!(list.len(), 1, "one journal file expected: {list:?}");
    let path = jdir.join(&list[0].0);
    let len = s.lstat(&path).unwrap().size;
    let mut fh = [0u8; FILE_HEADER_LEN as usize];
    assert_eq!(s.read_at(&path, 0, &mut fh).unwrap(), fh.len());
    let prev_seq = u64::from_le_bytes(fh[16..24].try_into().unwrap());
    let mut at = FILE_HEADER_LEN;
    let mut v = Vec::new();
    while at + REC_HEADER_LEN <= len {
        let mut h = [0u8; REC_HEADER_LEN as usize];
        assert_eq!(s.read_at(&path, at, &mut h).unwrap(), h.len());
        if h.iter().all(|b| *b == 0) || u64::from_le_bytes(h[8..16].try_into().unwrap()) <= prev_seq {
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

/// Implements the listed [`Storage`] methods of a wrapper by passing them
/// to its field `$inner` unchanged, so a test storage spells out only the
/// methods it changes: `impl Storage for W { pass_through!(inner: lstat,
/// read_dir, …); fn write_at(…) { … } }`.
#[allow(unused_macros)]
macro_rules! pass_through {
    ($inner:ident: $($m:ident),* $(,)?) => { $( crate::common::pass_through!(@one $inner $m); )* };
    (@one $i:ident lstat) => {
        fn lstat(&self, p: &std::path::Path) -> std::io::Result<txfs_engine::storage::Meta> { self.$i.lstat(p) }
    };
    (@one $i:ident read_dir) => {
        fn read_dir(&self, p: &std::path::Path) -> std::io::Result<Vec<(std::ffi::OsString, txfs_engine::storage::FileKind)>> {
            self.$i.read_dir(p)
        }
    };
    (@one $i:ident read_at) => {
        fn read_at(&self, p: &std::path::Path, off: u64, buf: &mut [u8]) -> std::io::Result<usize> { self.$i.read_at(p, off, buf) }
    };
    (@one $i:ident file_len) => {
        fn file_len(&self, p: &std::path::Path) -> std::io::Result<u64> { self.$i.file_len(p) }
    };
    (@one $i:ident write_at) => {
        fn write_at(&self, p: &std::path::Path, off: u64, data: &[u8]) -> std::io::Result<()> { self.$i.write_at(p, off, data) }
    };
    (@one $i:ident set_len) => {
        fn set_len(&self, p: &std::path::Path, len: u64) -> std::io::Result<()> { self.$i.set_len(p, len) }
    };
    (@one $i:ident create_file) => {
        fn create_file(&self, p: &std::path::Path, mode: u32) -> std::io::Result<()> { self.$i.create_file(p, mode) }
    };
    (@one $i:ident mkdir) => {
        fn mkdir(&self, p: &std::path::Path, mode: u32) -> std::io::Result<()> { self.$i.mkdir(p, mode) }
    };
    (@one $i:ident symlink) => {
        fn symlink(&self, t: &std::ffi::OsStr, p: &std::path::Path) -> std::io::Result<()> { self.$i.symlink(t, p) }
    };
    (@one $i:ident mknod) => {
        fn mknod(&self, p: &std::path::Path, k: txfs_engine::storage::FileKind, m: u32, r: u64) -> std::io::Result<()> {
            self.$i.mknod(p, k, m, r)
        }
    };
    (@one $i:ident readlink) => {
        fn readlink(&self, p: &std::path::Path) -> std::io::Result<std::ffi::OsString> { self.$i.readlink(p) }
    };
    (@one $i:ident rename) => {
        fn rename(&self, a: &std::path::Path, b: &std::path::Path) -> std::io::Result<()> { self.$i.rename(a, b) }
    };
    (@one $i:ident link) => {
        fn link(&self, a: &std::path::Path, b: &std::path::Path) -> std::io::Result<()> { self.$i.link(a, b) }
    };
    (@one $i:ident unlink) => {
        fn unlink(&self, p: &std::path::Path) -> std::io::Result<()> { self.$i.unlink(p) }
    };
    (@one $i:ident rmdir) => {
        fn rmdir(&self, p: &std::path::Path) -> std::io::Result<()> { self.$i.rmdir(p) }
    };
    (@one $i:ident set_mode) => {
        fn set_mode(&self, p: &std::path::Path, m: u32) -> std::io::Result<()> { self.$i.set_mode(p, m) }
    };
    (@one $i:ident set_owner) => {
        fn set_owner(&self, p: &std::path::Path, u: u32, g: u32) -> std::io::Result<()> { self.$i.set_owner(p, u, g) }
    };
    (@one $i:ident set_times) => {
        fn set_times(
            &self,
            p: &std::path::Path,
            a: txfs_engine::storage::Timestamp,
            m: txfs_engine::storage::Timestamp,
        ) -> std::io::Result<()> {
            self.$i.set_times(p, a, m)
        }
    };
    (@one $i:ident get_xattr) => {
        fn get_xattr(&self, p: &std::path::Path, n: &std::ffi::OsStr) -> std::io::Result<Option<Vec<u8>>> { self.$i.get_xattr(p, n) }
    };
    (@one $i:ident list_xattrs) => {
        fn list_xattrs(&self, p: &std::path::Path) -> std::io::Result<Vec<std::ffi::OsString>> { self.$i.list_xattrs(p) }
    };
    (@one $i:ident set_xattr) => {
        fn set_xattr(&self, p: &std::path::Path, n: &std::ffi::OsStr, v: &[u8]) -> std::io::Result<()> { self.$i.set_xattr(p, n, v) }
    };
    (@one $i:ident remove_xattr) => {
        fn remove_xattr(&self, p: &std::path::Path, n: &std::ffi::OsStr) -> std::io::Result<()> { self.$i.remove_xattr(p, n) }
    };
    (@one $i:ident fsync) => {
        fn fsync(&self, p: &std::path::Path) -> std::io::Result<()> { self.$i.fsync(p) }
    };
    (@one $i:ident sync_all) => {
        fn sync_all(&self) -> std::io::Result<()> { self.$i.sync_all() }
    };
    (@one $i:ident open_file) => {
        fn open_file(&self, p: &std::path::Path, create: bool) -> std::io::Result<std::sync::Arc<dyn txfs_engine::storage::StoredFile>> {
            self.$i.open_file(p, create)
        }
    };
}
#[allow(unused_imports)]
pub(crate) use pass_through;

/// A whole journal record in the unkeyed (`TXFSJNL1`) format, as a user could
/// write it into a file: the forgery keyed journals must reject.
pub fn unkeyed_record(seq: u64, durable_upto: u64, meta: &[u8], data_len_claim: u64, data: &[u8]) -> Vec<u8> {
    use txfs_engine::journal as jn;
    let mut h = [0u8; jn::REC_HEADER_LEN as usize];
    h[0..4].copy_from_slice(&jn::REC_MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&jn::REC_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&jn::KIND_COMMIT.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..24].copy_from_slice(&durable_upto.to_le_bytes());
    h[24..28].copy_from_slice(&(meta.len() as u32).to_le_bytes());
    h[32..40].copy_from_slice(&data_len_claim.to_le_bytes());
    let mut crc = crc32c::crc32c(&h[0..40]);
    crc = crc32c::crc32c_append(crc, meta);
    crc = crc32c::crc32c_append(crc, data);
    h[40..44].copy_from_slice(&crc.to_le_bytes());
    let mut v = h.to_vec();
    v.extend_from_slice(meta);
    v.extend_from_slice(data);
    v
}
