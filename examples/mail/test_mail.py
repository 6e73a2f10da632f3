"""The mail example against a real mount: SIGKILL the writer many times.

txfs: after every kill, every row names a whole attachment (no dangling
pointer), every attachment has its row (no orphan), SQLite's integrity_check
passes, no journal file beside the database, and every message the writer
reported as stored (after its commit returned) is there.
native (Fig. 1c on the plain file system): the fsync order prevents dangling
pointers, but a kill between the two steps leaves orphan files; counted and
printed, not asserted (it depends on where the kill lands).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

MAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mail.py")
KILLS = 12


def run_and_kill(d: str, mode: str, env: dict, rng: random.Random) -> list:
    """Starts a writer, lets it store at least one message, kills it at a random moment."""
    p = subprocess.Popen(
        [sys.executable, MAIL, "store", d, "--mode", mode, "--count", "0", "--size", str(256 * 1024)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert p.stdout is not None
    first = p.stdout.readline()
    assert first.startswith("stored"), first
    time.sleep(rng.uniform(0.0, 0.15))
    p.send_signal(signal.SIGKILL)
    rest = p.stdout.read()
    p.wait()
    # A kill can tear the last report line ("stored" without its name): only whole lines count.
    return [line.split()[1] for line in [first] + rest.splitlines() if line.startswith("stored") and len(line.split()) == 2]


def check(d: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, MAIL, "check", d], env=env, capture_output=True, text=True)
    assert out.stdout, out.stderr
    return json.loads(out.stdout)


def test_killed_writer_leaves_no_dangling_pointer_and_no_orphan(txfs_mount, env):
    rng = random.Random(6)
    d = os.path.join(txfs_mount.mnt, "mail")
    subprocess.run([sys.executable, MAIL, "init", d, "--rows", "100"], env=env, check=True)
    stored: list = []
    for i in range(KILLS):
        stored += run_and_kill(d, "txfs", env, rng)
        r = check(d, env)
        assert r["integrity"] == "ok", (i, r)
        assert r["dangling"] == [] and r["orphans"] == [] and r["corrupt"] == [], (i, r)
        assert r["other_files"] == [], f"files beside mail.db: {r['other_files']}"
        assert r["rows"] >= len(stored), (i, r["rows"], len(stored))
    # and the backing directory (plain files) agrees once checkpointed
    assert set(stored) <= set(os.listdir(os.path.join(d, "attachments")))


def test_native_protocol_under_the_same_kills(txfs_mount, env):
    rng = random.Random(7)
    d = os.path.join(txfs_mount.native, "mail")
    subprocess.run([sys.executable, MAIL, "init", d, "--rows", "100"], env=env, check=True)
    orphans = 0
    for i in range(KILLS):
        run_and_kill(d, "native", env, rng)
        r = check(d, env)
        assert r["integrity"] == "ok" and r["dangling"] == [] and r["corrupt"] == [], (i, r)
        orphans = len(r["orphans"])
    print(f"\nnative Fig. 1c protocol: {orphans} orphan attachment(s) after {KILLS} kills (txfs: 0)")
