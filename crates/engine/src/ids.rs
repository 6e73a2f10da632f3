//! Newtypes for every identifier that crosses a module boundary.

use std::fmt;

/// A file-system object (inode) as the engine knows it. Stable for the
/// lifetime of an [`Engine`](crate::Engine); the FUSE layer uses it as the
/// node id. [`ObjId::ROOT`] is the root directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjId(pub u64);

impl ObjId {
    pub const ROOT: ObjId = ObjId(1);
}

impl fmt::Display for ObjId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "obj#{}", self.0)
    }
}

/// A transaction handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxId(pub u64);

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tx#{}", self.0)
    }
}

/// Commit sequence number: the position of a commit in the total commit
/// order. `Seq(0)` is "before any commit of this engine".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// Journal epoch: one journal file per epoch; a checkpoint ends an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

/// A position in the journal across epochs (log sequence number): the
/// journal file of `epoch`, `off` bytes in. Ordered by epoch, then offset:
/// the order records are appended in. Group commit waits for one to be
/// durable (J4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn {
    pub epoch: Epoch,
    pub off: u64,
}

/// A data file, `.txfs/data/<id as 16 hex digits>`: a transaction's spilled
/// bytes, a new file's staged content or a shadow (DESIGN §2a). Journal
/// records and checkpoint plans store the bare number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataFileId(pub u64);
