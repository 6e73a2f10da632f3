//! Checkpoint: write the committed delta into the backing tree, then start a
//! new journal epoch.
//!
//! The backing tree changes *only* by executing a persisted plan (J1). A
//! plan is computed from the committed delta and the backing tree, written
//! to `.txfs/ckpt-<epoch>.plan` (checksummed, fsynced), and then executed in
//! four phases. Every step is idempotent, so recovery simply executes the
//! plan again from its last durable phase marker (J5):
//!
//! ```text
//!  phase 1  move out   every backing entry the delta changes is renamed to
//!                      .txfs/stage/o<id> (or unlinked, for a second link),
//!                      deepest path first      — skip if already gone
//!           marker     fsync the directories phase 1 changed (syncfs past
//!                      64 or if one moved); create .txfs/ckpt-<epoch>.p1;
//!                      fsync .txfs
//!  phase 2  place      staged and new objects go to their final names,
//!                      shallowest first; extra hard links after; a new
//!                      file whose content is exactly a data file is that
//!                      data file, renamed into place (its bytes are
//!                      written once: selective data journaling); an
//!                      existing file whose content is all of its shadow
//!                      gets its attributes and is replaced by it
//!                      — skip if the stage name is gone / target exists
//!  phase 3  contents   per file: truncate to the cut, write extents from
//!                      the journal and from data files, set the final
//!                      size; then attributes
//!                      — final-state writes: replaying them is harmless
//!  phase 4  delete     staged objects that died are removed
//!           finish     syncfs; create journal <epoch+1>; unlink journal
//!                      <epoch>; unlink the plan; then the epoch's data
//!                      files (nothing names them any more)
//! ```
//!
//! Why phase 1 needs the marker: phase 2 may re-create a name phase 1
//! moved away; replaying phase 1 after that would move the new object.
//! Why deepest first: namespace operations become durable in order, so if
//! a directory's move survived a crash, the moves of everything inside it
//! that phase 1 touched survived too.
//!
//! Locking: plan, phase 1, marker and phase 2 run under the engine lock;
//! phase 3 onwards runs outside it while the delta being written stays
//! readable as `State::frozen` and new commits go to the next journal
//! ([`run`], DESIGN §4).

use crate::delta::NO_CUT;
use crate::engine::{data_path, BaseLoc, State, META_DIR, ORPHANS_OBJ, SPARES_MAX};
use crate::error::{Error, IoContext, Result};
use crate::ids::{Epoch, ObjId, Seq};
use crate::journal::{self, JournalWriter, SyncState};
use crate::storage::{FileKind, Storage, StoredFile, Timestamp};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub enum MoveOut {
    Stage { from: Vec<u8>, stage: Vec<u8> },
    Unlink { from: Vec<u8> },
}

#[derive(Clone, Debug)]
pub enum Place {
    Rename {
        stage: Vec<u8>,
        to: Vec<u8>,
    },
    File {
        to: Vec<u8>,
    },
    Dir {
        to: Vec<u8>,
    },
    Symlink {
        to: Vec<u8>,
        target: Vec<u8>,
    },
    Link {
        existing: Vec<u8>,
        to: Vec<u8>,
    },
    /// An existing file whose committed content is all of a data file (its
    /// shadow, which [`build`] gave the file's owner, mode, xattrs and
    /// times): the data file, cut to `size`, synced and renamed over it.
    /// With `keep`, the old inode is linked there first and stays as a
    /// spare data file.
    Replace {
        data: Vec<u8>,
        to: Vec<u8>,
        size: u64,
        keep: Option<Vec<u8>>,
    },
}

#[derive(Clone, Debug)]
pub struct DataOp {
    pub path: Vec<u8>,
    pub cut: u64,
    pub size: u64,
    /// (file offset, length, offset in the epoch's journal)
    pub extents: Vec<(u64, u64, u64)>,
    /// (file offset, length, data file, offset in it)
    pub files: Vec<(u64, u64, u64, u64)>,
}

#[derive(Clone, Debug)]
pub struct AttrOp {
    pub path: Vec<u8>,
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
    pub out: Vec<MoveOut>,
    pub place: Vec<Place>,
    pub data: Vec<DataOp>,
    pub attrs: Vec<AttrOp>,
    pub dead: Vec<Vec<u8>>,
}

fn p(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

fn bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

pub fn plan_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join(format!("ckpt-{:016x}.plan", e.0))
}

fn marker_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join(format!("ckpt-{:016x}.p1", e.0))
}

pub fn journal_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join("journal").join(format!("{:016x}", e.0))
}

/// A retired journal kept to become the next epoch's (journal.rs,
/// "Recycled journals").
pub fn spare_path() -> PathBuf {
    Path::new(META_DIR).join("journal-spare")
}

/// The most of a retired journal kept as the spare (a longer one is cut
/// to this first): disk space held while mounted, for commits that do not
/// grow the next journal until it reaches this size. A spare is kept only
/// while free space is at least four times its size, and is given back
/// first when a checkpoint or a commit runs out of space.
pub const SPARE_MAX: u64 = 256 << 20;

/// Where [`key_empty_journal`] builds its file.
fn rebuild_tmp_path() -> PathBuf {
    Path::new(META_DIR).join("journal-new.tmp")
}

/// Deletes the spare journal (and a half-built plain one), if there is one.
pub fn drop_spare(s: &dyn Storage) -> Result<()> {
    for sp in [spare_path(), rebuild_tmp_path()] {
        match s.unlink(&sp) {
            Ok(()) => s.fsync(Path::new(META_DIR)).ctx("journal spare", || META_DIR.into())?,
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(Error::io("journal spare", sp.display().to_string(), e)),
        }
    }
    Ok(())
}

/// Recovery, for a journal in the older unkeyed format (`TXFSJNL1`) with
/// no record: replaces it by the same empty journal, keyed with a fresh
/// nonce, so that no epoch after an upgrade appends unkeyed records (whose
/// checksums a user could forge in file data: journal.rs). Built beside it
/// and renamed over it; a crash leaves one or the other, and a half-built
/// file is deleted by the next recovery ([`drop_spare`]). Returns the new
/// file and its nonce.
pub(crate) fn key_empty_journal(
    s: &dyn Storage,
    jp: &Path,
    epoch: Epoch,
    prev_seq: Seq,
) -> Result<(Arc<dyn StoredFile>, u32)> {
    let tmp = rebuild_tmp_path();
    let what = || tmp.display().to_string();
    let nonce = journal::new_nonce();
    let f = s.open_file(&tmp, true).ctx("journal create", what)?;
    f.set_len(0).ctx("journal create", what)?;
    f.write_at(0, &journal::file_header(epoch, prev_seq, nonce)).ctx("journal create", what)?;
    f.sync_data().ctx("journal create", what)?;
    s.rename(&tmp, jp).ctx("journal create", || jp.display().to_string())?;
    let jdir = Path::new(META_DIR).join("journal");
    s.fsync(&jdir).ctx("journal create", || jdir.display().to_string())?;
    s.fsync(Path::new(META_DIR)).ctx("journal create", || META_DIR.into())?;
    Ok((f, nonce))
}

/// Makes the spare the journal `jp` of epoch `next`: the new header is
/// written and synced before the rename, so either name holds a file whose
/// header matches it. `false` (a fresh file is created instead) if there is
/// no usable spare or any step fails.
fn recycle_spare(s: &dyn Storage, jp: &Path, next: Epoch, last_seq: Seq, nonce: u32) -> bool {
    let sp = spare_path();
    let Ok(f) = s.open_file(&sp, false) else { return false };
    match f.len() {
        Ok(l) if l > SPARE_MAX => {
            if f.set_len(SPARE_MAX).is_err() {
                return false;
            }
        }
        Ok(l) if l >= journal::FILE_HEADER_LEN => {}
        _ => return false,
    }
    if f.write_at(0, &journal::file_header(next, last_seq, nonce)).is_err() || f.sync_data().is_err() {
        return false;
    }
    drop(f);
    s.rename(&sp, jp).is_ok()
}

fn stage_path(o: ObjId) -> PathBuf {
    Path::new(META_DIR).join("stage").join(format!("o{}", o.0))
}

fn orphan_name(o: ObjId) -> OsString {
    OsString::from(format!("{}", o.0))
}

fn is_missing(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT) || e.kind() == std::io::ErrorKind::NotFound
}

fn exists(s: &dyn Storage, path: &Path) -> Result<bool> {
    match s.lstat(path) {
        Ok(_) => Ok(true),
        Err(e) if is_missing(&e) => Ok(false),
        Err(e) => Err(Error::io("stat", path.display().to_string(), e)),
    }
}

/// What the in-memory node table must look like after the plan ran.
struct NodeUpdates {
    moved: Vec<(ObjId, BaseLoc)>,
    /// Base names the plan changed: no node may keep them as a location.
    changed_locs: HashSet<(ObjId, OsString)>,
    gone: Vec<ObjId>,
    new_inos: Vec<ObjId>,
    /// New files placed by renaming their data file: the tree holds their
    /// content once phase 2 ran.
    in_place: Vec<ObjId>,
    /// Existing files replaced by their shadow: a new backing inode.
    replaced: Vec<ObjId>,
    /// Ids of the data files that old inodes are kept as (spares).
    spares: Vec<u64>,
}

/// Computes the plan for the committed delta.
fn build(st: &mut State) -> Result<(Plan, NodeUpdates)> {
    let d = st.committed.clone();
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
        if let Some(n) = st.nodes.get(b) {
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
    // Final path of a live object: first new name, else unchanged base name.
    let final_path = |st: &State, o: ObjId| -> Option<PathBuf> {
        let mut parts = Vec::new();
        let mut cur = o;
        for _ in 0..4096 {
            if cur == ObjId::ROOT {
                let mut pb = PathBuf::new();
                for s in parts.iter().rev() {
                    pb.push(s);
                }
                return Some(pb);
            }
            let (parent, name) = match final_locs.get(&cur).and_then(|v| v.first()) {
                Some((pp, n)) => (*pp, n.clone()),
                None if keep_at.contains_key(&cur) => {
                    let l = &keep_at[&cur];
                    (l.parent, l.name.clone())
                }
                None => {
                    if moved_out.contains(&cur) || d.created.contains_key(&cur) {
                        return None;
                    }
                    let b = st.nodes.get(&cur)?.base.clone()?;
                    (b.parent, b.name)
                }
            };
            parts.push(name);
            cur = parent;
        }
        None
    };
    let mut plan = Plan {
        epoch: st.journal.epoch,
        last_seq: st.seq,
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
        let from = st.base_path(*dir).ok_or(Error::Stale(*dir))?.join(name);
        let depth = from.components().count();
        let node = st.nodes.get(b).ok_or(Error::Stale(*b))?;
        let placed = final_locs.contains_key(b);
        let open = node.open > 0;
        if keep_at.contains_key(b) {
            // Still linked under a name that does not change: drop this one.
            outs.push((depth, MoveOut::Unlink { from: bytes(&from) }));
            continue;
        }
        // A file still linked under a name the engine never looked up.
        let linked_elsewhere =
            node.kind != FileKind::Dir && st.attr_unrecorded(None, *b).map(|a| a.nlink).unwrap_or(0) > 0;
        if staged.insert(*b) {
            outs.push((depth, MoveOut::Stage { from: bytes(&from), stage: bytes(&stage_path(*b)) }));
            if !placed {
                if open {
                    orphan.push(*b);
                } else {
                    if linked_elsewhere {
                        via_stage.insert(*b);
                    }
                    plan.dead.push(bytes(&stage_path(*b)));
                    upd.gone.push(*b);
                }
            }
        } else {
            outs.push((depth, MoveOut::Unlink { from: bytes(&from) }));
        }
    }
    outs.sort_by_key(|o| std::cmp::Reverse(o.0));
    plan.out = outs.into_iter().map(|(_, m)| m).collect();
    // New objects that never got a name.
    let mut created: Vec<_> = d.created.iter().collect();
    created.sort_by_key(|(o, _)| **o);
    for (o, n) in &created {
        if !final_locs.contains_key(o) {
            let open = st.nodes.get(o).is_some_and(|n| n.open > 0);
            if open && n.kind == FileKind::File {
                orphan.push(**o);
            } else {
                upd.gone.push(**o);
            }
        }
    }
    // How many objects have bytes in each data file: one that holds
    // another object's bytes is never renamed away.
    let mut users: HashMap<u64, usize> = HashMap::new();
    for od in d.objs.values() {
        let ids: HashSet<u64> = od
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
    let mut in_place: HashMap<ObjId, u64> = HashMap::new();
    for (o, n) in &created {
        if n.kind != FileKind::File {
            continue;
        }
        let Some(f) = d.objs.get(o).and_then(|od| od.file.as_ref()) else { continue };
        let size = f.size_after(0);
        if let (Some((id, end)), 0) = (f.shadow_file(), f.cut) {
            // Its length is all of it: no other bytes are in it.
            if end >= size && users.get(&id) == Some(&1) && st.data_files.get(&id).is_some_and(|df| df.len == size) {
                in_place.insert(**o, id);
            }
        }
    }
    // Existing files whose committed content is all of their shadow: the
    // shadow replaces them. Only files that keep their one name (a second
    // link would keep the old inode's content).
    let mut replace: HashMap<ObjId, (u64, u64, PathBuf, u64)> = HashMap::new();
    for (o, od) in &d.objs {
        if d.created.contains_key(o) || staged.contains(o) || final_locs.contains_key(o) {
            continue;
        }
        let Some((id, end)) = od.file.as_ref().and_then(|f| f.shadow_file()) else { continue };
        if users.get(&id) != Some(&1) {
            continue;
        }
        let (Some(bp), Some(to)) = (st.base_path(*o), final_path(st, *o)) else { continue };
        let m = st.storage.lstat(&bp).ctx("checkpoint stat", || bp.display().to_string())?;
        let size = od.file.as_ref().map_or(0, |f| f.size_after(m.size));
        if m.kind == FileKind::File && m.nlink == 1 && end >= size && st.storage.privileged() {
            match prepare_shadow(&*st.storage, &data_path(id), &bp) {
                Ok(()) => {
                    replace.insert(*o, (id, size, to, m.size));
                }
                // Copied instead, as before shadows.
                Err(e) => tracing::debug!("{}: {e}: its shadow is copied, not renamed", bp.display()),
            }
        }
    }
    let place_new = |o: ObjId, to: &Path| -> Place {
        match in_place.get(&o) {
            Some(id) => Place::Rename { stage: bytes(&data_path(*id)), to: bytes(to) },
            None => Place::File { to: bytes(to) },
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
            let b = st.nodes.get(o).and_then(|n| n.base.clone()).ok_or(Error::Stale(*o))?;
            final_path(st, b.parent).ok_or(Error::Stale(b.parent))?.join(&b.name)
        } else {
            final_path(st, *o).ok_or(Error::Stale(*o))?
        };
        let depth = first.components().count();
        if let Some(n) = d.created.get(o) {
            let pl = match n.kind {
                FileKind::Dir => Place::Dir { to: bytes(&first) },
                FileKind::Symlink => {
                    Place::Symlink { to: bytes(&first), target: n.target.clone().unwrap_or_default().into_vec() }
                }
                _ => place_new(*o, &first),
            };
            firsts.push((depth, pl));
            upd.new_inos.push(*o);
        } else if staged.contains(o) {
            firsts.push((depth, Place::Rename { stage: bytes(&stage_path(*o)), to: bytes(&first) }));
        }
        if !keeps_base_name {
            upd.moved.push((*o, BaseLoc { parent: locs[0].0, name: locs[0].1.clone() }));
        }
        for (dir, name) in locs.iter() {
            let to = final_path(st, *dir).ok_or(Error::Stale(*dir))?.join(name);
            if to != first {
                links.push((to.components().count(), Place::Link { existing: bytes(&first), to: bytes(&to) }));
            }
        }
    }
    firsts.sort_by_key(|(dpt, _)| *dpt);
    links.sort_by_key(|(dpt, _)| *dpt);
    plan.place = firsts.into_iter().chain(links).map(|(_, pl)| pl).collect();
    for o in &orphan {
        let to = Path::new(META_DIR).join("orphans").join(orphan_name(*o));
        if d.created.contains_key(o) {
            plan.place.push(place_new(*o, &to));
            upd.new_inos.push(*o);
        } else {
            plan.place.push(Place::Rename { stage: bytes(&stage_path(*o)), to: bytes(&to) });
        }
        upd.moved.push((*o, BaseLoc { parent: ORPHANS_OBJ, name: orphan_name(*o) }));
    }
    let mut replaced: Vec<_> = replace.iter().collect();
    replaced.sort();
    // The old inodes stay as spare data files (new shadows overwrite their
    // allocated blocks: about twice as fast as filling a new file here)
    // while the spares stay under SPARES_MAX and a quarter of free space.
    let free = st.storage.free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    let mut kept: u64 = st.spares.iter().map(|(_, l)| l).sum();
    for (_, (id, size, to, old)) in replaced {
        let keep = kept + old <= SPARES_MAX && free.is_none_or(|f| kept + old <= f / 4) && *old > 0;
        let keep = keep.then(|| {
            kept += old;
            let k = st.next_data;
            st.next_data += 1;
            upd.spares.push(k);
            bytes(&data_path(k))
        });
        plan.place.push(Place::Replace { data: bytes(&data_path(*id)), to: bytes(to), size: *size, keep });
    }
    // Phase 3.
    let orphan_set: HashSet<ObjId> = orphan.iter().copied().collect();
    let mut touched: Vec<_> = d.objs.iter().collect();
    touched.sort_by_key(|(o, _)| **o);
    for (o, od) in touched {
        let path = if orphan_set.contains(o) {
            Path::new(META_DIR).join("orphans").join(orphan_name(*o))
        } else if via_stage.contains(o) {
            stage_path(*o)
        } else {
            match final_path(st, *o) {
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
                st.storage.lstat(&bp).ctx("checkpoint stat", || bp.display().to_string())?.size
            };
            let mut extents = Vec::new();
            let mut files = Vec::new();
            for (off, e) in f.ext.iter() {
                match e.loc {
                    crate::delta::DataLoc::Journal(ep, joff) if ep == plan.epoch => extents.push((off, e.len, joff)),
                    crate::delta::DataLoc::File(id, foff) => files.push((off, e.len, id, foff)),
                    _ => {
                        return Err(Error::Poisoned(format!(
                            "{o}: committed extent not in the journal of {:?}",
                            plan.epoch
                        )))
                    }
                }
            }
            plan.data.push(DataOp { path: bytes(&path), cut: f.cut, size: f.size_after(base), extents, files });
        }
        let a = &od.attr;
        let op = AttrOp {
            path: bytes(&path),
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
    upd.changed_locs = changed_locs;
    upd.in_place = in_place.into_keys().chain(replace.keys().copied()).collect();
    upd.replaced = replace.into_keys().collect();
    Ok((plan, upd))
}

/// Phase 1, marker, phases 2–4 (idempotent; `resume` after a crash).
pub fn execute(s: &dyn Storage, plan: &Plan, journal: &dyn StoredFile) -> Result<()> {
    namespace(s, plan)?;
    contents(s, plan, journal, None)?;
    sync_stage_writes(s, plan)?;
    delete_and_sync(s, plan)
}

/// Makes phase 1's moves durable before the marker says they are done:
/// an `fsync` of each directory they changed, or `syncfs` when they are
/// many or a directory cannot be synced (no longer there: moved out
/// itself). Not `syncfs` always: it runs under the engine lock and also
/// waits for every dirty page of the backing file system, which other
/// programs' writes may have filled (bench/NOTES.md item 44).
fn sync_moves_out(s: &dyn Storage, plan: &Plan) -> Result<()> {
    const MAX_DIRS: usize = 64;
    let parent = |path: &[u8]| p(path).parent().unwrap_or(Path::new("")).to_path_buf();
    let mut dirs = std::collections::BTreeSet::new();
    for m in &plan.out {
        match m {
            MoveOut::Stage { from, stage } => {
                dirs.insert(parent(from));
                dirs.insert(parent(stage));
            }
            MoveOut::Unlink { from } => {
                dirs.insert(parent(from));
            }
        }
    }
    if dirs.len() <= MAX_DIRS && dirs.iter().all(|d| s.fsync(d).is_ok()) {
        return Ok(());
    }
    s.sync_all().ctx("checkpoint sync", || "phase 1".into())
}

fn in_stage(path: &[u8]) -> bool {
    p(path).starts_with(Path::new(META_DIR).join("stage"))
}

/// Phase 1, the marker, phase 2: every name the plan changes.
fn namespace(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let marker = marker_path(plan.epoch);
    if !exists(s, &marker)? {
        for m in &plan.out {
            match m {
                MoveOut::Stage { from, stage } => {
                    if exists(s, p(stage))? {
                        if exists(s, p(from))? {
                            s.unlink(p(from)).ctx("checkpoint unlink", || p(from).display().to_string())?;
                        }
                        continue;
                    }
                    match s.rename(p(from), p(stage)) {
                        Ok(()) => {}
                        Err(e) if is_missing(&e) => {
                            return Err(Error::Corrupt {
                                path: plan_path(plan.epoch),
                                offset: 0,
                                detail: format!("{} vanished before phase 1 moved it", p(from).display()),
                            })
                        }
                        Err(e) => return Err(Error::io("checkpoint move", p(from).display().to_string(), e)),
                    }
                }
                MoveOut::Unlink { from } => match s.unlink(p(from)) {
                    Ok(()) => {}
                    Err(e) if is_missing(&e) => {}
                    Err(e) => return Err(Error::io("checkpoint unlink", p(from).display().to_string(), e)),
                },
            }
        }
        sync_moves_out(s, plan)?;
        s.create_file(&marker, 0o600).ctx("checkpoint marker", || marker.display().to_string())?;
        s.fsync(Path::new(META_DIR)).ctx("checkpoint marker", || META_DIR.into())?;
    }
    for pl in &plan.place {
        match pl {
            Place::Rename { stage, to } => {
                if exists(s, p(stage))? {
                    s.rename(p(stage), p(to)).ctx("checkpoint place", || p(to).display().to_string())?;
                } else if !exists(s, p(to))? {
                    return Err(Error::Corrupt {
                        path: plan_path(plan.epoch),
                        offset: 0,
                        detail: format!("neither {} nor {} exists", p(stage).display(), p(to).display()),
                    });
                }
            }
            Place::Replace { data, to, size, keep } => {
                if exists(s, p(data))? {
                    replace_file(s, p(data), p(to), *size, keep.as_deref().map(p))?;
                } else if !exists(s, p(to))? {
                    return Err(Error::Corrupt {
                        path: plan_path(plan.epoch),
                        offset: 0,
                        detail: format!("neither {} nor {} exists", p(data).display(), p(to).display()),
                    });
                }
            }
            Place::File { to } => {
                s.create_file(p(to), 0o600).ctx("checkpoint create", || p(to).display().to_string())?
            }
            Place::Dir { to } => {
                if !exists(s, p(to))? {
                    s.mkdir(p(to), 0o700).ctx("checkpoint mkdir", || p(to).display().to_string())?;
                }
            }
            Place::Symlink { to, target } => {
                if !exists(s, p(to))? {
                    s.symlink(OsStr::from_bytes(target), p(to))
                        .ctx("checkpoint symlink", || p(to).display().to_string())?;
                }
            }
            Place::Link { existing, to } => {
                if !exists(s, p(to))? {
                    s.link(p(existing), p(to)).ctx("checkpoint link", || p(to).display().to_string())?;
                }
            }
        }
    }
    Ok(())
}

/// Gives the shadow `data` what the file `to` it replaces has besides its
/// bytes: owner, mode, exactly its xattrs (a spare's own are removed;
/// ACLs are xattrs) and times. Done while the plan is built, before it is
/// persisted: a daemon that may not do this (not root, a file system
/// without owners or xattrs) copies the file instead of failing a plan it
/// could never finish. The storage contract's ordered metadata makes these
/// changes durable no later than the plan.
fn prepare_shadow(s: &dyn Storage, data: &Path, to: &Path) -> std::io::Result<()> {
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

/// `to`'s new content is its prepared shadow `data`: cut to `size`, synced
/// and renamed over `to`. With `keep`, the old inode is linked there first
/// (if the file system allows: otherwise it is simply not kept). Replaying
/// it is safe until the rename (`to` is still the old inode); after it
/// `data` is gone and it is skipped.
fn replace_file(s: &dyn Storage, data: &Path, to: &Path, size: u64, keep: Option<&Path>) -> Result<()> {
    let what = || to.display().to_string();
    let dwhat = || data.display().to_string();
    // Again, while `to` is still the old inode: on a file system that does
    // not make one file's attribute changes durable with another's fsync,
    // a replay after a crash still renames a shadow with the file's owner,
    // mode and xattrs. Best effort: `build` did it once already.
    let _ = prepare_shadow(s, data, to);
    s.set_len(data, size).ctx("checkpoint replace", dwhat)?;
    if let Some(k) = keep {
        if !exists(s, k)? {
            if let Err(e) = s.link(to, k) {
                tracing::debug!("{}: {e}: the old inode is not kept as a spare", k.display());
            }
        }
    }
    s.fsync(data).ctx("checkpoint replace", dwhat)?;
    s.rename(data, to).ctx("checkpoint replace", what)
}

/// Phase 3: contents and attributes; with `stage`, only those written
/// through stage links (`Some(true)`) or only the others (`Some(false)`).
/// Any order is fine: every op writes a final state.
fn contents(s: &dyn Storage, plan: &Plan, journal: &dyn StoredFile, stage: Option<bool>) -> Result<()> {
    let chosen = |path: &[u8]| stage.is_none_or(|want| in_stage(path) == want);
    // A staged object's stage link is gone once phase 4 ran: on replay
    // there is nothing left to write through it.
    let gone_stage = |path: &Path| -> Result<bool> { Ok(in_stage(path.as_os_str().as_bytes()) && !exists(s, path)?) };
    let mut buf = Vec::new();
    for op in plan.data.iter().filter(|op| chosen(&op.path)) {
        let path = p(&op.path);
        if gone_stage(path)? {
            continue;
        }
        let what = || path.display().to_string();
        if op.cut != NO_CUT {
            s.set_len(path, op.cut.min(op.size)).ctx("checkpoint truncate", what)?;
        }
        for &(off, len, joff) in &op.extents {
            let mut done = 0u64;
            while done < len {
                let n = ((len - done) as usize).min(1 << 20);
                buf.resize(n, 0);
                journal::read_exact(journal, joff + done, &mut buf).ctx("checkpoint journal read", what)?;
                s.write_at(path, off + done, &buf).ctx("checkpoint write", what)?;
                done += n as u64;
            }
        }
        // Data files stay until the plan is finished: replay finds them.
        for &(off, len, id, foff) in &op.files {
            let dp = data_path(id);
            let df = s.open_file(&dp, false).ctx("checkpoint data file", || dp.display().to_string())?;
            let mut done = 0u64;
            while done < len {
                let n = ((len - done) as usize).min(1 << 20);
                buf.resize(n, 0);
                journal::read_exact(&*df, foff + done, &mut buf)
                    .ctx("checkpoint data file read", || dp.display().to_string())?;
                s.write_at(path, off + done, &buf).ctx("checkpoint write", what)?;
                done += n as u64;
            }
        }
        s.set_len(path, op.size).ctx("checkpoint set size", what)?;
    }
    for op in plan.attrs.iter().filter(|op| chosen(&op.path)) {
        let path = p(&op.path);
        if gone_stage(path)? {
            continue;
        }
        let what = || path.display().to_string();
        if let Some((uid, gid)) = op.owner {
            let m = s.lstat(path).ctx("checkpoint stat", what)?;
            s.set_owner(path, uid.unwrap_or(m.uid), gid.unwrap_or(m.gid)).ctx("checkpoint chown", what)?;
        }
        if let (Some(m), false) = (op.mode, op.is_symlink) {
            s.set_mode(path, m).ctx("checkpoint chmod", what)?;
        }
        for (k, v) in &op.xattrs {
            let k = OsStr::from_bytes(k);
            match v {
                Some(v) => s.set_xattr(path, k, v).ctx("checkpoint setxattr", what)?,
                None => s.remove_xattr(path, k).ctx("checkpoint removexattr", what)?,
            }
        }
        if let Some((at, mt)) = op.times {
            let m = s.lstat(path).ctx("checkpoint stat", what)?;
            s.set_times(path, at.unwrap_or(m.atime), mt.unwrap_or(m.mtime)).ctx("checkpoint utimes", what)?;
        }
    }
    Ok(())
}

/// Contents written through a stage link must be durable before phase 4
/// removes that link: replay cannot write through it again.
fn sync_stage_writes(s: &dyn Storage, plan: &Plan) -> Result<()> {
    if plan.data.iter().map(|d| &d.path).chain(plan.attrs.iter().map(|a| &a.path)).any(|x| in_stage(x)) {
        s.sync_all().ctx("checkpoint sync", || "phase 3".into())?;
    }
    Ok(())
}

/// Phase 4, then everything the plan wrote becomes durable.
fn delete_and_sync(s: &dyn Storage, plan: &Plan) -> Result<()> {
    for dead in &plan.dead {
        remove_tree(s, p(dead))?;
    }
    s.sync_all().ctx("checkpoint sync", || "phases 2-4".into())?;
    Ok(())
}

fn remove_tree(s: &dyn Storage, path: &Path) -> Result<()> {
    let m = match s.lstat(path) {
        Ok(m) => m,
        Err(e) if is_missing(&e) => return Ok(()),
        Err(e) => return Err(Error::io("checkpoint delete", path.display().to_string(), e)),
    };
    if m.kind == FileKind::Dir {
        for (n, _) in s.read_dir(path).ctx("checkpoint delete", || path.display().to_string())? {
            remove_tree(s, &path.join(n))?;
        }
        s.rmdir(path).ctx("checkpoint rmdir", || path.display().to_string())
    } else {
        s.unlink(path).ctx("checkpoint unlink", || path.display().to_string())
    }
}

/// Creates the next epoch's journal, then retires the plan's epoch.
pub fn finish(s: &dyn Storage, plan: &Plan) -> Result<(Arc<dyn StoredFile>, Epoch, u32)> {
    let r = next_journal(s, plan)?;
    retire(s, plan)?;
    Ok(r)
}

/// Creates (or keeps, with its records) the next epoch's journal; returns
/// it with its nonce.
fn next_journal(s: &dyn Storage, plan: &Plan) -> Result<(Arc<dyn StoredFile>, Epoch, u32)> {
    let next = Epoch(plan.epoch.0 + 1);
    let jp = journal_path(next);
    let mut nonce = journal::new_nonce();
    let recycled =
        matches!(s.lstat(&jp), Err(e) if is_missing(&e)) && recycle_spare(s, &jp, next, plan.last_seq, nonce);
    let f = s.open_file(&jp, true).ctx("journal create", || jp.display().to_string())?;
    if f.len().ctx("journal create", || jp.display().to_string())? < journal::FILE_HEADER_LEN {
        f.set_len(0).ctx("journal create", || jp.display().to_string())?;
        f.write_at(0, &journal::file_header(next, plan.last_seq, nonce))
            .ctx("journal create", || jp.display().to_string())?;
    } else if !recycled {
        // Kept from before a crash (recovery finishing the plan): its own.
        let mut h = [0u8; journal::FILE_HEADER_LEN as usize];
        journal::read_exact(&*f, 0, &mut h).ctx("journal open", || jp.display().to_string())?;
        nonce = journal::header_nonce(&h).ok_or_else(|| Error::Corrupt {
            path: jp.clone(),
            offset: 0,
            detail: "bad journal file header".into(),
        })?;
    }
    f.sync_data().ctx("journal create", || jp.display().to_string())?;
    let jdir = Path::new(META_DIR).join("journal");
    s.fsync(&jdir).ctx("journal create", || jdir.display().to_string())?;
    if recycled {
        // The spare's name must be gone for good before the journal is used.
        s.fsync(Path::new(META_DIR)).ctx("journal create", || META_DIR.into())?;
    }
    Ok((f, next, nonce))
}

/// Removes the plan's journal (kept as the spare if it can be), marker
/// and plan: the checkpoint is over.
fn retire(s: &dyn Storage, plan: &Plan) -> Result<()> {
    keep_as_spare(s, &journal_path(plan.epoch));
    for old in [journal_path(plan.epoch), marker_path(plan.epoch), plan_path(plan.epoch)] {
        match s.unlink(&old) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(Error::io("checkpoint cleanup", old.display().to_string(), e)),
        }
        let parent = old.parent().unwrap_or(Path::new(META_DIR)).to_path_buf();
        s.fsync(&parent).ctx("checkpoint cleanup", || parent.display().to_string())?;
    }
    Ok(())
}

/// Renames a retired journal to the spare, both folders synced. Best
/// effort: on failure `retire` unlinks it as before. (Nothing reads a
/// retired journal: the engine dropped it with the frozen delta.)
fn keep_as_spare(s: &dyn Storage, jp: &Path) {
    let Ok(m) = s.lstat(jp) else { return };
    // Only where space is plenty: the spare may hold at most a fifth of it.
    let kept = m.size.min(SPARE_MAX);
    if m.size < journal::FILE_HEADER_LEN || s.free_bytes().is_ok_and(|f| f.is_some_and(|f| f < 4 * kept)) {
        return;
    }
    let jdir = Path::new(META_DIR).join("journal");
    if s.rename(jp, &spare_path()).is_ok() {
        let _ = s.fsync(&jdir);
        let _ = s.fsync(Path::new(META_DIR));
    }
}

/// Persists a plan: write a temp file, fsync, rename, fsync the folder.
fn persist(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let body = crate::codec::encode_plan(plan);
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
    f.sync_data().ctx("plan write", what)?;
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
    crate::codec::decode_plan(body).ok_or_else(|| corrupt("undecodable plan"))
}

/// Runs a checkpoint; the caller holds the checkpoint lock (one at a time)
/// and not the engine lock. The plan, its namespace phases and the switch
/// to the next journal run under the engine lock; the contents (phase 3),
/// phase 4 and the final sync — the long part — run outside it, with the
/// delta they write kept as [`State::frozen`] so that reads and commits go
/// on meanwhile (DESIGN §4).
pub(crate) fn run(state: &Mutex<State>, sync: &SyncState) -> Result<()> {
    let (plan, journal, released, storage) = {
        let mut st = state.lock();
        if let Some(p) = &st.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        if st.committed.is_empty() {
            // No record in the current journal: nothing can name an orphan.
            let released = std::mem::take(&mut st.released_orphans);
            remove_released_orphans(&mut st, released);
            return Ok(());
        }
        let mut started = false;
        match start(&mut st, sync, &mut started) {
            Ok((plan, journal, released)) => (plan, journal, released, st.storage.clone()),
            Err(e) => {
                if started {
                    // The backing tree may be half-way through the plan;
                    // in-memory locations no longer match it. Recovery
                    // finishes the plan.
                    st.poisoned = Some(format!("checkpoint failed: {e}"));
                }
                return Err(e);
            }
        }
    };
    let res = contents(&*storage, &plan, &*journal, Some(false))
        .and_then(|()| delete_and_sync(&*storage, &plan))
        .and_then(|()| retire(&*storage, &plan));
    let mut st = state.lock();
    if let Err(e) = res {
        st.poisoned = Some(format!("checkpoint failed: {e}"));
        return Err(e);
    }
    st.frozen = None;
    st.tree_gen += 1;
    st.journal_files.remove(&plan.epoch);
    // The retired journal was the last thing naming the epoch's data files
    // (those placed by rename are gone from data/ already). A crash before
    // this leaves them to recovery, which removes what nothing names.
    let retired: Vec<u64> = st
        .data_files
        .iter()
        .filter(|(_, df)| df.owner.is_none() && df.epoch == plan.epoch)
        .map(|(id, _)| *id)
        .collect();
    for id in retired {
        st.data_files.remove(&id);
        match storage.unlink(&data_path(id)) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => {}
            Err(e) => tracing::warn!("{}: {e} (removed at the next start)", data_path(id).display()),
        }
    }
    st.stats.checkpoints += 1;
    // Released orphans: the retired journal was the last thing naming them.
    remove_released_orphans(&mut st, released);
    tracing::debug!(epoch = plan.epoch.0 + 1, "checkpoint done");
    Ok(())
}

/// What a plan may need on the backing file system at most: every data
/// byte it writes, a block per object it creates or moves, its own file and
/// the next journal's header — plus a margin for directory blocks.
fn space_needed(plan: &Plan) -> u64 {
    let journaled = plan.data.iter().flat_map(|d| d.extents.iter()).map(|(_, len, _)| *len);
    let filed = plan.data.iter().flat_map(|d| d.files.iter()).map(|(_, len, _, _)| *len);
    let data: u64 = journaled.chain(filed).map(|len| len.div_ceil(4096) * 4096).sum();
    let objects = (plan.out.len() + plan.place.len() + plan.data.len()) as u64;
    data + objects * 4096 + (1 << 20)
}

/// The part of a checkpoint under the engine lock: plan, phases 1–2, the
/// contents written through stage links, the next journal; then the
/// committed delta becomes `frozen` and commits go to the next journal.
#[allow(clippy::type_complexity)]
fn start(st: &mut State, sync: &SyncState, started: &mut bool) -> Result<(Plan, Arc<dyn StoredFile>, Vec<ObjId>)> {
    // Reads running without the lock must not trust what they read (J1's
    // phases 1 and 2 rename the tree's files under the lock, below).
    st.tree_gen += 1;
    let (plan, upd) = build(st)?;
    let storage = st.storage.clone();
    // Not enough room: fail before the backing tree changes, so nothing is
    // poisoned and the next attempt (once space is freed) simply runs.
    let mut free = storage.free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    if free.is_some_and(|f| f < space_needed(&plan)) {
        // The spare journal and spare data files are the first things to
        // give back.
        drop_spare(&*storage)?;
        st.drop_spares();
        free = storage.free_bytes().ctx("checkpoint", || "statvfs of the backing tree".into())?;
    }
    if let Some(free) = free {
        let need = space_needed(&plan);
        if free < need {
            return Err(Error::io(
                "checkpoint",
                format!("backing file system has {free} bytes free, the checkpoint needs up to {need}"),
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
    }
    // The plan reads extents from the journal: every record it covers must
    // be durable before the plan is (an ordered commit may have slipped in
    // since the caller's sync).
    st.journal.file.sync_data().ctx("journal sync", || st.journal.path.display().to_string())?;
    // From here on a failure may leave the plan half-done.
    *started = true;
    persist(&*storage, &plan)?;
    let jf = st.journal.file.clone();
    namespace(&*storage, &plan)?;
    // A node forgotten below (a file linked under a name never looked up)
    // would be read without `frozen`: its contents are written now.
    contents(&*storage, &plan, &*jf, Some(true))?;
    sync_stage_writes(&*storage, &plan)?;
    let (file, next, nonce) = next_journal(&*storage, &plan)?;
    // The backing tree now holds the plan's names: update locations.
    for o in upd.gone {
        if let Some(n) = st.nodes.get_mut(&o) {
            if let Some(k) = n.ino.take() {
                st.by_ino.remove(&k);
            }
            n.base = None;
            n.gone = true;
        }
    }
    for (o, loc) in upd.moved {
        if let Some(n) = st.nodes.get_mut(&o) {
            // Names the node had that still exist stay known as links.
            if let Some(old) = n.base.take() {
                n.alts.push(old);
            }
            n.alts.retain(|l| *l != loc);
            n.base = Some(loc);
            n.gone = false;
        }
    }
    for n in st.nodes.values_mut() {
        n.alts.retain(|l| !upd.changed_locs.contains(&(l.parent, l.name.clone())));
    }
    for o in upd.new_inos {
        if let Some(pth) = st.base_path(o) {
            if let Ok(m) = storage.lstat(&pth) {
                st.by_ino.insert((m.dev, m.ino), o);
                if let Some(n) = st.nodes.get_mut(&o) {
                    n.ino = Some((m.dev, m.ino));
                }
            }
        }
    }
    for k in upd.spares {
        // The link may not have been allowed (replace_file).
        if let Ok(m) = storage.lstat(&data_path(k)) {
            st.spares.push((k, m.size));
        }
    }
    for o in upd.replaced {
        let Some(m) = st.base_path(o).and_then(|pth| storage.lstat(&pth).ok()) else { continue };
        if let Some(old) = st.nodes.get_mut(&o).and_then(|n| n.ino.replace((m.dev, m.ino))) {
            st.by_ino.remove(&old);
        }
        st.by_ino.insert((m.dev, m.ino), o);
    }
    let released = std::mem::take(&mut st.released_orphans);
    let mut frozen = std::mem::take(&mut st.committed);
    for o in &upd.in_place {
        // Their data file is the tree's file now (renamed in phase 2).
        if let Some(od) = frozen.objs.get_mut(o) {
            od.file = None;
        }
    }
    st.frozen = Some(frozen);
    st.committed_data_bytes = 0;
    st.journal_files.insert(next, file.clone());
    st.journal = JournalWriter {
        epoch: next,
        path: journal_path(next),
        file: file.clone(),
        end: journal::FILE_HEADER_LEN,
        nonce,
    };
    sync.rotate(next, file, journal::FILE_HEADER_LEN);
    Ok((plan, jf, released))
}

/// Unlinks orphans whose last handle closed. Only when no journal record
/// can name them any more (J1); a crash first leaves them to recovery.
fn remove_released_orphans(st: &mut State, released: Vec<ObjId>) {
    if !released.is_empty() {
        st.tree_gen += 1;
    }
    for o in released {
        if let Some(pth) = st.base_path(o) {
            let _ = st.storage.unlink(&pth);
        }
        if let Some(n) = st.nodes.get_mut(&o) {
            n.base = None;
        }
    }
}
