//! The engine's timing tier: assertions about how fast something is,
//! which a loaded machine can break without any bug. They are `#[ignore]`d
//! so that `cargo test` (and scripts/test) stays deterministic; `bench/run`
//! runs them, one at a time:
//!
//! ```sh
//! cargo test -p txfs-engine --test timing -- --ignored --test-threads 1
//! ```
//!
//! Each test names the correctness test it measures; that test, without
//! the clock, stays in the main suite.

mod common;

use common::recycled::{opts, recycled_with};

use std::sync::Arc;
use std::time::Instant;
use txfs_engine::journal::REC_HEADER_LEN;
use txfs_engine::storage::{CrashPlan, Storage};
use txfs_engine::Engine;

/// Measures `a_recycled_journal_full_of_fake_headers_opens`
/// (recycled_journal_user_data.rs): J3's probe looks at every REC_MAGIC in
/// a recycled journal's old bytes; if it read and checksummed the
/// `data_len` a candidate header claims, user data made of fake headers
/// would make opening it read (headers x data_len) bytes. The keyed header
/// check rejects them from their 48 bytes: 64 KiB of fake headers claiming
/// 8 MiB each, in a ~12 MiB journal, open less than 10 times slower than
/// the same journal with plain bytes.
#[test]
#[ignore = "timing tier: run by bench/run"]
fn probe_cost_of_user_data_in_a_recycled_journal() {
    let claim = 8u64 << 20;
    let one = common::unkeyed_record(1 << 40, u64::MAX, &[], claim, &[]);
    let mut fake = Vec::new();
    while fake.len() < (64 << 10) {
        fake.extend_from_slice(&one[..REC_HEADER_LEN as usize]);
    }
    let plain = vec![b'x'; fake.len()];
    let mut took = Vec::new();
    for payload in [&plain, &fake] {
        let (fs, engine) = recycled_with(payload, 12 << 20);
        drop(engine); // a crash: the recycled journal keeps its old bytes
        let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("engine still holds the fs"));
        let img = Arc::new(fs.crash(&mut CrashPlan::keep_all()));
        let (jp, _, _) = common::journal_records(&*img);
        let len = img.lstat(&jp).unwrap().size;
        let t = Instant::now();
        let r = Engine::open(img.clone(), opts());
        let dt = t.elapsed();
        eprintln!(
            "open after a crash, {len}-byte recycled journal: {dt:?} ({:?})",
            r.as_ref().err().map(|e| e.to_string())
        );
        assert!(r.is_ok(), "a healthy recycled journal refused");
        took.push(dt.as_secs_f64());
    }
    eprintln!("{} fake headers: {:.0}x slower", fake.len() / REC_HEADER_LEN as usize, took[1] / took[0]);
    assert!(took[1] < 10.0 * took[0], "opening took {:?}s vs {:?}s", took[1], took[0]);
}
