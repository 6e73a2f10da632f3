//! What a transaction sees, and the reads it records.
//!
//! A view is three layers: the backing tree (base), the committed delta
//! (and a running checkpoint's frozen delta beneath it), and the
//! transaction's own delta. Every read first checks the stamps of what it
//! reads: an item stamped after the transaction began fails the read with
//! Conflict and dooms the transaction (I2, `State::conflict`), and the read
//! is added to the read set that commit validates (I3). [`Engine::read`]
//! reads a file no layer changes without the lock and checks afterwards
//! that nothing moved (`tree_gen`).
//!
//! Tests: `tests/isolation.rs` (`non_repeatable_read_is_impossible`,
//! `read_skew_is_impossible`, `a_transaction_reads_its_own_writes`),
//! `tests/unlocked_reads.rs`.

use super::api::{Attr, DirEntry};
use super::budget::Doom;
use super::isolation::PAGE;
use super::namespace::reserved;
use super::state::{State, Tx, ORPHANS_OBJ};
use super::Engine;

use crate::delta::AttrDelta;
use crate::error::{Error, IoContext, Result};
use crate::ids::{ObjId, TxId};
use crate::log::files::META_DIR;
use crate::storage::{FileKind, Storage, Timestamp};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl State {
    // ----- versions: eager checks (I2) -------------------------------------

    fn conflict(tx: &mut Tx, what: String) -> Error {
        tx.doomed = Some(Doom::Conflict(what.clone()));
        Error::Conflict { tx: tx.id, what }
    }

    pub(super) fn read_meta(&self, tx: &mut Tx, o: ObjId) -> Result<()> {
        if self.ver.metas.get(&o).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("attributes of {o}")));
        }
        tx.reads.metas.insert(o);
        Ok(())
    }

    fn read_name(&self, tx: &mut Tx, dir: ObjId, name: &OsStr) -> Result<()> {
        let key = (dir, name.to_owned());
        if self.ver.names.get(&key).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("name {name:?} in {dir}")));
        }
        let bytes = key.1.len() as u64;
        if tx.reads.names.insert(key) {
            tx.charge_read(bytes);
        }
        Ok(())
    }

    fn read_list(&self, tx: &mut Tx, dir: ObjId) -> Result<()> {
        if self.ver.lists.get(&dir).is_some_and(|q| *q > tx.start) {
            return Err(Self::conflict(tx, format!("listing of {dir}")));
        }
        tx.reads.lists.insert(dir);
        Ok(())
    }

    fn read_pages(&self, tx: &mut Tx, o: ObjId, off: u64, end: u64) -> Result<()> {
        if end <= off {
            return Ok(());
        }
        let (p0, p1) = (off / PAGE, end.div_ceil(PAGE));
        if let Some(f) = tx.delta.objs.get(&o).and_then(|d| d.file.as_ref()) {
            if f.ext.covers(off, end) {
                return Ok(());
            }
        }
        if self.ver.pages.get(&o).is_some_and(|r| r.newest(p0, p1) > tx.start) {
            return Err(Self::conflict(tx, format!("data of {o}")));
        }
        let ranges = tx.reads.pages.entry(o).or_default();
        // A file read in order is one range, not one per read.
        match ranges.last_mut() {
            Some(last) if last.0 <= p1 && p0 <= last.1 => *last = (last.0.min(p0), last.1.max(p1)),
            _ => {
                ranges.push((p0, p1));
                tx.charge_page_range();
            }
        }
        Ok(())
    }

    // ----- views ------------------------------------------------------------

    /// The object under `name` in `dir` as `tx` sees it.
    pub(crate) fn lookup(&mut self, tx: &mut Tx, dir: ObjId, name: &OsStr) -> Result<Option<ObjId>> {
        if reserved(dir, name) {
            return Ok(None);
        }
        if let Some(e) = tx.delta.entry(dir, name) {
            return Ok(e);
        }
        self.read_name(tx, dir, name)?;
        if let Some(e) = self.committed.entry(dir, name) {
            return Ok(e);
        }
        if self.is_created(tx, dir) {
            return Ok(None);
        }
        self.base_child(dir, name)
    }

    /// Attributes of `o` as `tx` sees them; records the read.
    pub(crate) fn attr(&mut self, tx: &mut Tx, o: ObjId) -> Result<Attr> {
        self.read_meta(tx, o)?;
        self.attr_unrecorded(Some(tx), o)
    }

    /// Attributes without recording a read (for the committed view, `tx = None`).
    pub(crate) fn attr_unrecorded(&self, tx: Option<&Tx>, o: ObjId) -> Result<Attr> {
        self.kind_in(tx, o)?;
        let node = &self.nodes[&o];
        let orphan = node.base.as_ref().is_some_and(|b| b.parent == ORPHANS_OBJ);
        let mut a = match self.base_meta(o)? {
            Some(m) => Attr {
                obj: o,
                kind: m.kind,
                size: m.size,
                mode: m.mode,
                nlink: m.nlink,
                uid: m.uid,
                gid: m.gid,
                rdev: m.rdev,
                atime: m.atime,
                mtime: m.mtime,
                ctime: m.ctime,
            },
            None => Attr {
                obj: o,
                kind: node.kind,
                // What a new directory reports on the backing file system.
                size: if node.kind == FileKind::Dir { 4096 } else { 0 },
                mode: 0,
                nlink: 0,
                uid: 0,
                gid: 0,
                rdev: 0,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
            },
        };
        if let Some(od) = self.frozen.as_ref().and_then(|d| d.objs.get(&o)) {
            // Link counts are in the tree already (namespace applied).
            apply_attr(&mut a, &AttrDelta { nlink: 0, ..od.attr.clone() });
            if let Some(f) = &od.file {
                a.size = f.size_after(a.size);
            }
        }
        let layers = [Some(&self.committed), tx.map(|t| &t.delta)];
        for d in layers.into_iter().flatten() {
            if let Some(od) = d.objs.get(&o) {
                apply_attr(&mut a, &od.attr);
                if let Some(f) = &od.file {
                    a.size = f.size_after(a.size);
                }
            }
        }
        if let Some(n) = tx.and_then(|t| t.delta.created.get(&o)).or_else(|| self.committed.created.get(&o)) {
            if let Some(t) = &n.target {
                a.size = t.len() as u64;
            }
            a.rdev = n.rdev;
        }
        if orphan {
            // The .txfs/orphans link is ours, not the user's.
            a.nlink = a.nlink.saturating_sub(1);
        }
        Ok(a)
    }

    /// Whether no layer changes `o`'s bytes, so that its backing file up to
    /// its end is its content (no checkpoint writes it either: that keeps
    /// its delta in `frozen` until done).
    fn bare(&self, tx: Option<&Tx>, o: ObjId) -> bool {
        let layers = [self.frozen.as_ref(), Some(&self.committed), tx.map(|t| &t.delta)];
        !layers.into_iter().flatten().any(|d| d.objs.get(&o).is_some_and(|od| od.file.is_some()))
    }

    /// Reads file content as `tx` (or, with `None`, everyone) sees it.
    pub(crate) fn read_content(&self, tx: Option<&Tx>, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let layers = [self.frozen.as_ref(), Some(&self.committed), tx.map(|t| &t.delta)];
        if self.bare(tx, o) {
            // No `lstat` for the size, which cost every READ an openat2
            // walk, a stat and a close (a fifth of a cold 4 KiB read's
            // daemon time).
            return match self.read_base(o, off, len) {
                // A daemon that may not open the file: a read at or past
                // its end still reads nothing, as the size says.
                Err(e) if matches!(e.errno(), libc::EACCES | libc::EPERM) => match self.base_meta(o) {
                    Ok(Some(m)) if off >= m.size => Ok(Vec::new()),
                    _ => Err(e),
                },
                r => r,
            };
        }
        let base_size = match self.base_file(o)? {
            Some(p) => self.storage.file_len(&p).map_err(|e| Error::io("stat", p.display().to_string(), e))?,
            None => 0,
        };
        let mut buf = match base_size.checked_sub(off) {
            Some(left) if left > 0 => self.read_base(o, off, (left as usize).min(len))?,
            _ => Vec::new(),
        };
        buf.resize(len, 0);
        let mut size = base_size;
        for d in layers.into_iter().flatten() {
            if let Some(f) = d.objs.get(&o).and_then(|od| od.file.as_ref()) {
                size = f
                    .overlay(size, off, &mut buf, &mut |loc, out| self.fetch(loc, out))
                    .ctx("read", || format!("{o} at {off}"))?;
            }
        }
        let keep = size.saturating_sub(off).min(len as u64) as usize;
        buf.truncate(keep);
        Ok(buf)
    }

    /// `len` bytes at `off` of `o`'s backing file, fewer at its end.
    fn read_base(&self, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let Some(path) = self.base_file(o)? else { return Ok(Vec::new()) };
        let mut buf = vec![0u8; len];
        // `read_at` is short only at the end of the file.
        let got = self.storage.read_at(&path, off, &mut buf).ctx("read", || path.display().to_string())?;
        buf.truncate(got);
        Ok(buf)
    }

    pub(super) fn readlink_view(&self, tx: &Tx, o: ObjId) -> Result<OsString> {
        if let Some(n) = tx.delta.created.get(&o).or_else(|| self.committed.created.get(&o)) {
            return n.target.clone().ok_or_else(|| Error::posix("readlink", o.to_string(), libc::EINVAL));
        }
        let p = self.base_path(o).ok_or(Error::Stale(o))?;
        self.storage.readlink(&p).ctx("readlink", || p.display().to_string())
    }

    /// Entries of `dir` as `tx` sees them; records the listing read.
    pub(crate) fn readdir(&mut self, tx: &mut Tx, dir: ObjId) -> Result<Vec<DirEntry>> {
        self.read_list(tx, dir)?;
        let mut names: BTreeMap<OsString, Option<ObjId>> = BTreeMap::new();
        if !self.is_created(tx, dir) {
            if let Some(p) = self.base_path(dir) {
                let list = self.storage.read_dir(&p).ctx("readdir", || p.display().to_string())?;
                for (name, _) in list {
                    if reserved(dir, &name) {
                        continue;
                    }
                    names.insert(name, None);
                }
                let base_names: Vec<OsString> = names.keys().cloned().collect();
                for n in base_names {
                    let o = self.base_child(dir, &n)?;
                    names.insert(n, o);
                }
            }
        }
        for d in [&self.committed, &tx.delta] {
            if let Some(dd) = d.dirs.get(&dir) {
                for (n, e) in dd {
                    names.insert(n.clone(), *e);
                }
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for (name, o) in names {
            if let Some(o) = o {
                out.push(DirEntry { name, obj: o, kind: self.node_kind(o)? });
            }
        }
        Ok(out)
    }

    pub(super) fn parent_of(&self, tx: &Tx, dir: ObjId) -> Option<ObjId> {
        // A directory's parent: from the newest delta that placed it, else base.
        for d in [&tx.delta, &self.committed] {
            if let Some(p) = d.parents.get(&dir) {
                return Some(*p);
            }
        }
        self.nodes.get(&dir)?.base.as_ref().map(|b| b.parent)
    }

    pub(super) fn expect_dir(&mut self, tx: &mut Tx, o: ObjId) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::Dir => Ok(()),
            _ => Err(Error::posix("lookup", format!("{o} is not a directory"), libc::ENOTDIR)),
        }
    }

    /// [`State::expect_dir`] for a directory something is made in: not one
    /// removed in `tx`'s view (ENOENT, as Linux answers in a dead
    /// directory). Reached through a descriptor or a working directory that
    /// outlived its removal; the kernel no longer stops that itself, since
    /// a transaction removes a private inode, not the one others hold. A
    /// name made there could never be checkpointed.
    ///
    /// The directory's metadata is read first (the callers read it anyway):
    /// a removal committed after `tx` began is a conflict, not ENOENT —
    /// link counts show current values ([`State::attr_unrecorded`]), not
    /// the snapshot's, so only a removal `tx` may see answers ENOENT.
    pub(super) fn expect_live_dir(&mut self, tx: &mut Tx, o: ObjId) -> Result<()> {
        self.expect_dir(tx, o)?;
        self.read_meta(tx, o)?;
        if self.attr_unrecorded(Some(tx), o)?.nlink == 0 {
            return Err(Error::posix("create", format!("{o} was removed"), libc::ENOENT));
        }
        Ok(())
    }

    /// Refuses setting `name` to `value` on `o` if the backing could not
    /// hold the object's resulting attributes (issue 23: a namespace it does
    /// not know, a value or a set too big for it), with the errno the
    /// backing gives: accepted, such a change would fail the checkpoint and
    /// leave the engine unable to ever apply its journal. The resulting set
    /// is the base's attributes under every delta (`tx`'s included) and
    /// this change; [`Storage::probe_xattrs`] tries it on a scratch object
    /// of the same kind. The caller has recorded its read of `o`'s
    /// metadata, so two transactions that each fill an object conflict.
    pub(super) fn probe_xattrs(&self, tx: &Tx, o: ObjId, kind: FileKind, name: &OsStr, value: &[u8]) -> Result<()> {
        let mut set: BTreeMap<OsString, (Vec<u8>, bool)> = BTreeMap::new();
        if !self.is_created(tx, o) {
            let p = self.base_path(o).ok_or(Error::Stale(o))?;
            for n in self.storage.list_xattrs(&p).ctx("listxattr", || p.display().to_string())? {
                if let Some(v) = self.storage.get_xattr(&p, &n).ctx("getxattr", || p.display().to_string())? {
                    set.insert(n, (v, false));
                }
            }
        }
        for d in [self.frozen.as_ref(), Some(&self.committed), Some(&tx.delta)].into_iter().flatten() {
            for (k, v) in d.objs.get(&o).map(|od| &od.attr.xattrs).into_iter().flatten() {
                match v {
                    Some(v) => set.insert(k.clone(), (v.clone(), true)),
                    None => set.remove(k),
                };
            }
        }
        set.insert(name.to_owned(), (value.to_vec(), true));
        let list: Vec<_> = set.into_iter().map(|(k, (v, w))| (k, v, w)).collect();
        let scratch = Path::new(META_DIR).join("probe");
        self.storage
            .probe_xattrs(&scratch, kind, &list)
            .map_err(|e| Error::io("setxattr", format!("{name:?} on {o}"), e))
    }

    /// An extended attribute as `tx` sees it; records the read.
    pub(super) fn xattr(&mut self, tx: &mut Tx, o: ObjId, name: &OsStr) -> Result<Option<Vec<u8>>> {
        self.kind_in(Some(tx), o)?;
        self.read_meta(tx, o)?;
        for d in [Some(&tx.delta), Some(&self.committed), self.frozen.as_ref()].into_iter().flatten() {
            if let Some(v) = d.objs.get(&o).and_then(|od| od.attr.xattrs.get(name)) {
                return Ok(v.clone());
            }
        }
        if self.is_created(tx, o) {
            return Ok(None);
        }
        let p = self.base_path(o).ok_or(Error::Stale(o))?;
        self.storage.get_xattr(&p, name).ctx("getxattr", || p.display().to_string())
    }
}

fn apply_attr(a: &mut Attr, d: &AttrDelta) {
    if let Some(m) = d.mode {
        a.mode = m;
    }
    if let Some(u) = d.uid {
        a.uid = u;
    }
    if let Some(g) = d.gid {
        a.gid = g;
    }
    if let Some(t) = d.atime {
        a.atime = t;
    }
    if let Some(t) = d.mtime {
        a.mtime = t;
    }
    if let Some(t) = d.ctime {
        a.ctime = t;
    }
    a.nlink = (a.nlink as i64 + d.nlink).max(0) as u64;
}

impl Engine {
    /// Reads up to `len` bytes at `off` (fewer at end of file).
    ///
    /// A file no layer changes is read from its backing file without the
    /// engine lock, so a cold read waits for the disk alone rather than
    /// holding up every other request. What the
    /// path names can change meanwhile only under the lock and only with
    /// `tree_gen` bumped, and a commit that changes the file gives it a
    /// layer: if either happened, the read is done again under the lock.
    pub fn read(&self, tx: Option<TxId>, o: ObjId, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off.saturating_add(len as u64);
        let file = |st: &State, t: &Tx| match st.kind_in(Some(t), o)? {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(Error::posix("read", o.to_string(), libc::EISDIR)),
            _ => Err(Error::posix("read", o.to_string(), libc::EINVAL)),
        };
        // Checks the kind and the pages' stamps (I2) each time: a retry may
        // come after a checkpoint removed the file (ESTALE, never an empty
        // read) or a commit changed the pages since the transaction began.
        let locked = |st: &mut State, t: &mut Tx| {
            file(st, t)?;
            st.read_pages(t, o, off, end)?;
            let out = st.read_content(Some(t), o, off, len)?;
            if out.len() < len {
                // A short read depends on the size.
                st.read_meta(t, o)?;
            }
            Ok(out)
        };
        enum First {
            Read(Vec<u8>),
            /// Read the backing file at this path without the lock.
            Unlocked(PathBuf, u64, Arc<dyn Storage>),
        }
        let first = self.run(tx, |st, t| {
            if st.bare(Some(t), o) {
                file(st, t)?;
                if let Some(path) = st.base_file(o)? {
                    st.read_pages(t, o, off, end)?;
                    return Ok(First::Unlocked(path, st.tree_gen, st.storage.clone()));
                }
            }
            locked(st, t).map(First::Read)
        })?;
        let (path, gen, storage) = match first {
            First::Read(out) => return Ok(out),
            First::Unlocked(path, gen, storage) => (path, gen, storage),
        };
        let mut buf = vec![0u8; len];
        // `read_at` is short only at the end of the file.
        let got = storage.read_at(&path, off, &mut buf);
        self.run(tx, |st, t| match got {
            Ok(n) if st.tree_gen == gen && st.bare(Some(t), o) => {
                buf.truncate(n);
                if n < len {
                    st.read_meta(t, o)?;
                }
                Ok(std::mem::take(&mut buf))
            }
            // Raced (a commit or a checkpoint changed the file or its
            // path), or failed: the locked read decides and reports — a
            // transaction that began before such a commit conflicts (I2).
            _ => locked(st, t),
        })
    }
}
