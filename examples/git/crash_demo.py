#!/usr/bin/env python3
"""Git killed mid-command, native vs txfs (TxFS paper §5.6).

    crash_demo.py --native DIR --txfs DIR_ON_MOUNT [--files 2000] [--kills 10]

In each DIR: a repository with FILES committed files. Each trial appends a
line to every file and runs `git add -A` (native) or `txgit add -A` (=
`txfs run -- git add -A`), then SIGKILLs it at a random moment within the
time an uninterrupted run takes: half the trials kill git itself, half kill
the whole process group (txfs run too).

Native, after each kill it records: a stale .git/index.lock (the next git
command refuses to run until someone deletes it by hand), whether
`git fsck` and `git status` still work, and the index's size. It then
deletes the stale lock to carry on, as a user would.
txfs, after each kill: .git must be byte for byte what it was before the
trial (no index.lock, no new loose object, same index) unless the command
had already finished and committed; either way `git fsck` is clean.

What SIGKILL cannot show is the paper's zero-length index: that needs a
power cut after `rename(index.lock, index)` reached the disk but the new
index's data had not. `strace` shows why it can happen on native: git (2.39,
default core.fsync) writes index.lock and renames it over index without any
fsync. This script prints that evidence (--strace) instead of pretending to
cut the power; `git status` on an index truncated to zero is shown with
--show-zero-index (the state the paper found after its VM crash).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TXGIT = os.path.join(HERE, "txgit")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "demo",
    "GIT_AUTHOR_EMAIL": "demo@example.org",
    "GIT_COMMITTER_NAME": "demo",
    "GIT_COMMITTER_EMAIL": "demo@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def env(extra: dict | None = None) -> dict:
    e = dict(os.environ)
    e.update(GIT_ENV)
    e.update(extra or {})
    return e


def git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", repo, *args], env=env(), capture_output=True, text=True, check=check)


def make_repo(repo: str, files: int) -> None:
    os.makedirs(repo)
    git(repo, "init", "-q")
    for i in range(files):
        with open(os.path.join(repo, f"f{i:05}"), "w") as f:
            f.write(f"{i}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")


def touch_all(repo: str, trial: int) -> None:
    for name in os.listdir(repo):
        if name.startswith("f"):
            with open(os.path.join(repo, name), "a") as f:
                f.write(f"trial {trial}\n")


def tree_digest(path: str) -> str:
    """SHA-256 over every path, type and content under path."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files) + [d + "/" for d in dirs]:
            full = os.path.join(root, name.rstrip("/"))
            h.update(os.path.relpath(full, path).encode() + b"\0")
            if not name.endswith("/"):
                with open(full, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def start(repo: str, use_txfs: bool, extra_env: dict) -> subprocess.Popen:
    cmd = [TXGIT, "add", "-A"] if use_txfs else ["git", "add", "-A"]
    return subprocess.Popen(cmd, cwd=repo, env=env(extra_env), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill(p: subprocess.Popen, whole_group: bool) -> None:
    if whole_group:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    # only git: the youngest process of the group that is git
    out = subprocess.run(["pgrep", "-g", str(p.pid), "-x", "git"], capture_output=True, text=True).stdout.split()
    for pid in out or [str(p.pid)]:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def timed_run(repo: str, use_txfs: bool, extra_env: dict) -> float:
    t = time.perf_counter()
    p = start(repo, use_txfs, extra_env)
    _, err = p.communicate()
    assert p.returncode == 0, err
    return time.perf_counter() - t


def native_trials(repo: str, kills: int, rng: random.Random) -> dict:
    touch_all(repo, -1)
    span = timed_run(repo, False, {})
    seen = {"kills": 0, "stale_lock": 0, "next_git_refused": 0, "fsck_failed": 0, "status_failed": 0,
            "index_sizes": []}
    for k in range(kills):
        touch_all(repo, k)
        p = start(repo, False, {})
        time.sleep(rng.uniform(0, 0.8 * span))
        kill(p, whole_group=k % 2 == 1)
        p.wait()
        seen["kills"] += 1
        lock = os.path.join(repo, ".git", "index.lock")
        if os.path.exists(lock):
            seen["stale_lock"] += 1
            if git(repo, "add", "-A", check=False).returncode != 0:
                seen["next_git_refused"] += 1
            os.unlink(lock)  # what the user must do by hand
        if git(repo, "fsck", "--no-progress", check=False).returncode != 0:
            seen["fsck_failed"] += 1
        if git(repo, "status", "--porcelain", check=False).returncode != 0:
            seen["status_failed"] += 1
        seen["index_sizes"].append(os.path.getsize(os.path.join(repo, ".git", "index")))
    return seen


def commits(repo: str) -> int | None:
    """The mount's commit counter (None without the Python client)."""
    try:
        import txfs  # clients/python
    except ImportError:
        return None
    return txfs.status(repo)["commits"]


def txfs_trials(repo: str, kills: int, rng: random.Random, extra_env: dict) -> dict:
    touch_all(repo, -1)
    span = timed_run(repo, True, extra_env)
    seen = {"kills": 0, "unchanged": 0, "committed": 0, "stale_lock": 0, "fsck_failed": 0, "changed_but_failed": 0}
    for k in range(kills):
        touch_all(repo, k)
        before = tree_digest(os.path.join(repo, ".git"))
        n0 = commits(repo)
        p = start(repo, True, extra_env)
        time.sleep(rng.uniform(0, 0.8 * span))
        kill(p, whole_group=k % 2 == 1)
        p.wait()
        seen["kills"] += 1
        after = tree_digest(os.path.join(repo, ".git"))
        if os.path.exists(os.path.join(repo, ".git", "index.lock")):
            seen["stale_lock"] += 1
        # A kill of the whole group can land after txfs run committed but
        # before it exited: the command "failed" yet its commit is whole.
        n1 = commits(repo)
        if p.returncode == 0 or (n0 is not None and n1 is not None and n1 > n0 and after != before):
            seen["committed"] += 1  # finished before the kill landed: whole and committed
        elif after == before:
            seen["unchanged"] += 1
        else:
            seen["changed_but_failed"] += 1
        if git(repo, "fsck", "--no-progress", check=False).returncode != 0:
            seen["fsck_failed"] += 1
    return seen


def strace_evidence(repo: str) -> str:
    """The syscalls git makes on its index during `git add -A`, natively."""
    if not shutil.which("strace"):
        return "(strace not installed)"
    touch_all(repo, 999)
    log = os.path.join(os.path.dirname(repo), "git-add.strace")
    subprocess.run(["strace", "-f", "-o", log, "-e", "trace=openat,rename,renameat,renameat2,fsync,fdatasync",
                    "git", "add", "-A"], cwd=repo, env=env(), check=True, capture_output=True)
    lines = [ln.split(None, 1)[1].strip() for ln in open(log) if "index" in ln or "sync" in ln]
    return "\n".join("    " + ln for ln in lines if "pack" not in ln)


def show_zero_index(repo: str) -> str:
    scratch = repo + "-zero"
    shutil.copytree(repo, scratch, symlinks=True)
    open(os.path.join(scratch, ".git", "index"), "w").close()
    r = git(scratch, "status", check=False)
    f = git(scratch, "fsck", check=False)
    shutil.rmtree(scratch)
    return (f"    git status -> exit {r.returncode}: {(r.stderr or r.stdout).strip()}\n"
            f"    git fsck   -> exit {f.returncode}: {(f.stderr or f.stdout).strip()[:200]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--native", required=True, help="a fresh directory on an ordinary file system")
    p.add_argument("--txfs", required=True, help="a fresh directory on a txfs mount")
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--strace", action="store_true")
    p.add_argument("--show-zero-index", action="store_true")
    a = p.parse_args()
    rng = random.Random(a.seed)
    for d in (a.native, a.txfs):
        make_repo(os.path.join(d, "repo"), a.files)
    print(f"git add -A over {a.files} modified files, SIGKILLed {a.kills} times at random moments")
    print("native:", native_trials(os.path.join(a.native, "repo"), a.kills, rng))
    print("txfs:  ", txfs_trials(os.path.join(a.txfs, "repo"), a.kills, rng, {}))
    if a.strace:
        print("native `git add -A` on its index (no fsync before the rename):")
        print(strace_evidence(os.path.join(a.native, "repo")))
    if a.show_zero_index:
        print("what a zero-length index (the paper's power cut) does to git:")
        print(show_zero_index(os.path.join(a.native, "repo")))


if __name__ == "__main__":
    sys.exit(main())
