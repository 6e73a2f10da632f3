#!/usr/bin/env python3
"""A directory-of-entries store modelled on OpenLDAP's ldif back end.

TxFS porting thesis §6.2: back-ldif keeps one small text file per entry
(~0.5 KB) in a directory tree; it updates an entry by writing a temp file
and renaming it over the entry, and serialises writers with one
reader-writer lock. The port wrapped each back-end call in a TxFS
transaction and replaced the lock with an abort-and-retry loop.

Variant A (lock):  rwlock.write(); write tmp; fsync(tmp); rename(tmp, entry);
                   fsync(dir); unlock           -- what back-ldif does
Variant B (txfs):  with txfs.transaction(): <the same code, no lock>;
                   on txfs.Conflict run it again -- what the port does
Variant B keeps the temp file and rename on purpose (the back end's code is
unchanged); inside the transaction the temp file never becomes visible, and
the fsyncs are free.

Every operation increments a counter in one entry (read-modify-write), so
the final sum tells whether an update was lost.

    ldifd.py init DIR --entries N
    ldifd.py work DIR --variant lock|txfs --threads T --ops N [--seed S]
                                      prints "ops/s" and the retries
    ldifd.py check DIR                JSON: entries, sum, temp files, bad entries
    ldifd.py bench --txfs DIR_ON_MOUNT --native DIR [--entries N] [--ops N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

import txfs

OU = "ou=people"
TMP_PREFIX = "ldif_tmp."


class RWLock:
    """Writer-preferring reader-writer lock (back-ldif's li_rdwr)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


def entry_path(d: str, uid: int) -> str:
    return os.path.join(d, OU, f"uid=user{uid}.ldif")


def render(uid: int, count: int) -> str:
    # ~0.5 KB, like the thesis's average entry
    return (
        f"dn: uid=user{uid},{OU},dc=example,dc=org\n"
        f"objectClass: inetOrgPerson\nuid: user{uid}\ncn: User {uid}\nsn: {uid}\n"
        f"mail: user{uid}@example.org\nuserPassword: {'x' * 300}\n"
        f"description: {count}\n"
    )


def parse(text: str) -> dict:
    attrs = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    if "dn" not in attrs or "description" not in attrs:
        raise ValueError("not a whole entry")
    return attrs


def write_entry(d: str, uid: int, text: str) -> None:
    """back-ldif's ldif_write_entry: temp file, fsync, rename, fsync dir."""
    dirpath = os.path.join(d, OU)
    tmp = os.path.join(dirpath, f"{TMP_PREFIX}{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, entry_path(d, uid))
    dfd = os.open(dirpath, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def modify(d: str, uid: int) -> None:
    """The back-end's modify: read the entry, change an attribute, write it back."""
    with open(entry_path(d, uid)) as f:
        attrs = parse(f.read())
    write_entry(d, uid, render(uid, int(attrs["description"]) + 1))


def init(d: str, entries: int) -> None:
    os.makedirs(os.path.join(d, OU), exist_ok=True)
    for uid in range(entries):
        with open(entry_path(d, uid), "w") as f:
            f.write(render(uid, 0))


def work(d: str, variant: str, threads: int, ops: int, seed: int) -> dict:
    entries = len([n for n in os.listdir(os.path.join(d, OU)) if n.endswith(".ldif")])
    lock = RWLock()
    retries = [0]
    count_lock = threading.Lock()

    def modify_locked(uid: int) -> None:
        lock.acquire_write()
        try:
            modify(d, uid)
        finally:
            lock.release_write()

    def modify_tx(uid: int) -> None:
        for attempt in range(100):
            try:
                with txfs.transaction():
                    modify(d, uid)
                return
            except txfs.Conflict:
                with count_lock:
                    retries[0] += 1
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise RuntimeError("still conflicting after 100 attempts")

    op = modify_locked if variant == "lock" else modify_tx

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        for _ in range(ops // threads):
            op(rng.randrange(entries))

    t = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    dt = time.perf_counter() - t
    return {"variant": variant, "threads": threads, "ops": ops // threads * threads, "seconds": dt,
            "ops_per_s": ops // threads * threads / dt, "retries": retries[0]}


def check(d: str) -> dict:
    names = os.listdir(os.path.join(d, OU))
    temps = [n for n in names if n.startswith(TMP_PREFIX)]
    total, bad = 0, []
    for n in names:
        if n.endswith(".ldif"):
            try:
                with open(os.path.join(d, OU, n)) as f:
                    total += int(parse(f.read())["description"])
            except ValueError:
                bad.append(n)
    return {"entries": len(names) - len(temps), "sum": total, "temp_files": temps, "bad_entries": bad}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("init")
    a.add_argument("dir")
    a.add_argument("--entries", type=int, default=1000)
    a = sub.add_parser("work")
    a.add_argument("dir")
    a.add_argument("--variant", choices=("lock", "txfs"), required=True)
    a.add_argument("--threads", type=int, default=4)
    a.add_argument("--ops", type=int, default=2000)
    a.add_argument("--seed", type=int, default=1)
    a = sub.add_parser("check")
    a.add_argument("dir")
    a = sub.add_parser("bench")
    a.add_argument("--txfs", required=True)
    a.add_argument("--native", required=True)
    a.add_argument("--entries", type=int, default=1000)
    a.add_argument("--ops", type=int, default=2000)
    args = p.parse_args()
    if args.cmd == "init":
        init(args.dir, args.entries)
    elif args.cmd == "work":
        print(json.dumps(work(args.dir, args.variant, args.threads, args.ops, args.seed)), flush=True)
    elif args.cmd == "check":
        r = check(args.dir)
        print(json.dumps(r))
        sys.exit(1 if r["temp_files"] or r["bad_entries"] else 0)
    else:
        print(f"{args.ops} modifies of random entries among {args.entries}")
        print(f"  {'variant':<28} {'threads':>7} {'ops/s':>8} {'retries':>8}")
        for label, variant, d in (("A lock+rename, native", "lock", os.path.join(args.native, "A")),
                                  ("A lock+rename, on txfs", "lock", os.path.join(args.txfs, "A")),
                                  ("B txfs tx + retry", "txfs", os.path.join(args.txfs, "B"))):
            init(d, args.entries)
            for threads in (1, 4):
                r = work(d, variant, threads, args.ops, 1)
                print(f"  {label:<28} {threads:>7} {r['ops_per_s']:>8.0f} {r['retries']:>8}")
            c = check(d)
            assert c["sum"] == 2 * (args.ops // 4 * 4) or c["sum"] == args.ops + args.ops // 4 * 4, c


if __name__ == "__main__":
    main()
