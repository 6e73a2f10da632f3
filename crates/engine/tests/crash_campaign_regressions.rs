//! Regressions found by the daemon crash campaign
//! (`reliability/crash_campaign.py`), pinned at the engine level.

use std::ffi::OsStr;
use std::sync::Arc;
use txfs_engine::storage::MemFs;
use txfs_engine::{Durability, Engine, Error, ObjId, Options, TxId};

fn engine() -> Engine {
    Engine::open(Arc::new(MemFs::new()), Options { flush_interval: None, ..Default::default() }).expect("open")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn obj(e: &Engine, tx: Option<TxId>, path: &str) -> txfs_engine::Result<ObjId> {
    let mut cur = ObjId::ROOT;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = e.lookup(tx, cur, os(c))?.obj;
    }
    Ok(cur)
}

/// The story: T1 begins and sees d/x/f. T2 removes f and the directory x
/// and commits. T1 then walks d/x/f (looking each name up again, as the
/// kernel does with zero-TTL entries) and writes f. It must either see its
/// snapshot or fail with a conflict: never ENOENT for a file its snapshot
/// holds (SPEC: every read sees the state as of begin, or conflicts).
#[test]
fn a_directory_removed_after_begin_is_a_conflict_not_enoent() {
    for looked_up_before in [false, true] {
        let e = engine();
        let d = e.mkdir(None, ObjId::ROOT, os("d"), 0o755, 0, 0).unwrap().obj;
        let x = e.mkdir(None, d, os("x"), 0o755, 0, 0).unwrap().obj;
        let f = e.create(None, x, os("f"), 0o644, 0, 0).unwrap().obj;
        e.write(None, f, 0, b"hello").unwrap();
        let t1 = e.begin();
        if looked_up_before {
            obj(&e, Some(t1), "d/x/f").unwrap();
        } else {
            obj(&e, Some(t1), "d").unwrap();
        }
        let t2 = e.begin();
        e.unlink(Some(t2), x, os("f")).unwrap();
        e.rmdir(Some(t2), d, os("x")).unwrap();
        e.commit(t2, Durability::Durable).unwrap();
        let r = obj(&e, Some(t1), "d/x/f").and_then(|f| e.write(Some(t1), f, 0, b"HELLO").map(|_| ()));
        match r {
            Ok(()) | Err(Error::Conflict { .. }) => eprintln!("looked up before: {looked_up_before}: {r:?}"),
            Err(other) => {
                panic!("looked up before: {looked_up_before}: T1 got {other:?}, want its snapshot or a conflict")
            }
        }
        let _ = e.abort(t1);
    }
}
