//! The one seam through which the engine touches durable storage.
//!
//! Every byte the engine reads from or writes to the backing directory —
//! user files, the journal, spill files, checkpoint plans — goes through
//! [`Storage`]. Three implementations exist:
//!
//! * [`RealFs`]: the backing directory on a real file system. Every path is
//!   resolved *beneath* the backing root with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS)`; no symlink and no `..` can lead outside it.
//! * [`MemFs`]: an in-memory inode table, for fast deterministic tests.
//! * [`CrashFs`]: a [`MemFs`] that also keeps a *durable* image and can be
//!   "power-cut": see its module for the exact durability model.
//!
//! ## Paths
//! Paths are relative to the backing root; the empty path is the root. The
//! engine only ever passes paths made of normal components (no `.`, `..`,
//! empty or `/`-containing names) and never expects a symlink to be
//! followed: a symlink met in the middle of a path is an error (`ELOOP`),
//! a symlink as the last component is operated on itself.
//!
//! ## Durability contract (what the engine relies on)
//! Only what POSIX promises (issue 28: [`CrashFs`]'s conservative model
//! holds the engine to exactly this; its ordered model is ext4's):
//! * `fdatasync(p)` on a file makes its data and size durable; `fsync(p)`
//!   also its attributes (mode, owner, times, xattrs). Neither makes the
//!   file's *name* durable.
//! * `fsync(p)` on a directory makes the namespace operations (create,
//!   mkdir, symlink, mknod, rename, link, unlink, rmdir) that changed its
//!   entries durable; a rename between two directories needs both synced.
//! * `sync_all()` makes everything durable (`syncfs`).
//! * Anything not yet durable may be lost at a power cut, independently of
//!   everything else (no order between namespace operations is assumed);
//!   data writes may be torn (at 4 KiB pages) or survive out of order.
//!
//! Journaling file systems (ext4, xfs, btrfs) give more (namespace
//! operations durable in issue order, with any fsync); the engine does
//! not depend on it. Each fsync it issues, and what depends on it:
//! docs/design/checkpoint.md, "What each sync is for".

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::Arc;

mod crash;
mod mem;
mod real;

pub use crash::{CrashFs, CrashPlan, Persistence};
pub use mem::MemFs;
pub use real::RealFs;

/// What kind of object a directory entry or inode is.
///
/// The order is part of the journal format (`codec`): new kinds are only
/// ever added at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A file type this build does not know (none on Linux today); listed
    /// and stat-able, never created.
    Other,
    /// A named pipe (`S_IFIFO`).
    Fifo,
    /// A unix socket's name (`S_IFSOCK`).
    Socket,
    /// A character device (`S_IFCHR`), with its device number (`rdev`).
    CharDev,
    /// A block device (`S_IFBLK`), with its device number (`rdev`).
    BlockDev,
}

impl FileKind {
    /// The kind of an `st_mode` (its `S_IFMT` bits).
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => FileKind::Other,
        }
    }

    /// The `S_IFMT` bits of this kind (0 for [`FileKind::Other`]).
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::BlockDev => libc::S_IFBLK,
            FileKind::Other => 0,
        }
    }

    /// A fifo, socket or device: what [`Storage::mknod`] makes. Such an
    /// object has no content the engine reads or writes (the kernel serves
    /// it), and only its device number besides its attributes.
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev)
    }

    /// A character or block device: it has a device number, and making one
    /// takes `CAP_MKNOD`.
    pub fn is_device(self) -> bool {
        matches!(self, FileKind::CharDev | FileKind::BlockDev)
    }
}

/// A point in time as the file system stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
    }
}

/// `lstat` of a stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    /// Device and inode number: identify hard links to one object.
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

/// An open file used by the engine for its own bookkeeping (journal, spill).
#[allow(clippy::len_without_is_empty)]
pub trait StoredFile: Send + Sync {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    /// Data and size durable (see the module's durability contract).
    fn sync_data(&self) -> io::Result<()>;
    /// Start writing `[off, off+len)` to the device without waiting, so a
    /// later `sync_data` has less left to do. A hint: it promises nothing,
    /// and may do nothing.
    fn start_writeback(&self, _off: u64, _len: u64) {}
}

/// The storage seam. All paths are relative to the backing root.
pub trait Storage: Send + Sync + 'static {
    /// Metadata of the object at `path`, not following a final symlink.
    /// `NotFound` if absent.
    fn lstat(&self, path: &Path) -> io::Result<Meta>;
    /// Entries of a directory, without `.` and `..`, in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>>;
    /// Reads from a regular file; returns the count read, less than
    /// `buf.len()` only where the file ends (0 at or past EOF).
    fn read_at(&self, path: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The size of a regular file (what `lstat` gives, possibly cheaper).
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        self.lstat(path).map(|m| m.size)
    }
    /// Writes all of `data` at `off` of a regular file, extending it if needed.
    fn write_at(&self, path: &Path, off: u64, data: &[u8]) -> io::Result<()>;
    fn set_len(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Creates a regular file if `path` is absent; succeeds if a regular file
    /// is already there (idempotent replay relies on this).
    fn create_file(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// `EEXIST` if something is already there.
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()>;
    fn symlink(&self, target: &OsStr, path: &Path) -> io::Result<()>;
    /// `mknodat(2)` of a fifo, socket or device ([`FileKind::is_special`];
    /// `EINVAL` for any other kind) with exactly `mode`'s permission bits
    /// (no umask); `rdev` is the device number of a device, ignored for the
    /// others. `EEXIST` if something is already there.
    fn mknod(&self, path: &Path, kind: FileKind, mode: u32, rdev: u64) -> io::Result<()>;
    fn readlink(&self, path: &Path) -> io::Result<OsString>;
    /// `rename(2)`: replaces a file or an empty directory at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn link(&self, existing: &Path, new: &Path) -> io::Result<()>;
    fn unlink(&self, path: &Path) -> io::Result<()>;
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// chmod; never follows a final symlink (a no-op on symlinks).
    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// lchown.
    fn set_owner(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()>;
    /// utimensat with AT_SYMLINK_NOFOLLOW.
    fn set_times(&self, path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()>;
    /// `Ok(None)` if the attribute is absent (or xattrs are unsupported).
    fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>>;
    fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>>;
    fn set_xattr(&self, path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()>;
    /// Succeeds if the attribute was already absent.
    fn remove_xattr(&self, path: &Path, name: &OsStr) -> io::Result<()>;
    /// Makes a file's data and metadata (or a directory's entries) durable.
    fn fsync(&self, path: &Path) -> io::Result<()>;
    /// `syncfs`: everything written so far becomes durable.
    fn sync_all(&self) -> io::Result<()>;
    /// Opens (optionally creating, mode 0600) a regular file for the engine's
    /// own use.
    fn open_file(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>>;
    /// Bytes the engine may still write to the backing file system, if
    /// known (a checkpoint that cannot fit is not started: DESIGN §4).
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// Inodes the engine may still create on the backing file system, if
    /// it has a fixed number (ext4: a checkpoint that would run out is not
    /// started, as one that would run out of bytes).
    fn free_inodes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// Whether the backing can hold an object of `kind` whose extended
    /// attributes are exactly `xattrs` (name, value, and whether the engine
    /// would write it: `false` for an attribute the object already holds on
    /// the backing unchanged). The first error the backing gives for a
    /// written attribute, or for the set's size (EOPNOTSUPP, ENOSPC, E2BIG,
    /// ERANGE, EPERM ...), is returned; `Ok` if it fits or cannot be told.
    /// `scratch` is a path beneath the engine's own folder where a trial
    /// object may be built (a leftover there is replaced); nothing remains
    /// there afterwards. The engine asks before it accepts an xattr change,
    /// so that no checkpoint meets a set the backing refuses.
    fn probe_xattrs(&self, _scratch: &Path, _kind: FileKind, _xattrs: &[(OsString, Vec<u8>, bool)]) -> io::Result<()> {
        Ok(())
    }
    /// The largest size a regular file may have on the backing (a write
    /// may end there, a truncate may reach it), if known.
    fn max_file_size(&self) -> Option<u64> {
        None
    }
    /// The most names one regular file may have on the backing, if known.
    fn max_links(&self) -> Option<u64> {
        None
    }
    /// Whether a checkpoint can give an object the owner `uid`:`gid` (a
    /// daemon that is not root can `lchown` only to itself and its own
    /// groups). Asked when the engine accepts an owner, so that no
    /// checkpoint meets EPERM.
    fn may_own(&self, _uid: u32, _gid: u32) -> bool {
        true
    }
    /// Whether a checkpoint can make an object of `kind` with device number
    /// `rdev` ([`Storage::mknod`]): a device takes `CAP_MKNOD`, except the
    /// character device 0:0 (an overlayfs whiteout, which Linux lets anyone
    /// make). Asked when the engine accepts a new device, so that no
    /// checkpoint meets EPERM.
    fn may_mknod(&self, _kind: FileKind, _rdev: u64) -> bool {
        true
    }
    /// Whether the engine may give a file any owner and mode and still open
    /// it (root: `CAP_CHOWN`, `CAP_DAC_OVERRIDE`). Only then does a
    /// checkpoint rename a shadow over a file (DESIGN §2a): a data file
    /// given a mode like 0200 must stay openable by the plan that renames
    /// it, or the plan could never finish.
    fn privileged(&self) -> bool {
        true
    }
}
