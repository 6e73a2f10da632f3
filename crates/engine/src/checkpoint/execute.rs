//! Executing a plan: phases 1–4 and the switch to the next journal.
//!
//! Every function here works on the storage and a [`Plan`] alone, never on
//! the engine's state, so recovery runs exactly the same code to finish a
//! plan a crash interrupted. Every step is idempotent given the phase
//! marker (J5): phase 1 skips what is already moved, phase 2 what is
//! already placed, phase 3 writes final states. [`finish`] creates the
//! next epoch's journal (recycling the spare when it can: `log::files`)
//! before the old journal, marker and plan go.
//!
//! Tests: `tests/crash.rs` (`failpoint_at_every_storage_op`,
//! `check_after_a_checkpoint_killed_at_every_step_reports_no_damage`),
//! `tests/checkpoint_syncs.rs` (which directories phase 1 syncs).

use super::paths::PathRef;
use super::plan::{marker_path, plan_path, prepare_shadow, MoveOut, Place, Plan};
use crate::delta::NO_CUT;
use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, Epoch};
use crate::log::files::{data_path, is_missing, journal_path, keep_as_spare, recycle_spare, META_DIR};
use crate::log::journal;
use crate::storage::{FileKind, Storage, StoredFile};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

pub(super) fn exists(s: &dyn Storage, path: &Path) -> Result<bool> {
    match s.lstat(path) {
        Ok(_) => Ok(true),
        Err(e) if is_missing(&e) => Ok(false),
        Err(e) => Err(Error::io("stat", path.display().to_string(), e)),
    }
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
/// programs' writes may have filled.
fn sync_moves_out(s: &dyn Storage, plan: &Plan) -> Result<()> {
    const MAX_DIRS: usize = 64;
    let parent = |path: &PathRef| plan.paths.parent(*path);
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
    if dirs.len() <= MAX_DIRS && dirs.iter().all(|d| s.fsync(&plan.path(*d)).is_ok()) {
        return Ok(());
    }
    s.sync_all().ctx("checkpoint sync", || "phase 1".into())
}

/// `fsync` of each folder, or `syncfs` if one cannot be (gone).
fn sync_dirs(s: &dyn Storage, plan: &Plan, dirs: &std::collections::BTreeSet<PathRef>, what: &str) -> Result<()> {
    if dirs.iter().all(|d| s.fsync(&plan.path(*d)).is_ok()) {
        return Ok(());
    }
    s.sync_all().ctx("checkpoint sync", || what.into())
}

/// Which of a plan's paths are in the stage folder.
fn in_stage(plan: &Plan) -> impl Fn(PathRef) -> bool + '_ {
    let stage = plan.paths.find(&Path::new(META_DIR).join("stage"));
    move |r| stage.is_some_and(|st| plan.paths.is_within(r, st))
}

/// Phase 1, the marker, phase 2: every name the plan changes.
pub(super) fn namespace(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let marker = marker_path(plan.epoch);
    if !exists(s, &marker)? {
        // Folders above the moves since the last sync, and the folders
        // those moves changed.
        let mut above_moved: HashSet<PathRef> = HashSet::new();
        let mut dirty = std::collections::BTreeSet::new();
        for m in &plan.out {
            let (MoveOut::Stage { from: from_ref, .. } | MoveOut::Unlink { from: from_ref }) = m;
            // Deepest first: an entry is moved out before the folder that
            // holds it. Those inner moves are made durable before the outer
            // one: a file system that does not order metadata could keep
            // the folder's move and lose them, and the replay would find
            // neither the entry's old name nor its stage name.
            if above_moved.contains(from_ref) {
                sync_dirs(s, plan, &dirty, "phase 1")?;
                (above_moved, dirty) = (HashSet::new(), Default::default());
            }
            let mut up = plan.paths.parent(*from_ref);
            while up != PathRef::ROOT && above_moved.insert(up) {
                up = plan.paths.parent(up);
            }
            dirty.insert(plan.paths.parent(*from_ref));
            if let MoveOut::Stage { stage, .. } = m {
                dirty.insert(plan.paths.parent(*stage));
            }
            let from = &plan.path(*from_ref);
            match m {
                MoveOut::Stage { stage, .. } => {
                    let stage = &plan.path(*stage);
                    if exists(s, stage)? {
                        if exists(s, from)? {
                            s.unlink(from).ctx("checkpoint unlink", || from.display().to_string())?;
                        }
                        continue;
                    }
                    match s.rename(from, stage) {
                        Ok(()) => {}
                        Err(e) if is_missing(&e) => {
                            return Err(Error::Corrupt {
                                path: plan_path(plan.epoch),
                                offset: 0,
                                detail: format!("{} vanished before phase 1 moved it", from.display()),
                            })
                        }
                        Err(e) => return Err(Error::io("checkpoint move", from.display().to_string(), e)),
                    }
                }
                MoveOut::Unlink { .. } => match s.unlink(from) {
                    Ok(()) => {}
                    Err(e) if is_missing(&e) => {}
                    Err(e) => return Err(Error::io("checkpoint unlink", from.display().to_string(), e)),
                },
            }
        }
        sync_moves_out(s, plan)?;
        s.create_file(&marker, 0o600).ctx("checkpoint marker", || marker.display().to_string())?;
        s.fsync(Path::new(META_DIR)).ctx("checkpoint marker", || META_DIR.into())?;
    }
    // Folders phase 2 made whose names are not yet durable.
    let mut made: Vec<PathRef> = Vec::new();
    let corrupt = |detail: String| Error::Corrupt { path: plan_path(plan.epoch), offset: 0, detail };
    for pl in &plan.place {
        match pl {
            Place::Rename { stage, to: to_ref } => {
                // A rename moves an object that has no other name: the
                // folder it goes into must not be lost (a `mkdir` of this
                // phase whose parent was not synced), or the object would
                // be lost with it and the replay would find neither name.
                if made.iter().any(|d| plan.paths.is_within(*to_ref, *d)) {
                    let parents = made.iter().map(|d| plan.paths.parent(*d)).collect();
                    sync_dirs(s, plan, &parents, "phase 2")?;
                    made.clear();
                }
                let (stage, to) = (&plan.path(*stage), &plan.path(*to_ref));
                if exists(s, stage)? {
                    s.rename(stage, to).ctx("checkpoint place", || to.display().to_string())?;
                } else if !exists(s, to)? {
                    return Err(corrupt(format!("neither {} nor {} exists", stage.display(), to.display())));
                }
            }
            Place::Replace { data, to, size, keep } => {
                let (data, to) = (&plan.path(*data), &plan.path(*to));
                if exists(s, data)? {
                    replace_file(s, data, to, *size, keep.map(|k| plan.path(k)).as_deref())?;
                } else if !exists(s, to)? {
                    return Err(corrupt(format!("neither {} nor {} exists", data.display(), to.display())));
                }
            }
            Place::File { to } => {
                let to = &plan.path(*to);
                s.create_file(to, 0o600).ctx("checkpoint create", || to.display().to_string())?
            }
            Place::Dir { to: to_ref } => {
                let to = &plan.path(*to_ref);
                if !exists(s, to)? {
                    s.mkdir(to, 0o700).ctx("checkpoint mkdir", || to.display().to_string())?;
                    made.push(*to_ref);
                }
            }
            Place::Symlink { to, target } => {
                let to = &plan.path(*to);
                if !exists(s, to)? {
                    s.symlink(OsStr::from_bytes(target), to).ctx("checkpoint symlink", || to.display().to_string())?;
                }
            }
            Place::Special { to, kind, rdev } => {
                let to = &plan.path(*to);
                if !exists(s, to)? {
                    s.mknod(to, *kind, 0o600, *rdev).ctx("checkpoint mknod", || to.display().to_string())?;
                }
            }
            Place::Link { existing, to } => {
                let (existing, to) = (&plan.path(*existing), &plan.path(*to));
                let what = || to.display().to_string();
                // A link left by a crashed run whose first name was lost
                // (and made again, a new object): it names the old inode.
                let stale = match s.lstat(to) {
                    Ok(m) => m.ino != s.lstat(existing).ctx("checkpoint link", what)?.ino,
                    Err(e) if is_missing(&e) => true,
                    Err(e) => return Err(Error::io("checkpoint link", what(), e)),
                };
                if stale {
                    if exists(s, to)? {
                        s.unlink(to).ctx("checkpoint link", what)?;
                    }
                    s.link(existing, to).ctx("checkpoint link", what)?;
                }
            }
        }
    }
    Ok(())
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
pub(super) fn contents(s: &dyn Storage, plan: &Plan, journal: &dyn StoredFile, stage: Option<bool>) -> Result<()> {
    let in_stage = in_stage(plan);
    let chosen = |path: PathRef| stage.is_none_or(|want| in_stage(path) == want);
    // A staged object's stage link is gone once phase 4 ran: on replay
    // there is nothing left to write through it.
    let gone_stage = |r: PathRef, path: &Path| -> Result<bool> { Ok(in_stage(r) && !exists(s, path)?) };
    let mut buf = Vec::new();
    for op in plan.data.iter().filter(|op| chosen(op.path)) {
        let path = &plan.path(op.path);
        if gone_stage(op.path, path)? {
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
            let dp = data_path(DataFileId(id));
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
    for op in plan.attrs.iter().filter(|op| chosen(op.path)) {
        let path = &plan.path(op.path);
        if gone_stage(op.path, path)? {
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
        // Removals first: the final set is what the engine checked fits
        // the backing (`Storage::probe_xattrs`); a set applied before a
        // removal that makes room for it could still meet ENOSPC.
        for (k, _) in op.xattrs.iter().filter(|(_, v)| v.is_none()) {
            s.remove_xattr(path, OsStr::from_bytes(k)).ctx("checkpoint removexattr", what)?;
        }
        for (k, v) in &op.xattrs {
            if let Some(v) = v {
                s.set_xattr(path, OsStr::from_bytes(k), v).ctx("checkpoint setxattr", what)?;
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
pub(super) fn sync_stage_writes(s: &dyn Storage, plan: &Plan) -> Result<()> {
    let in_stage = in_stage(plan);
    if plan.data.iter().map(|d| d.path).chain(plan.attrs.iter().map(|a| a.path)).any(in_stage) {
        s.sync_all().ctx("checkpoint sync", || "phase 3".into())?;
    }
    Ok(())
}

/// Phase 4, then everything the plan wrote becomes durable.
pub(super) fn delete_and_sync(s: &dyn Storage, plan: &Plan) -> Result<()> {
    for dead in &plan.dead {
        remove_tree(s, &plan.path(*dead))?;
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
pub(super) fn next_journal(s: &dyn Storage, plan: &Plan) -> Result<(Arc<dyn StoredFile>, Epoch, u32)> {
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
pub(super) fn retire(s: &dyn Storage, plan: &Plan) -> Result<()> {
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
