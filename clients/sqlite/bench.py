"""Rough single-connection figures: python3 bench.py MOUNT_DIR NATIVE_DIR [N]

Autocommit inserts, updates and point reads with this VFS (durable and
ordered) against the default VFS (rollback journal and WAL) on the same
txfs mount and on a native directory. Each run uses a fresh file name.
Not part of the tests; numbers depend on the machine's load.
"""

import os
import sqlite3
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txfs_sqlite  # noqa: E402


def run(name: str, uri: str, n: int, pragma: str = "") -> None:
    c = sqlite3.connect(uri, uri=True, isolation_level=None)
    if pragma:
        c.execute(pragma)
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    rates = []
    for sql, arg in (("INSERT INTO t(v) VALUES (randomblob(1000))", None),
                     ("UPDATE t SET v = randomblob(1000) WHERE id = ?", True),
                     ("SELECT v FROM t WHERE id = ?", True)):
        t = time.perf_counter()
        for i in range(n):
            c.execute(sql, (i % 50 + 1,) if arg else ()).fetchall()
        rates.append(n / (time.perf_counter() - t))
    print(f"{name:40s} insert {rates[0]:7.0f}/s  update {rates[1]:7.0f}/s  point-read {rates[2]:7.0f}/s")


def main() -> None:
    mnt, native = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    txfs_sqlite.load()
    tag = uuid.uuid4().hex[:8]
    run("txfs VFS, durable", f"file:{mnt}/b-{tag}-1.db?vfs=txfs", n)
    run("txfs VFS, txfs_commit=ordered", f"file:{mnt}/b-{tag}-2.db?vfs=txfs&txfs_commit=ordered", n)
    run("default VFS on the mount, DELETE", f"file:{mnt}/b-{tag}-3.db", n)
    run("default VFS on the mount, WAL", f"file:{mnt}/b-{tag}-4.db", n, "PRAGMA journal_mode=WAL")
    run("default VFS native, DELETE", f"file:{native}/b-{tag}-5.db", n)
    run("default VFS native, WAL", f"file:{native}/b-{tag}-6.db", n, "PRAGMA journal_mode=WAL")


if __name__ == "__main__":
    main()
