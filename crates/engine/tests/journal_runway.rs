//! Review regressions (review5): the journal's zeroed runway.
//!
//! A record header of zeros is taken as the clean end of the journal
//! (journal.rs, "Zeroed runway"), and recovery then keeps the bytes after
//! it (it cuts the file only when a cut is reported). After a power cut
//! those bytes can hold a whole later record of the same unsynced group
//! (its header reached the disk, the earlier record's did not). Recovery
//! rightly drops both; but the next commit is written at the same offset,
//! and if it has the same length the stale record sits exactly where the
//! next record is expected, with the expected sequence number: the recovery
//! after the next crash replays a commit that the first recovery had
//! dropped (and that everything since was built without). SPEC §4: the
//! recovered state must be a prefix of the commit order actually followed.

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use txfs_engine::journal::REC_HEADER_LEN;
use txfs_engine::storage::{CrashFs, CrashPlan, MemFs, Storage};
use txfs_engine::{Durability, Engine, ObjId, Options};

fn opts() -> Options {
    Options { flush_interval: None, checkpoint_bytes: u64::MAX, ..Default::default() }
}

/// The journal file and its records (start, end), stopping at a zero header.
fn records(s: &dyn Storage) -> (PathBuf, Vec<(u64, u64)>) {
    let (path, v, _) = common::journal_records(s);
    (path, v)
}

fn write_f(engine: &Engine, f: ObjId, byte: u8, d: Durability) {
    let tx = engine.begin();
    engine.write(Some(tx), f, 0, &[byte; 4096]).expect("write");
    engine.commit(tx, d).expect("commit");
}

fn content(engine: &Engine) -> Vec<u8> {
    let f = engine.lookup(None, ObjId::ROOT, OsStr::new("f")).expect("lookup f");
    engine.read(None, f.obj, 0, 4096).expect("read f")
}

#[test]
fn record_dropped_at_a_zero_header_is_not_replayed_after_the_next_commit() {
    // Commit 1 (durable, checkpointed): f = 'A'. Then, first in a new
    // epoch, commits 2 ('B') and 3 ('C'): ordered, never synced, the same
    // size.
    let fs = Arc::new(CrashFs::new(MemFs::new()));
    let engine = Engine::open(fs.clone(), opts()).expect("open");
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).expect("create");
    engine.write(Some(tx), f.obj, 0, &[b'A'; 4096]).expect("write");
    engine.commit(tx, Durability::Durable).expect("commit");
    // A checkpoint starts a new epoch: its journal is empty.
    engine.checkpoint().expect("checkpoint");
    write_f(&engine, f.obj, b'B', Durability::Ordered);
    write_f(&engine, f.obj, b'C', Durability::Ordered);
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));

    // Power cut: record 3 reached the disk whole, record 2's header (written
    // last, never synced) did not.
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (jpath, recs) = records(&img);
    assert_eq!(recs.len(), 2, "two records expected: {recs:?}");
    let (b_start, b_end) = recs[0];
    img.write_at(&jpath, b_start, &[0u8; REC_HEADER_LEN as usize]).unwrap();

    // First recovery: 'B' and 'C' were never acknowledged durable and are
    // not whole in order: f = 'A' (nothing to replay, so no checkpoint and
    // the epoch's journal goes on from its header).
    let fs = Arc::new(CrashFs::new(img));
    let engine = Engine::open(fs.clone(), opts()).expect("first recovery");
    assert_eq!(content(&engine), vec![b'A'; 4096], "first recovery");
    // Life goes on: f = 'D', durable (acknowledged).
    write_f(&engine, f.obj, b'D', Durability::Durable);
    drop(engine);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
    let img = fs.crash(&mut CrashPlan::keep_all());
    let (_, recs2) = records(&img);
    assert_eq!(recs2[0], (b_start, b_end), "the new record took the dropped one's place and size");

    // Second recovery: the last acknowledged commit set f = 'D'; 'C' was
    // dropped by the first recovery and must stay dropped.
    let engine = Engine::open(Arc::new(img), opts()).expect("second recovery");
    let got = content(&engine);
    assert_eq!(got[0], b'D', "f holds {:?}: a commit dropped by the first recovery was replayed", got[0] as char);
}
