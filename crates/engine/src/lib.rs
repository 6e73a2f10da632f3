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
//! Layers, top to bottom: [`Engine`] (objects, transactions, isolation,
//! commit) → `delta` (what a transaction changes) → `journal` (redo log,
//! group commit) and `checkpoint` (applying the log to the backing tree) →
//! [`storage::Storage`] (the one I/O seam, with real, in-memory and
//! power-cut implementations). `docs/DESIGN.md` states the invariants
//! (J1–J5, I1–I4) that the code cites.

mod checkpoint;
mod codec;
pub mod delta;
mod engine;
mod error;
mod ids;
pub mod journal;
mod recovery;
pub mod storage;
mod versions;

pub use engine::{
    Attr, DirEntry, Durability, Engine, Options, RenameFlags, SetAttr, Stats, IDLE_CHECKPOINT_MAX_NAMES, META_DIR,
    NAME_MAX,
};
pub use error::{Error, Result, ECONFLICT};
pub use ids::{Epoch, Lsn, ObjId, Seq, TxId};
pub use recovery::{check, CheckReport, JournalReport};
pub use storage::{FileKind, Timestamp};
