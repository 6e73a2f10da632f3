//! Recovery: finish an interrupted checkpoint, load the journal, and turn
//! commit records back into the committed delta.
//!
//! ```text
//!  1. create .txfs/{journal,stage,orphans,data} if missing; delete the
//!     spare journal
//!  2. a plan file exists      -> execute it again (J5) and finish it
//!  3. remove spill/ (older versions' private data: no trace); orphans/ is
//!     emptied after the checkpoint of step 4, since the journal may still
//!     name its files
//!  4. exactly one journal file -> scan it (J3), cut a torn tail, and
//!     compose every whole record into the committed delta
//!  5. remove every data file no record names (private data of
//!     transactions that never committed, or retired by a checkpoint)
//! ```
//! `Engine::open` then checkpoints, so after recovery the backing tree
//! holds the committed state as plain files. Every step only reads, or
//! repeats idempotent work, so a crash during recovery is recovered again.
//!
//! Records become a delta again here ([`decode`]); the transaction layer
//! wrote them (`txn::commit::encode`). Recovery builds the engine's
//! `State` and runs the checkpoint's own plan executor, so it depends on
//! `txn::state`, `checkpoint` and `log`, and only the engine facade calls it.
//! [`check`] is the read-only twin behind `txfs check`.
//!
//! Tests: `tests/crash.rs` (`crash_during_recovery_is_recovered_again`,
//! `journal_damage_is_reported_and_torn_tail_is_cut` for J3,
//! `first_open_killed_at_every_step`), `tests/journal_recycle.rs`.

use crate::checkpoint;
use crate::delta::{AttrDelta, DataLoc, Delta, FileDelta, NewObj, SizeDelta};
use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, Epoch, ObjId, Seq};
use crate::log::files::{self, data_path, is_missing, journal_path, META_DIR};
use crate::log::journal::{self, JournalWriter};
use crate::log::mark;
use crate::log::record::{CommitRecord, FileRef, ObjRef, PATH_ROOT};
use crate::storage::{FileKind, Storage};
use crate::txn::api::Options;
use crate::txn::state::State;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;

fn ensure_dir(s: &dyn Storage, p: &Path) -> Result<()> {
    match s.lstat(p) {
        Ok(m) if m.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(Error::posix("init", format!("{} exists and is not a directory", p.display()), libc::ENOTDIR)),
        Err(e) if is_missing(&e) => s.mkdir(p, 0o700).ctx("init", || p.display().to_string()),
        Err(e) => Err(Error::io("init", p.display().to_string(), e)),
    }
}

fn clear_dir(s: &dyn Storage, p: &Path) -> Result<()> {
    for (n, k) in s.read_dir(p).ctx("recovery cleanup", || p.display().to_string())? {
        let c = p.join(&n);
        if k == FileKind::Dir {
            clear_dir(s, &c)?;
            s.rmdir(&c).ctx("recovery cleanup", || c.display().to_string())?;
        } else {
            s.unlink(&c).ctx("recovery cleanup", || c.display().to_string())?;
        }
    }
    Ok(())
}

/// Removes files that were unlinked while open (none is open after a restart).
pub(crate) fn clear_orphans(st: &State) -> Result<()> {
    let p = Path::new(META_DIR).join("orphans");
    clear_dir(&**st.storage(), &p)?;
    st.storage().fsync(&p).ctx("recovery cleanup", || p.display().to_string())
}

fn parse_hex(n: &OsStr, prefix: &str, suffix: &str) -> Option<u64> {
    let s = n.to_str()?;
    let h = s.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if h.len() != 16 {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// Brings the backing store to a consistent state and builds the engine state.
pub(crate) fn recover(storage: Arc<dyn Storage>, opts: &Options) -> Result<State> {
    let s = &*storage;
    let meta = Path::new(META_DIR);
    ensure_dir(s, meta)?;
    for sub in ["journal", "stage", "orphans", "data"] {
        ensure_dir(s, &meta.join(sub))?;
    }
    // Every commit depends on these names. Whoever made them (this open,
    // an earlier one killed before its syncs, or `txfs mount` locking the
    // backing), they are made durable before anything is acknowledged: on
    // every open, two directory fsyncs.
    s.fsync(meta).ctx("init", || META_DIR.into())?;
    s.fsync(Path::new("")).ctx("init", || "backing root".into())?;
    // A spare journal is never trusted after a crash: a rename cut short can
    // leave it a second name of the live journal (journal.rs, "Recycled
    // journals").
    files::drop_spare(s)?;
    mark::drop_tmp(s)?;
    // 2. Interrupted checkpoint.
    let mut plans: Vec<u64> = Vec::new();
    for (n, _) in s.read_dir(meta).ctx("recovery", || META_DIR.into())? {
        if let Some(e) = parse_hex(&n, "ckpt-", ".plan") {
            plans.push(e);
        }
    }
    plans.sort();
    if plans.len() > 1 {
        return Err(Error::Corrupt {
            path: meta.into(),
            offset: 0,
            detail: format!("{} checkpoint plans", plans.len()),
        });
    }
    if let Some(&e) = plans.first() {
        let plan = checkpoint::load(s, &checkpoint::plan_path(Epoch(e)))?;
        tracing::info!(epoch = e, "finishing an interrupted checkpoint");
        match s.open_file(&journal_path(Epoch(e)), false) {
            Ok(jf) => checkpoint::execute(s, &plan, &*jf)?,
            // The journal is removed only after the plan ran completely.
            Err(err) if is_missing(&err) => {}
            Err(err) => return Err(Error::io("recovery", journal_path(Epoch(e)).display().to_string(), err)),
        }
        checkpoint::finish(s, &plan)?;
    }
    // 3. Private leftovers. (Orphans may still be named by the journal:
    // `Engine::open` clears them after its checkpoint.)
    let spill = meta.join("spill");
    if s.lstat(&spill).is_ok() {
        clear_dir(s, &spill)?;
        s.rmdir(&spill).ctx("recovery cleanup", || spill.display().to_string())?;
    }
    let stage = meta.join("stage");
    if !s.read_dir(&stage).ctx("recovery", || stage.display().to_string())?.is_empty() {
        return Err(Error::Corrupt {
            path: stage,
            offset: 0,
            detail: "staged objects without a checkpoint plan".into(),
        });
    }
    // The durable high-water mark: what the journal must still hold.
    let on_disk = mark::read(s)?;
    let accepted = std::cell::Cell::new(false);
    let losses = std::cell::RefCell::new(Vec::new());
    let refuse = |what: String| -> Result<()> {
        if opts.accept_loss {
            tracing::warn!("recovery accepts a loss (--accept-loss): {what}");
            accepted.set(true);
            losses.borrow_mut().push(what);
            Ok(())
        } else {
            tracing::error!("recovery refused: {what}");
            Err(Error::Lost(what))
        }
    };
    let mark_v = match &on_disk {
        mark::OnDisk::Valid { value, .. } => Some(*value),
        mark::OnDisk::Damaged(why) => {
            refuse(format!("the durable high-water mark is damaged ({why}): the journal cannot be verified"))?;
            None
        }
        mark::OnDisk::Absent => None,
    };
    // 4. The journal.
    let jdir = meta.join("journal");
    let mut epochs: Vec<u64> = Vec::new();
    for (n, _) in s.read_dir(&jdir).ctx("recovery", || jdir.display().to_string())? {
        match parse_hex(&n, "", "") {
            Some(e) => epochs.push(e),
            None => {
                return Err(Error::Corrupt {
                    path: jdir.join(&n),
                    offset: 0,
                    detail: "unexpected file in the journal folder".into(),
                })
            }
        }
    }
    epochs.sort();
    let epoch = match epochs.as_slice() {
        [] => {
            // No journal: a new backing, unless the mark says there was one.
            // Accepted loss starts past the mark's epoch and seq.
            let (e, prev) = match &mark_v {
                Some(m) => {
                    refuse(mark::verify(m, None).expect("no journal is always a loss"))?;
                    (Epoch(m.epoch.0 + 1), m.seq)
                }
                None => (Epoch(1), Seq(0)),
            };
            let p = journal_path(e);
            let f = s.open_file(&p, true).ctx("journal create", || p.display().to_string())?;
            f.write_at(0, &journal::file_header(e, prev, journal::new_nonce()))
                .ctx("journal create", || p.display().to_string())?;
            f.sync_data().ctx("journal create", || p.display().to_string())?;
            s.fsync(&jdir).ctx("journal create", || jdir.display().to_string())?;
            e
        }
        [e] => Epoch(*e),
        _ => {
            return Err(Error::Corrupt {
                path: jdir,
                offset: 0,
                detail: format!("{} journal files and no checkpoint plan", epochs.len()),
            })
        }
    };
    let jp = journal_path(epoch);
    let jf = s.open_file(&jp, false).ctx("journal open", || jp.display().to_string())?;
    let short = jf.len().ctx("journal open", || jp.display().to_string())? < journal::FILE_HEADER_LEN;
    if short && mark_v.is_some() {
        // The mark is written only once this journal's header was durable.
        refuse(format!(
            "{} is shorter than its header, but {} records commits up to seq {} as durable: it was truncated",
            jp.display(),
            mark::mark_path().display(),
            mark_v.map_or(0, |m| m.seq.0)
        ))?;
    }
    if short && (epoch == Epoch(1) || accepted.get()) {
        // The very first journal was created but its header never became
        // durable: nothing was ever committed. (Later epochs are created
        // and synced before their checkpoint plan is removed.) Or a loss
        // was accepted: the journal starts again past the mark.
        let prev = mark_v.filter(|_| accepted.get()).map_or(Seq(0), |m| m.seq);
        jf.set_len(0).ctx("journal init", || jp.display().to_string())?;
        jf.write_at(0, &journal::file_header(epoch, prev, journal::new_nonce()))
            .ctx("journal init", || jp.display().to_string())?;
        jf.sync_data().ctx("journal init", || jp.display().to_string())?;
    }
    let mut scan = journal::scan(&*jf, &jp, epoch)?;
    if let Some(m) = &mark_v {
        let found = mark::Found {
            epoch,
            nonce: scan.nonce,
            prev_seq: scan.prev_seq,
            last_seq: scan.records.last().map_or(scan.prev_seq, |r| r.seq),
        };
        if let Some(what) = mark::verify(m, Some(&found)) {
            refuse(what)?;
        }
    }
    // A torn tail is the end of what was never acknowledged durable — or
    // damage in the last synced group that the mark is too old to expose.
    let torn = scan.cut.as_ref().is_some_and(|(_, why)| !why.starts_with(journal::STALE_END));
    let mut jf = jf;
    if scan.nonce == 0 && scan.records.is_empty() {
        // An older, unkeyed journal with nothing in it: key it before
        // anything is appended (journal.rs, byte layout). One with records
        // is checkpointed by `Engine::open`, and the next journal is keyed.
        let (f, nonce) = files::key_empty_journal(s, &jp, epoch, scan.prev_seq)?;
        jf = f;
        scan.nonce = nonce;
        scan.cut = None;
        scan.valid_end = journal::FILE_HEADER_LEN;
    }
    if let Some((at, why)) = &scan.cut {
        if why.starts_with(journal::STALE_END) {
            tracing::debug!(journal = %jp.display(), offset = at, reason = %why, "cutting a recycled journal's old bytes");
        } else {
            tracing::warn!(journal = %jp.display(), offset = at, reason = %why, "cutting torn journal tail");
        }
        jf.set_len(scan.valid_end).ctx("journal cut", || jp.display().to_string())?;
        jf.sync_data().ctx("journal cut", || jp.display().to_string())?;
    }
    let journal = JournalWriter { epoch, path: jp.clone(), file: jf.clone(), end: scan.valid_end, nonce: scan.nonce };
    let mut st = State::new(storage.clone(), journal, scan.prev_seq, opts);
    let mut news: HashMap<u64, ObjId> = HashMap::new();
    for r in &scan.records {
        let d = decode(&mut st, &mut news, &r.record, epoch, r.data_start).map_err(|e| match e {
            // A damaged data file: named as itself.
            Error::Corrupt { path, offset, detail } => {
                Error::Corrupt { path, offset, detail: format!("{detail} (named by seq {})", r.seq.0) }
            }
            e => Error::Corrupt { path: jp.clone(), offset: r.start, detail: format!("seq {}: {e}", r.seq.0) },
        })?;
        st.replay(&d, r.seq);
    }
    // 5. Data files nobody names. New ones are numbered past every name
    // seen, so none can meet a leftover. Recovery deletes only what it can
    // account for: with the journal verified against the mark and nothing
    // cut but a recycled journal's old bytes, a data file no record names
    // belongs to no durable commit (an uncommitted transaction's, a spare,
    // a retired epoch's). Otherwise — no mark to verify against, a loss
    // accepted, a torn tail cut — it may hold a lost commit's bytes, and
    // it is kept in `.txfs/lost+found/` until the user removes it.
    let keep = mark_v.is_none() || accepted.get() || torn;
    let ddir = meta.join("data");
    let mut kept = 0;
    for (n, _) in s.read_dir(&ddir).ctx("recovery", || ddir.display().to_string())? {
        let id = parse_hex(&n, "", "").map(DataFileId);
        if let Some(id) = id {
            st.data_id_seen(id);
        }
        if id.is_none_or(|id| st.data_file(id).is_none()) {
            let p = ddir.join(&n);
            if keep {
                let to = lost_found_name(s, &n)?;
                tracing::warn!(from = %p.display(), to = %to.display(), "a data file no surviving record names: kept");
                s.rename(&p, &to).ctx("recovery lost+found", || p.display().to_string())?;
                kept += 1;
            } else {
                s.unlink(&p).ctx("recovery cleanup", || p.display().to_string())?;
            }
        }
    }
    if kept > 0 {
        let lf = lost_found();
        s.fsync(&lf).ctx("recovery lost+found", || lf.display().to_string())?;
        s.fsync(&ddir).ctx("recovery lost+found", || ddir.display().to_string())?;
    }
    st.mark = Arc::new(mark::Mark::new(&on_disk));
    st.loss_accepted = accepted.get();
    st.losses = losses.take();
    tracing::info!(epoch = epoch.0, records = scan.records.len(), seq = st.seq().0, "journal loaded");
    Ok(st)
}

/// Left by a final checkpoint that failed (`Engine::shutdown`): the reason.
/// `txfs umount` and `txfs check` report it; the next successful open
/// removes it.
pub fn checkpoint_failed_path() -> std::path::PathBuf {
    Path::new(META_DIR).join("checkpoint-failed")
}

/// Best effort: the engine may be failing already.
pub(crate) fn note_checkpoint_failed(s: &dyn Storage, e: &Error) {
    let p = checkpoint_failed_path();
    let _ = s.unlink(&p);
    let r = s.open_file(&p, true).and_then(|f| {
        f.write_at(0, format!("{e}\n").as_bytes())?;
        f.sync_data()
    });
    if let Err(err) = r.and_then(|()| s.fsync(Path::new(META_DIR))) {
        tracing::error!("{}: {err}", p.display());
    }
}

pub(crate) fn clear_checkpoint_failed(s: &dyn Storage) -> Result<()> {
    let p = checkpoint_failed_path();
    match s.unlink(&p) {
        Ok(()) => s.fsync(Path::new(META_DIR)).ctx("init", || META_DIR.into()),
        Err(e) if is_missing(&e) => Ok(()),
        Err(e) => Err(Error::io("init", p.display().to_string(), e)),
    }
}

/// Where recovery keeps data files it cannot account for.
pub fn lost_found() -> std::path::PathBuf {
    Path::new(META_DIR).join("lost+found")
}

/// A free name in `.txfs/lost+found/` for data file `n` (made durable, with
/// the folder, before anything is moved into it).
fn lost_found_name(s: &dyn Storage, n: &OsStr) -> Result<std::path::PathBuf> {
    let lf = lost_found();
    if s.lstat(&lf).is_err() {
        ensure_dir(s, &lf)?;
        s.fsync(Path::new(META_DIR)).ctx("recovery lost+found", || META_DIR.into())?;
    }
    let mut to = lf.join(n);
    let mut i = 1;
    while s.lstat(&to).is_ok() {
        let mut name = n.to_owned();
        name.push(format!(".{i}"));
        to = lf.join(name);
        i += 1;
    }
    Ok(to)
}

/// Turns one record back into a delta over the current committed state.
fn decode(
    st: &mut State,
    news: &mut HashMap<u64, ObjId>,
    rec: &CommitRecord,
    epoch: Epoch,
    data_start: u64,
) -> Result<Delta> {
    let mut d = Delta::default();
    for n in &rec.created {
        let o = st.new_obj(n.kind);
        news.insert(n.id, o);
        d.created.insert(o, NewObj { kind: n.kind, target: n.target.clone().map(OsString::from_vec), rdev: n.rdev });
    }
    // The record's path table, each entry from its parent's (earlier).
    let mut paths: Vec<ObjId> = Vec::with_capacity(rec.paths.len());
    for (i, (parent, name)) in rec.paths.iter().enumerate() {
        let dir = if *parent == PATH_ROOT { ObjId::ROOT } else { paths[*parent as usize] };
        let o = st.base_child(dir, OsStr::from_bytes(name))?.ok_or_else(|| {
            Error::Poisoned(format!("{} is not in the backing tree", String::from_utf8_lossy(&rec.path_of(i as u32))))
        })?;
        paths.push(o);
    }
    let resolve = |st: &mut State, news: &HashMap<u64, ObjId>, r: &ObjRef| -> Result<ObjId> {
        match r {
            ObjRef::New(id) => news.get(id).copied().ok_or_else(|| Error::Poisoned(format!("unknown new object {id}"))),
            ObjRef::Path(i) => Ok(paths[*i as usize]),
            ObjRef::Base(p) => {
                let mut cur = ObjId::ROOT;
                for c in Path::new(OsStr::from_bytes(p)).components() {
                    let name = c.as_os_str();
                    cur = st.base_child(cur, name)?.ok_or_else(|| {
                        Error::Poisoned(format!("{} is not in the backing tree", String::from_utf8_lossy(p)))
                    })?;
                }
                Ok(cur)
            }
        }
    };
    for rd in &rec.dirs {
        let dir = resolve(st, news, &rd.dir)?;
        for (name, e) in &rd.entries {
            let target = e.as_ref().map(|r| resolve(st, news, r)).transpose()?;
            if let Some(t) = target {
                if st.node_kind(t)? == FileKind::Dir {
                    d.parents.insert(t, dir);
                }
            }
            d.dirs.entry(dir).or_default().insert(OsString::from_vec(name.clone()), target);
        }
    }
    for ro in &rec.objs {
        let o = resolve(st, news, &ro.obj)?;
        let a = &ro.attr;
        let od = d.obj(o);
        od.attr = AttrDelta {
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            nlink: a.nlink,
            xattrs: a.xattrs.iter().map(|(k, v)| (OsString::from_vec(k.clone()), v.clone())).collect(),
        };
        if let Some(f) = &ro.file {
            let mut fd = FileDelta {
                cut: f.cut,
                size: if f.exact { SizeDelta::Exactly(f.size) } else { SizeDelta::AtLeast(f.size) },
                ext: Default::default(),
            };
            for &(off, len, doff) in &f.extents {
                fd.ext.insert(off, len, DataLoc::Journal(epoch, data_start + doff));
            }
            od.file = Some(fd);
        }
    }
    for (i, fr) in rec.files.iter().enumerate() {
        let ro = rec.objs.get(fr.obj as usize).filter(|ro| ro.file.is_some());
        let ro =
            ro.ok_or_else(|| Error::Poisoned(format!("data file reference to object #{} without content", fr.obj)))?;
        let o = resolve(st, news, &ro.obj)?;
        open_data_file(st, fr, rec.crcs.get(i).copied())?;
        let fd = d.obj(o).file.as_mut().expect("checked above");
        fd.ext.insert(fr.off, fr.len, DataLoc::File(DataFileId(fr.file), fr.file_off));
    }
    Ok(d)
}

/// Opens the data file a record names (synced before the record was
/// written: missing, short or with other bytes than its checksum is damage).
fn open_data_file(st: &mut State, fr: &FileRef, crc: Option<u32>) -> Result<()> {
    let id = DataFileId(fr.file);
    let path = data_path(id);
    let len = match st.data_file(id) {
        Some(df) => df.len,
        None => {
            let len = st.storage().lstat(&path).ctx("recovery", || path.display().to_string())?.size;
            st.add_committed_data_file(id, len);
            len
        }
    };
    if fr.file_off + fr.len > len {
        return Err(Error::Poisoned(format!(
            "{} holds {len} bytes, the record names bytes up to {}",
            path.display(),
            fr.file_off + fr.len
        )));
    }
    if let Some(want) = crc {
        let got = files::range_crc(&**st.storage(), id, fr.file_off, fr.len)
            .ctx("recovery", || path.display().to_string())?;
        if got != want {
            return Err(Error::Corrupt {
                path: path.clone(),
                offset: fr.file_off,
                detail: data_crc_mismatch(&path, fr, got, want),
            });
        }
    }
    Ok(())
}

fn data_crc_mismatch(path: &Path, fr: &FileRef, got: u32, want: u32) -> String {
    format!(
        "{} bytes {}..{} have crc32c {got:08x}, the record committed {want:08x}: the data file is damaged",
        path.display(),
        fr.file_off,
        fr.file_off + fr.len
    )
}

/// One journal file as `txfs check` found it.
#[derive(Debug)]
pub struct JournalReport {
    pub path: std::path::PathBuf,
    /// Whole, checksummed commit records.
    pub records: usize,
    /// Bytes up to the end of the last whole record.
    pub valid_bytes: u64,
    /// Where a torn tail would be cut, and why.
    pub cut: Option<(u64, String)>,
}

/// What `txfs check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub journals: Vec<JournalReport>,
    /// An interrupted checkpoint that the next mount or `recover` finishes.
    pub plan: Option<std::path::PathBuf>,
    /// Damage: each entry says what and where. Empty means healthy.
    pub problems: Vec<String>,
    /// Data files recovery could not account for, kept for the user
    /// (`.txfs/lost+found/`): not damage, but worth a look.
    pub lost_found: Vec<std::path::PathBuf>,
}

/// Verifies the journal and its references into the backing tree without
/// changing anything (`txfs check`).
pub fn check(s: &dyn Storage) -> Result<CheckReport> {
    let mut rep = CheckReport::default();
    let meta = Path::new(META_DIR);
    let list = match s.read_dir(meta) {
        Ok(l) => l,
        Err(e) if is_missing(&e) => return Ok(rep),
        Err(e) => return Err(Error::io("check", META_DIR.to_string(), e)),
    };
    for (n, _) in &list {
        if let Some(e) = parse_hex(n, "ckpt-", ".plan") {
            let pp = checkpoint::plan_path(Epoch(e));
            if let Err(err) = checkpoint::load(s, &pp) {
                rep.problems.push(err.to_string());
            }
            rep.plan = Some(pp);
        }
    }
    let jdir = meta.join("journal");
    let mut epochs = Vec::new();
    if let Ok(l) = s.read_dir(&jdir) {
        for (n, _) in l {
            match parse_hex(&n, "", "") {
                Some(e) => epochs.push(e),
                None => rep.problems.push(format!("{}: unexpected file in the journal folder", jdir.join(n).display())),
            }
        }
    }
    epochs.sort();
    if epochs.len() > 1 && rep.plan.is_none() {
        rep.problems.push(format!("{}: {} journal files and no checkpoint plan", jdir.display(), epochs.len()));
    }
    if let Ok(l) = s.read_dir(&meta.join("stage")) {
        if !l.is_empty() && rep.plan.is_none() {
            rep.problems.push(format!(
                "{}: {} staged objects without a checkpoint plan",
                meta.join("stage").display(),
                l.len()
            ));
        }
    }
    let plan_epoch = rep.plan.as_deref().and_then(|pp| pp.file_name()).and_then(|n| parse_hex(n, "ckpt-", ".plan"));
    let mark_v = match mark::read(s)? {
        mark::OnDisk::Valid { value, .. } => Some(value),
        mark::OnDisk::Damaged(why) => {
            rep.problems.push(format!("the durable high-water mark is damaged: {why}"));
            None
        }
        mark::OnDisk::Absent => None,
    };
    if let (Some(m), true) = (&mark_v, epochs.is_empty()) {
        rep.problems.extend(mark::verify(m, None));
    }
    if s.lstat(&checkpoint_failed_path()).is_ok() {
        let mut b = vec![0u8; 4096];
        let n = s.read_at(&checkpoint_failed_path(), 0, &mut b).unwrap_or(0);
        rep.problems.push(format!(
            "the last unmount's final checkpoint failed ({}): run `txfs recover` (the journal holds the commits)",
            String::from_utf8_lossy(&b[..n]).trim()
        ));
    }
    if let Ok(l) = s.read_dir(&lost_found()) {
        rep.lost_found = l.into_iter().map(|(n, _)| lost_found().join(n)).collect();
    }
    let last_epoch = epochs.last().copied();
    for e in epochs {
        let jp = journal_path(Epoch(e));
        let f = s.open_file(&jp, false).ctx("check", || jp.display().to_string())?;
        // The next epoch's journal of a running checkpoint, killed before
        // its header was written: finishing the plan writes it.
        let starting = plan_epoch == Some(e.wrapping_sub(1));
        // The very first journal, killed before its header was durable:
        // nothing was ever committed, and recovery writes the header again
        // (as `recover` above does).
        let never_begun = e == 1 && plan_epoch.is_none();
        if (starting || never_begun) && f.len().ctx("check", || jp.display().to_string())? < journal::FILE_HEADER_LEN {
            if let (Some(m), true) = (&mark_v, never_begun) {
                rep.problems.push(format!(
                    "{} is shorter than its header, but {} records commits up to seq {} as durable: it was \
                     truncated",
                    jp.display(),
                    mark::mark_path().display(),
                    m.seq.0
                ));
            }
            continue;
        }
        match journal::scan(&*f, &jp, Epoch(e)) {
            Ok(scan) => {
                if let (Some(m), true) = (&mark_v, last_epoch == Some(e)) {
                    let found = mark::Found {
                        epoch: Epoch(e),
                        nonce: scan.nonce,
                        prev_seq: scan.prev_seq,
                        last_seq: scan.records.last().map_or(scan.prev_seq, |r| r.seq),
                    };
                    rep.problems.extend(mark::verify(m, Some(&found)));
                }
                // Every base object a record names must exist (no plan running).
                if rep.plan.is_none() {
                    for r in &scan.records {
                        for (i, fr) in r.record.files.iter().enumerate() {
                            let dp = data_path(DataFileId(fr.file));
                            let len = s.lstat(&dp).map(|m| m.size).unwrap_or(0);
                            if len < fr.file_off + fr.len {
                                rep.problems.push(format!(
                                    "{} seq {}: names bytes up to {} of {}, which holds {len}",
                                    jp.display(),
                                    r.seq.0,
                                    fr.file_off + fr.len,
                                    dp.display()
                                ));
                            } else if let Some(&want) = r.record.crcs.get(i) {
                                match files::range_crc(s, DataFileId(fr.file), fr.file_off, fr.len) {
                                    Ok(got) if got == want => {}
                                    Ok(got) => rep.problems.push(format!(
                                        "{} seq {}: {}",
                                        jp.display(),
                                        r.seq.0,
                                        data_crc_mismatch(&dp, fr, got, want)
                                    )),
                                    Err(e) => rep.problems.push(format!("{}: {e}", dp.display())),
                                }
                            }
                        }
                        for o in r.record.refs() {
                            let p = match o {
                                ObjRef::Base(p) => p.clone(),
                                ObjRef::Path(i) => r.record.path_of(*i),
                                ObjRef::New(_) => continue,
                            };
                            if !p.starts_with(b".txfs/") && s.lstat(Path::new(OsStr::from_bytes(&p))).is_err() {
                                rep.problems.push(format!(
                                    "{} seq {}: names {} which is not in the backing tree",
                                    jp.display(),
                                    r.seq.0,
                                    String::from_utf8_lossy(&p)
                                ));
                            }
                        }
                    }
                }
                rep.journals.push(JournalReport {
                    path: jp,
                    records: scan.records.len(),
                    valid_bytes: scan.valid_end,
                    cut: scan.cut,
                });
            }
            Err(err) => rep.problems.push(err.to_string()),
        }
    }
    Ok(rep)
}
