//! The mount's timing tier: assertions about how fast or how small
//! something is (wall-clock bounds, ratios, resident memory), which a
//! loaded machine can break without any bug. They are `#[ignore]`d so that
//! `cargo test` (and scripts/test) stays deterministic; `bench/run` runs
//! them, one at a time:
//!
//! ```sh
//! cargo test -p txfs-fuse --test timing -- --ignored --test-threads 1
//! ```
//!
//! Each test names the correctness test it measures; that test, without
//! the clock, stays in the main suite.

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

fn uring_enabled() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

/// Measures `non_transactional_writer_beats_a_reader_transaction`
/// (isolation.rs): a non-transactional writer never waits for a
/// transaction that read what it writes; two such writes take under 2 s.
#[test]
#[ignore = "timing tier: run by bench/run"]
fn a_non_transactional_write_beside_a_reader_transaction_is_quick() {
    let m = Mount::with_backing(|b| std::fs::write(b.join("c"), "0\n").unwrap());
    let mut agent = Agent::spawn(m.mnt());
    m.begin().unwrap();
    assert_eq!(std::fs::read_to_string(m.path("c")).unwrap(), "0\n");
    let t0 = Instant::now();
    agent.ok("open(M + '/c', 'w').write('100\\n')");
    agent.ok("open(M + '/other', 'w').write('o')");
    let took = t0.elapsed();
    let _ = m.abort();
    assert!(took < Duration::from_secs(2), "the non-transactional write waited {took:?}");
}

/// Measures `many_views_give_back_descriptors_and_threads` (run.rs): after
/// 20 `txfs run`s, each with its own view writing and reading 4 MiB, the
/// daemon's resident memory grew by less than 8 MiB. Before: a daemon kept
/// 100–170 MiB of request buffers after 10–30 runs.
#[test]
#[ignore = "timing tier: run by bench/run"]
fn many_views_give_back_memory() {
    let mut m = Mount::new();
    // One malloc arena: with glibc's default (8 per CPU) what the daemon
    // keeps after 20 views depends on which of its short-lived threads
    // allocated where (13–31 MiB more here, with no leak: one arena keeps
    // it flat at +0.1 MiB over 45 views), so only the single arena tells a
    // leak from the allocator's retention.
    m.restart_with_env("MALLOC_ARENA_MAX", "1");
    let pid = m.daemon_pid().expect("daemon");
    let count = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).unwrap().count();
    let rss_kib = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let script = "dd if=/dev/zero of=f bs=1M count=4 status=none && cat f > /dev/null";
    let run = || check_ok(&m.run_cmd(&[], &["sh", "-c", script]).output().unwrap(), "txfs run");
    run();
    let settle = |fds: usize, threads: usize| {
        wait_until(Duration::from_secs(60), || count("fd") <= fds && count("task") <= threads)
    };
    std::thread::sleep(Duration::from_millis(300));
    let (fds, threads, rss) = (count("fd"), count("task"), rss_kib());
    for _ in 0..20 {
        run();
    }
    settle(fds + 2, threads);
    let rss2 = rss_kib();
    eprintln!("after 20 views the daemon's RSS went {rss} → {rss2} KiB");
    assert!(rss2 < rss + 8 * 1024, "after 20 views the daemon's RSS grew {rss} → {rss2} KiB");
    m.umount_clean();
}

/// Requests that reach the daemon every time: create, write, close, unlink.
fn churn(dir: &Path, n: usize) {
    for i in 0..n {
        let p = dir.join(format!("churn{i}"));
        std::fs::write(&p, b"x").unwrap();
        std::fs::remove_file(&p).unwrap();
    }
}

/// Measures `forgets_are_read_without_a_wake_up_each` (uring.rs): over the
/// ring, the thread reading FORGETs from /dev/fuse polls (at most one pause
/// per millisecond) instead of being woken per FORGET, which made W12's
/// `rm` of 20 000 files take 50 µs per file instead of 31. A poller sleeps
/// at least 1 ms per round; a reader woken per FORGET switches about once
/// per unlink. The churn must be fast enough to tell the two apart.
#[test]
#[ignore = "timing tier: run by bench/run"]
fn forgets_wake_the_dev_fuse_threads_at_most_once_per_millisecond() {
    if !uring_enabled() {
        eprintln!("enable_uring is off: /dev/fuse threads serve every request");
        return;
    }
    let mut m = Mount::new();
    m.restart_with_env("TXFS_LOG", "info,fuser::request=debug");
    let pid = m.daemon_pid().unwrap();
    let up = wait_until(Duration::from_secs(60), || m.log_text().contains("requests arrive over io_uring"));
    assert!(up, "no ring; log:\n{}", m.log_text());
    churn(m.mnt(), 100);
    let n = 3000;
    let (switches, started) = (dev_fuse_switches(pid), Instant::now());
    churn(m.mnt(), n);
    let ms = started.elapsed().as_millis() as u64;
    let woke = dev_fuse_switches(pid) - switches;
    eprintln!("{n} create+unlinks in {ms} ms: {woke} wake-ups of the /dev/fuse threads");
    assert!(ms + 50 < n as u64 / 3, "{n} create+unlinks took {ms} ms: too slow to tell polling from wake-ups");
    assert!(woke <= ms + 50, "{n} unlinks in {ms} ms woke the /dev/fuse threads {woke} times");
    m.umount_clean();
}
