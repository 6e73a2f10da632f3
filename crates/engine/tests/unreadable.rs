//! A daemon that is not root may be unable to open a backing file another
//! user made unreadable (mode 0 on the backing tree). A read then fails
//! with EACCES, as the backing file system says, except where nothing is
//! there to read: at or past the end, which a stat can tell.

mod common;

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::{MemFs, Storage};
use txfs_engine::{Engine, ObjId, Options, META_DIR};

/// Refuses to read user files, as open(2) does without read permission.
struct NoRead {
    inner: Arc<MemFs>,
}

impl Storage for NoRead {
    common::pass_through!(inner: lstat, read_dir, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file, write_at, set_len);
    fn read_at(&self, p: &Path, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        if p.starts_with(META_DIR) {
            return self.inner.read_at(p, off, buf);
        }
        Err(io::Error::from_raw_os_error(libc::EACCES))
    }
}

/// Story: reads stopped `lstat`ing the backing file for its size (a READ
/// without lstat) and read it to its end instead; a daemon that could not open
/// it then failed a read at the end (a reader's last `read` before EOF)
/// with EACCES, where it had read nothing. Fixed in 17049ed (lstat again
/// on EACCES/EPERM).
#[test]
fn an_unreadable_backing_file_reads_nothing_at_its_end() {
    let e = Engine::open(
        Arc::new(NoRead { inner: Arc::new(MemFs::new()) }),
        Options { flush_interval: None, ..Default::default() },
    )
    .unwrap();
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"0123456789").unwrap();
    // Before the checkpoint the bytes come from the journal.
    assert_eq!(e.read(None, f, 0, 10).unwrap(), b"0123456789");
    e.checkpoint().unwrap();
    // Now only the backing file holds them.
    assert_eq!(e.read(None, f, 10, 4096).unwrap(), b"", "at the end");
    assert_eq!(e.read(None, f, 50, 4096).unwrap(), b"", "past the end");
    let err = e.read(None, f, 0, 4096).unwrap_err();
    assert_eq!(err.errno(), libc::EACCES, "{err}");
    let err = e.read(None, f, 9, 4096).unwrap_err();
    assert_eq!(err.errno(), libc::EACCES, "one byte before the end: {err}");
    // Inside a transaction that has not changed the file: the same.
    let tx = e.begin();
    assert_eq!(e.read(Some(tx), f, 10, 4096).unwrap(), b"", "at the end, in a transaction");
    assert_eq!(e.read(Some(tx), f, 3, 4).unwrap_err().errno(), libc::EACCES);
    e.abort(tx).unwrap();
}
