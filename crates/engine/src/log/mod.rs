//! The log: everything that makes a commit durable before the backing tree
//! changes (the redo half of the design; the checkpoint is the other half).
//!
//! * [`record`]: what one commit changed, as bytes (`CommitRecord`).
//! * [`journal`]: the journal file of one epoch: byte layout, append,
//!   scan (J2, J3), the zeroed runway and recycled journals.
//! * [`group_commit`]: one `fdatasync` for many committers (J4).
//! * [`files`]: paths under `.txfs/`, data files, the spare journal.
//! * [`mark`]: the durable high-water mark outside the journal.
//!
//! Nothing here knows the engine's state: the transaction layer hands the
//! journal a record and its bytes, recovery asks it for the records back.

pub(crate) mod files;
pub(crate) mod group_commit;
pub mod journal;
pub mod mark;
pub(crate) mod record;
