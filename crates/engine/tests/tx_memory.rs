//! Memory and read-set caps (SPEC §4a, issue 23): one user's transaction
//! cannot take the daemon's memory, and a transaction past a cap fails
//! with ENOSPC, gives its memory back at once and can only be aborted.

mod common;

use common::{dump_engine, leftovers};
use std::ffi::OsStr;
use std::sync::Arc;
use txfs_engine::storage::MemFs;
use txfs_engine::{Durability, Engine, Error, ObjId, Options};

fn engine(opts: Options) -> (Engine, Arc<MemFs>) {
    let fs = Arc::new(MemFs::new());
    let opts = Options { flush_interval: None, ..opts };
    (Engine::open(fs.clone(), opts).unwrap(), fs)
}

fn enospc(r: Result<impl std::fmt::Debug, Error>) -> Error {
    match r {
        Err(e) if e.errno() == libc::ENOSPC => e,
        other => panic!("expected ENOSPC, got {other:?}"),
    }
}

/// One-byte writes with a byte of gap between them (no two extents can be
/// one) until the cap stops them: the transaction never holds more than its
/// cap by the engine's count, every later operation and its commit fail
/// with ENOSPC, its memory is back before it is aborted, and nothing of it
/// is visible or left behind.
#[test]
fn tiny_writes_stop_at_the_cap_and_the_transaction_can_only_abort() {
    let cap = 4 << 20;
    let (e, fs) = engine(Options { tx_mem: cap, mount_tx_mem: 4 * cap, ..Options::default() });
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, b"committed").unwrap();
    let before = dump_engine(&e, None);
    let tx = e.begin();
    let mut n = 0u64;
    let err = loop {
        match e.write(Some(tx), f, 100 + 2 * n, b"x") {
            Ok(_) => n += 1,
            Err(err) => break err,
        }
        assert!(e.stats().tx_mem <= cap + 4096, "{} bytes held after {n} writes", e.stats().tx_mem);
        assert!(n < 1_000_000, "no cap met after {n} one-byte writes");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("tx_mem"), "the error names the cap: {err}");
    // Somewhere near the cap, not long before it: ~100 bytes per extent.
    assert!(n > 10_000, "stopped after only {n} writes");
    assert_eq!(e.stats().tx_mem, 0, "its memory goes back at once, before the abort");
    assert_eq!(e.stats().limit_aborts, 1);
    assert!(e.is_doomed(tx) && !e.lost_conflict(tx), "doomed by the limit, not by a conflict");
    enospc(e.write(Some(tx), f, 0, b"y"));
    enospc(e.getattr(Some(tx), f));
    enospc(e.create(Some(tx), ObjId::ROOT, OsStr::new("g"), 0o644, 0, 0));
    enospc(e.commit(tx, Durability::Durable));
    assert_eq!(dump_engine(&e, None), before, "nothing of it is visible");
    // Others go on: a plain write and another transaction.
    e.write(None, f, 0, b"C").unwrap();
    let t2 = e.begin();
    e.write(Some(t2), f, 1, b"o").unwrap();
    e.commit(t2, Durability::Durable).unwrap();
    assert_eq!(e.read(None, f, 0, 9).unwrap(), b"Committed");
    e.checkpoint().unwrap();
    assert!(leftovers(&*fs).is_empty(), "{:?}", leftovers(&*fs));
}

/// Written bytes alone never meet the cap: past half of it they spill to
/// disk, so a transaction writing several times its cap commits whole.
#[test]
fn payload_spills_instead_of_meeting_the_cap() {
    let cap = 2 << 20;
    let (e, _fs) = engine(Options { tx_mem: cap, mount_tx_mem: cap, ..Options::default() });
    let f = e.create(None, ObjId::ROOT, OsStr::new("big"), 0o644, 0, 0).unwrap().obj;
    let tx = e.begin();
    let chunk: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    for i in 0..128u64 {
        e.write(Some(tx), f, i * chunk.len() as u64, &chunk).unwrap();
        assert!(e.stats().tx_mem <= cap, "{} held", e.stats().tx_mem);
    }
    e.commit(tx, Durability::Durable).unwrap();
    let got = e.read(None, f, 100 * chunk.len() as u64, chunk.len()).unwrap();
    assert_eq!(got, chunk);
    assert_eq!(e.getattr(None, f).unwrap().size, 128 * chunk.len() as u64);
}

/// Two transactions each within its own cap, together past the mount's:
/// the one whose operation crosses it fails, the other commits.
#[test]
fn the_mount_wide_cap_stops_the_transaction_that_crosses_it() {
    let (e, _fs) = engine(Options { tx_mem: 3 << 20, mount_tx_mem: 4 << 20, ..Options::default() });
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    let g = e.create(None, ObjId::ROOT, OsStr::new("g"), 0o644, 0, 0).unwrap().obj;
    let (a, b) = (e.begin(), e.begin());
    let mut n = 0u64;
    while e.stats().tx_mem < 2 << 20 {
        e.write(Some(a), f, 2 * n, b"a").unwrap();
        n += 1;
    }
    let mut m = 0u64;
    let err = loop {
        match e.write(Some(b), g, 2 * m, b"b") {
            Ok(_) => m += 1,
            Err(err) => break err,
        }
        assert!(m < 1_000_000);
    };
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("mount_tx_mem"), "{err}");
    e.abort(b).unwrap();
    e.commit(a, Durability::Durable).unwrap();
    assert_eq!(e.read(None, f, 0, 3).unwrap(), b"a\0a");
    assert_eq!(e.stats().tx_mem, 0);
}

/// Thousands of creates in one transaction meet the cap as writes do.
#[test]
fn creates_are_bookkeeping_too() {
    let (e, _fs) = engine(Options { tx_mem: 1 << 20, ..Options::default() });
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap().obj;
    let tx = e.begin();
    let mut n = 0;
    let err = loop {
        match e.create(Some(tx), d, OsStr::new(&format!("file-{n:06}")), 0o644, 0, 0) {
            Ok(_) => n += 1,
            Err(err) => break err,
        }
        assert!(n < 100_000);
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(n > 500, "only {n} creates");
    e.abort(tx).unwrap();
    assert!(e.readdir(None, d).unwrap().is_empty());
}

/// The read set is capped by entries; a file read in order is one entry,
/// however many reads it takes.
#[test]
fn the_read_set_is_capped_and_ordered_reads_are_one_entry() {
    let (e, _fs) = engine(Options { tx_reads: 64, ..Options::default() });
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    e.write(None, f, 0, &vec![7u8; 4 << 20]).unwrap();
    let tx = e.begin();
    for p in 0..1024u64 {
        assert_eq!(e.read(Some(tx), f, p * 4096, 4096).unwrap().len(), 4096, "page {p}");
    }
    e.commit(tx, Durability::Durable).unwrap();
    let d = e.mkdir(None, ObjId::ROOT, OsStr::new("d"), 0o755, 0, 0).unwrap().obj;
    for i in 0..100 {
        e.create(None, d, OsStr::new(&format!("{i}")), 0o644, 0, 0).unwrap();
    }
    let tx = e.begin();
    let mut n = 0;
    let err = loop {
        match e.lookup(Some(tx), d, OsStr::new(&format!("{n}"))) {
            Ok(_) => n += 1,
            Err(err) => break err,
        }
        assert!(n < 100, "100 lookups in a transaction capped at 64 read entries");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(err.to_string().contains("tx_reads"), "{err}");
    // A lookup reads the name and the object's attributes: two entries.
    assert!((28..=32).contains(&n), "{n} lookups");
    enospc(e.commit(tx, Durability::Ordered));
}

/// Commit stamps are kept only while a live transaction may fail on them:
/// with transactions always live (each begins before the last one ends),
/// the stamps of 200 000 plain writes do not all stay.
#[test]
fn stamps_older_than_every_live_transaction_are_dropped() {
    let (e, _fs) = engine(Options::default());
    let f = e.create(None, ObjId::ROOT, OsStr::new("f"), 0o644, 0, 0).unwrap().obj;
    let mut live = e.begin();
    let mut most = 0;
    for i in 0..200_000u64 {
        e.write(None, f, i * 4096, b"p").unwrap();
        if i % 1000 == 999 {
            let next = e.begin();
            e.commit(live, Durability::Ordered).unwrap();
            live = next;
        }
        most = most.max(e.stats().stamps);
    }
    assert!(most < 140_000, "{most} stamps kept at most (200 000 without pruning)");
    // What was stamped after the live transaction began still conflicts.
    e.write(None, f, 0, b"q").unwrap();
    assert!(e.read(Some(live), f, 0, 1).unwrap_err().is_conflict());
}
