//! See before you commit (issue 29): `txfs run --dry-run / --confirm`,
//! `txfs diff`, on a real mount, through the view (root's default) and
//! without it (`TXFS_RUN_VIEW=0`, how every non-root run goes).

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

/// What the script changes: every kind the listing knows.
const SCRIPT: &str = "printf 'port=8080\\nhost=a\\n' > etc/.conf.tmp && mv etc/.conf.tmp etc/app.conf \
    && rm -r old && mkdir -p new/deeper && echo hi > new/deeper/a && mv keep kept && chmod 700 kept \
    && ln -sf kept lnk && mkfifo pipe && echo scratch > tmp && rm tmp && head -c 100 /dev/zero > bin \
    && printf 'more\\n' >> log";

fn seeded() -> Mount {
    Mount::with_backing(|b| {
        std::fs::create_dir_all(b.join("etc")).unwrap();
        std::fs::create_dir_all(b.join("old/sub")).unwrap();
        std::fs::write(b.join("etc/app.conf"), "port=80\n").unwrap();
        std::fs::write(b.join("old/sub/f"), "f").unwrap();
        std::fs::write(b.join("old/g"), "g").unwrap();
        std::fs::write(b.join("keep"), "k").unwrap();
        std::fs::write(b.join("log"), "one\n").unwrap();
        std::os::unix::fs::symlink("keep", b.join("lnk")).unwrap();
    })
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `(path, status)` of every change.
fn statuses(v: &serde_json::Value) -> Vec<(String, String)> {
    v["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_owned(), c["status"].as_str().unwrap().to_owned()))
        .collect()
}

fn change<'a>(v: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    v["changes"].as_array().unwrap().iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("{path} in {v:#}"))
}

fn dry_run_lists_everything_and_commits_nothing(view: &str) {
    let m = seeded();
    let before = snapshot(m.mnt());
    let out = m
        .run_cmd(&["--dry-run", "--json"], &["sh", "-c", &format!("{SCRIPT} && exit 7")])
        .env("TXFS_RUN_VIEW", view)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "CMD's status: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(snapshot(m.mnt()), before, "a dry run committed something");
    let v = json_of(&out);
    let want = [
        ("bin", "created"),
        ("etc/app.conf", "modified"),
        ("kept", "renamed"),
        ("lnk", "replaced"),
        ("log", "modified"),
        ("new", "created"),
        ("new/deeper", "created"),
        ("new/deeper/a", "created"),
        ("old", "deleted"),
        ("old/g", "deleted"),
        ("old/sub", "deleted"),
        ("old/sub/f", "deleted"),
        ("pipe", "created"),
    ];
    let want: Vec<(String, String)> = want.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect();
    assert_eq!(statuses(&v), want);
    let conf = change(&v, "etc/app.conf");
    assert_eq!((conf["old"]["size"].as_u64(), conf["new"]["size"].as_u64()), (Some(8), Some(17)));
    assert!(conf["what"].as_array().unwrap().contains(&"replaced".into()));
    let kept = change(&v, "kept");
    assert_eq!(kept["from"], "keep");
    assert_eq!((kept["old"]["mode"].as_str(), kept["new"]["mode"].as_str()), (Some("0644"), Some("0700")));
    assert_eq!(
        (change(&v, "lnk")["old_target"].as_str(), change(&v, "lnk")["target"].as_str()),
        (Some("keep"), Some("kept"))
    );
    assert_eq!(change(&v, "log")["bytes_written"], 5);
    assert_eq!(change(&v, "old")["below"], serde_json::json!({ "files": 2, "dirs": 1 }));
    assert_eq!(change(&v, "new")["below"], serde_json::json!({ "files": 1, "dirs": 1 }));
    assert_eq!(change(&v, "pipe")["kind"], "fifo");
    assert_eq!(v["summary"]["paths"], 13);
    assert_eq!(m.live_txs(), 0, "the dry run's transaction is gone");

    // The human form: one line a path, what is below new/ and old/ folded.
    let out = m.run_cmd(&["--dry-run", "--diff"], &["sh", "-c", SCRIPT]).env("TXFS_RUN_VIEW", view).output().unwrap();
    check_ok(&out, "txfs run --dry-run --diff");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.iter().any(|l| l.starts_with("deleted   old/  (2 files, 1 directory)")), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("renamed   keep → kept  (mode 0644 → 0700)")), "{text}");
    assert!(!text.contains("old/sub/f"), "below a deleted directory, folded: {text}");
    for want in ["--- a/etc/app.conf", "+++ b/etc/app.conf", "-port=80", "+port=8080", "+host=a", "+more"] {
        assert!(lines.contains(&want), "{want} in the diff: {text}");
    }
    assert!(text.contains("Binary files /dev/null and b/bin differ"), "{text}");
    assert!(text.contains("13 paths: "), "{text}");
    assert_eq!(snapshot(m.mnt()), before);
}

#[test]
fn dry_run_lists_everything_and_commits_nothing_in_a_view() {
    dry_run_lists_everything_and_commits_nothing("1");
}

#[test]
fn dry_run_lists_everything_and_commits_nothing_without_a_view() {
    dry_run_lists_everything_and_commits_nothing("0");
}

#[test]
fn txfs_diff_lists_the_callers_own_transaction() {
    let m = seeded();
    let out_file = m.scratch().join("diff.json");
    let txfs = env!("CARGO_BIN_EXE_txfs");
    for view in ["1", "0"] {
        let script = format!("echo x > made && rm log && {txfs} diff --json > {} && exit 1", out_file.display());
        let out = m.run_cmd(&[], &["sh", "-c", &script]).env("TXFS_RUN_VIEW", view).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
        let want = [("log".to_string(), "deleted".to_string()), ("made".to_string(), "created".to_string())];
        assert_eq!(statuses(&v), want, "view={view}");
    }
}

#[test]
fn confirm_commits_with_yes_and_refuses_to_ask_a_pipe() {
    let m = seeded();
    let before = snapshot(m.mnt());
    let out = m.run_cmd(&["--confirm"], &["sh", "-c", "echo a > a"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    assert_eq!(snapshot(m.mnt()), before);
    let out = m.run_cmd(&["--confirm", "--yes"], &["sh", "-c", "echo a > a"]).stdin(Stdio::null()).output().unwrap();
    check_ok(&out, "txfs run --confirm --yes");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("created   a  (2 B)"), "{out:?}");
    assert_eq!(std::fs::read_to_string(m.path("a")).unwrap(), "a\n");
    // A failing command is aborted without asking.
    let out = m.run_cmd(&["--confirm", "--yes"], &["sh", "-c", "echo b > b; exit 4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(!m.path("b").exists());
}

/// A pseudo-terminal: (master, slave).
fn pty() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; no name, termios or size.
    let r = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both are ours now.
    unsafe { (std::fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// `txfs run --confirm` on a terminal, answering `answer` once the prompt
/// is up, after `meanwhile` ran; its exit status.
fn confirm_on_a_tty(m: &Mount, cmd: &str, answer: &str, meanwhile: impl FnOnce()) -> i32 {
    let (mut master, slave) = pty();
    let stdin = Stdio::from(slave.try_clone().unwrap());
    let stderr = Stdio::from(slave);
    let mut child = m.run_cmd(&["--confirm"], &["sh", "-c", cmd]).stdin(stdin).stderr(stderr).spawn().unwrap();
    // Wait for the prompt on the terminal.
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("[y/N]") {
        let n = master.read(&mut buf).expect("the prompt");
        assert!(n > 0, "no prompt: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    meanwhile();
    master.write_all(answer.as_bytes()).unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("txfs run --confirm hung");
    st.code().expect("an exit status")
}

#[test]
fn confirm_asks_on_the_terminal_and_commits_only_on_y() {
    let m = seeded();
    assert_eq!(confirm_on_a_tty(&m, "echo n > n", "n\n", || {}), 1);
    assert!(!m.path("n").exists(), "committed on n");
    assert_eq!(confirm_on_a_tty(&m, "echo y > y", "y\n", || {}), 0);
    assert_eq!(std::fs::read_to_string(m.path("y")).unwrap(), "y\n");
}

#[test]
fn a_conflict_while_confirm_waits_fails_the_commit_whole() {
    let m = seeded();
    // The command reads `keep` and writes what it read into `copy`; while
    // the prompt waits, someone else changes `keep`.
    let code = confirm_on_a_tty(&m, "cat keep > copy && echo two > second", "y\n", || {
        std::fs::write(m.path("keep"), "changed meanwhile").unwrap();
    });
    assert_eq!(code, 75, "the usual conflict exit");
    assert!(!m.path("copy").exists() && !m.path("second").exists(), "half applied");
    assert_eq!(std::fs::read_to_string(m.path("keep")).unwrap(), "changed meanwhile");
    assert_eq!(m.live_txs(), 0);
}

#[test]
fn txfs_diff_started_from_a_thread_transaction_lists_it() {
    // A program in fs_tx_begin() runs `txfs diff` (system, subprocess): the
    // child is in no transaction; the thread's above it is listed. (No
    // other test of this file begins a thread transaction: one per process
    // is what makes it unambiguous.)
    let m = seeded();
    m.begin().unwrap();
    std::fs::write(m.path("by-thread"), "t").unwrap();
    let out = m.txfs().args(["diff", "--json"]).output().unwrap();
    let listed = out.status.success().then(|| statuses(&json_of(&out)));
    m.abort().unwrap();
    assert_eq!(listed, Some(vec![("by-thread".to_string(), "created".to_string())]), "{out:?}");
    assert!(!m.path("by-thread").exists());
    // Outside any transaction (here, after the abort: checked in this test
    // so that no other thread of this process is in one): status 1.
    let out = m.txfs().arg("diff").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in a transaction"), "{out:?}");
}
