//! [`MemFs`]: an in-memory, POSIX-like file system for fast deterministic
//! tests, and the tree that [`CrashFs`](super::CrashFs) power-cuts.
//!
//! ## Model
//! A [`MemTree`] is an inode table: every object is an inode (numbered from
//! 1, the root, and never reused) and a directory maps names to inode
//! numbers. Hard links, renames and "open, then unlink" therefore behave as
//! on a real file system: a [`StoredFile`] handle is bound to its inode and
//! keeps working after the file is renamed or unlinked (an unlinked inode
//! lives until its last handle is dropped).
//!
//! Behaviour follows Linux (ext4) with these conventions:
//! * Errors are `io::Error`s carrying the errno Linux would return
//!   (`ENOENT`, `EEXIST`, `ENOTDIR`, `EISDIR`, `ENOTEMPTY`, `ELOOP` for a
//!   symlink in the middle of a path, `EINVAL` for a malformed path or a
//!   directory renamed into itself, ...).
//! * New objects are owned by uid/gid 0 and get exactly the mode asked for
//!   (no umask), like [`RealFs`](super::RealFs) does.
//! * `st_dev` is 1; a directory's `nlink` is 2 + its subdirectories and its
//!   size 4096; a symlink's mode is 0o777 and `set_mode` on it is a no-op.
//! * `mknod` makes fifos, sockets and devices (no privilege is asked for:
//!   `may_mknod` is always true); they have size 0 and `st_rdev` is the
//!   device number of a device, 0 otherwise. `read_at`, `write_at` and
//!   `set_len` refuse them with `EINVAL`, as [`RealFs`](super::RealFs) does.
//! * Timestamps come from a per-tree clock: `Timestamp::now()`, forced to be
//!   strictly increasing. Reads never update `atime`.
//! * `set_owner` clears setuid (and setgid when group-exec is set) on
//!   non-directories, as Linux's `chown` does even for root.
//! * Extended attributes: the name needs a `user.`/`trusted.`/`security.`/
//!   `system.` prefix (`ENOTSUP` otherwise, which reads treat as "absent");
//!   `user.*` is only allowed on files and directories (`EPERM`); values are
//!   at most 64 KiB (`E2BIG`).
//! * File contents are sparse (4 KiB chunks): huge offsets cost nothing.
//! * `fsync`/`sync_all`/`sync_data` are no-ops (a `MemFs` never crashes).

use super::{FileKind, Meta, Storage, StoredFile, Timestamp};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// An `io::Error` carrying `errno`.
pub(crate) fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Splits a storage path into its names; `[]` is the root. Anything but
/// plain names (`.`, `..`, an empty name, a leading or doubled `/`, a NUL
/// byte) is `EINVAL`; a name longer than 255 bytes is `ENAMETOOLONG`.
pub(crate) fn components(path: &Path) -> io::Result<Vec<&OsStr>> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    bytes
        .split(|&b| b == b'/')
        .map(|c| match c {
            b"" | b"." | b".." => Err(err(libc::EINVAL)),
            c if c.contains(&0) => Err(err(libc::EINVAL)),
            c if c.len() > 255 => Err(err(libc::ENAMETOOLONG)),
            c => Ok(OsStr::from_bytes(c)),
        })
        .collect()
}

const ROOT: u64 = 1;
const CHUNK: usize = 4096;
/// Largest file size (Linux's `MAX_LFS_FILESIZE`).
const MAX_SIZE: u64 = i64::MAX as u64;

/// Sparse file contents: absent chunks read as zeros.
#[derive(Clone, Default)]
struct Data {
    size: u64,
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl Data {
    fn read(&self, off: u64, buf: &mut [u8]) -> usize {
        let n = self.size.saturating_sub(off).min(buf.len() as u64) as usize;
        let mut done = 0;
        while done < n {
            let pos = off + done as u64;
            let within = (pos % CHUNK as u64) as usize;
            let len = (CHUNK - within).min(n - done);
            let dst = &mut buf[done..done + len];
            match self.chunks.get(&(pos / CHUNK as u64)) {
                Some(c) => dst.copy_from_slice(&c[within..within + len]),
                None => dst.fill(0),
            }
            done += len;
        }
        n
    }

    /// The caller checked that `off + data.len() <= MAX_SIZE`.
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = off + done as u64;
            let within = (pos % CHUNK as u64) as usize;
            let len = (CHUNK - within).min(data.len() - done);
            let chunk = self.chunks.entry(pos / CHUNK as u64).or_insert_with(|| vec![0; CHUNK].into());
            chunk[within..within + len].copy_from_slice(&data[done..done + len]);
            done += len;
        }
        self.size = self.size.max(off + data.len() as u64);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.size {
            self.chunks.split_off(&len.div_ceil(CHUNK as u64));
            if let Some(c) = self.chunks.get_mut(&(len / CHUNK as u64)) {
                c[(len % CHUNK as u64) as usize..].fill(0);
            }
        }
        self.size = len;
    }
}

#[derive(Clone)]
enum Node {
    File(Data),
    Dir(BTreeMap<OsString, u64>),
    Symlink(OsString),
    /// A fifo, socket or device ([`FileKind::is_special`]) and its device
    /// number (0 but for devices).
    Special(FileKind, u64),
}

#[derive(Clone)]
struct Inode {
    node: Node,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Links to a file or symlink (unused for directories: computed).
    nlink: u64,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    /// When `mtime` was last set (by a data op or `set_times`): lets a data
    /// op replayed late by `CrashFs` leave a newer `set_times` in place.
    mtime_set: Timestamp,
    xattrs: BTreeMap<OsString, Vec<u8>>,
}

impl Inode {
    /// A new object owned by 0:0, with one link, all times `now`.
    fn new(node: Node, mode: u32, now: Timestamp) -> Inode {
        Inode {
            node,
            mode,
            uid: 0,
            gid: 0,
            nlink: 1,
            atime: now,
            mtime: now,
            ctime: now,
            mtime_set: now,
            xattrs: BTreeMap::new(),
        }
    }

    /// The attributes alone (an empty file as the node).
    fn clone_attrs(&self) -> Inode {
        Inode {
            node: Node::File(Data::default()),
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            mtime_set: self.mtime_set,
            xattrs: self.xattrs.clone(),
        }
    }

    fn kind(&self) -> FileKind {
        match self.node {
            Node::File(_) => FileKind::File,
            Node::Dir(_) => FileKind::Dir,
            Node::Symlink(_) => FileKind::Symlink,
            Node::Special(k, _) => k,
        }
    }
}

/// An inode's attributes (and, from [`MemTree::fresh_copy`], its empty
/// node), for `CrashFs` to replay on another tree.
#[derive(Clone)]
pub(crate) struct InodeCopy(Inode);

impl std::fmt::Debug for InodeCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InodeCopy(mode {:o})", self.0.mode)
    }
}

/// The whole state of a [`MemFs`]: cheap to reason about, cloneable (a
/// clone is a snapshot; `CrashFs` keeps a live and a durable one).
///
/// Mutating methods take the time `now` to stamp (from [`MemTree::tick`]),
/// and creating ones the inode number to use (normally
/// [`MemTree::next_ino`]), so that `CrashFs` can replay an operation on
/// another tree with the very same outcome.
#[derive(Clone)]
pub(crate) struct MemTree {
    inodes: BTreeMap<u64, Inode>,
    /// The next inode number to hand out (bumped past every inode added).
    pub(crate) next_ino: u64,
    /// The last time handed out by `tick`.
    pub(crate) clock: Timestamp,
    /// Open handles per inode.
    open: BTreeMap<u64, usize>,
}

impl MemTree {
    pub(crate) fn new() -> MemTree {
        let now = Timestamp::now();
        let root = Inode::new(Node::Dir(BTreeMap::new()), 0o755, now);
        MemTree { inodes: BTreeMap::from([(ROOT, root)]), next_ino: ROOT + 1, clock: now, open: BTreeMap::new() }
    }

    /// The current time, strictly later than any handed out before.
    pub(crate) fn tick(&mut self) -> Timestamp {
        let now = Timestamp::now();
        let last = self.clock;
        self.clock = if now > last {
            now
        } else if last.nanos < 999_999_999 {
            Timestamp { secs: last.secs, nanos: last.nanos + 1 }
        } else {
            Timestamp { secs: last.secs + 1, nanos: 0 }
        };
        self.clock
    }

    /// Forgets open handles and frees the unlinked inodes they kept alive:
    /// the tree as found after a reboot.
    pub(crate) fn forget_open(&mut self) {
        for ino in std::mem::take(&mut self.open).into_keys() {
            if self.inodes.get(&ino).is_some_and(|i| i.nlink == 0) {
                self.inodes.remove(&ino);
            }
        }
    }

    pub(crate) fn exists(&self, ino: u64) -> bool {
        self.inodes.contains_key(&ino)
    }

    fn get(&self, ino: u64) -> io::Result<&Inode> {
        self.inodes.get(&ino).ok_or_else(|| err(libc::ESTALE))
    }

    fn get_mut(&mut self, ino: u64) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or_else(|| err(libc::ESTALE))
    }

    fn is_dir(&self, ino: u64) -> bool {
        self.inodes.get(&ino).is_some_and(|i| matches!(i.node, Node::Dir(_)))
    }

    fn entries(&self, dir: u64) -> io::Result<&BTreeMap<OsString, u64>> {
        match &self.get(dir)?.node {
            Node::Dir(e) => Ok(e),
            _ => Err(err(libc::ENOTDIR)),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> io::Result<&mut BTreeMap<OsString, u64>> {
        match &mut self.get_mut(dir)?.node {
            Node::Dir(e) => Ok(e),
            _ => Err(err(libc::ENOTDIR)),
        }
    }

    fn walk(&self, names: &[&OsStr]) -> io::Result<u64> {
        let mut cur = ROOT;
        for name in names {
            cur = match &self.get(cur)?.node {
                Node::Dir(e) => *e.get(*name).ok_or_else(|| err(libc::ENOENT))?,
                Node::Symlink(_) => return Err(err(libc::ELOOP)),
                Node::File(_) | Node::Special(..) => return Err(err(libc::ENOTDIR)),
            };
        }
        Ok(cur)
    }

    /// The inode at `path`, a final symlink not followed.
    pub(crate) fn lookup(&self, path: &Path) -> io::Result<u64> {
        self.walk(&components(path)?)
    }

    /// Whether nothing is at `path` (`open(O_CREAT)` would create it).
    pub(crate) fn absent(&self, path: &Path) -> bool {
        self.lookup(path).is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
    }

    /// The directory holding `path`'s last name, and that name. The root
    /// has no parent: `root_errno` then.
    fn parent<'p>(&self, path: &'p Path, root_errno: i32) -> io::Result<(u64, &'p OsStr)> {
        let names = components(path)?;
        let (name, dirs) = names.split_last().ok_or_else(|| err(root_errno))?;
        let dir = self.walk(dirs)?;
        match self.get(dir)?.node {
            Node::Dir(_) => Ok((dir, name)),
            Node::Symlink(_) => Err(err(libc::ELOOP)),
            Node::File(_) | Node::Special(..) => Err(err(libc::ENOTDIR)),
        }
    }

    fn child(&self, dir: u64, name: &OsStr) -> io::Result<u64> {
        self.entries(dir)?.get(name).copied().ok_or_else(|| err(libc::ENOENT))
    }

    fn touch_dir(&mut self, dir: u64, now: Timestamp) -> io::Result<()> {
        let d = self.get_mut(dir)?;
        (d.mtime, d.ctime, d.mtime_set) = (now, now, now);
        Ok(())
    }

    fn add(&mut self, path: &Path, node: Node, mode: u32, ino: u64, now: Timestamp) -> io::Result<()> {
        let (dir, name) = self.parent(path, libc::EEXIST)?;
        if self.entries(dir)?.contains_key(name) || self.exists(ino) {
            return Err(err(libc::EEXIST));
        }
        let inode = Inode::new(node, mode & 0o7777, now);
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        self.inodes.insert(ino, inode);
        self.next_ino = self.next_ino.max(ino + 1);
        self.touch_dir(dir, now)
    }

    /// Removes one link to `ino`; frees it when no link and no handle remain.
    fn drop_link(&mut self, ino: u64, now: Timestamp) {
        let open = self.open.contains_key(&ino);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlink = i.nlink.saturating_sub(1);
            i.ctime = now;
            if matches!(i.node, Node::Dir(_)) || (i.nlink == 0 && !open) {
                self.inodes.remove(&ino);
            }
        }
    }

    fn meta(&self, ino: u64) -> io::Result<Meta> {
        let i = self.get(ino)?;
        let (size, nlink, rdev) = match &i.node {
            Node::File(d) => (d.size, i.nlink, 0),
            Node::Dir(e) => (4096, 2 + e.values().filter(|c| self.is_dir(**c)).count() as u64, 0),
            Node::Symlink(t) => (t.len() as u64, i.nlink, 0),
            Node::Special(_, rdev) => (0, i.nlink, *rdev),
        };
        Ok(Meta {
            kind: i.kind(),
            mode: i.mode,
            uid: i.uid,
            gid: i.gid,
            nlink,
            size,
            dev: 1,
            ino,
            rdev,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
        })
    }

    pub(crate) fn lstat(&self, path: &Path) -> io::Result<Meta> {
        self.meta(self.lookup(path)?)
    }

    pub(crate) fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        let entries = self.entries(self.lookup(path)?)?;
        entries.iter().map(|(name, ino)| Ok((name.clone(), self.get(*ino)?.kind()))).collect()
    }

    /// The regular file at `path`: `EISDIR` for a directory, `ELOOP` for a
    /// symlink (as `open(O_NOFOLLOW)`), `EINVAL` for a special file (as
    /// `RealFs`, which never opens one).
    pub(crate) fn file_ino(&self, path: &Path) -> io::Result<u64> {
        let ino = self.lookup(path)?;
        match self.get(ino)?.node {
            Node::File(_) => Ok(ino),
            Node::Dir(_) => Err(err(libc::EISDIR)),
            Node::Symlink(_) => Err(err(libc::ELOOP)),
            Node::Special(..) => Err(err(libc::EINVAL)),
        }
    }

    fn data(&self, ino: u64) -> io::Result<&Data> {
        match &self.get(ino)?.node {
            Node::File(d) => Ok(d),
            _ => Err(err(libc::EINVAL)),
        }
    }

    /// A data op changed the file at `now`: the times, unless a metadata op
    /// issued later was already applied (only `CrashFs` replays that way).
    fn data_mut(&mut self, ino: u64, now: Timestamp) -> io::Result<&mut Data> {
        let i = self.get_mut(ino)?;
        let Node::File(d) = &mut i.node else {
            return Err(err(libc::EINVAL));
        };
        if now > i.mtime_set {
            (i.mtime, i.mtime_set) = (now, now);
        }
        i.ctime = i.ctime.max(now);
        Ok(d)
    }

    pub(crate) fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.data(ino)?.read(off, buf))
    }

    pub(crate) fn write(&mut self, ino: u64, off: u64, data: &[u8], now: Timestamp) -> io::Result<()> {
        self.data(ino)?;
        if off.checked_add(data.len() as u64).is_none_or(|end| end > MAX_SIZE) {
            return Err(err(libc::EFBIG));
        }
        if !data.is_empty() {
            self.data_mut(ino, now)?.write(off, data);
        }
        Ok(())
    }

    pub(crate) fn set_len(&mut self, ino: u64, len: u64, now: Timestamp) -> io::Result<()> {
        if len > MAX_SIZE {
            return Err(err(libc::EINVAL));
        }
        self.data_mut(ino, now)?.set_len(len);
        Ok(())
    }

    pub(crate) fn len(&self, ino: u64) -> io::Result<u64> {
        Ok(self.data(ino)?.size)
    }

    /// Ok(true) if created, Ok(false) if a regular file is already there.
    pub(crate) fn create_file(&mut self, path: &Path, mode: u32, ino: u64, now: Timestamp) -> io::Result<bool> {
        match self.lookup(path) {
            Ok(i) if matches!(self.get(i)?.node, Node::File(_)) => Ok(false),
            Ok(_) => Err(err(libc::EEXIST)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                self.add(path, Node::File(Data::default()), mode, ino, now).map(|()| true)
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn mkdir(&mut self, path: &Path, mode: u32, ino: u64, now: Timestamp) -> io::Result<()> {
        self.add(path, Node::Dir(BTreeMap::new()), mode, ino, now)
    }

    pub(crate) fn symlink(&mut self, target: &OsStr, path: &Path, ino: u64, now: Timestamp) -> io::Result<()> {
        if target.is_empty() {
            return Err(err(libc::ENOENT));
        }
        if target.len() > 4095 {
            return Err(err(libc::ENAMETOOLONG));
        }
        if target.as_bytes().contains(&0) {
            return Err(err(libc::EINVAL));
        }
        self.add(path, Node::Symlink(target.to_owned()), 0o777, ino, now)
    }

    pub(crate) fn mknod(
        &mut self,
        path: &Path,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        ino: u64,
        now: Timestamp,
    ) -> io::Result<()> {
        if !kind.is_special() {
            return Err(err(libc::EINVAL));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        self.add(path, Node::Special(kind, rdev), mode, ino, now)
    }

    pub(crate) fn readlink(&self, path: &Path) -> io::Result<OsString> {
        match &self.get(self.lookup(path)?)?.node {
            Node::Symlink(t) => Ok(t.clone()),
            _ => Err(err(libc::EINVAL)),
        }
    }

    pub(crate) fn rename(&mut self, from: &Path, to: &Path, now: Timestamp) -> io::Result<()> {
        let (fdir, fname) = self.parent(from, libc::EBUSY)?;
        let src = self.child(fdir, fname)?;
        let (tdir, tname) = self.parent(to, libc::EBUSY)?;
        let src_dir = self.is_dir(src);
        let (fc, tc) = (components(from)?, components(to)?);
        if src_dir && tc.len() > fc.len() && tc[..fc.len()] == fc[..] {
            return Err(err(libc::EINVAL));
        }
        if let Some(&dst) = self.entries(tdir)?.get(tname) {
            if dst == src {
                return Ok(());
            }
            match (src_dir, self.is_dir(dst)) {
                (true, false) => return Err(err(libc::ENOTDIR)),
                (false, true) => return Err(err(libc::EISDIR)),
                (true, true) if !self.entries(dst)?.is_empty() => return Err(err(libc::ENOTEMPTY)),
                _ => {}
            }
            self.drop_link(dst, now);
        }
        self.entries_mut(fdir)?.remove(fname);
        self.entries_mut(tdir)?.insert(tname.to_owned(), src);
        self.touch_dir(fdir, now)?;
        self.touch_dir(tdir, now)?;
        self.get_mut(src)?.ctime = now;
        Ok(())
    }

    pub(crate) fn link(&mut self, existing: &Path, new: &Path, now: Timestamp) -> io::Result<()> {
        let src = self.lookup(existing)?;
        if self.is_dir(src) {
            return Err(err(libc::EPERM));
        }
        let (dir, name) = self.parent(new, libc::EEXIST)?;
        if self.entries(dir)?.contains_key(name) {
            return Err(err(libc::EEXIST));
        }
        self.entries_mut(dir)?.insert(name.to_owned(), src);
        let i = self.get_mut(src)?;
        i.nlink += 1;
        i.ctime = now;
        self.touch_dir(dir, now)
    }

    pub(crate) fn unlink(&mut self, path: &Path, now: Timestamp) -> io::Result<()> {
        let (dir, name) = self.parent(path, libc::EISDIR)?;
        let ino = self.child(dir, name)?;
        if self.is_dir(ino) {
            return Err(err(libc::EISDIR));
        }
        self.entries_mut(dir)?.remove(name);
        self.drop_link(ino, now);
        self.touch_dir(dir, now)
    }

    pub(crate) fn rmdir(&mut self, path: &Path, now: Timestamp) -> io::Result<()> {
        let (dir, name) = self.parent(path, libc::EBUSY)?;
        let ino = self.child(dir, name)?;
        if !self.entries(ino)?.is_empty() {
            return Err(err(libc::ENOTEMPTY));
        }
        self.entries_mut(dir)?.remove(name);
        self.drop_link(ino, now);
        self.touch_dir(dir, now)
    }

    pub(crate) fn set_mode(&mut self, path: &Path, mode: u32, now: Timestamp) -> io::Result<()> {
        let i = self.get_mut(self.lookup(path)?)?;
        if !matches!(i.node, Node::Symlink(_)) {
            i.mode = mode & 0o7777;
            i.ctime = now;
        }
        Ok(())
    }

    /// `u32::MAX` leaves an id unchanged, as `-1` does for `lchown`.
    pub(crate) fn set_owner(&mut self, path: &Path, uid: u32, gid: u32, now: Timestamp) -> io::Result<()> {
        let i = self.get_mut(self.lookup(path)?)?;
        if uid != u32::MAX {
            i.uid = uid;
        }
        if gid != u32::MAX {
            i.gid = gid;
        }
        if !matches!(i.node, Node::Dir(_)) {
            i.mode &= !libc::S_ISUID;
            if i.mode & libc::S_IXGRP != 0 {
                i.mode &= !libc::S_ISGID;
            }
        }
        i.ctime = now;
        Ok(())
    }

    pub(crate) fn set_times(
        &mut self,
        path: &Path,
        atime: Timestamp,
        mtime: Timestamp,
        now: Timestamp,
    ) -> io::Result<()> {
        if atime.nanos >= 1_000_000_000 || mtime.nanos >= 1_000_000_000 {
            return Err(err(libc::EINVAL));
        }
        let i = self.get_mut(self.lookup(path)?)?;
        (i.atime, i.mtime, i.mtime_set, i.ctime) = (atime, mtime, now, now);
        Ok(())
    }

    /// Checks an xattr name for `ino`; `Ok(false)` if the kernel would
    /// refuse a `user.*` name there (symlinks and special files).
    fn xattr_ok(&self, ino: u64, name: &OsStr) -> io::Result<bool> {
        Self::xattr_name_ok(name, matches!(self.get(ino)?.node, Node::Symlink(_) | Node::Special(..)))
    }

    /// [`MemTree::xattr_ok`] for an object that is or is not a file or
    /// directory (`no_user`: a symlink or special file, where Linux refuses
    /// `user.*`).
    fn xattr_name_ok(name: &OsStr, no_user: bool) -> io::Result<bool> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() > 255 {
            return Err(err(libc::ERANGE));
        }
        let prefix = [&b"user."[..], b"trusted.", b"security.", b"system."].into_iter().find(|p| b.starts_with(p));
        match prefix {
            None => Err(err(libc::ENOTSUP)),
            Some(p) if p.len() == b.len() || b.contains(&0) => Err(err(libc::EINVAL)),
            Some(p) => Ok(p != b"user." || !no_user),
        }
    }

    pub(crate) fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        let ino = self.lookup(path)?;
        match self.xattr_ok(ino, name) {
            Ok(true) => Ok(self.get(ino)?.xattrs.get(name).cloned()),
            Ok(false) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        Ok(self.get(self.lookup(path)?)?.xattrs.keys().cloned().collect())
    }

    pub(crate) fn set_xattr(&mut self, path: &Path, name: &OsStr, value: &[u8], now: Timestamp) -> io::Result<()> {
        let ino = self.lookup(path)?;
        if !self.xattr_ok(ino, name)? {
            return Err(err(libc::EPERM));
        }
        if value.len() > 65536 {
            return Err(err(libc::E2BIG));
        }
        let i = self.get_mut(ino)?;
        i.xattrs.insert(name.to_owned(), value.to_vec());
        i.ctime = now;
        Ok(())
    }

    pub(crate) fn remove_xattr(&mut self, path: &Path, name: &OsStr, now: Timestamp) -> io::Result<()> {
        let ino = self.lookup(path)?;
        match self.xattr_ok(ino, name) {
            Ok(true) => {}
            Ok(false) => return Err(err(libc::EPERM)),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
            Err(e) => return Err(e),
        }
        let i = self.get_mut(ino)?;
        if i.xattrs.remove(name).is_some() {
            i.ctime = now;
        }
        Ok(())
    }

    // ----- inode-level operations: `CrashFs`'s conservative model -----
    //
    // There a namespace operation may survive a power cut without an
    // earlier one (its parent's `mkdir`, a rename of its directory), so it
    // is replayed by inode numbers, not by paths; what ends up unreachable
    // from the root is lost ([`MemTree::collect`]).

    /// A new object as it was created: the inode's attributes and an empty
    /// node of its kind (a symlink's target, a device's number).
    pub(crate) fn fresh_copy(&self, ino: u64) -> io::Result<InodeCopy> {
        let i = self.get(ino)?;
        let node = match &i.node {
            Node::File(_) => Node::File(Data::default()),
            Node::Dir(_) => Node::Dir(BTreeMap::new()),
            n => n.clone(),
        };
        Ok(InodeCopy(Inode { node, ..i.clone_attrs() }))
    }

    /// Adds the inode of [`MemTree::fresh_copy`], unless it exists.
    pub(crate) fn put_inode(&mut self, ino: u64, c: &InodeCopy) {
        if let std::collections::btree_map::Entry::Vacant(v) = self.inodes.entry(ino) {
            v.insert(c.0.clone());
            self.next_ino = self.next_ino.max(ino + 1);
        }
    }

    /// The attributes of `ino` (mode, owner, times, xattrs).
    pub(crate) fn attrs(&self, ino: u64) -> io::Result<InodeCopy> {
        Ok(InodeCopy(self.get(ino)?.clone_attrs()))
    }

    /// Gives `ino` (if it exists) the attributes of `c`.
    pub(crate) fn set_attrs(&mut self, ino: u64, c: &InodeCopy) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            (i.mode, i.uid, i.gid) = (c.0.mode, c.0.uid, c.0.gid);
            (i.atime, i.mtime, i.ctime, i.mtime_set) = (c.0.atime, c.0.mtime, c.0.ctime, c.0.mtime_set);
            i.xattrs = c.0.xattrs.clone();
        }
    }

    /// `dir/name` becomes `ino` (a directory keeps one name: any other is
    /// dropped). Nothing happens if `dir` or `ino` does not exist.
    pub(crate) fn set_entry(&mut self, dir: u64, name: &OsStr, ino: u64, now: Timestamp) {
        if !self.is_dir(dir) || !self.exists(ino) {
            return;
        }
        if self.is_dir(ino) {
            for i in self.inodes.values_mut() {
                if let Node::Dir(e) = &mut i.node {
                    e.retain(|_, c| *c != ino);
                }
            }
        }
        if let Ok(e) = self.entries_mut(dir) {
            if let Some(old) = e.insert(name.to_owned(), ino) {
                if old != ino {
                    if let Some(o) = self.inodes.get_mut(&old) {
                        o.ctime = now;
                    }
                }
            }
        }
        let _ = self.touch_dir(dir, now);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.ctime = now;
        }
    }

    /// Removes `dir/name` if it is `ino`.
    pub(crate) fn clear_entry(&mut self, dir: u64, name: &OsStr, ino: u64, now: Timestamp) {
        let Ok(e) = self.entries_mut(dir) else { return };
        if e.get(name) != Some(&ino) {
            return;
        }
        e.remove(name);
        let _ = self.touch_dir(dir, now);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.ctime = now;
        }
    }

    /// What a reboot (and fsck) finds: inodes unreachable from the root
    /// are gone, a file's link count is its names.
    pub(crate) fn collect(&mut self) {
        let mut links: BTreeMap<u64, u64> = BTreeMap::from([(ROOT, 1)]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            let Some(Inode { node: Node::Dir(e), .. }) = self.inodes.get(&d) else { continue };
            for &c in e.values() {
                let n = links.entry(c).or_insert(0);
                *n += 1;
                if *n == 1 && self.is_dir(c) {
                    todo.push(c);
                }
            }
        }
        self.inodes.retain(|ino, _| links.contains_key(ino));
        for (ino, i) in self.inodes.iter_mut() {
            if !matches!(i.node, Node::Dir(_)) {
                i.nlink = links[ino];
            }
        }
        self.open.clear();
    }

    /// Registers an open handle on a file inode.
    pub(crate) fn open(&mut self, ino: u64) {
        *self.open.entry(ino).or_default() += 1;
    }

    /// Drops an open handle; frees the inode if it was its last trace.
    pub(crate) fn close(&mut self, ino: u64) {
        let Some(n) = self.open.get_mut(&ino) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.open.remove(&ino);
            if self.inodes.get(&ino).is_some_and(|i| i.nlink == 0) {
                self.inodes.remove(&ino);
            }
        }
    }
}

/// [`Storage::probe_xattrs`] for the in-memory trees: names and sizes as
/// their `set_xattr` takes them (no limit on a set's total).
pub(super) fn probe_xattrs(kind: FileKind, xattrs: &[(OsString, Vec<u8>, bool)]) -> io::Result<()> {
    for (name, value, _) in xattrs.iter().filter(|x| x.2) {
        if !MemTree::xattr_name_ok(name, !matches!(kind, FileKind::File | FileKind::Dir))? {
            return Err(err(libc::EPERM));
        }
        if value.len() > 65536 {
            return Err(err(libc::E2BIG));
        }
    }
    Ok(())
}

/// An in-memory [`Storage`]; see the module documentation.
pub struct MemFs {
    tree: Arc<Mutex<MemTree>>,
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new()
    }
}

impl MemFs {
    /// An empty file system: a root directory with mode 0o755, owned by 0:0.
    pub fn new() -> MemFs {
        MemFs::from_tree(MemTree::new())
    }

    pub(crate) fn from_tree(tree: MemTree) -> MemFs {
        MemFs { tree: Arc::new(Mutex::new(tree)) }
    }

    /// A copy of the current state.
    pub(crate) fn snapshot(&self) -> MemTree {
        self.tree.lock().clone()
    }

    /// Runs a mutation with a fresh timestamp.
    fn change<R>(&self, f: impl FnOnce(&mut MemTree, Timestamp) -> io::Result<R>) -> io::Result<R> {
        let mut t = self.tree.lock();
        let now = t.tick();
        f(&mut t, now)
    }
}

impl Storage for MemFs {
    fn lstat(&self, path: &Path) -> io::Result<Meta> {
        self.tree.lock().lstat(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        self.tree.lock().read_dir(path)
    }
    fn read_at(&self, path: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let t = self.tree.lock();
        t.read(t.file_ino(path)?, off, buf)
    }
    fn write_at(&self, path: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.change(|t, now| t.write(t.file_ino(path)?, off, data, now))
    }
    fn set_len(&self, path: &Path, len: u64) -> io::Result<()> {
        self.change(|t, now| t.set_len(t.file_ino(path)?, len, now))
    }
    fn create_file(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.change(|t, now| t.create_file(path, mode, t.next_ino, now).map(drop))
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.change(|t, now| t.mkdir(path, mode, t.next_ino, now))
    }
    fn symlink(&self, target: &OsStr, path: &Path) -> io::Result<()> {
        self.change(|t, now| t.symlink(target, path, t.next_ino, now))
    }
    fn mknod(&self, path: &Path, kind: FileKind, mode: u32, rdev: u64) -> io::Result<()> {
        self.change(|t, now| t.mknod(path, kind, mode, rdev, t.next_ino, now))
    }
    fn readlink(&self, path: &Path) -> io::Result<OsString> {
        self.tree.lock().readlink(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.change(|t, now| t.rename(from, to, now))
    }
    fn link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.change(|t, now| t.link(existing, new, now))
    }
    fn unlink(&self, path: &Path) -> io::Result<()> {
        self.change(|t, now| t.unlink(path, now))
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        self.change(|t, now| t.rmdir(path, now))
    }
    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.change(|t, now| t.set_mode(path, mode, now))
    }
    fn set_owner(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        self.change(|t, now| t.set_owner(path, uid, gid, now))
    }
    fn set_times(&self, path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
        self.change(|t, now| t.set_times(path, atime, mtime, now))
    }
    fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        self.tree.lock().get_xattr(path, name)
    }
    fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        self.tree.lock().list_xattrs(path)
    }
    fn probe_xattrs(&self, _scratch: &Path, kind: FileKind, xattrs: &[(OsString, Vec<u8>, bool)]) -> io::Result<()> {
        probe_xattrs(kind, xattrs)
    }
    fn set_xattr(&self, path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
        self.change(|t, now| t.set_xattr(path, name, value, now))
    }
    fn remove_xattr(&self, path: &Path, name: &OsStr) -> io::Result<()> {
        self.change(|t, now| t.remove_xattr(path, name, now))
    }
    fn fsync(&self, path: &Path) -> io::Result<()> {
        self.tree.lock().lookup(path).map(drop)
    }
    fn sync_all(&self) -> io::Result<()> {
        Ok(())
    }
    fn open_file(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        let ino = self.change(|t, now| {
            if create && t.absent(path) {
                t.create_file(path, 0o600, t.next_ino, now)?;
            }
            let ino = t.file_ino(path)?;
            t.open(ino);
            Ok(ino)
        })?;
        Ok(Arc::new(MemFile { tree: self.tree.clone(), ino }))
    }
}

/// A handle bound to an inode of a [`MemFs`].
struct MemFile {
    tree: Arc<Mutex<MemTree>>,
    ino: u64,
}

impl StoredFile for MemFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.tree.lock().read(self.ino, off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let mut t = self.tree.lock();
        let now = t.tick();
        t.write(self.ino, off, data, now)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut t = self.tree.lock();
        let now = t.tick();
        t.set_len(self.ino, len, now)
    }
    fn len(&self) -> io::Result<u64> {
        self.tree.lock().len(self.ino)
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        self.tree.lock().close(self.ino);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every object (the root as ""), by path: its metadata, its contents (or
    /// link target) and its xattrs.
    #[allow(clippy::type_complexity)]
    pub(crate) fn dump(fs: &dyn Storage) -> BTreeMap<String, (Meta, Vec<u8>, Vec<(OsString, Vec<u8>)>)> {
        fn walk(fs: &dyn Storage, dir: &str, out: &mut BTreeMap<String, (Meta, Vec<u8>, Vec<(OsString, Vec<u8>)>)>) {
            for (name, _) in fs.read_dir(Path::new(dir)).unwrap() {
                let name = name.to_string_lossy();
                let path = if dir.is_empty() { name.into_owned() } else { format!("{dir}/{name}") };
                let p = Path::new(&path);
                let m = fs.lstat(p).unwrap();
                let body = match m.kind {
                    FileKind::File => {
                        let mut b = vec![0; m.size as usize];
                        assert_eq!(fs.read_at(p, 0, &mut b).unwrap(), b.len());
                        b
                    }
                    FileKind::Symlink => fs.readlink(p).unwrap().into_encoded_bytes(),
                    _ => Vec::new(),
                };
                let xattrs = fs.list_xattrs(p).unwrap();
                let xattrs =
                    xattrs.into_iter().filter_map(|n| Some((n.clone(), fs.get_xattr(p, &n).unwrap()?))).collect();
                let is_dir = m.kind == FileKind::Dir;
                out.insert(path.clone(), (m, body, xattrs));
                if is_dir {
                    walk(fs, &path, out);
                }
            }
        }
        let root = fs.lstat(Path::new("")).unwrap();
        let mut out = BTreeMap::from([(String::new(), (root, Vec::new(), Vec::new()))]);
        walk(fs, "", &mut out);
        out
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    pub(crate) fn errno<T>(r: io::Result<T>) -> i32 {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.raw_os_error().unwrap_or(0),
        }
    }

    fn read_all(fs: &dyn Storage, path: &str) -> Vec<u8> {
        let mut buf = vec![0; fs.lstat(p(path)).unwrap().size as usize];
        let n = fs.read_at(p(path), 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn errno_cases() {
        let fs = MemFs::new();
        fs.mkdir(p("d"), 0o755).unwrap();
        fs.create_file(p("d/f"), 0o644).unwrap();
        fs.symlink(OsStr::new("d"), p("s")).unwrap();
        assert_eq!(errno(fs.lstat(p("nope"))), libc::ENOENT);
        assert_eq!(errno(fs.lstat(p("nope/x"))), libc::ENOENT);
        assert_eq!(errno(fs.mkdir(p("d"), 0o755)), libc::EEXIST);
        assert_eq!(errno(fs.mkdir(p(""), 0o755)), libc::EEXIST);
        assert_eq!(errno(fs.lstat(p("d/f/x"))), libc::ENOTDIR);
        assert_eq!(errno(fs.read_dir(p("d/f"))), libc::ENOTDIR);
        assert_eq!(errno(fs.lstat(p("s/f"))), libc::ELOOP);
        assert_eq!(errno(fs.read_at(p("s"), 0, &mut [0; 4])), libc::ELOOP);
        assert_eq!(errno(fs.read_at(p("d"), 0, &mut [0; 4])), libc::EISDIR);
        assert_eq!(errno(fs.unlink(p("d"))), libc::EISDIR);
        assert_eq!(errno(fs.rmdir(p("d/f"))), libc::ENOTDIR);
        assert_eq!(errno(fs.rmdir(p("d"))), libc::ENOTEMPTY);
        assert_eq!(errno(fs.link(p("d"), p("d2"))), libc::EPERM);
        assert_eq!(errno(fs.create_file(p("d"), 0o644)), libc::EEXIST);
        assert_eq!(errno(fs.create_file(p("s"), 0o644)), libc::EEXIST);
        for bad in ["/d", "d/", "d//f", "./d", "d/..", ".."] {
            assert_eq!(errno(fs.lstat(p(bad))), libc::EINVAL, "{bad}");
        }
        assert_eq!(errno(fs.lstat(p(&"x".repeat(256)))), libc::ENAMETOOLONG);
        assert_eq!(errno(fs.write_at(p("d/f"), u64::MAX - 1, b"ab")), libc::EFBIG);
        // Idempotent create, readlink, set_mode on a symlink is a no-op.
        fs.create_file(p("d/f"), 0o600).unwrap();
        assert_eq!(fs.lstat(p("d/f")).unwrap().mode, 0o644);
        assert_eq!(fs.readlink(p("s")).unwrap(), "d");
        assert_eq!(errno(fs.readlink(p("d"))), libc::EINVAL);
        fs.set_mode(p("s"), 0o600).unwrap();
        assert_eq!(fs.lstat(p("s")).unwrap().mode, 0o777);
    }

    #[test]
    fn data_sparse_and_truncate() {
        let fs = MemFs::new();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.write_at(p("f"), 5000, b"hello").unwrap();
        assert_eq!(fs.lstat(p("f")).unwrap().size, 5005);
        let data = read_all(&fs, "f");
        assert!(data[..5000].iter().all(|&b| b == 0));
        assert_eq!(&data[5000..], b"hello");
        fs.set_len(p("f"), 5002).unwrap();
        fs.set_len(p("f"), 6000).unwrap();
        let data = read_all(&fs, "f");
        assert_eq!(&data[5000..5004], b"he\0\0");
        assert_eq!(fs.read_at(p("f"), 7000, &mut [0; 8]).unwrap(), 0);
        fs.set_len(p("f"), 1 << 50).unwrap(); // sparse: costs nothing
        assert_eq!(fs.read_at(p("f"), (1 << 50) - 2, &mut [1; 8]).unwrap(), 2);
    }

    #[test]
    fn hard_links_and_nlink() {
        let fs = MemFs::new();
        fs.create_file(p("a"), 0o644).unwrap();
        fs.link(p("a"), p("b")).unwrap();
        let (ma, mb) = (fs.lstat(p("a")).unwrap(), fs.lstat(p("b")).unwrap());
        assert_eq!((ma.ino, ma.nlink, ma.dev), (mb.ino, 2, 1));
        fs.write_at(p("a"), 0, b"shared").unwrap();
        assert_eq!(read_all(&fs, "b"), b"shared");
        assert_eq!(errno(fs.link(p("a"), p("b"))), libc::EEXIST);
        fs.unlink(p("a")).unwrap();
        assert_eq!(fs.lstat(p("b")).unwrap().nlink, 1);
        // Directory link counts: 2 + subdirectories.
        fs.mkdir(p("d"), 0o755).unwrap();
        fs.mkdir(p("d/x"), 0o755).unwrap();
        fs.mkdir(p("d/y"), 0o755).unwrap();
        fs.create_file(p("d/f"), 0o644).unwrap();
        assert_eq!(fs.lstat(p("d")).unwrap().nlink, 4);
        assert_eq!(fs.lstat(p("")).unwrap().nlink, 3);
        // Inode numbers are never reused.
        let old = fs.lstat(p("d/f")).unwrap().ino;
        fs.unlink(p("d/f")).unwrap();
        fs.create_file(p("d/f"), 0o644).unwrap();
        assert!(fs.lstat(p("d/f")).unwrap().ino > old);
    }

    #[test]
    fn rename_semantics() {
        let fs = MemFs::new();
        fs.mkdir(p("d"), 0o755).unwrap();
        fs.mkdir(p("d/sub"), 0o755).unwrap();
        fs.mkdir(p("e"), 0o755).unwrap();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.create_file(p("g"), 0o644).unwrap();
        fs.create_file(p("d/sub/x"), 0o644).unwrap();
        assert_eq!(errno(fs.rename(p("d"), p("d/sub/in"))), libc::EINVAL);
        assert_eq!(errno(fs.rename(p("d"), p("f"))), libc::ENOTDIR);
        assert_eq!(errno(fs.rename(p("f"), p("d"))), libc::EISDIR);
        assert_eq!(errno(fs.rename(p("e"), p("d"))), libc::ENOTEMPTY);
        assert_eq!(errno(fs.rename(p("nope"), p("x"))), libc::ENOENT);
        assert_eq!(errno(fs.rename(p("f"), p("nope/x"))), libc::ENOENT);
        // Same inode: a no-op that keeps both names.
        fs.link(p("f"), p("f2")).unwrap();
        fs.rename(p("f"), p("f2")).unwrap();
        assert!(fs.lstat(p("f")).is_ok() && fs.lstat(p("f2")).is_ok());
        // Replace a file; the replaced inode loses its link.
        let g = fs.lstat(p("g")).unwrap().ino;
        fs.rename(p("g"), p("f")).unwrap();
        assert_eq!(fs.lstat(p("f")).unwrap().ino, g);
        assert_eq!(fs.lstat(p("f2")).unwrap().nlink, 1);
        // Move a directory over an empty one; subtree follows.
        fs.rename(p("d"), p("e")).unwrap();
        assert_eq!(fs.read_dir(p("e/sub")).unwrap(), vec![("x".into(), FileKind::File)]);
        assert_eq!(errno(fs.lstat(p("d"))), libc::ENOENT);
        assert_eq!(fs.lstat(p("")).unwrap().nlink, 3);
    }

    #[test]
    fn handles_follow_the_inode() {
        let fs = MemFs::new();
        let h = fs.open_file(p("j"), true).unwrap();
        assert_eq!(fs.lstat(p("j")).unwrap().mode, 0o600);
        h.write_at(0, b"abc").unwrap();
        fs.rename(p("j"), p("k")).unwrap();
        h.write_at(3, b"def").unwrap();
        assert_eq!(read_all(&fs, "k"), b"abcdef");
        let ino = fs.lstat(p("k")).unwrap().ino;
        fs.unlink(p("k")).unwrap();
        h.set_len(2).unwrap();
        let mut buf = [0; 8];
        assert_eq!(h.read_at(0, &mut buf).unwrap(), 2);
        assert_eq!(h.len().unwrap(), 2);
        assert!(fs.snapshot().exists(ino));
        drop(h);
        assert!(!fs.snapshot().exists(ino));
        assert_eq!(errno(fs.open_file(p("k"), false)), libc::ENOENT);
    }

    #[test]
    fn attributes_and_times() {
        let fs = MemFs::new();
        fs.create_file(p("f"), 0o6755).unwrap();
        fs.set_owner(p("f"), 1000, u32::MAX).unwrap();
        let m = fs.lstat(p("f")).unwrap();
        assert_eq!((m.uid, m.gid, m.mode), (1000, 0, 0o755));
        let t = Timestamp { secs: 1_000_000, nanos: 5 };
        fs.set_times(p("f"), t, t).unwrap();
        let m = fs.lstat(p("f")).unwrap();
        assert_eq!((m.atime, m.mtime), (t, t));
        assert!(m.ctime > t);
        fs.write_at(p("f"), 0, b"x").unwrap();
        let m2 = fs.lstat(p("f")).unwrap();
        assert!(m2.mtime > m.ctime && m2.ctime == m2.mtime);
        let dir_before = fs.lstat(p("")).unwrap().mtime;
        fs.unlink(p("f")).unwrap();
        assert!(fs.lstat(p("")).unwrap().mtime > dir_before);
        assert_eq!(errno(fs.set_times(p(""), t, Timestamp { secs: 0, nanos: 1 << 30 })), libc::EINVAL);
    }

    #[test]
    fn xattrs() {
        let fs = MemFs::new();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.symlink(OsStr::new("f"), p("s")).unwrap();
        let n = OsStr::new("user.k");
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), None);
        fs.set_xattr(p("f"), n, b"v").unwrap();
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), Some(b"v".to_vec()));
        assert_eq!(fs.list_xattrs(p("f")).unwrap(), vec![OsString::from("user.k")]);
        fs.remove_xattr(p("f"), n).unwrap();
        fs.remove_xattr(p("f"), n).unwrap();
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), None);
        assert_eq!(errno(fs.set_xattr(p("s"), n, b"v")), libc::EPERM);
        assert_eq!(errno(fs.set_xattr(p("f"), OsStr::new("bogus"), b"v")), libc::ENOTSUP);
        assert_eq!(errno(fs.set_xattr(p("f"), OsStr::new("user."), b"v")), libc::EINVAL);
        assert_eq!(errno(fs.set_xattr(p("f"), n, &vec![0; 65537])), libc::E2BIG);
        fs.set_xattr(p("s"), OsStr::new("trusted.t"), b"v").unwrap();
    }
}
