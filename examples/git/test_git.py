"""txgit and the git alias on a real mount; git killed mid `git add -A`.

On txfs every kill leaves .git byte for byte as before (or, if git had
finished, committed whole): no index.lock, git fsck clean. The native run
of the same kills is printed for comparison (stale index.lock, usually).
"""

from __future__ import annotations

import os
import random
import subprocess

import crash_demo as demo  # examples/git is on sys.path via this file's folder

FILES = 200
KILLS = 6


def test_txgit_commits_and_alias_works(txfs_mount, env):
    env = dict(env, TXFS=txfs_mount.binary, **demo.GIT_ENV)
    repo = os.path.join(txfs_mount.mnt, "git-alias")
    demo.make_repo(repo, 5)
    with open(os.path.join(repo, "new"), "w") as f:
        f.write("x\n")
    subprocess.run([demo.TXGIT, "add", "new"], cwd=repo, env=env, check=True)
    subprocess.run([demo.TXGIT, "commit", "-q", "-m", "via txgit"], cwd=repo, env=env, check=True)
    alias = f"alias.tx=!{txfs_mount.binary} run -- git"
    with open(os.path.join(repo, "new"), "a") as f:
        f.write("y\n")
    subprocess.run(["git", "-c", alias, "tx", "commit", "-qam", "via alias"], cwd=repo, env=env, check=True)
    log = subprocess.run(["git", "log", "--format=%s"], cwd=repo, env=env, capture_output=True, text=True).stdout
    assert log.split("\n")[:2] == ["via alias", "via txgit"], log
    # a failing command under txgit leaves nothing: a bad pathspec after staging
    before = demo.tree_digest(os.path.join(repo, ".git"))
    r = subprocess.run(
        [demo.TXGIT, "commit", "-q", "-m", "x", "--", "no-such-file"],
        cwd=repo, env=env, capture_output=True,
    )
    assert r.returncode != 0
    assert demo.tree_digest(os.path.join(repo, ".git")) == before


def test_git_killed_mid_add(txfs_mount, env, monkeypatch):
    monkeypatch.setenv("TXFS", txfs_mount.binary)
    monkeypatch.setenv("TXFS_MOUNT", txfs_mount.mnt)
    rng = random.Random(56)
    repo = os.path.join(txfs_mount.mnt, "git-kill")
    demo.make_repo(repo, FILES)
    seen = demo.txfs_trials(repo, KILLS, rng, {})
    assert seen["stale_lock"] == 0 and seen["fsck_failed"] == 0 and seen["changed_but_failed"] == 0, seen
    assert seen["unchanged"] + seen["committed"] == KILLS, seen
    native = os.path.join(txfs_mount.native, "git-kill")
    demo.make_repo(native, FILES)
    print("\nnative:", demo.native_trials(native, KILLS, rng), "\ntxfs:  ", seen)
