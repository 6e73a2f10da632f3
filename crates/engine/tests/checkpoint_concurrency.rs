//! The checkpoint writes file contents (its phase 3, the long part) without
//! the engine lock (SPEC §5: checkpointing never blocks readers of
//! committed data). A storage wrapper holds the checkpoint at its first
//! content write; meanwhile readers must see the committed state, and
//! transactions and plain writes must commit, durably, into the next
//! journal. Power cuts taken at that moment must recover every durable
//! commit; the finished checkpoint must leave exactly the committed state.

mod common;

use common::{dump_engine, dump_storage, leftovers, Tree};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, META_DIR};

/// A storage that, once armed, stops the first write to a user file (only
/// the checkpoint writes user files) until released.
struct Gate {
    inner: Arc<CrashFs>,
    armed: AtomicBool,
    state: Mutex<(bool, bool)>, // (entered, released)
    cv: Condvar,
}

impl Gate {
    fn hold(&self, p: &Path) {
        if p.starts_with(META_DIR) || !self.armed.swap(false, Ordering::SeqCst) {
            return;
        }
        let mut g = self.state.lock().unwrap();
        g.0 = true;
        self.cv.notify_all();
        while !g.1 {
            g = self.cv.wait(g).unwrap();
        }
    }

    fn wait_entered(&self) -> bool {
        let g = self.state.lock().unwrap();
        let (g, _) = self.cv.wait_timeout_while(g, Duration::from_secs(60), |s| !s.0).unwrap();
        g.0
    }

    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Storage for Gate {
    common::pass_through!(inner: lstat, read_dir, read_at, file_len, create_file, mkdir, symlink, mknod, readlink, rename, link, unlink, rmdir, set_mode, set_owner, set_times, get_xattr, list_xattrs, set_xattr, remove_xattr, fsync, sync_all, open_file);
    fn write_at(&self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        self.hold(p);
        self.inner.write_at(p, off, data)
    }
    fn set_len(&self, p: &Path, len: u64) -> io::Result<()> {
        self.hold(p);
        self.inner.set_len(p, len)
    }
}

fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, stage_threshold: 32 << 10, ..Default::default() }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

/// Runs `f` on another thread; fails the test if it does not finish in
/// time (it would wait for the engine lock forever if the checkpoint held it).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} waited for the checkpoint"))
}

fn recovered(img: MemFs) -> Tree {
    let e = Engine::open(Arc::new(img), Options { flush_interval: None, ..Default::default() }).expect("recovery");
    dump_engine(&e, None)
}

/// Story: a checkpoint is writing an overwritten file, a renamed
/// directory's new file (staged: renamed into place) and changed modes.
/// While it writes, a reader sees the committed bytes and attributes, a
/// transaction creates a file and overwrites the one being written, a plain
/// write lands, and all of it commits durably without waiting. A power cut
/// at that moment recovers all of it; the checkpoint then finishes, and
/// after close the backing tree is exactly the committed state.
#[test]
fn commits_and_reads_go_on_while_the_checkpoint_writes_contents() {
    let crash = Arc::new(CrashFs::new(MemFs::new()));
    let gate = Arc::new(Gate {
        inner: crash.clone(),
        armed: AtomicBool::new(false),
        state: Mutex::new((false, false)),
        cv: Condvar::new(),
    });
    let e = Arc::new(Engine::open(gate.clone(), opts()).unwrap());
    // A base tree: d/a with 256 KiB.
    let old = pattern(256 << 10, 1);
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap().obj;
    let a = e.create(None, d, OsStr::new("a"), 0o644, 0, 0).unwrap().obj;
    e.write(None, a, 0, &old).unwrap();
    e.checkpoint().unwrap();
    // Committed since: a's middle overwritten, d renamed to e2, a new
    // staged file in it, a mode change.
    let tx = e.begin();
    e.write(Some(tx), a, 4096, &pattern(64 << 10, 9)).unwrap();
    e.rename(Some(tx), ObjId::ROOT, OsStr::new("d"), ObjId::ROOT, OsStr::new("e2"), Default::default()).unwrap();
    let n = e.create(Some(tx), d, OsStr::new("new"), 0o600, 0, 0).unwrap().obj;
    e.write(Some(tx), n, 0, &pattern(100 << 10, 5)).unwrap();
    e.setattr(Some(tx), a, &txfs_engine::SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    e.commit(tx, Durability::Durable).unwrap();
    let before = dump_engine(&e, None);

    gate.armed.store(true, Ordering::SeqCst);
    let ck = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    assert!(gate.wait_entered(), "the checkpoint never wrote a user file");

    // Phase 3 is stopped at its first content write, without the lock.
    let seen = within("a reader", {
        let e = e.clone();
        move || dump_engine(&e, None)
    });
    assert_eq!(seen, before, "a read during the checkpoint's phase 3 differs from the committed state");
    let after = within("a commit", {
        let e = e.clone();
        move || {
            let tx = e.begin();
            let c = e.create(Some(tx), d, OsStr::new("c"), 0o644, 0, 0).unwrap().obj;
            e.write(Some(tx), c, 0, b"committed during the checkpoint").unwrap();
            e.write(Some(tx), a, 100 << 10, b"newer").unwrap();
            e.commit(tx, Durability::Durable).unwrap();
            e.write(None, a, 200 << 10, b"plain").unwrap();
            e.sync().unwrap();
            dump_engine(&e, None)
        }
    });
    assert_ne!(after, before);
    // Power cuts now: every durable commit survives (the plan is finished
    // by recovery, the next journal replayed over it).
    for mut plan in [CrashPlan::drop_all(), CrashPlan::keep_all(), CrashPlan::random(7), CrashPlan::random(8)] {
        assert_eq!(recovered(crash.crash(&mut plan)), after, "power cut during phase 3");
    }

    gate.release();
    ck.join().unwrap().expect("checkpoint");
    assert_eq!(dump_engine(&e, None), after);
    // The next checkpoint (at close) writes what committed meanwhile.
    Arc::try_unwrap(e).ok().expect("engine still shared").close().unwrap();
    let fs: &dyn Storage = &*crash;
    assert_eq!(dump_storage(fs), after, "backing tree after close");
    assert!(leftovers(fs).is_empty(), "leftovers: {:?}", leftovers(fs));
}
