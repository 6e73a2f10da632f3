"""Fixtures: a real txfs mount under /tmp/sqlvfs-* and the built extension.

The daemon is $TXFS_BIN (default: this checkout's target/debug/txfs); the
extension is ../txfs_vfs.so (`make -C clients/sqlite`). The mount is always
undone in teardown and the daemon stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

HERE = Path(__file__).resolve().parent
EXT = str(HERE.parent / "txfs_vfs")  # SQLite appends .so
sys.path.insert(0, str(HERE.parent.parent / "python"))
sys.path.insert(0, str(HERE.parent))

from txfs import mounts  # noqa: E402  (the client package of this repository)
DEFAULT_BIN = str(HERE.parents[2] / "target" / "debug" / "txfs")  # this checkout's


class Mount(NamedTuple):
    mnt: str
    backing: str
    log: str


def _mounted(mnt: str) -> bool:
    return any(e.point == mnt for e in mounts.read_mountinfo())


@pytest.fixture(scope="session")
def txfs_mount() -> Iterator[Mount]:
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    if not os.path.exists(binary):
        pytest.fail(f"no txfs daemon at {binary} (cargo build -p txfs-fuse at the repository root, or set TXFS_BIN)")
    if not os.path.exists(EXT + ".so"):
        pytest.fail(f"{EXT}.so is missing: run make -C clients/sqlite")
    base = os.path.realpath(tempfile.mkdtemp(prefix="sqlvfs-"))
    backing, mnt, log = f"{base}/backing", f"{base}/mnt", f"{base}.log"
    os.mkdir(backing)
    os.mkdir(mnt)
    with open(log, "wb") as logf:
        proc = subprocess.Popen([binary, "mount", backing, mnt, "-f"], stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _mounted(mnt):
            assert proc.poll() is None, f"txfs daemon exited: {open(log).read()[-2000:]}"
            assert time.monotonic() < deadline, "txfs did not mount in 60 s"
            time.sleep(0.05)
        os.environ["TXFS_MOUNT"] = mnt
        yield Mount(mnt, backing, log)
        assert proc.poll() is None, f"txfs daemon died: {open(log).read()[-2000:]}"
    finally:
        # txfs umount first: this process's txfs client keeps descriptors of
        # the mount root between transactions, which a plain umount calls busy
        for cmd in ([binary, "umount", mnt], ["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not _mounted(mnt):
                break
            try:
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                continue  # not installed (fusermount3 without fuse3), or hung: the next one
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not _mounted(mnt):
            shutil.rmtree(base, ignore_errors=True)
            os.unlink(log)


@pytest.fixture
def db(txfs_mount: Mount, request: pytest.FixtureRequest) -> str:
    """A fresh database path inside the mount (one per test)."""
    d = os.path.join(txfs_mount.mnt, request.node.name)
    os.mkdir(d)
    return os.path.join(d, "t.db")
