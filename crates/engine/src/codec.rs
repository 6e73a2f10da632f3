//! The byte encoding of a journal record's meta part ([`CommitRecord`],
//! [`FileRef`]) and of a checkpoint plan's body (`Plan`): the rules and
//! the primitives. Each format implements [`Codec`] beside its own types
//! (`log/record.rs`, `checkpoint/plan.rs`, with the [`fields`] macro for
//! structs); this module imports neither.
//!
//! Their bytes are on disk in every journal and plan ever written, so they
//! never change: `codec_golden.rs` compares them with checked-in golden
//! bytes (`tests/fixtures/golden/`), and `tests/journal_compat.rs` opens
//! backing directories written by every earlier version.
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
//! The first plans had no version: `DataOp::files`, added to them in
//! place, is why a plan of the very first layout no longer decodes
//! (`tests/journal_compat.rs` pins that refusal). A plan's body now
//! starts with a version mark (`checkpoint/plan.rs`, `PLAN_V2`: paths as a
//! table, issue 23); a body without it is read as the unversioned format.
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

use crate::ids::{Epoch, Seq};
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

    /// Whether every byte was read.
    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(crate) fn variant(&mut self, variants: u32) -> Result<u32> {
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
#[cfg(test)]
pub(crate) fn encode<T: Codec>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.put(&mut out);
    out
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
    ($t:ident < $g:ident > { $($f:ident),* $(,)? }) => {
        impl<$g: $crate::codec::Codec> $crate::codec::Codec for $t<$g> {
            fn put(&self, out: &mut Vec<u8>) {
                $( $crate::codec::Codec::put(&self.$f, out); )*
            }
            fn get(r: &mut $crate::codec::Reader<'_>) -> std::result::Result<Self, $crate::codec::DecodeError> {
                Ok($t { $( $f: $crate::codec::Codec::get(r)?, )* })
            }
        }
    };
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $crate::codec::Codec for $t {
            fn put(&self, out: &mut Vec<u8>) {
                $( $crate::codec::Codec::put(&self.$f, out); )*
            }
            fn get(r: &mut $crate::codec::Reader<'_>) -> std::result::Result<Self, $crate::codec::DecodeError> {
                Ok($t { $( $f: $crate::codec::Codec::get(r)?, )* })
            }
        }
    };
}
pub(crate) use fields;

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

/// A `u32` variant index: 0 file, 1 directory, 2 symlink, 3 other, and
/// (added at the end, so every earlier byte decodes as before) 4 fifo,
/// 5 socket, 6 character device, 7 block device. The kind alone: a
/// record's new object adds a device's number after it (`RecNew`).
impl Codec for FileKind {
    fn put(&self, out: &mut Vec<u8>) {
        let index: u32 = match self {
            FileKind::File => 0,
            FileKind::Dir => 1,
            FileKind::Symlink => 2,
            FileKind::Other => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        };
        index.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.variant(8)? {
            0 => FileKind::File,
            1 => FileKind::Dir,
            2 => FileKind::Symlink,
            3 => FileKind::Other,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            _ => FileKind::BlockDev,
        })
    }
}
