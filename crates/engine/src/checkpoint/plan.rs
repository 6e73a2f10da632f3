//! The checkpoint plan: what a checkpoint will do to the backing tree,
//! computed from the committed delta and persisted before any of it runs.
//!
//! [`build`] turns the committed delta into a [`Plan`] of the four phases
//! (see `checkpoint/mod.rs`) and the node-table updates the engine makes
//! once the plan's namespace phases ran ([`NodeUpdates`]). Paths in a plan
//! are bytes relative to the backing root. [`persist`] writes it to
//! `.txfs/ckpt-<epoch>.plan` (checksummed, synced, renamed into place)
//! before phase 1, so the tree changes only by executing a persisted plan
//! (J1) and recovery finishes an interrupted one from its file (J5);
//! [`load`] reads it back. The plan's bytes are an on-disk format.
//!
//! Tests: `tests/crash.rs` (`crash_during_recovery_is_recovered_again`,
//! `checkpoint_of_a_file_linked_elsewhere_killed_at_every_step`),
//! `tests/shadow.rs` (`a_replacing_checkpoint_killed_at_every_step`).

use super::paths::{PathRef, Paths};
use crate::codec::{fields, Codec, DecodeError, Reader};
use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, Epoch, ObjId, Seq};
use crate::log::files::{data_path, META_DIR, SPARES_MAX};
use crate::log::journal;
use crate::storage::{FileKind, Storage, Timestamp};
use crate::txn::state::{BaseLoc, NodeUpdates, State, ORPHANS_OBJ};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A plan's steps name paths as `P`: a [`PathRef`] into the plan's
/// [`Paths`] (today's plans), or the whole path's bytes (the first
/// format, which recovery still reads: [`decode_plan`]).
#[derive(Clone, Debug)]
pub enum MoveOut<P = PathRef> {
    Stage { from: P, stage: P },
    Unlink { from: P },
}

#[derive(Clone, Debug)]
pub enum Place<P = PathRef> {
    Rename {
        stage: P,
        to: P,
    },
    File {
        to: P,
    },
    Dir {
        to: P,
    },
    Symlink {
        to: P,
        target: Vec<u8>,
    },
    Link {
        existing: P,
        to: P,
    },
    /// An existing file whose committed content is all of a data file (its
    /// shadow, which [`build`] gave the file's owner, mode, xattrs and
    /// times): the data file, cut to `size`, synced and renamed over it.
    /// With `keep`, the old inode is linked there first and stays as a
    /// spare data file.
    Replace {
        data: P,
        to: P,
        size: u64,
        keep: Option<P>,
    },
    /// A new fifo, socket or device ([`FileKind::is_special`]), made with
    /// `mknod` (mode 0600 until phase 3 sets the object's own); `rdev` is
    /// a device's number, 0 for the others.
    Special {
        to: P,
        kind: FileKind,
        rdev: u64,
    },
}

#[derive(Clone, Debug)]
pub struct DataOp<P = PathRef> {
    pub path: P,
    pub cut: u64,
    pub size: u64,
    /// (file offset, length, offset in the epoch's journal)
    pub extents: Vec<(u64, u64, u64)>,
    /// (file offset, length, data file, offset in it)
    pub files: Vec<(u64, u64, u64, u64)>,
}

#[derive(Clone, Debug)]
pub struct AttrOp<P = PathRef> {
    pub path: P,
    pub is_symlink: bool,
    pub mode: Option<u32>,
    pub owner: Option<(Option<u32>, Option<u32>)>,
    pub times: Option<(Option<Timestamp>, Option<Timestamp>)>,
    pub xattrs: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub epoch: Epoch,
    /// Seq of the last commit the plan covers (header of the next journal).
    pub last_seq: Seq,
    /// Every path the steps name.
    pub paths: Paths,
    pub out: Vec<MoveOut>,
    pub place: Vec<Place>,
    pub data: Vec<DataOp>,
    pub attrs: Vec<AttrOp>,
    pub dead: Vec<PathRef>,
}

impl Plan {
    /// A path of the plan, made for one storage call.
    pub fn path(&self, r: PathRef) -> PathBuf {
        self.paths.path(r)
    }
}

pub fn plan_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join(format!("ckpt-{:016x}.plan", e.0))
}

pub(super) fn marker_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join(format!("ckpt-{:016x}.p1", e.0))
}

fn stage_path(o: ObjId) -> PathBuf {
    Path::new(META_DIR).join("stage").join(format!("o{}", o.0))
}

fn orphan_name(o: ObjId) -> OsString {
    OsString::from(format!("{}", o.0))
}

/// Where objects are in the backing tree now (`base`) and after the plan
/// (`final`), as entries of the plan's paths: each object's path is found
/// once, from its parent's (a walk per object made a deep tree cost the
/// square of its depth).
struct Namer<'a> {
    final_locs: &'a HashMap<ObjId, Vec<(ObjId, OsString)>>,
    keep_at: &'a HashMap<ObjId, BaseLoc>,
    moved_out: &'a HashSet<ObjId>,
    created: &'a HashMap<ObjId, crate::delta::NewObj>,
    paths: Paths,
    finals: HashMap<ObjId, Option<PathRef>>,
    bases: HashMap<ObjId, Option<PathRef>>,
}

impl Namer<'_> {
    /// The path of a live object after the plan: its first new name,
    /// else its unchanged base name. `None`: it ends up nowhere.
    fn final_of(&mut self, st: &State, o: ObjId) -> Option<PathRef> {
        let step = |cur: ObjId| -> Option<(ObjId, OsString)> {
            match self.final_locs.get(&cur).and_then(|v| v.first()) {
                Some((pp, n)) => Some((*pp, n.clone())),
                None => match self.keep_at.get(&cur) {
                    Some(l) => Some((l.parent, l.name.clone())),
                    None if self.moved_out.contains(&cur) || self.created.contains_key(&cur) => None,
                    None => st.node(cur)?.base.clone().map(|b| (b.parent, b.name)),
                },
            }
        };
        let mut chain = Vec::new();
        let top = walk(o, &self.finals, step, &mut chain);
        Self::fill(&mut self.paths, &mut self.finals, top, chain)
    }

    /// The path of an object in the backing tree (J1: unchanged between
    /// checkpoints), as `State::base_path`.
    fn base_of(&mut self, st: &State, o: ObjId) -> Option<PathRef> {
        let step = |cur: ObjId| st.node(cur)?.base.clone().map(|b| (b.parent, b.name));
        let mut chain = Vec::new();
        let top = walk(o, &self.bases, step, &mut chain);
        Self::fill(&mut self.paths, &mut self.bases, top, chain)
    }

    /// Names the objects of `chain` (innermost first) from `top`, the
    /// path of the outermost one's parent.
    fn fill(
        paths: &mut Paths,
        known: &mut HashMap<ObjId, Option<PathRef>>,
        top: Option<PathRef>,
        chain: Vec<(ObjId, OsString)>,
    ) -> Option<PathRef> {
        let mut r = top;
        for (obj, name) in chain.into_iter().rev() {
            r = r.map(|pr| paths.join(pr, name.as_bytes()));
            known.insert(obj, r);
        }
        r
    }

    fn join(&mut self, dir: PathRef, name: &OsStr) -> PathRef {
        self.paths.join(dir, name.as_bytes())
    }

    /// A path of the metadata directory (a stage, data file or orphan).
    fn meta(&mut self, path: &Path) -> PathRef {
        self.paths.intern(path).expect("metadata paths are relative")
    }
}

/// Walks up from `o` through `step` (an object's parent and name) until
/// the root or an object already in `known`, pushing the objects passed on
/// `chain`; returns the path where the walk stopped. A cycle, or an object
/// `step` does not place, ends it with `None`.
fn walk(
    o: ObjId,
    known: &HashMap<ObjId, Option<PathRef>>,
    step: impl Fn(ObjId) -> Option<(ObjId, OsString)>,
    chain: &mut Vec<(ObjId, OsString)>,
) -> Option<PathRef> {
    let mut seen = HashSet::new();
    let mut cur = o;
    loop {
        if cur == ObjId::ROOT {
            return Some(PathRef::ROOT);
        }
        if let Some(r) = known.get(&cur) {
            return *r;
        }
        // Only a cycle ends the walk unfinished: trees may be deeper than
        // PATH_MAX (4096 levels here made a deeper tree's checkpoint fail).
        if !seen.insert(cur) {
            return None;
        }
        let (parent, name) = step(cur)?;
        chain.push((cur, name));
        cur = parent;
    }
}

/// Computes the plan for the committed delta.
pub(super) fn build(st: &mut State) -> Result<(Plan, NodeUpdates)> {
    let d = st.committed().clone();
    // 1. Which entries change, and what the backing tree holds there.
    let mut changes: Vec<(ObjId, OsString, Option<ObjId>, Option<ObjId>)> = Vec::new();
    let mut dirs: Vec<_> = d.dirs.iter().collect();
    dirs.sort_by_key(|(o, _)| **o);
    for (dir, entries) in dirs {
        for (name, now) in entries {
            let before = if d.created.contains_key(dir) { None } else { st.base_child(*dir, name)? };
            if before != *now {
                changes.push((*dir, name.clone(), before, *now));
            }
        }
    }
    // Final names of objects that gain entries.
    let mut final_locs: HashMap<ObjId, Vec<(ObjId, OsString)>> = HashMap::new();
    let mut moved_out: HashSet<ObjId> = HashSet::new();
    for (dir, name, before, now) in &changes {
        if let Some(o) = now {
            final_locs.entry(*o).or_default().push((*dir, name.clone()));
        }
        if let Some(b) = before {
            moved_out.insert(*b);
        }
    }
    for v in final_locs.values_mut() {
        v.sort();
    }
    // Base names that change, and objects that lose a name but keep
    // another known one (a hard link a lookup met): they stay there.
    let changed_locs: HashSet<(ObjId, OsString)> =
        changes.iter().filter(|c| c.2.is_some()).map(|c| (c.0, c.1.clone())).collect();
    let mut keep_at: HashMap<ObjId, BaseLoc> = HashMap::new();
    for b in &moved_out {
        if final_locs.contains_key(b) {
            continue;
        }
        if let Some(n) = st.node(*b) {
            let remaining = n
                .base
                .iter()
                .chain(n.alts.iter())
                .find(|l| !changed_locs.contains(&(l.parent, l.name.clone())))
                .cloned();
            if let Some(loc) = remaining {
                keep_at.insert(*b, loc);
            }
        }
    }
    let mut names = Namer {
        final_locs: &final_locs,
        keep_at: &keep_at,
        moved_out: &moved_out,
        created: &d.created,
        paths: Paths::default(),
        finals: HashMap::new(),
        bases: HashMap::new(),
    };
    let mut plan = Plan {
        epoch: st.journal().epoch,
        last_seq: st.seq(),
        paths: Paths::default(),
        out: Vec::new(),
        place: Vec::new(),
        data: Vec::new(),
        attrs: Vec::new(),
        dead: Vec::new(),
    };
    let mut upd = NodeUpdates {
        moved: Vec::new(),
        gone: Vec::new(),
        new_inos: Vec::new(),
        in_place: Vec::new(),
        replaced: Vec::new(),
        spares: Vec::new(),
        changed_locs: HashSet::new(),
    };
    for (o, loc) in &keep_at {
        upd.moved.push((*o, loc.clone()));
    }
    // Objects that end up nowhere in the tree but must survive: open
    // objects (orphans) and files still linked under names we never saw.
    let mut orphan: Vec<ObjId> = Vec::new();
    // Phase 1.
    let mut staged: HashSet<ObjId> = HashSet::new();
    // Contents of these are written through their stage link (phase 3
    // runs before phase 4 removes it).
    let mut via_stage: HashSet<ObjId> = HashSet::new();
    let mut outs: Vec<(usize, MoveOut)> = Vec::new();
    for (dir, name, before, _) in &changes {
        let Some(b) = before else { continue };
        let dir_ref = names.base_of(st, *dir).ok_or(Error::Stale(*dir))?;
        let from = names.join(dir_ref, name);
        let depth = names.paths.depth(from);
        let node = st.node(*b).ok_or(Error::Stale(*b))?;
        let placed = final_locs.contains_key(b);
        let open = node.open > 0;
        if keep_at.contains_key(b) {
            // Still linked under a name that does not change: drop this one.
            outs.push((depth, MoveOut::Unlink { from }));
            continue;
        }
        // A file still linked under a name the engine never looked up.
        let linked_elsewhere =
            node.kind != FileKind::Dir && st.attr_unrecorded(None, *b).map(|a| a.nlink).unwrap_or(0) > 0;
        if staged.insert(*b) {
            let stage = names.meta(&stage_path(*b));
            outs.push((depth, MoveOut::Stage { from, stage }));
            if !placed {
                if open {
                    orphan.push(*b);
                } else {
                    if linked_elsewhere {
                        via_stage.insert(*b);
                    }
                    plan.dead.push(stage);
                    upd.gone.push(*b);
                }
            }
        } else {
            outs.push((depth, MoveOut::Unlink { from }));
        }
    }
    outs.sort_by_key(|o| std::cmp::Reverse(o.0));
    plan.out = outs.into_iter().map(|(_, m)| m).collect();
    // New objects that never got a name.
    let mut created: Vec<_> = d.created.iter().collect();
    created.sort_by_key(|(o, _)| **o);
    for (o, n) in &created {
        if !final_locs.contains_key(o) {
            let open = st.node(**o).is_some_and(|n| n.open > 0);
            if open && n.kind == FileKind::File {
                orphan.push(**o);
            } else {
                upd.gone.push(**o);
            }
        }
    }
    // How many objects have bytes in each data file: one that holds
    // another object's bytes is never renamed away.
    let mut users: HashMap<DataFileId, usize> = HashMap::new();
    for od in d.objs.values() {
        let ids: HashSet<DataFileId> = od
            .file
            .iter()
            .flat_map(|f| f.ext.iter())
            .filter_map(|(_, e)| match e.loc {
                crate::delta::DataLoc::File(id, _) => Some(id),
                _ => None,
            })
            .collect();
        for id in ids {
            *users.entry(id).or_default() += 1;
        }
    }
    // New files that are exactly a data file (staged, or the shadow of a
    // later transaction that rewrote all of it): renamed into place.
    let mut in_place: HashMap<ObjId, DataFileId> = HashMap::new();
    for (o, n) in &created {
        if n.kind != FileKind::File {
            continue;
        }
        let Some(f) = d.objs.get(o).and_then(|od| od.file.as_ref()) else { continue };
        let size = f.size_after(0);
        if let (Some((id, end)), 0) = (f.shadow_file(), f.cut) {
            // Its length is all of it: no other bytes are in it.
            if end >= size && users.get(&id) == Some(&1) && st.data_file(id).is_some_and(|df| df.len == size) {
                in_place.insert(**o, id);
            }
        }
    }
    // Existing files whose committed content is all of their shadow: the
    // shadow replaces them. Only files that keep their one name (a second
    // link would keep the old inode's content).
    let mut replace: HashMap<ObjId, (DataFileId, u64, PathRef, u64)> = HashMap::new();
    for (o, od) in &d.objs {
        if d.created.contains_key(o) || staged.contains(o) || final_locs.contains_key(o) {
            continue;
        }
        let Some((id, end)) = od.file.as_ref().and_then(|f| f.shadow_file()) else { continue };
        if users.get(&id) != Some(&1) {
            continue;
        }
        let (Some(bp), Some(to)) = (st.base_path(*o), names.final_of(st, *o)) else { continue };
        let m = st.storage().lstat(&bp).ctx("checkpoint stat", || bp.display().to_string())?;
        let size = od.file.as_ref().map_or(0, |f| f.size_after(m.size));
        if m.kind == FileKind::File && m.nlink == 1 && end >= size && st.storage().privileged() {
            match prepare_shadow(&**st.storage(), &data_path(id), &bp) {
                Ok(()) => {
                    replace.insert(*o, (id, size, to, m.size));
                }
                // Copied instead, as before shadows.
                Err(e) => tracing::debug!("{}: {e}: its shadow is copied, not renamed", bp.display()),
            }
        }
    }
    let place_new = |names: &mut Namer, o: ObjId, to: PathRef| -> Place {
        match in_place.get(&o) {
            Some(id) => Place::Rename { stage: names.meta(&data_path(*id)), to },
            None => Place::File { to },
        }
    };
    // Phase 2.
    let mut firsts: Vec<(usize, Place)> = Vec::new();
    let mut links: Vec<(usize, Place)> = Vec::new();
    let mut objs: Vec<_> = final_locs.keys().copied().collect();
    objs.sort();
    for o in &objs {
        let locs = &final_locs[o];
        let keeps_base_name = !d.created.contains_key(o) && !staged.contains(o);
        let first = if keeps_base_name {
            // Unchanged base name, gaining links: links are made from it.
            let b = st.node(*o).and_then(|n| n.base.clone()).ok_or(Error::Stale(*o))?;
            let dir = names.final_of(st, b.parent).ok_or(Error::Stale(b.parent))?;
            names.join(dir, &b.name)
        } else {
            names.final_of(st, *o).ok_or(Error::Stale(*o))?
        };
        let depth = names.paths.depth(first);
        if let Some(n) = d.created.get(o) {
            let pl = match n.kind {
                FileKind::Dir => Place::Dir { to: first },
                FileKind::Symlink => {
                    Place::Symlink { to: first, target: n.target.clone().unwrap_or_default().into_vec() }
                }
                k if k.is_special() => Place::Special { to: first, kind: k, rdev: n.rdev },
                _ => place_new(&mut names, *o, first),
            };
            firsts.push((depth, pl));
            upd.new_inos.push(*o);
        } else if staged.contains(o) {
            firsts.push((depth, Place::Rename { stage: names.meta(&stage_path(*o)), to: first }));
        }
        if !keeps_base_name {
            upd.moved.push((*o, BaseLoc { parent: locs[0].0, name: locs[0].1.clone() }));
        }
        for (dir, name) in locs.iter() {
            let dir_ref = names.final_of(st, *dir).ok_or(Error::Stale(*dir))?;
            let to = names.join(dir_ref, name);
            if to != first {
                links.push((names.paths.depth(to), Place::Link { existing: first, to }));
            }
        }
    }
    firsts.sort_by_key(|(dpt, _)| *dpt);
    links.sort_by_key(|(dpt, _)| *dpt);
    plan.place = firsts.into_iter().chain(links).map(|(_, pl)| pl).collect();
    let orphans_dir = Path::new(META_DIR).join("orphans");
    for o in &orphan {
        let to = names.meta(&orphans_dir.join(orphan_name(*o)));
        if d.created.contains_key(o) {
            let pl = place_new(&mut names, *o, to);
            plan.place.push(pl);
            upd.new_inos.push(*o);
        } else {
            plan.place.push(Place::Rename { stage: names.meta(&stage_path(*o)), to });
        }
        upd.moved.push((*o, BaseLoc { parent: ORPHANS_OBJ, name: orphan_name(*o) }));
    }
    let mut replaced: Vec<_> = replace.iter().collect();
    replaced.sort();
    // The old inodes stay as spare data files (new shadows overwrite their
    // allocated blocks: about twice as fast as filling a new file here)
    // while the spares stay under SPARES_MAX and a quarter of free space.
    let free = st.storage().free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    let mut kept: u64 = st.spare_bytes();
    for (_, (id, size, to, old)) in replaced {
        let keep = kept + old <= SPARES_MAX && free.is_none_or(|f| kept + old <= f / 4) && *old > 0;
        let keep = keep.then(|| {
            kept += old;
            let k = st.new_data_id();
            upd.spares.push(k);
            names.meta(&data_path(k))
        });
        plan.place.push(Place::Replace { data: names.meta(&data_path(*id)), to: *to, size: *size, keep });
    }
    // Phase 3.
    let orphan_set: HashSet<ObjId> = orphan.iter().copied().collect();
    let mut touched: Vec<_> = d.objs.iter().collect();
    touched.sort_by_key(|(o, _)| **o);
    for (o, od) in touched {
        let path = if orphan_set.contains(o) {
            names.meta(&orphans_dir.join(orphan_name(*o)))
        } else if via_stage.contains(o) {
            names.meta(&stage_path(*o))
        } else {
            match names.final_of(st, *o) {
                Some(pth) => pth,
                None => continue,
            }
        };
        let kind = st.node_kind(*o)?;
        if let (Some(f), false) = (&od.file, in_place.contains_key(o) || replace.contains_key(o)) {
            let base = if d.created.contains_key(o) {
                0
            } else {
                let bp = st.base_path(*o).ok_or(Error::Stale(*o))?;
                st.storage().lstat(&bp).ctx("checkpoint stat", || bp.display().to_string())?.size
            };
            let mut extents = Vec::new();
            let mut files = Vec::new();
            for (off, e) in f.ext.iter() {
                match e.loc {
                    crate::delta::DataLoc::Journal(ep, joff) if ep == plan.epoch => extents.push((off, e.len, joff)),
                    crate::delta::DataLoc::File(id, foff) => files.push((off, e.len, id.0, foff)),
                    _ => {
                        return Err(Error::Poisoned(format!(
                            "{o}: committed extent not in the journal of {:?}",
                            plan.epoch
                        )))
                    }
                }
            }
            plan.data.push(DataOp { path, cut: f.cut, size: f.size_after(base), extents, files });
        }
        let a = &od.attr;
        let op = AttrOp {
            path,
            is_symlink: kind == FileKind::Symlink,
            mode: a.mode,
            owner: (a.uid.is_some() || a.gid.is_some()).then_some((a.uid, a.gid)),
            times: (a.atime.is_some() || a.mtime.is_some() || od.file.is_some()).then_some((a.atime, a.mtime)),
            xattrs: a.xattrs.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.clone())).collect(),
        };
        if op.mode.is_some() || op.owner.is_some() || op.times.is_some() || !op.xattrs.is_empty() {
            plan.attrs.push(op);
        }
    }
    plan.paths = names.paths;
    upd.changed_locs = changed_locs;
    upd.in_place = in_place.into_keys().chain(replace.keys().copied()).collect();
    upd.replaced = replace.into_keys().collect();
    Ok((plan, upd))
}

/// Gives the shadow `data` what the file `to` it replaces has besides its
/// bytes: owner, mode, exactly its xattrs (a spare's own are removed;
/// ACLs are xattrs) and times. Done while the plan is built, before it is
/// persisted: a daemon that may not do this (not root, a file system
/// without owners or xattrs) copies the file instead of failing a plan it
/// could never finish. Nothing depends on these changes being durable
/// before the step itself: `Place::Replace` gives them again and fsyncs
/// the shadow before renaming it.
pub(super) fn prepare_shadow(s: &dyn Storage, data: &Path, to: &Path) -> std::io::Result<()> {
    let m = s.lstat(to)?;
    // chown first: it clears the set-id bits that chmod then restores.
    s.set_owner(data, m.uid, m.gid)?;
    s.set_mode(data, m.mode)?;
    let want = s.list_xattrs(to)?;
    for name in s.list_xattrs(data)? {
        if !want.contains(&name) {
            s.remove_xattr(data, &name)?;
        }
    }
    for name in &want {
        if let Some(v) = s.get_xattr(to, name)? {
            s.set_xattr(data, name, &v)?;
        }
    }
    s.set_times(data, m.atime, m.mtime)
}

/// Persists a plan: write a temp file, fsync, rename, fsync the folder.
/// Writes the plan beside its place (`.tmp`, synced): nothing names it
/// yet, so a failure here leaves the checkpoint not started. [`publish`]
/// puts it in place.
pub(super) fn persist(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let body = encode_plan(plan);
    let mut bytes = Vec::with_capacity(body.len() + 8);
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    let final_path = plan_path(plan.epoch);
    let tmp = final_path.with_extension("tmp");
    let what = || tmp.display().to_string();
    let f = s.open_file(&tmp, true).ctx("plan write", what)?;
    f.set_len(0).ctx("plan write", what)?;
    f.write_at(0, &bytes).ctx("plan write", what)?;
    f.sync_data().ctx("plan write", what)
}

/// Puts the plan [`persist`] wrote in place, durably: from here on
/// recovery executes it.
pub(super) fn publish(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let final_path = plan_path(plan.epoch);
    let tmp = final_path.with_extension("tmp");
    s.rename(&tmp, &final_path).ctx("plan write", || final_path.display().to_string())?;
    s.fsync(Path::new(META_DIR)).ctx("plan write", || META_DIR.into())?;
    Ok(())
}

/// Reads a persisted plan, verifying its checksum.
pub fn load(s: &dyn Storage, path: &Path) -> Result<Plan> {
    let corrupt = |detail: &str| Error::Corrupt { path: path.to_path_buf(), offset: 0, detail: detail.into() };
    let f = s.open_file(path, false).ctx("plan read", || path.display().to_string())?;
    let len = f.len().ctx("plan read", || path.display().to_string())?;
    let mut bytes = vec![0u8; len as usize];
    journal::read_exact(&*f, 0, &mut bytes).ctx("plan read", || path.display().to_string())?;
    if bytes.len() < 8 {
        return Err(corrupt("plan shorter than its header"));
    }
    let crc = u32::from_le_bytes(bytes[0..4].try_into().expect("4"));
    let n = u32::from_le_bytes(bytes[4..8].try_into().expect("4")) as usize;
    let body = bytes.get(8..8 + n).ok_or_else(|| corrupt("plan truncated"))?;
    if crc32c::crc32c(body) != crc {
        return Err(corrupt("plan checksum mismatch"));
    }
    decode_plan(body).ok_or_else(|| corrupt("undecodable plan"))
}

// The byte encoding of the plan (the table in `codec`).
//
// The first format has no version: its body starts with the epoch, and
// its steps name whole paths. Today's body starts with `PLAN_V2` (as an
// epoch, a number no backing reaches), then the epoch, the last seq, the
// path table (`paths.rs`), and the steps naming paths by their index.

/// The first 8 bytes of a body of the second format.
const PLAN_V2: [u8; 8] = *b"txfsPl2\0";

/// A plan of the first format, as it was encoded.
#[derive(Clone, Debug)]
pub(crate) struct PlanV1 {
    pub epoch: Epoch,
    pub last_seq: Seq,
    pub out: Vec<MoveOut<Vec<u8>>>,
    pub place: Vec<Place<Vec<u8>>>,
    pub data: Vec<DataOp<Vec<u8>>>,
    pub attrs: Vec<AttrOp<Vec<u8>>>,
    pub dead: Vec<Vec<u8>>,
}

/// A plan's body (the plan file adds its checksum and length).
pub(crate) fn encode_plan(plan: &Plan) -> Vec<u8> {
    let mut out = PLAN_V2.to_vec();
    plan.epoch.put(&mut out);
    plan.last_seq.put(&mut out);
    plan.paths.put(&mut out);
    plan.out.put(&mut out);
    plan.place.put(&mut out);
    plan.data.put(&mut out);
    plan.attrs.put(&mut out);
    plan.dead.put(&mut out);
    out
}

/// A plan from its body, of either format; `None` if the bytes are not a
/// whole plan (bytes after one are ignored), or name a path its table
/// does not have.
pub(crate) fn decode_plan(body: &[u8]) -> Option<Plan> {
    let Some(rest) = body.strip_prefix(&PLAN_V2) else {
        return PlanV1::get(&mut Reader::new(body)).ok()?.interned();
    };
    let r = &mut Reader::new(rest);
    let epoch = Epoch::get(r).ok()?;
    let last_seq = Seq::get(r).ok()?;
    let paths = Paths::get(r).ok()??;
    let plan = Plan {
        epoch,
        last_seq,
        out: Codec::get(r).ok()?,
        place: Codec::get(r).ok()?,
        data: Codec::get(r).ok()?,
        attrs: Codec::get(r).ok()?,
        dead: Codec::get(r).ok()?,
        paths,
    };
    let mut ok = true;
    plan.each_path(&mut |p| ok &= plan.paths.holds(p));
    ok.then_some(plan)
}

impl PlanV1 {
    /// The same plan, its paths in a table; `None` if one is not a
    /// relative path.
    fn interned(self) -> Option<Plan> {
        let mut paths = Paths::default();
        let mut bad = false;
        let mut f = |b: Vec<u8>| {
            paths.intern(Path::new(OsStr::from_bytes(&b))).unwrap_or_else(|| {
                bad = true;
                PathRef::ROOT
            })
        };
        let plan = Plan {
            epoch: self.epoch,
            last_seq: self.last_seq,
            out: self.out.into_iter().map(|m| m.map(&mut f)).collect(),
            place: self.place.into_iter().map(|m| m.map(&mut f)).collect(),
            data: self.data.into_iter().map(|m| m.map(&mut f)).collect(),
            attrs: self.attrs.into_iter().map(|m| m.map(&mut f)).collect(),
            dead: self.dead.into_iter().map(&mut f).collect(),
            paths: Paths::default(),
        };
        (!bad).then_some(Plan { paths, ..plan })
    }
}

impl Plan {
    /// The plan in the first format (whole paths), as the tests compare.
    #[cfg(test)]
    pub(crate) fn to_v1(&self) -> PlanV1 {
        let mut f = |r: PathRef| self.path(r).into_os_string().into_vec();
        PlanV1 {
            epoch: self.epoch,
            last_seq: self.last_seq,
            out: self.out.iter().cloned().map(|m| m.map(&mut f)).collect(),
            place: self.place.iter().cloned().map(|m| m.map(&mut f)).collect(),
            data: self.data.iter().cloned().map(|m| m.map(&mut f)).collect(),
            attrs: self.attrs.iter().cloned().map(|m| m.map(&mut f)).collect(),
            dead: self.dead.iter().map(|r| f(*r)).collect(),
        }
    }

    /// Every path a step names.
    fn each_path(&self, f: &mut impl FnMut(PathRef)) {
        let mut g = |p: PathRef| f(p);
        for m in &self.out {
            m.clone().map(&mut g);
        }
        for m in &self.place {
            m.clone().map(&mut g);
        }
        self.data.iter().for_each(|m| g(m.path));
        self.attrs.iter().for_each(|m| g(m.path));
        self.dead.iter().for_each(|m| g(*m));
    }
}

impl<P> MoveOut<P> {
    fn map<Q>(self, f: &mut impl FnMut(P) -> Q) -> MoveOut<Q> {
        match self {
            MoveOut::Stage { from, stage } => MoveOut::Stage { from: f(from), stage: f(stage) },
            MoveOut::Unlink { from } => MoveOut::Unlink { from: f(from) },
        }
    }
}

impl<P> Place<P> {
    fn map<Q>(self, f: &mut impl FnMut(P) -> Q) -> Place<Q> {
        match self {
            Place::Rename { stage, to } => Place::Rename { stage: f(stage), to: f(to) },
            Place::File { to } => Place::File { to: f(to) },
            Place::Dir { to } => Place::Dir { to: f(to) },
            Place::Symlink { to, target } => Place::Symlink { to: f(to), target },
            Place::Link { existing, to } => Place::Link { existing: f(existing), to: f(to) },
            Place::Replace { data, to, size, keep } => {
                Place::Replace { data: f(data), to: f(to), size, keep: keep.map(&mut *f) }
            }
            Place::Special { to, kind, rdev } => Place::Special { to: f(to), kind, rdev },
        }
    }
}

impl<P> DataOp<P> {
    fn map<Q>(self, f: &mut impl FnMut(P) -> Q) -> DataOp<Q> {
        let DataOp { path, cut, size, extents, files } = self;
        DataOp { path: f(path), cut, size, extents, files }
    }
}

impl<P> AttrOp<P> {
    fn map<Q>(self, f: &mut impl FnMut(P) -> Q) -> AttrOp<Q> {
        let AttrOp { path, is_symlink, mode, owner, times, xattrs } = self;
        AttrOp { path: f(path), is_symlink, mode, owner, times, xattrs }
    }
}

impl<P: Codec> Codec for MoveOut<P> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            MoveOut::Stage { from, stage } => {
                0u32.put(out);
                from.put(out);
                stage.put(out);
            }
            MoveOut::Unlink { from } => {
                1u32.put(out);
                from.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(match r.variant(2)? {
            0 => MoveOut::Stage { from: Codec::get(r)?, stage: Codec::get(r)? },
            _ => MoveOut::Unlink { from: Codec::get(r)? },
        })
    }
}

impl<P: Codec> Codec for Place<P> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Place::Rename { stage, to } => {
                0u32.put(out);
                stage.put(out);
                to.put(out);
            }
            Place::File { to } => {
                1u32.put(out);
                to.put(out);
            }
            Place::Dir { to } => {
                2u32.put(out);
                to.put(out);
            }
            Place::Symlink { to, target } => {
                3u32.put(out);
                to.put(out);
                target.put(out);
            }
            Place::Link { existing, to } => {
                4u32.put(out);
                existing.put(out);
                to.put(out);
            }
            Place::Replace { data, to, size, keep } => {
                5u32.put(out);
                data.put(out);
                to.put(out);
                size.put(out);
                keep.put(out);
            }
            Place::Special { to, kind, rdev } => {
                6u32.put(out);
                to.put(out);
                kind.put(out);
                rdev.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(match r.variant(7)? {
            0 => Place::Rename { stage: Codec::get(r)?, to: Codec::get(r)? },
            1 => Place::File { to: Codec::get(r)? },
            2 => Place::Dir { to: Codec::get(r)? },
            3 => Place::Symlink { to: Codec::get(r)?, target: Codec::get(r)? },
            4 => Place::Link { existing: Codec::get(r)?, to: Codec::get(r)? },
            5 => {
                Place::Replace { data: Codec::get(r)?, to: Codec::get(r)?, size: Codec::get(r)?, keep: Codec::get(r)? }
            }
            _ => Place::Special { to: Codec::get(r)?, kind: Codec::get(r)?, rdev: Codec::get(r)? },
        })
    }
}

fields!(DataOp<P> { path, cut, size, extents, files });
fields!(AttrOp<P> { path, is_symlink, mode, owner, times, xattrs });
fields!(PlanV1 { epoch, last_seq, out, place, data, attrs, dead });
