//! The commit record: what one transaction changed, as the journal stores
//! it (the *meta* part of a record; the record header and the data part are
//! [`super::journal`]'s).
//!
//! A record names objects by [`ObjRef`]: an object of the backing tree by
//! its path there, which is stable until the next checkpoint (J1), and an
//! object created since the last checkpoint by its id in this epoch. The
//! path is an entry of the record's own table of `(parent entry, name)`
//! ([`CommitRecord::paths`]), so that a deep tree costs a record its
//! names, not the square of its depth (whole paths, `ObjRef::Base`, made
//! a chmod of 1500 nested directories of long names a 577 MB record:
//! issue 23; they are still read). Record version 1 is the encoded
//! [`CommitRecord`] alone; version 2 follows it with the [`FileRef`]s of
//! extents whose bytes are in data files (selective data journaling,
//! DESIGN §2a), their checksums, and the path table. The bytes are the on-disk
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
    /// An object of the backing tree as of the last checkpoint, by its
    /// entry in [`CommitRecord::paths`].
    Path(u32),
}

/// No parent entry: a name in the root directory.
pub const PATH_ROOT: u32 = u32::MAX;

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
    /// The paths that [`ObjRef::Path`] names: `(parent, name)`, the parent
    /// an earlier entry or [`PATH_ROOT`]. Encoded after `crcs` (which are
    /// then always encoded), in version 2; a binary older than the table
    /// refuses such a record's refs (an unknown variant: `Corrupt`, nothing
    /// changed) instead of cutting it as a torn tail.
    pub paths: Vec<(u32, Vec<u8>)>,
}

impl CommitRecord {
    /// The record's meta part and its version (the encoding: `codec`).
    /// Cannot fail; a `Result` for its callers.
    pub fn encode(&self) -> std::result::Result<(Vec<u8>, u16), std::convert::Infallible> {
        let mut meta = Vec::new();
        self.put(&mut meta);
        if self.files.is_empty() && self.paths.is_empty() {
            return Ok((meta, REC_VERSION));
        }
        self.files.put(&mut meta);
        if !self.crcs.is_empty() || !self.paths.is_empty() {
            self.crcs.put(&mut meta);
        }
        if !self.paths.is_empty() {
            self.paths.put(&mut meta);
        }
        Ok((meta, REC_VERSION_FILES))
    }

    /// The objects the record names, each time it names one.
    pub fn refs(&self) -> impl Iterator<Item = &ObjRef> {
        let dirs = self.dirs.iter().flat_map(|d| std::iter::once(&d.dir).chain(d.entries.iter().flat_map(|e| &e.1)));
        dirs.chain(self.objs.iter().map(|o| &o.obj))
    }

    /// The whole path of entry `i` of [`CommitRecord::paths`] (which
    /// `decode` checked).
    pub fn path_of(&self, i: u32) -> Vec<u8> {
        let mut names = Vec::new();
        let mut cur = i;
        while cur != PATH_ROOT {
            let (parent, name) = &self.paths[cur as usize];
            names.push(&name[..]);
            cur = *parent;
        }
        names.reverse();
        names.join(&b'/')
    }

    /// Whether the path table and the refs into it are whole: every parent
    /// an earlier entry, every name one component, every ref an entry.
    fn paths_ok(&self) -> bool {
        let names_ok = self.paths.iter().enumerate().all(|(i, (parent, name))| {
            (*parent == PATH_ROOT || (*parent as usize) < i)
                && !name.is_empty()
                && name != b"."
                && name != b".."
                && !name.contains(&b'/')
        });
        names_ok && self.refs().all(|r| !matches!(r, ObjRef::Path(i) if *i as usize >= self.paths.len()))
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
            if !r.is_empty() {
                rec.paths = Codec::get(&mut r)?;
            }
        }
        // A ref into a table the record does not have is not a record (as
        // the variant was to every binary before the table).
        if !rec.paths_ok() {
            return Err(DecodeError::Variant { index: 2, variants: 2 });
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
            ObjRef::Path(i) => {
                2u32.put(out);
                i.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, DecodeError> {
        Ok(match r.variant(3)? {
            0 => ObjRef::Base(Codec::get(r)?),
            1 => ObjRef::New(Codec::get(r)?),
            _ => ObjRef::Path(Codec::get(r)?),
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
            paths: Vec::new(),
        })
    }
}
