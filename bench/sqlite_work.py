"""SQLite workloads of the benchmark suite (W4, W5, W6, W11), one trial per run.

    python3 sqlite_work.py populate-w4 DB ROWS
    python3 sqlite_work.py w4 MODE DB OP NTX PER_TX
    ...

MODE: ``delete`` / ``truncate`` / ``wal`` (SQLite's own journal, synchronous=FULL,
on a plain directory), ``txfs`` (journal_mode=OFF, synchronous=OFF, each SQLite
transaction inside ``with txfs.transaction():`` — the txfs commit gives
atomicity and durability) or ``vfs`` (clients/sqlite's txfs VFS, if built).
Each run checks its result (row counts, contents) and prints one JSON line:
{"seconds": S, "ops": N}; S covers the measured loop only.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
import txfs  # noqa: E402

VFS_SO = os.path.join(HERE, "..", "clients", "sqlite", "txfs_vfs.so")


def timed_start() -> float:
    """Starts the clock (and the harness's FUSE tracing: the measured part only)."""
    _trace("1")
    return time.perf_counter()


def timed_end(t0: float) -> float:
    secs = time.perf_counter() - t0
    _trace("0")
    return secs


def _trace(v: str) -> None:
    p = os.environ.get("BENCH_TRACE_ENABLE")
    if p:
        try:
            with open(p, "w") as f:
                f.write(v)
        except OSError:
            pass


def fail(msg: str) -> None:
    print(f"sqlite_work: check failed: {msg}", file=sys.stderr)
    sys.exit(1)


_vfs_loaded = False


def load_vfs() -> None:
    """Registers clients/sqlite's "txfs" VFS in the SQLite library Python uses.

    Python's sqlite3 may be built without load_extension, so this goes through
    the C API (ctypes) of the same libsqlite3 the _sqlite3 module links.
    """
    global _vfs_loaded
    if _vfs_loaded:
        return
    import ctypes
    import _sqlite3

    lib = None
    with open(f"/proc/{os.getpid()}/maps") as f:
        for line in f:
            if "libsqlite3" in line:
                lib = ctypes.CDLL(line.split()[-1])
                break
    if lib is None:
        lib = ctypes.CDLL(_sqlite3.__file__)
    db = ctypes.c_void_p()
    if lib.sqlite3_open(b":memory:", ctypes.byref(db)) != 0:
        fail("sqlite3_open")
    lib.sqlite3_enable_load_extension(db, 1)
    err = ctypes.c_char_p()
    if lib.sqlite3_load_extension(db, VFS_SO.encode(), b"sqlite3_txfsvfs_init", ctypes.byref(err)) != 0:
        fail(f"loading {VFS_SO}: {err.value}")
    _vfs_loaded = True


def connect(path: str, mode: str) -> sqlite3.Connection:
    if mode == "vfs":
        load_vfs()
        conn = sqlite3.connect(f"file:{path}?vfs=txfs", uri=True, isolation_level=None, check_same_thread=False)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    if mode in ("delete", "truncate", "wal"):
        conn.execute(f"PRAGMA journal_mode={mode.upper()}")
        conn.execute("PRAGMA synchronous=FULL")
    elif mode == "delete-64m":
        # Rollback with the page cache the txfs VFS gives its connections.
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA cache_size=-65536")
    elif mode == "txfs":
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
    elif mode in ("txfs-delete", "txfs-wal"):
        # The application's own connection, unchanged (its journal and its
        # syncs), with each of its transactions inside a txfs one.
        conn.execute(f"PRAGMA journal_mode={mode[5:].upper()}")
        conn.execute("PRAGMA synchronous=FULL")
    return conn


class Tx:
    """One application transaction: SQLite's BEGIN/COMMIT, inside a txfs one in txfs mode."""

    def __init__(self, mode: str, *conns: sqlite3.Connection, immediate: bool = True, wrap: bool = False) -> None:
        self.mode, self.conns, self.immediate = mode, conns, immediate
        # vfs: SQLite's own BEGIN/COMMIT are txfs transactions; wrap=True joins
        # them into one application transaction (several files or connections)
        self.outer = txfs.transaction() if mode == "txfs" or (mode == "vfs" and wrap) else None

    def __enter__(self) -> None:
        if self.outer is not None:
            self.outer.__enter__()
        for c in self.conns:
            c.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")

    def __exit__(self, et, ev, tb) -> None:
        for c in self.conns:
            c.execute("COMMIT" if et is None else "ROLLBACK")
        if self.outer is not None:
            self.outer.__exit__(et, ev, tb)


def blob(rng: random.Random, n: int = 1000) -> bytes:
    return rng.randbytes(n)


# ---- W4: 1 KB inserts / updates, PER_TX per transaction --------------------
def populate_w4(db: str, rows: int) -> None:
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=DELETE")
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    rng = random.Random(1)
    c.executemany("INSERT INTO t VALUES(?,?)", ((i, blob(rng)) for i in range(rows)))
    c.commit()
    c.close()


def w4(mode: str, db: str, op: str, ntx: int, per_tx: int) -> None:
    conn = connect(db, mode)
    (rows,) = conn.execute("SELECT count(*) FROM t").fetchone()
    rng = random.Random(42)
    payloads = [blob(rng) for _ in range(64)]
    t0 = timed_start()
    for k in range(ntx):
        with Tx(mode, conn):
            if op == "insert":
                conn.executemany(
                    "INSERT INTO t(v) VALUES(?)", ((payloads[i % 64],) for i in range(per_tx))
                )
            else:
                conn.executemany(
                    "UPDATE t SET v=? WHERE id=?",
                    ((payloads[i % 64], rng.randrange(rows)) for i in range(per_tx)),
                )
    secs = timed_end(t0)
    (after,) = conn.execute("SELECT count(*) FROM t").fetchone()
    want = rows + ntx * per_tx if op == "insert" else rows
    if after != want:
        fail(f"{after} rows, want {want}")
    if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
        fail("quick_check")
    print(json.dumps({"seconds": secs, "ops": ntx * per_tx}))


# ---- W5: Android Mail: 1 MB attachment + a row ------------------------------
def populate_w5(db: str, rows: int) -> None:
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=DELETE")
    c.execute("CREATE TABLE mail(id INTEGER PRIMARY KEY, subject TEXT, body TEXT, attachment TEXT)")
    c.execute("CREATE INDEX mail_subject ON mail(subject)")
    rng = random.Random(2)
    c.executemany(
        "INSERT INTO mail VALUES(?,?,?,NULL)",
        ((i, f"subject {rng.random()}", "x" * rng.randrange(100, 400)) for i in range(rows)),
    )
    c.commit()
    c.close()


def w5(mode: str, dirpath: str, n: int, att_kb: int) -> None:
    conn = connect(os.path.join(dirpath, "mail.db"), mode)
    (rows,) = conn.execute("SELECT count(*) FROM mail").fetchone()
    att_dir = os.path.join(dirpath, "att")
    os.makedirs(att_dir, exist_ok=True)
    dfd = os.open(att_dir, os.O_RDONLY | os.O_DIRECTORY)
    data = random.Random(3).randbytes(att_kb * 1024)
    t0 = timed_start()
    for i in range(n):
        name = os.path.join(att_dir, f"a{i}")
        outer = txfs.transaction() if mode in ("txfs", "txfs-delete", "txfs-wal", "vfs") else None
        if outer:
            outer.__enter__()
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        if outer is None:  # the attachment must be durable before the row points at it
            os.fsync(fd)
            os.fsync(dfd)
        os.close(fd)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO mail(subject, body, attachment) VALUES(?,?,?)", (f"new {i}", "body " * 50, name))
        conn.execute("COMMIT")
        if outer:
            outer.__exit__(None, None, None)
    secs = timed_end(t0)
    (after,) = conn.execute("SELECT count(*) FROM mail").fetchone()
    if after != rows + n:
        fail(f"{after} rows, want {rows + n}")
    for (att,) in conn.execute("SELECT attachment FROM mail WHERE attachment IS NOT NULL"):
        if os.path.getsize(att) != len(data):
            fail(f"attachment {att}")
    os.close(dfd)
    print(json.dumps({"seconds": secs, "ops": n}))


# ---- W6: 2 threads, 12 databases: read row -> SHA-256 -> insert elsewhere ---
NDB = 12


def populate_w6(dirpath: str, rows: int) -> None:
    rng = random.Random(4)
    for d in range(NDB):
        c = sqlite3.connect(os.path.join(dirpath, f"db{d}.sqlite"))
        c.execute("PRAGMA journal_mode=DELETE")
        c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        c.executemany("INSERT INTO t VALUES(?,?)", ((i, blob(rng)) for i in range(rows)))
        c.commit()
        c.close()


def w6(mode: str, dirpath: str, threads: int, n: int) -> None:
    conflicts = [0]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            # each thread owns the databases d with d % threads == t (no sharing)
            mine = [d for d in range(NDB) if d % threads == t]
            conns = {d: connect(os.path.join(dirpath, f"db{d}.sqlite"), mode) for d in mine}
            rng = random.Random(100 + t)
            nrows = min(c.execute("SELECT count(*) FROM t").fetchone()[0] for c in conns.values())
            for i in range(n):
                src, dst = rng.sample(mine, 2)
                rid = rng.randrange(nrows)
                while True:
                    try:
                        with Tx(mode, conns[dst], wrap=True):
                            (v,) = conns[src].execute("SELECT v FROM t WHERE id=?", (rid,)).fetchone()
                            h = hashlib.sha256(v).digest()
                            conns[dst].execute("INSERT INTO t(v) VALUES(?)", (h,))
                        break
                    except txfs.Conflict:
                        conflicts[0] += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    before = 0
    for d in range(NDB):
        c = sqlite3.connect(os.path.join(dirpath, f"db{d}.sqlite"))
        before += c.execute("SELECT count(*) FROM t").fetchone()[0]
        c.close()
    ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    t0 = timed_start()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    secs = timed_end(t0)
    if errors:
        raise errors[0]
    after = 0
    for d in range(NDB):
        c = sqlite3.connect(os.path.join(dirpath, f"db{d}.sqlite"))
        after += c.execute("SELECT count(*) FROM t").fetchone()[0]
        c.close()
    if after != before + threads * n:
        fail(f"{after} rows, want {before + threads * n}")
    print(json.dumps({"seconds": secs, "ops": threads * n, "conflicts": conflicts[0]}))


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "populate-w4":
        populate_w4(args[0], int(args[1]))
    elif cmd == "w4":
        w4(args[0], args[1], args[2], int(args[3]), int(args[4]))
    elif cmd == "populate-w5":
        populate_w5(args[0], int(args[1]))
    elif cmd == "w5":
        w5(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "populate-w6":
        populate_w6(args[0], int(args[1]))
    elif cmd == "w6":
        w6(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "populate-tpcc":
        import tpcc

        tpcc.populate(args[0], int(args[1]), int(args[2]))
    elif cmd == "tpcc":
        import tpcc

        tpcc.run(args[0], args[1], int(args[2]), connect, Tx, fail, timed_start, timed_end)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
