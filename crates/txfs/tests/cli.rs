//! The CLI's promises to its users: `txfs status` counters that move with
//! what happens on the mount, and a man-style `--help` for every subcommand.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::process::Command;

fn counter(m: &Mount, name: &str) -> u64 {
    let s = m.status();
    s[name].as_u64().unwrap_or_else(|| panic!("status has no {name}: {s}"))
}

#[test]
fn status_counters_move() {
    let m = Mount::new();
    std::fs::write(m.path("f"), b"0").unwrap();
    let (commits, aborts, conflicts, lag) =
        (counter(&m, "commits"), counter(&m, "aborts"), counter(&m, "conflicts"), counter(&m, "checkpoint_lag"));
    assert!(counter(&m, "journal_bytes") >= lag, "lag counts the journal's records, not its header");

    // A committed transaction: commits +1, and its records wait in the journal.
    m.begin().unwrap();
    std::fs::write(m.path("g"), vec![7u8; 100_000]).unwrap();
    m.commit().unwrap();
    assert!(counter(&m, "commits") > commits, "{}", m.status());
    assert!(counter(&m, "checkpoint_lag") >= lag + 100_000, "{}", m.status());
    assert!(counter(&m, "journal_syncs") >= 1);

    // An abort.
    m.begin().unwrap();
    std::fs::write(m.path("h"), b"x").unwrap();
    assert_eq!(counter(&m, "live_txs"), 1);
    m.abort().unwrap();
    assert_eq!(counter(&m, "aborts"), aborts + 1, "{}", m.status());
    assert_eq!(counter(&m, "live_txs"), 0);

    // A conflict: this thread's transaction read f, then another process
    // (non-transactional) changed it: the transaction loses at commit.
    m.begin().unwrap();
    let _ = std::fs::read(m.path("f")).unwrap();
    let f = m.path("f");
    std::thread::spawn(move || std::fs::File::options().write(true).open(f).unwrap().write_all_at(b"1", 0).unwrap())
        .join()
        .unwrap();
    std::fs::write(m.path("f2"), b"y").unwrap();
    let r = m.commit();
    assert_errno(r, libc::EDEADLK, "commit after a read that another writer overwrote");
    let _ = m.abort();
    assert!(counter(&m, "conflicts") > conflicts, "{}", m.status());

    // The human form names the same counters.
    let out = Command::new(TXFS).arg("status").arg(m.mnt()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["commits", "aborts", "conflicts", "journal_bytes", "checkpoint_lag", "live_txs"] {
        assert!(text.contains(name), "`txfs status` lacks {name}:\n{text}");
    }
}

#[test]
fn every_subcommand_has_a_man_style_help() {
    for sub in ["mount", "umount", "status", "run", "recover", "check"] {
        let out = Command::new(TXFS).args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "txfs {sub} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Example"), "txfs {sub} --help has no examples:\n{text}");
        assert!(text.contains("Exit status"), "txfs {sub} --help has no exit status:\n{text}");
        if matches!(sub, "mount" | "recover" | "check") {
            assert!(text.contains("BACKING/.txfs/"), "txfs {sub} --help does not list its files:\n{text}");
        }
    }
}
