//! The CLI's promises to its users: `txfs status` counters that move with
//! what happens on the mount, and a man-style `--help` for every subcommand.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::Duration;

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

/// Story: an operator sees the daemon grow and asks which transactions
/// are live: `txfs status` lists each with its owner (pid, uid, a thread's
/// begin or a `txfs run`), age, bytes written and read-set size.
#[test]
fn status_lists_live_transactions() {
    let m = Mount::new();
    std::fs::write(m.path("read-me"), b"r").unwrap();
    assert_eq!(m.status()["transactions"], serde_json::json!([]), "none yet");
    let run = m.run_cmd(&[], &["sh", "-c", "echo x > by-run; sleep 30"]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(10), || m.live_txs() == 1), "the run's transaction is live");
    m.begin().unwrap();
    std::fs::write(m.path("big"), vec![1u8; 100_000]).unwrap();
    let _ = std::fs::read(m.path("read-me")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s = m.status();
    let txs = s["transactions"].as_array().unwrap_or_else(|| panic!("no transactions in {s}"));
    assert_eq!(txs.len(), 2, "{s}");
    let (runs, threads): (Vec<_>, Vec<_>) = txs.iter().partition(|t| t["kind"] == "run");
    let (r, t) = (runs[0], threads[0]);
    assert_eq!(t["kind"], "thread", "{s}");
    assert_eq!(t["pid"].as_u64(), Some(std::process::id() as u64), "the process that began: {s}");
    // SAFETY: geteuid cannot fail.
    assert_eq!(t["uid"].as_u64(), Some(unsafe { libc::geteuid() } as u64), "{s}");
    assert!(t["bytes"].as_u64().unwrap() >= 100_000, "bytes written: {s}");
    assert!(t["reads"].as_u64().unwrap() >= 1, "read set: {s}");
    assert!(t["mem"].as_u64().unwrap() >= 100_000, "memory its caps count, its bytes in memory too: {s}");
    assert!(t["age_s"].as_f64().unwrap() >= 0.3, "age: {s}");
    assert_eq!(t["paths"].as_u64(), Some(1), "paths touched: `big`: {s}");
    assert_eq!(r["paths"].as_u64(), Some(1), "paths touched: `by-run`: {s}");
    assert_eq!(r["pid"].as_u64(), Some(run.id() as u64), "the txfs run that owns the tree: {s}");
    assert!(r["age_s"].as_f64().unwrap() >= t["age_s"].as_f64().unwrap(), "the older first: {s}");
    let text = String::from_utf8(m.txfs().arg("status").arg(m.mnt()).output().unwrap().stdout).unwrap();
    let row = text.lines().find(|l| l.contains(&format!("tx#{}", t["tx"]))).unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols[1..4],
        [std::process::id().to_string().as_str(), t["uid"].to_string().as_str(), "thread"],
        "{text}"
    );
    assert!(
        text.contains("PID")
            && text.contains("READS")
            && text.contains("MEM")
            && text.contains("PATHS")
            && text.contains(" run "),
        "{text}"
    );
    m.abort().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let mut run = run;
    let _ = run.wait();
    assert!(wait_until(Duration::from_secs(10), || m.status()["transactions"] == serde_json::json!([])), "all gone");
}

#[test]
fn every_subcommand_has_a_man_style_help() {
    for sub in ["mount", "umount", "status", "run", "recover", "check", "completions"] {
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

/// `txfs status MNT ARGS` with stdout piped, as a child.
fn status_child(m: &Mount, args: &[&str]) -> std::process::Child {
    Command::new(TXFS)
        .arg("status")
        .arg(m.mnt())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Story: `txfs status M --watch 1 | head -1` in a script. When the reader
/// goes, status must end quietly (exit 0), not panic on the closed pipe.
#[test]
fn status_ends_quietly_when_its_reader_goes() {
    use std::io::BufRead;
    let m = Mount::new();
    for args in [&["--watch", "0.05"][..], &["--json", "--watch", "0.05"][..]] {
        let mut c = status_child(&m, args);
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "{args:?}: no output");
        // The reader is gone (dropped above): the next line meets a closed pipe.
        let st = wait_timeout(&mut c, std::time::Duration::from_secs(30)).expect("status goes on without a reader");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
        assert!(st.success() && !err.contains("panicked"), "{args:?}: exited {st}: {err}");
    }
}

/// Story: a monitoring agent reads `txfs status --json --watch` line by
/// line: every line is one JSON object (NDJSON) with the counters and
/// its time, forever — not JSON once and then a text table.
#[test]
fn status_json_watch_prints_one_object_a_line() {
    use std::io::BufRead;
    let m = Mount::new();
    let mut c = status_child(&m, &["--json", "--watch", "0.05"]);
    let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
    let mut times = Vec::new();
    for i in 0..4 {
        let line = lines.next().expect("a line").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("line {i} is not JSON ({e}): {line}"));
        assert!(v["commits"].is_u64() && v["live_txs"].is_u64(), "line {i} lacks the counters: {line}");
        times.push(v["time"].as_f64().unwrap_or_else(|| panic!("line {i} has no time: {line}")));
    }
    let _ = c.kill();
    let _ = c.wait();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "times go forward: {times:?}");
}

/// Story: a counter name as long as `lookup_getattr_requests` ran into its
/// value (`lookup_getattr_requests130425`). Every line of the text form is
/// a name, space, a number (up to the table of live transactions).
#[test]
fn status_text_columns_never_run_into_values() {
    let m = Mount::new();
    let out = Command::new(TXFS).arg("status").arg(m.mnt()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no live transactions"), "{text}");
    for line in text.lines().skip(1).take_while(|l| !l.contains("live transactions")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 2 && f[1].parse::<u64>().is_ok(), "a name run into its value: {line:?}\n{text}");
        assert!(f[0].chars().all(|c| c.is_ascii_lowercase() || c == '_'), "not a bare name: {line:?}");
    }
}

/// Story: `txfs run -- tpyo` must say why nothing ran, and exit as a shell
/// would: 127 for a command not found, 126 for one that cannot be run.
#[test]
fn run_prints_the_exec_error_and_exits_like_a_shell() {
    use std::os::unix::fs::PermissionsExt;
    let m = Mount::new();
    let plain = m.scratch().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let missing = "txfs-no-such-command-anywhere";
    for (cmd, code, says) in [(missing, 127, "No such file"), (plain.to_str().unwrap(), 126, "Permission denied")] {
        let out = Command::new(TXFS).arg("run").arg("--mount").arg(m.mnt()).arg("--").arg(cmd).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "txfs run -- {cmd}: {err}");
        assert!(err.contains(cmd) && err.contains(says), "txfs run -- {cmd} says why: {err}");
    }
    assert_eq!(m.live_txs(), 0, "the transactions were aborted");
}

/// Story: two txfs mounts are up (and maybe others' too). `txfs run` with
/// no --mount takes the one holding the current directory, else the one
/// the command's paths are in; it does not give up because there are
/// several.
#[test]
fn run_chooses_the_mount_by_directory_or_paths() {
    let (a, b) = (Mount::new(), Mount::new());
    let out = Command::new(TXFS)
        .args(["run", "--", "sh", "-c", "echo in-a > f"])
        .current_dir(a.mnt())
        .env_remove("TXFS_MOUNT")
        .output()
        .unwrap();
    assert!(out.status.success(), "run in a's directory: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(a.path("f")).unwrap(), "in-a\n");
    // From outside both, a command whose path is in b and that fails: if
    // the run was b's, its write is aborted with it; on any other mount it
    // would be a plain write to b that stays.
    let target = b.path("g");
    let out = Command::new(TXFS)
        .args(["run", "--", "sh", "-c", "cp /proc/self/comm \"$0\"; exit 1"])
        .arg(&target)
        .current_dir("/")
        .env_remove("TXFS_MOUNT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "the command's status: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!target.exists(), "the failed command's write to b survived: the run was not b's");
}

/// Story (issue 23): the journal's disk answers EIO (here
/// `TXFS_FAILPOINT=journal:1:eio`, the first journal write after the
/// mount). From then on the mount acknowledges nothing — it used to do so
/// silently: `txfs status` showed healthy counters. It must name the fault,
/// say that plain reads go on, and exit 1; `--json` carries it too.
#[test]
fn status_names_a_fault_and_exits_1() {
    let mut m = Mount::new();
    std::fs::write(m.path("before"), b"committed").unwrap();
    let healthy = Command::new(TXFS).args(["status", "--json"]).arg(m.mnt()).output().unwrap();
    assert!(healthy.status.success());
    let v: serde_json::Value = serde_json::from_slice(&healthy.stdout).unwrap();
    assert_eq!(v["fault"], serde_json::Value::Null, "{v}");

    m.restart_with_env("TXFS_FAILPOINT", "journal:1:eio");
    assert!(std::fs::write(m.path("after"), b"x").is_err(), "a write acknowledged although its journal write failed");
    assert!(m.log_text().contains("txfs failpoint: EIO"), "the failpoint was not reached: {}", m.log_text());
    assert_eq!(std::fs::read(m.path("before")).unwrap(), b"committed", "plain reads go on");

    let out = Command::new(TXFS).arg("status").arg(m.mnt()).output().unwrap();
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "txfs status exited {:?} with a fault:\n{text}{err}", out.status);
    assert!(text.contains("FAULT") && text.contains("journal") && text.contains("plain reads are served"), "{text}");
    assert!(text.contains("commits"), "the counters are still printed:\n{text}");
    let out = Command::new(TXFS).args(["status", "--json"]).arg(m.mnt()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["fault"]["reads_go_on"], serde_json::Value::Bool(true), "{v}");
    assert!(v["fault"]["why"].as_str().is_some_and(|w| w.contains("journal")), "{v}");
}

/// Story (issue 23): the backing disk fails a checkpoint's contents write
/// (here `TXFS_FAILPOINT=tree:1:eio`: the first write to the backing tree
/// after the mount, once). The mount used to stop acknowledging anything
/// until it was mounted again. Now writes go on, `txfs status` names the
/// fault as retried, the checkpoint is retried and succeeds, and status is
/// healthy again; BACKING ends up with everything.
#[test]
fn a_checkpoint_that_fails_writing_contents_is_retried_while_writes_go_on() {
    let mut m = Mount::new();
    std::fs::write(m.path("f"), b"old contents").unwrap();
    m.restart_with_env("TXFS_CHECKPOINT_BYTES", "1");
    m.restart_with_env("TXFS_FAILPOINT", "tree:1:eio");
    std::fs::write(m.path("f"), b"new contents").unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || m.log_text().contains("to be retried")),
        "the checkpoint did not fail as arranged: {}",
        m.log_text()
    );
    let out = Command::new(TXFS).args(["status", "--json"]).arg(m.mnt()).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "status exits 1 while a checkpoint fails");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["fault"]["acknowledged"], serde_json::Value::Bool(true), "{v}");
    assert!(v["fault"]["why"].as_str().is_some_and(|w| w.contains("checkpoint failed writing contents")), "{v}");
    std::fs::write(m.path("g"), b"written after the fault").expect("writes go on while the checkpoint is retried");
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"new contents");
    assert!(
        wait_until(Duration::from_secs(30), || m.log_text().contains("unfinished checkpoint is done")),
        "the checkpoint was not retried: {}",
        m.log_text()
    );
    assert!(wait_until(Duration::from_secs(10), || m.status()["fault"].is_null()), "healthy again");
    m.umount_clean();
    assert_eq!(std::fs::read(m.backing().join("f")).unwrap(), b"new contents");
    assert_eq!(std::fs::read(m.backing().join("g")).unwrap(), b"written after the fault");
}
