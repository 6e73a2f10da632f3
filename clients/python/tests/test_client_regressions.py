"""Regressions of the Python client on a real mount, found by the
reliability campaign (issue 4, reliability/)."""

from __future__ import annotations

import os
import subprocess

import pytest

import txfs

pytestmark = pytest.mark.integration


def test_conflict_in_the_block_aborts_and_the_thread_goes_on(work: str) -> None:
    """Story (reliability/isolation.py): a transaction doomed by a conflict
    inside the with-block could not be aborted — the abort opened the mount
    root, which read its listing in the doomed transaction and failed with
    EDEADLK — so the thread stayed in it for good: every later begin, stat
    and open raised EDEADLK as a plain OSError."""
    path = os.path.join(work, "c")
    with open(path, "w") as f:
        f.write("0")
    with pytest.raises(txfs.Conflict):
        with txfs.transaction():
            with open(path) as f:
                assert f.read() == "0"
            # another process changes what the transaction read
            subprocess.run(["sh", "-c", f"printf 100 > '{path}'"], check=True, timeout=30)
            with open(path) as f:  # a conflict here, or at the latest at commit
                f.read()
            with open(path, "w") as f:
                f.write("1")
    assert not txfs.in_transaction()
    assert txfs.state()["tx"] == 0
    os.stat(work)
    with txfs.transaction():
        with open(path, "w") as f:
            f.write("2")
    with open(path) as f:
        assert f.read() == "2"


def test_a_create_in_the_mount_root_is_no_conflict(work: str, mnt: str) -> None:
    """Story: the commit ioctl opened the mount root inside the transaction,
    which read the root's listing; a name created there by another process
    after begin made the commit fail with a conflict."""
    name = os.path.join(mnt, f"root-create-{os.getpid()}")
    with txfs.transaction():
        with open(os.path.join(work, "x"), "w") as f:
            f.write("x")
        subprocess.run(["touch", name], check=True, timeout=30)
    os.unlink(name)
    with open(os.path.join(work, "x")) as f:
        assert f.read() == "x"
