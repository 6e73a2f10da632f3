"""The ldif-style store on a real mount: no lost update without locks, and
no temp file after kill -9 (variant B); variant A's leftovers are printed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import ldifd

LDIFD = ldifd.__file__


def test_txfs_variant_loses_no_update_without_locks(txfs_mount, monkeypatch):
    monkeypatch.setenv("TXFS_MOUNT", txfs_mount.mnt)
    d = os.path.join(txfs_mount.mnt, "ldap-hot")
    ldifd.init(d, 8)  # few entries, 4 threads: real conflicts
    r = ldifd.work(d, "txfs", threads=4, ops=200, seed=3)
    c = ldifd.check(d)
    assert c["sum"] == r["ops"] == 200, (r, c)
    assert c["temp_files"] == [] and c["bad_entries"] == [] and c["entries"] == 8, c
    print(f"\n4 threads, 200 modifies of 8 entries: {r['retries']} conflicts retried, none lost")


def kill_during_work(d: str, variant: str, env: dict, rng: random.Random) -> dict:
    before = ldifd.check(d)["sum"]
    p = subprocess.Popen([sys.executable, LDIFD, "work", d, "--variant", variant, "--threads", "4", "--ops", "1000000"],
                         env=env, stdout=subprocess.DEVNULL)
    # A loaded machine may take a while to start the work: wait for its
    # first modifies, then kill it at a random moment.
    deadline = time.monotonic() + 60
    while ldifd.check(d)["sum"] == before and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.3, 0.7))
    p.send_signal(signal.SIGKILL)
    p.wait()
    out = subprocess.run([sys.executable, LDIFD, "check", d], env=env, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_kill_9_leaves_no_temp_files_in_txfs_variant(txfs_mount, env):
    rng = random.Random(62)
    b = os.path.join(txfs_mount.mnt, "ldap-B")
    a = os.path.join(txfs_mount.native, "ldap-A")
    ldifd.init(b, 200)
    ldifd.init(a, 200)
    a_temps = 0
    for i in range(4):
        c = kill_during_work(b, "txfs", env, rng)
        assert c["temp_files"] == [] and c["bad_entries"] == [] and c["entries"] == 200, (i, c)
        assert c["sum"] > 0, c
        ca = kill_during_work(a, "lock", env, rng)
        assert ca["bad_entries"] == [], ca  # rename is atomic: entries stay whole
        a_temps = len(ca["temp_files"])
    print(f"\nafter 4 kills: variant A (lock+rename, native) left {a_temps} temp file(s); B left 0")
