//! Failpoints for the crash campaign (`reliability/crash_campaign.py`): the
//! daemon kills itself with `SIGKILL` — exactly what `kill -9` does — right
//! before a chosen storage operation.
//!
//! Every byte the engine writes goes through the storage seam
//! ([`txfs_engine::storage::Storage`]), so "before the n-th mutating storage
//! operation" names every point of commit (journal append, group sync),
//! checkpoint (plan, phase marker, each move, place, content write and
//! delete, journal rotation) and recovery (the same steps, run at mount).
//!
//! ```text
//! TXFS_FAILPOINT=<class>:<n>   die before the n-th (1-based) mutating op
//!                              of <class>, counted from the daemon's start
//!   any        every mutating op: write, set_len, create, mkdir, symlink,
//!              mknod, rename, link, unlink, rmdir, chmod/chown/utimes, xattr
//!              changes, fsync, syncfs, creating open, handle write/sync
//!   journal    ops on .txfs/journal/ (commit: append, cut, group sync;
//!              checkpoint: rotation)
//!   sync       fsync, fdatasync and syncfs only
//!   ckpt       ops on the backing tree, .txfs/stage, .txfs/orphans and the
//!              checkpoint plan and markers (.txfs/ckpt-*)
//!   tree       ops on the backing tree outside .txfs/ only (a checkpoint's
//!              moves, creates and contents: of a file that existed and
//!              only changed contents, the first is a contents write)
//!   recovery   any op while the engine is still opening (recovery at mount)
//!
//! TXFS_FAILPOINT=<class>:<n>:eio   the n-th op of <class> counted from the
//!                              end of recovery fails with EIO instead (once;
//!                              the daemon goes on): an I/O error, not a death
//! ```
//!
//! Before dying the daemon prints one line to stderr (the daemon log,
//! `BACKING/.txfs/daemon.log`):
//! `txfs failpoint: SIGKILL before <op> <path> (<phase> op #<k>, <class> #<n>)`
//! so the campaign can say which step it killed.
//!
//! The campaign also sets `TXFS_CHECKPOINT_BYTES` (see `config.rs`) to
//! reach checkpoints often.
//!
//! Zero cost when unset: without `TXFS_FAILPOINT` the daemon uses the real
//! storage directly and this wrapper does not exist. Compiled only into
//! debug builds and builds with the `testing` feature: a release binary
//! has no failpoints (and refuses `TXFS_FAILPOINT`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use txfs_engine::storage::{FileKind, Meta, Storage, StoredFile, Timestamp};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Any,
    Journal,
    Sync,
    Ckpt,
    Tree,
    Recovery,
}

/// The storage the engine gets, and the failpoint if one is armed.
pub type Wrapped = (Arc<dyn Storage>, Option<Arc<Armed>>);

/// `storage` wrapped with the failpoint of `TXFS_FAILPOINT`, or unchanged.
pub fn wrap(storage: Arc<dyn Storage>) -> Result<Wrapped, String> {
    let Some(spec) = std::env::var_os("TXFS_FAILPOINT") else {
        return Ok((storage, None));
    };
    let spec = spec.to_string_lossy().into_owned();
    let (class, n) = spec.split_once(':').ok_or_else(|| format!("TXFS_FAILPOINT={spec}: want <class>:<n>"))?;
    let class = match class {
        "any" => Class::Any,
        "journal" => Class::Journal,
        "sync" => Class::Sync,
        "ckpt" => Class::Ckpt,
        "tree" => Class::Tree,
        "recovery" => Class::Recovery,
        c => return Err(format!("TXFS_FAILPOINT: unknown class {c:?} (any, journal, sync, ckpt, tree, recovery)")),
    };
    let (n, eio) = match n.split_once(':') {
        Some((n, "eio")) => (n, true),
        Some((_, m)) => return Err(format!("TXFS_FAILPOINT={spec}: unknown mode {m:?} (eio)")),
        None => (n, false),
    };
    let n: u64 = n.parse().map_err(|_| format!("TXFS_FAILPOINT={spec}: {n:?} is not a count"))?;
    let armed = Arc::new(Armed {
        class,
        n,
        eio,
        ops: AtomicU64::new(0),
        hits: AtomicU64::new(0),
        opening: AtomicBool::new(true),
    });
    Ok((Arc::new(FailFs { inner: storage, armed: armed.clone() }), Some(armed)))
}

/// The armed failpoint: what to count and when to die.
pub struct Armed {
    class: Class,
    n: u64,
    /// Fail the op with EIO instead of dying.
    eio: bool,
    ops: AtomicU64,
    hits: AtomicU64,
    opening: AtomicBool,
}

impl Armed {
    /// The engine is open: recovery is over.
    pub fn opened(&self) {
        self.opening.store(false, Ordering::SeqCst);
    }

    fn before(&self, op: &str, path: &Path, sync: bool) -> io::Result<()> {
        let k = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        let opening = self.opening.load(Ordering::SeqCst);
        let meta = path.starts_with(txfs_engine::META_DIR);
        let under = |d: &str| path.starts_with(Path::new(txfs_engine::META_DIR).join(d));
        let ckpt_file = meta
            && path.file_name().is_some_and(|f| f.to_string_lossy().starts_with("ckpt-"))
            && path.parent() == Some(Path::new(txfs_engine::META_DIR));
        let counts = match self.class {
            Class::Any => true,
            Class::Journal => under("journal"),
            Class::Sync => sync,
            Class::Ckpt => !meta || under("stage") || under("orphans") || ckpt_file || op == "syncfs",
            Class::Tree => !meta && op != "syncfs",
            Class::Recovery => opening,
        };
        if !counts || (self.eio && opening) {
            return Ok(());
        }
        let h = self.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if h == self.n && self.eio {
            let phase = if opening { "recovery" } else { "serving" };
            eprintln!("txfs failpoint: EIO for {op} {} ({phase} op #{k}, {:?} #{h})", path.display(), self.class);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if h == self.n {
            let phase = if opening { "recovery" } else { "serving" };
            eprintln!(
                "txfs failpoint: SIGKILL before {op} {} ({phase} op #{k}, {:?} #{h})",
                path.display(),
                self.class
            );
            // SAFETY: plain syscalls; SIGKILL cannot be caught, so nothing runs after.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            loop {
                std::thread::park();
            }
        }
        Ok(())
    }
}

struct FailFs {
    inner: Arc<dyn Storage>,
    armed: Arc<Armed>,
}

struct FailFile {
    inner: Arc<dyn StoredFile>,
    path: PathBuf,
    armed: Arc<Armed>,
}

impl StoredFile for FailFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.armed.before("write", &self.path, false)?;
        self.inner.write_at(off, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.armed.before("set_len", &self.path, false)?;
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn sync_data(&self) -> io::Result<()> {
        self.armed.before("fdatasync", &self.path, true)?;
        self.inner.sync_data()
    }
    fn start_writeback(&self, off: u64, len: u64) {
        self.inner.start_writeback(off, len)
    }
}

impl Storage for FailFs {
    fn privileged(&self) -> bool {
        self.inner.privileged()
    }
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        self.inner.free_bytes()
    }
    fn free_inodes(&self) -> io::Result<Option<u64>> {
        self.inner.free_inodes()
    }
    fn lstat(&self, path: &Path) -> io::Result<Meta> {
        self.inner.lstat(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<(OsString, FileKind)>> {
        self.inner.read_dir(path)
    }
    fn read_at(&self, path: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_at(path, off, buf)
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        self.inner.file_len(path)
    }
    fn write_at(&self, path: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.armed.before("write", path, false)?;
        self.inner.write_at(path, off, data)
    }
    fn set_len(&self, path: &Path, len: u64) -> io::Result<()> {
        self.armed.before("set_len", path, false)?;
        self.inner.set_len(path, len)
    }
    fn create_file(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.armed.before("create", path, false)?;
        self.inner.create_file(path, mode)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.armed.before("mkdir", path, false)?;
        self.inner.mkdir(path, mode)
    }
    fn symlink(&self, target: &OsStr, path: &Path) -> io::Result<()> {
        self.armed.before("symlink", path, false)?;
        self.inner.symlink(target, path)
    }
    fn mknod(&self, path: &Path, kind: FileKind, mode: u32, rdev: u64) -> io::Result<()> {
        self.armed.before("mknod", path, false)?;
        self.inner.mknod(path, kind, mode, rdev)
    }
    fn may_mknod(&self, kind: FileKind, rdev: u64) -> bool {
        self.inner.may_mknod(kind, rdev)
    }
    fn readlink(&self, path: &Path) -> io::Result<OsString> {
        self.inner.readlink(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.armed.before("rename", from, false)?;
        self.inner.rename(from, to)
    }
    fn link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.armed.before("link", new, false)?;
        self.inner.link(existing, new)
    }
    fn unlink(&self, path: &Path) -> io::Result<()> {
        self.armed.before("unlink", path, false)?;
        self.inner.unlink(path)
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        self.armed.before("rmdir", path, false)?;
        self.inner.rmdir(path)
    }
    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.armed.before("chmod", path, false)?;
        self.inner.set_mode(path, mode)
    }
    fn set_owner(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        self.armed.before("chown", path, false)?;
        self.inner.set_owner(path, uid, gid)
    }
    fn set_times(&self, path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
        self.armed.before("utimes", path, false)?;
        self.inner.set_times(path, atime, mtime)
    }
    fn get_xattr(&self, path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        self.inner.get_xattr(path, name)
    }
    fn list_xattrs(&self, path: &Path) -> io::Result<Vec<OsString>> {
        self.inner.list_xattrs(path)
    }
    fn set_xattr(&self, path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
        self.armed.before("setxattr", path, false)?;
        self.inner.set_xattr(path, name, value)
    }
    fn remove_xattr(&self, path: &Path, name: &OsStr) -> io::Result<()> {
        self.armed.before("removexattr", path, false)?;
        self.inner.remove_xattr(path, name)
    }
    fn fsync(&self, path: &Path) -> io::Result<()> {
        self.armed.before("fsync", path, true)?;
        self.inner.fsync(path)
    }
    fn sync_all(&self) -> io::Result<()> {
        self.armed.before("syncfs", Path::new(""), true)?;
        self.inner.sync_all()
    }
    fn open_file(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoredFile>> {
        if create {
            self.armed.before("open-create", path, false)?;
        }
        let inner = self.inner.open_file(path, create)?;
        Ok(Arc::new(FailFile { inner, path: path.to_path_buf(), armed: self.armed.clone() }))
    }
}
