//! The byte encoding of a journal record's meta part ([`CommitRecord`],
//! [`FileRef`]) and of a checkpoint plan's body ([`Plan`]).
//!
//! Their bytes are on disk in every journal and plan ever written, so they
//! never change: the tests below compare them with checked-in golden bytes
//! (`tests/fixtures/golden/`), and `tests/journal_compat.rs` opens backing
//! directories written by every earlier version.
//!
//! ## The encoding
//! ```text
//!   u32, u64, i64   little-endian, fixed width (4, 8, 8 bytes)
//!   bool            one byte: 0 or 1
//!   Option<T>       one byte: 0 (None), or 1 and then T
//!   Vec<T>          u64 count, then the elements (a byte string: its bytes)
//!   tuple, struct   the fields in declaration order, nothing between them
//!   enum            u32 variant index (declaration order), then its fields
//! ```
//! No field names, no versions, no padding: a type's fields are its
//! format, so a field may never be added, removed or reordered, and an
//! enum may only gain variants at its end. A new format is a new record
//! version (as version 2 added the file refs after the version-1 body).
//! A plan has no version: `DataOp::files`, added to it in place, is why a
//! plan of the first format no longer decodes (`tests/journal_compat.rs`
//! pins that refusal); a change to the plan needs a version first.
//!
//! This is exactly what bincode 1.x's `serialize` (fixed-width integers,
//! little-endian) made of the serde-derived types, which wrote every
//! journal and plan before this module did; decoding refuses what bincode
//! refused, with its words (`txfs check` shows them): a body cut short, a
//! bool, `Option` tag or variant index out of range. Bytes after a whole
//! value are not read (bincode's `deserialize` allowed them too).
//!
//! [`CommitRecord`]: crate::journal::CommitRecord
//! [`FileRef`]: crate::journal::FileRef

use crate::checkpoint::plan::{AttrOp, DataOp, MoveOut, Place, Plan};
use crate::ids::{Epoch, Seq};
use crate::journal::{CommitRecord, FileRef, ObjRef, RecAttr, RecDir, RecFile, RecNew, RecObj};
use crate::storage::{FileKind, Timestamp};
use std::fmt;

/// Why bytes are not a whole value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes end inside the value (or a count runs past them).
    Truncated,
    /// A bool that is neither 0 nor 1.
    Bool(u8),
    /// An `Option` tag that is neither 0 nor 1.
    OptionTag(u8),
    /// An enum variant index past the type's last variant.
    Variant { index: u32, variants: u32 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // bincode 1.x's words for each, as `txfs check` has shown them.
        match self {
            DecodeError::Truncated => write!(f, "io error: failed to fill whole buffer"),
            DecodeError::Bool(b) => write!(f, "invalid u8 while decoding bool, expected 0 or 1, found {b}"),
            DecodeError::OptionTag(t) => write!(f, "tag for enum is not valid, found {t}"),
            DecodeError::Variant { index, variants } => {
                write!(f, "invalid value: integer `{index}`, expected variant index 0 <= i < {variants}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

type Result<T> = std::result::Result<T, DecodeError>;

/// Bytes being decoded, front first.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn count(&mut self) -> Result<usize> {
        usize::try_from(u64::get(self)?).map_err(|_| DecodeError::Truncated)
    }

    fn variant(&mut self, variants: u32) -> Result<u32> {
        let index = u32::get(self)?;
        if index >= variants {
            return Err(DecodeError::Variant { index, variants });
        }
        Ok(index)
    }
}

/// A value with a byte encoding (the module doc's table).
pub(crate) trait Codec: Sized {
    fn put(&self, out: &mut Vec<u8>);
    fn get(r: &mut Reader<'_>) -> Result<Self>;

    /// The elements of a `Vec<Self>`, after its count (one at a time; bytes
    /// in one copy).
    fn put_all(items: &[Self], out: &mut Vec<u8>) {
        for item in items {
            item.put(out);
        }
    }

    fn get_all(n: usize, r: &mut Reader<'_>) -> Result<Vec<Self>> {
        // A count is not trusted with memory before its elements are read.
        let mut items = Vec::with_capacity(n.min((1 << 20) / std::mem::size_of::<Self>().max(1)));
        for _ in 0..n {
            items.push(Self::get(r)?);
        }
        Ok(items)
    }
}

/// A whole value's bytes.
pub(crate) fn encode<T: Codec>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.put(&mut out);
    out
}

/// A plan's body (the plan file adds its checksum and length).
pub(crate) fn encode_plan(plan: &Plan) -> Vec<u8> {
    encode(plan)
}

/// A plan from its body; `None` if the bytes are not a whole plan (bytes
/// after one are ignored).
pub(crate) fn decode_plan(body: &[u8]) -> Option<Plan> {
    Plan::get(&mut Reader::new(body)).ok()
}

impl Codec for u8 {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(r.take(1)?[0])
    }
    fn put_all(items: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(items);
    }
    fn get_all(n: usize, r: &mut Reader<'_>) -> Result<Vec<u8>> {
        Ok(r.take(n)?.to_vec())
    }
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
int!(u32, u64, i64);

impl Codec for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        match u8::get(r)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::Bool(b)),
        }
    }
}

impl<T: Codec> Codec for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        match u8::get(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            t => Err(DecodeError::OptionTag(t)),
        }
    }
}

impl<T: Codec> Codec for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u64).put(out);
        T::put_all(self, out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let n = r.count()?;
        T::get_all(n, r)
    }
}

macro_rules! tuple {
    ($($n:tt $t:ident),*) => {
        impl<$($t: Codec),*> Codec for ($($t,)*) {
            fn put(&self, out: &mut Vec<u8>) {
                $( self.$n.put(out); )*
            }
            fn get(r: &mut Reader<'_>) -> Result<Self> {
                Ok(($( $t::get(r)?, )*))
            }
        }
    };
}
tuple!(0 A, 1 B);
tuple!(0 A, 1 B, 2 C);
tuple!(0 A, 1 B, 2 C, 3 D);

/// A struct: its fields, in this order (the declaration order, which is
/// the format).
macro_rules! fields {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl Codec for $t {
            fn put(&self, out: &mut Vec<u8>) {
                $( self.$f.put(out); )*
            }
            fn get(r: &mut Reader<'_>) -> Result<Self> {
                Ok($t { $( $f: Codec::get(r)?, )* })
            }
        }
    };
}

impl Codec for Epoch {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(Epoch(u64::get(r)?))
    }
}

impl Codec for Seq {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(Seq(u64::get(r)?))
    }
}

fields!(Timestamp { secs, nanos });

impl Codec for FileKind {
    fn put(&self, out: &mut Vec<u8>) {
        let index: u32 = match self {
            FileKind::File => 0,
            FileKind::Dir => 1,
            FileKind::Symlink => 2,
            FileKind::Other => 3,
        };
        index.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.variant(4)? {
            0 => FileKind::File,
            1 => FileKind::Dir,
            2 => FileKind::Symlink,
            _ => FileKind::Other,
        })
    }
}

// The record (journal.rs).

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
    fn get(r: &mut Reader<'_>) -> Result<Self> {
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
fields!(RecNew { id, kind, target });
fields!(FileRef { obj, off, len, file, file_off });

/// A record's version-1 body: `files` is not part of it (a version-2
/// record encodes them after it: [`CommitRecord::encode`]).
impl Codec for CommitRecord {
    fn put(&self, out: &mut Vec<u8>) {
        self.created.put(out);
        self.dirs.put(out);
        self.objs.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(CommitRecord { created: Codec::get(r)?, dirs: Codec::get(r)?, objs: Codec::get(r)?, files: Vec::new() })
    }
}

// The plan (checkpoint.rs).

impl Codec for MoveOut {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            MoveOut::Stage { from, stage } => {
                0u32.put(out);
                from.put(out);
                stage.put(out);
            }
            MoveOut::Unlink { from } => {
                1u32.put(out);
                from.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.variant(2)? {
            0 => MoveOut::Stage { from: Codec::get(r)?, stage: Codec::get(r)? },
            _ => MoveOut::Unlink { from: Codec::get(r)? },
        })
    }
}

impl Codec for Place {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Place::Rename { stage, to } => {
                0u32.put(out);
                stage.put(out);
                to.put(out);
            }
            Place::File { to } => {
                1u32.put(out);
                to.put(out);
            }
            Place::Dir { to } => {
                2u32.put(out);
                to.put(out);
            }
            Place::Symlink { to, target } => {
                3u32.put(out);
                to.put(out);
                target.put(out);
            }
            Place::Link { existing, to } => {
                4u32.put(out);
                existing.put(out);
                to.put(out);
            }
            Place::Replace { data, to, size, keep } => {
                5u32.put(out);
                data.put(out);
                to.put(out);
                size.put(out);
                keep.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.variant(6)? {
            0 => Place::Rename { stage: Codec::get(r)?, to: Codec::get(r)? },
            1 => Place::File { to: Codec::get(r)? },
            2 => Place::Dir { to: Codec::get(r)? },
            3 => Place::Symlink { to: Codec::get(r)?, target: Codec::get(r)? },
            4 => Place::Link { existing: Codec::get(r)?, to: Codec::get(r)? },
            _ => {
                Place::Replace { data: Codec::get(r)?, to: Codec::get(r)?, size: Codec::get(r)?, keep: Codec::get(r)? }
            }
        })
    }
}

fields!(DataOp { path, cut, size, extents, files });
fields!(AttrOp { path, is_symlink, mode, owner, times, xattrs });
fields!(Plan { epoch, last_seq, out, place, data, attrs, dead });

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::NO_CUT;
    use crate::journal::{REC_VERSION, REC_VERSION_FILES};

    const RECORD_V1: &[u8] = include_bytes!("../tests/fixtures/golden/record-v1.bin");
    const RECORD_V2: &[u8] = include_bytes!("../tests/fixtures/golden/record-v2.bin");
    const PLAN: &[u8] = include_bytes!("../tests/fixtures/golden/plan.bin");

    fn ts(secs: i64, nanos: u32) -> Option<Timestamp> {
        Some(Timestamp { secs, nanos })
    }

    /// A record with every kind of change: each `FileKind`, both `ObjRef`s,
    /// names added, replaced and removed, attributes set and left alone,
    /// xattrs set (one empty) and removed, a file with a cut and extents,
    /// one without contents; non-UTF-8 names.
    fn record(files: Vec<FileRef>) -> CommitRecord {
        CommitRecord {
            created: vec![
                RecNew { id: 1, kind: FileKind::File, target: None },
                RecNew { id: 2, kind: FileKind::Dir, target: None },
                RecNew { id: 3, kind: FileKind::Symlink, target: Some(b"../to\xff".to_vec()) },
                RecNew { id: 4, kind: FileKind::Other, target: None },
            ],
            dirs: vec![
                RecDir {
                    dir: ObjRef::Base(b"".to_vec()),
                    entries: vec![
                        (b"new".to_vec(), Some(ObjRef::New(1))),
                        (b"moved\xfe".to_vec(), Some(ObjRef::Base(b"a/b".to_vec()))),
                        (b"gone".to_vec(), None),
                    ],
                },
                RecDir { dir: ObjRef::New(2), entries: vec![] },
            ],
            objs: vec![
                RecObj {
                    obj: ObjRef::New(1),
                    attr: RecAttr {
                        mode: Some(0o100644),
                        uid: Some(1000),
                        gid: None,
                        atime: ts(-1, 999_999_999),
                        mtime: ts(1_700_000_000, 5),
                        ctime: None,
                        nlink: -1,
                        xattrs: vec![
                            (b"user.a".to_vec(), Some(b"value".to_vec())),
                            (b"user.empty".to_vec(), Some(vec![])),
                            (b"user.gone".to_vec(), None),
                        ],
                    },
                    file: Some(RecFile {
                        cut: NO_CUT,
                        exact: true,
                        size: 1 << 40,
                        extents: vec![(0, 6, 0), (u64::MAX - 1, 1, 6)],
                    }),
                },
                RecObj {
                    obj: ObjRef::Base(b"a/b".to_vec()),
                    attr: RecAttr::default(),
                    file: Some(RecFile { cut: 3, exact: false, size: 0, extents: vec![] }),
                },
                RecObj { obj: ObjRef::New(2), attr: RecAttr { nlink: 2, ..RecAttr::default() }, file: None },
            ],
            files,
        }
    }

    fn file_refs() -> Vec<FileRef> {
        vec![
            FileRef { obj: 0, off: 0, len: 20 << 10, file: 0, file_off: 0 },
            FileRef { obj: u32::MAX, off: 7, len: 1, file: 0x0123_4567_89ab_cdef, file_off: u64::MAX },
        ]
    }

    /// A plan with every step: both moves out, every placement, data from
    /// the journal and from data files, attributes set and left alone.
    fn plan() -> Plan {
        Plan {
            epoch: Epoch(7),
            last_seq: Seq(41),
            out: vec![
                MoveOut::Stage { from: b"d/f".to_vec(), stage: b".txfs/stage/o9".to_vec() },
                MoveOut::Unlink { from: b"link2".to_vec() },
            ],
            place: vec![
                Place::Rename { stage: b".txfs/stage/o9".to_vec(), to: b"e/f".to_vec() },
                Place::File { to: b"new".to_vec() },
                Place::Dir { to: b"dir\xff".to_vec() },
                Place::Symlink { to: b"ln".to_vec(), target: b"new".to_vec() },
                Place::Link { existing: b"new".to_vec(), to: b"hard".to_vec() },
                Place::Replace {
                    data: b".txfs/data/0000000000000003".to_vec(),
                    to: b"big".to_vec(),
                    size: 1 << 20,
                    keep: Some(b".txfs/data/0000000000000004".to_vec()),
                },
                Place::Replace {
                    data: b".txfs/data/0000000000000005".to_vec(),
                    to: b"b2".to_vec(),
                    size: 0,
                    keep: None,
                },
            ],
            data: vec![
                DataOp {
                    path: b"new".to_vec(),
                    cut: NO_CUT,
                    size: 10,
                    extents: vec![(0, 4, 48), (4, 6, 100)],
                    files: vec![(10, 5, 2, 0)],
                },
                DataOp { path: b"e/f".to_vec(), cut: 0, size: 0, extents: vec![], files: vec![] },
            ],
            attrs: vec![
                AttrOp {
                    path: b"new".to_vec(),
                    is_symlink: false,
                    mode: Some(0o600),
                    owner: Some((Some(0), None)),
                    times: Some((ts(1, 2), None)),
                    xattrs: vec![(b"user.x".to_vec(), Some(b"1".to_vec())), (b"user.y".to_vec(), None)],
                },
                AttrOp { path: b"ln".to_vec(), is_symlink: true, mode: None, owner: None, times: None, xattrs: vec![] },
            ],
            dead: vec![b".txfs/stage/o3".to_vec(), vec![]],
        }
    }

    fn encoded(rec: &CommitRecord) -> (Vec<u8>, u16) {
        rec.encode().expect("a record always encodes")
    }

    #[test]
    fn record_without_data_files_is_version_1_and_its_golden_bytes() {
        let (meta, version) = encoded(&record(vec![]));
        assert_eq!(version, REC_VERSION);
        assert!(meta == RECORD_V1, "record v1 bytes changed:\n{meta:02x?}");
        let back = CommitRecord::decode(RECORD_V1, REC_VERSION).expect("decodes");
        assert_eq!(encoded(&back), (RECORD_V1.to_vec(), REC_VERSION));
    }

    #[test]
    fn record_with_data_files_is_version_2_and_its_golden_bytes() {
        let (meta, version) = encoded(&record(file_refs()));
        assert_eq!(version, REC_VERSION_FILES);
        assert!(meta == RECORD_V2, "record v2 bytes changed:\n{meta:02x?}");
        // The file refs follow the version-1 body.
        assert_eq!(&RECORD_V2[..RECORD_V1.len()], RECORD_V1);
        let back = CommitRecord::decode(RECORD_V2, REC_VERSION_FILES).expect("decodes");
        assert_eq!(back.files, file_refs());
        assert_eq!(encoded(&back), (RECORD_V2.to_vec(), REC_VERSION_FILES));
        // Read as version 1, the file refs are bytes after the record.
        let v1 = CommitRecord::decode(RECORD_V2, REC_VERSION).expect("decodes");
        assert!(v1.files.is_empty());
        assert_eq!(encoded(&v1).0, RECORD_V1);
    }

    #[test]
    fn plan_golden_bytes() {
        let body = encode_plan(&plan());
        assert!(body == PLAN, "plan bytes changed:\n{body:02x?}");
        let back = decode_plan(PLAN).expect("decodes");
        assert_eq!(encode_plan(&back), PLAN);
    }

    /// Every prefix of a record or plan is refused, with the reason that
    /// bincode gave (it is part of `txfs check`'s report).
    #[test]
    fn truncation_is_refused() {
        for n in 0..RECORD_V2.len() {
            let err = CommitRecord::decode(&RECORD_V2[..n], REC_VERSION_FILES).expect_err("a prefix");
            assert_eq!(err.to_string(), "io error: failed to fill whole buffer", "prefix {n}");
        }
        for n in 0..RECORD_V1.len() {
            assert!(CommitRecord::decode(&RECORD_V1[..n], REC_VERSION).is_err(), "prefix {n}");
        }
        for n in 0..PLAN.len() {
            assert!(decode_plan(&PLAN[..n]).is_none(), "prefix {n}");
        }
    }

    /// Bytes after a whole record or plan are ignored (as bincode 1's
    /// `deserialize` and `deserialize_from` do).
    #[test]
    fn trailing_bytes_are_ignored() {
        let mut meta = RECORD_V2.to_vec();
        meta.extend_from_slice(&[0xff; 9]);
        let back = CommitRecord::decode(&meta, REC_VERSION_FILES).expect("decodes");
        assert_eq!(encoded(&back).0, RECORD_V2);
        let mut body = PLAN.to_vec();
        body.extend_from_slice(&[0xff; 9]);
        assert_eq!(encode_plan(&decode_plan(&body).expect("decodes")), PLAN);
    }

    /// Bytes that no encoder writes are refused: a bool, an `Option` tag or
    /// an enum variant out of range, a length past the end.
    #[test]
    fn garbage_is_refused() {
        let decode = |meta: &[u8]| CommitRecord::decode(meta, REC_VERSION).map(|_| ()).map_err(|e| e.to_string());
        // created: len 1, id, kind, target tag
        let mut one = vec![1, 0, 0, 0, 0, 0, 0, 0];
        one.extend_from_slice(&9u64.to_le_bytes());
        let with = |tail: &[u8]| [&one[..], tail, &[0u8; 24][..]].concat();
        assert_eq!(decode(&with(&[0, 0, 0, 0, 0])), Ok(()));
        assert_eq!(
            decode(&with(&[4, 0, 0, 0, 0])),
            Err("invalid value: integer `4`, expected variant index 0 <= i < 4".into())
        );
        assert_eq!(decode(&with(&[0, 0, 0, 0, 2])), Err("tag for enum is not valid, found 2".into()));
        // objs: len 1, ObjRef variant 2
        let objs = [&[0u8; 16][..], &[1, 0, 0, 0, 0, 0, 0, 0], &[2, 0, 0, 0]].concat();
        assert_eq!(decode(&objs), Err("invalid value: integer `2`, expected variant index 0 <= i < 2".into()));
        // A length that runs past the end.
        let long = [&u64::MAX.to_le_bytes()[..], &[0u8; 16]].concat();
        assert_eq!(decode(&long), Err("io error: failed to fill whole buffer".into()));
        // A RecFile's `exact` that is not 0 or 1.
        let mut meta = RECORD_V1.to_vec();
        let at = find_exact_flag(&meta);
        meta[at] = 7;
        assert_eq!(decode(&meta), Err("invalid u8 while decoding bool, expected 0 or 1, found 7".into()));
    }

    /// Where RECORD_V1 holds the first `RecFile::exact`: between its
    /// `cut = NO_CUT` and its `size = 1 << 40`.
    fn find_exact_flag(meta: &[u8]) -> usize {
        let file = [&NO_CUT.to_le_bytes()[..], &[1], &(1u64 << 40).to_le_bytes()].concat();
        let at = meta.windows(file.len()).position(|w| w == file).expect("the first RecFile");
        at + 8
    }
}
