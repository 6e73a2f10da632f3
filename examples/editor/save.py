#!/usr/bin/env python3
"""An editor's save: copy-write-rename vs in place inside a txfs transaction.

Faust §4.3 / Fig. 4.2: an editor that saves by copying the file, changing
the copy and renaming it over the original pays for the whole file on every
save; a transaction can change the file in place and pay for what changed.
Faust found the crossover at 2-4 MB (redo log). This measures ours.

Strategies, each making one 4 KB edit in the middle of a SIZE-byte file:
  rename        copy to a temp file, edit the copy, fsync, rename over the
                original, fsync the directory (Vim's default, roughly)
  tx-patch      with txfs.transaction(): pwrite the 4 KB in place
                (Faust's ported save: only what changed is written)
  tx-rewrite    with txfs.transaction(): truncate and rewrite the whole file
                in place (what txfs.vim does: Vim hands over the whole buffer)

    save.py bench --txfs DIR_ON_MOUNT --native DIR [--sizes 4K,64K,1M,4M,16M,32M]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import txfs

EDIT = b"E" * 4096


def fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_rename(path: str, size: int) -> None:
    tmp = path + ".tmp"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.seek(size // 2)
        dst.write(EDIT)
        dst.flush()
        os.fsync(dst.fileno())
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def save_tx_patch(path: str, size: int) -> None:
    with txfs.transaction():
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, EDIT, size // 2)
        finally:
            os.close(fd)


def save_tx_rewrite(path: str, size: int, buf: bytes) -> None:
    with txfs.transaction():
        with open(path, "wb") as f:  # O_TRUNC, then the whole buffer
            f.write(buf)


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def measure(fn, reps: int) -> float:
    fn()  # warm
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1000


def bench(txfs_dir: str, native_dir: str, sizes: list, budget: int) -> None:
    os.makedirs(txfs_dir, exist_ok=True)
    os.makedirs(native_dir, exist_ok=True)
    print(f"{'size':>6} {'rename (ext4)':>14} {'rename (txfs)':>14} {'tx-patch':>10} {'tx-rewrite':>11}   ms per save")
    for size in sizes:
        reps = max(3, min(50, budget // size))
        buf = os.urandom(size)
        row = []
        for d, kind in ((native_dir, "rename"), (txfs_dir, "rename"), (txfs_dir, "patch"), (txfs_dir, "rewrite")):
            path = os.path.join(d, f"doc-{size}")
            with open(path, "wb") as f:
                f.write(buf)
            if kind == "rename":
                row.append(measure(lambda: save_rename(path, size), reps))
            elif kind == "patch":
                row.append(measure(lambda: save_tx_patch(path, size), reps))
            else:
                row.append(measure(lambda: save_tx_rewrite(path, size, buf), reps))
            os.unlink(path)
        label = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
        print(f"{label:>6} {row[0]:>14.2f} {row[1]:>14.2f} {row[2]:>10.2f} {row[3]:>11.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("bench")
    a.add_argument("--txfs", required=True)
    a.add_argument("--native", required=True)
    a.add_argument("--sizes", default="4K,64K,1M,4M,16M,32M")
    a.add_argument("--budget", default="256M", help="bytes per cell; sets the repetitions")
    args = p.parse_args()
    bench(args.txfs, args.native, [parse_size(s) for s in args.sizes.split(",")], parse_size(args.budget))


if __name__ == "__main__":
    sys.exit(main())
