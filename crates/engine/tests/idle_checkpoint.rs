//! A mount that stops committing is checkpointed by its background thread
//! (`Options::idle_checkpoint`), not only once the journal reaches
//! `checkpoint_bytes`: its files are then plain backing files again, which
//! reads serve without layers and without the engine lock (since 1f2c31a).

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use txfs_engine::storage::{MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options, IDLE_CHECKPOINT_MAX_NAMES};

const IDLE: Duration = Duration::from_millis(600);

fn open(idle: Option<Duration>) -> (Arc<MemFs>, Engine) {
    let fs = Arc::new(MemFs::new());
    let opts = Options {
        flush_interval: Some(Duration::from_millis(20)),
        idle_checkpoint: idle,
        checkpoint_bytes: u64::MAX,
        ..Default::default()
    };
    (fs.clone(), Engine::open(fs, opts).unwrap())
}

fn backing(fs: &MemFs, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = fs.read_at(Path::new(name), 0, &mut buf).unwrap_or(0);
    buf.truncate(n);
    buf
}

/// Story: a small commit stayed in the journal, and its file in the
/// committed layer, until the journal reached 256 MiB or the mount ended;
/// every read of that file went through the layers under the lock.
#[test]
fn a_quiet_engine_checkpoints_what_it_committed_once() {
    let (fs, e) = open(Some(IDLE));
    let before = e.stats().checkpoints;
    let tx = e.begin();
    let f = e.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(Some(tx), f, 0, b"committed").unwrap();
    let committed = Instant::now();
    e.commit(tx, Durability::Ordered).unwrap();
    let early = backing(&fs, "f");
    // (A machine that stalled this thread for the idle time proves nothing.)
    if committed.elapsed() < IDLE / 2 {
        assert_eq!(early, b"", "checkpointed at once, not when idle");
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    while e.stats().checkpoints == before {
        assert!(Instant::now() < deadline, "no checkpoint after 30 s idle: {:?}", e.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(backing(&fs, "f"), b"committed");
    assert_eq!(e.read(None, f, 0, 100).unwrap(), b"committed");

    // Nothing new: no more checkpoints however long it stays quiet.
    let after = e.stats().checkpoints;
    std::thread::sleep(IDLE * 3);
    assert_eq!(e.stats().checkpoints, after, "checkpointed again with nothing committed");
}

/// Commits closer together than the idle time never trigger it: a busy
/// mount keeps batching its checkpoints by size.
#[test]
fn a_busy_engine_is_not_checkpointed_for_idleness() {
    let (_fs, e) = open(Some(IDLE));
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    let before = e.stats().checkpoints;
    let start = Instant::now();
    let (mut last, mut widest) = (Instant::now(), Duration::ZERO);
    while start.elapsed() < IDLE * 3 {
        e.write(None, f, 0, b"again").unwrap();
        widest = widest.max(last.elapsed());
        last = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
    }
    // A machine that stalled this thread for half the idle time proves
    // nothing either way.
    if widest < IDLE / 2 {
        assert_eq!(e.stats().checkpoints, before, "checkpointed while commits kept coming");
    }
}

/// `None` keeps the old behaviour: by size only.
#[test]
fn without_an_idle_time_only_size_checkpoints() {
    let (fs, e) = open(None);
    let before = e.stats().checkpoints;
    e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap();
    std::thread::sleep(IDLE * 2);
    assert_eq!(e.stats().checkpoints, before);
    assert!(fs.lstat(Path::new("f")).is_err(), "the new name reached the backing tree");
}

/// Story: a burst of 20 000 new files, then 5 s of quiet: the idle
/// checkpoint created all those names under the engine lock, and a reader
/// on the mount waited 2.9 s for one READ (bench/adhoc/burst.sh). Many
/// names wait for the size threshold or the unmount, as before idle
/// checkpoints.
#[test]
fn many_new_names_are_not_checkpointed_for_idleness() {
    for (n, checkpointed) in [(IDLE_CHECKPOINT_MAX_NAMES + 1, false), (IDLE_CHECKPOINT_MAX_NAMES, true)] {
        let (fs, e) = open(Some(IDLE));
        let before = e.stats().checkpoints;
        let tx = e.begin();
        for i in 0..n {
            e.create(Some(tx), ObjId::ROOT, OsStr::new(&format!("f{i}")), 0o644, 0, 0).unwrap();
        }
        e.commit(tx, Durability::Ordered).unwrap();
        let deadline = Instant::now() + if checkpointed { Duration::from_secs(30) } else { IDLE * 3 };
        while e.stats().checkpoints == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(e.stats().checkpoints > before, checkpointed, "{n} new names: {:?}", e.stats());
        assert_eq!(fs.lstat(Path::new("f0")).is_ok(), checkpointed);
    }
}
