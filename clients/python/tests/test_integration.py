"""Integration tests against a real txfs mount (see conftest.txfs_mount).

Other processes are the outside observers: a transaction's effects must be
invisible to them (through stat, cat, ls and Python's os calls) until it
commits, then visible all at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import pytest

import txfs
from txfs import _wire

from conftest import DEFAULT_BIN, TxfsMount

pytestmark = pytest.mark.integration

TIMEOUT = 60
T = TypeVar("T")


def run(cmd: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def outside_view(paths: List[str], listdir: str) -> Dict[str, object]:
    """What another process sees: stat/cat exit codes, ls output, Python's view."""
    code = textwrap.dedent(
        """
        import json, os, sys
        paths, d = json.loads(sys.argv[1]), sys.argv[2]
        def read(p):
            try:
                with open(p) as f:
                    return f.read()
            except OSError as e:
                return "errno:%d" % e.errno
        print(json.dumps({
            "exists": [os.path.exists(p) for p in paths],
            "read": [read(p) if not os.path.isdir(p) else "<dir>" for p in paths],
            "listdir": sorted(os.listdir(d)),
        }))
        """
    )
    py = run([sys.executable, "-c", code, json.dumps(paths), listdir])
    assert py.returncode == 0, py.stderr
    view: Dict[str, object] = json.loads(py.stdout)
    view["stat"] = [run(["stat", p]).returncode for p in paths]
    view["cat"] = [run(["cat", p]).stdout for p in paths]  # (a directory: "")
    view["ls"] = sorted(run(["ls", "-a", listdir]).stdout.split())
    return view


def write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_several_mounts_the_current_directorys(
    work: str, second_mount: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two real mounts, no TXFS_MOUNT: begin takes the one holding the
    # current directory; outside both, ENOTUNIQ naming them
    monkeypatch.delenv("TXFS_MOUNT")
    mnt = txfs.find_mount(work)
    monkeypatch.chdir(work)
    assert txfs.find_mount() == mnt
    with txfs.transaction():
        with open("chosen", "w") as f:
            f.write("x")
    assert os.path.exists(os.path.join(work, "chosen"))
    monkeypatch.chdir(second_mount)
    assert txfs.find_mount() == second_mount
    with txfs.transaction():
        with open("chosen2", "w") as f:
            f.write("y")
    assert os.listdir(second_mount) == ["chosen2"]
    monkeypatch.chdir(os.path.dirname(second_mount))
    with pytest.raises(OSError) as ei:
        txfs.begin()
    assert ei.value.errno == errno.ENOTUNIQ
    assert mnt in str(ei.value) and second_mount in str(ei.value), ei.value
    assert not txfs.in_transaction()


def _cat(path: str) -> str:
    # another process's view of the file
    return subprocess.run(["cat", path], capture_output=True, text=True, check=True).stdout


def test_atomic_write_on_txfs_is_one_transaction(work: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target = os.path.join(work, "config")
    write(target, "old")
    os.chmod(target, 0o640)
    commits = txfs.status()["commits"]
    fsyncs: list = []
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd))
    with txfs.atomic_write(target) as f:
        assert txfs.in_transaction(), "a transaction, not the rename dance"
        f.write("new ")
        f.flush()
        assert _cat(target) == "old", "others see the old file until the end"
        f.write("content")
    assert not txfs.in_transaction()
    assert _cat(target) == "new content"
    assert txfs.status()["commits"] > commits
    assert fsyncs == [], "a durable commit needs no fsync"
    assert sorted(os.listdir(work)) == ["config"], "no temporary file"
    assert (os.stat(target).st_mode & 0o777) == 0o640
    # an exception: nothing changes, the transaction is gone
    with pytest.raises(RuntimeError):
        with txfs.atomic_write(target, "wb") as fb:
            fb.write(b"half")
            raise RuntimeError("boom")
    assert _cat(target) == "new content"
    assert not txfs.in_transaction()
    with pytest.raises(FileExistsError):
        with txfs.atomic_write(target, "x") as f:
            f.write("x")  # pragma: no cover
    assert _cat(target) == "new content" and not txfs.in_transaction()


def test_isolation_from_another_process(work: str) -> None:
    a, b, c, e, f, d = (os.path.join(work, n) for n in ("a.txt", "b.txt", "c.txt", "e.txt", "f.txt", "dir"))
    inner = os.path.join(d, "inner.txt")
    write(b, "old b")
    write(c, "to be unlinked")
    write(e, "to be renamed")
    paths = [a, b, c, e, f, d, inner]
    before = outside_view(paths, work)
    assert before["exists"] == [False, True, True, True, False, False, False]
    assert before["listdir"] == ["b.txt", "c.txt", "e.txt"]
    with txfs.transaction() as tx:
        assert tx.mount is not None and os.path.samefile(tx.mount, os.environ["TXFS_MOUNT"])
        write(a, "new a")
        write(b, "new b")
        os.unlink(c)
        os.rename(e, f)
        os.mkdir(d)
        write(inner, "inner")
        write(os.path.join(work, "tmp.txt"), "appears and vanishes inside the transaction")
        os.unlink(os.path.join(work, "tmp.txt"))
        # the transaction sees its own changes
        assert read(a) == "new a" and read(b) == "new b" and read(f) == "to be renamed"
        assert sorted(os.listdir(work)) == ["a.txt", "b.txt", "dir", "f.txt"]
        during = outside_view(paths, work)
        assert during == before, "another process saw uncommitted changes"
    after = outside_view(paths, work)
    assert after["exists"] == [True, True, False, False, True, True, True]
    assert after["stat"] == [0, 0, 1, 1, 0, 0, 0]
    assert after["read"] == ["new a", "new b", "errno:2", "errno:2", "to be renamed", "<dir>", "inner"]
    assert after["cat"] == ["new a", "new b", "", "", "to be renamed", "", "inner"]
    assert after["listdir"] == ["a.txt", "b.txt", "dir", "f.txt"]
    assert after["ls"] == [".", "..", "a.txt", "b.txt", "dir", "f.txt"]


def test_isolation_from_another_thread(work: str) -> None:
    f = os.path.join(work, "f")
    seen: List[bool] = []

    def look() -> None:
        seen.append(os.path.exists(f))

    with txfs.transaction():
        write(f, "x")
        t = threading.Thread(target=look)
        t.start()
        t.join(TIMEOUT)
    t = threading.Thread(target=look)
    t.start()
    t.join(TIMEOUT)
    assert seen == [False, True]


def test_thread_exiting_inside_a_transaction_aborts_it(work: str, mnt: str) -> None:
    """SPEC §2: a thread that exits with a transaction open aborts it."""
    f = os.path.join(work, "orphan")
    live_before = txfs.status(mnt)["live_txs"]

    def leave_open() -> None:
        txfs.begin()
        write(f, "orphaned")

    t = threading.Thread(target=leave_open)
    t.start()
    t.join(TIMEOUT)
    deadline = time.monotonic() + 60
    while txfs.status(mnt)["live_txs"] > live_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert txfs.status(mnt)["live_txs"] <= live_before, "the dead thread's transaction is still live"
    assert not os.path.exists(f)
    assert outside_view([f], work)["exists"] == [False]
    # and nothing it touched is held: a new transaction may write the same name
    with txfs.transaction():
        write(f, "mine")
    assert read(f) == "mine"


def _backing_names(backing: str) -> List[str]:
    out = []
    for root, dirs, files in os.walk(backing):
        if root == backing and ".txfs" in dirs:
            dirs.remove(".txfs")
        out.extend(dirs)
        out.extend(files)
    return out


def test_abort_leaves_no_trace(work: str, txfs_mount: TxfsMount) -> None:
    keep = os.path.join(work, "keep")
    write(keep, "kept")
    before = sorted(os.listdir(work))
    tag = "aborted-" + os.urandom(4).hex()
    txfs.begin()
    try:
        write(os.path.join(work, tag + ".file"), "gone")
        os.mkdir(os.path.join(work, tag + ".dir"))
        write(os.path.join(work, tag + ".dir", tag + ".inner"), "gone")
        write(keep, "overwritten")
        os.symlink("keep", os.path.join(work, tag + ".link"))
        os.unlink(keep)
        assert not os.path.exists(keep)
    finally:
        txfs.abort()
    assert not txfs.in_transaction()
    assert txfs.state()["depth"] == 0
    assert sorted(os.listdir(work)) == before
    assert read(keep) == "kept"
    view = outside_view([keep, os.path.join(work, tag + ".file")], work)
    assert view["read"] == ["kept", "errno:%d" % errno.ENOENT]
    assert view["listdir"] == before
    assert not [n for n in _backing_names(txfs_mount.backing) if tag in n], "aborted names in BACKING"


def test_exception_in_with_block_aborts(work: str) -> None:
    f = os.path.join(work, "f")
    with pytest.raises(ZeroDivisionError):
        with txfs.transaction():
            write(f, "never")
            1 / 0
    assert not os.path.exists(f)
    assert not txfs.in_transaction()
    assert txfs.state()["depth"] == 0
    assert outside_view([f], work)["exists"] == [False]


def test_nested_transactions_flatten(work: str) -> None:
    f, g = os.path.join(work, "f"), os.path.join(work, "g")
    with txfs.transaction():
        with txfs.transaction():
            write(f, "inner")
            assert txfs.state()["depth"] == 2
        assert txfs.state()["depth"] == 1
        assert outside_view([f], work)["exists"] == [False], "inner commit published"
        write(g, "outer")
    assert outside_view([f, g], work)["read"] == ["inner", "outer"]


def test_ordered_commit_and_sync(work: str, mnt: str) -> None:
    f = os.path.join(work, "f")
    with txfs.transaction(durable=False, mount=work):
        write(f, "ordered")
    assert outside_view([f], work)["read"] == ["ordered"]
    txfs.sync(mnt)
    txfs.sync(f)
    txfs.sync()


def test_status_counters(work: str, mnt: str) -> None:
    s0 = txfs.status(mnt)
    assert set(s0) == {
        "commits",
        "aborts",
        "conflicts",
        "live_txs",
        "journal_bytes",
        "journal_syncs",
        "checkpoints",
        "last_seq",
    }
    with txfs.transaction():
        assert txfs.status()["live_txs"] >= 1
        st = txfs.state()
        assert st["tx"] != 0 and st["depth"] == 1
        write(os.path.join(work, "f"), "x")
    s1 = txfs.status(work)
    assert s1["commits"] >= s0["commits"] + 1
    assert s1["last_seq"] >= s0["last_seq"]


def test_bad_mounts(mnt: str, work: str) -> None:
    with pytest.raises(OSError) as ei:
        txfs.begin("/proc")
    assert ei.value.errno == errno.ENOTTY
    with pytest.raises(OSError) as ei:
        txfs.begin(os.path.join(work, "missing", "x"))
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(OSError) as ei:
        txfs.commit()  # no transaction: the daemon says so
    assert not txfs.in_transaction()


# ---- conflicts --------------------------------------------------------------------


def _increment(path: str, barrier: Optional[threading.Barrier]) -> None:
    with txfs.transaction():
        with open(path, "r+") as f:
            v = int(f.read().strip() or 0)
            if barrier is not None:
                barrier.wait(TIMEOUT)  # both have read before either writes
            f.seek(0)
            f.write(f"{v + 1}\n")
            f.truncate()


def _race(n: int, target: Callable[[int], None]) -> List[Optional[BaseException]]:
    results: List[Optional[BaseException]] = [None] * n

    def body(i: int) -> None:
        try:
            target(i)
        except BaseException as e:  # noqa: B902 - reported to the test
            results[i] = e

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a transaction thread hung"
    return results


def test_conflict_for_one_of_two_threads_then_retry(work: str) -> None:
    counter = os.path.join(work, "counter")
    write(counter, "0\n")
    barrier = threading.Barrier(2)
    results = _race(2, lambda i: _increment(counter, barrier))
    conflicts = [r for r in results if isinstance(r, txfs.Conflict)]
    others = [r for r in results if r is not None and not isinstance(r, txfs.Conflict)]
    assert not others, f"unexpected errors: {others!r}"
    assert len(conflicts) == 1, f"want exactly one Conflict, got {results!r}"
    assert conflicts[0].errno == errno.EDEADLK
    assert read(counter) == "1\n"
    assert not txfs.in_transaction()

    # the same race with retry(): both increments land
    attempts = [0, 0]
    barrier2 = threading.Barrier(2)

    def with_retry(i: int) -> None:
        def once() -> None:
            attempts[i] += 1
            _increment(counter, barrier2 if attempts[i] == 1 else None)

        txfs.retry(once, attempts=20, backoff=0.005)

    results = _race(2, with_retry)
    assert results == [None, None], results
    assert read(counter) == "3\n"
    assert sum(attempts) >= 3, f"nobody retried: {attempts}"
    assert outside_view([counter], work)["read"] == ["3\n"]


def test_transactional_decorator_retries(work: str) -> None:
    counter = os.path.join(work, "counter")
    write(counter, "0\n")
    barrier = threading.Barrier(2)
    calls = [0, 0]

    @txfs.transactional(attempts=20, backoff=0.005)
    def bump(i: int) -> None:
        calls[i] += 1
        with open(counter, "r+") as f:
            v = int(f.read())
            if calls[i] == 1:
                barrier.wait(TIMEOUT)
            f.seek(0)
            f.write(f"{v + 1}\n")

    results = _race(2, bump)
    assert results == [None, None], results
    assert read(counter) == "2\n"
    assert sum(calls) >= 3


# ---- sqlite ------------------------------------------------------------------------

ROWS = 500


def _make_db(path: str) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    con.executemany("INSERT INTO t (id, v) VALUES (?, ?)", ((i, f"value {i} " + "x" * 100) for i in range(ROWS)))
    con.commit()
    con.close()


def _db_state(path: str) -> Tuple[str, int, str]:
    """(integrity_check, row count, digest of all rows), read from another process."""
    code = textwrap.dedent(
        """
        import hashlib, sqlite3, sys
        con = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True)
        ok = con.execute("PRAGMA integrity_check").fetchone()[0]
        n = con.execute("SELECT count(*) FROM t").fetchone()[0]
        h = hashlib.sha256()
        for row in con.execute("SELECT id, v FROM t ORDER BY id"):
            h.update(repr(row).encode())
        print(ok, n, h.hexdigest())
        """
    )
    r = run([sys.executable, "-c", code, path])
    assert r.returncode == 0, r.stderr
    ok, n, digest = r.stdout.split()
    return ok, int(n), digest


def test_sqlite_inside_transaction(work: str) -> None:
    db = os.path.join(work, "app.db")
    _make_db(db)
    before = _db_state(db)
    assert before[:2] == ("ok", ROWS)
    with txfs.transaction():
        con = sqlite3.connect(db)
        con.execute("UPDATE t SET v = 'updated' WHERE id < 100")
        con.executemany("INSERT INTO t (v) VALUES (?)", (("new",) for _ in range(50)))
        con.commit()
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == ROWS + 50
        con.close()
        assert _db_state(db) == before, "another process saw the uncommitted database"
    after = _db_state(db)
    assert after[:2] == ("ok", ROWS + 50)
    assert not os.path.exists(db + "-journal")


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_sqlite_connection_opened_before_the_transaction(work: str, journal_mode: str) -> None:
    """The TxFS paper's mail client: a SQLite database held open by the
    application (default VFS) and an attachment file, changed in one
    transaction. SQLite refuses to write a database whose st_ino changed
    under its connection (SQLITE_READONLY_DBMOVED), so the file must show
    one inode number inside the transaction and out."""
    db = os.path.join(work, "mail.db")
    _make_db(db)
    con = sqlite3.connect(db, isolation_level=None)
    assert con.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0] == journal_mode
    outside = os.stat(db)
    attachment = os.path.join(work, "attachment.bin")
    with txfs.transaction():
        inside = os.stat(db)
        assert (inside.st_ino, inside.st_dev) == (outside.st_ino, outside.st_dev)
        assert os.stat(work).st_ino == os.stat(work).st_ino
        con.execute("BEGIN")
        con.execute("INSERT INTO t (v) VALUES ('mail with attachment')")
        con.execute("COMMIT")
        write(attachment, "attached bytes\n")
        assert os.stat(attachment).st_ino == os.stat(attachment).st_ino
        assert not _outside_exists(attachment), "another process saw the uncommitted attachment"
        if journal_mode == "delete":
            # (WAL's index is memory shared with every connection through a
            # mapping made before the transaction: see the test below.)
            assert _db_state(db)[1] == ROWS, "another process saw the uncommitted row"
    assert os.stat(db).st_ino == outside.st_ino
    assert _db_state(db)[1] == ROWS + 1 and read(attachment) == "attached bytes\n"
    con.close()


@pytest.mark.parametrize(
    "journal_mode",
    ["delete", pytest.param("wal", marks=pytest.mark.xfail(strict=True, reason="issue 24: a shared mapping made before the transaction (WAL's -shm) is not the transaction's"))],
)
def test_sqlite_transaction_aborted_leaves_neither_row_nor_attachment(work: str, journal_mode: str) -> None:
    db = os.path.join(work, "mail.db")
    _make_db(db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute(f"PRAGMA journal_mode={journal_mode}")
    attachment = os.path.join(work, "attachment.bin")
    write(attachment, "kept\n")
    try:
        with txfs.transaction():
            con.execute("INSERT INTO t (v) VALUES ('never sent')")
            os.unlink(attachment)
            raise KeyError("abort")
    except KeyError:
        pass
    assert read(attachment) == "kept\n"
    assert _db_state(db)[:2] == ("ok", ROWS)
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == ROWS
    con.close()


def test_sqlite_error_in_a_transaction_that_lost_a_conflict_is_a_conflict(work: str) -> None:
    """Another process commits a row while a transaction reads the same
    database: the transaction's next read of a changed page fails with
    EDEADLK, which SQLite reports as "disk I/O error" (sqlite3.OperationalError).
    That error is the lost conflict's: the block raises Conflict, and
    txfs.transactional runs it again, which then commits."""
    db = os.path.join(work, "mail.db")
    _make_db(db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA cache_size=0")  # every statement reads the file
    tries = []

    @txfs.transactional(attempts=5)
    def send() -> None:
        tries.append(1)
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] >= ROWS
        if len(tries) == 1:  # someone else commits meanwhile
            r = run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                     "c.execute(\"UPDATE t SET v = 'other' WHERE id < 400\"); c.commit()", db])
            assert r.returncode == 0, r.stderr
        con.execute("INSERT INTO t (v) VALUES ('sent')")

    send()
    assert len(tries) >= 2, "the conflict was not retried"
    assert _db_state(db)[:2] == ("ok", ROWS + 1)
    with pytest.raises(txfs.Conflict) as info:
        with txfs.transaction():
            con.execute("SELECT count(*) FROM t").fetchone()
            r = run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                     "c.execute(\"UPDATE t SET v = 'again' WHERE id < 400\"); c.commit()", db])
            assert r.returncode == 0, r.stderr
            con.execute("SELECT sum(length(v)) FROM t").fetchone()
    assert isinstance(info.value.__cause__, sqlite3.Error), repr(info.value.__cause__)
    con.close()


def _outside_exists(path: str) -> bool:
    r = run([sys.executable, "-c", "import os, sys; print(os.path.exists(sys.argv[1]))", path])
    return r.stdout.strip() == "True"


WRITER = textwrap.dedent(
    """
    import os, sqlite3, sys, time
    import txfs
    db, mode = sys.argv[1], sys.argv[2]
    txfs.begin()                                  # $TXFS_MOUNT
    con = sqlite3.connect(db, isolation_level=None)
    if mode == "committed":
        # a whole sqlite transaction, committed by sqlite (fsyncs and all),
        # but the txfs transaction stays open: then SIGKILL
        con.execute("BEGIN")
        con.execute("DELETE FROM t WHERE id % 3 = 0")
        con.execute("UPDATE t SET v = 'changed' WHERE id % 3 = 1")
        con.executemany("INSERT INTO t (v) VALUES (?)", (("added" * 50,) for _ in range(2000)))
        con.execute("COMMIT")
        print("ready", flush=True)
    else:
        # busy: killed somewhere inside sqlite transactions, journal and all
        i = 0
        while True:
            con.execute("BEGIN")
            con.executemany("INSERT INTO t (v) VALUES (?)", (("busy%d" % i,) for _ in range(200)))
            con.execute("UPDATE t SET v = 'busy' WHERE id %% 7 = %d" % (i % 7))
            if i == 3:
                print("ready", flush=True)
            con.execute("COMMIT" if i % 2 else "ROLLBACK")
            i += 1
    time.sleep(120)
    """
)


@pytest.mark.parametrize("mode", ["committed", "busy"])
def test_sqlite_writer_killed_mid_transaction(work: str, mnt: str, child_env: Dict[str, str], mode: str) -> None:
    db = os.path.join(work, "kill.db")
    _make_db(db)
    before = _db_state(db)
    assert before[:2] == ("ok", ROWS)
    live_before = txfs.status(mnt)["live_txs"]
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, db, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", f"writer: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        if mode == "committed":
            # sqlite committed inside the open txfs transaction: nobody sees it
            assert _db_state(db) == before
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    # the daemon aborts the dead thread's transaction
    deadline = time.monotonic() + 60
    while txfs.status(mnt)["live_txs"] > live_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert txfs.status(mnt)["live_txs"] <= live_before, "the killed writer's transaction is still live"
    after = _db_state(db)
    assert after == before, f"database changed: {before} -> {after}"
    assert sorted(os.listdir(work)) == ["kill.db"], "leftovers (hot journal?)"
    # and it is still an ordinary, writable database
    con = sqlite3.connect(db)
    con.execute("INSERT INTO t (v) VALUES ('after')")
    con.commit()
    con.close()
    assert _db_state(db)[:2] == ("ok", ROWS + 1)


# ---- kernel caches ---------------------------------------------------------------------

OBSERVER = textwrap.dedent(
    """
    import json, mmap, os, sys
    path = sys.argv[1]
    fd = os.open(path, os.O_RDONLY)          # opened before the transaction began
    os.pread(fd, 4096, 0)                    # and its pages cached
    try:
        m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        m[:len(m)]                           # fault the pages in
    except OSError as e:                     # checked by test_read_only_mmap
        m = None
        mmap_error = "errno:%d" % e.errno
    print("ready", flush=True)
    for line in sys.stdin:
        st = os.fstat(fd)
        fresh = os.open(path, os.O_RDONLY)
        try:
            fresh_data = os.pread(fresh, 4096, 0).decode()
        finally:
            os.close(fresh)
        print(json.dumps({
            "pread": os.pread(fd, 4096, 0).decode(),
            "fstat_size": st.st_size,
            "stat_size": os.stat(path).st_size,
            "fresh": fresh_data,
            "mmap": m[:len(m)].decode() if m is not None else mmap_error,
        }), flush=True)
    """
)


def test_isolation_through_cached_pages_and_open_fds(work: str) -> None:
    """An observer that opened, read and mmapped the file before the
    transaction must not see the transaction's writes through its page cache,
    its old descriptor or its mapping until the commit."""
    f = os.path.join(work, "cached")
    write(f, "committed v1")
    obs = subprocess.Popen(
        [sys.executable, "-c", OBSERVER, f], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert obs.stdin is not None and obs.stdout is not None

    def ask() -> Dict[str, object]:
        assert obs.stdin is not None and obs.stdout is not None
        obs.stdin.write("?\n")
        obs.stdin.flush()
        answer: Dict[str, object] = json.loads(obs.stdout.readline())
        return answer

    try:
        assert obs.stdout.readline().strip() == "ready"
        base = ask()
        mmap_ok = base.pop("mmap") == "committed v1"
        assert base == {"pread": "committed v1", "fstat_size": 12, "stat_size": 12, "fresh": "committed v1"}
        with txfs.transaction():
            with open(f, "r+") as w:
                w.write("UNCOMMITTED")  # same size region, page already cached elsewhere
            with open(f, "a") as w:
                w.write(" and longer")
            assert read(f) == "UNCOMMITTED1 and longer"
            during = ask()
            during_mmap = during.pop("mmap")
            assert during == base, f"uncommitted data leaked: {during}"
            if mmap_ok:
                assert during_mmap == "committed v1", f"uncommitted data leaked into a mapping: {during_mmap}"
        after = ask()
        assert after["fresh"] == "UNCOMMITTED1 and longer"
        assert after["stat_size"] == len("UNCOMMITTED1 and longer")
        assert after["pread"] == "UNCOMMITTED1 and longer", f"stale after commit: {after}"
    finally:
        obs.stdin.close()
        obs.wait(TIMEOUT)
        obs.stdout.close()


@pytest.mark.parametrize("shared", [False, True], ids=["MAP_PRIVATE", "MAP_SHARED"])
def test_read_only_mmap(work: str, shared: bool) -> None:
    """SPEC §3: read-only mmap works, shared or private, outside and inside
    a transaction (MAP_SHARED is what Python's mmap, SQLite's mmap_size and
    LMDB use); inside, the mapping shows the transaction's own writes."""
    import mmap

    flags = mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE
    f = os.path.join(work, "mapped")
    write(f, "mapped data")
    with open(f, "rb") as r:
        with mmap.mmap(r.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as m:
            assert m[:] == b"mapped data"
    with txfs.transaction():
        write(f, "tx data")
        with open(f, "rb") as r:
            with mmap.mmap(r.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as m:
                assert m[:] == b"tx data"
                # Others reading with read(2) still see the committed data.
                other = subprocess.run(["cat", f], capture_output=True, text=True, timeout=TIMEOUT)
                assert other.stdout == "mapped data"
    assert read(f) == "tx data"


def _mount_fds(mnt: str) -> list[int]:
    """This process's descriptors of the mount root ``mnt``."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == mnt:
                out.append(int(name))
        except OSError:
            pass
    return sorted(out)


def _in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a new thread (which starts without a kept descriptor)
    and return its result, re-raising what it raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["v"] = fn()
        except BaseException as e:  # re-raised below
            box["e"] = e

    th = threading.Thread(target=run)
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def test_thread_keeps_one_mount_descriptor_and_closes_it_at_exit(mnt: str, work: str) -> None:
    """A transaction holds one descriptor of the mount root; the thread keeps
    it for its next transaction whichever way one ends (no OPENDIR per
    transaction, and never more than one), and closes it when it exits (a
    leaked one would keep the mount busy)."""
    before = _mount_fds(mnt)

    def body() -> list[int]:
        with txfs.transaction():
            during = _mount_fds(mnt)
            assert len(during) == len(before) + 1
            with txfs.transaction():
                assert _mount_fds(mnt) == during
        kept = _mount_fds(mnt)
        assert kept == during, "the descriptor is kept for the next transaction"
        assert fcntl.fcntl(next(iter(set(kept) - set(before))), fcntl.F_GETFL) & os.O_DSYNC, "marked for txfs umount"
        with pytest.raises(RuntimeError):
            with txfs.transaction():
                raise RuntimeError("abort")
        assert _mount_fds(mnt) == kept, "an abort keeps the same descriptor"
        with txfs.transaction():
            write(os.path.join(work, "f"), "x")
        assert _mount_fds(mnt) == kept, "a commit keeps the same descriptor"
        with pytest.raises(OSError):
            txfs.commit()
        assert _mount_fds(mnt) == kept
        return kept

    kept = _in_thread(body)
    assert len(kept) == len(before) + 1
    assert _mount_fds(mnt) == before, "the thread's exit closed its kept descriptor"
    assert read(os.path.join(work, "f")) == "x"


def test_forked_child_closes_kept_descriptors(mnt: str, work: str) -> None:
    """A forked child closes its copies of the parent's kept descriptors (it
    would hold the mount busy for its whole life) and opens its own."""
    with txfs.transaction():
        write(os.path.join(work, "parent"), "p")
    kept = _mount_fds(mnt)
    assert kept
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        code = 0
        try:
            os.close(r)
            inherited = _mount_fds(mnt)
            with txfs.transaction():
                write(os.path.join(work, "child"), "c")
            os.write(w, repr((inherited, len(_mount_fds(mnt)))).encode())
        except BaseException as e:
            os.write(w, repr(e).encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report
    inherited, after = eval(report)
    assert inherited == [], "the child closed the parent's kept descriptor at the fork"
    assert after == 1, "the child keeps its own"
    assert read(os.path.join(work, "child")) == "c"
    assert _mount_fds(mnt) == kept, "the parent's is untouched"
    with txfs.transaction():
        write(os.path.join(work, "parent"), "p2")
    assert _mount_fds(mnt) == kept


def test_kept_descriptor_number_reused_by_the_program_is_left_alone(mnt: str, work: str, tmp_path: Any) -> None:
    """A program that closes the kept descriptor behind the library's back and
    reuses its number gets to keep its own file: the library neither uses
    nor closes a descriptor that no longer names what it opened."""

    def body() -> None:
        with txfs.transaction():
            pass
        (kept,) = set(_mount_fds(mnt)) - set(before)
        other = str(tmp_path / "mine")  # off the mount: a txfs ioctl on it fails
        write(other, "my bytes")
        fd = os.open(other, os.O_RDONLY)
        os.dup2(fd, kept)  # closes the kept descriptor, reuses its number
        os.close(fd)
        with txfs.transaction():
            write(os.path.join(work, "g"), "y")
        assert os.pread(kept, 100, 0) == b"my bytes", "the reused number is still the program's"
        os.close(kept)

    before = _mount_fds(mnt)
    _in_thread(body)
    assert read(os.path.join(work, "g")) == "y"
    assert _mount_fds(mnt) == before


def test_thread_ending_inside_a_transaction_closes_its_descriptor(mnt: str, work: str) -> None:
    """A thread that ends without committing leaves no descriptor of the
    mount behind (the daemon aborts its transaction)."""
    before = _mount_fds(mnt)

    def body() -> None:
        txfs.begin()
        write(os.path.join(work, "never"), "x")

    for _ in range(5):
        _in_thread(body)
    assert _mount_fds(mnt) == before
    deadline = time.monotonic() + 60
    while txfs.status(mnt)["live_txs"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(os.path.join(work, "never"))


def test_a_number_reopened_by_another_thread_is_that_threads(mnt: str, work: str) -> None:
    """Thread A's kept descriptor is closed behind its back and the number
    goes to thread B's descriptor of the same root (same device, inode and
    mark): A's record must not close it when A ends, nor serve A's next
    transaction (B's transactions go on through it after A is gone)."""
    a_kept: list[int] = []
    go_a, a_done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def thread_a() -> None:
        try:
            with txfs.transaction():
                pass
            a_kept.extend(set(_mount_fds(mnt)) - set(before))
            go_a.wait(TIMEOUT)  # then A ends, still holding its record of n
        except BaseException as e:
            box["a"] = e
        finally:
            a_done.set()

    before = _mount_fds(mnt)
    ta = threading.Thread(target=thread_a)
    ta.start()
    deadline = time.monotonic() + TIMEOUT
    while not a_kept and ta.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    (n,) = a_kept
    os.close(n)  # behind the library's back

    def thread_b() -> int:
        with txfs.transaction():
            write(os.path.join(work, "b"), "B1")
        (mine,) = set(_mount_fds(mnt)) - set(before)
        assert mine == n, "B reopened the number A had"
        go_a.set()
        a_done.wait(TIMEOUT)
        ta.join(TIMEOUT)  # A has ended: its record is finalized
        assert os.readlink(f"/proc/self/fd/{n}") == mnt, "A closed B's descriptor"
        with txfs.transaction():
            write(os.path.join(work, "b"), "B2")
        assert set(_mount_fds(mnt)) - set(before) == {n}, "B's transactions go on through n"
        return n

    _in_thread(thread_b)
    if "a" in box:
        raise box["a"]
    assert read(os.path.join(work, "b")) == "B2"
    assert _mount_fds(mnt) == before


def test_exit_with_daemon_threads_in_transactions_does_not_hang(mnt: str, child_env: Dict[str, str]) -> None:
    """Daemon threads frozen at interpreter exit (perhaps inside the
    module's lock) must not hang the finalizers of their kept descriptors
    (review: 30 of 60 exits hung)."""
    script = textwrap.dedent(
        """
        import os, threading, txfs
        M = os.environ["TXFS_MOUNT"]
        def loop(i):
            while True:
                with txfs.transaction():
                    pass
        for i in range(8):
            threading.Thread(target=loop, args=(i,), daemon=True).start()
        with txfs.transaction():
            pass
        """
    )
    for _ in range(12):
        done = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr


def test_txfs_umount_detaches_a_mount_held_only_by_kept_descriptors(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``txfs umount`` of a mount this idle process still keeps a descriptor
    of succeeds; the next begin on that path is no longer on txfs, and a new
    mount there works at once."""
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    base = os.path.realpath(tempfile.mkdtemp(prefix="txfs-pytest-umount."))
    backing, point = os.path.join(base, "b"), os.path.join(base, "m")
    os.mkdir(backing)
    os.mkdir(point)

    def mount() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([binary, "mount", backing, point, "-f"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not any(e.point == point for e in txfs.read_mountinfo("/proc/self/mountinfo")):
            assert proc.poll() is None and time.monotonic() < deadline, "txfs did not mount"
            time.sleep(0.05)
        return proc

    proc = mount()
    try:
        with txfs.transaction(mount=point):
            write(os.path.join(point, "a"), "1")
        assert _mount_fds(point), "the thread keeps a descriptor of the mount"
        done = subprocess.run([binary, "umount", point], capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert proc.wait(timeout=TIMEOUT) == 0
        with pytest.raises(OSError) as ei:
            txfs.begin(point)
        assert ei.value.errno in (errno.ENOTTY, errno.ENODEV), ei.value
        proc = mount()
        with txfs.transaction(mount=point):
            write(os.path.join(point, "a"), "2")
        assert read(os.path.join(point, "a")) == "2"
        assert len(_mount_fds(point)) == 1, "the stale descriptor was replaced, not leaked"
    finally:
        subprocess.run([binary, "umount", point], capture_output=True, timeout=TIMEOUT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


# ---- the change set ------------------------------------------------------------------


def _record_len(c: txfs.Change) -> int:
    """Bytes of a change's record in the daemon's listing."""
    strs = sum(len(os.fsencode(s)) for s in (c.path, c.from_, c.old_target, c.target))
    names = sum(len(os.fsencode(x)) + 1 for x in c.xattrs)
    return _wire.TXFS_CHANGE_HEAD + 5 * 4 + strs + names


def test_changes_list_the_transaction_and_read_both_sides(work: str, mnt: str) -> None:
    rel = os.path.relpath(work, mnt)
    j = lambda name: os.path.join(work, name)  # noqa: E731
    write(j("mod"), "old content")
    write(j("ren"), "moved")
    write(j("del"), "doomed")
    with pytest.raises(OSError) as ei:
        txfs.changes()
    assert ei.value.errno == errno.EINVAL, "outside a transaction"
    txfs.begin()
    try:
        write(j("new"), "fresh")
        write(j("mod"), "new content, longer")
        os.rename(j("ren"), j("ren2"))
        os.unlink(j("del"))
        write(j("tmp"), "scratch")
        os.unlink(j("tmp"))
        listing = txfs.changes()
        assert not listing.lost
        got = list(listing)
        assert [c.path for c in got] == [f"{rel}/{n}" for n in ("del", "mod", "new", "ren2")]
        assert [c.index for c in got] == [0, 1, 2, 3]
        deleted, modified, created, renamed = got
        assert (deleted.status, deleted.what, deleted.old_size) == ("deleted", {"deleted"}, 6)
        assert deleted.what_bits == _wire.TXFS_CHANGE_DELETED and deleted.new_mode == 0
        # (a truncating open's setattr carries an mtime: not "times")
        assert modified.status == "modified" and modified.what == {"modified"}
        assert (modified.old_size, modified.new_size, modified.bytes_written) == (11, 19, 19)
        assert stat.S_ISREG(modified.kind) and stat.S_IMODE(modified.new_mode) == stat.S_IMODE(os.stat(j("mod")).st_mode)
        assert (created.status, created.new_size, created.old_mode) == ("created", 5, 0)
        assert (renamed.status, renamed.from_, renamed.new_size) == ("renamed", f"{rel}/ren", 5)
        assert all(c.target == c.old_target == "" and c.xattrs == () for c in got)
        assert next(listing, None) is None, "the end stays the end"

        assert modified.read_new() == b"new content, longer"
        assert modified.read_old() == b"old content"
        assert modified.read_new(4, 3) == b"con" and modified.read_new(100) == b""
        assert renamed.read_old() == b"moved" and deleted.read_old() == b"doomed"
        for side in (deleted.read_new, created.read_old):
            with pytest.raises(OSError) as ei:
                side()
            assert ei.value.errno == errno.ENOENT

        with open(j("mod"), "w") as f:  # a change: the next listing is new
            f.write("new content, longer")
        newer = txfs.changes()  # replaces the first listing's snapshot
        with pytest.raises(OSError) as ei:
            modified.read_new()
        assert ei.value.errno == errno.ESTALE
        assert [c.read_new() for c in newer if c.status == "modified"] == [b"new content, longer"]
    finally:
        txfs.abort()
    assert read(j("mod")) == "old content" and read(j("ren")) == "moved" and read(j("del")) == "doomed"
    assert sorted(os.listdir(work)) == ["del", "mod", "ren"]
    with pytest.raises(OSError) as ei:
        txfs.changes()
    assert ei.value.errno == errno.EINVAL


def test_changes_of_5000_files_are_fetched_a_page_at_a_time(
    work: str, mnt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = os.path.relpath(work, mnt)
    names = [f"{i:05d}-" + "n" * (i % 90) for i in range(5000)]
    calls: List[int] = []
    ask = txfs._changes_ioctl

    def counted(mount: str, arg: bytes) -> bytes:
        calls.append(_wire.IOC_CHANGES.unpack(arg)[2])  # the offset asked for
        return ask(mount, arg)

    monkeypatch.setattr(txfs, "_changes_ioctl", counted)
    txfs.begin()
    try:
        for n in names:
            with open(os.path.join(work, n), "wb") as f:
                f.write(b"x")
        listing = txfs.changes()
        assert len(calls) == 1, "one page to begin with"
        pages = -(-listing.total // _wire.TXFS_CHANGES_DATA)
        assert pages > 10, f"{listing.total} bytes: too few pages to test paging"
        first = next(listing)
        assert first.path == f"{rel}/{names[0]}" and len(calls) == 1, "nothing more fetched for one change"
        got = [first, *listing]
        assert len(calls) == pages, f"{len(calls)} requests for {pages} pages"
        assert calls == [i * _wire.TXFS_CHANGES_DATA for i in range(pages)]
        assert [c.path for c in got] == [f"{rel}/{n}" for n in names]
        assert all(c.status == "created" and c.new_size == 1 for c in got)
        # records that straddle a page's end came out whole
        at, straddled = 0, 0
        for c in got:
            n = _record_len(c)
            straddled += at // _wire.TXFS_CHANGES_DATA != (at + n - 1) // _wire.TXFS_CHANGES_DATA
            at += n
        assert at == listing.total and straddled >= pages // 2, (at, straddled)
        assert got[-1].read_new() == b"x"
    finally:
        txfs.abort()
    assert os.listdir(work) == []


@pytest.mark.parametrize("view", ["0", "1"])
def test_changes_under_txfs_run(work: str, mnt: str, child_env: Dict[str, str], view: str) -> None:
    # A process of a `txfs run` tree lists the tree's transaction, page by
    # page through descriptors of its own, and nests a transaction of its
    # own into it — also in a root run's view, a mount of type
    # fuse.txfs-view over the shared one, which the client must take for
    # the txfs mount it is.
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    child_env = dict(child_env, TXFS_RUN_VIEW=view, TXFS_MOUNT=mnt)
    script = textwrap.dedent(
        """
        import json, os, sys, txfs
        w = sys.argv[1]
        for i in range(300):
            with open(os.path.join(w, "f%03d-%s" % (i, "r" * 150)), "w") as f:
                f.write("run")
        with txfs.transaction():
            with open(os.path.join(w, "g-nested"), "w") as f:
                f.write("run")
        out = [(c.status, os.path.basename(c.path), c.read_new().decode()) for c in txfs.changes()]
        print(json.dumps(out))
        sys.exit(3)
        """
    )
    r = run([binary, "run", "--", sys.executable, "-c", script, work], env=child_env)
    assert r.returncode == 3, r.stderr
    got = json.loads(r.stdout)
    want = [["created", "f%03d-%s" % (i, "r" * 150), "run"] for i in range(300)]
    assert got == want + [["created", "g-nested", "run"]]
    assert os.listdir(work) == [], "an exit status of 3 aborts"
