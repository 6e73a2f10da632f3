//! A checkpoint's part under the engine lock must not wait for the whole
//! backing file system to reach the disk: `syncfs` also waits for every
//! page other programs dirtied there, and a reader on the mount stalled
//! ~0.8 s behind it. Phase 1's moves are made durable by syncing the
//! directories they changed (since c1baefd; `syncfs` stays the fallback).

mod common;

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use txfs_engine::storage::{MemFs, Storage};
use txfs_engine::{Engine, ObjId, Options, RenameFlags};

/// Parks the first `syncfs` once armed, until released; counts them all.
struct HoldSync {
    inner: Arc<MemFs>,
    armed: AtomicBool,
    syncs: AtomicU64,
    state: Mutex<(bool, bool)>, // (entered, released)
    cv: Condvar,
}

impl Storage for HoldSync {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, open_file, write_at, set_len);
    fn sync_all(&self) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.armed.swap(false, Ordering::SeqCst) {
            let mut g = self.state.lock().unwrap();
            g.0 = true;
            self.cv.notify_all();
            while !g.1 {
                g = self.cv.wait(g).unwrap();
            }
        }
        self.inner.sync_all()
    }
}

fn setup() -> (Arc<HoldSync>, Arc<Engine>, ObjId) {
    let fs = Arc::new(HoldSync {
        inner: Arc::new(MemFs::new()),
        armed: AtomicBool::new(false),
        syncs: AtomicU64::new(0),
        state: Mutex::new((false, false)),
        cv: Condvar::new(),
    });
    let opts = Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() };
    let e = Arc::new(Engine::open(fs.clone(), opts).unwrap());
    let other = e.create(None, ObjId::ROOT, OsStr::new("other"), 0o644, 0, 0).unwrap().obj;
    e.write(None, other, 0, b"still readable").unwrap();
    (fs, e, other)
}

/// Runs a checkpoint with the first `syncfs` parked and reads `other`
/// meanwhile; `true` if the read finished while the `syncfs` waited.
fn read_during_first_syncfs(fs: &Arc<HoldSync>, e: &Arc<Engine>, other: ObjId) -> bool {
    fs.armed.store(true, Ordering::SeqCst);
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    {
        let g = fs.state.lock().unwrap();
        let (g, _) = fs.cv.wait_timeout_while(g, Duration::from_secs(60), |s| !s.0).unwrap();
        assert!(g.0, "the checkpoint never synced the file system");
    }
    let (done, rx) = mpsc::channel();
    {
        let e = e.clone();
        std::thread::spawn(move || {
            let _ = done.send(e.read(None, other, 0, 100).unwrap());
        });
    }
    // A read that waits for the parked syncfs waits until it is released
    // below: the bound tells that apart from a slow machine.
    let got = rx.recv_timeout(Duration::from_secs(60));
    fs.state.lock().unwrap().1 = true;
    fs.cv.notify_all();
    ckpt.join().unwrap().unwrap();
    if let Ok(bytes) = &got {
        assert_eq!(bytes, b"still readable");
    }
    got.is_ok()
}

/// Story: every checkpoint that moved a name (a rename, an unlink) ran a
/// `syncfs` under the engine lock, so a read of an unrelated file waited
/// for every dirty page of the backing file system.
#[test]
fn a_checkpoint_moving_names_syncs_no_file_system_under_the_lock() {
    let (fs, e, other) = setup();
    e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap();
    let d = e.lookup(None, ObjId::ROOT, OsStr::new("d")).unwrap().obj;
    for i in 0..20 {
        let f = e.create(None, d, OsStr::new(&format!("f{i}")), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, b"x").unwrap();
    }
    e.checkpoint().unwrap();
    for i in 0..20 {
        let (from, to) = (format!("f{i}"), format!("g{i}"));
        e.rename(None, d, OsStr::new(&from), d, OsStr::new(&to), RenameFlags::default()).unwrap();
    }
    e.unlink(None, d, OsStr::new("g0")).unwrap();
    assert!(read_during_first_syncfs(&fs, &e, other), "a read waited for the checkpoint's syncfs");
    for i in 1..20 {
        let g = e.lookup(None, d, OsStr::new(&format!("g{i}"))).unwrap().obj;
        assert_eq!(e.read(None, g, 0, 10).unwrap(), b"x");
        assert!(fs.inner.lstat(Path::new(&format!("d/g{i}"))).is_ok(), "g{i} not in the backing tree");
    }
    assert!(fs.inner.lstat(Path::new("d/f1")).is_err() && fs.inner.lstat(Path::new("d/g0")).is_err());
}

/// A directory moved out together with a name inside it cannot be synced
/// where the plan knew it: the checkpoint falls back to `syncfs` (still
/// correct, just under the lock again) rather than fail.
#[test]
fn moves_inside_a_moved_directory_fall_back_to_syncfs() {
    let (fs, e, _other) = setup();
    e.mkdir(None, ObjId::ROOT, OsStr::new("a"), 0o755, 0, 0).unwrap();
    let a = e.lookup(None, ObjId::ROOT, OsStr::new("a")).unwrap().obj;
    e.create(None, a, OsStr::new("f"), 0o644, 0, 0).unwrap();
    e.checkpoint().unwrap();
    let tx = e.begin();
    e.rename(Some(tx), a, OsStr::new("f"), a, OsStr::new("g"), RenameFlags::default()).unwrap();
    e.rename(Some(tx), ObjId::ROOT, OsStr::new("a"), ObjId::ROOT, OsStr::new("b"), RenameFlags::default()).unwrap();
    e.commit(tx, txfs_engine::Durability::Durable).unwrap();
    let before = fs.syncs.load(Ordering::SeqCst);
    e.checkpoint().unwrap();
    // Phase 1's fallback, then phase 4's own.
    assert_eq!(
        fs.syncs.load(Ordering::SeqCst) - before,
        2,
        "phase 1 synced neither its directories nor the file system"
    );
    assert!(fs.inner.lstat(Path::new("b/g")).is_ok(), "b/g not in the backing tree");
    assert!(fs.inner.lstat(Path::new("a")).is_err());
}
