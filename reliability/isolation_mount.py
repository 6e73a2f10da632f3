"""What the part-B reliability checks share: a txfs mount of their own, the
daemon's pid (is it alive? how big is it?), command-line options and the
JSON result the runner `reliability/run` reads.

Every check is `python3 reliability/<name>.py [--quick|--long] [--seed N]
--json OUT.json`; it exits non-zero on a violation. The daemon is
`$TXFS_BIN`, default `target/debug/txfs` (build: `cargo build -p txfs-fuse`).
Temporary directories are made under `$TXFS_REL_TMP` (default: the system
temp dir) with the prefix `txfs-rel-<check>-`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from report import finish, row  # noqa: F401  (re-exported to the checks)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import txfs  # noqa: E402  (the client package of this repository)
from txfs import mounts  # noqa: E402

MOUNT_TIMEOUT = 60.0
UMOUNT_TIMEOUT = 300.0  # unmount checkpoints: up to 256 MiB of journal on a busy disk


def txfs_bin() -> str:
    b = os.environ.get("TXFS_BIN") or os.path.join(ROOT, "target", "debug", "txfs")
    if not os.path.exists(b):
        raise FileNotFoundError(f"txfs binary {b} not found: cargo build -p txfs-fuse (or set TXFS_BIN)")
    return b


def in_mountinfo(point: str) -> bool:
    """A txfs mount is at ``point`` (the client's one mountinfo parser)."""
    return any(e.point == point for e in mounts.read_mountinfo())


def daemon_alive(pid: int, mnt: str) -> bool:
    """Daemon `pid` runs (not a zombie) and its mount is at `mnt`. By /proc,
    not Popen.poll(): a forked child cannot wait for the daemon."""
    if not in_mountinfo(mnt):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def rss_kib(pid: int) -> int:
    """VmRSS of process `pid` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Mount:
    """`txfs mount BACKING MNT -f` over fresh temp directories; a context
    manager that always unmounts and stops the daemon it started."""

    def __init__(self, check: str, backing: Optional[str] = None, opts: str = "") -> None:
        self.opts = opts  # -o OPTS for txfs mount (e.g. allow_other)
        base = os.environ.get("TXFS_REL_TMP") or tempfile.gettempdir()
        self.base = os.path.realpath(tempfile.mkdtemp(prefix=f"txfs-rel-{check}-", dir=base))
        self.backing = backing or os.path.join(self.base, "backing")
        self.mnt = os.path.join(self.base, "mnt")
        self.log = os.path.join(self.base, "daemon.log")
        os.makedirs(self.backing, exist_ok=True)
        os.mkdir(self.mnt)
        os.chmod(self.base, 0o755)
        self.proc: Optional[subprocess.Popen] = None
        self.stop_error = ""
        self.umount_seconds = 0.0

    def __enter__(self) -> "Mount":
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self) -> None:
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [txfs_bin(), "mount", self.backing, self.mnt, "-f"] + (["-o", self.opts] if self.opts else []),
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not in_mountinfo(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"txfs exited ({self.proc.returncode}) before mounting:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"txfs did not mount {self.mnt}:\n{self.log_tail()}")
            time.sleep(0.02)
        os.environ["TXFS_MOUNT"] = self.mnt

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """The daemon runs (not a zombie) and the mount is there. By /proc,
        not Popen.poll(): a forked child of ours cannot wait for the daemon."""
        return self.proc is not None and daemon_alive(self.pid, self.mnt)

    def rss_kib(self) -> int:
        """VmRSS of the daemon in KiB (0 if it is gone)."""
        return rss_kib(self.pid)

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> bool:
        """Unmount (checkpointing) and stop the daemon; whether it went cleanly."""
        clean = True
        if self.proc is None:
            return True
        if in_mountinfo(self.mnt):
            t0 = time.monotonic()
            try:
                r = subprocess.run([txfs_bin(), "umount", self.mnt], capture_output=True, timeout=UMOUNT_TIMEOUT)
                clean = r.returncode == 0
                if not clean:
                    self.stop_error = f"txfs umount: exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
            except subprocess.TimeoutExpired:
                clean = False
                self.stop_error = (f"txfs umount did not finish within {UMOUNT_TIMEOUT:.0f} s; daemon log:\n"
                                   f"{self.log_tail(15)}")
            self.umount_seconds = time.monotonic() - t0
        deadline = time.monotonic() + 60
        while in_mountinfo(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        for cmd in (["fusermount3", "-u", self.mnt], ["umount", self.mnt], ["umount", "-l", self.mnt]):
            if not in_mountinfo(self.mnt):
                break
            clean = False
            self.stop_error += f" still mounted: {' '.join(cmd)}"
            subprocess.run(cmd, capture_output=True, timeout=30)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            clean = False
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.returncode not in (0, None):
            clean = False
            self.stop_error += f" daemon exit status {self.proc.returncode}"
        self.proc = None
        return clean

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if not in_mountinfo(self.mnt):
            # rm, not shutil.rmtree: that recurses once per level (deep trees)
            subprocess.run(["rm", "-rf", "--one-file-system", self.base], capture_output=True, timeout=600)


def parse_args(description: str, script: str = "", check: str = "", level: str = "") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the CI-sized run (default)")
    mode.add_argument("--long", action="store_true", help="the thorough run")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: random)")
    p.add_argument("--json", metavar="OUT", default=None, help="write the result rows here")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    args.mode = "long" if args.long else "quick"
    if script:
        started = time.monotonic()

        def crashed(typ: Any, value: Any, tb: Any) -> None:
            # the check itself broke (mount failed, daemon vanished, ...): still
            # leave a row that says so, then the usual traceback
            if args.json and typ is not KeyboardInterrupt:
                r = row(check, level, 0, 1, 0, time.monotonic() - started, command(script, args))
                with open(args.json, "w") as f:
                    json.dump({"rows": [r], "notes": [f"{check}: the check crashed: {typ.__name__}: {value}"]}, f, indent=2)
            sys.__excepthook__(typ, value, tb)

        sys.excepthook = crashed
    return args


def command(script: str, args: argparse.Namespace, pinned_seed: bool = True) -> str:
    """The exact command line that reproduces a row."""
    parts = ["python3", f"reliability/{script}", f"--{args.mode}"]
    if pinned_seed:
        parts += ["--seed", str(args.seed)]
    return shlex.join(parts)
