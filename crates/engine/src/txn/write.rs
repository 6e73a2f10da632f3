//! File data: where a transaction's written bytes wait for its commit.
//!
//! * **Memory**: up to `Options::spill_threshold` bytes per transaction.
//! * **Spill**: past it, bytes go to the transaction's spill data file,
//!   copied without the engine lock ([`State::reserve_spill`], then
//!   [`State::spilled`]); the commit waits for copies still in flight
//!   (`Tx::inflight`).
//! * **Stage**: a file the transaction created gets a data file of its own
//!   once it reaches `Options::stage_threshold`; the commit names it, the
//!   checkpoint renames it into place (its bytes are written once).
//! * **Shadow**: an existing file the transaction rewrites from its start
//!   gets a data file holding its bytes at the file's own offsets; the
//!   checkpoint renames it over the file when it is all of the content
//!   (DESIGN §2a). A spare data file (an old inode a checkpoint replaced)
//!   is reused for it when one fits.
//!
//! Every data file is synced before the record that names it is written
//! (J2). Tests: `tests/limits.rs` (spill, staging, ENOSPC),
//! `tests/shadow.rs` (shadows, spares,
//! `a_write_still_copying_when_its_transaction_commits_lands_before_the_commit`).

use super::state::{State, Tx};
use super::Engine;

use crate::delta::{DataLoc, FileDelta};
use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, ObjId, TxId};
use crate::log::files::{data_path, DataFile};
use crate::storage::{FileKind, StoredFile};
use std::sync::Arc;

/// Zeros that fallocate writes as bytes, this many at a time.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// The modes of fallocate(2) the engine does ([`Engine::fallocate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Falloc {
    /// Mode 0: the size grows to the range's end.
    Allocate,
    /// `FALLOC_FL_KEEP_SIZE`: nothing visible.
    Reserve,
    /// Punch hole or zero range with `FALLOC_FL_KEEP_SIZE`: zeros inside
    /// the file.
    ZeroInside,
    /// Zero range: zeros, and the size grows to the range's end.
    Zero,
}

impl Falloc {
    /// The mode `bits` ask for, or `None` for EOPNOTSUPP. As Linux 6.17+
    /// decides (`vfs_fallocate`): the modes are exclusive, punching needs
    /// keep-size; collapse, insert, unshare and write-zeroes are not done
    /// here (ext4 itself answers EOPNOTSUPP for the last two).
    fn of(bits: i32) -> Option<Falloc> {
        let keep = bits & libc::FALLOC_FL_KEEP_SIZE != 0;
        match bits & !libc::FALLOC_FL_KEEP_SIZE {
            0 if keep => Some(Falloc::Reserve),
            0 => Some(Falloc::Allocate),
            libc::FALLOC_FL_PUNCH_HOLE if keep => Some(Falloc::ZeroInside),
            libc::FALLOC_FL_ZERO_RANGE if keep => Some(Falloc::ZeroInside),
            libc::FALLOC_FL_ZERO_RANGE => Some(Falloc::Zero),
            _ => None,
        }
    }
}

/// A rewrite gets a shadow once it reaches this far into the file: smaller
/// files stay in the spill file (one sync for all of them at the commit,
/// not one each, and no rename each at the checkpoint).
const SHADOW_MIN: u64 = 1 << 20;

impl State {
    fn write(&mut self, tx: &mut Tx, o: ObjId, off: u64, data: &[u8]) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::posix("write", o.to_string(), libc::EISDIR)),
            _ => return Err(Error::posix("write", o.to_string(), libc::EINVAL)),
        }
        if data.is_empty() {
            return Ok(());
        }
        self.check_file_size("write", o, off.saturating_add(data.len() as u64))?;
        off.checked_add(data.len() as u64)
            .filter(|e| *e <= i64::MAX as u64)
            .ok_or_else(|| Error::posix("write", format!("{o} at {off}"), libc::EFBIG))?;
        if self.stage(tx, o, off + data.len() as u64)? {
            let id = tx.staged[&o];
            let what = || data_path(id).display().to_string();
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            // Its length first: a write cut short (ENOSPC) may have
            // extended the file, and a data file is never shorter than its
            // `len` says when the checkpoint renames it into place.
            df.len = df.len.max(off + data.len() as u64);
            df.writer()?.write_at(off, data).ctx("write", what)?;
            tx.data_dirty = true;
            tx.delta.obj(o).file = Some(FileDelta::staged(id, df.len));
            Self::touch(tx, o, true);
            return Ok(());
        }
        if let Some(&id) = tx.shadows.get(&o) {
            let what = || data_path(id).display().to_string();
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.len = df.len.max(off + data.len() as u64);
            df.writer()?.write_at(off, data).ctx("write", what)?;
            self.spilled(tx, o, off, data.len() as u64, id, off);
            return Ok(());
        }
        let loc = if !self.mem_fits(tx, data.len() as u64) {
            self.spill(tx, data)?
        } else {
            tx.mem_bytes += data.len() as u64;
            DataLoc::Mem(Arc::new(data.to_vec()), 0)
        };
        let od = tx.delta.obj(o);
        od.file.get_or_insert_with(FileDelta::default).write(off, data.len() as u64, loc);
        Self::touch(tx, o, true);
        Ok(())
    }

    /// For a write that goes to `tx`'s spill file: reserves where its bytes
    /// go and returns the file, so that the caller copies them without the
    /// engine lock and then calls [`State::spilled`]. `None`: the write
    /// takes the ordinary path (memory, a staged file, or an error).
    #[allow(clippy::type_complexity)]
    fn reserve_spill(
        &mut self,
        tx: &mut Tx,
        o: ObjId,
        off: u64,
        len: u64,
    ) -> Result<Option<(DataFileId, u64, Arc<dyn StoredFile>)>> {
        if tx.committing {
            return Ok(None);
        }
        let fits = len > 0 && off.checked_add(len).is_some_and(|e| e <= i64::MAX as u64);
        if let Some(id) = if fits { self.shadow(tx, o, off, len)? } else { None } {
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.len = df.len.max(off + len);
            let file = df.writer()?.clone();
            tx.inflight += 1;
            return Ok(Some((id, off, file)));
        }
        let ordinary = len == 0
            || self.mem_fits(tx, len)
            || tx.delta.created.contains_key(&o)
            || off.checked_add(len).is_none_or(|e| e > i64::MAX as u64)
            || self.kind_in(Some(tx), o)? != FileKind::File;
        if ordinary {
            return Ok(None);
        }
        if tx.spill.is_none() {
            let id = self.new_data_file(tx, "spill")?;
            tx.spill = Some((id, 0));
        }
        let (id, end) = tx.spill.as_mut().expect("just set");
        let at = *end;
        *end += len;
        let df = self.data_files.get_mut(id).ok_or_else(|| Error::Poisoned("spill file gone".into()))?;
        df.len = *end;
        let file = df.writer()?.clone();
        tx.inflight += 1;
        Ok(Some((*id, at, file)))
    }

    /// The shadow data file of `o` in `tx`, if it has one or gets one now:
    /// a file `tx` did not create (in the tree with a single link, or
    /// created by a committed transaction) that `tx` rewrites from its
    /// start — its bytes are exactly everything below `off`, at most its
    /// memory budget, and this write reaches [`SHADOW_MIN`] — gets one when
    /// this write reaches `stage_threshold` (as a new file is staged) or
    /// would leave memory. `tx`'s bytes of `o` are moved into it
    /// once; from then on every write of `o` goes there, at its own offset.
    /// A checkpoint renames the shadow into place when it is all of the
    /// committed content (DESIGN §2a): those bytes are written once.
    fn shadow(&mut self, tx: &mut Tx, o: ObjId, off: u64, len: u64) -> Result<Option<DataFileId>> {
        if let Some(&id) = tx.shadows.get(&o) {
            return Ok(Some(id));
        }
        // Like a new file's staging: once the rewrite reaches
        // `stage_threshold`, or its bytes would leave memory.
        if (self.mem_fits(tx, len) && off + len < self.stage_threshold)
            || tx.delta.created.contains_key(&o)
            || self.kind_in(Some(tx), o)? != FileKind::File
        {
            return Ok(None);
        }
        let mine = tx.delta.objs.get(&o).and_then(|od| od.file.as_ref());
        // Cheap checks first: `covers` walks the extents up to a gap.
        let prefix = |f: &FileDelta| f.ext.end() <= off && f.ext.covers(0, off);
        if off + len < SHADOW_MIN || off > self.spill_threshold.max(SHADOW_MIN) || !(mine.map_or(off == 0, prefix)) {
            return Ok(None);
        }
        let new = self.committed.created.contains_key(&o);
        if !new && !self.base_meta(o)?.is_some_and(|m| m.kind == FileKind::File && m.nlink == 1) {
            return Ok(None);
        }
        let pieces: Vec<_> =
            mine.map_or(Vec::new(), |f| f.ext.iter().map(|(at, e)| (at, e.len, e.loc.clone())).collect());
        // After O_TRUNC the transaction sees a short file: the tree's size
        // says more about how big the rewrite will be.
        let want = self.attr_unrecorded(Some(tx), o)?.size.max(self.attr_unrecorded(None, o)?.size);
        let id = match self.take_spare(tx, want) {
            Some(id) => id,
            None => self.new_data_file(tx, "shadow")?,
        };
        // Registered first: if the copy fails, the transaction still owns
        // (and its end removes) the file, and its extents still point where
        // they did.
        tx.shadows.insert(o, id);
        tx.data_dirty = true;
        let end = pieces.iter().map(|(at, l, _)| at + l).max().unwrap_or(0);
        let df = self.data_files.get_mut(&id).expect("just made");
        df.len = df.len.max(end);
        self.copy_into(id, &pieces, "shadow")?;
        let f = tx.delta.obj(o).file.get_or_insert_with(FileDelta::default);
        for (at, l, loc) in &pieces {
            f.write(*at, *l, DataLoc::File(id, *at));
            if let DataLoc::Mem(..) = loc {
                // Those bytes left memory: the delta points here now.
                tx.mem_bytes = tx.mem_bytes.saturating_sub(*l);
            }
        }
        Ok(Some(id))
    }

    /// The bytes reserved by [`State::reserve_spill`] are written: they are
    /// the transaction's content of `o` at `off`.
    fn spilled(&mut self, tx: &mut Tx, o: ObjId, off: u64, len: u64, id: DataFileId, at: u64) {
        tx.data_dirty = true;
        tx.delta.obj(o).file.get_or_insert_with(FileDelta::default).write(off, len, DataLoc::File(id, at));
        Self::touch(tx, o, true);
    }

    /// Copies extents' bytes into the data file `id`, each at its own file
    /// offset, a MiB at a time (staging and shadows move a transaction's
    /// bytes into their file once).
    fn copy_into(&self, id: DataFileId, pieces: &[(u64, u64, DataLoc)], op: &'static str) -> Result<()> {
        let what = || data_path(id).display().to_string();
        let file =
            self.data_files.get(&id).ok_or_else(|| Error::Poisoned(format!("{op}: data file gone")))?.writer()?;
        let mut buf = Vec::new();
        for (at, len, loc) in pieces {
            let mut done = 0u64;
            while done < *len {
                let n = ((len - done) as usize).min(1 << 20);
                buf.resize(n, 0);
                self.fetch(&loc.advance(done), &mut buf).ctx(op, what)?;
                file.write_at(at + done, &buf).ctx(op, what)?;
                done += n as u64;
            }
        }
        Ok(())
    }

    /// A spare data file for a shadow of `tx` of a file of `want` bytes, if
    /// one opens: the smallest that holds `want`, else the largest. Its
    /// length stays its `len` (the blocks past what the shadow writes hold
    /// old bytes: a checkpoint renames a shadow into place only when every
    /// byte below its size is the transaction's, cutting the rest).
    fn take_spare(&mut self, tx: &Tx, want: u64) -> Option<DataFileId> {
        let fits = (0..self.spares.len()).filter(|&i| self.spares[i].1 >= want).min_by_key(|&i| self.spares[i].1);
        let i = fits.or_else(|| (0..self.spares.len()).max_by_key(|&i| self.spares[i].1))?;
        let (id, len) = self.spares.swap_remove(i);
        match self.storage.open_file(&data_path(id), false) {
            Ok(f) => {
                let epoch = self.journal.epoch;
                self.data_files.insert(id, DataFile { file: Some(f), owner: Some(tx.id), len, epoch });
                self.give_data_file(tx, id);
                Some(id)
            }
            Err(e) => {
                tracing::warn!("{}: {e} (spare data file dropped)", data_path(id).display());
                let _ = self.storage.unlink(&data_path(id));
                None
            }
        }
    }

    /// Gives the data file `id` to `tx`'s user, if it has one: its blocks
    /// count against their quota (the checkpoint gives a staged file its
    /// final owner, a shadow its file's; spill files are removed). Best
    /// effort: a daemon that may not chown keeps them.
    fn give_data_file(&self, tx: &Tx, id: DataFileId) {
        if let Some((uid, gid)) = tx.owner {
            if let Err(e) = self.storage.set_owner(&data_path(id), uid, gid) {
                tracing::debug!("{}: {e} (kept by the daemon's user)", data_path(id).display());
            }
        }
    }

    /// Deletes the spare data files (disk space goes back).
    pub(crate) fn drop_spares(&mut self) {
        for (id, _) in std::mem::take(&mut self.spares) {
            match self.storage.unlink(&data_path(id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("{}: {e} (removed at the next start)", data_path(id).display()),
            }
        }
    }

    /// A new, empty data file owned by `tx`.
    fn new_data_file(&mut self, tx: &Tx, what: &'static str) -> Result<DataFileId> {
        let id = DataFileId(self.next_data);
        self.next_data += 1;
        let path = data_path(id);
        let f = self.storage.open_file(&path, true).ctx(what, || path.display().to_string())?;
        f.set_len(0).ctx(what, || path.display().to_string())?;
        self.give_data_file(tx, id);
        let epoch = self.journal.epoch;
        self.data_files.insert(id, DataFile { file: Some(f), owner: Some(tx.id), len: 0, epoch });
        Ok(id)
    }

    fn spill(&mut self, tx: &mut Tx, data: &[u8]) -> Result<DataLoc> {
        if tx.spill.is_none() {
            let id = self.new_data_file(tx, "spill")?;
            tx.spill = Some((id, 0));
        }
        let (id, end) = tx.spill.as_mut().expect("just set");
        let df = self.data_files.get_mut(id).ok_or_else(|| Error::Poisoned("spill file gone".into()))?;
        df.writer()?.write_at(*end, data).ctx("spill write", || data_path(*id).display().to_string())?;
        let loc = DataLoc::File(*id, *end);
        *end += data.len() as u64;
        df.len = *end;
        tx.data_dirty = true;
        Ok(loc)
    }

    /// Whether `o`'s content lives in a staged data file of `tx`, staging
    /// it now if `tx` created it and its content reaches the threshold with
    /// `end` (its bytes so far are copied in once).
    fn stage(&mut self, tx: &mut Tx, o: ObjId, end: u64) -> Result<bool> {
        if tx.staged.contains_key(&o) {
            return Ok(true);
        }
        if !tx.delta.created.contains_key(&o) {
            return Ok(false);
        }
        let size = tx.delta.objs.get(&o).and_then(|od| od.file.as_ref()).map_or(0, |f| f.size_after(0));
        if size.max(end) < self.stage_threshold {
            return Ok(false);
        }
        let id = self.new_data_file(tx, "stage")?;
        let what = || data_path(id).display().to_string();
        // A new file's content is its extents over nothing (holes are zeros).
        let pieces =
            tx.delta.objs.get(&o).and_then(|od| od.file.as_ref()).map_or(Vec::new(), |f| f.ext.pieces(0, size));
        for (_, len, loc) in &pieces {
            if let DataLoc::Mem(..) = loc {
                // Those bytes leave memory once the delta points here.
                tx.mem_bytes = tx.mem_bytes.saturating_sub(*len);
            }
        }
        self.copy_into(id, &pieces, "stage")?;
        let df = self.data_files.get_mut(&id).expect("just made");
        df.writer()?.set_len(size).ctx("stage", what)?;
        df.len = size;
        tx.staged.insert(o, id);
        tx.data_dirty = true;
        tx.delta.obj(o).file = Some(FileDelta::staged(id, size));
        Ok(true)
    }

    /// EFBIG for a file size the backing could not hold (issue 23: the
    /// checkpoint would meet it and fail), as the backing itself answers.
    fn check_file_size(&self, op: &'static str, o: ObjId, end: u64) -> Result<()> {
        if end > self.max_file_size.unwrap_or(i64::MAX as u64).min(i64::MAX as u64) {
            return Err(Error::posix(op, format!("{o} up to {end}"), libc::EFBIG));
        }
        Ok(())
    }

    /// Raises `o`'s size to at least `end` without reading it (fallocate
    /// mode 0): the bytes it adds read as zeros. A staged file's data file
    /// grows (sparse) with it, so that it stays all of the content.
    fn extend(&mut self, tx: &mut Tx, o: ObjId, end: u64) -> Result<()> {
        self.check_file_size("fallocate", o, end)?;
        if let Some(&id) = tx.staged.get(&o) {
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            if end > df.len {
                df.writer()?.set_len(end).ctx("fallocate", || data_path(id).display().to_string())?;
                df.len = end;
                tx.data_dirty = true;
                tx.delta.obj(o).file = Some(FileDelta::staged(id, end));
            }
        } else {
            tx.delta.obj(o).file.get_or_insert_with(FileDelta::default).extend(end);
        }
        Self::touch(tx, o, true);
        Ok(())
    }

    /// What fallocate(2) does without zero bytes, under the lock: the
    /// checks, the times, a size extension, zeros that reach the end of the
    /// file (a cut: they cost no bytes). Returns the range that is left to
    /// write as zero bytes (empty if none). `plain`: an operation outside a
    /// transaction, which may read the size at no cost (it cannot
    /// conflict), as may a transaction of a file it created.
    fn fallocate(&mut self, tx: &mut Tx, o: ObjId, how: Falloc, off: u64, len: u64, plain: bool) -> Result<(u64, u64)> {
        match self.kind_in(Some(tx), o)? {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::posix("fallocate", o.to_string(), libc::EISDIR)),
            _ => return Err(Error::posix("fallocate", o.to_string(), libc::ENODEV)),
        }
        // As the kernel: an end past what a file can hold (or past i64) is
        // EFBIG in every mode, even one that changes no size.
        let end = off
            .checked_add(len)
            .filter(|e| *e <= i64::MAX as u64)
            .ok_or_else(|| Error::posix("fallocate", format!("{o} at {off}+{len}"), libc::EFBIG))?;
        self.check_file_size("fallocate", o, end)?;
        // ext4's `file_modified`: mtime and ctime in every mode.
        Self::touch(tx, o, true);
        let sized = plain || tx.delta.created.contains_key(&o);
        let nothing = Ok((0, 0));
        match how {
            Falloc::Reserve => nothing,
            Falloc::Allocate => self.extend(tx, o, end).and(nothing),
            // Zeros inside the file only: the size is read (a transaction
            // that punches a file another one grows conflicts with it).
            Falloc::ZeroInside => {
                let size = self.attr(tx, o)?.size;
                if off >= size {
                    nothing
                } else if end >= size {
                    // To the end: cut there and give the size back; the
                    // bytes past the cut read as zeros.
                    self.truncate(tx, o, off)?;
                    self.truncate(tx, o, size).and(nothing)
                } else {
                    Ok((off, end))
                }
            }
            // Zeros and at least `end` bytes: blind, as a write, unless the
            // size may be read for free, or a range of a MiB or more reaches
            // the end of the file as the transaction sees it: then it reads
            // the size rather than write every zero of it (a downloader's
            // gigabytes past the end cost a size, not gigabytes).
            Falloc::Zero if sized || (len >= ZEROS.len() as u64 && end >= self.attr_unrecorded(Some(tx), o)?.size) => {
                let size = self.attr(tx, o)?.size;
                if off >= size {
                    self.extend(tx, o, end).and(nothing)
                } else if end >= size {
                    self.truncate(tx, o, off)?;
                    self.truncate(tx, o, end).and(nothing)
                } else {
                    Ok((off, end))
                }
            }
            Falloc::Zero => Ok((off, end)),
        }
    }

    pub(super) fn truncate(&mut self, tx: &mut Tx, o: ObjId, size: u64) -> Result<()> {
        match self.kind_in(Some(tx), o)? {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::posix("truncate", o.to_string(), libc::EISDIR)),
            _ => return Err(Error::posix("truncate", o.to_string(), libc::EINVAL)),
        }
        self.check_file_size("truncate", o, size)?;
        if let Some(&id) = tx.staged.get(&o) {
            let df = self.data_files.get_mut(&id).ok_or(Error::Stale(o))?;
            df.writer()?.set_len(size).ctx("truncate", || data_path(id).display().to_string())?;
            df.len = size;
            tx.data_dirty = true;
            tx.delta.obj(o).file = Some(FileDelta::staged(id, size));
        } else {
            tx.delta.obj(o).file.get_or_insert_with(FileDelta::default).truncate(size);
        }
        Self::touch(tx, o, true);
        Ok(())
    }
}

impl Engine {
    pub fn write(&self, tx: Option<TxId>, o: ObjId, off: u64, data: &[u8]) -> Result<usize> {
        let len = data.len() as u64;
        let reserved = self.run(tx, |st, t| match tx.is_some() {
            true => match st
                .check_file_size("write", o, if len == 0 { 0 } else { off.saturating_add(len) })
                .and_then(|()| st.reserve_spill(t, o, off, len))?
            {
                Some(r) => Ok(Some(r)),
                None => st.write(t, o, off, data).map(|_| None),
            },
            false => st.write(t, o, off, data).map(|_| None),
        })?;
        // Spilled bytes are copied without the engine lock: concurrent
        // transactions' big writes do not wait for one another's copies.
        let Some((id, at, file)) = reserved else { return Ok(data.len()) };
        let copied = file.write_at(at, data);
        if copied.is_ok() {
            // On their way to the disk before the commit's sync waits.
            file.start_writeback(at, len);
        }
        let mut st = self.lock();
        let Some(mut t) = tx.and_then(|id| st.txs.remove(&id)) else {
            return Err(Error::NoSuchTx(tx.unwrap_or(TxId(0))));
        };
        t.inflight = t.inflight.saturating_sub(1);
        t.ops += 1;
        if t.inflight == 0 {
            // A commit of `t` may be waiting for its copies.
            self.shared.copied.notify_all();
        }
        let poisoned = st.poisoned();
        if let (Ok(()), None, None) = (&copied, &t.doomed, &poisoned) {
            st.spilled(&mut t, o, off, len, id, at);
            st.charge(&mut t);
        }
        let doomed = t.doomed.clone();
        let id_tx = t.id;
        st.txs.insert(id_tx, t);
        if let Some(p) = poisoned {
            return Err(Error::Poisoned(p));
        }
        match copied {
            Ok(()) => match doomed {
                Some(d) => {
                    let e = d.error(id_tx);
                    if e.is_conflict() {
                        st.stats.conflicts += 1;
                    }
                    Err(e)
                }
                None => Ok(data.len()),
            },
            Err(e) => {
                if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                    // Spare data files give their space back: a retry may fit.
                    st.drop_spares();
                }
                Err(Error::io("spill write", data_path(id).display().to_string(), e))
            }
        }
    }

    /// fallocate(2) with Linux's `mode` bits, as ext4 answers it (SPEC §2):
    ///
    /// * `0`: the size becomes at least `off + len`; the bytes it adds read
    ///   as zeros, no byte changes. Blind: nothing is read.
    /// * `FALLOC_FL_KEEP_SIZE`: changes no byte and no size (nothing is
    ///   reserved on the backing: see docs/LIMITS.md).
    /// * `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, and
    ///   `FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE`: the bytes of the
    ///   range that lie inside the file become zeros; reads the size.
    /// * `FALLOC_FL_ZERO_RANGE`: the range becomes zeros and the size at
    ///   least `off + len`. Blind, like a write, except that a range of a
    ///   MiB or more that reaches the end of the file reads the size (its
    ///   zeros past the end then cost nothing).
    ///
    /// Every mode sets mtime and ctime. Zeros that reach the end of the
    /// file cost no bytes (a cut); others are written as zero bytes, a MiB
    /// at a time, so the transaction's memory budget spills them like any
    /// write. Errors: EINVAL for `len == 0` or a value past `i64::MAX`;
    /// EOPNOTSUPP for any other mode (collapse, insert, unshare, write
    /// zeroes, punch without keep-size, unknown bits); EISDIR, ENODEV for
    /// what is no regular file; EFBIG for `off + len` past the largest file
    /// the backing holds.
    pub fn fallocate(&self, tx: Option<TxId>, o: ObjId, mode: i32, off: u64, len: u64) -> Result<()> {
        if len == 0 || off > i64::MAX as u64 || len > i64::MAX as u64 {
            return Err(Error::posix("fallocate", format!("{o} at {off}+{len}"), libc::EINVAL));
        }
        let how = Falloc::of(mode)
            .ok_or_else(|| Error::posix("fallocate", format!("{o}: mode {mode:#x}"), libc::EOPNOTSUPP))?;
        let write_zeros = |st: &mut State, t: &mut Tx, (from, to): (u64, u64)| -> Result<()> {
            let mut at = from;
            while at < to {
                let n = (to - at).min(ZEROS.len() as u64) as usize;
                st.write(t, o, at, &ZEROS[..n])?;
                at += n as u64;
            }
            Ok(())
        };
        let Some(id) = tx else {
            // One transaction, committed in the same lock hold as a plain
            // write: past the memory budget its zeros go to the spill file.
            return self.run(None, |st, t| {
                let rest = st.fallocate(t, o, how, off, len, true)?;
                write_zeros(st, t, rest)
            });
        };
        let (mut at, to) = self.run(tx, |st, t| st.fallocate(t, o, how, off, len, false))?;
        // A MiB at a time through the write path: its spilled copies run
        // without the lock, as a big write's do.
        while at < to {
            let n = (to - at).min(ZEROS.len() as u64) as usize;
            self.write(Some(id), o, at, &ZEROS[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    /// Appends at the end of the file as this transaction sees it; returns
    /// the offset written at.
    pub fn append(&self, tx: Option<TxId>, o: ObjId, data: &[u8]) -> Result<u64> {
        self.run(tx, |st, t| {
            let size = st.attr(t, o)?.size;
            st.write(t, o, size, data)?;
            Ok(size)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::MemFs;
    use crate::{Engine, ObjId, Options};
    use std::ffi::OsStr;
    use std::sync::Arc;

    /// A 64 MiB zero range in a transaction with a 1 MiB memory budget: by
    /// the engine's own count (`Tx::mem_bytes`) the transaction never holds
    /// more than its budget; the rest went to its spill file.
    #[test]
    fn a_big_zero_range_keeps_a_transaction_within_its_memory_budget() {
        let opts = Options { spill_threshold: 1 << 20, flush_interval: None, ..Options::default() };
        let e = Engine::open(Arc::new(MemFs::new()), opts).unwrap();
        let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, &[1u8; 4096]).unwrap();
        e.write(None, f, 80 << 20, &[2u8; 4096]).unwrap();
        let tx = e.begin();
        e.fallocate(Some(tx), f, libc::FALLOC_FL_ZERO_RANGE, 100, 64 << 20).unwrap();
        let st = e.lock();
        let t = &st.txs[&tx];
        assert!(t.mem_bytes <= 1 << 20, "{} bytes in memory", t.mem_bytes);
        let (_, spilled) = t.spill.expect("the zeros past the budget are in the spill file");
        assert!(spilled >= 63 << 20, "{spilled} bytes spilled");
    }
}
