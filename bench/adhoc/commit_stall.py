#!/usr/bin/env python3
"""How long one big commit stalls another process's plain writes
(issue 23; docs/LIMITS.md 21).

Mounts txfs over a fresh backing directory, starts a plain writer (open,
write one byte, close, every 5 ms) and, in one thread transaction, makes N
one-byte writes with a byte of gap between them (no two can be one extent:
the most bookkeeping per byte a program can make) through the batch ioctl,
then commits. Prints the commit's time and the writer's worst latency
during it, for each N.

    python3 bench/adhoc/commit_stall.py [N ...]    (default 250000 1000000)
    TXFS_BIN=target/release/txfs  (default: the checkout's release build)
    TXFS_MOUNT_OPTS=tx_mem=16M    (-o options for the mount)
Needs root (/dev/fuse).
"""

import fcntl
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "reliability"))
import txfs  # noqa: E402
from hostile import batch_bytes  # noqa: E402
from txfs import _wire  # noqa: E402

BIN = os.environ.get("TXFS_BIN") or os.path.join(ROOT, "target", "release", "txfs")


def one(n: int) -> None:
    d = tempfile.mkdtemp(prefix="txfs-stall-", dir="/var/tmp")
    b, m = os.path.join(d, "b"), os.path.join(d, "m")
    os.mkdir(b)
    os.mkdir(m)
    opts = os.environ.get("TXFS_MOUNT_OPTS")
    subprocess.run([BIN, "mount", b, m] + (["-o", opts] if opts else []), check=True)
    stop = threading.Event()
    worst = [0.0, 0.0]  # during the commit, outside it
    committing = threading.Event()

    def writer() -> None:
        p = os.path.join(m, "latency")
        while not stop.is_set():
            t = time.monotonic()
            with open(p, "wb") as f:
                f.write(b"x")
            dt = time.monotonic() - t
            i = 0 if committing.is_set() else 1
            worst[i] = max(worst[i], dt)
            time.sleep(0.005)

    th = threading.Thread(target=writer)
    th.start()
    fd = os.open(os.path.join(m, "huge"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        txfs.begin(m)
        fcntl.ioctl(fd, _wire.iow(_wire.TXFS_IOC_MAGIC, 10, 8), bytes(8))
        per = ((1 << 20) - 16) // 17
        buf = mmap.mmap(-1, 1 << 20)
        done, err = 0, "ok"
        while done < n:
            k = min(per, n - done)
            data = batch_bytes([((done + i) * 2, b"x") for i in range(k)])
            buf.seek(0)
            buf.write(data)
            try:
                os.pwrite(fd, memoryview(buf)[: len(data)], 0)
            except OSError as e:
                err = os.strerror(e.errno)
                break
            done += k
        time.sleep(0.2)
        committing.set()
        t = time.monotonic()
        try:
            txfs.commit()
            outcome = "committed"
        except OSError as e:
            outcome = f"commit failed: {os.strerror(e.errno)}"
            if txfs.in_transaction():
                txfs.abort()
        secs = time.monotonic() - t
        time.sleep(0.3)
        committing.clear()
        print(f"{done} one-byte extents ({err}): {outcome} in {secs * 1000:.0f} ms; another process's worst "
              f"plain write {worst[0] * 1000:.0f} ms during the commit, {worst[1] * 1000:.0f} ms otherwise",
              flush=True)
    finally:
        stop.set()
        th.join()
        os.close(fd)
        subprocess.run([BIN, "umount", m], check=False)


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [250_000, 1_000_000]:
        one(n)
