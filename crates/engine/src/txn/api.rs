//! The plain values of the engine's public API: what [`super::Engine`]
//! takes ([`Options`], [`Durability`], [`SetAttr`], [`RenameFlags`]) and
//! returns ([`Attr`], [`DirEntry`], [`Stats`]). They depend on nothing of
//! the engine, so every room of it (and checkpoint and recovery) can use
//! them without importing the facade.

use crate::ids::ObjId;
use crate::storage::{FileKind, Timestamp};
use std::ffi::OsString;
use std::time::Duration;

/// Longest file name, in bytes.
pub const NAME_MAX: usize = 255;

#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of written data a transaction keeps in memory before spilling
    /// the rest to `.txfs/spill/`.
    pub spill_threshold: u64,
    /// A file created by a transaction whose content reaches this size is
    /// staged in a data file of its own: its bytes are written once, synced
    /// before the commit record, and renamed into place by the checkpoint
    /// instead of being journaled and copied (selective data journaling).
    /// Below it one journal `fdatasync` beats two syncs (measured: a 1 MiB
    /// new file + SQLite row, 2.6 ms journaled vs 5.8 ms staged).
    pub stage_threshold: u64,
    /// Journal size (plus committed data files) that triggers a background
    /// checkpoint.
    pub checkpoint_bytes: u64,
    /// How often the background thread makes ordered commits durable and
    /// checks the journal size; `None`: no background thread.
    pub flush_interval: Option<Duration>,
    /// A mount with committed changes and no commit for this long is
    /// checkpointed in the background (with `flush_interval`): reads then
    /// find untouched files, the committed delta's memory is given back,
    /// and a crash has less to replay. Not when the changes rename, create
    /// or remove more than [`IDLE_CHECKPOINT_MAX_NAMES`] names: a
    /// checkpoint moves names under the engine lock, and every request
    /// waits for that (tens of thousands of names held readers up for
    /// seconds). `None`: only by size.
    pub idle_checkpoint: Option<Duration>,
    /// Memory one live transaction may hold in the daemon: its bytes in
    /// memory and its bookkeeping (delta and read-set entries, counted as
    /// `txn/budget.rs` says). Past it the operation fails with ENOSPC and
    /// the transaction can only be aborted. Its written bytes spill to disk
    /// from half of it on, so payload alone does not meet it.
    pub tx_mem: u64,
    /// Memory all live transactions together may hold (as `tx_mem`): the
    /// transaction whose operation goes past it fails as past `tx_mem`.
    pub mount_tx_mem: u64,
    /// Entries one transaction's read set may hold (page ranges, names,
    /// listings, attributes): its commit validates each under the lock.
    pub tx_reads: u64,
    /// Recovery goes on past a journal that lost commits the durable
    /// high-water mark (`.txfs/mark`) says were durable — truncated,
    /// shortened, replaced or deleted — or past a damaged mark, keeping
    /// what survives and logging what was lost (`txfs recover
    /// --accept-loss`). Without it such a journal is refused.
    pub accept_loss: bool,
}

/// The most name changes an idle checkpoint moves (see
/// [`Options::idle_checkpoint`]): a few milliseconds of the lock.
pub const IDLE_CHECKPOINT_MAX_NAMES: usize = 256;

impl Default for Options {
    fn default() -> Self {
        Options {
            spill_threshold: 64 << 20,
            stage_threshold: 16 << 20,
            checkpoint_bytes: 256 << 20,
            flush_interval: Some(Duration::from_millis(500)),
            idle_checkpoint: Some(Duration::from_secs(5)),
            tx_mem: 128 << 20,
            mount_tx_mem: 192 << 20,
            tx_reads: 1 << 20,
            accept_loss: false,
        }
    }
}

/// How a commit returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Returns after the commit is durable.
    Durable,
    /// Returns once the commit's place in the order is fixed; durable at the
    /// next sync, durable commit or background flush. After a crash the
    /// recovered state is always a prefix of the commit order.
    Ordered,
}

/// Attributes of an object as a transaction (or everyone) sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub obj: ObjId,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    pub obj: ObjId,
    pub kind: FileKind,
}

/// Attribute changes for [`Engine::setattr`](crate::Engine::setattr).
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
}

/// Flags of [`Engine::rename`](crate::Engine::rename) (as `renameat2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// Why an engine stopped acknowledging ([`Engine::fault`](crate::Engine::fault)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The first failure, as the operations that fail now report it.
    pub why: String,
    /// Whether plain reads are still served (they are after a failed
    /// journal sync or a checkpoint that failed writing contents, not in
    /// its namespace phases).
    pub reads_go_on: bool,
    /// A checkpoint that failed writing contents: it is tried again (every
    /// few seconds, and by every explicit checkpoint) while writes, commits
    /// and reads go on; the journal grows until it succeeds.
    pub retried: bool,
}

/// Live counters, for `txfs status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub commits: u64,
    pub aborts: u64,
    pub conflicts: u64,
    pub live_txs: u64,
    pub journal_bytes: u64,
    pub journal_syncs: u64,
    pub checkpoints: u64,
    pub last_seq: u64,
    /// Memory live transactions hold, by the engine's count (budget.rs).
    pub tx_mem: u64,
    /// Transactions doomed by a memory or read-set cap.
    pub limit_aborts: u64,
    /// Commit stamps kept for validation (isolation.rs).
    pub stamps: u64,
}
