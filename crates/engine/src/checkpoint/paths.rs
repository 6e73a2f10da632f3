//! The paths a checkpoint plan names, each once: a table of
//! `(parent, name)` entries, so that a path costs its last name, not all
//! of its components.
//!
//! A plan of full paths cost the square of the tree's depth: 1500 nested
//! directories of 255-byte names made 290 MB of path bytes, held several
//! times while the plan was encoded and written (daemon VmHWM 1.7 GB;
//! issue 23). A [`PathRef`] is an index into [`Paths`]; equal paths are
//! the same ref, because every path enters component by component
//! ([`Paths::join`], [`Paths::intern`]). Storage calls get a [`PathBuf`]
//! made for the call ([`Paths::path`]) and dropped after it.

use crate::codec::{Codec, DecodeError, Reader};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// A path of a plan, relative to the backing root: an entry of [`Paths`],
/// or [`PathRef::ROOT`] (the empty path, the root itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathRef(u32);

impl PathRef {
    pub const ROOT: PathRef = PathRef(u32::MAX);
}

#[derive(Clone, Debug)]
struct Entry {
    parent: PathRef,
    name: Vec<u8>,
    /// Components from the root (not stored: the table's order gives it).
    depth: u32,
}

/// The table of a plan's paths.
#[derive(Clone, Debug, Default)]
pub struct Paths {
    entries: Vec<Entry>,
    index: HashMap<(PathRef, Vec<u8>), PathRef>,
}

impl Paths {
    /// The path `parent/name` (`name` one component).
    pub fn join(&mut self, parent: PathRef, name: &[u8]) -> PathRef {
        debug_assert!(is_name(name), "{:?} is not one component", OsStr::from_bytes(name));
        let key = (parent, name.to_vec());
        if let Some(r) = self.index.get(&key) {
            return *r;
        }
        let r = PathRef(u32::try_from(self.entries.len()).expect("fewer than 2^32 paths in a plan"));
        let depth = self.depth(parent) as u32 + 1;
        self.entries.push(Entry { parent, name: key.1.clone(), depth });
        self.index.insert(key, r);
        r
    }

    /// A relative path, component by component; `None` if it is not one
    /// (absolute, or with `..`).
    pub fn intern(&mut self, path: &Path) -> Option<PathRef> {
        let mut r = PathRef::ROOT;
        for c in path.components() {
            match c {
                Component::Normal(n) => r = self.join(r, n.as_bytes()),
                Component::CurDir => {}
                _ => return None,
            }
        }
        Some(r)
    }

    /// The entry of a relative path, if the table has it (nothing added).
    pub fn find(&self, path: &Path) -> Option<PathRef> {
        let mut r = PathRef::ROOT;
        for c in path.components() {
            match c {
                Component::Normal(n) => r = *self.index.get(&(r, n.as_bytes().to_vec()))?,
                Component::CurDir => {}
                _ => return None,
            }
        }
        Some(r)
    }

    /// The path itself, made for one storage call.
    pub fn path(&self, r: PathRef) -> PathBuf {
        let mut names = Vec::with_capacity(self.depth(r));
        let mut len = 0;
        let mut cur = r;
        while cur != PathRef::ROOT {
            let e = &self.entries[cur.0 as usize];
            names.push(&e.name[..]);
            len += e.name.len() + 1;
            cur = e.parent;
        }
        let mut out = Vec::with_capacity(len);
        for n in names.iter().rev() {
            if !out.is_empty() {
                out.push(b'/');
            }
            out.extend_from_slice(n);
        }
        PathBuf::from(OsStr::from_bytes(&out))
    }

    pub fn parent(&self, r: PathRef) -> PathRef {
        if r == PathRef::ROOT {
            return r;
        }
        self.entries[r.0 as usize].parent
    }

    /// Components from the root (0 for the root).
    pub fn depth(&self, r: PathRef) -> usize {
        if r == PathRef::ROOT {
            return 0;
        }
        self.entries[r.0 as usize].depth as usize
    }

    /// Whether `r` is `dir` or lies beneath it (`Path::starts_with`).
    pub fn is_within(&self, r: PathRef, dir: PathRef) -> bool {
        let (mut cur, want) = (r, self.depth(dir));
        if self.depth(cur) < want {
            return false;
        }
        while self.depth(cur) > want {
            cur = self.parent(cur);
        }
        cur == dir
    }

    /// How many entries (the root is none).
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Whether `r` is the root or an entry of this table.
    pub fn holds(&self, r: PathRef) -> bool {
        r == PathRef::ROOT || (r.0 as usize) < self.entries.len()
    }
}

/// One component: not empty, no `/`, not `.` or `..`.
fn is_name(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/')
}

// On disk: the entries as `(u32 parent, name)` in table order, every
// parent an earlier entry or `u32::MAX` (so the table has no cycles and
// each depth is known when its entry is read); a ref is its u32.

impl Codec for PathRef {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(PathRef(u32::get(r)?))
    }
}

impl Paths {
    pub(super) fn put(&self, out: &mut Vec<u8>) {
        (self.entries.len() as u64).put(out);
        for e in &self.entries {
            e.parent.put(out);
            e.name.put(out);
        }
    }

    /// The table from its bytes; `Ok(None)` if they decode but are not a
    /// table (a parent not before its entry, a name that is not one
    /// component, a path twice).
    pub(super) fn get(r: &mut Reader<'_>) -> std::result::Result<Option<Paths>, DecodeError> {
        let entries: Vec<(PathRef, Vec<u8>)> = Codec::get(r)?;
        let mut t = Paths::default();
        for (i, (parent, name)) in entries.into_iter().enumerate() {
            if !(parent == PathRef::ROOT || (parent.0 as usize) < i) || !is_name(&name) {
                return Ok(None);
            }
            if t.join(parent, &name).0 as usize != i {
                return Ok(None);
            }
        }
        Ok(Some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_paths_are_one_entry_and_come_back_whole() {
        let mut t = Paths::default();
        let a = t.intern(Path::new("a/b/c")).unwrap();
        let b = t.join(t.find(Path::new("a/b")).unwrap(), b"c");
        assert_eq!(a, b);
        assert_eq!(t.entries(), 3);
        assert_eq!(t.path(a), Path::new("a/b/c"));
        assert_eq!(t.path(PathRef::ROOT), Path::new(""));
        assert_eq!(t.intern(Path::new("")), Some(PathRef::ROOT));
        assert_eq!(t.depth(a), 3);
        assert_eq!(t.path(t.parent(a)), Path::new("a/b"));
        assert!(t.is_within(a, t.find(Path::new("a")).unwrap()));
        assert!(t.is_within(a, a) && t.is_within(a, PathRef::ROOT));
        let x = t.intern(Path::new("a/x")).unwrap();
        assert!(!t.is_within(a, x) && !t.is_within(x, a));
        assert_eq!(t.intern(Path::new("../a")), None);
        assert_eq!(t.intern(Path::new("/a")), None);
        assert_eq!(t.find(Path::new("a/y")), None);
    }

    #[test]
    fn a_deep_path_costs_its_last_name() {
        let name = [b'n'; 255];
        let mut t = Paths::default();
        let mut r = PathRef::ROOT;
        for _ in 0..1500 {
            r = t.join(r, &name);
        }
        let mut bytes = Vec::new();
        t.put(&mut bytes);
        // 1500 names of 255 bytes and their 16 bytes of framing; the full
        // paths were 1500 * 1501 / 2 * 256 bytes (288 MB).
        assert_eq!(bytes.len(), 8 + 1500 * (4 + 8 + 255));
        assert_eq!(t.path(r).as_os_str().len(), 1500 * 256 - 1);
        let back = Paths::get(&mut Reader::new(&bytes)).unwrap().unwrap();
        assert_eq!(back.path(r), t.path(r));
    }

    #[test]
    fn a_table_that_is_not_one_is_refused() {
        let enc = |entries: Vec<(u32, &[u8])>| {
            let v: Vec<(PathRef, Vec<u8>)> = entries.into_iter().map(|(p, n)| (PathRef(p), n.to_vec())).collect();
            let mut out = Vec::new();
            v.put(&mut out);
            out
        };
        let get = |b: Vec<u8>| Paths::get(&mut Reader::new(&b)).unwrap().map(|t| t.entries());
        assert_eq!(get(enc(vec![(u32::MAX, b"a"), (0, b"b")])), Some(2));
        assert_eq!(get(enc(vec![(1, b"a"), (u32::MAX, b"b")])), None, "a parent after its entry");
        assert_eq!(get(enc(vec![(0, b"a")])), None, "its own parent");
        assert_eq!(get(enc(vec![(u32::MAX, b"a/b")])), None);
        assert_eq!(get(enc(vec![(u32::MAX, b"..")])), None);
        assert_eq!(get(enc(vec![(u32::MAX, b"")])), None);
        assert_eq!(get(enc(vec![(u32::MAX, b"a"), (u32::MAX, b"a")])), None, "a path twice");
    }
}
