"""The txfs VFS against a real txfs mount, with the stock sqlite3 shell, Python
and C, and several processes. Every test opens its own database."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import EXT, HERE

import txfs  # clients/python, put on sys.path by conftest
import txfs_sqlite  # clients/sqlite

WORKER = [sys.executable, str(HERE / "worker.py")]


def connect(path: str, **params: str) -> sqlite3.Connection:
    txfs_sqlite.load(EXT)
    query = "".join(f"&{k}={v}" for k, v in params.items())
    return sqlite3.connect(f"file:{path}?vfs=txfs{query}", uri=True, isolation_level=None, timeout=5)


def side_files(path: str) -> list:
    """Anything next to the database but the database itself."""
    d, name = os.path.split(path)
    return sorted(n for n in os.listdir(d) if n != name)


def test_shell_loads_and_forces_journal_off(db: str) -> None:
    script = f"""
.load {EXT}
.open file:{db}?vfs=txfs
PRAGMA journal_mode;
CREATE TABLE t(x);
BEGIN;
INSERT INTO t VALUES (1), (2);
.system ls -a {os.path.dirname(db)}
COMMIT;
SELECT sum(x) FROM t;
PRAGMA integrity_check;
"""
    out = subprocess.run(["sqlite3", "-batch", "-bail"], input=script, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == "off"
    # the listing during the open transaction: only the database
    assert [n for n in lines[1:] if n not in (".", "..")][:1] == ["t.db"]
    assert "t.db-journal" not in lines and "t.db-wal" not in lines
    assert lines[-2:] == ["3", "ok"]
    # WAL (or any journal) is refused, not silently accepted
    bad = subprocess.run(["sqlite3", "-batch"], input=f".load {EXT}\n.open file:{db}?vfs=txfs\nPRAGMA journal_mode=WAL;\n",
                         capture_output=True, text=True, timeout=60)
    assert "journal_mode stays OFF" in bad.stderr
    assert side_files(db) == []


def test_not_on_txfs_is_refused(tmp_path) -> None:
    with pytest.raises(sqlite3.OperationalError):
        connect(str(tmp_path / "plain.db")).execute("CREATE TABLE t(x)")


def test_no_journal_or_wal_during_and_after(db: str) -> None:
    conn = connect(db)
    conn.execute("CREATE TABLE t(x, y)")
    for round_ in range(3):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t VALUES (?, randomblob(3000))", [(i,) for i in range(300)])
        # this thread is inside the transaction: it sees the transaction's own files
        assert side_files(db) == [], round_
        conn.execute("UPDATE t SET x = x + 1")
        assert side_files(db) == []
        conn.execute("COMMIT" if round_ != 1 else "ROLLBACK")
        assert side_files(db) == []
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (600,)
    conn.execute("CREATE INDEX ty ON t(y)")
    conn.execute("DELETE FROM t WHERE x % 2 = 0")
    conn.execute("VACUUM")
    assert side_files(db) == []
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_rollback_undoes(db: str) -> None:
    conn = connect(db)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(2, 5000)])
    conn.execute("DELETE FROM t WHERE x = 1")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (4998,)
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    # a fresh connection (another snapshot, no cache) agrees
    assert connect(db).execute("SELECT x FROM t").fetchall() == [(1,)]
    # the connection still works after the rollback
    conn.execute("INSERT INTO t VALUES (7)")
    assert connect(db).execute("SELECT sum(x) FROM t").fetchone() == (8,)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_other_process_never_sees_uncommitted_rows(db: str) -> None:
    conn = connect(db)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES (1)")
    w = subprocess.Popen(WORKER + ["hold", db, "2000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        for _ in range(5):
            assert conn.execute("SELECT count(*), sum(x) FROM t").fetchone() == (1, 1)
        assert side_files(db) == []
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip() == "committed"
    finally:
        w.wait(timeout=30)
    assert w.returncode == 0
    assert conn.execute("SELECT count(*), sum(x) FROM t").fetchone() == (2001, -1 - sum(range(2000)))


def wait_reaped(db: str) -> None:
    """Waits until the daemon has aborted the transaction of a killed worker
    (however long a loaded machine takes; one never aborted fails)."""
    mnt = os.path.dirname(db)
    deadline = time.monotonic() + 60
    while txfs.status(mnt)["live_txs"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert txfs.status(mnt)["live_txs"] == 0, "the killed worker's transaction was never aborted"


def test_sigkill_mid_transaction_leaves_database_unchanged(db: str) -> None:
    conn = connect(db)
    conn.execute("CREATE TABLE t(x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    before = conn.execute("SELECT count(*), sum(x) FROM t").fetchone()
    w = subprocess.Popen(WORKER + ["hold", db, "5000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "ready"
    w.send_signal(signal.SIGKILL)
    w.wait(timeout=30)
    wait_reaped(db)
    assert conn.execute("SELECT count(*), sum(x) FROM t").fetchone() == before
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.execute("INSERT INTO t VALUES (-1)")  # and it takes writes again
    assert side_files(db) == []


def test_sigkill_during_commit_is_all_or_nothing(db: str) -> None:
    """A 24 MB transaction is killed at 30/60/90 % of its measured COMMIT
    time (the page writes): each attempt leaves all of it or none."""
    conn = connect(db)
    conn.execute("CREATE TABLE big(id INTEGER PRIMARY KEY, b BLOB)")
    conn.execute("CREATE TABLE meta(n)")
    conn.execute("INSERT INTO meta VALUES (0)")

    def start() -> subprocess.Popen:
        w = subprocess.Popen(WORKER + ["commit-big", db, "24"], stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().strip() == "committing"
        return w

    w = start()  # calibration: how long does COMMIT take?
    t0 = time.monotonic()
    assert w.stdout.readline().strip() == "committed"
    commit_time = time.monotonic() - t0
    w.wait(timeout=30)
    state = (1, 24)
    outcomes = []
    for frac in (0.3, 0.6, 0.9):
        w = start()
        time.sleep(commit_time * frac)
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
        wait_reaped(db)
        got = conn.execute("SELECT (SELECT n FROM meta), (SELECT count(*) FROM big)").fetchone()
        assert got in (state, (state[0] + 1, state[1] + 24)), (frac, got)
        outcomes.append(got != state)
        state = got
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    print(f"commit {commit_time * 1000:.0f} ms; killed attempts that committed anyway: {outcomes}")


def test_concurrent_writers_lose_and_duplicate_nothing(db: str) -> None:
    conn = connect(db)
    conn.execute("CREATE TABLE counters(id INTEGER PRIMARY KEY, v INTEGER)")
    conn.execute("CREATE TABLE log(worker, seq, seen, UNIQUE(worker, seq))")
    conn.execute("INSERT INTO counters VALUES (0, 0)")
    workers, n = 4, 40
    stop = threading.Event()
    seen_side: list = []

    def watch() -> None:  # no journal may ever appear, at any moment
        while not stop.is_set():
            seen_side.extend(side_files(db))
            time.sleep(0.002)

    reads = {"ok": 0, "busy": 0, "bad": []}

    def read() -> None:  # one statement = one snapshot: counter and log agree
        c = connect(db)
        while not stop.is_set():
            try:
                v, rows = c.execute("SELECT (SELECT v FROM counters), (SELECT count(*) FROM log)").fetchone()
            except sqlite3.OperationalError as e:
                assert "locked" in str(e)
                reads["busy"] += 1
                continue
            reads["ok"] += 1
            if v != rows:
                reads["bad"].append((v, rows))

    t = threading.Thread(target=watch)
    t.start()
    r = threading.Thread(target=read)
    r.start()
    procs = [subprocess.Popen(WORKER + ["counter", db, str(n), str(i)], stdout=subprocess.PIPE, text=True)
             for i in range(workers)]
    retries = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0
            retries.append(int(out.strip()))
    finally:
        stop.set()
        t.join()
        r.join()
    assert seen_side == []
    assert reads["bad"] == [] and reads["ok"] > 0, reads
    assert conn.execute("SELECT v FROM counters").fetchone() == (workers * n,)
    assert conn.execute("SELECT count(*), count(DISTINCT worker || '/' || seq) FROM log").fetchone() == (workers * n,) * 2
    # every increment saw a distinct predecessor: no lost update
    assert conn.execute("SELECT count(DISTINCT seen), min(seen), max(seen) FROM log").fetchone() == (
        workers * n, 0, workers * n - 1)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    print(f"retries per worker: {retries}; reads {reads['ok']} ok, {reads['busy']} busy")


def test_conflict_is_busy_and_retry_succeeds(db: str) -> None:
    a, b = connect(db), None
    a.execute("CREATE TABLE t(x)")
    a.execute("INSERT INTO t VALUES (0)")
    result: dict = {}

    def other() -> None:  # another thread = another txfs transaction
        c = connect(db)
        c.execute("UPDATE t SET x = x + 10")
        result["done"] = True

    a.execute("BEGIN")
    assert a.execute("SELECT x FROM t").fetchone() == (0,)
    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert result.get("done")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        a.execute("UPDATE t SET x = x + 1")
        a.execute("COMMIT")
    if a.in_transaction:
        a.execute("ROLLBACK")
    a.execute("UPDATE t SET x = x + 1")  # the retry
    assert connect(db).execute("SELECT x FROM t").fetchone() == (11,)


def test_ordered_commit_parameter(db: str) -> None:
    conn = connect(db, txfs_commit="ordered")
    assert conn.execute("PRAGMA txfs_commit").fetchone() == ("ordered",)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES (1)")
    txfs.sync(os.path.dirname(db))
    assert connect(db).execute("SELECT x FROM t").fetchall() == [(1,)]


def test_listing6_rows_and_plain_file_commit_and_abort_together(db: str) -> None:
    d = os.path.dirname(db)
    conn = connect(db)
    conn.execute("CREATE TABLE msg(id INTEGER PRIMARY KEY, path)")

    # commit: both appear, at once
    with txfs.transaction(mount=d):
        conn.execute("INSERT INTO msg VALUES (1, 'a1')")
        with open(os.path.join(d, "a1"), "w") as f:
            f.write("attachment 1")
        conn.execute("UPDATE msg SET path = 'a1' WHERE id = 1")  # a second SQLite transaction, same txfs one
        # nothing is visible outside before the application's commit
        res: dict = {}
        th = threading.Thread(target=lambda: res.update(
            rows=connect(db).execute("SELECT count(*) FROM msg").fetchone(), file=os.path.exists(os.path.join(d, "a1"))))
        th.start()
        th.join()
        assert res == {"rows": (0,), "file": False}
    assert connect(db).execute("SELECT * FROM msg").fetchall() == [(1, "a1")]
    assert open(os.path.join(d, "a1")).read() == "attachment 1"

    # abort: neither survives
    with pytest.raises(RuntimeError):
        with txfs.transaction(mount=d):
            conn.execute("INSERT INTO msg VALUES (2, 'a2')")
            with open(os.path.join(d, "a2"), "w") as f:
                f.write("attachment 2")
            raise RuntimeError("application gives up")
    assert connect(db).execute("SELECT id FROM msg").fetchall() == [(1,)]
    assert not os.path.exists(os.path.join(d, "a2"))
    assert conn.execute("SELECT id FROM msg").fetchall() == [(1,)]

    # an SQLite ROLLBACK inside the application's transaction leaves it alive
    with txfs.transaction(mount=d):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO msg VALUES (3, 'x')")
        conn.execute("ROLLBACK")
        with open(os.path.join(d, "a3"), "w") as f:
            f.write("3")
        conn.execute("INSERT INTO msg VALUES (4, 'a3')")
    assert connect(db).execute("SELECT id FROM msg").fetchall() == [(1,), (4,)]
    assert os.path.exists(os.path.join(d, "a3"))
    assert side_files(db) == ["a1", "a3"]


def test_listing6_in_c(db: str) -> None:
    prog = HERE / "listing6"
    if not prog.exists():
        pytest.skip("tests/listing6 not built (make -C clients/sqlite test builds it)")
    out = subprocess.run([str(prog), EXT, db, "3", "25"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    conn = connect(db)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM msg").fetchone() == (75, 75)
    d = os.path.dirname(db)
    files = [n for n in os.listdir(d) if n.startswith("m")]
    assert sorted(files) == sorted(f"m{i}" for (i,) in conn.execute("SELECT id FROM msg"))


def test_listing6_python_retry_loop_under_contention(db: str) -> None:
    """The README's Listing 6 loop, from three threads at once."""
    d = os.path.dirname(db)
    connect(db).execute("CREATE TABLE msg(id INTEGER PRIMARY KEY, path)")
    retries = []

    def store_all(t: int) -> None:
        conn = connect(db)
        n = 0
        for i in range(15):
            msg_id = t * 100 + i
            while True:
                try:
                    with txfs.transaction(mount=d):
                        with open(os.path.join(d, f"m{msg_id}"), "w") as f:
                            f.write(str(msg_id))
                        conn.execute("INSERT INTO msg VALUES (?, ?)", (msg_id, f"m{msg_id}"))
                    break
                except txfs.Conflict:
                    n += 1
                except sqlite3.OperationalError as e:
                    if not txfs_sqlite.is_busy(e):
                        raise
                    n += 1
        retries.append(n)

    threads = [threading.Thread(target=store_all, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(retries) == 3  # no thread died
    rows = connect(db).execute("SELECT path FROM msg ORDER BY id").fetchall()
    assert len(rows) == 45
    assert sorted(n for n in os.listdir(d) if n.startswith("m")) == sorted(p for (p,) in rows)
    assert connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    print(f"retries per thread: {retries}")


def test_gathered_writes_read_back_roll_back_and_commit_whole(db: str) -> None:
    """V6: a transaction's pages reach the daemon in runs. Reads, the file's
    size and the commit see every gathered page; a rollback sends none."""
    conn = connect(db)
    conn.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB)")
    with conn:
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, bytes([i % 251]) * 900) for i in range(4000)])
    size = os.path.getsize(db)
    # Scattered and contiguous pages in one transaction, read back inside it.
    conn.execute("BEGIN")
    conn.executemany("UPDATE t SET v = ? WHERE k = ?", [(b"\xff" * 900, k) for k in range(0, 4000, 7)])
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(k, b"n" * 3000) for k in range(10000, 10500)])
    assert conn.execute("SELECT count(*) FROM t WHERE v = ?", (b"\xff" * 900,)).fetchone() == (572,)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (4500,)
    conn.execute("ROLLBACK")
    assert os.path.getsize(db) == size, "a rolled-back transaction grew the file"
    other = connect(db)
    assert other.execute("SELECT count(*), sum(length(v)) FROM t").fetchone() == (4000, 4000 * 900)
    # The same transaction committed: whole, seen by a fresh connection.
    with conn:
        conn.executemany("UPDATE t SET v = ? WHERE k = ?", [(b"\xff" * 900, k) for k in range(0, 4000, 7)])
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(k, b"n" * 3000) for k in range(10000, 10500)])
    fresh = connect(db)
    assert fresh.execute("SELECT count(*) FROM t WHERE v = ?", (b"\xff" * 900,)).fetchone() == (572,)
    assert fresh.execute("SELECT count(*) FROM t").fetchone() == (4500,)
    assert fresh.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_two_connections_with_warm_caches_see_each_others_commits(db: str) -> None:
    """The VFS gives each connection a 64 MiB page cache (reads do not cross
    into the daemon). A cache is valid only while the file's change counter
    is the one it was read under: alternate writers over a table far larger
    than SQLite's default 2 MB cache must always read the other's last commit."""
    a, b = connect(db), connect(db)
    assert a.execute("PRAGMA cache_size").fetchone() == (-65536,)
    a.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v INTEGER, pad BLOB)")
    with a:
        a.executemany("INSERT INTO t VALUES (?, 0, zeroblob(1000))", [(i,) for i in range(6000)])
    for conn in (a, b):  # warm both caches with the whole table
        assert conn.execute("SELECT sum(length(pad)) FROM t").fetchone() == (6_000_000,)
    rng = __import__("random").Random(5)
    for step in range(200):
        writer, reader = (a, b) if step % 2 == 0 else (b, a)
        k = rng.randrange(6000)
        with writer:
            writer.execute("UPDATE t SET v = ? WHERE k = ?", (step + 1, k))
        assert reader.execute("SELECT v FROM t WHERE k = ?", (k,)).fetchone() == (step + 1,), f"step {step}"
    assert b.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_hot_journal_left_by_another_vfs_is_not_ignored(db: str) -> None:
    """V8: the VFS answers "no journal" itself only for databases that had
    none when it opened them. One left with a hot rollback journal by the
    default VFS (a writer killed mid-transaction) must still be refused, not
    read as if the half-written pages were whole."""
    script = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA journal_mode=DELETE'); c.execute('PRAGMA cache_size=10')\n"
        "c.execute('CREATE TABLE t(x)')\n"
        "c.executemany('INSERT INTO t VALUES (?)', [(b'a' * 900,) for _ in range(2000)])\n"
        "c.execute('BEGIN'); c.execute('UPDATE t SET x = ?', (b'b' * 900,))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, db], check=True)
    assert os.path.getsize(db + "-journal") > 0, "the killed writer left a hot journal"
    with pytest.raises(sqlite3.DatabaseError):
        connect(db).execute("SELECT count(*) FROM t WHERE x = ?", (b"a" * 900,)).fetchone()
    # The default VFS rolls it back; then the txfs VFS opens it normally.
    plain = sqlite3.connect(db)
    assert plain.execute("SELECT count(*) FROM t WHERE x = ?", (b"a" * 900,)).fetchone() == (2000,)
    plain.close()
    assert not os.path.exists(db + "-journal")
    assert connect(db).execute("SELECT count(*) FROM t").fetchone() == (2000,)


def test_sqlite_under_txfs_run_joins_the_run(db: str, txfs_mount) -> None:
    """Under `txfs run` a SQLite connection's levels nest into the run's
    transaction (V3, with BEGIN_STATE's prior_tx under V7): its read-only
    statements must not abort the run, its commits only leave their level,
    and the run's exit commits it all. With the view (root) and without."""
    from conftest import DEFAULT_BIN
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    conn = connect(db)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    script = (
        f"import sys; sys.path[:0] = [{str(HERE.parent)!r}, {str(HERE.parent.parent / 'python')!r}]\n"
        "import sqlite3, txfs_sqlite\n"
        f"txfs_sqlite.load({EXT!r})\n"
        f"c = sqlite3.connect('file:{db}?vfs=txfs', uri=True, isolation_level=None)\n"
        "n = c.execute('SELECT count(*) FROM t').fetchone()[0]\n"
        "c.execute('INSERT INTO t VALUES (2)')\n"
        "c.execute('BEGIN'); c.execute('INSERT INTO t VALUES (3)'); c.execute('COMMIT')\n"
        "print(n, c.execute('SELECT sum(x) FROM t').fetchone()[0])\n"
    )
    want_sum = 1
    for view in ("1", "0"):
        env = dict(os.environ, TXFS_RUN_VIEW=view)
        out = subprocess.run([binary, "run", "--mount", txfs_mount.mnt, "--retries", "0", "--", sys.executable,
                              "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"view={view}: {out.returncode}: {out.stderr}"
        want_sum += 5
        assert out.stdout.split()[1] == str(want_sum), f"view={view}: {out.stdout}"
        assert connect(db).execute("SELECT sum(x) FROM t").fetchone() == (want_sum,), f"view={view}: committed"
    assert "aborted" not in open(txfs_mount.log).read().split("process tree transaction")[-1]


def test_a_commit_that_frees_pages_shrinks_the_file(db: str) -> None:
    """The pager truncates the file after its commit point (commit phase two);
    that truncate must reach the file, not vanish with an aborted level."""
    con = connect(db)
    con.execute("CREATE TABLE t(x)")
    con.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) "
                "INSERT INTO t SELECT randomblob(1000) FROM n")
    big = os.path.getsize(db)
    assert big > 3_000_000
    con.execute("DELETE FROM t")
    con.execute("VACUUM")
    small = os.path.getsize(db)
    assert small <= 16384, f"VACUUM left {small} bytes (was {big})"
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # auto_vacuum=FULL shrinks at every commit that frees pages
    con.execute("PRAGMA auto_vacuum=FULL")
    con.execute("VACUUM")
    con.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) "
                "INSERT INTO t SELECT randomblob(1000) FROM n")
    grown = os.path.getsize(db)
    con.execute("DELETE FROM t WHERE rowid > 100")
    after = os.path.getsize(db)
    assert after < grown // 4, f"{grown} -> {after}"
    # another connection sees a valid database of the committed size
    other = connect(db)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (100,)
    assert other.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    other.close()
    con.close()



def test_a_shrink_racing_another_commit_cuts_none_of_its_pages(db: str) -> None:
    """Without locks, another process may commit between one connection's
    commit point and its truncate (V11): that truncate must not cut the
    other's pages. One process shrinks the file at every other commit while
    another grows it; every row the grower committed must be there."""
    con = connect(db)
    con.execute("PRAGMA auto_vacuum=FULL")
    con.execute("VACUUM")
    con.execute("CREATE TABLE t(x)")
    con.execute("CREATE TABLE u(i INTEGER PRIMARY KEY, b)")
    for rnd in range(1, 4):  # the window is narrow: one round hits it about half the time
        churn = subprocess.Popen(WORKER + ["churn", db, "400", "t"], stderr=subprocess.PIPE, text=True)
        grow = subprocess.run(WORKER + ["grow", db, "1000", str(rnd * 1000)], capture_output=True, text=True,
                              timeout=300)
        _, err = churn.communicate(timeout=300)
        assert churn.returncode == 0, err[-2000:]
        assert grow.returncode == 0, grow.stderr[-2000:]
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert con.execute("SELECT count(*), sum(length(b)) FROM u").fetchone() == (rnd * 1000, rnd * 3_000_000)
    assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)
    con.close()
