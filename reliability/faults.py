#!/usr/bin/env python3
"""Faults: a full backing disk, a damaged journal, a mount lost under open
transactions.

1. disk full. BACKING on a small ext4 image on a loop device (mkfs.ext4,
   losetup; always detached at the end). The rest of the disk is filled
   with a file outside BACKING, then
   * mid-commit: a transaction of several MiB commits → must fail with a
     clean errno (ENOSPC, or EFBIG), change nothing, leave the
     transaction's files absent; committed files intact;
   * after freeing the space the same transaction commits and reads back;
   * mid-checkpoint: data committed to the journal, the disk filled again,
     a checkpoint forced (more commits past TXFS_CHECKPOINT_BYTES, then
     unmount) → nothing committed may be lost: after freeing the space a
     remount shows every acknowledged commit; whether the *running* mount
     keeps working after the failed checkpoint is reported.
2. journal damage. Transactions committed, the daemon killed (the journal
   keeps its records), then each trial flips one bit, or truncates the
   journal at a random offset, in a copy of BACKING: `txfs check` must
   report it (exit 1 "DAMAGE", or a cut torn tail), `txfs mount` must refuse
   damage, and whatever mounts must be a committed prefix containing
   everything before the damaged record.
3. lost mount. Processes with open transactions; `fusermount3 -u -z` (lazy
   unmount) under them → their commits fail, the daemon ends, a remount
   shows every commit acknowledged before and nothing of the open ones.

Usage: python3 reliability/faults.py [--quick|--long] [--seed N] [--json OUT]
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import time
from typing import List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import crash_harness as H  # noqa: E402

PY_CLIENT = os.path.join(H.ROOT, "clients", "python")


def tx_script(mnt: str, body: str, commit: bool = True, durable: bool = True) -> str:
    """Python code for a child: one transaction running `body`, then commit; prints the errno or 'ok'."""
    return f"""
import os, sys, errno
sys.path.insert(0, {PY_CLIENT!r}); import txfs
M = {mnt!r}
try:
    txfs.begin(M)
{chr(10).join('    ' + l for l in body.strip().splitlines())}
    {'txfs.commit(durable=' + str(durable) + ')' if commit else 'pass'}
    print('ok')
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
    try: txfs.abort()
    except OSError: pass
"""


def run_tx(mnt: str, body: str, durable: bool = True) -> str:
    r = subprocess.run([sys.executable, "-c", tx_script(mnt, body, True, durable)], capture_output=True, text=True,
                       timeout=300)
    return (r.stdout.strip() or r.stderr.strip()[-300:])


# ---- 1. disk full -------------------------------------------------------------------------------


class LoopExt4:
    def __init__(self, base: str, mib: int) -> None:
        self.img = os.path.join(base, "ext4.img")
        self.dir = os.path.join(base, "ext4")
        self.dev: Optional[str] = None
        self.mounted = False
        os.mkdir(self.dir)
        with open(self.img, "wb") as f:
            f.truncate(mib << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", self.img], check=True, capture_output=True)
        self.dev = subprocess.run(["losetup", "-f", "--show", self.img], check=True, capture_output=True,
                                  text=True).stdout.strip()
        subprocess.run(["mount", self.dev, self.dir], check=True)
        self.mounted = True

    def fill(self, leave: int = 0) -> None:
        """Fills the disk with filler files, leaving about `leave` bytes free."""
        n = 0
        while True:
            st = os.statvfs(self.dir)
            free = st.f_bavail * st.f_frsize
            if free <= leave + 4096:
                break
            chunk = min(free - leave, 8 << 20)
            n += 1
            try:
                with open(os.path.join(self.dir, f"filler{n}"), "wb") as f:
                    f.write(b"\xff" * chunk)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break

    def free(self) -> None:
        for n in os.listdir(self.dir):
            if n.startswith("filler"):
                os.unlink(os.path.join(self.dir, n))
        os.sync()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", self.dir], capture_output=True)
            if H.in_mountinfo(self.dir):
                subprocess.run(["umount", "-l", self.dir], capture_output=True)
            self.mounted = False
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            self.dev = None


def disk_full(rng: random.Random, problems: List[str], notes: List[str], poisoned: List[str]) -> Tuple[int, int]:
    """Returns (fault points tried, data lost)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("losetup"):
        notes.append("disk full: skipped (needs root, mkfs.ext4 and losetup)")
        return 0, 0
    base = H.scratch("faults-enospc")
    loop = None
    d = None
    tried = lost = 0
    try:
        loop = LoopExt4(base, 48)
        backing, mnt = os.path.join(loop.dir, "backing"), os.path.join(base, "mnt")
        os.mkdir(backing)
        os.mkdir(mnt)
        d = H.Daemon(backing, mnt, os.path.join(base, "daemon.log"), {"TXFS_CHECKPOINT_BYTES": str(6 << 20)})
        assert d.start(), d.log_tail()
        r = run_tx(mnt, "open(M + '/keep', 'wb').write(b'K' * 100000)")
        assert r == "ok", f"setup commit: {r}"
        # mid-commit
        loop.fill(leave=1 << 20)
        big = "for i in range(4): open(M + f'/big{i}', 'wb').write(bytes([65 + i]) * (1 << 20))"
        r = run_tx(mnt, big)
        tried += 1
        if r not in ("ENOSPC", "EFBIG"):
            problems.append(f"disk full mid-commit: the commit returned {r!r}, want ENOSPC")
        present = [n for n in os.listdir(mnt) if n.startswith("big")]
        if r != "ok" and present:
            problems.append(f"disk full mid-commit: the failed transaction left {present}")
        if open(os.path.join(mnt, "keep"), "rb").read() != b"K" * 100000:
            problems.append("disk full mid-commit: committed file 'keep' changed")
            lost += 1
        loop.free()
        r2 = run_tx(mnt, big)
        if r2 != "ok":
            problems.append(f"disk full: after freeing space the mount does not work: commit returned {r2!r}")
        else:
            for i in range(4):
                if open(os.path.join(mnt, f"big{i}"), "rb").read() != bytes([65 + i]) * (1 << 20):
                    problems.append(f"disk full: big{i} reads back wrong after the retried commit")
        notes.append(f"disk full mid-commit: commit → {r}; after freeing space → {r2}")
        # mid-checkpoint: the journal holds ~4 MiB; fill, then push past the 6 MiB threshold.
        acked = {}
        for i in range(3):
            body = f"open(M + '/c{i}', 'wb').write(bytes([{97 + i}]) * (900 << 10))"
            if run_tx(mnt, body) == "ok":
                acked[f"c{i}"] = bytes([97 + i]) * (900 << 10)
        loop.fill(leave=256 << 10)
        results = []
        for i in range(3, 8):
            body = f"open(M + '/c{i}', 'wb').write(bytes([{97 + i}]) * (300 << 10))"
            r = run_tx(mnt, body)
            results.append(r)
            if r == "ok":
                acked[f"c{i}"] = bytes([97 + i]) * (300 << 10)
        tried += 1
        plain = None
        try:
            with open(os.path.join(mnt, "keep"), "rb") as f:
                plain = "ok" if f.read() == b"K" * 100000 else "wrong data"
        except OSError as e:
            plain = errno.errorcode.get(e.errno, str(e.errno))
        loop.free()
        try:
            with open(os.path.join(mnt, "after-free"), "wb") as f:
                f.write(b"x")
            works = "ok"
        except OSError as e:
            works = errno.errorcode.get(e.errno, str(e.errno))
        notes.append(f"disk full mid-checkpoint: commits while full → {results}; a read of a committed file → "
                     f"{plain}; a write after freeing the space → {works}")
        if works != "ok":
            poisoned.append(f"after ENOSPC inside a checkpoint the running mount answers {works} until it is "
                            f"remounted (DESIGN §4: the engine is poisoned after an I/O error in a checkpoint); "
                            f"commits while the disk was full returned {sorted(set(results))}, not ENOSPC")
        ok, err = d.umount()
        if not ok:
            # A poisoned engine may refuse the final checkpoint: kill it, recovery must then finish it.
            d.kill9()
        d = H.Daemon(backing, mnt, os.path.join(base, "daemon2.log"))
        if not d.start():
            problems.append(f"disk full: the remount after freeing space failed:\n{d.log_tail()}")
            lost += len(acked)
        else:
            for n, want in acked.items():
                try:
                    got = open(os.path.join(mnt, n), "rb").read()
                except OSError:
                    got = None
                if got != want:
                    lost += 1
                    problems.append(f"disk full mid-checkpoint: acknowledged commit of {n} lost after remount")
            ok, err = d.umount()
            if not ok:
                problems.append(f"disk full: final umount failed: {err}")
        d = None
        chk = H.txfs_cli("check", backing)
        if chk.returncode != 0:
            problems.append(f"disk full: txfs check after the run: {chk.stdout}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"disk full: the check itself failed: {e!r}")
    finally:
        if d is not None:
            d.kill9()
        H.lazy_unmount(os.path.join(base, "mnt"))
        if loop is not None:
            loop.close()
        shutil.rmtree(base, ignore_errors=True)
    return tried, lost


# ---- 2. journal damage ---------------------------------------------------------------------------


def journal_damage(rng: random.Random, trials: int, problems: List[str], notes: List[str]) -> Tuple[int, int]:
    base = H.scratch("faults-journal")
    tried = lost = 0
    try:
        backing, mnt = os.path.join(base, "backing"), os.path.join(base, "mnt")
        os.mkdir(backing)
        os.mkdir(mnt)
        d = H.Daemon(backing, mnt, os.path.join(base, "daemon.log"))
        assert d.start(), d.log_tail()
        snaps = [H.read_tree(mnt)]
        for i in range(10):
            body = f"open(M + '/f{i % 4}', 'ab').write(b'{i}' * {rng.randrange(10, 9000)})\n" \
                   f"open(M + '/n{i}', 'wb').write(b'N{i}')"
            r = run_tx(mnt, body, durable=True)
            assert r == "ok", r
            snaps.append(H.read_tree(mnt))
        d.kill9()
        jdir = os.path.join(backing, ".txfs", "journal")
        (jname,) = os.listdir(jdir)
        jlen = os.path.getsize(os.path.join(jdir, jname))
        pristine = os.path.join(base, "pristine")
        shutil.copytree(backing, pristine, symlinks=True)
        shutil.rmtree(backing)
        stats = {"refused": 0, "cut": 0, "harmless": 0}
        for t in range(trials):
            shutil.copytree(pristine, backing, symlinks=True)
            jp = os.path.join(backing, ".txfs", "journal", jname)
            if rng.random() < 0.6:
                off = rng.randrange(0, jlen)
                bit = rng.randrange(8)
                with open(jp, "r+b") as f:
                    f.seek(off)
                    b = f.read(1)[0]
                    f.seek(off)
                    f.write(bytes([b ^ (1 << bit)]))
                what = f"bit {bit} of byte {off} (of {jlen}) flipped"
            else:
                off = rng.randrange(0, jlen)
                os.truncate(jp, off)
                what = f"journal truncated to {off} of {jlen} bytes"
            tried += 1
            chk = H.txfs_cli("check", backing)
            damage = chk.returncode == 1 and "DAMAGE" in chk.stdout
            cut = "torn tail" in chk.stdout
            ok = d2 = None
            d2 = H.Daemon(backing, mnt, os.path.join(base, f"d{t}.log"))
            mounted = d2.start()
            if mounted:
                got = H.read_tree(mnt)
                d2.kill9()
                if damage:
                    problems.append(f"journal damage ({what}): txfs check said DAMAGE but the mount accepted it")
                # Whatever mounted must be a committed prefix; without a reported cut, the whole.
                idx = [i for i, s in enumerate(snaps) if s == got]
                if not idx:
                    problems.append(f"journal damage ({what}): the mount shows a state that was never committed:"
                                    f" {H.tree_diff(snaps[-1], got)[:3]}")
                    lost += 1
                elif not cut and idx[-1] != len(snaps) - 1:
                    problems.append(f"journal damage ({what}): commits silently lost (state {idx[-1]} of "
                                    f"{len(snaps) - 1}) and txfs check reported nothing")
                    lost += len(snaps) - 1 - idx[-1]
                elif cut:
                    stats["cut"] += 1
                else:
                    stats["harmless"] += 1
            else:
                d2.reap()
                stats["refused"] += 1
                if not damage:
                    problems.append(f"journal damage ({what}): the mount refused but txfs check did not report "
                                    f"damage (exit {chk.returncode}): {chk.stdout.strip()[:200]}")
            del ok
            shutil.rmtree(backing)
        notes.append(f"journal damage: {tried} damaged journals: {stats['refused']} refused by mount (check: "
                     f"DAMAGE), {stats['cut']} cut as a torn tail to a committed prefix (reported by check), "
                     f"{stats['harmless']} flips of bytes nothing reads (state complete, nothing reported)")
    except Exception as e:  # noqa: BLE001
        problems.append(f"journal damage: the check itself failed: {e!r}")
    finally:
        H.lazy_unmount(os.path.join(base, "mnt"))
        shutil.rmtree(base, ignore_errors=True)
    return tried, lost


# ---- 3. lost mount ----------------------------------------------------------------------------------


def lost_mount(rounds: int, problems: List[str], notes: List[str]) -> Tuple[int, int]:
    base = H.scratch("faults-lazy")
    tried = lost = 0
    try:
        backing, mnt = os.path.join(base, "backing"), os.path.join(base, "mnt")
        os.mkdir(backing)
        os.mkdir(mnt)
        committed = {}
        for rnd in range(rounds):
            d = H.Daemon(backing, mnt, os.path.join(base, f"d{rnd}.log"))
            assert d.start(), d.log_tail()
            for i in range(3):
                n = f"r{rnd}c{i}"
                r = run_tx(mnt, f"open(M + '/{n}', 'wb').write(b'{n}' * 1000)", durable=i % 2 == 0)
                assert r == "ok", r
                committed[n] = f"{n}".encode() * 1000
            # Two processes with open transactions, waiting on stdin to commit.
            body = ("open(M + '/open{k}', 'wb').write(b'U' * 5000)\n"
                    "os.rename(M + '/r{rnd}c0', M + '/moved{k}')\n"
                    "print('ready', flush=True); sys.stdin.readline()")
            kids = []
            for k in range(2):
                code = tx_script(mnt, body.format(k=k, rnd=rnd))
                p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
                kids.append(p)
            how = "lazy unmount" if rnd % 2 == 0 else "connection aborted, then lazy unmount"
            if rnd % 2 == 1:
                conn = os.minor(os.stat(mnt).st_dev)
                ctl = "/sys/fs/fuse/connections"
                if not os.path.exists(f"{ctl}/{conn}"):
                    subprocess.run(["mount", "-t", "fusectl", "none", ctl], capture_output=True)
                with open(f"{ctl}/{conn}/abort", "w") as f:
                    f.write("1")
            fu = subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, text=True)
            if fu.returncode != 0 or H.in_mountinfo(mnt):
                problems.append(f"lost mount round {rnd}: fusermount3 -u -z failed: {fu.stderr.strip()}")
            tried += 1
            outs = []
            for p in kids:
                try:
                    out, _ = p.communicate("\n", timeout=60)
                except BrokenPipeError:
                    out = (p.stdout.read() if p.stdout else "") or "died"
                    p.wait()
                outs.append(out.strip().splitlines()[-1] if out.strip() else "died")
            # After a lazy unmount a process's open descriptors (the client keeps one on the mount root)
            # still reach the daemon: such a commit may succeed, and must then be whole. After a
            # connection abort nothing may commit.
            if rnd % 2 == 1 and "ok" in outs:
                problems.append(f"lost mount round {rnd} ({how}): a commit succeeded on an aborted connection")
            for k, o in enumerate(outs):
                if o == "ok":
                    committed[f"open{k}"] = b"U" * 5000
                    committed[f"moved{k}"] = committed.pop(f"r{rnd}c0")
            try:
                assert d.proc is not None
                d.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                problems.append(f"lost mount round {rnd}: the daemon did not end after the lazy unmount")
                d.kill9()
            if d.proc is not None and d.proc.returncode != 0:
                notes.append(f"lost mount round {rnd}: daemon exit status {d.proc.returncode}")
            d2 = H.Daemon(backing, mnt, os.path.join(base, f"v{rnd}.log"))
            if not d2.start():
                problems.append(f"lost mount round {rnd}: remount failed:\n{d2.log_tail()}")
                break
            got = H.read_tree(mnt)
            for n, want in committed.items():
                if got.get(n, ("", 0, b""))[2:] != (want,):
                    lost += 1
                    problems.append(f"lost mount round {rnd}: committed {n} missing or changed")
            stray = [n for n in got if n.startswith(("open", "moved")) and n not in committed]
            if stray:
                problems.append(f"lost mount round {rnd}: open transactions left {stray}")
            ok, err = d2.umount()
            if not ok:
                problems.append(f"lost mount round {rnd}: umount: {err}")
            notes.append(f"lost mount round {rnd} ({how}): the open transactions' commits returned {outs}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"lost mount: the check itself failed: {e!r}")
    finally:
        H.lazy_unmount(os.path.join(base, "mnt"))
        shutil.rmtree(base, ignore_errors=True)
    return tried, lost


def main() -> None:
    args = H.parse_args(__doc__.splitlines()[0])
    rng = random.Random(args.seed)
    long = args.mode == "long"
    cmd = H.command("faults.py", args)
    rows, notes = [], []
    poisoned: List[str] = []
    for name, fn in [
        ("backing disk full mid-commit and mid-checkpoint (ext4 loop device)",
         lambda p, n: disk_full(rng, p, n, poisoned)),
        ("journal bit flips and truncation (unmounted)",
         lambda p, n: journal_damage(rng, 300 if long else 40, p, n)),
        ("mount lost (fusermount3 -u -z) under open transactions", lambda p, n: lost_mount(5 if long else 2, p, n)),
    ]:
        problems: List[str] = []
        t0 = time.monotonic()
        tried, lost = fn(problems, notes)
        rows.append(H.row(name, "fault", tried, len(problems), lost, time.monotonic() - t0, cmd))
        notes.extend(f"VIOLATION {name}: {p}" for p in problems[:10])
    if poisoned:
        r = H.row("disk full mid-checkpoint: the mount works again once space is freed", "fault", 1, 1, 0, 0, cmd)
        r["known_bug"] = "open: " + poisoned[0]
        rows.append(r)
    H.finish(args, rows, notes)


if __name__ == "__main__":
    main()
