//! The files of `.txfs/` that hold committed bytes besides the journal
//! records: where each lives, the data files, and the spare journal.
//!
//! ```text
//!   .txfs/journal/<epoch, 16 hex digits>   the journal of one epoch (one at a time)
//!   .txfs/journal-spare                    a retired journal kept for reuse
//!   .txfs/data/<id, 16 hex digits>         a data file: spilled or staged bytes
//! ```
//!
//! **Data files** hold a transaction's bytes outside the journal: its spill
//! file once it outgrows memory, a new file's staged content, an existing
//! file's shadow (DESIGN §2a). A record names them ([`super::record::FileRef`])
//! only after they were synced, and the checkpoint of the record's epoch
//! retires them (J1, J5). Tests: `tests/limits.rs` (spill), `tests/shadow.rs`.
//!
//! **The spare journal** is the journal a checkpoint retired, kept so that
//! the next epoch's journal is a file whose blocks are already written
//! (journal.rs, "Recycled journals"). It is dropped first whenever space
//! runs out, and recovery deletes it before anything else. Tests:
//! `tests/journal_recycle.rs`, `tests/recycled_journal_user_data.rs`.

use crate::error::{Error, IoContext, Result};
use crate::ids::{DataFileId, Epoch, Seq, TxId};
use crate::log::journal;
use crate::storage::{Storage, StoredFile};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the engine's own folder in the backing root, hidden from users.
pub const META_DIR: &str = ".txfs";

pub(crate) fn is_missing(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT) || e.kind() == std::io::ErrorKind::NotFound
}

pub fn journal_path(e: Epoch) -> PathBuf {
    Path::new(META_DIR).join("journal").join(format!("{:016x}", e.0))
}

pub(crate) fn data_path(id: DataFileId) -> PathBuf {
    Path::new(META_DIR).join("data").join(format!("{:016x}", id.0))
}

/// Total bytes of spare data files kept (DESIGN §2a).
pub(crate) const SPARES_MAX: u64 = 2 << 30;

/// A data file: a transaction's spilled bytes or a new file's staged content.
pub(crate) struct DataFile {
    /// Open while a live transaction writes it. Committed data files are
    /// read by path (the storage keeps a few read descriptors), so they do
    /// not hold a descriptor each until the checkpoint.
    pub file: Option<Arc<dyn StoredFile>>,
    /// The live transaction writing it; `None` once a commit names it.
    pub owner: Option<TxId>,
    /// Bytes written: a spill file's end, a staged file's size.
    pub len: u64,
    /// The journal epoch whose records name it (set by the commit): the
    /// checkpoint of that epoch retires it.
    pub epoch: Epoch,
}

impl DataFile {
    pub(crate) fn writer(&self) -> Result<&Arc<dyn StoredFile>> {
        self.file.as_ref().ok_or_else(|| Error::Poisoned("write to a committed data file".into()))
    }
}

/// Reads exactly `out.len()` bytes of `path` at `off` through the storage.
pub(crate) fn read_exact_at(s: &dyn Storage, path: &Path, mut off: u64, mut out: &mut [u8]) -> std::io::Result<()> {
    while !out.is_empty() {
        let n = s.read_at(path, off, out)?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        off += n as u64;
        out = &mut out[n..];
    }
    Ok(())
}

/// A range longer than twice this is checksummed over its first and last
/// `CRC_EDGE` bytes only: the checksum is computed under the engine lock
/// at commit, and a staged file can be huge and sparse (one write at a
/// terabyte's offset in a new file made a commit read a terabyte of
/// zeros, found by the hostile suite's `entry` class). Every range of up
/// to 2 MiB, and so every small file's, is covered whole.
pub(crate) const CRC_EDGE: u64 = 1 << 20;

/// crc32c of bytes `[off, off + len)` of data file `id` (a range longer
/// than `2 * CRC_EDGE`: of its first and last `CRC_EDGE` bytes).
pub(crate) fn range_crc(s: &dyn Storage, id: DataFileId, off: u64, len: u64) -> std::io::Result<u32> {
    let path = data_path(id);
    let spans =
        if len > 2 * CRC_EDGE { vec![(off, CRC_EDGE), (off + len - CRC_EDGE, CRC_EDGE)] } else { vec![(off, len)] };
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    let mut crc = 0u32;
    for (from, n) in spans {
        let (mut at, end) = (from, from + n);
        while at < end {
            let k = (end - at).min(buf.len() as u64) as usize;
            read_exact_at(s, &path, at, &mut buf[..k])?;
            crc = crc32c::crc32c_append(crc, &buf[..k]);
            at += k as u64;
        }
    }
    Ok(crc)
}

/// The checksums of a record's data-file ranges, in its order. Small
/// ranges are read a MiB window at a time, in data-file order (a record
/// lists them by object, and a transaction's spill file holds them in the
/// order it wrote them): a transaction of many small spilled writes names
/// hundreds of thousands of ranges, and a read (an open of the data file)
/// per range held the engine lock for seconds.
pub(crate) fn range_crcs(s: &dyn Storage, refs: &[super::record::FileRef]) -> Result<Vec<u32>> {
    const WINDOW: u64 = 1 << 20;
    let mut order: Vec<usize> = (0..refs.len()).collect();
    order.sort_by_key(|&i| (refs[i].file, refs[i].file_off));
    let mut out = vec![0u32; refs.len()];
    // (data file, offset of the window, its bytes)
    let mut win: Option<(u64, u64, Vec<u8>)> = None;
    for i in order {
        let r = &refs[i];
        let what = || data_path(DataFileId(r.file)).display().to_string();
        if r.len > WINDOW / 4 {
            out[i] = range_crc(s, DataFileId(r.file), r.file_off, r.len).ctx("data file checksum", what)?;
            continue;
        }
        let inside = |(f, at, b): &(u64, u64, Vec<u8>)| {
            *f == r.file && r.file_off >= *at && r.file_off + r.len <= at + b.len() as u64
        };
        if !win.as_ref().is_some_and(inside) {
            let path = data_path(DataFileId(r.file));
            let len = s.file_len(&path).ctx("data file checksum", what)?;
            let n = len.saturating_sub(r.file_off).min(WINDOW).max(r.len) as usize;
            let mut b = vec![0u8; n];
            read_exact_at(s, &path, r.file_off, &mut b).ctx("data file checksum", what)?;
            win = Some((r.file, r.file_off, b));
        }
        let (_, at, b) = win.as_ref().expect("just read");
        let k = (r.file_off - at) as usize;
        out[i] = crc32c::crc32c(&b[k..k + r.len as usize]);
    }
    Ok(out)
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
pub(crate) fn recycle_spare(s: &dyn Storage, jp: &Path, next: Epoch, last_seq: Seq, nonce: u32) -> bool {
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

/// Renames a retired journal to the spare, both folders synced. Best
/// effort: on failure `retire` unlinks it as before. (Nothing reads a
/// retired journal: the engine dropped it with the frozen delta.)
pub(crate) fn keep_as_spare(s: &dyn Storage, jp: &Path) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::FileRef;
    use crate::storage::MemFs;

    /// The windowed checksums are each range's own, across files, windows
    /// and ranges bigger than a window.
    #[test]
    fn range_crcs_read_in_windows_are_each_ranges_own() {
        let s = MemFs::new();
        s.mkdir(Path::new(META_DIR), 0o700).unwrap();
        s.mkdir(&Path::new(META_DIR).join("data"), 0o700).unwrap();
        for id in [1u64, 2] {
            let p = data_path(DataFileId(id));
            s.create_file(&p, 0o600).unwrap();
            let bytes: Vec<u8> = (0..3u64 << 20).map(|i| (i * 7 + id) as u8).collect();
            s.write_at(&p, 0, &bytes).unwrap();
        }
        let r = |file, file_off, len| FileRef { obj: 0, off: 0, len, file, file_off };
        let refs = vec![
            r(1, 0, 1),
            r(1, 2, 5),
            r(1, (1 << 20) - 3, 7),
            r(2, 10, 100),
            r(1, 40, 1),
            r(1, 100, 2 << 20),
            r(2, (3 << 20) - 1, 1),
        ];
        let got = range_crcs(&s, &refs).unwrap();
        for (r, c) in refs.iter().zip(got) {
            assert_eq!(c, range_crc(&s, DataFileId(r.file), r.file_off, r.len).unwrap(), "{r:?}");
        }
        assert!(range_crcs(&s, &[r(1, 3 << 20, 1)]).is_err(), "a range past the file's end");
    }
}
