//! `txfs-engine`: ACID transactions over an ordinary directory tree,
//! in-process. The FUSE mount of txfs is a thin adapter over this crate.
//!
//! ```no_run
//! use std::sync::Arc;
//! use txfs_engine::{Durability, Engine, ObjId, Options, storage::RealFs};
//! let fs = Arc::new(RealFs::open("/srv/data".as_ref()).unwrap());
//! let engine = Engine::open(fs, Options::default()).unwrap();
//! let tx = engine.begin();
//! let f = engine.create(Some(tx), ObjId::ROOT, "note".as_ref(), 0o644, 0, 0).unwrap();
//! engine.write(Some(tx), f.obj, 0, b"hello").unwrap();
//! engine.commit(tx, Durability::Durable).unwrap(); // all of it, or none of it
//! engine.close().unwrap();
//! ```
//!
//! Folders are the layers, top to bottom:
//! * `txn/`: [`Engine`], the facade, and the transaction layer behind it:
//!   objects, reads, writes, commit, isolation (I1–I4);
//! * `checkpoint/` (applying the committed delta to the backing tree, J1,
//!   J5) and `recovery.rs` (finishing a checkpoint, replaying the journal);
//! * `delta.rs` (what a transaction changes) and `log/` (commit records,
//!   the journal, group commit, data files: J2–J4);
//! * [`storage::Storage`], the one I/O seam, with real, in-memory and
//!   power-cut implementations.
//!
//! `docs/DESIGN.md` states the invariants (J1–J5, I1–I4) that the code
//! cites; each module's opening essay names the tests that exercise them.

mod checkpoint;
mod codec;
#[cfg(test)]
mod codec_golden;
pub mod delta;
mod error;
mod ids;
mod log;
mod recovery;
pub mod storage;
mod txn;

pub use error::{Error, Result, ECONFLICT};
pub use ids::{DataFileId, Epoch, Lsn, ObjId, Seq, TxId};
pub use log::files::META_DIR;
pub use log::journal;
pub use log::mark::{mark_path, MarkValue};
pub use recovery::{check, checkpoint_failed_path, lost_found, CheckReport, JournalReport};
pub use storage::{FileKind, Timestamp};
pub use txn::{
    what, Attr, Change, DirEntry, Durability, Engine, Fault, Options, RenameFlags, SetAttr, Stats, TxInfo,
    IDLE_CHECKPOINT_MAX_NAMES, NAME_MAX,
};
