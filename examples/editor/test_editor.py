"""Vim's save through txfs.vim on a real mount, and a save killed midway."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import txfs

HERE = os.path.dirname(os.path.abspath(__file__))
VIMRC = os.path.join(HERE, "txfs.vim")


@pytest.mark.skipif(shutil.which("vim") is None, reason="vim not installed")
def test_vim_saves_in_place_as_one_transaction(txfs_mount, env):
    d = os.path.join(txfs_mount.mnt, "editor-vim")
    os.mkdir(d)
    path = os.path.join(d, "doc.txt")
    with open(path, "w") as f:
        f.write("hello old world\n" * 1000)
    ino = os.stat(path).st_ino
    commits = txfs.status(txfs_mount.mnt)["commits"]
    r = subprocess.run(
        ["vim", "-u", "NONE", "-i", "NONE", "-N", "-es",
         "-c", f"let g:txfs_mount = '{txfs_mount.mnt}'", "-c", f"let g:txfs_bin = '{txfs_mount.binary}'",
         "-c", f"source {VIMRC}", "-c", "%s/old/new/", "-c", "wq", path],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r
    with open(path) as f:
        assert f.read() == "hello new world\n" * 1000
    assert os.stat(path).st_ino == ino, "saved in place"
    assert sorted(os.listdir(d)) == ["doc.txt"], "no swap, backup or temp file"
    assert txfs.status(txfs_mount.mnt)["commits"] > commits


def killed_save(path: str, wrap: list, env: dict, new: bytes) -> bytes:
    """Feeds half of `new` to `cat > path` (what txfs.vim runs), then kills it."""
    p = subprocess.Popen(wrap + ["sh", "-c", 'cat > "$0"', path], stdin=subprocess.PIPE, env=env,
                         start_new_session=True)
    assert p.stdin is not None
    p.stdin.write(new[: len(new) // 2])
    p.stdin.flush()
    deadline = time.monotonic() + 5
    # natively the half shows up in the file; inside a transaction nobody
    # else can see it, so just give cat the time to write it
    while time.monotonic() < deadline and not wrap and os.path.getsize(path) < len(new) // 2:
        time.sleep(0.01)
    # inside a transaction: wait until the save's transaction is open (a
    # loaded machine may take a while to start it), then give cat the time
    deadline = time.monotonic() + 60
    while wrap and time.monotonic() < deadline and txfs.status(wrap[3])["live_txs"] < 1:
        time.sleep(0.01)
    time.sleep(0.3)
    if wrap:  # the save's transaction is open, holding half the file
        assert txfs.status(wrap[3])["live_txs"] >= 1
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    with open(path, "rb") as f:
        return f.read()


def test_a_save_killed_midway_leaves_the_old_file_whole(txfs_mount, env):
    old, new = b"old\n" * 250_000, b"new\n" * 250_000
    on_tx = os.path.join(txfs_mount.mnt, "editor-kill.txt")
    native = os.path.join(txfs_mount.native, "editor-kill.txt")
    for path in (on_tx, native):
        with open(path, "wb") as f:
            f.write(old)
    wrap = [txfs_mount.binary, "run", "--mount", txfs_mount.mnt, "--"]
    assert killed_save(on_tx, wrap, env, new) == old
    left = killed_save(native, [], env, new)
    assert left != old and left != new  # an in-place save without a transaction: half a file
    print(f"\nnative in-place save killed midway: {len(left)} of {len(new)} bytes; txfs: the old file, whole")


def test_bench_runs(txfs_mount, env):
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "save.py"), "bench", "--txfs", os.path.join(txfs_mount.mnt, "ed"),
         "--native", os.path.join(txfs_mount.native, "ed"), "--sizes", "4K,1M", "--budget", "4M"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["4K", "1M"] and all(float(x) > 0 for row in rows for x in row[1:]), r.stdout
