//! The redo journal: one append-only file per epoch under `.txfs/journal/`.
//!
//! ## Byte layout (all integers little-endian)
//! File header, 32 bytes:
//! ```text
//!   0  [u8; 8]  magic "TXFSJNL2" ("TXFSJNL1": an older journal, nonce 0)
//!   8  u64      epoch
//!  16  u64      seq of the last commit before this epoch
//!  24  u32      crc32c of bytes 0..24 and 28..32 (TXFSJNL1: of 0..24)
//!  28  u32      nonce: random, non-zero, new for every journal (TXFSJNL1: 0)
//! ```
//! Then records, back to back, each:
//! ```text
//!   0  u32  magic 0x524A5854 ("TXJR")
//!   4  u16  version (1, or 2 if data files follow the record: below)
//!   6  u16  kind (1 = commit)
//!   8  u64  seq            commit sequence number, +1 per record
//!  16  u64  durable_upto   file offset known durable when this was written
//!  24  u32  meta_len
//!  28  u32  reserved (0)
//!  32  u64  data_len
//!  40  u32  crc32c of bytes 0..40, then meta, then data, seeded with the nonce
//!  44  u32  crc32c of bytes 0..40 seeded with !nonce (the header alone;
//!           TXFSJNL1: reserved, 0)
//!  48  meta (`CommitRecord`, encoded as in `codec`), then data (extent bytes)
//! ```
//! A record that fits the writer's buffer is written in one `pwrite`; a
//! bigger one writes its header last. The checksum covers it all, so a
//! record whose write was torn anywhere fails it. The nonce keys both
//! checksums to this one file: record data is bytes users wrote into
//! files, and without a key a user could write a byte string that is a
//! whole record; the nonce is in
//! `.txfs/`, which the mount hides, so nobody can compute a record that
//! verifies here, and a record of another journal (a recycled file's old
//! bytes) never does. The header check lets a scan reject a candidate
//! record from its 48 bytes without reading the length it claims.
//!
//! ## Data files (selective data journaling)
//! A version-2 record's meta is the encoded `CommitRecord` followed by the
//! encoded `Vec<FileRef>`: extents whose bytes are not in the record but in
//! data files `.txfs/data/<16 hex digits>` (a large transaction's spilled
//! data, a new file's staged content). Every data file a record names was
//! `fdatasync`ed before the record was written, so a record that survives a
//! crash finds its bytes. Records without data files stay version 1.
//!
//! ## Zeroed runway
//! `fdatasync` after an append that grows the file must also commit the new
//! size and block allocation (an ext4 journal commit: ~240 µs here), while
//! one after overwriting blocks already written and synced flushes only the
//! data (~150 µs). So the writer keeps up to [`RUNWAY`] bytes of zeros
//! written past the last record, and small records overwrite them; the file
//! grows once per runway instead of once per commit. Only records that a
//! sync follows at once (durable commits) get one: for plain writes and
//! ordered commits the zeros would just be written twice. A tail of nothing but
//! zeros is the clean end of the journal, not a torn tail. Anything else
//! after the last whole record is cut by recovery (as before), so no stale
//! record can line up with a later append.
//!
//! ## Recycled journals
//! A checkpoint keeps the journal it retires as `.txfs/journal-spare`
//! (up to `SPARE_MAX` (log/files.rs) bytes), and the next epoch's
//! journal is that file with a new header: its blocks are allocated and
//! written already, so an `fdatasync` after a record there flushes only
//! data, for records of any size (the runway only covers small ones). A
//! 1 MiB record + `fdatasync`: 710 µs appended, 400 µs over written blocks.
//! After the new epoch's records come the old epoch's bytes, record data
//! included: bytes users wrote into files. None of them verifies as a
//! record here, because every checksum is keyed with this file's nonce
//! (byte layout above; a user who wrote a perfect record of their own into
//! a file cannot know the nonce). As a second guard, a whole record whose
//! seq is not newer than the header's `prev_seq` ends the scan like a torn
//! one (cut there; never a damage witness). So nothing older than this
//! epoch can line up with an append, and J3's probe, which now runs over up
//! to 256 MiB of old bytes, rejects a candidate from its 48-byte header
//! (the header check) before reading the length it claims. The spare is
//! written a new header (new nonce) and synced before it is renamed into
//! place; recovery deletes a spare before anything else (a rename cut by a
//! crash can leave it a second name of a live journal), and
//! `Engine::shutdown` drops it and cuts a recycled journal's old bytes.
//! Older journals (`TXFSJNL1`, nonce 0) are read as before; binaries that
//! predate the nonce refuse a `TXFSJNL2` journal ("bad journal file
//! header") rather than misread it.
//!
//! ## Torn tail versus damage (invariant J3)
//! Scanning stops at the first record that is short or fails its checksum.
//! If a later record with a valid checksum says (`durable_upto`) that bytes
//! beyond that point were already durable, the bad record was durable once:
//! that is damage, reported as [`Error::Corrupt`], never skipped. Otherwise
//! the bad bytes were never acknowledged as durable — a torn tail — and the
//! journal is cut there. (Damage inside the very last synced group cannot be
//! told from a torn write; `txfs check` reports every cut.)
//!
//! ## Group commit (invariant J4)
//! Appends happen under the engine lock; the `fdatasync` that makes them
//! durable runs outside it, one for many committers: `log/group_commit.rs`.
//!
//! ## Tests
//! J2 and J3: `tests/crash.rs` (`power_cuts_leave_a_durable_prefix`,
//! `journal_damage_is_reported_and_torn_tail_is_cut`). The runway:
//! `tests/journal_runway.rs` and the unit tests below. Recycled journals and
//! the nonce: `tests/journal_recycle.rs`, `tests/recycled_journal_user_data.rs`,
//! `tests/journal_keying.rs`.

pub use crate::codec::DecodeError;
use crate::error::{Error, IoContext, Result};
use crate::ids::{Epoch, Seq};
use crate::storage::StoredFile;
use std::path::PathBuf;
use std::sync::Arc;

// The record's meta part and group commit have modules of their own; their
// items stay reachable here, where the journal's users have always found them.
pub use super::group_commit::SyncState;
pub use super::record::{
    CommitRecord, FileRef, ObjRef, RecAttr, RecDir, RecFile, RecNew, RecObj, REC_VERSION, REC_VERSION_FILES,
};

/// An older journal's magic: no nonce (0), record header word 44 unused.
pub const FILE_MAGIC: &[u8; 8] = b"TXFSJNL1";
/// A journal keyed by the nonce in its header.
pub const FILE_MAGIC_KEYED: &[u8; 8] = b"TXFSJNL2";
pub const FILE_HEADER_LEN: u64 = 32;
pub const REC_MAGIC: u32 = 0x524A_5854;
pub const REC_HEADER_LEN: u64 = 48;
pub const KIND_COMMIT: u16 = 1;
/// How a scan's cut reason starts when the journal ends at a whole record of
/// an earlier epoch (a recycled journal's old bytes, not a torn write).
pub const STALE_END: &str = "a record of an earlier epoch";
/// Largest metadata part we accept when scanning (guards against garbage lengths).
pub const MAX_META: u64 = 1 << 30;
/// Zeros kept written past the last record (see "Zeroed runway").
pub const RUNWAY: u64 = 2 << 20;
/// Records larger than this grow the file themselves (a zeroed runway would
/// double their writes for a saving that is small next to their size).
const RUNWAY_MAX_RECORD: u64 = 256 << 10;

/// A journal file header; `nonce` 0 writes the older, unkeyed format.
pub fn file_header(epoch: Epoch, prev_seq: Seq, nonce: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0..8].copy_from_slice(if nonce == 0 { FILE_MAGIC } else { FILE_MAGIC_KEYED });
    h[8..16].copy_from_slice(&epoch.0.to_le_bytes());
    h[16..24].copy_from_slice(&prev_seq.0.to_le_bytes());
    h[28..32].copy_from_slice(&nonce.to_le_bytes());
    let crc = header_crc(&h);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

fn header_crc(h: &[u8; 32]) -> u32 {
    let crc = crc32c::crc32c(&h[0..24]);
    if &h[0..8] == FILE_MAGIC {
        crc
    } else {
        crc32c::crc32c_append(crc, &h[28..32])
    }
}

/// The nonce of a valid file header (0 for an older journal), or `None`.
pub fn header_nonce(h: &[u8; 32]) -> Option<u32> {
    let magic_ok = &h[0..8] == FILE_MAGIC || &h[0..8] == FILE_MAGIC_KEYED;
    if !magic_ok || u32::from_le_bytes(h[24..28].try_into().expect("4 bytes")) != header_crc(h) {
        return None;
    }
    if &h[0..8] == FILE_MAGIC {
        return Some(0); // bytes 28..32 were never checked there
    }
    let nonce = u32::from_le_bytes(h[28..32].try_into().expect("4 bytes"));
    (nonce != 0).then_some(nonce)
}

/// A fresh non-zero nonce for a new journal file (`getrandom`, else the
/// clock and pid mixed).
pub fn new_nonce() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: `b` is a valid 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let mut v = u32::from_le_bytes(b);
    if n != 4 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut x = [0u8; 16];
        x[0..8].copy_from_slice(&(t.as_nanos() as u64).to_le_bytes());
        x[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        v = crc32c::crc32c(&x);
    }
    if v == 0 {
        1
    } else {
        v
    }
}

/// The record header check (bytes 44..48) of a keyed journal.
fn header_check(nonce: u32, h: &[u8]) -> u32 {
    crc32c::crc32c_append(!nonce, &h[0..40])
}

/// Appends records to the journal of the current epoch.
pub struct JournalWriter {
    pub epoch: Epoch,
    pub path: PathBuf,
    pub file: Arc<dyn StoredFile>,
    /// Where the next record goes.
    pub end: u64,
    /// The file's nonce (its header): seeds every record's checksums.
    pub nonce: u32,
}

/// Where a record landed.
pub struct Appended {
    pub start: u64,
    /// File offset of the record's data part.
    pub data_start: u64,
    pub end: u64,
}

impl JournalWriter {
    /// Appends one record. `data` is called with a sink that takes the data
    /// part in order; exactly `data_len` bytes must be written to it. On
    /// error the file is cut back so the partial record leaves no trace.
    /// `sync_follows`: the caller syncs this record at once (a durable
    /// commit), so a small one gets a zeroed runway (see "Zeroed runway");
    /// records nobody waits for (plain writes, ordered commits) just grow
    /// the file: zeroing first would write every byte of a growing journal
    /// twice (64 KiB plain writes into a fresh mount: 130 MiB for 64).
    #[allow(clippy::too_many_arguments)]
    pub fn append(
        &mut self,
        seq: Seq,
        durable_upto: u64,
        version: u16,
        meta: &[u8],
        data_len: u64,
        sync_follows: bool,
        data: &mut dyn FnMut(&mut DataSink<'_>) -> Result<()>,
    ) -> Result<Appended> {
        let start = self.end;
        let rec_end = start + REC_HEADER_LEN + meta.len() as u64 + data_len;
        if sync_follows && rec_end - start <= RUNWAY_MAX_RECORD {
            self.extend_runway(rec_end);
        }
        let res = self.append_inner(start, seq, durable_upto, version, meta, data_len, data);
        if res.is_err() {
            // Best effort: a failed cut leaves garbage that fails its checksum.
            let _ = self.file.set_len(start);
        }
        res
    }

    /// Makes sure zeros are written from the end of the file to `rec_end`
    /// plus a runway. Best effort: on failure (a full disk) the file is cut
    /// back and the record grows the file itself.
    fn extend_runway(&mut self, rec_end: u64) {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let Ok(len) = self.file.len() else { return };
        if len >= rec_end {
            return;
        }
        let to = rec_end + RUNWAY;
        let mut at = len;
        while at < to {
            let n = (to - at).min(ZEROS.len() as u64) as usize;
            if self.file.write_at(at, &ZEROS[..n]).is_err() {
                let _ = self.file.set_len(len);
                return;
            }
            at += n as u64;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn append_inner(
        &mut self,
        start: u64,
        seq: Seq,
        durable_upto: u64,
        version: u16,
        meta: &[u8],
        data_len: u64,
        data: &mut dyn FnMut(&mut DataSink<'_>) -> Result<()>,
    ) -> Result<Appended> {
        let mut h = [0u8; REC_HEADER_LEN as usize];
        h[0..4].copy_from_slice(&REC_MAGIC.to_le_bytes());
        h[4..6].copy_from_slice(&version.to_le_bytes());
        h[6..8].copy_from_slice(&KIND_COMMIT.to_le_bytes());
        h[8..16].copy_from_slice(&seq.0.to_le_bytes());
        h[16..24].copy_from_slice(&durable_upto.to_le_bytes());
        h[24..28].copy_from_slice(&(meta.len() as u32).to_le_bytes());
        h[32..40].copy_from_slice(&data_len.to_le_bytes());
        if self.nonce != 0 {
            let hc = header_check(self.nonce, &h);
            h[44..48].copy_from_slice(&hc.to_le_bytes());
        }
        let mut crc = crc32c::crc32c_append(self.nonce, &h[0..40]);
        crc = crc32c::crc32c_append(crc, meta);
        let path = self.path.clone();
        let what = || format!("{}", path.display());
        let data_start = start + REC_HEADER_LEN + meta.len() as u64;
        // The sink starts with a placeholder header and the meta: a record
        // that fits its buffer (every small commit) is one `pwrite`, header
        // included, instead of three (meta, data, header). Its checksum
        // covers it all, so a torn write fails it wherever it tore; the
        // header is only ever written last for records too big for that.
        let mut sink = if REC_HEADER_LEN as usize + meta.len() <= SINK_BUF {
            let mut buf =
                Vec::with_capacity(REC_HEADER_LEN as usize + meta.len() + data_len.min(SINK_BUF as u64) as usize);
            buf.extend_from_slice(&[0u8; REC_HEADER_LEN as usize]);
            buf.extend_from_slice(meta);
            DataSink { file: &*self.file, at: start, crc, written: 0, buf, kicked: start }
        } else {
            // A big meta part (thousands of names) is written as it is.
            self.file.write_at(start + REC_HEADER_LEN, meta).ctx("journal write", what)?;
            DataSink { file: &*self.file, at: data_start, crc, written: 0, buf: Vec::new(), kicked: data_start }
        };
        data(&mut sink)?;
        if sink.written != data_len {
            return Err(Error::Poisoned(format!(
                "journal record data length mismatch: {} != {data_len}",
                sink.written
            )));
        }
        h[40..44].copy_from_slice(&sink.crc.to_le_bytes());
        let one_write = sink.at == start; // nothing flushed yet: the header goes with the rest
        if one_write {
            sink.buf[..REC_HEADER_LEN as usize].copy_from_slice(&h);
        }
        sink.finish()?;
        if !one_write {
            self.file.write_at(start, &h).ctx("journal write", what)?;
        }
        let end = data_start + data_len;
        self.end = end;
        Ok(Appended { start, data_start, end })
    }
}

/// Streams a record's data part into the journal. Small pieces (a
/// transaction's 4 KiB writes) are gathered and written together: one
/// `pwrite` per [`SINK_BUF`] instead of one per extent.
///
/// A big record's data is pushed toward the device every [`KICK`] bytes
/// (`StoredFile::start_writeback`) while the rest is still being copied:
/// otherwise the whole record waits in the page cache for the commit's
/// `fdatasync`, and the one durable commit after a run of big ordered ones
/// pays for flushing all of them at once.
pub struct DataSink<'a> {
    file: &'a dyn StoredFile,
    /// Where `buf` goes (everything before it is written).
    at: u64,
    crc: u32,
    written: u64,
    buf: Vec<u8>,
    /// Everything before this was handed to `start_writeback`.
    kicked: u64,
}

const SINK_BUF: usize = 256 << 10;
/// Writeback of a record's data starts in pieces of this size.
const KICK: u64 = 1 << 20;
/// The page size the journal's writes are padded to (see `finish`).
const PAGE: u64 = 4096;

impl DataSink<'_> {
    pub fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.written += bytes.len() as u64;
        if self.buf.len() + bytes.len() <= SINK_BUF {
            self.buf.extend_from_slice(bytes);
            return Ok(());
        }
        self.flush()?;
        if bytes.len() < SINK_BUF {
            self.buf.extend_from_slice(bytes);
            return Ok(());
        }
        self.file.write_at(self.at, bytes).ctx("journal write", || "record data".into())?;
        self.at += bytes.len() as u64;
        self.kick();
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.file.write_at(self.at, &self.buf).ctx("journal write", || "record data".into())?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
            self.kick();
        }
        Ok(())
    }

    /// Writes what is gathered, and zeros from the record's end to the end
    /// of its last page. A write that covers only part of a page the page
    /// cache does not hold must read it first: appends into a recycled
    /// journal, or after its pages were evicted, paid a synchronous 4 KiB
    /// read per commit, a large part of a small durable commit's time.
    /// Past the end there is only the runway, old epochs' bytes or nothing,
    /// and zeros there are a clean end (see "Zeroed runway").
    fn finish(&mut self) -> Result<()> {
        let end = self.at + self.buf.len() as u64;
        let pad = (PAGE - end % PAGE) % PAGE;
        self.buf.resize(self.buf.len() + pad as usize, 0);
        self.flush()
    }

    fn kick(&mut self) {
        if self.at - self.kicked >= KICK {
            self.file.start_writeback(self.kicked, self.at - self.kicked);
            self.kicked = self.at;
        }
    }
}

/// One record found by [`scan`].
#[derive(Debug)]
pub struct Scanned {
    pub seq: Seq,
    pub start: u64,
    pub data_start: u64,
    pub end: u64,
    pub record: CommitRecord,
}

/// Result of scanning one journal file.
#[derive(Debug)]
pub struct Scan {
    /// Seq of the last commit before this epoch (from the file header).
    pub prev_seq: Seq,
    pub records: Vec<Scanned>,
    /// End of the last whole record: appends continue here.
    pub valid_end: u64,
    /// Where and why a torn tail was cut, if it was.
    pub cut: Option<(u64, String)>,
    /// The file's nonce (0: an older, unkeyed journal).
    pub nonce: u32,
}

struct RawHeader {
    version: u16,
    seq: u64,
    durable_upto: u64,
    meta_len: u64,
    data_len: u64,
    end: u64,
}

/// Parses the record header at `at` (checked against the nonce in a keyed
/// journal), reading nothing else; `Err(reason)` if it is not one.
fn read_header(
    file: &dyn StoredFile,
    len: u64,
    at: u64,
    nonce: u32,
) -> std::result::Result<(RawHeader, [u8; 48]), String> {
    if at + REC_HEADER_LEN > len {
        return Err("short record header".into());
    }
    let mut h = [0u8; REC_HEADER_LEN as usize];
    read_exact(file, at, &mut h).map_err(|e| e.to_string())?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
    if u32_at(0) != REC_MAGIC {
        return Err("bad record magic".into());
    }
    if nonce != 0 && u32_at(44) != header_check(nonce, &h) {
        return Err("record header checksum mismatch".into());
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != REC_VERSION && version != REC_VERSION_FILES {
        return Err(format!("unknown record version {version}"));
    }
    let meta_len = u32_at(24) as u64;
    let data_len = u64_at(32);
    if meta_len > MAX_META || data_len > len {
        return Err("implausible record length".into());
    }
    let end = at + REC_HEADER_LEN + meta_len + data_len;
    if end > len {
        return Err("record runs past end of file".into());
    }
    Ok((RawHeader { version, seq: u64_at(8), durable_upto: u64_at(16), meta_len, data_len, end }, h))
}

/// Parses and checksums the record at `at`; `Err(reason)` if it is not whole.
fn read_record(
    file: &dyn StoredFile,
    len: u64,
    at: u64,
    nonce: u32,
) -> std::result::Result<(RawHeader, Vec<u8>), String> {
    let (rh, h) = read_header(file, len, at, nonce)?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let (meta_len, end) = (rh.meta_len, rh.end);
    let mut meta = vec![0u8; meta_len as usize];
    read_exact(file, at + REC_HEADER_LEN, &mut meta).map_err(|e| e.to_string())?;
    let mut crc = crc32c::crc32c_append(nonce, &h[0..40]);
    crc = crc32c::crc32c_append(crc, &meta);
    let mut buf = vec![0u8; 1 << 20];
    let mut off = at + REC_HEADER_LEN + meta_len;
    while off < end {
        let n = ((end - off) as usize).min(buf.len());
        read_exact(file, off, &mut buf[..n]).map_err(|e| e.to_string())?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n as u64;
    }
    if crc != u32_at(40) {
        return Err("record checksum mismatch".into());
    }
    Ok((rh, meta))
}

/// The seq of an earlier epoch's record header at `at` — magic, a known
/// version, a commit, a seq in `1..=prev_seq` — unverified (it was keyed
/// with the file's earlier nonce): only to tell the old bytes of a
/// recycled journal from a torn tail in what `txfs check` says.
fn old_header(file: &dyn StoredFile, len: u64, at: u64, prev_seq: u64) -> Option<u64> {
    if at + REC_HEADER_LEN > len {
        return None;
    }
    let mut h = [0u8; REC_HEADER_LEN as usize];
    read_exact(file, at, &mut h).ok()?;
    let version = u16::from_le_bytes([h[4], h[5]]);
    let kind = u16::from_le_bytes([h[6], h[7]]);
    let seq = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let ok = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes")) == REC_MAGIC
        && (version == REC_VERSION || version == REC_VERSION_FILES)
        && kind == KIND_COMMIT
        && (1..=prev_seq).contains(&seq);
    ok.then_some(seq)
}

/// The seq field of whatever lies at `at`, read as a record header.
fn raw_seq(file: &dyn StoredFile, len: u64, at: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (at + 16 <= len).then_some(())?;
    read_exact(file, at + 8, &mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Whether every byte from `at` to `len` is zero.
fn zero_tail(file: &dyn StoredFile, len: u64, mut at: u64) -> bool {
    let mut buf = vec![0u8; 1 << 16];
    while at < len {
        let n = ((len - at) as usize).min(buf.len());
        if read_exact(file, at, &mut buf[..n]).is_err() || buf[..n].iter().any(|b| *b != 0) {
            return false;
        }
        at += n as u64;
    }
    true
}

pub fn read_exact(file: &dyn StoredFile, mut off: u64, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = file.read_at(off, buf)?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        off += n as u64;
        buf = &mut buf[n..];
    }
    Ok(())
}

/// Reads every whole record of one epoch's journal (J3).
pub fn scan(file: &dyn StoredFile, path: &std::path::Path, epoch: Epoch) -> Result<Scan> {
    let corrupt = |offset: u64, detail: String| Error::Corrupt { path: path.to_path_buf(), offset, detail };
    let len = file.len().ctx("journal stat", || path.display().to_string())?;
    let mut h = [0u8; FILE_HEADER_LEN as usize];
    if len < FILE_HEADER_LEN {
        return Err(corrupt(0, "journal shorter than its header".into()));
    }
    read_exact(file, 0, &mut h).ctx("journal read", || path.display().to_string())?;
    let Some(nonce) = header_nonce(&h) else {
        return Err(corrupt(0, "bad journal file header".into()));
    };
    let file_epoch = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    if file_epoch != epoch.0 {
        return Err(corrupt(8, format!("header says epoch {file_epoch}, file name says {}", epoch.0)));
    }
    let mut records = Vec::new();
    let mut at = FILE_HEADER_LEN;
    let prev_seq = Seq(u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")));
    let mut expect_seq: Option<u64> = Some(prev_seq.0 + 1);
    while at < len {
        // A whole record of an earlier epoch is the end of this one: the
        // rest of a recycled journal ("Recycled journals").
        let rec = read_record(file, len, at, nonce).and_then(|(rh, meta)| {
            if rh.seq <= prev_seq.0 {
                Err(format!("{STALE_END} (seq {}): the rest of a recycled journal", rh.seq))
            } else {
                Ok((rh, meta))
            }
        });
        match rec {
            Ok((rh, meta)) => {
                if let Some(s) = expect_seq {
                    if rh.seq != s {
                        return Err(corrupt(at, format!("record seq {} where {} was expected", rh.seq, s)));
                    }
                }
                let record = CommitRecord::decode(&meta, rh.version)
                    .map_err(|e| corrupt(at, format!("undecodable record metadata: {e}")))?;
                expect_seq = Some(rh.seq + 1);
                let data_start = at + REC_HEADER_LEN + rh.meta_len;
                debug_assert_eq!(data_start + rh.data_len, rh.end);
                records.push(Scanned { seq: Seq(rh.seq), start: at, data_start, end: rh.end, record });
                at = rh.end;
            }
            Err(reason) => {
                // Nothing but zeros from here on is the runway: the clean
                // end, unless a later record says it was durable (checked
                // below). Anything else after a zero header (records whose
                // predecessor's header never landed) is a torn tail to cut:
                // left in place, a later append could line up with it.
                let clean = zero_tail(file, len, at);
                // An earlier epoch's record header at or after the end (its
                // seq not past this file's prev_seq): the old bytes of a
                // recycled journal, not a torn record of this one.
                let mut old = old_header(file, len, at, prev_seq.0);
                // Is there a later whole record claiming durability past here?
                let mut probe = at + 1;
                let mut buf = vec![0u8; 1 << 16];
                while probe + REC_HEADER_LEN <= len {
                    let n = ((len - probe) as usize).min(buf.len());
                    if file.read_at(probe, &mut buf[..n]).is_err() {
                        break;
                    }
                    let magic = REC_MAGIC.to_le_bytes();
                    for i in 0..n.saturating_sub(3) {
                        if buf[i..i + 4] == magic {
                            // Only this epoch's records speak of this file's
                            // offsets (older ones: recycled). The header
                            // decides before the body it claims is read.
                            let cand = probe + i as u64;
                            old = old.or_else(|| old_header(file, len, cand, prev_seq.0));
                            let witness = |rh: &RawHeader| rh.seq > prev_seq.0 && rh.durable_upto > at;
                            if !read_header(file, len, cand, nonce).is_ok_and(|(rh, _)| witness(&rh)) {
                                continue;
                            }
                            if let Ok((rh, _)) = read_record(file, len, cand, nonce) {
                                return Err(corrupt(
                                    at,
                                    format!(
                                        "{reason}, but a later record (seq {}) says the journal was durable up to {}",
                                        rh.seq, rh.durable_upto
                                    ),
                                ));
                            }
                        }
                    }
                    probe += (n.saturating_sub(3)).max(1) as u64;
                }
                let not_ours = ["bad record magic", "record header checksum mismatch", "short record header"];
                // A header here that carries the next seq is this epoch's
                // record, damaged or torn (a flipped magic, say): never
                // reported as old bytes.
                let next_here = expect_seq.is_some_and(|n| raw_seq(file, len, at) == Some(n));
                let reason = match old {
                    Some(seq) if !next_here && not_ours.contains(&reason.as_str()) => {
                        format!("{STALE_END} (seq {seq}) follows: the rest of a recycled journal ({reason} here)")
                    }
                    _ => reason,
                };
                let cut = if clean { None } else { Some((at, reason)) };
                return Ok(Scan { prev_seq, records, valid_end: at, cut, nonce });
            }
        }
    }
    Ok(Scan { prev_seq, records, valid_end: at, cut: None, nonce })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_zero_is_the_older_unkeyed_checksum() {
        // Journals written before the nonce (TXFSJNL1) stay readable: a
        // checksum seeded with 0 is crc32c itself.
        let h = [7u8; 40];
        assert_eq!(crc32c::crc32c_append(0, &h), crc32c::crc32c(&h));
        let old = file_header(Epoch(3), Seq(9), 0);
        assert_eq!(&old[0..8], FILE_MAGIC);
        assert_eq!(u32::from_le_bytes(old[24..28].try_into().unwrap()), crc32c::crc32c(&old[0..24]));
        assert_eq!(header_nonce(&old), Some(0));
        let new = file_header(Epoch(3), Seq(9), 0xdead_beef);
        assert_eq!(&new[0..8], FILE_MAGIC_KEYED);
        assert_eq!(header_nonce(&new), Some(0xdead_beef));
        let mut bad = new;
        bad[30] ^= 1; // the nonce is covered by the header checksum
        assert_eq!(header_nonce(&bad), None);
        assert_ne!(new_nonce(), 0);
    }

    /// A file that remembers the writeback hints it gets.
    #[derive(Default)]
    struct Hinted {
        data: parking_lot::Mutex<Vec<u8>>,
        hints: parking_lot::Mutex<Vec<(u64, u64)>>,
        /// (offset, length) of every write.
        writes: parking_lot::Mutex<Vec<(u64, usize)>>,
    }

    impl StoredFile for Hinted {
        fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            let d = self.data.lock();
            let n = buf.len().min(d.len().saturating_sub(off as usize));
            buf[..n].copy_from_slice(&d[off as usize..off as usize + n]);
            Ok(n)
        }
        fn write_at(&self, off: u64, data: &[u8]) -> std::io::Result<()> {
            self.writes.lock().push((off, data.len()));
            let mut d = self.data.lock();
            let end = off as usize + data.len();
            if d.len() < end {
                d.resize(end, 0);
            }
            d[off as usize..end].copy_from_slice(data);
            Ok(())
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.data.lock().resize(len as usize, 0);
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(self.data.lock().len() as u64)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn start_writeback(&self, off: u64, len: u64) {
            self.hints.lock().push((off, len));
        }
    }

    /// Zeros go ahead of small records that a sync follows (durable
    /// commits), and of nothing else: a growing journal of plain writes is
    /// written once, not zeroed first.
    #[test]
    fn only_records_a_sync_follows_get_a_runway() {
        let f = Arc::new(Hinted::default());
        let mut w = JournalWriter { epoch: Epoch(1), path: "j".into(), file: f.clone(), end: 64, nonce: 7 };
        let page = [1u8; 4096];
        let page_end = |e: u64| e.div_ceil(PAGE) * PAGE;
        for i in 0..8 {
            let a = w.append(Seq(i + 1), 0, 1, b"m", 4096, false, &mut |s| s.put(&page)).unwrap();
            assert_eq!(f.len().unwrap(), page_end(a.end), "plain record {i}: the file ends with the record's page");
            let d = f.data.lock();
            assert!(d[a.end as usize..].iter().all(|b| *b == 0), "zeros after the record, to its page's end");
        }
        let a = w.append(Seq(9), 0, 1, b"m", 4096, true, &mut |s| s.put(&page)).unwrap();
        assert_eq!(f.len().unwrap(), a.end + RUNWAY, "a durable one: zeros ahead");
        let b = w.append(Seq(10), 0, 1, b"m", 4096, true, &mut |s| s.put(&page)).unwrap();
        assert_eq!(f.len().unwrap(), a.end + RUNWAY, "the next one lands in them (the file does not grow)");
        assert!(b.end < a.end + RUNWAY);
    }

    /// A big record's data is handed to writeback in pieces while it is
    /// written (contiguous from the record's start, within its pages, at
    /// least KICK each); a small record's is not.
    #[test]
    fn big_records_start_writeback_as_they_are_written() {
        let f = Arc::new(Hinted::default());
        let mut w = JournalWriter { epoch: Epoch(1), path: "j".into(), file: f.clone(), end: 64, nonce: 7 };
        let piece = vec![5u8; 100 << 10];
        let small = w.append(Seq(1), 0, 1, b"m", 4096, true, &mut |s| s.put(&piece[..4096])).unwrap();
        assert!(f.hints.lock().is_empty(), "a 4 KiB record: no hint");
        let n = 35u64; // 3.5 MiB in 100 KiB pieces
        let big = w
            .append(Seq(2), 0, 1, b"meta", n * piece.len() as u64, true, &mut |s| {
                for _ in 0..n {
                    s.put(&piece)?;
                }
                Ok(())
            })
            .unwrap();
        assert!(big.start >= small.end);
        let hints = f.hints.lock().clone();
        assert!(hints.len() >= 3, "3.5 MiB: at least 3 pieces, got {hints:?}");
        let mut at = big.start;
        for (off, len) in &hints {
            assert_eq!(*off, at, "contiguous from the record's start: {hints:?}");
            assert!(*len >= KICK, "{hints:?}");
            at += len;
        }
        assert!(at <= big.end.div_ceil(PAGE) * PAGE, "within the record's pages: {hints:?}");
    }

    /// A record that fits the sink's buffer is one write, header included,
    /// padded to its page's end; it scans back as written. A big one still
    /// writes its header last.
    #[test]
    fn a_small_record_is_one_write() {
        let f = Arc::new(Hinted::default());
        let mut w = JournalWriter { epoch: Epoch(1), path: "j".into(), file: f.clone(), end: 64, nonce: 7 };
        let page = vec![9u8; 4096];
        let a = w.append(Seq(1), 0, 1, b"meta", 4096, false, &mut |s| s.put(&page)).unwrap();
        assert_eq!(
            *f.writes.lock(),
            vec![(64, (a.end.div_ceil(PAGE) * PAGE - 64) as usize)],
            "one write for the whole record"
        );
        assert_eq!(&f.data.lock()[a.data_start as usize..a.end as usize], &page[..]);
        f.writes.lock().clear();
        let big = vec![3u8; SINK_BUF + 1];
        let b = w.append(Seq(2), 0, 1, b"meta", big.len() as u64, false, &mut |s| s.put(&big)).unwrap();
        let writes = f.writes.lock().clone();
        assert!(writes.len() >= 2, "{writes:?}");
        assert_eq!(writes.last().map(|w| w.0), Some(b.start), "the header last: {writes:?}");
    }
}
