//! Fifos, unix sockets and devices (issue 24, item 2): made by
//! [`Engine::mknod`] inside transactions and out, named, renamed, linked
//! and removed like files, written into the backing directory by the
//! checkpoint with `mknod`, and replayed from the journal by recovery.
//! Special files already in the backing directory keep their kind and
//! device number. The model (`model.rs`) mixes `mkfifo` into its random
//! runs; `crash.rs` kills a checkpoint of every kind at every step
//! (`checkpoint_of_special_files_killed_at_every_step`).

mod common;

use common::{dump_engine, dump_storage, Node};
use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use txfs_engine::storage::{FileKind, MemFs, RealFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, RenameFlags, SetAttr};

fn opts() -> Options {
    Options { flush_interval: None, ..Default::default() }
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn dev(major: u32, minor: u32) -> u64 {
    libc::makedev(major, minor) as u64
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn errno<T: std::fmt::Debug>(r: txfs_engine::Result<T>) -> i32 {
    r.expect_err("an error").errno()
}

#[test]
fn special_files_made_in_a_transaction_are_invisible_until_commit() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let tx = e.begin();
    let fifo = e.mknod(Some(tx), ObjId::ROOT, os("fifo"), FileKind::Fifo, 0o640, 0, 7, 8).unwrap();
    let sock = e.mknod(Some(tx), ObjId::ROOT, os("sock"), FileKind::Socket, 0o755, 0, 0, 0).unwrap();
    let null = e.mknod(Some(tx), ObjId::ROOT, os("null"), FileKind::CharDev, 0o666, dev(1, 3), 0, 0).unwrap();
    let disk = e.mknod(Some(tx), ObjId::ROOT, os("disk"), FileKind::BlockDev, 0o660, dev(8, 1), 0, 6).unwrap();
    let got = |a: &txfs_engine::Attr| (a.kind, a.mode, a.rdev, a.size, a.nlink, a.uid, a.gid);
    assert_eq!(got(&fifo), (FileKind::Fifo, 0o640, 0, 0, 1, 7, 8));
    assert_eq!(got(&sock), (FileKind::Socket, 0o755, 0, 0, 1, 0, 0));
    assert_eq!(got(&null), (FileKind::CharDev, 0o666, dev(1, 3), 0, 1, 0, 0));
    assert_eq!(got(&disk), (FileKind::BlockDev, 0o660, dev(8, 1), 0, 1, 0, 6));
    // Inside: listed with their kinds, looked up with their numbers.
    let list: Vec<_> = e.readdir(Some(tx), ObjId::ROOT).unwrap().into_iter().map(|d| (d.name, d.kind)).collect();
    assert_eq!(
        list,
        [
            ("disk".into(), FileKind::BlockDev),
            ("fifo".into(), FileKind::Fifo),
            ("null".into(), FileKind::CharDev),
            ("sock".into(), FileKind::Socket)
        ]
    );
    assert_eq!(e.lookup(Some(tx), ObjId::ROOT, os("null")).unwrap().rdev, dev(1, 3));
    // Outside: nothing, not even to another transaction.
    let other = e.begin();
    for name in ["fifo", "sock", "null", "disk"] {
        assert_eq!(errno(e.lookup(None, ObjId::ROOT, os(name))), libc::ENOENT, "{name} outside");
        assert_eq!(errno(e.lookup(Some(other), ObjId::ROOT, os(name))), libc::ENOENT, "{name} in another tx");
    }
    assert!(e.readdir(None, ObjId::ROOT).unwrap().is_empty());
    e.abort(other).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    let a = e.lookup(None, ObjId::ROOT, os("disk")).unwrap();
    assert_eq!(got(&a), (FileKind::BlockDev, 0o660, dev(8, 1), 0, 1, 0, 6));
    e.checkpoint().unwrap();
    let a = e.lookup(None, ObjId::ROOT, os("null")).unwrap();
    assert_eq!(got(&a), (FileKind::CharDev, 0o666, dev(1, 3), 0, 1, 0, 0), "after the checkpoint");
    assert_eq!(a.obj, null.obj, "the same object before and after the checkpoint");
    e.close().unwrap();
    let m = fs.lstat(Path::new("null")).unwrap();
    assert_eq!((m.kind, m.mode, m.rdev), (FileKind::CharDev, 0o666, dev(1, 3)));
}

#[test]
fn an_aborted_transaction_leaves_no_special_file() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
    let tx = e.begin();
    e.mknod(Some(tx), d, os("fifo"), FileKind::Fifo, 0o600, 0, 0, 0).unwrap();
    e.mknod(Some(tx), d, os("sock"), FileKind::Socket, 0o600, 0, 0, 0).unwrap();
    e.mknod(Some(tx), d, os("null"), FileKind::CharDev, 0o600, dev(1, 3), 0, 0).unwrap();
    assert_eq!(e.readdir(Some(tx), d).unwrap().len(), 3);
    e.abort(tx).unwrap();
    assert!(e.readdir(None, d).unwrap().is_empty());
    e.checkpoint().unwrap();
    e.close().unwrap();
    assert_eq!(dump_storage(&*fs).into_keys().collect::<Vec<_>>(), [Path::new("d")]);
}

/// On a real backing directory: after commit and checkpoint, a real fifo,
/// socket and (as root) character and block device, with the mode, owner
/// and device number given, linked and renamed as the commits said.
#[test]
fn commit_and_checkpoint_make_real_special_files_in_the_backing() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(RealFs::open(dir.path()).unwrap());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let owner = if root() { (1000, 1000) } else { (unsafe { libc::geteuid() }, unsafe { libc::getegid() }) };
    let tx = e.begin();
    let fifo = e.mknod(Some(tx), ObjId::ROOT, os("fifo"), FileKind::Fifo, 0o640, 0, owner.0, owner.1).unwrap();
    e.mknod(Some(tx), ObjId::ROOT, os("sock"), FileKind::Socket, 0o700, 0, owner.0, owner.1).unwrap();
    if root() {
        e.mknod(Some(tx), ObjId::ROOT, os("null"), FileKind::CharDev, 0o666, dev(1, 3), 0, 0).unwrap();
        e.mknod(Some(tx), ObjId::ROOT, os("loop"), FileKind::BlockDev, 0o660, dev(7, 200), 0, 6).unwrap();
    }
    e.commit(tx, Durability::Durable).unwrap();
    e.link(None, fifo.obj, ObjId::ROOT, os("fifo2")).unwrap();
    e.rename(None, ObjId::ROOT, os("sock"), ObjId::ROOT, os("sock2"), RenameFlags::default()).unwrap();
    // Nothing reaches the backing before the checkpoint (J1).
    assert!(std::fs::symlink_metadata(dir.path().join("fifo")).is_err());
    e.close().unwrap();
    let md = |n: &str| std::fs::symlink_metadata(dir.path().join(n)).unwrap();
    let (f, f2, s) = (md("fifo"), md("fifo2"), md("sock2"));
    assert!(f.file_type().is_fifo(), "{f:?}");
    assert_eq!((f.mode() & 0o7777, f.uid(), f.gid(), f.nlink(), f.rdev()), (0o640, owner.0, owner.1, 2, 0));
    assert_eq!(f2.ino(), f.ino(), "fifo2 is a hard link of fifo");
    assert!(s.file_type().is_socket(), "{s:?}");
    assert_eq!((s.mode() & 0o7777, s.uid()), (0o700, owner.0));
    assert!(std::fs::symlink_metadata(dir.path().join("sock")).is_err());
    if root() {
        let (n, l) = (md("null"), md("loop"));
        assert!(n.file_type().is_char_device(), "{n:?}");
        assert_eq!((n.mode() & 0o7777, n.rdev()), (0o666, dev(1, 3)));
        assert!(l.file_type().is_block_device(), "{l:?}");
        assert_eq!((l.mode() & 0o7777, l.gid(), l.rdev()), (0o660, 6, dev(7, 200)));
    }
    // Reopened, the engine sees the same.
    let e = Engine::open(fs, opts()).unwrap();
    let a = e.lookup(None, ObjId::ROOT, os("fifo")).unwrap();
    assert_eq!((a.kind, a.mode, a.nlink), (FileKind::Fifo, 0o640, 2));
    if root() {
        assert_eq!(e.lookup(None, ObjId::ROOT, os("null")).unwrap().rdev, dev(1, 3));
    }
}

/// Committed, not checkpointed, then a crash (the engine dropped): the
/// backing has no fifo yet, and recovery makes it from the journal.
#[test]
fn recovery_replays_special_files_into_a_real_backing() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(RealFs::open(dir.path()).unwrap());
    {
        let e = Engine::open(fs.clone(), opts()).unwrap();
        let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
        e.checkpoint().unwrap();
        let tx = e.begin();
        e.mknod(Some(tx), d, os("fifo"), FileKind::Fifo, 0o604, 0, 0, 0).unwrap();
        e.mknod(Some(tx), d, os("sock"), FileKind::Socket, 0o600, 0, 0, 0).unwrap();
        if root() {
            e.mknod(Some(tx), d, os("zero"), FileKind::CharDev, 0o644, dev(1, 5), 0, 0).unwrap();
        }
        e.commit(tx, Durability::Durable).unwrap();
        drop(e); // a crash: no checkpoint
    }
    assert!(std::fs::read_dir(dir.path().join("d")).unwrap().next().is_none(), "nothing placed before recovery");
    let e = Engine::open(fs.clone(), opts()).expect("recovery");
    let md = |n: &str| std::fs::symlink_metadata(dir.path().join(n)).unwrap();
    assert!(md("d/fifo").file_type().is_fifo());
    assert_eq!(md("d/fifo").mode() & 0o7777, 0o604);
    assert!(md("d/sock").file_type().is_socket());
    if root() {
        assert!(md("d/zero").file_type().is_char_device());
        assert_eq!(md("d/zero").rdev(), dev(1, 5));
        assert_eq!(
            dump_engine(&e, None).get(Path::new("d/zero")),
            Some(&Node::Special { kind: FileKind::CharDev, mode: 0o644, rdev: dev(1, 5) })
        );
    }
    e.close().unwrap();
}

/// What Linux answers: `mknod` of a directory is EPERM, of a symlink (or
/// an unknown type) EINVAL, over a name EEXIST; a special file has no
/// contents (read, write, truncate: EINVAL), no link target (EINVAL) and
/// no `user.*` xattrs (set or remove: EPERM; get: absent); chown drops
/// its setuid bit. `mknod` of a regular file is `create`.
#[test]
fn mknod_and_special_files_answer_as_linux() {
    let fs = Arc::new(MemFs::new());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let r = ObjId::ROOT;
    assert_eq!(errno(e.mknod(None, r, os("d"), FileKind::Dir, 0o755, 0, 0, 0)), libc::EPERM);
    assert_eq!(errno(e.mknod(None, r, os("l"), FileKind::Symlink, 0o777, 0, 0, 0)), libc::EINVAL);
    assert_eq!(errno(e.mknod(None, r, os("o"), FileKind::Other, 0o644, 0, 0, 0)), libc::EINVAL);
    let f = e.mknod(None, r, os("file"), FileKind::File, 0o644, 0, 0, 0).unwrap();
    assert_eq!((f.kind, f.mode), (FileKind::File, 0o644));
    e.write(None, f.obj, 0, b"plain").unwrap();
    let p = e.mknod(None, r, os("p"), FileKind::Fifo, 0o4755, 99, 0, 0).unwrap();
    assert_eq!((p.mode, p.rdev), (0o4755, 0), "a fifo keeps no device number");
    for name in ["p", "file"] {
        assert_eq!(errno(e.mknod(None, r, os(name), FileKind::Fifo, 0o644, 0, 0, 0)), libc::EEXIST);
    }
    assert_eq!(errno(e.read(None, p.obj, 0, 10)), libc::EINVAL);
    assert_eq!(errno(e.write(None, p.obj, 0, b"x")), libc::EINVAL);
    assert_eq!(errno(e.truncate(None, p.obj, 0)), libc::EINVAL);
    assert_eq!(errno(e.readlink(None, p.obj)), libc::EINVAL);
    assert_eq!(errno(e.setxattr(None, p.obj, os("user.x"), Some(b"v"), false, false)), libc::EPERM);
    assert_eq!(errno(e.setxattr(None, p.obj, os("user.x"), None, false, false)), libc::EPERM);
    assert_eq!(e.getxattr(None, p.obj, os("user.x")).unwrap(), None);
    e.setxattr(None, p.obj, os("trusted.t"), Some(b"v"), false, false).expect("trusted.* on a fifo");
    let a = e.setattr(None, p.obj, &SetAttr { uid: Some(5), ..Default::default() }).unwrap();
    assert_eq!((a.uid, a.mode), (5, 0o755), "chown drops setuid");
    assert_eq!(errno(e.lookup(None, p.obj, os("x"))), libc::ENOTDIR);
    e.close().unwrap();
    let m = fs.lstat(Path::new("p")).unwrap();
    assert_eq!((m.kind, m.mode, m.uid), (FileKind::Fifo, 0o755, 5));
    assert_eq!(fs.get_xattr(Path::new("p"), os("trusted.t")).unwrap(), Some(b"v".to_vec()));
}

/// A MemFs seen by a daemon without `CAP_MKNOD`: devices (but the 0:0
/// whiteout) cannot be made.
struct NoMknod {
    inner: MemFs,
}

impl Storage for NoMknod {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, write_at, set_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn may_mknod(&self, kind: FileKind, rdev: u64) -> bool {
        !kind.is_device() || (kind == FileKind::CharDev && rdev == 0)
    }
}

/// A device the checkpoint could not make is refused at the call (EPERM),
/// in a transaction and out, so that no checkpoint meets it; fifos,
/// sockets and the whiteout device still commit and checkpoint.
#[test]
fn devices_the_backing_cannot_make_are_refused_at_the_call() {
    let fs = Arc::new(NoMknod { inner: MemFs::new() });
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let r = ObjId::ROOT;
    let tx = e.begin();
    assert_eq!(errno(e.mknod(Some(tx), r, os("null"), FileKind::CharDev, 0o666, dev(1, 3), 0, 0)), libc::EPERM);
    assert_eq!(errno(e.mknod(None, r, os("sda"), FileKind::BlockDev, 0o660, dev(8, 0), 0, 0)), libc::EPERM);
    assert_eq!(errno(e.mknod(None, r, os("b0"), FileKind::BlockDev, 0o660, 0, 0, 0)), libc::EPERM);
    e.mknod(Some(tx), r, os("fifo"), FileKind::Fifo, 0o600, 0, 0, 0).unwrap();
    e.mknod(Some(tx), r, os("sock"), FileKind::Socket, 0o600, 0, 0, 0).unwrap();
    e.mknod(Some(tx), r, os("whiteout"), FileKind::CharDev, 0o600, 0, 0, 0).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    e.close().unwrap();
    let kinds: Vec<_> = dump_storage(&fs.inner)
        .into_iter()
        .map(|(p, n)| match n {
            Node::Special { kind, .. } => (p.display().to_string(), kind),
            n => panic!("{}: {n:?}", p.display()),
        })
        .collect();
    assert_eq!(
        kinds,
        [("fifo".into(), FileKind::Fifo), ("sock".into(), FileKind::Socket), ("whiteout".into(), FileKind::CharDev)]
    );
}

/// Fifos, sockets and devices already in the backing directory are listed
/// and stat-ed with their own kind and number, and are renamed, linked and
/// removed as themselves (the same inode, not a copy).
#[test]
fn special_files_already_in_the_backing_keep_their_kind_and_number() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path();
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::mkfifo(c(&b.join("fifo")).as_ptr(), 0o620) }, 0);
    let _listener = std::os::unix::net::UnixListener::bind(b.join("sock")).unwrap();
    if root() {
        // SAFETY: a valid C string.
        let made = unsafe { libc::mknod(c(&b.join("tty")).as_ptr(), libc::S_IFCHR | 0o620, libc::makedev(4, 7)) };
        assert_eq!(made, 0);
    }
    let fifo_ino = std::fs::symlink_metadata(b.join("fifo")).unwrap().ino();
    let fs = Arc::new(RealFs::open(b).unwrap());
    let e = Engine::open(fs.clone(), opts()).unwrap();
    let list: Vec<_> = e.readdir(None, ObjId::ROOT).unwrap().into_iter().map(|d| (d.name, d.kind)).collect();
    let mut want = vec![("fifo".into(), FileKind::Fifo), ("sock".into(), FileKind::Socket)];
    if root() {
        want.push(("tty".into(), FileKind::CharDev));
    }
    assert_eq!(list, want);
    let f = e.lookup(None, ObjId::ROOT, os("fifo")).unwrap();
    assert_eq!((f.kind, f.mode, f.rdev), (FileKind::Fifo, 0o620 & !umask(), 0));
    if root() {
        let t = e.lookup(None, ObjId::ROOT, os("tty")).unwrap();
        assert_eq!((t.kind, t.rdev), (FileKind::CharDev, dev(4, 7)));
        e.unlink(None, ObjId::ROOT, os("tty")).unwrap();
    }
    let tx = e.begin();
    e.rename(Some(tx), ObjId::ROOT, os("fifo"), ObjId::ROOT, os("renamed"), RenameFlags::default()).unwrap();
    e.link(Some(tx), f.obj, ObjId::ROOT, os("linked")).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    e.unlink(None, ObjId::ROOT, os("sock")).unwrap();
    e.close().unwrap();
    let md = |n: &str| std::fs::symlink_metadata(b.join(n));
    assert!(md("fifo").is_err() && md("sock").is_err() && md("tty").is_err());
    for n in ["renamed", "linked"] {
        let m = md(n).unwrap();
        assert!(m.file_type().is_fifo(), "{n}");
        assert_eq!((m.ino(), m.nlink()), (fifo_ino, 2), "{n} is the fifo that was there");
    }
}

fn umask() -> u32 {
    // SAFETY: umask has no preconditions; set back at once.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    }
}
