//! Unmodified applications on the mount: SQLite (from Python, inside a
//! thread transaction) and git (under `txfs run`), including being
//! SIGKILLed in the middle.

mod common;

use common::*;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SQL_WRITER: &str = r#"
import os, sys, fcntl, struct, sqlite3, time
M, db, mode = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(M, os.O_RDONLY)
fcntl.ioctl(fd, 0x4008e701, struct.pack('II', 0, 0))
con = sqlite3.connect(db, isolation_level=None)
for rnd in range(1000000 if mode == 'loop' else 1):
    con.execute('BEGIN')
    con.execute("UPDATE t SET v = v || '+' WHERE id % 3 = ?", (rnd % 3,))
    con.executemany('INSERT INTO t(v) VALUES (?)', [('new %d %d' % (rnd, i),) for i in range(50)])
    con.execute('DELETE FROM t WHERE id % 17 = ?', (rnd % 17,))
    con.execute('COMMIT')
    print('sql-committed', rnd, flush=True)
if mode == 'commit':
    con.close()
    fcntl.ioctl(fd, 0x4008e702, struct.pack('II', 0, 0))
    print('tx-committed', flush=True)
else:
    time.sleep(60)
"#;

const SQL_SETUP: &str = r#"
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute('CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)')
con.executemany('INSERT INTO t(v) VALUES (?)', [('row %d ' % i + 'x' * (i % 300),) for i in range(2000)])
con.execute('CREATE INDEX tv ON t(v)')
con.commit()
con.close()
"#;

fn sqlite(db: &Path, sql: &str) -> String {
    let o = Command::new("sqlite3").arg(db).arg(sql).output().expect("sqlite3");
    check_ok(&o, sql).trim().to_string()
}

fn start_writer(
    m: &Mount,
    db: &Path,
    mode: &str,
) -> (std::process::Child, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    use std::io::BufRead;
    let mut c = Command::new(python())
        .arg("-c")
        .arg(SQL_WRITER)
        .arg(m.mnt())
        .arg(db)
        .arg(mode)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
    (c, lines)
}

fn assert_db_unchanged(m: &Mount, db: &Path, bytes: &[u8], dump: &str, what: &str) {
    assert!(
        wait_until(Duration::from_secs(60), || m.live_txs() == 0),
        "{what}: the killed writer's tx was not aborted"
    );
    assert_eq!(sqlite(db, "PRAGMA integrity_check"), "ok", "{what}");
    assert!(std::fs::read(db).unwrap() == bytes, "{what}: the database file changed");
    assert_eq!(sqlite(db, ".dump"), dump, "{what}");
    let mut left = names(m.mnt());
    left.retain(|n| n != "db");
    assert!(left.is_empty(), "{what}: leftovers {left:?}");
}

#[test]
fn sqlite_in_a_transaction_survives_sigkill() {
    let mut m = Mount::new();
    let db = m.path("db");
    check_ok(&Command::new(python()).arg("-c").arg(SQL_SETUP).arg(&db).output().unwrap(), "setup");
    assert_eq!(sqlite(&db, "SELECT count(*) FROM t"), "2000");
    let bytes = std::fs::read(&db).unwrap();
    let dump = sqlite(&db, ".dump");

    // Killed after SQLite committed (and fsynced) but before the txfs commit.
    let (mut w, mut lines) = start_writer(&m, &db, "hold");
    let l = lines.next().expect("writer output").unwrap();
    assert!(l.starts_with("sql-committed"), "{l}");
    // Meanwhile, another process reads the old database.
    assert_eq!(sqlite(&db, "SELECT count(*) FROM t"), "2000");
    assert_eq!(sqlite(&db, "PRAGMA integrity_check"), "ok");
    assert_eq!(m.live_txs(), 1);
    w.kill().unwrap();
    w.wait().unwrap();
    assert_db_unchanged(&m, &db, &bytes, &dump, "killed after the SQL commit");

    // Killed in the middle of a stream of SQL transactions.
    for delay in [10u64, 60, 150, 300] {
        let (mut w, _lines) = start_writer(&m, &db, "loop");
        std::thread::sleep(Duration::from_millis(delay));
        w.kill().unwrap();
        w.wait().unwrap();
        assert_db_unchanged(&m, &db, &bytes, &dump, &format!("killed after {delay} ms"));
    }

    // The daemon killed while a writer is mid-transaction.
    let (mut w, mut lines) = start_writer(&m, &db, "hold");
    assert!(lines.next().unwrap().unwrap().starts_with("sql-committed"));
    m.kill_daemon();
    w.kill().unwrap();
    w.wait().unwrap();
    m.start();
    assert_db_unchanged(&m, &db, &bytes, &dump, "daemon killed");

    // And committed: all of it.
    let (mut w, mut lines) = start_writer(&m, &db, "commit");
    assert!(lines.next().unwrap().unwrap().starts_with("sql-committed"));
    assert_eq!(lines.next().unwrap().unwrap(), "tx-committed");
    assert!(w.wait().unwrap().success());
    assert_eq!(sqlite(&db, "PRAGMA integrity_check"), "ok");
    let expect = 2000 + 50 - (2050 / 17);
    assert_eq!(sqlite(&db, "SELECT count(*) FROM t"), expect.to_string());
    assert_eq!(
        sqlite(&db, "SELECT count(*) FROM t WHERE v LIKE '%+'"),
        sqlite(&db, "SELECT count(*) FROM t WHERE id % 3 = 0 AND id <= 2000")
    );
    m.umount_clean();
    assert_eq!(sqlite(&m.backing().join("db"), "SELECT count(*) FROM t"), expect.to_string());
    assert!(!m.backing().join("db-journal").exists());
}

fn git(repo: &Path, home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("git");
    c.args(args)
        .current_dir(repo)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com");
    c
}

fn git_ok(repo: &Path, home: &Path, args: &[&str]) -> String {
    let o: Output = git(repo, home, args).output().unwrap();
    check_ok(&o, &format!("git {}", args.join(" ")))
}

/// `txfs run -- sh -c 'git add -A && git commit -q -m MSG'` in `repo`, in a
/// process group of its own.
fn git_commit_run(m: &Mount, repo: &Path, home: &Path, msg: &str) -> std::process::Child {
    let mut c = m.run_cmd(&[], &["sh", "-c", &format!("git add -A && git commit -q -m '{msg}'")]);
    c.current_dir(repo)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    c.spawn().unwrap()
}

fn assert_repo_sane(repo: &Path, home: &Path, what: &str) {
    assert!(!repo.join(".git/index.lock").exists(), "{what}: index.lock left behind");
    assert!(!repo.join(".git/HEAD.lock").exists(), "{what}: HEAD.lock left behind");
    let o = git(repo, home, &["fsck", "--strict", "--no-dangling"]).output().unwrap();
    check_ok(&o, &format!("{what}: git fsck"));
    assert!(o.stderr.is_empty(), "{what}: git fsck complained: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn git_commit_under_txfs_run_is_atomic() {
    let m = Mount::new();
    let home = m.scratch();
    let repo: PathBuf = m.path("repo");
    std::fs::create_dir(&repo).unwrap();
    git_ok(&repo, &home, &["init", "-q", "-b", "main"]);
    git_ok(&repo, &home, &["config", "gc.auto", "0"]);
    for i in 0..30 {
        std::fs::create_dir_all(repo.join(format!("d{}", i % 5))).unwrap();
        std::fs::write(repo.join(format!("d{}/f{i}", i % 5)), format!("file {i}\n").repeat(i + 1)).unwrap();
    }
    git_ok(&repo, &home, &["add", "-A"]);
    git_ok(&repo, &home, &["commit", "-q", "-m", "initial"]);

    // Under txfs run: works, and is timed to pick kill delays.
    std::fs::write(repo.join("d0/f0"), "changed\n").unwrap();
    std::fs::write(repo.join("added"), "added\n").unwrap();
    std::fs::remove_file(repo.join("d1/f1")).unwrap();
    let t0 = Instant::now();
    let mut c = git_commit_run(&m, &repo, &home, "x");
    let st = wait_timeout(&mut c, Duration::from_secs(60)).expect("git under txfs run hung");
    let took = t0.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    assert!(st.success(), "txfs run git commit: {st}: {err}");
    assert_eq!(git_ok(&repo, &home, &["rev-list", "--count", "HEAD"]).trim(), "2");
    assert_eq!(git_ok(&repo, &home, &["log", "-1", "--format=%s"]).trim(), "x");
    assert_eq!(git_ok(&repo, &home, &["status", "--porcelain"]), "");
    assert_repo_sane(&repo, &home, "after txfs run");

    // Killed midway: the repository is exactly as before, or (if the kill
    // came after the commit) exactly one commit further.
    let ms = took.as_millis() as u64;
    let mut untouched = 0;
    for (k, frac) in [2u64, 5, 10, 20, 30, 45, 60].into_iter().enumerate() {
        std::fs::write(repo.join(format!("iter{k}")), format!("iteration {k}\n")).unwrap();
        std::fs::write(repo.join("d2/f2"), format!("changed in {k}\n")).unwrap();
        let head = git_ok(&repo, &home, &["rev-parse", "HEAD"]);
        let before = snapshot(&repo);
        let delay = Duration::from_millis((ms * frac / 100).max(1));
        let mut c = git_commit_run(&m, &repo, &home, &format!("k{k}"));
        std::thread::sleep(delay);
        let exited_first = c.try_wait().unwrap().is_some();
        // SAFETY: the group of our child (process_group(0)).
        unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
        let _ = c.wait();
        assert!(wait_until(Duration::from_secs(60), || m.live_txs() == 0), "the killed tree's tx was not aborted");
        let after = snapshot(&repo);
        let new_head = git_ok(&repo, &home, &["rev-parse", "HEAD"]);
        if after == before {
            untouched += 1;
        } else {
            assert_ne!(new_head, head, "k{k} ({delay:?}): the repository changed without a commit");
            assert_eq!(git_ok(&repo, &home, &["rev-parse", "HEAD~1"]), head, "k{k}: not one commit further");
            assert_eq!(git_ok(&repo, &home, &["status", "--porcelain"]), "", "k{k}: half a commit");
            eprintln!("k{k} ({delay:?}): the commit won the race with the kill (exited first: {exited_first})");
        }
        assert_repo_sane(&repo, &home, &format!("killed after {delay:?}"));
    }
    eprintln!("git under txfs run took {took:?}; {untouched} of 7 kills left the repository untouched");
    assert!(untouched >= 3, "most kills should land before the commit ({untouched} of 7 did; one run took {took:?})");
    // And it still works afterwards.
    std::fs::write(repo.join("d3/f3"), "final\n").unwrap();
    let mut c = git_commit_run(&m, &repo, &home, "final");
    assert!(wait_timeout(&mut c, Duration::from_secs(60)).unwrap().success());
    assert_eq!(git_ok(&repo, &home, &["status", "--porcelain"]), "");
    assert_repo_sane(&repo, &home, "final");
}
