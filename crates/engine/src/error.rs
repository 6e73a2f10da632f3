//! One error type for the engine, and the one place that maps it to errno.

use crate::ids::{ObjId, TxId};
use std::io;
use std::path::PathBuf;

/// The errno `txfs.h` calls `TXFS_ECONFLICT`. A standard errno value, because
/// FUSE turns anything from 512 up into EIO. `EDEADLK` reads as what it is:
/// the transaction lost a race and must be retried.
pub const ECONFLICT: i32 = libc::EDEADLK;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transaction read or wrote something another transaction changed
    /// and committed first. Nothing it did survives; abort and retry.
    #[error("{tx}: serialization conflict on {what}; abort and retry the transaction")]
    Conflict { tx: TxId, what: String },
    /// An operation on a path or object failed with a POSIX error.
    #[error("{op} {what}: {source}")]
    Os { op: &'static str, what: String, source: io::Error },
    /// The transaction went past a memory or read-set cap (`Options::tx_mem`,
    /// `mount_tx_mem`, `tx_reads`): its memory is gone, it can only be
    /// aborted, and a rerun would meet the same cap.
    #[error("{tx}: transaction too big: {what}; abort it (split it, or raise the mount's cap)")]
    Limit { tx: TxId, what: String },
    #[error("{0}: no such transaction (already committed or aborted?)")]
    NoSuchTx(TxId),
    #[error("{0}: no such object")]
    Stale(ObjId),
    /// The journal or a checkpoint plan is damaged before its last whole
    /// commit: recovery refuses to guess.
    #[error("journal damaged at {path}, offset {offset}: {detail}")]
    Corrupt { path: PathBuf, offset: u64, detail: String },
    /// Commits that the durable high-water mark says were durable are not
    /// in the journal (truncated, shortened, replaced or deleted):
    /// recovery refuses rather than start without them.
    #[error("{0}. To proceed: {how}", how = crate::log::mark::HOW)]
    Lost(String),
    /// The engine hit an I/O error writing its journal and refuses further
    /// writes until reopened (a retried fsync proves nothing).
    #[error("engine stopped after an earlier I/O error ({0}); remount to recover")]
    Poisoned(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno a C programmer expects for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Conflict { .. } => ECONFLICT,
            Error::Limit { .. } => libc::ENOSPC,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::NoSuchTx(_) => libc::EINVAL,
            Error::Stale(_) => libc::ESTALE,
            Error::Corrupt { .. } => libc::EIO,
            Error::Lost(_) => libc::EIO,
            Error::Poisoned(_) => libc::EIO,
        }
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// A POSIX error with the given errno.
    pub fn posix(op: &'static str, what: impl Into<String>, errno: i32) -> Error {
        Error::Os { op, what: what.into(), source: io::Error::from_raw_os_error(errno) }
    }

    pub fn io(op: &'static str, what: impl Into<String>, source: io::Error) -> Error {
        Error::Os { op, what: what.into(), source }
    }
}

/// Adds "what and where" to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, op: &'static str, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Os { op, what: what(), source })
    }
}
