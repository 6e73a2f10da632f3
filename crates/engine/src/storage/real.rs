//! [`RealFs`]: the backing directory on a real (Linux) file system.
//!
//! ## Confinement
//! [`RealFs::open`] keeps a file descriptor on the backing root, and every
//! path is resolved *beneath* it, never through a symlink:
//! * paths are first checked to be plain names (`EINVAL` for `.`, `..`, an
//!   empty name, a leading `/`);
//! * a parent directory (or a file to open) is reached with `openat2(root,
//!   .., RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: a
//!   symlink anywhere on the way is `ELOOP`, an escape `EXDEV`;
//! * the last component is handled by an `*at` call that does not follow it
//!   (`AT_SYMLINK_NOFOLLOW`, `O_NOFOLLOW`, or calls that never follow).
//!
//! Errors carry the kernel's errno, unchanged.
//!
//! ## Choices beyond the trait's documentation
//! * `create_file` and `mkdir` give the new object exactly the mode asked
//!   for (an `fchmod` after creation), whatever the process umask, as
//!   [`MemFs`](super::MemFs) does; `open_file`'s creation mode 0600 is
//!   subject to the umask. `create_file` over a non-regular object is
//!   `EEXIST`.
//! * `read_at`, `write_at`, `set_len` and `open_file` only touch regular
//!   files: `ELOOP` for a symlink, `EISDIR` for a directory, `EINVAL` for a
//!   device, fifo or socket (opened non-blocking, never read).
//! * `fsync` of a symlink or special file syncs its parent directory (which
//!   holds all that can be made durable of it).
//! * `mknod` makes fifos and sockets for anyone, devices only as root
//!   (`may_mknod`: `CAP_MKNOD` is not looked at apart from root), and
//!   opens none of them.
//! * Extended attributes go through `/proc/self/fd/<parent>/<name>` with the
//!   `l*xattr` calls (so `/proc` must be mounted for them). `ENOTSUP` reads
//!   as "no attribute" for `get_xattr`, `list_xattrs` and `remove_xattr`.
//! * The backing's limits, so the engine refuses at the call what a
//!   checkpoint could not apply (issue 23): `probe_xattrs` builds a scratch
//!   object of the same kind at the path it is given (the engine's
//!   `.txfs/probe`), sets the whole resulting xattr set on it and removes
//!   it; `max_file_size` is probed once with `ftruncate` of a nameless
//!   `O_TMPFILE`; `max_links` is `_PC_LINK_MAX` where glibc knows it
//!   (ext2/3/4, xfs, btrfs), unknown elsewhere.

use super::mem::{components, err};
use super::{FileKind, Meta, Storage, StoredFile, Timestamp};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// The backing directory; see the module documentation.
pub struct RealFs {
    root: OwnedFd,
    /// Read descriptors of recently read files, most recent last. Reading
    /// through one open file keeps the kernel's readahead state (a fresh
    /// open per READ made cold sequential reads synchronous) and saves the
    /// openat2 walk. Any rename, unlink or rmdir empties it, so a cached
    /// path never names another file than a fresh resolution would.
    readers: parking_lot::Mutex<Vec<(std::path::PathBuf, Arc<File>)>>,
    /// The backing file system's largest file size, probed once.
    max_size: std::sync::OnceLock<Option<u64>>,
}

/// How many read descriptors [`RealFs`] keeps.
const READERS: usize = 32;

/// Where an operation's last component lives: a directory fd (the root if
/// `dir` is `None`) and a name in it (`.` for the root itself).
struct At {
    dir: Option<OwnedFd>,
    root: RawFd,
    name: CString,
}

impl At {
    fn fd(&self) -> RawFd {
        self.dir.as_ref().map_or(self.root, |d| d.as_raw_fd())
    }
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| err(libc::EINVAL))
}

fn kind_of(mode: libc::mode_t) -> FileKind {
    FileKind::from_mode(mode)
}

/// Whether this process may make a device node with `mknodat` (root: the
/// daemon runs as root when devices matter; a capability set narrower
/// than root's is not looked at). Anyone may make a whiteout (char 0:0).
fn may_mknod_device(kind: FileKind, rdev: u64) -> bool {
    // SAFETY: geteuid has no preconditions.
    !kind.is_device() || (kind == FileKind::CharDev && rdev == 0) || unsafe { libc::geteuid() } == 0
}

#[allow(clippy::unnecessary_cast)] // the stat field types vary by platform
fn meta_of(st: &libc::stat) -> Meta {
    let ts = |secs: i64, nanos: i64| Timestamp { secs, nanos: nanos as u32 };
    Meta {
        kind: kind_of(st.st_mode),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink as u64,
        size: st.st_size as u64,
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        rdev: st.st_rdev as u64,
        atime: ts(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: ts(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: ts(st.st_ctime as i64, st.st_ctime_nsec as i64),
    }
}

fn fstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid C string and out-pointer; `st` is initialized on success.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(unsafe { st.assume_init() })
}

/// Reads until `buf` is full or EOF.
fn read_full(f: &File, off: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off.saturating_add(n as u64)) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn ftruncate(f: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| err(libc::EINVAL))?;
    // SAFETY: plain syscall on an owned fd.
    cvt(unsafe { libc::ftruncate(f.as_raw_fd(), len) })
}

impl RealFs {
    /// Opens the backing root directory.
    pub fn open(root: &Path) -> io::Result<RealFs> {
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(root)?;
        Ok(RealFs { root: f.into(), readers: parking_lot::Mutex::new(Vec::new()), max_size: Default::default() })
    }

    /// The fd of the backing root directory (opened `O_RDONLY|O_DIRECTORY`).
    pub fn root_fd(&self) -> RawFd {
        self.root.as_raw_fd()
    }

    /// `openat2` of `rel` (non-empty, validated) beneath the root, through
    /// no symlink; a final symlink is `ELOOP` unless `O_PATH|O_NOFOLLOW`.
    ///
    /// A path longer than [`STEP_MAX`] is walked in steps: each step opens
    /// at most that many bytes of it as a directory (`O_PATH`), beneath the
    /// directory the previous step opened, with the same resolve flags. So
    /// no tree is too deep for the backing to reach, whatever `PATH_MAX`
    /// says: a user who built one through the mount with relative
    /// `mkdirat` calls gets it checkpointed like any other.
    fn openat2(&self, rel: &[u8], flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let mut dir: Option<OwnedFd> = None;
        let mut rest = rel;
        while rest.len() > STEP_MAX {
            // components are at most 255 bytes, so a '/' is always in reach
            let cut = rest[..=STEP_MAX].iter().rposition(|&b| b == b'/').ok_or_else(|| err(libc::ENAMETOOLONG))?;
            let from = dir.as_ref().map_or(self.root_fd(), |d| d.as_raw_fd());
            dir = Some(Self::openat2_beneath(from, &rest[..cut], libc::O_PATH | libc::O_DIRECTORY, 0)?);
            rest = &rest[cut + 1..];
        }
        Self::openat2_beneath(dir.as_ref().map_or(self.root_fd(), |d| d.as_raw_fd()), rest, flags, mode)
    }

    /// One `openat2` of `rel` beneath the directory `from`.
    fn openat2_beneath(from: RawFd, rel: &[u8], flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let rel = cstring(rel)?;
        // SAFETY: `open_how` is plain data (and `non_exhaustive` in libc).
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.mode = if flags & libc::O_CREAT != 0 { u64::from(mode) } else { 0 };
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        let mut tries = 0;
        loop {
            // SAFETY: valid pointers and size for the openat2 syscall.
            let fd = unsafe {
                libc::syscall(libc::SYS_openat2, from, rel.as_ptr(), &how, std::mem::size_of::<libc::open_how>())
            };
            if fd >= 0 {
                // SAFETY: the kernel just gave us this fd.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
            }
            let e = io::Error::last_os_error();
            tries += 1;
            // EAGAIN: a concurrent rename made the kernel unsure; retry.
            if !matches!(errno_of(&e), libc::EAGAIN | libc::EINTR) || tries >= 16 {
                return Err(e);
            }
        }
    }

    /// The directory holding `path`'s last component, and that name.
    fn at(&self, path: &Path) -> io::Result<At> {
        let names = components(path)?;
        let Some((name, dirs)) = names.split_last() else {
            return Ok(At { dir: None, root: self.root_fd(), name: c".".into() });
        };
        let dir = if dirs.is_empty() {
            None
        } else {
            Some(self.openat2(&join(dirs), libc::O_PATH | libc::O_DIRECTORY, 0)?)
        };
        Ok(At { dir, root: self.root_fd(), name: cstring(name.as_bytes())? })
    }

    /// Opens the object at `path` itself (`O_NOFOLLOW`).
    fn open_path(&self, path: &Path, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let names = components(path)?;
        let rel = if names.is_empty() { b".".to_vec() } else { join(&names) };
        self.openat2(&rel, flags | libc::O_NOFOLLOW, mode)
    }

    /// Opens a regular file: `EISDIR` for a directory, `EINVAL` for any
    /// other non-regular object.
    fn open_regular(&self, path: &Path, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let f = File::from(self.open_path(path, flags | libc::O_NONBLOCK, mode)?);
        let ft = f.metadata()?.file_type();
        if ft.is_file() {
            Ok(f)
        } else {
            Err(err(if ft.is_dir() { libc::EISDIR } else { libc::EINVAL }))
        }
    }

    /// A read descriptor for `path`, from [`RealFs::readers`] or opened.
    fn reader(&self, path: &Path) -> io::Result<Arc<File>> {
        let mut cache = self.readers.lock();
        if let Some(i) = cache.iter().position(|(p, _)| p == path) {
            let e = cache.remove(i);
            let f = e.1.clone();
            cache.push(e);
            return Ok(f);
        }
        let f = Arc::new(self.open_regular(path, libc::O_RDONLY, 0)?);
        if cache.len() >= READERS {
            cache.remove(0);
        }
        cache.push((path.to_path_buf(), f.clone()));
        Ok(f)
    }

    /// chmod that never follows a final symlink (and leaves symlinks alone).
    fn chmod_at(&self, at: &At, mode: u32) -> io::Result<()> {
        let mode = mode & 0o7777;
        // SAFETY: valid C string; fchmodat2 (Linux 6.6) honours NOFOLLOW.
        let r =
            unsafe { libc::syscall(libc::SYS_fchmodat2, at.fd(), at.name.as_ptr(), mode, libc::AT_SYMLINK_NOFOLLOW) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        let is_link = || fstatat(at.fd(), &at.name).is_ok_and(|st| kind_of(st.st_mode) == FileKind::Symlink);
        match errno_of(&e) {
            libc::EOPNOTSUPP if is_link() => Ok(()),
            libc::ENOSYS if is_link() => Ok(()),
            // SAFETY: valid C string. Older kernels: the name was just seen
            // not to be a symlink.
            libc::ENOSYS => cvt(unsafe { libc::fchmodat(at.fd(), at.name.as_ptr(), mode, 0) }),
            _ => Err(e),
        }
    }

    /// The largest length `ftruncate` accepts on a nameless scratch file
    /// (`O_TMPFILE` in the root, gone when closed): the file system's
    /// maximum file size (ext4 with 4 KiB blocks: 16 TiB), which a write
    /// may reach and not pass (`EFBIG`). `None` if no scratch file can be
    /// made here.
    fn probe_max_size(&self) -> Option<u64> {
        // SAFETY: a valid C string; the fd is checked and owned below.
        let fd = unsafe {
            libc::openat(self.root_fd(), c".".as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600)
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: the kernel just gave us this fd.
        let f = unsafe { File::from_raw_fd(fd) };
        let fits = |len: u64| ftruncate(&f, len).is_ok();
        let (mut ok, mut bad) = (0u64, i64::MAX as u64 + 1);
        if fits(bad - 1) {
            return Some(bad - 1);
        }
        while bad - ok > 1 {
            let mid = ok + (bad - ok) / 2;
            if fits(mid) {
                ok = mid;
            } else {
                bad = mid;
            }
        }
        let _ = ftruncate(&f, 0);
        Some(ok)
    }

    /// Removes whatever is at `path` (a file, symlink or empty directory).
    fn remove_any(&self, path: &Path) -> io::Result<()> {
        match self.unlink(path) {
            Err(e) if errno_of(&e) == libc::EISDIR || errno_of(&e) == libc::EPERM => self.rmdir(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// `/proc/self/fd/<dir>/<name>`: the object itself for the `l*xattr`
    /// calls (the magic link is the middle component; the name is not
    /// followed).
    fn xattr_path(at: &At) -> io::Result<CString> {
        let mut p = format!("/proc/self/fd/{}/", at.fd()).into_bytes();
        p.extend_from_slice(at.name.as_bytes());
        cstring(&p)
    }
}

/// The longest relative path one `openat2` is given (`PATH_MAX` is 4096
/// bytes with the NUL): [`RealFs::openat2`] walks longer ones in steps.
const STEP_MAX: usize = 2048;

fn join(names: &[&OsStr]) -> Vec<u8> {
    names.iter().map(|n| n.as_bytes()).collect::<Vec<_>>().join(&b'/')
}

/// Calls a "size query, then fill" xattr function until the buffer fits.
fn xattr_buf(mut call: impl FnMut(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
    for _ in 0..16 {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        let n = call(buf.as_mut_ptr().cast(), buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if errno_of(&e) != libc::ERANGE {
            return Err(e);
        }
    }
    Err(err(libc::ERANGE))
}

impl Storage for RealFs {
    fn privileged(&self) -> bool {
        // SAFETY: no arguments, cannot fail.
        unsafe { libc::geteuid() == 0 }
    }
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        // SAFETY: fstatvfs into a zeroed struct on our own descriptor.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut v) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Root may use the reserved blocks (ext4's 5 %), as its writes will.
        // SAFETY: geteuid cannot fail.
        let blocks = if unsafe { libc::geteuid() } == 0 { v.f_bfree } else { v.f_bavail };
        Ok(Some(blocks.saturating_mul(v.f_frsize)))
    }
    fn free_inodes(&self) -> io::Result<Option<u64>> {
        // SAFETY: fstatvfs into a zeroed struct on our own descriptor.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut v) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // No fixed number (btrfs, tmpfs without a limit say 0 files).
        // SAFETY: geteuid cannot fail.
        let free = if unsafe { libc::geteuid() } == 0 { v.f_ffree } else { v.f_favail };
        Ok((v.f_files > 0).then_some(free))
    }

    fn probe_xattrs(&self, scratch: &Path, kind: FileKind, xattrs: &[(OsString, Vec<u8>, bool)]) -> io::Result<()> {
        self.remove_any(scratch)?;
        match kind {
            FileKind::File => self.create_file(scratch, 0o600)?,
            FileKind::Dir => self.mkdir(scratch, 0o700)?,
            FileKind::Symlink => self.symlink(OsStr::new("txfs-probe"), scratch)?,
            // Every special file takes the same xattrs as a fifo (Linux
            // asks the inode's type only whether `user.*` is allowed: never
            // on any of them), and a fifo needs no privilege.
            k if k.is_special() => self.mknod(scratch, FileKind::Fifo, 0o600, 0)?,
            _ => return Ok(()),
        }
        // What the engine writes first, so its own refusal (a namespace,
        // a size) is what is reported; an attribute the object keeps as it
        // is counts only for the room it takes.
        let mut res = Ok(());
        for written in [true, false] {
            for (name, value, _) in xattrs.iter().filter(|x| x.2 == written) {
                match self.set_xattr(scratch, name, value) {
                    Ok(()) => {}
                    Err(e) if written || matches!(errno_of(&e), libc::ENOSPC | libc::E2BIG) => {
                        res = Err(e);
                        break;
                    }
                    Err(_) => {}
                }
            }
            if res.is_err() {
                break;
            }
        }
        self.remove_any(scratch)?;
        res
    }
    fn may_mknod(&self, kind: FileKind, rdev: u64) -> bool {
        may_mknod_device(kind, rdev)
    }
    fn may_own(&self, uid: u32, gid: u32) -> bool {
        // SAFETY: these calls have no preconditions; getgroups fills at
        // most the length it is given.
        unsafe {
            if libc::geteuid() == 0 {
                return true;
            }
            if uid != libc::geteuid() {
                return false;
            }
            if gid == libc::getegid() {
                return true;
            }
            let mut groups = vec![0 as libc::gid_t; 1024];
            let n = libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr());
            n > 0 && groups[..n as usize].contains(&gid)
        }
    }
    fn max_file_size(&self) -> Option<u64> {
        *self.max_size.get_or_init(|| self.probe_max_size())
    }
    fn max_links(&self) -> Option<u64> {
        // glibc's `_PC_LINK_MAX` is exact only for the file systems it
        // knows (ext2/3/4: 32 000 or 65 000, xfs, btrfs); for the others
        // (tmpfs among them) it guesses 127, which would refuse names the
        // backing takes. Those are left to the backing.
        // SAFETY: fstatfs into a zeroed struct on our own descriptor.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(self.root_fd(), &mut st) } != 0 {
            return None;
        }
        const KNOWN: [i64; 3] = [0xEF53 /* ext2/3/4 */, 0x5846_5342 /* xfs */, 0x9123_683E /* btrfs */];
        if !KNOWN.contains(&(st.f_type as i64)) {
            return None;
        }
        // SAFETY: fpathconf on our own descriptor.
        let n = unsafe { libc::fpathconf(self.root_fd(), libc::_PC_LINK_MAX) };
        (n > 0).then_some(n as u64)
    }

    fn lstat(&self, path: &Path) -> io::Result<Meta> {
        let at = self.at(path)?;
        Ok(meta_of(&fstatat(at.fd(), &at.name)?))
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        struct Dir(*mut libc::DIR);
        impl Drop for Dir {
            fn drop(&mut self) {
                // SAFETY: a DIR from fdopendir, closed once.
                unsafe { libc::closedir(self.0) };
            }
        }
        let fd = self.open_path(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?.into_raw_fd();
        // SAFETY: `fd` is an open directory we own; fdopendir takes it over.
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let dir = Dir(dir);
        let mut out = Vec::new();
        loop {
            // SAFETY: errno is thread-local; readdir on a live DIR.
            let ent = unsafe {
                *libc::__errno_location() = 0;
                libc::readdir(dir.0)
            };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                return if errno_of(&e) == 0 { Ok(out) } else { Err(e) };
            }
            // SAFETY: readdir returned a valid entry, alive until next call.
            let (name, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            let kind = match d_type {
                libc::DT_REG => FileKind::File,
                libc::DT_DIR => FileKind::Dir,
                libc::DT_LNK => FileKind::Symlink,
                libc::DT_FIFO => FileKind::Fifo,
                libc::DT_SOCK => FileKind::Socket,
                libc::DT_CHR => FileKind::CharDev,
                libc::DT_BLK => FileKind::BlockDev,
                // SAFETY: `dir.0` is a live DIR.
                libc::DT_UNKNOWN => kind_of(fstatat(unsafe { libc::dirfd(dir.0) }, name)?.st_mode),
                _ => FileKind::Other,
            };
            out.push((OsString::from_vec(name.to_bytes().to_vec()), kind));
        }
    }

    fn read_at(&self, path: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full(&*self.reader(path)?, off, buf)
    }

    /// `lseek(SEEK_END)` on the cached read descriptor (one call) instead
    /// of `lstat`'s openat2 walk, stat and close; and not a stat, which on
    /// ext4 with fine-grained timestamps makes the next write (the
    /// checkpoint's, into these very files) dirty the inode (see
    /// `RealFile::len`). `lstat` when the file cannot be opened for reading.
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let Ok(f) = self.reader(path) else { return self.lstat(path).map(|m| m.size) };
        // SAFETY: plain syscall on our own descriptor; reads use pread, so
        // the offset this moves is never used.
        let end = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(end as u64)
    }

    fn write_at(&self, path: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.open_regular(path, libc::O_WRONLY, 0)?.write_all_at(data, off)
    }

    fn set_len(&self, path: &Path, len: u64) -> io::Result<()> {
        ftruncate(&self.open_regular(path, libc::O_WRONLY, 0)?, len)
    }

    fn create_file(&self, path: &Path, mode: u32) -> io::Result<()> {
        let at = self.at(path)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid C string.
        let fd = unsafe { libc::openat(at.fd(), at.name.as_ptr(), flags, mode & 0o7777) };
        if fd >= 0 {
            // SAFETY: the kernel just gave us this fd.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: plain syscall on an owned fd. Exact mode, no umask.
            return cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) });
        }
        let e = io::Error::last_os_error();
        if errno_of(&e) != libc::EEXIST {
            return Err(e);
        }
        match kind_of(fstatat(at.fd(), &at.name)?.st_mode) {
            FileKind::File => Ok(()),
            _ => Err(e),
        }
    }

    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        let at = self.at(path)?;
        // SAFETY: valid C string.
        cvt(unsafe { libc::mkdirat(at.fd(), at.name.as_ptr(), mode & 0o7777) })?;
        self.chmod_at(&at, mode)
    }

    fn symlink(&self, target: &OsStr, path: &Path) -> io::Result<()> {
        let at = self.at(path)?;
        let target = cstring(target.as_bytes())?;
        // SAFETY: valid C strings.
        cvt(unsafe { libc::symlinkat(target.as_ptr(), at.fd(), at.name.as_ptr()) })
    }

    fn mknod(&self, path: &Path, kind: FileKind, mode: u32, rdev: u64) -> io::Result<()> {
        if !kind.is_special() {
            return Err(err(libc::EINVAL));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        let at = self.at(path)?;
        // SAFETY: valid C string.
        cvt(unsafe {
            libc::mknodat(at.fd(), at.name.as_ptr(), kind.mode_bits() | (mode & 0o7777), rdev as libc::dev_t)
        })?;
        // Exact mode, no umask (as `mkdir`).
        self.chmod_at(&at, mode)
    }

    fn readlink(&self, path: &Path) -> io::Result<OsString> {
        let at = self.at(path)?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: valid C string and buffer.
            let n = unsafe { libc::readlinkat(at.fd(), at.name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if (n as usize) < buf.len() {
                buf.truncate(n as usize);
                return Ok(OsString::from_vec(buf));
            }
            buf.resize(buf.len() * 2, 0);
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        // The cache is emptied with its lock held across the call: a reader
        // opened in between would keep the old file under the path.
        let mut readers = self.readers.lock();
        let (a, b) = (self.at(from)?, self.at(to)?);
        // SAFETY: valid C strings.
        let r = cvt(unsafe { libc::renameat(a.fd(), a.name.as_ptr(), b.fd(), b.name.as_ptr()) });
        readers.clear();
        r
    }

    fn link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        let (a, b) = (self.at(existing)?, self.at(new)?);
        // SAFETY: valid C strings; flags 0: a final symlink is not followed.
        cvt(unsafe { libc::linkat(a.fd(), a.name.as_ptr(), b.fd(), b.name.as_ptr(), 0) })
    }

    fn unlink(&self, path: &Path) -> io::Result<()> {
        let mut readers = self.readers.lock();
        let at = self.at(path)?;
        // SAFETY: valid C string.
        let r = cvt(unsafe { libc::unlinkat(at.fd(), at.name.as_ptr(), 0) });
        readers.clear();
        r
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        let mut readers = self.readers.lock();
        let at = self.at(path)?;
        // SAFETY: valid C string.
        let r = cvt(unsafe { libc::unlinkat(at.fd(), at.name.as_ptr(), libc::AT_REMOVEDIR) });
        readers.clear();
        r
    }

    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.chmod_at(&self.at(path)?, mode)
    }

    fn set_owner(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        let at = self.at(path)?;
        // SAFETY: valid C string.
        cvt(unsafe { libc::fchownat(at.fd(), at.name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
    }

    fn set_times(&self, path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
        // Out-of-range nanoseconds would alias UTIME_NOW / UTIME_OMIT.
        if atime.nanos >= 1_000_000_000 || mtime.nanos >= 1_000_000_000 {
            return Err(err(libc::EINVAL));
        }
        let at = self.at(path)?;
        let ts = |t: Timestamp| libc::timespec { tv_sec: t.secs as libc::time_t, tv_nsec: t.nanos as _ };
        let times = [ts(atime), ts(mtime)];
        // SAFETY: valid C string and two timespecs.
        cvt(unsafe { libc::utimensat(at.fd(), at.name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
    }

    fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        let at = self.at(path)?;
        let (p, name) = (Self::xattr_path(&at)?, cstring(name.as_bytes())?);
        // SAFETY: valid C strings; buffer pointer/size pairs from xattr_buf.
        match xattr_buf(|buf, size| unsafe { libc::lgetxattr(p.as_ptr(), name.as_ptr(), buf, size) }) {
            Ok(v) => Ok(Some(v)),
            Err(e) if matches!(errno_of(&e), libc::ENODATA | libc::ENOTSUP) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let at = self.at(path)?;
        let p = Self::xattr_path(&at)?;
        // SAFETY: valid C string; buffer pointer/size pairs from xattr_buf.
        match xattr_buf(|buf, size| unsafe { libc::llistxattr(p.as_ptr(), buf.cast(), size) }) {
            Ok(list) => {
                Ok(list.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| OsString::from_vec(n.to_vec())).collect())
            }
            Err(e) if errno_of(&e) == libc::ENOTSUP => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn set_xattr(&self, path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
        let at = self.at(path)?;
        let (p, name) = (Self::xattr_path(&at)?, cstring(name.as_bytes())?);
        // SAFETY: valid C strings and value buffer.
        cvt(unsafe { libc::lsetxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) })
    }

    fn remove_xattr(&self, path: &Path, name: &OsStr) -> io::Result<()> {
        let at = self.at(path)?;
        let (p, name) = (Self::xattr_path(&at)?, cstring(name.as_bytes())?);
        // SAFETY: valid C strings.
        match cvt(unsafe { libc::lremovexattr(p.as_ptr(), name.as_ptr()) }) {
            Err(e) if matches!(errno_of(&e), libc::ENODATA | libc::ENOTSUP) => Ok(()),
            r => r,
        }
    }

    fn fsync(&self, path: &Path) -> io::Result<()> {
        let fd = match self.lstat(path)?.kind {
            FileKind::File | FileKind::Dir => self.open_path(path, libc::O_RDONLY | libc::O_NONBLOCK, 0)?,
            _ => {
                let at = self.at(path)?;
                // SAFETY: valid C string; reopens the (O_PATH) parent for fsync.
                let fd = unsafe {
                    libc::openat(at.fd(), c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)
                };
                cvt(fd)?;
                // SAFETY: the kernel just gave us this fd.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
        };
        // SAFETY: plain syscall on an owned fd.
        cvt(unsafe { libc::fsync(fd.as_raw_fd()) })
    }

    fn sync_all(&self) -> io::Result<()> {
        // SAFETY: plain syscall on the root fd.
        cvt(unsafe { libc::syncfs(self.root_fd()) })
    }

    fn open_file(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        let flags = libc::O_RDWR | if create { libc::O_CREAT } else { 0 };
        Ok(Arc::new(RealFile(self.open_regular(path, flags, 0o600)?)))
    }
}

/// A regular file of the backing directory, opened by [`RealFs::open_file`].
struct RealFile(File);

impl StoredFile for RealFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full(&self.0, off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, off)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        ftruncate(&self.0, len)
    }
    /// The size by `lseek(SEEK_END)`, not `fstat`: on a file system with
    /// fine-grained timestamps (ext4 since 6.13), a stat that asks for
    /// mtime/ctime makes the next write stamp a fresh time and dirty the
    /// inode, and then every `fdatasync` of the journal also writes its inode
    /// block (a second synchronous I/O, ~90 µs here). Every access goes
    /// through `pread`/`pwrite`, so the offset this moves is never used.
    fn len(&self) -> io::Result<u64> {
        // SAFETY: plain syscall on our own descriptor.
        let end = unsafe { libc::lseek(self.0.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(end as u64)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn start_writeback(&self, off: u64, len: u64) {
        // SAFETY: plain syscall on our own descriptor; a failure only means
        // the later fdatasync does all the work, as before.
        unsafe {
            libc::sync_file_range(self.0.as_raw_fd(), off as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::mem::tests::dump;
    use crate::storage::MemFs;
    use std::collections::BTreeMap;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn errno<T>(r: io::Result<T>) -> i32 {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.raw_os_error().unwrap_or(0),
        }
    }

    fn setup() -> (tempfile::TempDir, RealFs) {
        let dir = tempfile::tempdir().unwrap();
        let fs = RealFs::open(dir.path()).unwrap();
        (dir, fs)
    }

    /// A tree deeper than `PATH_MAX` (30 levels of 255-byte names, which a
    /// user builds through the mount with relative `mkdirat`) is reached by
    /// every call, and a symlink deep in it is still never followed.
    #[test]
    fn trees_deeper_than_path_max_are_reached_in_steps() {
        let (dir, fs) = setup();
        let mut path = std::path::PathBuf::new();
        for i in 0..30 {
            path.push(format!("{i:02}{}", "d".repeat(253)));
            fs.mkdir(&path, 0o755).unwrap();
        }
        assert!(path.as_os_str().len() > 4096 + STEP_MAX);
        let f = path.join("f");
        fs.create_file(&f, 0o640).unwrap();
        fs.write_at(&f, 0, b"deep").unwrap();
        let mut b = [0u8; 8];
        assert_eq!(fs.read_at(&f, 0, &mut b).unwrap(), 4);
        assert_eq!(&b[..4], b"deep");
        assert_eq!(fs.lstat(&f).unwrap().mode & 0o7777, 0o640);
        fs.set_xattr(&f, OsStr::new("user.k"), b"v").unwrap();
        assert_eq!(fs.get_xattr(&f, OsStr::new("user.k")).unwrap(), Some(b"v".to_vec()));
        fs.rename(&f, &path.join("g")).unwrap();
        assert_eq!(fs.read_dir(&path).unwrap(), vec![(OsString::from("g"), FileKind::File)]);
        fs.fsync(&path.join("g")).unwrap();
        // a symlink in the middle of a long path: refused, not followed
        let linked = path.parent().unwrap().join("ln");
        fs.symlink(dir.path().as_os_str(), &linked).unwrap();
        assert_eq!(errno(fs.create_file(&linked.join("x".repeat(200)).join("y"), 0o644)), libc::ELOOP);
        assert_eq!(errno(fs.mkdir(&linked.join("y"), 0o755)), libc::ELOOP);
        fs.unlink(&linked).unwrap();
        fs.unlink(&path.join("g")).unwrap();
        fs.rmdir(&path).unwrap();
    }

    /// Reads and sizes come from cached descriptors: a file replaced under
    /// the path (renamed over, removed and created again) must be the one
    /// they see next, and a truncate through another descriptor too.
    #[test]
    fn cached_readers_follow_what_the_path_names() {
        let (_dir, fs) = setup();
        let read = |fs: &RealFs, path: &str| {
            let mut b = vec![0u8; 64];
            let n = fs.read_at(p(path), 0, &mut b).unwrap();
            b.truncate(n);
            (b, fs.file_len(p(path)).unwrap())
        };
        for (name, data) in [("f", &b"first"[..]), ("g", b"second file"), ("h", b"third")] {
            fs.create_file(p(name), 0o644).unwrap();
            fs.write_at(p(name), 0, data).unwrap();
        }
        assert_eq!(read(&fs, "f"), (b"first".to_vec(), 5));
        fs.rename(p("g"), p("f")).unwrap();
        assert_eq!(read(&fs, "f"), (b"second file".to_vec(), 11));
        fs.unlink(p("f")).unwrap();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.write_at(p("f"), 0, b"again").unwrap();
        assert_eq!(read(&fs, "f"), (b"again".to_vec(), 5));
        assert_eq!(read(&fs, "h"), (b"third".to_vec(), 5));
        fs.set_len(p("h"), 2).unwrap();
        assert_eq!(read(&fs, "h"), (b"th".to_vec(), 2));
    }

    /// `mknod` makes fifos and sockets (and, as root, devices) with exactly
    /// the mode asked for, never opens them, and they read back with their
    /// kind and number; contents are refused (EINVAL or ENXIO, at once: a
    /// fifo without a peer never blocks), xattrs and `fsync` work as for a
    /// symlink. `MemFs` keeps the same tree.
    #[test]
    fn special_files_are_made_with_mknod_and_never_opened() {
        let (dir, fs) = setup();
        let mem = MemFs::new();
        let root = unsafe { libc::geteuid() } == 0;
        let null = libc::makedev(1, 3) as u64;
        let mut made = vec![("p", FileKind::Fifo, 0o4640, 0), ("s", FileKind::Socket, 0o701, 0)];
        if root {
            made.push(("c", FileKind::CharDev, 0o666, null));
            made.push(("b", FileKind::BlockDev, 0o600, libc::makedev(7, 1) as u64));
        }
        for s in [&fs as &dyn Storage, &mem] {
            for (name, kind, mode, rdev) in &made {
                s.mknod(p(name), *kind, *mode, *rdev).unwrap();
                let m = s.lstat(p(name)).unwrap();
                assert_eq!((m.kind, m.mode, m.rdev, m.size), (*kind, *mode, *rdev, 0), "{name}");
            }
            assert_eq!(errno(s.mknod(p("p"), FileKind::Fifo, 0o600, 0)), libc::EEXIST);
            for k in [FileKind::File, FileKind::Dir, FileKind::Symlink, FileKind::Other] {
                assert_eq!(errno(s.mknod(p("x"), k, 0o600, 0)), libc::EINVAL, "{k:?}");
            }
            s.mknod(p("p0"), FileKind::Fifo, 0o600, 1234).unwrap();
            assert_eq!(s.lstat(p("p0")).unwrap().rdev, 0, "a fifo has no device number");
            assert_eq!(errno(s.read_at(p("p"), 0, &mut [0; 4])), libc::EINVAL);
            assert!(s.write_at(p("p"), 0, b"x").is_err());
            assert!(s.set_len(p("s"), 0).is_err());
            assert!(s.open_file(p("p"), false).is_err());
            s.fsync(p("p")).unwrap();
            s.set_owner(p("p"), 0, 0).ok();
            s.set_mode(p("p"), 0o640).unwrap();
            let t = Timestamp { secs: 1_000_000, nanos: 7 };
            s.set_times(p("s"), t, t).unwrap();
            assert_eq!(s.lstat(p("s")).unwrap().mtime, t);
            assert_eq!(errno(s.set_xattr(p("p"), OsStr::new("user.k"), b"v")), libc::EPERM);
            s.rename(p("p"), p("q")).unwrap();
            s.link(p("q"), p("q2")).unwrap();
            assert_eq!(s.lstat(p("q")).unwrap().nlink, 2);
            s.unlink(p("q2")).unwrap();
            s.unlink(p("p0")).unwrap();
        }
        let mut names = fs.read_dir(p("")).unwrap();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<_> = made.iter().map(|(n, k, ..)| (OsString::from(*n), *k)).collect();
        want.retain(|(n, _)| n != "p");
        want.push(("q".into(), FileKind::Fifo));
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(names, want);
        let strip = |fs: &dyn Storage| {
            dump(fs)
                .into_iter()
                .map(|(k, (m, b, _))| (k, (m.kind, m.mode, m.nlink, m.size, m.rdev, b)))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(strip(&fs), strip(&mem));
        let md = std::fs::symlink_metadata(dir.path().join("q")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&md.file_type()));
        // An xattr probe for a special file builds a fifo (no privilege
        // needed), and leaves nothing.
        let scratch = p("probe");
        assert_eq!(
            errno(fs.probe_xattrs(scratch, FileKind::Socket, &[("user.k".into(), b"v".to_vec(), true)])),
            libc::EPERM
        );
        assert_eq!(errno(fs.lstat(scratch)), libc::ENOENT);
    }

    #[test]
    fn basic_ops() {
        let (dir, fs) = setup();
        fs.mkdir(p("d"), 0o777).unwrap();
        fs.create_file(p("d/f"), 0o666).unwrap();
        fs.create_file(p("d/f"), 0o600).unwrap(); // idempotent, mode kept
        let m = fs.lstat(p("d/f")).unwrap();
        assert_eq!((m.kind, m.mode, m.size), (FileKind::File, 0o666, 0));
        assert_eq!(fs.lstat(p("d")).unwrap().mode, 0o777); // no umask
        fs.write_at(p("d/f"), 3, b"abc").unwrap();
        let mut buf = [9u8; 10];
        assert_eq!(fs.read_at(p("d/f"), 0, &mut buf).unwrap(), 6);
        assert_eq!(&buf[..6], b"\0\0\0abc");
        assert_eq!(fs.read_at(p("d/f"), 100, &mut buf).unwrap(), 0);
        fs.set_len(p("d/f"), 4).unwrap();
        assert_eq!(std::fs::read(dir.path().join("d/f")).unwrap(), b"\0\0\0a");
        fs.symlink(OsStr::new("f"), p("d/s")).unwrap();
        assert_eq!(fs.readlink(p("d/s")).unwrap(), "f");
        assert_eq!(fs.lstat(p("d/s")).unwrap().kind, FileKind::Symlink);
        fs.link(p("d/f"), p("g")).unwrap();
        assert_eq!(fs.lstat(p("g")).unwrap().nlink, 2);
        fs.rename(p("g"), p("d/h")).unwrap();
        let mut names = fs.read_dir(p("d")).unwrap();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [("f", FileKind::File), ("h", FileKind::File), ("s", FileKind::Symlink)];
        assert_eq!(names, want.map(|(n, k)| (OsString::from(n), k)));
        assert_eq!(fs.read_dir(p("")).unwrap(), vec![(OsString::from("d"), FileKind::Dir)]);
        fs.set_mode(p("d/s"), 0o600).unwrap(); // no-op on a symlink
        fs.set_mode(p("d/f"), 0o4640).unwrap();
        assert_eq!(fs.lstat(p("d/f")).unwrap().mode, 0o4640);
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        fs.set_owner(p("d/s"), uid, gid).unwrap();
        let t = Timestamp { secs: 1_234_567_890, nanos: 123_456_789 };
        fs.set_times(p("d/s"), t, t).unwrap();
        assert_eq!(fs.lstat(p("d/s")).unwrap().mtime, t);
        for path in ["d/f", "d", "d/s", ""] {
            fs.fsync(p(path)).unwrap();
        }
        fs.sync_all().unwrap();
        let h = fs.open_file(p("j"), true).unwrap();
        h.write_at(0, b"journal").unwrap();
        h.set_len(4).unwrap();
        h.sync_data().unwrap();
        assert_eq!(h.len().unwrap(), 4);
        let mut buf = [0u8; 8];
        assert_eq!(h.read_at(0, &mut buf).unwrap(), 4);
        assert_eq!(errno(fs.open_file(p("d"), false)), libc::EISDIR);
        assert_eq!(errno(fs.open_file(p("d/s"), false)), libc::ELOOP);
        fs.unlink(p("d/h")).unwrap();
        assert_eq!(errno(fs.rmdir(p("d"))), libc::ENOTEMPTY);
        for n in ["d/f", "d/s"] {
            fs.unlink(p(n)).unwrap();
        }
        fs.rmdir(p("d")).unwrap();
        assert_eq!(errno(fs.lstat(p("d"))), libc::ENOENT);
    }

    /// `len` (by `lseek`) follows writes past the end and truncation, and
    /// moving the descriptor's offset changes nothing for positioned I/O.
    #[test]
    fn stored_file_len_follows_writes_and_truncation() {
        let (_d, fs) = setup();
        let f = fs.open_file(p("j"), true).unwrap();
        assert_eq!(f.len().unwrap(), 0);
        f.write_at(100, b"xyz").unwrap();
        assert_eq!(f.len().unwrap(), 103);
        f.write_at(0, b"ab").unwrap();
        assert_eq!(f.len().unwrap(), 103);
        f.set_len(7).unwrap();
        assert_eq!(f.len().unwrap(), 7);
        let mut b = [9u8; 4];
        assert_eq!(f.read_at(0, &mut b).unwrap(), 4);
        assert_eq!(&b, b"ab\0\0");
    }

    #[test]
    fn cannot_escape_the_root() {
        let (_dir, fs) = setup();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, b"secret").unwrap();
        let perms = std::fs::metadata(&secret).unwrap().permissions();
        std::os::unix::fs::symlink("/etc", fs_path(&fs, "x")).unwrap();
        std::os::unix::fs::symlink(outside.path(), fs_path(&fs, "out")).unwrap();
        std::os::unix::fs::symlink(&secret, fs_path(&fs, "outf")).unwrap();
        let mut buf = [0u8; 16];
        let escaped = |e: i32| e == libc::ELOOP || e == libc::EXDEV;
        assert!(escaped(errno(fs.read_at(p("x/passwd"), 0, &mut buf))));
        assert!(escaped(errno(fs.lstat(p("x/passwd")))));
        assert!(escaped(errno(fs.read_dir(p("x")))) || errno(fs.read_dir(p("x"))) == libc::ENOTDIR);
        assert!(escaped(errno(fs.read_at(p("outf"), 0, &mut buf))));
        assert!(escaped(errno(fs.write_at(p("outf"), 0, b"pwned"))));
        assert!(escaped(errno(fs.set_len(p("outf"), 0))));
        assert!(escaped(errno(fs.open_file(p("outf"), true))));
        assert!(escaped(errno(fs.write_at(p("out/secret"), 0, b"pwned"))));
        assert!(escaped(errno(fs.create_file(p("out/new"), 0o644))));
        assert!(escaped(errno(fs.mkdir(p("out/new"), 0o755))));
        assert!(escaped(errno(fs.unlink(p("out/secret")))));
        assert!(escaped(errno(fs.rename(p("out/secret"), p("stolen")))));
        assert!(escaped(errno(fs.set_xattr(p("out/secret"), OsStr::new("user.k"), b"v"))));
        assert_eq!(errno(fs.create_file(p("outf"), 0o644)), libc::EEXIST);
        fs.set_mode(p("outf"), 0o777).unwrap(); // the link itself: a no-op
        fs.set_times(p("outf"), Timestamp::default(), Timestamp::default()).unwrap();
        for bad in ["..", "../x", "d/../x", "/etc/passwd", "./x", "a//b", "a/"] {
            assert_eq!(errno(fs.lstat(p(bad))), libc::EINVAL, "{bad}");
            assert_eq!(errno(fs.read_at(p(bad), 0, &mut buf)), libc::EINVAL, "{bad}");
        }
        assert_eq!(std::fs::read(&secret).unwrap(), b"secret");
        assert_eq!(std::fs::metadata(&secret).unwrap().permissions(), perms);
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    fn fs_path(fs: &RealFs, name: &str) -> std::path::PathBuf {
        Path::new(&format!("/proc/self/fd/{}", fs.root_fd())).join(name)
    }

    #[test]
    fn xattr_roundtrip() {
        let (_dir, fs) = setup();
        fs.create_file(p("f"), 0o644).unwrap();
        fs.symlink(OsStr::new("f"), p("s")).unwrap();
        let n = OsStr::new("user.txfs");
        match fs.set_xattr(p("f"), n, b"value") {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return, // no xattrs here
            r => r.unwrap(),
        }
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), Some(b"value".to_vec()));
        assert!(fs.list_xattrs(p("f")).unwrap().contains(&n.to_owned()));
        assert_eq!(fs.get_xattr(p("f"), OsStr::new("user.none")).unwrap(), None);
        fs.remove_xattr(p("f"), n).unwrap();
        fs.remove_xattr(p("f"), n).unwrap();
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), None);
        // user.* is refused on a symlink itself (never its target).
        assert_eq!(errno(fs.set_xattr(p("s"), n, b"v")), libc::EPERM);
        assert_eq!(fs.get_xattr(p("f"), n).unwrap(), None);
        fs.set_xattr(p(""), n, b"root").unwrap();
        assert_eq!(fs.get_xattr(p(""), n).unwrap(), Some(b"root".to_vec()));
    }

    /// Runs one script on a `MemFs` and a `RealFs`: same errnos, same tree.
    #[test]
    fn memfs_matches_realfs() {
        type Step = fn(&dyn Storage) -> io::Result<()>;
        let steps: Vec<Step> = vec![
            |fs| fs.mkdir(p("d"), 0o755),
            |fs| fs.mkdir(p("d/sub"), 0o700),
            |fs| fs.create_file(p("d/f"), 0o640),
            |fs| fs.create_file(p("d/f"), 0o600),
            |fs| fs.create_file(p("d"), 0o600),
            |fs| fs.mkdir(p("d"), 0o755),
            |fs| fs.mkdir(p("nope/x"), 0o755),
            |fs| fs.mkdir(p("d/f/x"), 0o755),
            |fs| fs.symlink(OsStr::new("d"), p("s")),
            |fs| fs.symlink(OsStr::new("x"), p("s")),
            |fs| fs.create_file(p("s"), 0o644),
            |fs| fs.create_file(p("s/x"), 0o644),
            |fs| fs.lstat(p("s/f")).map(drop),
            |fs| fs.read_dir(p("d/f")).map(drop),
            |fs| fs.read_dir(p("s")).map(drop),
            |fs| fs.readlink(p("d")).map(drop),
            |fs| fs.read_at(p("d"), 0, &mut [0; 4]).map(drop),
            |fs| fs.read_at(p("s"), 0, &mut [0; 4]).map(drop),
            |fs| fs.write_at(p("d/f"), 10, b"hello"),
            |fs| fs.set_len(p("d/f"), 12),
            |fs| fs.set_len(p("d"), 12),
            |fs| fs.write_at(p("nope"), 0, b"x"),
            |fs| fs.link(p("d/f"), p("d/g")),
            |fs| fs.link(p("d/f"), p("d/g")),
            |fs| fs.link(p("d"), p("e")),
            |fs| fs.link(p("s"), p("s2")),
            |fs| fs.rename(p("d/f"), p("d/g")),
            |fs| fs.rename(p("d"), p("d/sub/in")),
            |fs| fs.rename(p("d/sub"), p("d/f")),
            |fs| fs.rename(p("d/f"), p("d/sub")),
            |fs| fs.rename(p("nope"), p("x")),
            |fs| fs.mkdir(p("e"), 0o755),
            |fs| fs.create_file(p("e/x"), 0o644),
            |fs| fs.rename(p("d/sub"), p("e")),
            |fs| fs.unlink(p("e/x")),
            |fs| fs.rename(p("d/sub"), p("e")),
            |fs| fs.rename(p("d/g"), p("top")),
            |fs| fs.unlink(p("d")),
            |fs| fs.unlink(p("nope")),
            |fs| fs.rmdir(p("d/f")),
            |fs| fs.rmdir(p("d")),
            |fs| fs.rmdir(p("s")),
            |fs| fs.set_mode(p("d/f"), 0o6755),
            |fs| fs.set_owner(p("d/f"), u32::MAX, u32::MAX),
            |fs| fs.set_mode(p("e"), 0o3775),
            |fs| fs.set_owner(p("e"), u32::MAX, u32::MAX),
            |fs| fs.set_mode(p("s"), 0o600),
            |fs| fs.set_xattr(p("s"), OsStr::new("user.a"), b"v"),
            |fs| fs.set_xattr(p("d/f"), OsStr::new("bogus"), b"v"),
            |fs| fs.set_xattr(p("d/f"), OsStr::new("user."), b"v"),
            |fs| fs.remove_xattr(p("d/f"), OsStr::new("user.none")),
            |fs| fs.set_times(p("d/f"), Timestamp { secs: 5, nanos: 1_000_000_000 }, Timestamp::default()),
            |fs| fs.fsync(p("nope")),
            |fs| fs.open_file(p("d"), true).map(drop),
            |fs| fs.open_file(p("s"), false).map(drop),
            |fs| fs.open_file(p("nope"), false).map(drop),
            |fs| fs.open_file(p("j"), true).map(drop),
        ];
        let (_dir, real) = setup();
        let mem = MemFs::new();
        for (i, step) in steps.iter().enumerate() {
            let (r, m) = (step(&real), step(&mem));
            let code = |r: io::Result<()>| r.map_err(|e| e.raw_os_error());
            assert_eq!(code(r), code(m), "step {i}");
        }
        // Inode numbers, devices and times differ by nature; the rest must not.
        let strip = |fs: &dyn Storage| -> Vec<_> {
            let tree = dump(fs).into_iter().filter(|(path, _)| !path.is_empty());
            tree.map(|(path, (m, body, _))| {
                (path, m.kind, m.mode, m.nlink, (m.kind != FileKind::Dir).then_some(m.size), body)
            })
            .collect()
        };
        assert_eq!(strip(&real), strip(&mem));
    }
}
