#!/usr/bin/env python3
"""Android Mail's "store a message with an attachment", two ways.

TxFS paper Fig. 1c and Table 5: the attachment is a file, the message a row
of a SQLite database that names the file. Both must appear together: a row
without its file is a dangling pointer, a file without its row an orphan.

native (Fig. 1c, what Android Mail does):
    write attachment; fsync(attachment); fsync(dir)     # the file first ...
    SQLite transaction, journal_mode=DELETE, synchronous=FULL
      (journal write, fsync journal, fsync dir, db write, fsync db, unlink journal)
  A crash between the two steps leaves an orphan file; the application needs
  a cleanup scan at start-up to find it.

txfs (one transaction, no fsync at all):
    with txfs.transaction():
        write attachment
        SQLite transaction, journal_mode=MEMORY     # SQL-level rollback only
  Commit makes both durable with one journal fdatasync; a crash before it
  leaves neither. (clients/sqlite's txfs VFS, when built, does the same
  without the journal_mode pragma: see README.md.)

    mail.py init   DIR [--rows N]                 create DIR/mail.db (+ N 1 KB rows)
    mail.py store  DIR --mode txfs|native [--count N] [--size BYTES]
                                                  store N messages (0: forever),
                                                  print "stored ID" after each
    mail.py check  DIR                            JSON: rows, files, dangling,
                                                  orphans, integrity; exit 1 if
                                                  either list is non-empty
    mail.py bench  --txfs DIR_ON_MOUNT --native DIR [--count N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import time
import uuid

import txfs

SCHEMA = """CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, subject TEXT, body TEXT,
    attachment TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL)"""


def connect(d: str, mode: str) -> sqlite3.Connection:
    conn = sqlite3.connect(os.path.join(d, "mail.db"), isolation_level=None, timeout=30)
    if mode == "txfs":
        # The txfs transaction is the journal: SQLite keeps only an in-memory
        # undo log (for ROLLBACK) and need not sync (fsync in a transaction is
        # free anyway).
        conn.execute("PRAGMA journal_mode=MEMORY")
        conn.execute("PRAGMA synchronous=OFF")
    else:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=FULL")
    return conn


def init(d: str, rows: int) -> None:
    os.makedirs(os.path.join(d, "attachments"), exist_ok=True)
    conn = connect(d, "native")
    conn.execute(SCHEMA)
    conn.execute("CREATE TABLE IF NOT EXISTS filler (id INTEGER PRIMARY KEY, blob BLOB)")
    conn.execute("BEGIN")
    for _ in range(rows):
        conn.execute("INSERT INTO filler (blob) VALUES (?)", (os.urandom(1024),))
    conn.execute("COMMIT")
    conn.close()


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def store_native(d: str, conn: sqlite3.Connection, data: bytes) -> str:
    """Fig. 1c: persist the attachment (2 fsyncs), then the row (SQLite's own)."""
    name = uuid.uuid4().hex + ".bin"
    att_dir = os.path.join(d, "attachments")
    path = os.path.join(att_dir, name)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # fsync(attachment)
    fsync_path(att_dir)  # fsync(dir): the name is durable too
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO messages (subject, body, attachment, size, sha256) VALUES (?, ?, ?, ?, ?)",
        ("hello", "see attachment", name, len(data), hashlib.sha256(data).hexdigest()),
    )
    conn.execute("COMMIT")  # journal + db + directory fsyncs inside SQLite
    return name


def store_txfs(d: str, conn: sqlite3.Connection, data: bytes) -> str:
    """The same in one txfs transaction: no fsync, no ordering, no cleanup scan."""
    name = uuid.uuid4().hex + ".bin"
    with txfs.transaction():
        with open(os.path.join(d, "attachments", name), "wb") as f:
            f.write(data)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO messages (subject, body, attachment, size, sha256) VALUES (?, ?, ?, ?, ?)",
            ("hello", "see attachment", name, len(data), hashlib.sha256(data).hexdigest()),
        )
        conn.execute("COMMIT")
    return name


def store(d: str, mode: str, count: int, size: int) -> None:
    conn = connect(d, mode)
    fn = store_txfs if mode == "txfs" else store_native
    i = 0
    while count == 0 or i < count:
        data = os.urandom(size)
        for attempt in range(10):
            try:
                name = fn(d, conn, data)
                break
            except txfs.Conflict:
                # Lost a conflict: nothing of it survived. SQLite's cache may
                # hold the aborted pages: start from a fresh connection.
                conn.close()
                conn = connect(d, mode)
                time.sleep(0.01 * (attempt + 1))
        else:
            raise SystemExit("still conflicting after 10 attempts")
        print("stored", name, flush=True)
        i += 1
    conn.close()


def check(d: str) -> dict:
    extra = [n for n in os.listdir(d) if n not in ("mail.db", "attachments")]
    # Read-write, as the application's next start would: SQLite rolls a hot
    # journal (native mode, killed mid-COMMIT) back on first read.
    conn = sqlite3.connect(os.path.join(d, "mail.db"))
    integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    rows = conn.execute("SELECT attachment, size, sha256 FROM messages").fetchall()
    conn.close()
    files = set(os.listdir(os.path.join(d, "attachments")))
    dangling, bad = [], []
    for name, size, digest in rows:
        if name not in files:
            dangling.append(name)
            continue
        with open(os.path.join(d, "attachments", name), "rb") as f:
            data = f.read()
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            bad.append(name)
    orphans = sorted(files - {r[0] for r in rows})
    return {
        "rows": len(rows),
        "files": len(files),
        "dangling": dangling,
        "orphans": orphans,
        "corrupt": bad,
        "integrity": integrity,
        "other_files": extra,  # a -journal left by SQLite, before the rollback
    }


def bench(txfs_dir: str, native_dir: str, count: int, size: int) -> None:
    print(f"{count} messages with a {size // 1024} KB attachment each")
    for mode, d in (("native", native_dir), ("txfs", txfs_dir)):
        init(d, 0)
        conn = connect(d, mode)
        fn = store_txfs if mode == "txfs" else store_native
        data = os.urandom(size)
        t = time.perf_counter()
        for _ in range(count):
            fn(d, conn, data)
        dt = time.perf_counter() - t
        conn.close()
        print(f"  {mode:<7} {d:<40} {count / dt:8.1f} msgs/s  ({dt / count * 1000:.2f} ms each)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("init")
    a.add_argument("dir")
    a.add_argument("--rows", type=int, default=0)
    a = sub.add_parser("store")
    a.add_argument("dir")
    a.add_argument("--mode", choices=("txfs", "native"), required=True)
    a.add_argument("--count", type=int, default=1)
    a.add_argument("--size", type=int, default=1 << 20)
    a = sub.add_parser("check")
    a.add_argument("dir")
    a = sub.add_parser("bench")
    a.add_argument("--txfs", required=True)
    a.add_argument("--native", required=True)
    a.add_argument("--count", type=int, default=50)
    a.add_argument("--size", type=int, default=1 << 20)
    args = p.parse_args()
    if args.cmd == "init":
        init(args.dir, args.rows)
    elif args.cmd == "store":
        store(args.dir, args.mode, args.count, args.size)
    elif args.cmd == "check":
        r = check(args.dir)
        print(json.dumps(r))
        sys.exit(1 if r["dangling"] or r["orphans"] or r["corrupt"] or r["integrity"] != "ok" else 0)
    else:
        bench(args.txfs, args.native, args.count, args.size)


if __name__ == "__main__":
    main()
