//! A journal that a checkpoint recycled, with user data in its old bytes
//! (tests/recycled_journal_user_data.rs, and its timing in tests/timing.rs).

use std::ffi::OsStr;
use std::sync::Arc;
use txfs_engine::storage::{CrashFs, MemFs};
use txfs_engine::{Durability, Engine, ObjId, Options};

/// No background flushes, no checkpoint but the test's own.
pub fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

pub fn write(engine: &Engine, f: ObjId, off: u64, data: &[u8]) {
    let tx = engine.begin();
    engine.write(Some(tx), f, off, data).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
}

pub fn create(engine: &Engine, name: &str, data: &[u8]) -> ObjId {
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new(name), 0o644, 0, 0).expect("create").obj;
    engine.write(Some(tx), f, 0, data).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
    f
}

/// Three epochs with `payload` written into file f in the second and `big`
/// more bytes (file h) after it; a checkpoint then makes the second epoch's
/// file the live journal of the fourth.
pub fn recycled_with(payload: &[u8], big: usize) -> (Arc<CrashFs>, Engine) {
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let f = create(&engine, "f", b"nothing");
    let h = create(&engine, "h", b"h");
    engine.checkpoint().expect("checkpoint 1");
    write(&engine, f, 0, payload);
    if big > 0 {
        // More ordinary data after it (the journal grows on).
        for i in 0..big.div_ceil(4 << 20) {
            write(&engine, h, (i as u64) << 22, &vec![b'z'; 4 << 20]);
        }
    }
    engine.checkpoint().expect("checkpoint 2");
    write(&engine, h, 0, b"epoch 3");
    engine.checkpoint().expect("checkpoint 3");
    (fs, engine)
}
