"""What the part-A reliability checks (crash_campaign.py, faults.py) share:
a txfs daemon they start and may kill, command-line options, a tree model
of a directory, and the JSON result the runner `reliability/run` reads.

Not a check itself (no shebang: `reliability/run` skips it).
The daemon is `$TXFS_BIN`, default `target/debug/txfs`. Scratch
directories are /tmp/crashcamp-* (or under `$TXFS_REL_TMP`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from report import finish, row  # noqa: F401  (re-exported to the checks)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from txfs import mounts  # noqa: E402  (the client package of this repository)

MOUNT_TIMEOUT = 60.0


def txfs_bin() -> str:
    b = os.environ.get("TXFS_BIN") or os.path.join(ROOT, "target", "debug", "txfs")
    if not os.path.exists(b):
        sys.exit(f"txfs binary {b} not found: cargo build -p txfs-fuse (or set TXFS_BIN)")
    return b


def in_mountinfo(point: str) -> bool:
    """A txfs mount is at ``point`` (the client's one mountinfo parser)."""
    return any(e.point == point for e in mounts.read_mountinfo())


def scratch(name: str) -> str:
    base = os.environ.get("TXFS_REL_TMP") or tempfile.gettempdir()
    d = os.path.realpath(tempfile.mkdtemp(prefix=f"crashcamp-{name}-", dir=base))
    os.chmod(d, 0o755)
    return d


def lazy_unmount(point: str) -> None:
    """Undo a mount whose daemon is dead or dying (never blocks on it)."""
    for cmd in (["fusermount3", "-u", "-z", point], ["umount", "-l", point]):
        if not in_mountinfo(point):
            return
        subprocess.run(cmd, capture_output=True, timeout=30)


class Daemon:
    """`txfs mount -f BACKING MNT` as a child we may SIGKILL. `env` adds
    variables (TXFS_FAILPOINT, TXFS_CHECKPOINT_BYTES)."""

    def __init__(self, backing: str, mnt: str, log: str, env: Optional[Dict[str, str]] = None) -> None:
        self.backing, self.mnt, self.log = backing, mnt, log
        self.env = dict(os.environ)
        self.env.pop("TXFS_FAILPOINT", None)
        self.env.update(env or {})
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> bool:
        """Mount; False if the daemon died first (a failpoint in recovery)."""
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [txfs_bin(), "mount", self.backing, self.mnt, "-f"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=self.env,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not in_mountinfo(self.mnt):
            if self.proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"txfs did not mount {self.mnt}:\n{self.log_tail()}")
            time.sleep(0.01)
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
        self.reap()

    def reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        lazy_unmount(self.mnt)

    def umount(self) -> Tuple[bool, str]:
        """`txfs umount` (checkpoints); whether it and the daemon ended cleanly."""
        r = subprocess.run([txfs_bin(), "umount", self.mnt], capture_output=True, text=True, timeout=300)
        ok = r.returncode == 0
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                ok = False
                self.proc.kill()
                self.proc.wait(timeout=10)
            ok = ok and self.proc.returncode == 0
        lazy_unmount(self.mnt)
        return ok, r.stderr

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"


def txfs_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([txfs_bin(), *args], capture_output=True, text=True, timeout=300)


# ---- a directory tree as a value -------------------------------------------

# path (relative, '/'-separated) -> ("d", mode) | ("f", mode, bytes) | ("l", target)
Tree = Dict[str, tuple]


def read_tree(root: str, skip_meta: bool = True) -> Tree:
    t: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            rel = ""
            if skip_meta and ".txfs" in dirnames:
                dirnames.remove(".txfs")
        for n in dirnames + filenames:
            p = os.path.join(rel, n) if rel else n
            full = os.path.join(dirpath, n)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                t[p] = ("d", stat.S_IMODE(st.st_mode))
            elif stat.S_ISLNK(st.st_mode):
                t[p] = ("l", os.readlink(full))
            else:
                with open(full, "rb") as f:
                    t[p] = ("f", stat.S_IMODE(st.st_mode), f.read())
    return t


def tree_diff(want: Tree, got: Tree, limit: int = 8) -> List[str]:
    out = []
    for p in sorted(set(want) | set(got)):
        a, b = want.get(p), got.get(p)
        if a == b:
            continue
        def show(x: Optional[tuple]) -> str:
            if x is None:
                return "absent"
            if x[0] == "f":
                return f"file mode {x[1]:o} len {len(x[2])} head {x[2][:24]!r}"
            return repr(x)
        out.append(f"{p}: want {show(a)}, got {show(b)}")
        if len(out) >= limit:
            out.append("...")
            break
    return out


# ---- options and results ----------------------------------------------------


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the CI-sized run (default)")
    mode.add_argument("--long", action="store_true", help="the thorough run")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: random)")
    p.add_argument("--json", metavar="OUT", default=None, help="write the result rows here")
    p.add_argument("--trials", type=int, default=None, help="override the number of crash trials")
    args, _ = p.parse_known_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    args.mode = "long" if args.long else "quick"
    return args


def command(script: str, args: argparse.Namespace, extra: Optional[List[str]] = None) -> str:
    parts = ["python3", f"reliability/{script}", f"--{args.mode}", "--seed", str(args.seed)]
    return shlex.join(parts + (extra or []))



def rmtree(d: str) -> None:
    if not in_mountinfo(os.path.join(d, "mnt")):
        shutil.rmtree(d, ignore_errors=True)
