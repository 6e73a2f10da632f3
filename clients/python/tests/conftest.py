"""Fixtures: a txfs daemon mounted for the integration tests.

The daemon is ``$TXFS_BIN`` or the debug binary of this checkout
(``target/debug/txfs`` at the repository root); when that file does not
exist the integration tests fail, saying how to build it. The mount
is always undone in teardown (fusermount3 -u, else umount, else umount -l)
and the daemon stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, NamedTuple

import pytest

HERE = Path(__file__).resolve().parent
PKG_ROOT = HERE.parent  # clients/python
sys.path.insert(0, str(PKG_ROOT))

import txfs  # noqa: E402
from txfs import mounts  # noqa: E402

DEFAULT_BIN = str(PKG_ROOT.parent.parent / "target" / "debug" / "txfs")  # this checkout's
MOUNT_TIMEOUT = 60.0


class TxfsMount(NamedTuple):
    mnt: str
    backing: str
    log: str
    pid: int


def _mounted(mnt: str) -> bool:
    try:
        return any(e.point == mnt for e in mounts.read_mountinfo("/proc/self/mountinfo"))
    except OSError:
        return False


def _unmount(binary: str, mnt: str) -> None:
    # txfs umount first: this process's txfs client keeps descriptors of the
    # mount root between transactions, which a plain umount calls busy
    for cmd in ([binary, "umount", mnt], ["fusermount3", "-u", mnt], ["fusermount", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
        if not _mounted(mnt):
            return
        try:
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue


def _log_tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def txfs_mount(request: pytest.FixtureRequest) -> Iterator[TxfsMount]:
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    if not os.path.exists(binary):
        pytest.fail(
            f"txfs daemon binary not found at {binary} "
            "(build it: cargo build -p txfs-fuse at the repository root, or set TXFS_BIN)"
        )
    # Not under pytest's tmp_path: its cleanup must never walk into a mount.
    base = os.path.realpath(tempfile.mkdtemp(prefix="txfs-pytest."))
    backing = os.path.join(base, "backing")
    mnt = os.path.join(base, "mnt")
    # the daemon's log outlives the mount directory when a test failed
    fd, log = tempfile.mkstemp(prefix="txfs-pytest-daemon.", suffix=".log")
    os.close(fd)
    os.mkdir(backing)
    os.mkdir(mnt)
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [binary, "mount", backing, mnt, "-f"],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not _mounted(mnt):
            if proc.poll() is not None:
                pytest.fail(f"txfs daemon exited ({proc.returncode}) before mounting:\n{_log_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"txfs did not mount {mnt} within {MOUNT_TIMEOUT} s:\n{_log_tail(log)}")
            time.sleep(0.05)
        yield TxfsMount(mnt, backing, log, proc.pid)
        if proc.poll() is not None:
            pytest.fail(f"txfs daemon died during the tests ({proc.returncode}):\n{_log_tail(log)}")
    finally:
        _unmount(binary, mnt)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if not _mounted(mnt):
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"WARNING: could not unmount {mnt}", file=sys.__stderr__)
        if request.session.testsfailed:
            print(f"\ntxfs daemon log: {log}", file=sys.__stderr__)
        else:
            os.unlink(log)


@pytest.fixture()
def second_mount(txfs_mount: TxfsMount) -> Iterator[str]:
    """Another txfs mount (daemon mode) for the length of one test."""
    binary = os.environ.get("TXFS_BIN") or DEFAULT_BIN
    base = os.path.realpath(tempfile.mkdtemp(prefix="txfs-pytest2."))
    backing, mnt = os.path.join(base, "backing"), os.path.join(base, "mnt")
    os.mkdir(backing)
    os.mkdir(mnt)
    r = subprocess.run([binary, "mount", backing, mnt], capture_output=True, text=True, timeout=MOUNT_TIMEOUT)
    if r.returncode != 0:
        pytest.fail(f"a second txfs mount failed: {r.stderr}")
    try:
        yield mnt
    finally:
        _unmount(binary, mnt)
        if not _mounted(mnt):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def mnt(txfs_mount: TxfsMount, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The mount point, also as $TXFS_MOUNT (other txfs mounts may exist)."""
    monkeypatch.setenv("TXFS_MOUNT", txfs_mount.mnt)
    yield txfs_mount.mnt
    # never leave this thread inside a transaction for the next test
    if txfs.in_transaction():
        txfs.abort()


@pytest.fixture()
def work(mnt: str, request: pytest.FixtureRequest) -> str:
    """A fresh directory on the mount for one test (created outside any transaction)."""
    name = f"py-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
    for ch in "[]/ ":
        name = name.replace(ch, "_")
    path = os.path.join(mnt, name)
    os.mkdir(path)
    return path


@pytest.fixture()
def child_env(mnt: str) -> Dict[str, str]:
    """Environment for child Python processes: txfs importable, TXFS_MOUNT set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PKG_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TXFS_MOUNT"] = mnt
    return env
