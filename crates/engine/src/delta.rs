//! Deltas: what a transaction (or the committed-but-not-checkpointed past)
//! changes on top of the state below it.
//!
//! A [`Delta`] is the engine's one representation of change. A live
//! transaction owns one (its private state); the engine owns one more for
//! everything committed since the last checkpoint. Reading an object means
//! starting from the backing file and laying the committed delta, then the
//! transaction's delta, on top. Committing means composing a transaction's
//! delta into the committed one ([`Delta::compose`]); a checkpoint writes
//! the committed delta into the backing tree and empties it.
//!
//! ## File contents: cut, extents, size
//! A [`FileDelta`] describes the final content of a file *as a function of
//! the content below it* (`B`, of size `b`), without having read `B`:
//!
//! ```text
//!   byte i of the result =  extent data          if an extent covers i
//!                           B[i]                 else if i < min(b, cut)
//!                           0                    otherwise
//!   size of the result   =  s                    if size = Exactly(s)
//!                           max(min(b, cut), s)  if size = AtLeast(s)
//! ```
//!
//! `truncate(t)` lowers `cut` to `t`, clips extents at `t` and sets
//! `Exactly(t)`; `write(off, data)` adds an extent and raises the size
//! bound; `extend(e)` raises the size bound alone (fallocate(2) mode 0:
//! the bytes it adds are zeros, with no extent). None needs `b`, so blind
//! writes stay blind: two transactions writing different pages of one
//! file do not read each other's size.
//! Composition keeps the same shape (proof in the comments of
//! [`FileDelta::compose`]), and applying a delta twice gives the same
//! result as applying it once — the property checkpoint replay relies on.

use crate::ids::{DataFileId, Epoch, ObjId};
use crate::storage::{FileKind, Timestamp};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::sync::Arc;

/// No cut: the content below survives up to its own size.
///
/// NB: a value, not `Option<u64>`. A cut is an upper bound on the bytes
/// that survive from below, and cuts compose by `min` (see
/// [`FileDelta::compose`]); "no cut" is the bound that keeps everything,
/// the identity of `min`, so every formula above holds for it unchanged.
/// An `Option` would need its own `min` at each of those places (`None` sorts
/// first). Journal records and checkpoint plans store it as this value.
pub const NO_CUT: u64 = u64::MAX;

/// Where the bytes of an extent live.
#[derive(Clone, Debug)]
pub enum DataLoc {
    /// In memory: `buf[start..]`.
    Mem(Arc<Vec<u8>>, usize),
    /// In a data file `.txfs/data/<id>` (a transaction's spill file, or a
    /// new file's staged content), at a byte offset. Committed records name
    /// data files instead of carrying those bytes (selective data
    /// journaling, DESIGN §2).
    File(DataFileId, u64),
    /// In the journal of an epoch, at a byte offset.
    Journal(Epoch, u64),
}

impl DataLoc {
    /// The location `k` bytes further on.
    pub fn advance(&self, k: u64) -> DataLoc {
        match self {
            DataLoc::Mem(b, s) => DataLoc::Mem(b.clone(), s + k as usize),
            DataLoc::File(f, o) => DataLoc::File(*f, o + k),
            DataLoc::Journal(e, o) => DataLoc::Journal(*e, o + k),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Extent {
    pub len: u64,
    pub loc: DataLoc,
}

/// Non-overlapping extents keyed by file offset.
#[derive(Clone, Debug, Default)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// How many extents.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Extent)> {
        self.map.iter().map(|(o, e)| (*o, e))
    }

    /// Removes the bytes `[start, end)` from the map, splitting extents.
    fn punch(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // The extent that begins before `start` and reaches into the range.
        if let Some((&o, e)) = self.map.range(..start).next_back() {
            if o + e.len > start {
                let e = e.clone();
                let head = start - o;
                self.map.insert(o, Extent { len: head, loc: e.loc.clone() });
                if o + e.len > end {
                    let skip = end - o;
                    self.map.insert(end, Extent { len: e.len - skip, loc: e.loc.advance(skip) });
                }
            }
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(o, _)| *o).collect();
        for o in inside {
            let e = self.map.remove(&o).expect("key just listed");
            if o + e.len > end {
                let skip = end - o;
                self.map.insert(end, Extent { len: e.len - skip, loc: e.loc.advance(skip) });
            }
        }
    }

    pub fn insert(&mut self, off: u64, len: u64, loc: DataLoc) {
        if len == 0 {
            return;
        }
        self.punch(off, off + len);
        self.map.insert(off, Extent { len, loc });
    }

    /// Moves every extent whose bytes are not in a data file to the next
    /// bytes of a run starting at `at` in the journal of `epoch`, in offset
    /// order (as [`encode`](crate) laid them out); returns where the run
    /// ends. One pass, no splitting: a commit of a million extents points
    /// them at its record in linear time.
    pub fn to_journal(&mut self, epoch: Epoch, mut at: u64) -> u64 {
        for e in self.map.values_mut() {
            if !matches!(e.loc, DataLoc::File(..)) {
                e.loc = DataLoc::Journal(epoch, at);
                at += e.len;
            }
        }
        at
    }

    /// Drops every byte at or beyond `at`.
    pub fn clip(&mut self, at: u64) {
        self.punch(at, u64::MAX);
    }

    /// The pieces of extents that intersect `[start, end)`, clipped to it.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<(u64, u64, DataLoc)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        if let Some((&o, e)) = self.map.range(..start).next_back() {
            if o + e.len > start {
                let s = start;
                let t = (o + e.len).min(end);
                out.push((s, t - s, e.loc.advance(s - o)));
            }
        }
        for (&o, e) in self.map.range(start..end) {
            let t = (o + e.len).min(end);
            out.push((o, t - o, e.loc.clone()));
        }
        out
    }

    /// True if every byte of `[start, end)` is covered. Stops at the first
    /// gap: a map of a million extents with gaps answers at once.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        let mut at = start;
        if let Some((&o, e)) = self.map.range(..start).next_back() {
            if o + e.len > start {
                at = o + e.len;
            }
        }
        for (&o, e) in self.map.range(at..) {
            if at >= end {
                break;
            }
            if o != at {
                return false;
            }
            at = o + e.len;
        }
        at >= end
    }

    /// The end of the last extent (0 if empty).
    pub fn end(&self) -> u64 {
        self.map.iter().next_back().map(|(o, e)| o + e.len).unwrap_or(0)
    }

    pub fn total_len(&self) -> u64 {
        self.map.values().map(|e| e.len).sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeDelta {
    /// The size is `max(min(b, cut), s)`.
    AtLeast(u64),
    /// The size is exactly this.
    Exactly(u64),
}

/// Change to a regular file's content (see the module docs).
#[derive(Clone, Debug)]
pub struct FileDelta {
    pub cut: u64,
    pub size: SizeDelta,
    pub ext: ExtentMap,
}

impl Default for FileDelta {
    fn default() -> Self {
        FileDelta { cut: NO_CUT, size: SizeDelta::AtLeast(0), ext: ExtentMap::default() }
    }
}

impl FileDelta {
    /// A file created empty: nothing of the (non-existent) content below.
    pub fn empty_new() -> FileDelta {
        FileDelta { cut: 0, size: SizeDelta::Exactly(0), ext: ExtentMap::default() }
    }

    /// A new file whose whole content is a staged data file of `size`
    /// bytes, byte for byte (holes read as the file's own zeros).
    pub fn staged(file: DataFileId, size: u64) -> FileDelta {
        let mut ext = ExtentMap::default();
        ext.insert(0, size, DataLoc::File(file, 0));
        FileDelta { cut: 0, size: SizeDelta::Exactly(size), ext }
    }

    /// The data file whose bytes, at their own offsets, are all of this
    /// delta's extents, contiguous from offset 0 (a shadow: DESIGN §2a),
    /// and where those extents end. `None` if any byte below that end comes
    /// from elsewhere or from another offset.
    pub fn shadow_file(&self) -> Option<(DataFileId, u64)> {
        let mut file = None;
        let mut at = 0;
        for (off, e) in self.ext.iter() {
            match e.loc {
                DataLoc::File(f, foff) if off == at && foff == off && file.is_none_or(|g| g == f) => file = Some(f),
                _ => return None,
            }
            at = off + e.len;
        }
        file.map(|f| (f, at))
    }

    pub fn size_after(&self, lower: u64) -> u64 {
        match self.size {
            SizeDelta::Exactly(s) => s,
            SizeDelta::AtLeast(s) => lower.min(self.cut).max(s),
        }
    }

    /// True if the result does not depend on the size of what is below.
    pub fn size_is_blind(&self) -> bool {
        matches!(self.size, SizeDelta::Exactly(_))
    }

    pub fn write(&mut self, off: u64, len: u64, loc: DataLoc) {
        self.ext.insert(off, len, loc);
        let end = off + len;
        self.size = match self.size {
            SizeDelta::AtLeast(s) => SizeDelta::AtLeast(s.max(end)),
            SizeDelta::Exactly(s) => SizeDelta::Exactly(s.max(end)),
        };
    }

    /// Raises the size to at least `end` without reading it and without
    /// bytes (fallocate(2) mode 0): whatever the size below turns out to
    /// be, the bytes between it and `end` read as zeros (module docs: no
    /// extent covers them, and they lie past `min(b, cut)`). A smaller
    /// file grows; a bigger one keeps its size and bytes.
    pub fn extend(&mut self, end: u64) {
        self.size = match self.size {
            SizeDelta::AtLeast(s) => SizeDelta::AtLeast(s.max(end)),
            SizeDelta::Exactly(s) => SizeDelta::Exactly(s.max(end)),
        };
    }

    pub fn truncate(&mut self, t: u64) {
        self.cut = self.cut.min(t);
        self.ext.clip(t);
        self.size = SizeDelta::Exactly(t);
    }

    /// `self` then `top`, as one delta.
    ///
    /// With `c' = min(cut, top.cut)`: a byte not covered by `top` and below
    /// `top.cut` comes from `self`, i.e. from `self`'s extents (kept unless
    /// clipped by `top.cut`) or from `B` below `min(b, cut)`; so the result
    /// is `B` below `min(b, c')` under the union of extents. For the size,
    /// `max(min(max(min(b, cut), s), top.cut), t)` expands to
    /// `max(min(b, c'), max(min(s, top.cut), t))`.
    pub fn compose(&mut self, top: &FileDelta) {
        if top.cut != NO_CUT {
            self.ext.clip(top.cut);
        }
        for (o, e) in top.ext.iter() {
            self.ext.insert(o, e.len, e.loc.clone());
        }
        self.size = match (self.size, top.size) {
            (_, SizeDelta::Exactly(t)) => SizeDelta::Exactly(t),
            (SizeDelta::Exactly(s), SizeDelta::AtLeast(t)) => SizeDelta::Exactly(s.min(top.cut).max(t)),
            (SizeDelta::AtLeast(s), SizeDelta::AtLeast(t)) => SizeDelta::AtLeast(s.min(top.cut).max(t)),
        };
        self.cut = self.cut.min(top.cut);
    }

    /// [`FileDelta::compose`], taking `top`'s extents instead of copying
    /// them: when none of ours survives `top`'s cut, or all of ours lie
    /// below its first extent (a commit's extents over an older commit's,
    /// the common case), the maps are joined without a lookup per extent —
    /// a commit of a million extents held the engine lock 0.3 s inserting
    /// them one by one. A small `top` is inserted extent by extent.
    pub fn compose_owned(&mut self, top: FileDelta) {
        if top.cut != NO_CUT {
            self.ext.clip(top.cut);
        }
        let mut ext = top.ext;
        let below = match ext.map.keys().next() {
            None => true,
            Some(&first) => self.ext.end() <= first,
        };
        if self.ext.is_empty() {
            std::mem::swap(&mut self.ext, &mut ext);
        } else if below && ext.len() >= self.ext.len() / 16 {
            // `append` rebuilds the tree (linear in both): only when `top`
            // is not much smaller, or a stream of one-extent commits over
            // a big committed map would cost a copy each.
            self.ext.map.append(&mut ext.map);
        } else {
            for (o, e) in ext.map {
                self.ext.insert(o, e.len, e.loc);
            }
        }
        self.size = match (self.size, top.size) {
            (_, SizeDelta::Exactly(t)) => SizeDelta::Exactly(t),
            (SizeDelta::Exactly(s), SizeDelta::AtLeast(t)) => SizeDelta::Exactly(s.min(top.cut).max(t)),
            (SizeDelta::AtLeast(s), SizeDelta::AtLeast(t)) => SizeDelta::AtLeast(s.min(top.cut).max(t)),
        };
        self.cut = self.cut.min(top.cut);
    }

    /// Lays this delta over `buf`, which holds bytes `[off, off+len)` of the
    /// content below (of size `lower`). Returns the new size. `fetch` reads
    /// extent data.
    pub fn overlay(
        &self,
        lower: u64,
        off: u64,
        buf: &mut [u8],
        fetch: &mut dyn FnMut(&DataLoc, &mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<u64> {
        let end = off + buf.len() as u64;
        let keep = lower.min(self.cut);
        if keep < end {
            let from = keep.max(off);
            buf[(from - off) as usize..].fill(0);
        }
        for (o, l, loc) in self.ext.pieces(off, end) {
            let s = (o - off) as usize;
            fetch(&loc, &mut buf[s..s + l as usize])?;
        }
        Ok(self.size_after(lower))
    }
}

/// Attribute changes; `None` leaves the value below.
#[derive(Clone, Debug, Default)]
pub struct AttrDelta {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
    /// Added to the link count below.
    pub nlink: i64,
    /// `Some(v)` sets, `None` removes.
    pub xattrs: BTreeMap<OsString, Option<Vec<u8>>>,
}

impl AttrDelta {
    pub fn compose(&mut self, top: &AttrDelta) {
        macro_rules! take {
            ($($f:ident),*) => { $( if top.$f.is_some() { self.$f = top.$f; } )* };
        }
        take!(mode, uid, gid, atime, mtime, ctime);
        self.nlink += top.nlink;
        for (k, v) in &top.xattrs {
            self.xattrs.insert(k.clone(), v.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
            && self.ctime.is_none()
            && self.nlink == 0
            && self.xattrs.is_empty()
    }
}

#[derive(Clone, Debug, Default)]
pub struct ObjDelta {
    pub file: Option<FileDelta>,
    pub attr: AttrDelta,
}

/// An object that did not exist below this delta.
#[derive(Clone, Debug)]
pub struct NewObj {
    pub kind: FileKind,
    /// Symlink target.
    pub target: Option<OsString>,
    /// A device's number (`st_rdev`); 0 for every other kind.
    pub rdev: u64,
}

/// Directory entry changes: `Some(obj)` links `obj` under the name, `None`
/// removes the name.
pub type DirDelta = BTreeMap<OsString, Option<ObjId>>;

#[derive(Clone, Debug, Default)]
pub struct Delta {
    pub objs: HashMap<ObjId, ObjDelta>,
    pub dirs: HashMap<ObjId, DirDelta>,
    pub created: HashMap<ObjId, NewObj>,
    /// New parent of each directory this delta created or moved.
    pub parents: HashMap<ObjId, ObjId>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty() && self.dirs.is_empty() && self.created.is_empty() && self.parents.is_empty()
    }

    pub fn obj(&mut self, o: ObjId) -> &mut ObjDelta {
        self.objs.entry(o).or_default()
    }

    /// The entry change for `name` in `dir`, if this delta has one.
    pub fn entry(&self, dir: ObjId, name: &std::ffi::OsStr) -> Option<Option<ObjId>> {
        self.dirs.get(&dir).and_then(|d| d.get(name)).copied()
    }

    /// [`Delta::compose`], taking `top` apart instead of copying it (its
    /// files' extents: [`FileDelta::compose_owned`]).
    pub fn compose_owned(&mut self, top: Delta) {
        self.created.extend(top.created);
        self.parents.extend(top.parents);
        for (d, entries) in top.dirs {
            self.dirs.entry(d).or_default().extend(entries);
        }
        for (o, od) in top.objs {
            let mine = self.objs.entry(o).or_default();
            mine.attr.compose(&od.attr);
            if let Some(f) = od.file {
                match &mut mine.file {
                    Some(m) => m.compose_owned(f),
                    None => mine.file = Some(f),
                }
            }
        }
    }

    /// `self` then `top`, as one delta.
    pub fn compose(&mut self, top: &Delta) {
        for (o, n) in &top.created {
            self.created.insert(*o, n.clone());
        }
        for (d, p) in &top.parents {
            self.parents.insert(*d, *p);
        }
        for (d, entries) in &top.dirs {
            let mine = self.dirs.entry(*d).or_default();
            for (n, e) in entries {
                mine.insert(n.clone(), *e);
            }
        }
        for (o, od) in &top.objs {
            let mine = self.objs.entry(*o).or_default();
            mine.attr.compose(&od.attr);
            if let Some(f) = &od.file {
                match &mut mine.file {
                    Some(m) => m.compose(f),
                    None => mine.file = Some(f.clone()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mem(data: &[u8]) -> DataLoc {
        DataLoc::Mem(Arc::new(data.to_vec()), 0)
    }

    fn fetch(loc: &DataLoc, out: &mut [u8]) -> std::io::Result<()> {
        match loc {
            DataLoc::Mem(b, s) => {
                out.copy_from_slice(&b[*s..*s + out.len()]);
                Ok(())
            }
            _ => unreachable!("tests use memory extents"),
        }
    }

    fn apply(fd: &FileDelta, below: &[u8]) -> Vec<u8> {
        let size = fd.size_after(below.len() as u64) as usize;
        let mut buf = vec![0u8; size];
        let n = below.len().min(size);
        buf[..n].copy_from_slice(&below[..n]);
        fd.overlay(below.len() as u64, 0, &mut buf, &mut fetch).unwrap();
        buf
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write(u64, Vec<u8>),
        Truncate(u64),
        Extend(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..64, proptest::collection::vec(any::<u8>(), 1..24)).prop_map(|(o, d)| Op::Write(o, d)),
            (0u64..80).prop_map(Op::Truncate),
            (0u64..90).prop_map(Op::Extend),
        ]
    }

    fn run(ops: &[Op], fd: &mut FileDelta, model: &mut Vec<u8>) {
        for op in ops {
            match op {
                Op::Write(o, d) => {
                    let end = *o as usize + d.len();
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[*o as usize..end].copy_from_slice(d);
                    fd.write(*o, d.len() as u64, mem(d));
                }
                Op::Truncate(t) => {
                    model.resize(*t as usize, 0);
                    fd.truncate(*t);
                }
                Op::Extend(e) => {
                    if model.len() < *e as usize {
                        model.resize(*e as usize, 0);
                    }
                    fd.extend(*e);
                }
            }
        }
    }

    proptest! {
        /// A delta built from writes, truncates and extensions, laid over any content,
        /// gives what applying the same operations to that content gives.
        #[test]
        fn file_delta_matches_model(below in proptest::collection::vec(any::<u8>(), 0..70),
                                    ops in proptest::collection::vec(op(), 0..12)) {
            let mut fd = FileDelta::default();
            let mut model = below.clone();
            run(&ops, &mut fd, &mut model);
            prop_assert_eq!(apply(&fd, &below), model);
        }

        /// compose(a, b) over content == b over (a over content); and
        /// applying a delta twice == once (idempotent replay).
        #[test]
        fn compose_and_idempotence(below in proptest::collection::vec(any::<u8>(), 0..70),
                                   a in proptest::collection::vec(op(), 0..8),
                                   b in proptest::collection::vec(op(), 0..8)) {
            let (mut da, mut db) = (FileDelta::default(), FileDelta::default());
            let mut model = below.clone();
            run(&a, &mut da, &mut model);
            run(&b, &mut db, &mut model);
            let mut ab = da.clone();
            ab.compose(&db);
            prop_assert_eq!(apply(&ab, &below), model.clone());
            prop_assert_eq!(apply(&ab, &apply(&ab, &below)), model.clone());
            // Taking `b` apart composes the same.
            let mut owned = da.clone();
            owned.compose_owned(db.clone());
            prop_assert_eq!(apply(&owned, &below), model);
        }
    }

    proptest! {
        /// `covers` says what a byte map says: every byte of the range is
        /// in some extent.
        #[test]
        fn covers_matches_a_byte_map(writes in proptest::collection::vec((0u64..64, 1u64..12), 0..10),
                                     start in 0u64..80, len in 0u64..40) {
            let mut m = ExtentMap::default();
            let mut bytes = [false; 128];
            for (o, l) in writes {
                m.insert(o, l, mem(&vec![1u8; l as usize]));
                bytes[o as usize..(o + l) as usize].fill(true);
            }
            let want = bytes[start as usize..(start + len) as usize].iter().all(|b| *b);
            prop_assert_eq!(m.covers(start, start + len), want);
        }
    }

    #[test]
    fn punch_splits_extents() {
        let mut m = ExtentMap::default();
        m.insert(0, 10, mem(b"0123456789"));
        m.insert(3, 2, mem(b"ab"));
        let got: Vec<_> = m.pieces(0, 10).into_iter().map(|(o, l, _)| (o, l)).collect();
        assert_eq!(got, vec![(0, 3), (3, 2), (5, 5)]);
        assert!(m.covers(0, 10));
        assert!(!m.covers(0, 11));
        m.clip(4);
        assert_eq!(m.end(), 4);
    }
}
