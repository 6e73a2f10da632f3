"""Subprocess side of the tests: python3 worker.py COMMAND DB ARGS...

counter DB N WORKER   N read-modify-write increments, each one SQLite
                      transaction retried on SQLITE_BUSY; prints retries
hold DB ROWS          BEGIN, insert ROWS rows, print "ready", then wait for
                      a line on stdin before COMMIT (the parent may kill it)
commit-big DB MB      one transaction of MB megabytes; prints "committing"
                      right before COMMIT (the parent kills it meanwhile)
churn DB N TABLE      N times: insert 50 rows of 2 KB into TABLE, commit,
                      delete them, commit (with auto_vacuum=FULL each delete
                      shrinks the file); retried on SQLITE_BUSY
grow DB N FIRST       N one-row inserts into table u (keys from FIRST), each
                      its own transaction, retried on SQLITE_BUSY; prints N
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import txfs_sqlite  # noqa: E402

EXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "txfs_vfs")


def connect(path: str) -> sqlite3.Connection:
    txfs_sqlite.load(EXT)
    return sqlite3.connect(f"file:{path}?vfs=txfs", uri=True, isolation_level=None, timeout=5)


def busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


def counter(path: str, n: int, worker: int) -> None:
    conn = connect(path)
    retries = 0
    for seq in range(n):
        while True:
            try:
                conn.execute("BEGIN")
                (v,) = conn.execute("SELECT v FROM counters WHERE id = 0").fetchone()
                conn.execute("UPDATE counters SET v = ? WHERE id = 0", (v + 1,))
                conn.execute("INSERT INTO log(worker, seq, seen) VALUES (?, ?, ?)", (worker, seq, v))
                conn.execute("COMMIT")
                break
            except sqlite3.OperationalError as e:
                if not busy(e):
                    raise
                retries += 1
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                time.sleep(random.uniform(0, 0.005 * min(retries, 10)))
    print(retries, flush=True)


def hold(path: str, rows: int) -> None:
    conn = connect(path)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t(x) VALUES (?)", [(i,) for i in range(rows)])
    conn.execute("UPDATE t SET x = -x")
    print("ready", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    print("committed", flush=True)


def commit_big(path: str, mb: int) -> None:
    conn = connect(path)
    conn.execute("BEGIN")
    blob = os.urandom(1 << 20)
    for i in range(mb):
        conn.execute("INSERT INTO big(b) VALUES (?)", (blob,))
    conn.execute("UPDATE meta SET n = n + 1")
    print("committing", flush=True)
    conn.execute("COMMIT")
    print("committed", flush=True)


def retry(conn: sqlite3.Connection, sql: str, args: tuple = ()) -> None:
    tries = 0
    while True:
        try:
            conn.execute(sql, args)
            return
        except sqlite3.OperationalError as e:
            if not busy(e):
                raise
            tries += 1
            time.sleep(random.uniform(0, 0.001 * min(tries, 10)))


def churn(path: str, n: int, table: str) -> None:
    conn = connect(path)
    for _ in range(n):
        retry(conn, f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 50) "
                    f"INSERT INTO {table} SELECT randomblob(2000) FROM k")
        retry(conn, f"DELETE FROM {table}")


def grow(path: str, n: int, first: int) -> None:
    conn = connect(path)
    for i in range(first, first + n):
        retry(conn, "INSERT INTO u VALUES (?, randomblob(3000))", (i,))
    print(n, flush=True)


if __name__ == "__main__":
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "counter":
        counter(path, int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "hold":
        hold(path, int(sys.argv[3]))
    elif cmd == "commit-big":
        commit_big(path, int(sys.argv[3]))
    elif cmd == "churn":
        churn(path, int(sys.argv[3]), sys.argv[4])
    elif cmd == "grow":
        grow(path, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")
