//! A live transaction's change set (`txfs diff`, `txfs run --dry-run`):
//! what its commit would do to the committed state, path by path. Read-only
//! and unrecorded: listing a transaction's changes adds nothing to its read
//! set, so looking never makes it conflict.
//!
//! The change set is worked out from the transaction's delta alone, against
//! the committed state as it is now (what the commit would apply on top
//! of): every directory entry the delta sets is compared with the committed
//! entry of that name, which tells the objects that lost a name and those
//! that gained one; every object whose content or attributes the delta
//! changes is compared with its committed attributes. Paths are resolved
//! through a reverse index of the layers' entries, built once per listing,
//! so a change set of `n` paths costs `O(n · depth)` plus the committed
//! delta's size, never a walk of the tree.

use super::state::{State, Tx};
use super::{Attr, Engine};
use crate::delta::Delta;
use crate::error::{Error, Result};
use crate::ids::{ObjId, TxId};
use crate::storage::FileKind;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// What happened to a path ([`Change::what`], a set of these bits).
pub mod what {
    /// The path names an object the transaction made.
    pub const CREATED: u32 = 0x1;
    /// The path no longer names anything.
    pub const DELETED: u32 = 0x2;
    /// The file's bytes or size changed.
    pub const MODIFIED: u32 = 0x4;
    /// The object at `path` was at `from` before.
    pub const RENAMED: u32 = 0x8;
    /// `path` is a new name of an object that keeps its old one(s).
    pub const LINKED: u32 = 0x10;
    pub const MODE: u32 = 0x20;
    pub const OWNER: u32 = 0x40;
    pub const XATTR: u32 = 0x80;
    /// Times set explicitly (utimensat, touch), not those a write bumps.
    pub const TIMES: u32 = 0x100;
    /// The path names a different object than before (a file saved by
    /// writing a new one and renaming it over the old, `ln -sf`).
    pub const REPLACED: u32 = 0x200;
}

/// One path of a change set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Below the mount's root; for a deletion, where it was.
    pub path: PathBuf,
    /// Where the object was before (a rename).
    pub from: Option<PathBuf>,
    pub what: u32,
    /// The kind of what `path` names after the commit (before, if deleted).
    pub kind: FileKind,
    /// The committed object at `from` (or `path`) and its attributes.
    pub old: Option<Attr>,
    /// The object at `path` after the commit and its attributes.
    pub new: Option<Attr>,
    /// Bytes the transaction wrote into the file (a new file: its size).
    pub bytes: u64,
    /// A symlink's target before and after.
    pub old_target: Option<OsString>,
    pub target: Option<OsString>,
    /// Extended attributes set or removed.
    pub xattrs: Vec<OsString>,
    /// A created or deleted directory: the files and directories below it
    /// that were created or deleted with it (listed too).
    pub files: u64,
    pub dirs: u64,
}

impl Change {
    fn new(path: PathBuf, what: u32, kind: FileKind) -> Change {
        Change {
            path,
            from: None,
            what,
            kind,
            old: None,
            new: None,
            bytes: 0,
            old_target: None,
            target: None,
            xattrs: Vec::new(),
            files: 0,
            dirs: 0,
        }
    }
}

/// Where objects are named in one view: the entries of its delta layers,
/// upper first, indexed by the object they name.
struct Names<'a> {
    layers: Vec<&'a Delta>,
    by_obj: Vec<HashMap<ObjId, Vec<(ObjId, &'a OsStr)>>>,
    paths: HashMap<ObjId, Option<PathBuf>>,
}

impl<'a> Names<'a> {
    /// `layers`: lowest first.
    fn new(layers: &[&'a Delta]) -> Names<'a> {
        let layers: Vec<&Delta> = layers.iter().rev().copied().collect();
        let by_obj = layers
            .iter()
            .map(|d| {
                let mut m: HashMap<ObjId, Vec<(ObjId, &OsStr)>> = HashMap::new();
                for (dir, entries) in &d.dirs {
                    for (name, e) in entries {
                        if let Some(o) = e {
                            m.entry(*o).or_default().push((*dir, name.as_os_str()));
                        }
                    }
                }
                m
            })
            .collect();
        Names { layers, by_obj, paths: HashMap::new() }
    }

    /// Whether a layer above `i` (or any, with `i = len`) sets `dir/name`.
    fn shadowed(&self, i: usize, dir: ObjId, name: &OsStr) -> bool {
        self.layers[..i].iter().any(|d| d.entry(dir, name).is_some())
    }

    /// A name of `o` in this view: its directory and the name. Of several
    /// (hard links), the oldest: a base name, then the lowest layer's, the
    /// first in order.
    fn loc(&self, st: &State, o: ObjId) -> Option<(ObjId, OsString)> {
        let all = self.layers.len();
        if let Some(node) = st.nodes.get(&o) {
            let base = node.base.iter().chain(&node.alts).find(|b| !self.shadowed(all, b.parent, &b.name));
            if let Some(b) = base {
                return Some((b.parent, b.name.clone()));
            }
        }
        for (i, m) in self.by_obj.iter().enumerate().rev() {
            let locs = m.get(&o).into_iter().flatten().filter(|(d, n)| !self.shadowed(i, *d, n));
            if let Some((d, n)) = locs.min() {
                return Some((*d, n.to_os_string()));
            }
        }
        None
    }

    /// Every name of `o` in this view, in [`Names::loc`]'s order.
    fn locs(&self, st: &State, o: ObjId) -> Vec<(ObjId, OsString)> {
        let all = self.layers.len();
        let mut out: Vec<(ObjId, OsString)> = Vec::new();
        if let Some(node) = st.nodes.get(&o) {
            let base = node.base.iter().chain(&node.alts).filter(|b| !self.shadowed(all, b.parent, &b.name));
            out.extend(base.map(|b| (b.parent, b.name.clone())));
        }
        for (i, m) in self.by_obj.iter().enumerate().rev() {
            let mut locs: Vec<&(ObjId, &OsStr)> =
                m.get(&o).into_iter().flatten().filter(|(d, n)| !self.shadowed(i, *d, n)).collect();
            locs.sort();
            out.extend(locs.into_iter().map(|(d, n)| (*d, n.to_os_string())));
        }
        out
    }

    /// The path of `o` below the root in this view, if it has a name.
    fn path(&mut self, st: &State, o: ObjId) -> Option<PathBuf> {
        if o == ObjId::ROOT {
            return Some(PathBuf::new());
        }
        let mut chain = Vec::new();
        let mut cur = o;
        let mut base = loop {
            if let Some(p) = self.paths.get(&cur) {
                break p.clone();
            }
            if cur == ObjId::ROOT {
                break Some(PathBuf::new());
            }
            match self.loc(st, cur) {
                // The bound only stops a cycle: trees may be deeper than
                // PATH_MAX (issue 23), and their paths are listed whole.
                Some((dir, name)) if chain.len() <= super::state::MAX_DEPTH => {
                    chain.push((cur, name));
                    cur = dir;
                }
                _ => break None,
            }
        };
        for (obj, name) in chain.into_iter().rev() {
            base = base.map(|p| p.join(name));
            self.paths.insert(obj, base.clone());
        }
        base
    }
}

impl State {
    /// The committed entry `dir/name` (no read recorded).
    fn committed_entry(&mut self, dir: ObjId, name: &OsStr) -> Result<Option<ObjId>> {
        if let Some(e) = self.committed.entry(dir, name) {
            return Ok(e);
        }
        if self.committed.created.contains_key(&dir) {
            return Ok(None);
        }
        self.base_child(dir, name)
    }

    /// An extended attribute as `tx` (or, with `None`, everyone) sees it,
    /// without recording the read.
    fn xattr_unrecorded(&self, tx: Option<&Tx>, o: ObjId, name: &OsStr) -> Result<Option<Vec<u8>>> {
        let layers = [tx.map(|t| &t.delta), Some(&self.committed), self.frozen.as_ref()];
        for d in layers.into_iter().flatten() {
            if let Some(v) = d.objs.get(&o).and_then(|od| od.attr.xattrs.get(name)) {
                return Ok(v.clone());
            }
        }
        if tx.is_some_and(|t| t.delta.created.contains_key(&o)) || self.committed.created.contains_key(&o) {
            return Ok(None);
        }
        let Some(p) = self.base_file(o)? else { return Ok(None) };
        self.storage.get_xattr(&p, name).map_err(|e| Error::io("getxattr", p.display().to_string(), e))
    }

    fn target_unrecorded(&self, tx: Option<&Tx>, o: ObjId) -> Option<OsString> {
        if let Some(n) = tx.and_then(|t| t.delta.created.get(&o)).or_else(|| self.committed.created.get(&o)) {
            return n.target.clone();
        }
        self.storage.readlink(&self.base_path(o)?).ok()
    }

    /// `tx`'s change set, sorted by path (component-wise, so that what is
    /// below a directory follows it).
    pub(super) fn changes(&mut self, tx: &Tx) -> Result<Vec<Change>> {
        // Names each object lost and gained: (dir, name).
        let mut lost: HashMap<ObjId, Vec<(ObjId, OsString)>> = HashMap::new();
        let mut gained: HashMap<ObjId, Vec<(ObjId, OsString)>> = HashMap::new();
        // Entries that name another object than before: the old one, by entry.
        let mut replaced: HashMap<(ObjId, OsString), ObjId> = HashMap::new();
        for (dir, entries) in &tx.delta.dirs {
            let made_here = tx.delta.created.contains_key(dir);
            for (name, now) in entries {
                let before = if made_here { None } else { self.committed_entry(*dir, name)? };
                if before == *now {
                    continue;
                }
                if let Some(o) = before {
                    lost.entry(o).or_default().push((*dir, name.clone()));
                }
                if let Some(o) = now {
                    gained.entry(*o).or_default().push((*dir, name.clone()));
                }
                if let (Some(old), Some(_)) = (before, now) {
                    replaced.insert((*dir, name.clone()), old);
                }
            }
        }
        // The old object of a replaced entry that lives on under another
        // name (`mv a b; mv c a`) was not replaced: it moved.
        replaced.retain(|_, old| !gained.contains_key(old));
        let committed = &self.committed;
        let mut old_names = Names::new(&[committed]);
        let mut new_names = Names::new(&[committed, &tx.delta]);
        let this: &State = self;
        let old_attr = |o: ObjId| this.attr_unrecorded(None, o).ok();
        let new_attr = |o: ObjId| this.attr_unrecorded(Some(tx), o).ok();
        let in_dir = |names: &mut Names, dir: ObjId, name: &OsStr| names.path(this, dir).map(|p| p.join(name));

        let mut out: Vec<Change> = Vec::new();
        // The entry standing for each object, for its content and
        // attribute changes.
        let mut primary: HashMap<ObjId, usize> = HashMap::new();
        let mut gained: Vec<(ObjId, Vec<(ObjId, OsString)>)> = gained.into_iter().collect();
        gained.sort_by_key(|(o, _)| *o);
        for (o, mut names) in gained {
            names.sort();
            let kind = this.node_kind(o)?;
            let created = tx.delta.created.contains_key(&o);
            let mut from = if created { Vec::new() } else { lost.remove(&o).unwrap_or_default() };
            from.sort();
            for (i, (dir, name)) in names.iter().enumerate() {
                let Some(path) = in_dir(&mut new_names, *dir, name) else { continue };
                let mut c = Change::new(path, 0, kind);
                c.new = new_attr(o);
                if created {
                    c.what = what::CREATED;
                    c.target = this.target_unrecorded(Some(tx), o);
                    if kind == FileKind::File {
                        c.bytes = c.new.as_ref().map_or(0, |a| a.size);
                    }
                } else if let Some((fd, fname)) = from.get(i) {
                    c.what = what::RENAMED;
                    c.from = in_dir(&mut old_names, *fd, fname);
                    c.old = old_attr(o);
                } else {
                    // A new name of an object that keeps its own: its
                    // changes are listed at its own name.
                    c.what = what::LINKED;
                    c.old = old_attr(o);
                }
                if let Some(&old) = replaced.get(&(*dir, name.clone())) {
                    // This entry named `old` before: one change, not a
                    // deletion of `old` beside it.
                    if let Some(names) = lost.get_mut(&old) {
                        names.retain(|l| (l.0, &l.1) != (*dir, name));
                    }
                    c.what |= what::REPLACED;
                    let old_kind = this.node_kind(old)?;
                    c.old_target = (old_kind == FileKind::Symlink).then(|| this.target_unrecorded(None, old)).flatten();
                    if created {
                        let before = old_attr(old);
                        if old_kind == kind {
                            // A new file in the old one's place: to the
                            // user, its content changed (another kind:
                            // just replaced).
                            c.what &= !what::CREATED;
                            if kind == FileKind::File {
                                c.what |= what::MODIFIED;
                            }
                            if let (Some(b), Some(n)) = (&before, &c.new) {
                                if b.mode != n.mode {
                                    c.what |= what::MODE;
                                }
                                if (b.uid, b.gid) != (n.uid, n.gid) {
                                    c.what |= what::OWNER;
                                }
                            }
                        }
                        c.old = before;
                    }
                }
                if c.what & what::LINKED != 0 {
                    out.push(c);
                    continue;
                }
                primary.entry(o).or_insert(out.len());
                out.push(c);
            }
            // More names lost than gained: the rest are deleted.
            for (dir, name) in from.into_iter().skip(names.len()) {
                lost.entry(o).or_default().push((dir, name));
            }
        }
        let mut lost: Vec<(ObjId, Vec<(ObjId, OsString)>)> = lost.into_iter().collect();
        lost.sort_by_key(|(o, _)| *o);
        for (o, names) in lost {
            let kind = this.node_kind(o)?;
            for (dir, name) in names {
                let Some(path) = in_dir(&mut old_names, dir, &name) else { continue };
                let mut c = Change::new(path, what::DELETED, kind);
                c.old = old_attr(o);
                c.old_target = (kind == FileKind::Symlink).then(|| this.target_unrecorded(None, o)).flatten();
                out.push(c);
            }
        }
        // Content and attributes of objects that existed.
        let mut objs: Vec<ObjId> =
            tx.delta.objs.keys().copied().filter(|o| !tx.delta.created.contains_key(o)).collect();
        objs.sort();
        for o in objs {
            let od = &tx.delta.objs[&o];
            let (Some(old), Some(new)) = (old_attr(o), new_attr(o)) else { continue };
            let mut bits = 0;
            // Bytes written, or the old ones cut (a truncate, even one
            // grown back to the old size: the tail reads as zeros now).
            let touched = od.file.as_ref().is_some_and(|f| !f.ext.is_empty() || f.cut < old.size);
            if od.file.is_some() && (old.size != new.size || touched) {
                bits |= what::MODIFIED;
            }
            if old.mode != new.mode {
                bits |= what::MODE;
            }
            if (old.uid, old.gid) != (new.uid, new.gid) {
                bits |= what::OWNER;
            }
            // Times set by utimensat or touch, not the mtime a truncate
            // (open with O_TRUNC: the kernel's setattr carries it), a
            // write or a change of a directory's entries gives.
            if tx.timed.contains(&o) && (old.atime, old.mtime) != (new.atime, new.mtime) {
                bits |= what::TIMES;
            }
            let mut xattrs = Vec::new();
            for name in od.attr.xattrs.keys() {
                if this.xattr_unrecorded(None, o, name)? != this.xattr_unrecorded(Some(tx), o, name)? {
                    xattrs.push(name.clone());
                }
            }
            if !xattrs.is_empty() {
                bits |= what::XATTR;
            }
            if bits == 0 {
                continue;
            }
            let idx = match primary.get(&o) {
                Some(&i) => i,
                None => {
                    // At a name it had and keeps (of a file with several,
                    // not one it gained or lost), if any.
                    let kept = old_names.locs(this, o).into_iter().find(|(d, n)| match tx.delta.entry(*d, n) {
                        None => true,
                        Some(e) => e == Some(o),
                    });
                    let at =
                        kept.and_then(|(d, n)| Some((in_dir(&mut new_names, d, &n)?, in_dir(&mut old_names, d, &n))));
                    let (path, before) = match at {
                        Some((p, b)) => (p, b),
                        None => match new_names.path(this, o) {
                            Some(p) => (p, old_names.path(this, o)),
                            None => continue,
                        },
                    };
                    let mut c = Change::new(path, 0, new.kind);
                    // Moved with a directory above it: where it was.
                    c.from = before.filter(|p| *p != c.path);
                    out.push(c);
                    out.len() - 1
                }
            };
            let c = &mut out[idx];
            c.what |= bits;
            c.bytes = od.file.as_ref().map_or(0, |f| f.ext.total_len());
            c.xattrs = xattrs;
            c.old = Some(old);
            c.new = Some(new);
        }
        Ok(finish(out))
    }
}

/// Sorts, and counts what was created or deleted below directories.
fn finish(mut out: Vec<Change>) -> Vec<Change> {
    // Deletions first at a path (an old path another object now has).
    out.sort_by(|a, b| a.path.cmp(&b.path).then((b.what & what::DELETED).cmp(&(a.what & what::DELETED))));
    // Created (deleted) directories: count what was created (deleted)
    // below them. What is below a path follows it in component order.
    let mut open: Vec<usize> = Vec::new();
    for i in 0..out.len() {
        while let Some(&top) = open.last() {
            if out[i].path.starts_with(&out[top].path) && out[i].path != out[top].path {
                break;
            }
            open.pop();
        }
        let (w, is_dir) = (out[i].what, out[i].kind == FileKind::Dir);
        for &d in &open {
            let dw = out[d].what;
            let same =
                (dw & what::CREATED != 0 && w & what::CREATED != 0) || (dw == what::DELETED && w == what::DELETED);
            if same {
                if is_dir {
                    out[d].dirs += 1;
                } else {
                    out[d].files += 1;
                }
            }
        }
        if is_dir && (w & what::CREATED != 0 || w == what::DELETED) {
            open.push(i);
        }
    }
    out
}

impl Engine {
    /// The change set of live transaction `tx` ([`Change`]), sorted by
    /// path. Records no read: it cannot make `tx` conflict.
    pub fn changes(&self, tx: TxId) -> Result<Vec<Change>> {
        let mut st = self.lock();
        let t = st.txs.remove(&tx).ok_or(Error::NoSuchTx(tx))?;
        let r = st.changes(&t);
        st.txs.insert(tx, t);
        r
    }

    /// A value that differs from the last one whenever `tx`'s change set
    /// may have changed since: a new operation of it or a new commit.
    pub fn changes_version(&self, tx: TxId) -> Result<(u64, u64)> {
        let st = self.lock();
        let t = st.txs.get(&tx).ok_or(Error::NoSuchTx(tx))?;
        Ok((t.ops, st.seq.0))
    }

    /// `o`'s attributes and up to `len` bytes at `off` of it, as the
    /// committed state has it (`new = false`) or as `tx` would commit it:
    /// the two sides of a change's diff. Records no read.
    pub fn read_change(&self, tx: TxId, o: ObjId, new: bool, off: u64, len: usize) -> Result<(Attr, Vec<u8>)> {
        let st = self.lock();
        let t = st.txs.get(&tx).ok_or(Error::NoSuchTx(tx))?;
        let view = new.then_some(t);
        let a = st.attr_unrecorded(view, o)?;
        let data = if a.kind == FileKind::File { st.read_content(view, o, off, len)? } else { Vec::new() };
        Ok((a, data))
    }
}
