"""Fixtures for the example tests: a real txfs mount, and a scratch directory
on the same (ext4 or whatever) file system as its backing directory for the
native side of each comparison.

The daemon is ``$TXFS_BIN`` or ``target/debug/txfs`` of this checkout; the
tests fail, saying how to build it, when it does not exist. ``$TXFS_TMP_PREFIX`` names the
prefix of the scratch directory in /tmp (default ``txfs-examples.``).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from txfs import mounts  # noqa: E402  (the client package of this repository)


class Mount(NamedTuple):
    mnt: str
    backing: str
    native: str  # a plain directory beside the backing directory
    binary: str
    log: str


def _mounted(mnt: str) -> bool:
    return any(e.point == mnt for e in mounts.read_mountinfo())


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-30:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def txfs_mount() -> Iterator[Mount]:
    binary = os.environ.get("TXFS_BIN") or str(ROOT / "target" / "debug" / "txfs")
    if not os.path.exists(binary):
        pytest.fail(f"no txfs binary at {binary} (cargo build -p txfs-fuse at the repository root, or set TXFS_BIN)")
    base = os.path.realpath(tempfile.mkdtemp(prefix=os.environ.get("TXFS_TMP_PREFIX", "txfs-examples.")))
    backing, mnt, native = (os.path.join(base, d) for d in ("backing", "mnt", "native"))
    for d in (backing, mnt, native):
        os.mkdir(d)
    log = os.path.join(base, "daemon.log")
    with open(log, "wb") as logf:
        proc = subprocess.Popen([binary, "mount", backing, mnt, "-f"], stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"txfs did not mount {mnt}:\n{_tail(log)}")
            time.sleep(0.05)
        yield Mount(mnt, backing, native, binary, log)
        assert proc.poll() is None, f"txfs daemon died during the tests:\n{_tail(log)}"
    finally:
        # txfs umount first: this process's txfs client keeps descriptors of
        # the mount root between transactions, which a plain umount calls busy
        for cmd in ([binary, "umount", mnt], ["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not _mounted(mnt):
                break
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not _mounted(mnt):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def env(txfs_mount: Mount) -> dict:
    """Environment for child processes: the client importable, $TXFS_MOUNT set."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "clients" / "python"), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["TXFS_MOUNT"] = txfs_mount.mnt
    e["TXFS_BIN"] = txfs_mount.binary
    return e
