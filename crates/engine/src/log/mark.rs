//! The durable high-water mark, `.txfs/mark`: proof outside the journal of
//! how far the journal was durable, so that recovery and `txfs check` can
//! refuse a journal that lost acknowledged commits (truncated, shortened,
//! replaced, deleted) instead of starting afresh or cutting it.
//!
//! ```text
//! .txfs/mark: 8192 bytes, two slots, at 0 and at 4096 (64 bytes each)
//!    0  [u8;8] magic "TXFSMRK1"
//!    8  u64    generation: the slot with the higher valid one is the mark
//!   16  u64    epoch of the journal the mark speaks of
//!   24  u64    seq: every commit up to this one was durable
//!   32  u64    journal offset where the records up to `seq` end
//!   40  u32    the journal's nonce (its identity: new for every journal file)
//!   44  u32    0
//!   48  u32    crc32c of bytes 0..48
//! ```
//!
//! The file is created whole (both slots) as `mark.tmp`, synced, renamed,
//! and `.txfs` synced: a `mark` name that exists holds a valid slot. Later
//! updates overwrite the older slot in place and `fdatasync` the file: a
//! torn update leaves the other slot, an older but true mark (the two slots
//! lie in different 4 KiB pages). A mark that lags is harmless — it claims
//! only "at least up to here was durable" — so it is written at each open,
//! after each checkpoint, and lazily by the background thread (at most once
//! a second, after its journal flush), never on a commit's path.
//! Design: docs/design/journal.md, "The high-water mark".

use crate::error::{IoContext, Result};
use crate::ids::{Epoch, Seq};
use crate::log::files::{is_missing, META_DIR};
use crate::storage::Storage;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TXFSMRK1";
const SLOT: u64 = 4096;
const SLOT_LEN: usize = 52;

pub fn mark_path() -> PathBuf {
    Path::new(META_DIR).join("mark")
}

fn tmp_path() -> PathBuf {
    Path::new(META_DIR).join("mark.tmp")
}

/// Removes a `mark.tmp` that a crash left (recovery, before anything else).
pub fn drop_tmp(s: &dyn Storage) -> Result<()> {
    match s.unlink(&tmp_path()) {
        Ok(()) => Ok(()),
        Err(e) if is_missing(&e) => Ok(()),
        Err(e) => Err(crate::error::Error::io("mark", tmp_path().display().to_string(), e)),
    }
}

/// What the mark says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkValue {
    pub epoch: Epoch,
    pub seq: Seq,
    pub end: u64,
    pub nonce: u32,
}

fn encode(gen: u64, v: &MarkValue) -> [u8; SLOT_LEN] {
    let mut b = [0u8; SLOT_LEN];
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&gen.to_le_bytes());
    b[16..24].copy_from_slice(&v.epoch.0.to_le_bytes());
    b[24..32].copy_from_slice(&v.seq.0.to_le_bytes());
    b[32..40].copy_from_slice(&v.end.to_le_bytes());
    b[40..44].copy_from_slice(&v.nonce.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..48]);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(u64, MarkValue)> {
    if b.len() < SLOT_LEN || &b[0..8] != MAGIC {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if u32::from_le_bytes(b[48..52].try_into().expect("4 bytes")) != crc32c::crc32c(&b[0..48]) {
        return None;
    }
    let v = MarkValue {
        epoch: Epoch(u64_at(16)),
        seq: Seq(u64_at(24)),
        end: u64_at(32),
        nonce: u32::from_le_bytes(b[40..44].try_into().expect("4 bytes")),
    };
    Some((u64_at(8), v))
}

/// What is on disk: no mark (a backing older than marks, or one never
/// opened), a mark, or a mark file with no valid slot (damage).
#[derive(Debug)]
pub enum OnDisk {
    Absent,
    Valid { gen: u64, value: MarkValue },
    Damaged(String),
}

/// Reads `.txfs/mark`.
pub fn read(s: &dyn Storage) -> Result<OnDisk> {
    let p = mark_path();
    let mut best: Option<(u64, MarkValue)> = None;
    for slot in 0..2u64 {
        let mut b = [0u8; SLOT_LEN];
        let n = match s.read_at(&p, slot * SLOT, &mut b) {
            Ok(n) => n,
            Err(e) if is_missing(&e) => return Ok(OnDisk::Absent),
            Err(e) => return Err(crate::error::Error::io("mark", p.display().to_string(), e)),
        };
        if let Some((g, v)) = decode(&b[..n]) {
            if best.is_none_or(|(bg, _)| g > bg) {
                best = Some((g, v));
            }
        }
    }
    Ok(match best {
        Some((gen, value)) => OnDisk::Valid { gen, value },
        None => OnDisk::Damaged(format!("{}: neither of its two slots is valid", p.display())),
    })
}

/// The engine's writer of the mark: serializes updates and never moves the
/// mark backwards.
pub struct Mark {
    inner: Mutex<Option<(u64, MarkValue)>>,
}

impl Mark {
    /// `on_disk`: what recovery read (a damaged mark accepted with
    /// `accept_loss` is replaced whole by the first write).
    pub fn new(on_disk: &OnDisk) -> Mark {
        let cur = match on_disk {
            OnDisk::Valid { gen, value } => Some((*gen, *value)),
            _ => None,
        };
        Mark { inner: Mutex::new(cur) }
    }

    /// Records `v` as durable. The caller guarantees that every commit up
    /// to `v.seq` is durable and that journal `v.epoch` (nonce `v.nonce`)
    /// is durable under its name. A value older than the one recorded is
    /// skipped; `force` rewrites the file whole (after accepted damage).
    pub fn write(&self, s: &dyn Storage, v: MarkValue, force: bool) -> Result<()> {
        let mut g = self.inner.lock();
        let p = mark_path();
        match *g {
            Some((gen, cur)) if !force => {
                if v == cur || v.epoch < cur.epoch || v.seq < cur.seq {
                    return Ok(());
                }
                let gen = gen + 1;
                let f = s.open_file(&p, false).ctx("mark", || p.display().to_string())?;
                f.write_at((gen % 2) * SLOT, &encode(gen, &v)).ctx("mark", || p.display().to_string())?;
                f.sync_data().ctx("mark", || p.display().to_string())?;
                *g = Some((gen, v));
            }
            _ => {
                let gen = g.map_or(1, |(gen, _)| gen + 1);
                let t = tmp_path();
                let _ = s.unlink(&t);
                let f = s.open_file(&t, true).ctx("mark", || t.display().to_string())?;
                let slot = encode(gen, &v);
                f.write_at(0, &slot).ctx("mark", || t.display().to_string())?;
                f.write_at(SLOT, &slot).ctx("mark", || t.display().to_string())?;
                f.sync_data().ctx("mark", || t.display().to_string())?;
                drop(f);
                s.rename(&t, &p).ctx("mark", || p.display().to_string())?;
                s.fsync(Path::new(META_DIR)).ctx("mark", || META_DIR.into())?;
                *g = Some((gen, v));
            }
        }
        Ok(())
    }
}

/// What a journal found at recovery looks like next to the mark.
pub struct Found {
    pub epoch: Epoch,
    pub nonce: u32,
    pub prev_seq: Seq,
    /// Seq of the last whole record kept (`prev_seq` if none).
    pub last_seq: Seq,
}

/// How to proceed, said in every refusal.
pub const HOW: &str = "restore .txfs/ from a copy if you have one; or run `txfs recover --accept-loss BACKING` \
                       to keep what survives (the commits named are lost)";

/// `None` if the journal holds everything the mark says was durable;
/// otherwise what is missing.
pub fn verify(m: &MarkValue, j: Option<&Found>) -> Option<String> {
    let Some(j) = j else {
        return Some(format!(
            "no journal file, but {} records every commit up to seq {} of epoch {} as durable: the journal was \
             deleted",
            mark_path().display(),
            m.seq.0,
            m.epoch.0
        ));
    };
    if j.epoch < m.epoch {
        return Some(format!(
            "the journal is of epoch {}, older than epoch {} that {} records: it was replaced by an older one",
            j.epoch.0,
            m.epoch.0,
            mark_path().display()
        ));
    }
    if j.epoch == m.epoch && j.nonce != m.nonce {
        return Some(format!(
            "the journal of epoch {} is not the file {} records (its identity differs): it was replaced",
            j.epoch.0,
            mark_path().display()
        ));
    }
    let have = if j.epoch == m.epoch { j.last_seq } else { j.prev_seq };
    if have < m.seq {
        return Some(format!(
            "the journal of epoch {} ends at seq {}, but {} records every commit up to seq {} as durable: {} \
             acknowledged commits are missing (the journal was truncated or shortened)",
            j.epoch.0,
            have.0,
            mark_path().display(),
            m.seq.0,
            m.seq.0 - have.0
        ));
    }
    None
}
