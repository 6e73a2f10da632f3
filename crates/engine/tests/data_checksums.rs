//! Data-file checksums (journal.md, "Data files"; issue 28): a record names
//! each data-file range with its crc32c; recovery and `txfs check` verify
//! them, so one flipped byte in `.txfs/data/` is refused — check names the
//! file, recovery changes nothing — and never reaches the user's file.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, Error, ObjId, Options, META_DIR};

fn opts() -> Options {
    Options {
        flush_interval: None,
        idle_checkpoint: None,
        checkpoint_bytes: u64::MAX,
        stage_threshold: 64 << 10,
        ..Default::default()
    }
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}

fn data_files(s: &dyn Storage) -> Vec<PathBuf> {
    let d = Path::new(META_DIR).join("data");
    s.read_dir(&d).unwrap().into_iter().map(|(n, _)| d.join(n)).collect()
}

/// Flips one byte at `at` of the only data file; the image is refused by
/// check (naming the file) and recovery. Returns the image.
fn flipped_is_refused(img: MemFs, at: u64, ctx: &str) -> MemFs {
    let files = data_files(&img);
    assert_eq!(files.len(), 1, "{ctx}: {files:?}");
    let mut b = [0u8; 1];
    img.read_at(&files[0], at, &mut b).unwrap();
    img.write_at(&files[0], at, &[b[0] ^ 0x20]).unwrap();
    let rep = txfs_engine::check(&img).expect("check");
    let name = files[0].display().to_string();
    assert!(rep.problems.iter().any(|p| p.contains(&name)), "{ctx}: check does not name {name}: {:?}", rep.problems);
    let img = Arc::new(img);
    match Engine::open(img.clone(), opts()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(path, files[0], "{ctx}"),
        Err(e) => panic!("{ctx}: refused otherwise: {e}"),
        Ok(_) => panic!("{ctx}: a damaged data file was recovered"),
    }
    assert_eq!(data_files(&*img), files, "{ctx}: the refused recovery moved the data file");
    Arc::try_unwrap(img).unwrap_or_else(|_| panic!("engine holds the fs"))
}

#[test]
fn a_flipped_byte_in_a_staged_file_is_refused_and_never_placed() {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let big = pattern(300 << 10, 0);
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("big"), 0o644, 0, 0).unwrap().obj;
    engine.write(Some(tx), f, 0, &big).unwrap();
    engine.commit(tx, Durability::Durable).unwrap();
    drop(engine);
    // Undamaged, it recovers.
    let img = Arc::new(fs.crash(&mut CrashPlan::keep_all()));
    assert!(txfs_engine::check(&*img).unwrap().problems.is_empty());
    let e = Engine::open(img, opts()).expect("recover");
    let got = e.read(None, e.lookup(None, ObjId::ROOT, OsStr::new("big")).unwrap().obj, 0, big.len()).unwrap();
    assert!(got == big);
    let img = flipped_is_refused(fs.crash(&mut CrashPlan::keep_all()), 200_000, "staged");
    assert!(img.lstat(Path::new("big")).is_err(), "the damaged file was placed in the tree");
}

#[test]
fn a_flipped_byte_in_a_shadow_is_refused_and_the_old_file_stays() {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let old = pattern(2 << 20, 0);
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    engine.write(Some(tx), f, 0, &old).unwrap();
    engine.commit(tx, Durability::Durable).unwrap();
    engine.close().unwrap();
    let engine = Engine::open(fs.clone(), opts()).expect("reopen");
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).unwrap().obj;
    let tx = engine.begin();
    let new = pattern(2 << 20, 0x55);
    for (i, c) in new.chunks(128 << 10).enumerate() {
        engine.write(Some(tx), f, (i << 17) as u64, c).unwrap();
    }
    engine.commit(tx, Durability::Durable).unwrap();
    drop(engine);
    let img = flipped_is_refused(fs.crash(&mut CrashPlan::keep_all()), 1_000_000, "shadow");
    let mut got = vec![0u8; old.len()];
    img.read_at(Path::new("f"), 0, &mut got).unwrap();
    assert!(got == old, "the user's file changed");
}
