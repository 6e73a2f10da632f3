//! Commit and abort: the end of a transaction.
//!
//! [`Engine::commit_changes`] syncs the transaction's data files without
//! the lock, waits for its writes still copying into them, then
//! [`commit_locked`] does the rest under one lock hold:
//! 1. validate the read set against the stamps (I3); stale: Conflict;
//! 2. drop what nobody can observe (objects created and removed again);
//! 3. encode the delta as a [`CommitRecord`] ([`encode`]) and append it to
//!    the journal (J2): from here the commit is in the commit order;
//! 4. point the delta's extents at the journal, compose it into the
//!    committed delta, stamp every changed item with the new seq (I2).
//!
//! A durable commit then waits, outside the lock, for a sync that started
//! after its append (J4, `log::group_commit`). A commit that cannot be
//! journaled (ENOSPC) fails whole and changes nothing.
//!
//! Tests: `tests/isolation.rs` (`commit_makes_everything_visible_at_once`,
//! `abort_leaves_no_trace`, `created_and_deleted_file_costs_no_journal_bytes`),
//! `tests/crash.rs` (`power_cuts_leave_a_durable_prefix`),
//! `tests/limits.rs` (`a_commit_that_does_not_fit_fails_whole_with_enospc`).

use super::api::Durability;
use super::isolation::PAGE;
use super::state::{State, Tx};
use super::Engine;

use crate::delta::{DataLoc, Delta, SizeDelta, NO_CUT};
use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, Lsn, ObjId, Seq, TxId};
use crate::log::files::{data_path, DataFile, META_DIR};
use crate::log::journal::{self, JournalWriter, SyncState};
use crate::storage::{FileKind, Storage, StoredFile};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;

use crate::log::record::{CommitRecord, FileRef, ObjRef, RecAttr, RecDir, RecFile, RecNew, RecObj, PATH_ROOT};
impl Engine {
    /// Commits `tx`. On [`Error::Conflict`] the transaction is gone and
    /// nothing of it survives: retry it from the start.
    pub fn commit(&self, tx: TxId, durability: Durability) -> Result<()> {
        self.commit_changes(tx, durability).map(|_| ())
    }

    /// [`Engine::commit`], returning the files whose content the commit
    /// changed (the mount invalidates their kernel page cache).
    pub fn commit_changes(&self, tx: TxId, durability: Durability) -> Result<Vec<ObjId>> {
        // Data files are synced before the record that names them is
        // written; outside the lock, so other operations go on meanwhile.
        // A write that lands after this marks the file dirty again and
        // commit_locked syncs it under the lock.
        let (unsynced, storage) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let storage = st.storage().clone();
            match st.txs.get_mut(&tx) {
                Some(t) if t.doomed.is_none() => (take_unsynced(&st.data_files, t), storage),
                _ => (Vec::new(), storage),
            }
        };
        if let Err(e) = sync_data_files(&*storage, &unsynced) {
            let mut st = self.lock();
            if let Some(mut t) = st.txs.remove(&tx) {
                st.discard_tx(&mut t);
                st.stats.aborts += 1;
                st.stats.live_txs = st.txs.len() as u64;
                self.shared.copied.notify_all();
            }
            return Err(e);
        }
        let (pos, changed) = {
            // Writes of this transaction still copying into its data files
            // finish first (`Tx::inflight`); the last one to end wakes us.
            let mut st = self.lock();
            // Not for a doomed one: its commit fails anyway, and a write
            // whose reservation failed the cap never copies (nor ends).
            while let Some(t) = st.txs.get_mut(&tx).filter(|t| t.inflight > 0 && t.doomed.is_none()) {
                t.committing = true;
                self.shared.copied.wait(&mut st);
            }
            let mut t = st.txs.remove(&tx).ok_or(Error::NoSuchTx(tx))?;
            st.stats.live_txs = st.txs.len() as u64;
            self.shared.copied.notify_all();
            if let Some(p) = st.poisoned() {
                st.discard_tx(&mut t);
                return Err(Error::Poisoned(p));
            }
            let r = commit_locked(&mut st, &self.shared.sync, t, durability == Durability::Durable);
            if let Err(Error::Conflict { .. }) = &r {
                st.stats.conflicts += 1;
                st.stats.aborts += 1;
            }
            if st.txs.is_empty() {
                st.ver.prune_all();
            }
            super::budget::unlock(st);
            r?
        };
        if durability == Durability::Durable {
            self.shared.sync.wait_durable(pos)?;
        }
        self.maybe_checkpoint();
        Ok(changed)
    }

    pub fn abort(&self, tx: TxId) -> Result<()> {
        let mut st = self.lock();
        let mut t = st.txs.remove(&tx).ok_or(Error::NoSuchTx(tx))?;
        self.shared.copied.notify_all();
        st.discard_tx(&mut t);
        st.stats.aborts += 1;
        st.stats.live_txs = st.txs.len() as u64;
        if st.txs.is_empty() {
            st.ver.prune_all();
        }
        st.bury(t);
        super::budget::unlock(st);
        Ok(())
    }
}

/// Validates, journals and publishes one transaction (I3, J2). Called with
/// the lock held; returns the journal position to wait for if durable.
///
/// The record names the transaction's data files (synced first, ordered
/// commits too: their bytes are written once) instead of carrying them.
/// `sync_follows`: the caller waits for this record's durability at once.
pub(super) fn commit_locked(
    st: &mut State,
    sync: &SyncState,
    mut tx: Tx,
    sync_follows: bool,
) -> Result<(Lsn, Vec<ObjId>)> {
    let r = validate_and_publish(st, sync, &mut tx, sync_follows);
    if r.is_err() {
        // Every failure gives back what the transaction held (most paths
        // did already; an encoding error did not).
        st.discard_tx(&mut tx);
    }
    st.bury(tx);
    r
}

fn validate_and_publish(
    st: &mut State,
    sync: &SyncState,
    tx: &mut Tx,
    sync_follows: bool,
) -> Result<(Lsn, Vec<ObjId>)> {
    if let Some(d) = tx.doomed.take() {
        st.discard_tx(tx);
        return Err(d.error(tx.id));
    }
    if let Some(what) = tx.reads.first_stale(&st.ver, tx.start) {
        st.discard_tx(tx);
        return Err(Error::Conflict { tx: tx.id, what });
    }
    drop_unreachable_new(st, &mut tx.delta, &tx.explicit);
    if tx.delta.is_empty() {
        st.discard_tx(tx);
        return Ok((*sync.written.lock(), Vec::new()));
    }
    // Bytes written to data files since the caller synced them (or every
    // byte, for a commit that did not go through commit_changes).
    let unsynced = take_unsynced(&st.data_files, tx);
    if let Err(e) = sync_data_files(&**st.storage(), &unsynced) {
        st.discard_tx(tx);
        st.stats.aborts += 1;
        return Err(e);
    }
    let changed: Vec<ObjId> = tx.delta.objs.iter().filter(|(_, od)| od.file.is_some()).map(|(o, _)| *o).collect();
    let seq = Seq(st.seq.0 + 1);
    // Sizes before this commit, for stamping truncated pages.
    // Sizes before this commit: truncated pages are stamped up to the old
    // size, and only a size that changes stamps the metadata (a write
    // inside the file does not conflict with a transaction that looked the
    // file up).
    let mut old_sizes = HashMap::new();
    for (o, od) in &tx.delta.objs {
        if od.file.is_some() {
            if let Ok(a) = st.attr_unrecorded(None, *o) {
                old_sizes.insert(*o, a.size);
            }
        }
    }
    let (mut rec, extents) = encode(st, &tx.delta)?;
    // Each data-file range the record names gets its crc32c, verified by
    // recovery and `txfs check` (journal.md, "Data files"): read back from
    // the page cache, just synced.
    match crate::log::files::range_crcs(&**st.storage(), &rec.files) {
        Ok(c) => rec.crcs = c,
        Err(e) => {
            st.discard_tx(tx);
            st.stats.aborts += 1;
            return Err(e);
        }
    }
    let (meta, version) = rec.encode().map_err(|e| Error::Poisoned(format!("record encoding: {e}")))?;
    let data_len: u64 = extents.iter().map(|(_, _, l, _)| *l).sum();
    let durable_upto = {
        let s = sync.synced();
        if s.epoch == st.journal.epoch {
            s.off
        } else {
            0
        }
    };
    let appended = {
        let st_ref: &State = st;
        let mut fill = |sink: &mut journal::DataSink<'_>| -> Result<()> {
            let mut buf = Vec::new();
            for (_, _, len, loc) in &extents {
                // Bytes in memory go to the sink as they are (no zeroed
                // buffer, no copy: a plain 512 KiB WRITE spent 6% of the
                // daemon's time in those).
                if let DataLoc::Mem(b, s) = loc {
                    let bytes = b
                        .get(*s..*s + *len as usize)
                        .ok_or_else(|| std::io::Error::other("memory extent out of range"))
                        .ctx("commit", || "reading transaction data".into())?;
                    sink.put(bytes)?;
                    continue;
                }
                let mut done = 0u64;
                while done < *len {
                    let n = ((*len - done) as usize).min(1 << 20);
                    buf.resize(n, 0);
                    st_ref.fetch(&loc.advance(done), &mut buf).ctx("commit", || "reading transaction data".into())?;
                    sink.put(&buf)?;
                    done += n as u64;
                }
            }
            Ok(())
        };
        let mut j = placeholder_writer(st_ref);
        let r = j.append(seq, durable_upto, version, &meta, data_len, sync_follows, &mut fill);
        let end = j.end;
        st.journal.end = end;
        r
    };
    let appended = match appended {
        Ok(a) => a,
        Err(e) => {
            st.discard_tx(tx);
            st.stats.aborts += 1;
            if matches!(e.errno(), libc::ENOSPC | libc::EDQUOT) {
                // The spare journal's and spare data files' space goes back
                // to the file system: this commit failed whole, a retry may fit.
                let _ = crate::log::files::drop_spare(&*st.storage);
                st.drop_spares();
            } else if e.errno() != libc::EFBIG {
                // Anything but "no room" (EIO above all): what the journal
                // holds is no longer known, so nothing more is acknowledged
                // until recovery reads it back (the one poison latch).
                st.poison_journal(format!("journal write: {e}"));
            }
            return Err(e);
        }
    };
    // The data files the record names now belong to the committed state.
    for id in rec.files.iter().map(|f| DataFileId(f.file)).collect::<std::collections::BTreeSet<_>>() {
        if let Some(df) = st.data_files.get_mut(&id) {
            if df.owner.take().is_some() {
                st.committed_data_bytes += df.len;
                df.file = None;
                df.epoch = st.journal.epoch;
            }
        }
    }
    // Point the delta's extents at the journal, then publish.
    // `extents` lists them object by object, each in offset order, every
    // extent of the object that is not in a data file: as `to_journal`
    // walks them.
    let epoch = st.journal.epoch;
    let mut data_off = appended.data_start;
    let mut last = None;
    for (o, _, len, _) in &extents {
        if last != Some(*o) {
            last = Some(*o);
            if let Some(f) = tx.delta.objs.get_mut(o).and_then(|od| od.file.as_mut()) {
                let end = f.ext.to_journal(epoch, data_off);
                debug_assert_eq!(
                    end - data_off,
                    extents.iter().filter(|(p, ..)| p == o).map(|(_, _, l, _)| *l).sum::<u64>()
                );
            }
        }
        data_off += len;
    }
    stamp(st, &tx.delta, seq, &old_sizes);
    let floor = st.txs.values().map(|t| t.start).min();
    st.ver.maybe_prune(floor);
    st.committed.compose_owned(std::mem::take(&mut tx.delta));
    for (o, old) in &old_sizes {
        if st.attr_unrecorded(None, *o).map(|a| a.size).ok() != Some(*old) {
            st.ver.metas.insert(*o, seq);
        }
    }
    st.seq = seq;
    st.discard_tx(tx);
    st.stats.commits += 1;
    let pos = Lsn { epoch, off: appended.end };
    *sync.written.lock() = pos;
    Ok((pos, changed))
}

/// Objects created and removed again inside one transaction, and not
/// open, leave no trace: no journal bytes, no durable I/O (SPEC §5);
/// changes to objects that are gone cannot be observed by anyone.
fn drop_unreachable_new(st: &mut State, d: &mut Delta, explicit: &std::collections::HashSet<ObjId>) {
    let linked: std::collections::HashSet<ObjId> =
        d.dirs.values().flat_map(|e| e.values().flatten().copied()).collect();
    let dead: Vec<ObjId> = d
        .created
        .keys()
        .filter(|o| !linked.contains(o) && st.nodes.get(o).is_none_or(|n| n.open == 0))
        .copied()
        .collect();
    for o in dead {
        d.created.remove(&o);
        d.objs.remove(&o);
        d.dirs.remove(&o);
        d.parents.remove(&o);
    }
    // Objects removed and checkpointed since the transaction touched them.
    d.objs.retain(|o, _| st.nodes.get(o).is_some_and(|n| !n.gone));
    // Names removed that the committed state never had (a file created and
    // unlinked inside the transaction), then directories whose only change
    // left is the times those namespace changes bumped: the transaction
    // changed nothing there, and costs no journal write and no fdatasync
    // (SPEC §5). Times the transaction set itself stay.
    let dirs: Vec<ObjId> = d.dirs.keys().copied().collect();
    for dir in dirs {
        let gone: Vec<OsString> = d.dirs[&dir].iter().filter(|(_, e)| e.is_none()).map(|(n, _)| n.clone()).collect();
        for name in gone {
            let existed = match st.committed.entry(dir, &name) {
                Some(e) => e.is_some(),
                None if d.created.contains_key(&dir) || st.committed.created.contains_key(&dir) => false,
                // An unreadable backing tree: keep the removal.
                None => st.base_child(dir, &name).map_or(true, |c| c.is_some()),
            };
            if !existed {
                d.dirs.get_mut(&dir).expect("listed").remove(&name);
            }
        }
        if !d.dirs[&dir].is_empty() {
            continue;
        }
        d.dirs.remove(&dir);
        let times_only = d.objs.get(&dir).is_some_and(|od| {
            let a = &od.attr;
            od.file.is_none()
                && a.mode.is_none()
                && a.uid.is_none()
                && a.gid.is_none()
                && a.nlink == 0
                && a.xattrs.is_empty()
        });
        if times_only && !explicit.contains(&dir) && !d.created.contains_key(&dir) {
            d.objs.remove(&dir);
        }
    }
}

fn placeholder_writer(st: &State) -> JournalWriter {
    JournalWriter {
        epoch: st.journal.epoch,
        path: st.journal.path.clone(),
        file: st.journal.file.clone(),
        end: st.journal.end,
        nonce: st.journal.nonce,
    }
}

/// Stamps every item `delta` changes with `seq` (I2).
pub(super) fn stamp(st: &mut State, delta: &Delta, seq: Seq, old_sizes: &HashMap<ObjId, u64>) {
    for (o, od) in &delta.objs {
        if let Some(f) = &od.file {
            let r = st.ver.pages.entry(*o).or_default();
            let before = r.len();
            // Extents that share or touch pages are one stamp: the same
            // pages get the same seq, and a million one-byte writes cost a
            // few stamps instead of a million.
            let mut run: Option<(u64, u64)> = None;
            for (off, e) in f.ext.iter() {
                let (p0, p1) = (off / PAGE, (off + e.len).div_ceil(PAGE));
                match &mut run {
                    Some((_, end)) if p0 <= *end => *end = (*end).max(p1),
                    _ => {
                        if let Some((s, end)) = run.replace((p0, p1)) {
                            r.stamp(s, end, seq);
                        }
                    }
                }
            }
            if let Some((s, end)) = run {
                r.stamp(s, end, seq);
            }
            if f.cut != NO_CUT {
                let old = old_sizes.get(o).copied().unwrap_or(u64::MAX / 2);
                r.stamp(f.cut / PAGE, old.max(f.cut).div_ceil(PAGE) + 1, seq);
            }
            let after = r.len();
            st.ver.page_ranges = (st.ver.page_ranges + after).saturating_sub(before);
        }
        let a = &od.attr;
        // A directory's link count changes with every mkdir/rmdir in it; it
        // is not validated, or creating different names in one directory
        // would conflict (SPEC §3). A file's link count is.
        // A directory's own count drops by 2 only when it is removed: that is
        // stamped, so a transaction adding names to it cannot commit.
        let links = match st.nodes.get(o).map(|n| n.kind) {
            Some(FileKind::Dir) => a.nlink <= -2,
            _ => a.nlink != 0,
        };
        if a.mode.is_some() || a.uid.is_some() || a.gid.is_some() || links || !a.xattrs.is_empty() {
            st.ver.metas.insert(*o, seq);
        }
    }
    for (d, entries) in &delta.dirs {
        for n in entries.keys() {
            st.ver.names.insert((*d, n.clone()), seq);
        }
        st.ver.lists.insert(*d, seq);
    }
    for o in delta.parents.keys() {
        st.ver.metas.insert(*o, seq);
    }
}

/// The data files of `tx` that hold bytes not yet synced, marking them
/// synced: the caller syncs them before the commit record is written.
fn take_unsynced(data_files: &HashMap<DataFileId, DataFile>, tx: &mut Tx) -> Vec<(DataFileId, Arc<dyn StoredFile>)> {
    if !std::mem::take(&mut tx.data_dirty) {
        return Vec::new();
    }
    let files = tx.data_file_ids().filter_map(|id| data_files.get(&id).and_then(|d| d.file.clone()).map(|f| (id, f)));
    files.collect()
}

/// Makes the data files' bytes durable, and their names: a data file is
/// created (or, a spare, linked by a checkpoint) in `.txfs/data/` by a
/// namespace operation that only an fsync of that folder makes durable on
/// a file system that does not order metadata (journal.md, "Data files").
/// Without it a power cut could keep the record and lose the file it names.
fn sync_data_files(s: &dyn Storage, files: &[(DataFileId, Arc<dyn StoredFile>)]) -> Result<()> {
    for (id, f) in files {
        f.sync_data().ctx("commit", || format!("syncing {}", data_path(*id).display()))?;
    }
    if !files.is_empty() {
        let dir = std::path::Path::new(META_DIR).join("data");
        s.fsync(&dir).ctx("commit", || format!("syncing {}", dir.display()))?;
    }
    Ok(())
}

/// Encodes a delta as a commit record; returns the record and the extents
/// whose bytes form its data part, in order. Extents in data files are
/// named by the record (`files`, synced by the caller), not copied.
#[allow(clippy::type_complexity)]
pub(crate) fn encode(st: &State, d: &Delta) -> Result<(CommitRecord, Vec<(ObjId, u64, u64, DataLoc)>)> {
    // Base objects by entries of the record's path table, each entry
    // made once, from its parent's.
    let mut paths: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut entries: HashMap<ObjId, u32> = HashMap::new();
    let mut r = |o: ObjId| -> Result<ObjRef> {
        let n = st.nodes.get(&o).ok_or(Error::Stale(o))?;
        if n.gone {
            return Err(Error::Stale(o));
        }
        if o == ObjId::ROOT {
            // The empty path: no entry (a record of root entries alone
            // has the bytes of every earlier build).
            Ok(ObjRef::Base(Vec::new()))
        } else if n.base.is_some() && !st.committed.created.contains_key(&o) && !d.created.contains_key(&o) {
            Ok(ObjRef::Path(base_entry(st, o, &mut paths, &mut entries)?))
        } else {
            Ok(ObjRef::New(o.0))
        }
    };
    let mut rec = CommitRecord::default();
    let mut created: Vec<_> = d.created.iter().collect();
    created.sort_by_key(|(o, _)| **o);
    for (o, n) in created {
        rec.created.push(RecNew {
            id: o.0,
            kind: n.kind,
            target: n.target.clone().map(|t| t.into_vec()),
            rdev: n.rdev,
        });
    }
    let mut dirs: Vec<_> = d.dirs.iter().collect();
    dirs.sort_by_key(|(o, _)| **o);
    for (dir, entries) in dirs {
        let mut es = Vec::new();
        for (name, e) in entries {
            es.push((name.as_bytes().to_vec(), e.map(&mut r).transpose()?));
        }
        rec.dirs.push(RecDir { dir: r(*dir)?, entries: es });
    }
    let mut extents = Vec::new();
    let mut data_off = 0u64;
    let mut objs: Vec<_> = d.objs.iter().collect();
    objs.sort_by_key(|(o, _)| **o);
    for (o, od) in objs {
        if st.nodes.get(o).is_none_or(|n| n.gone) {
            // Removed and checkpointed since: nothing can observe it.
            continue;
        }
        let a = &od.attr;
        let attr = RecAttr {
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            nlink: a.nlink,
            xattrs: a.xattrs.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.clone())).collect(),
        };
        let index = rec.objs.len() as u32;
        let file = od.file.as_ref().map(|f| {
            let mut ex = Vec::new();
            for (off, e) in f.ext.iter() {
                if let DataLoc::File(file, file_off) = e.loc {
                    rec.files.push(FileRef { obj: index, off, len: e.len, file: file.0, file_off });
                    continue;
                }
                ex.push((off, e.len, data_off));
                extents.push((*o, off, e.len, e.loc.clone()));
                data_off += e.len;
            }
            let (exact, size) = match f.size {
                SizeDelta::Exactly(s) => (true, s),
                SizeDelta::AtLeast(s) => (false, s),
            };
            RecFile { cut: f.cut, exact, size, extents: ex }
        });
        rec.objs.push(RecObj { obj: r(*o)?, attr, file });
    }
    rec.paths = paths;
    // Directory parents are implied by the entries that name them.
    Ok((rec, extents))
}

/// The entry of base object `o` in a record's path table, adding it and
/// the entries of its parents the table does not have yet.
fn base_entry(st: &State, o: ObjId, paths: &mut Vec<(u32, Vec<u8>)>, entries: &mut HashMap<ObjId, u32>) -> Result<u32> {
    let mut chain = Vec::new();
    let mut cur = o;
    let mut top = PATH_ROOT;
    while cur != ObjId::ROOT {
        if let Some(i) = entries.get(&cur) {
            top = *i;
            break;
        }
        // Only a cycle gets this far (as `State::base_path`).
        if chain.len() > crate::txn::state::MAX_DEPTH {
            return Err(Error::Stale(o));
        }
        let loc = st.nodes.get(&cur).and_then(|n| n.base.as_ref()).ok_or(Error::Stale(o))?;
        chain.push((cur, loc.name.as_bytes()));
        cur = loc.parent;
    }
    for (obj, name) in chain.into_iter().rev() {
        paths.push((top, name.to_vec()));
        top = (paths.len() - 1) as u32;
        entries.insert(obj, top);
    }
    Ok(top)
}
