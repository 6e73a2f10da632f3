//! The commit record: what one transaction changed, as the journal stores
//! it (the *meta* part of a record; the record header and the data part are
//! [`super::journal`]'s).
//!
//! A record names objects by [`ObjRef`]: an object of the backing tree by
//! its path there, which is stable until the next checkpoint (J1), and an
//! object created since the last checkpoint by its id in this epoch. Record
//! version 1 is the encoded [`CommitRecord`] alone; version 2 follows it
//! with the [`FileRef`]s of extents whose bytes are in data files
//! (selective data journaling, DESIGN §2a). The bytes are the on-disk
//! format: a journal written by any earlier build must still decode
//! (`tests/crash.rs` and `tests/journal_recycle.rs` replay journals written
//! by this build; the encoding itself is pinned by the record layout in
//! [`super::journal`]).
//!
//! This module knows nothing of the engine's state: the transaction layer
//! builds a record from a delta (`txn::commit`), recovery turns one back
//! into a delta (`recovery`).

use crate::codec::{fields, Codec, DecodeError, Reader};
use crate::storage::{FileKind, Timestamp};

pub const REC_VERSION: u16 = 1;
/// A record whose meta is followed by its [`FileRef`]s.
pub const REC_VERSION_FILES: u16 = 2;

/// How a journal record names an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ObjRef {
    /// An object of the backing tree as of the last checkpoint, by its path
    /// there (the backing tree does not change between checkpoints: J1).
    Base(Vec<u8>),
    /// An object created since the last checkpoint, by its id in this epoch.
    New(u64),
}

#[derive(Clone, Debug, Default)]
pub struct RecAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
    pub nlink: i64,
    pub xattrs: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

#[derive(Clone, Debug)]
pub struct RecFile {
    pub cut: u64,
    pub exact: bool,
    pub size: u64,
    /// (file offset, length, offset in this record's data part)
    pub extents: Vec<(u64, u64, u64)>,
}

#[derive(Clone, Debug)]
pub struct RecObj {
    pub obj: ObjRef,
    pub attr: RecAttr,
    pub file: Option<RecFile>,
}

#[derive(Clone, Debug)]
pub struct RecDir {
    pub dir: ObjRef,
    pub entries: Vec<(Vec<u8>, Option<ObjRef>)>,
}

#[derive(Clone, Debug)]
pub struct RecNew {
    pub id: u64,
    pub kind: FileKind,
    pub target: Option<Vec<u8>>,
    /// A device's number (`st_rdev`); 0 for every other kind. Encoded only
    /// after a device's kind (see the `Codec` below).
    pub rdev: u64,
}

/// Bytes of a file extent that live in a data file, not in the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRef {
    /// Index into [`CommitRecord::objs`] (that object's `file` is `Some`).
    pub obj: u32,
    pub off: u64,
    pub len: u64,
    /// The data file `.txfs/data/<file as 16 hex digits>`, and where in it.
    pub file: u64,
    pub file_off: u64,
}

/// The metadata part of a commit record: a transaction's delta with
/// objects named by [`ObjRef`].
#[derive(Clone, Debug, Default)]
pub struct CommitRecord {
    pub created: Vec<RecNew>,
    pub dirs: Vec<RecDir>,
    pub objs: Vec<RecObj>,
    /// Encoded after the rest, in version-2 records only.
    pub files: Vec<FileRef>,
    /// crc32c of each `files` range's bytes in its data file, in the same
    /// order; encoded after `files` when there are any. Version 2 records
    /// written before these were kept end at `files` (empty here): an older
    /// reader ignores bytes after the meta it knows, so the record keeps
    /// its version and an older binary still reads it whole.
    pub crcs: Vec<u32>,
}

impl CommitRecord {
    /// The record's meta part and its version (the encoding: `codec`).
    /// Cannot fail; a `Result` for its callers.
    pub fn encode(&self) -> std::result::Result<(Vec<u8>, u16), std::convert::Infallible> {
        let mut meta = Vec::new();
        self.put(&mut meta);
        if self.files.is_empty() {
            return Ok((meta, REC_VERSION));
        }
        self.files.put(&mut meta);
        if !self.crcs.is_empty() {
            self.crcs.put(&mut meta);
        }
        Ok((meta, REC_VERSION_FILES))
    }

    /// A record from its meta part; bytes after it are ignored.
    pub fn decode(meta: &[u8], version: u16) -> std::result::Result<CommitRecord, DecodeError> {
        let mut r = Reader::new(meta);
        let mut rec = CommitRecord::get(&mut r)?;
        if version == REC_VERSION_FILES {
            rec.files = Codec::get(&mut r)?;
            if !r.is_empty() {
                rec.crcs = Codec::get(&mut r)?;
                if rec.crcs.len() != rec.files.len() {
                    return Err(DecodeError::Truncated);
                }
            }
        }
        Ok(rec)
    }
}

// The byte encoding of the record (the table in `codec`).

impl Codec for ObjRef {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            ObjRef::Base(path) => {
                0u32.put(out);
                path.put(out);
            }
            ObjRef::New(id) => {
                1u32.put(out);
                id.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(match r.variant(2)? {
            0 => ObjRef::Base(Codec::get(r)?),
            _ => ObjRef::New(Codec::get(r)?),
        })
    }
}

fields!(RecAttr { mode, uid, gid, atime, mtime, ctime, nlink, xattrs });
fields!(RecFile { cut, exact, size, extents });
fields!(RecObj { obj, attr, file });
fields!(RecDir { dir, entries });
/// `id`, `kind`, then — for a character or block device only — its `rdev`
/// (`u64`), then `target`. As bincode would encode a kind enum whose
/// device variants carry the number: the kinds before devices existed
/// (tags 0..3) are exactly the bytes every earlier build wrote.
impl Codec for RecNew {
    fn put(&self, out: &mut Vec<u8>) {
        self.id.put(out);
        self.kind.put(out);
        if self.kind.is_device() {
            self.rdev.put(out);
        }
        self.target.put(out);
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        let id = Codec::get(r)?;
        let kind: FileKind = Codec::get(r)?;
        let rdev = if kind.is_device() { Codec::get(r)? } else { 0 };
        Ok(RecNew { id, kind, target: Codec::get(r)?, rdev })
    }
}
fields!(FileRef { obj, off, len, file, file_off });

/// A record's version-1 body: `files` is not part of it (a version-2
/// record encodes them after it: [`CommitRecord::encode`]).
impl Codec for CommitRecord {
    fn put(&self, out: &mut Vec<u8>) {
        self.created.put(out);
        self.dirs.put(out);
        self.objs.put(out);
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(CommitRecord {
            created: Codec::get(r)?,
            dirs: Codec::get(r)?,
            objs: Codec::get(r)?,
            files: Vec::new(),
            crcs: Vec::new(),
        })
    }
}
