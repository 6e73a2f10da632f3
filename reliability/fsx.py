#!/usr/bin/env python3
"""fsx-like random exerciser for a txfs mount, checked against a model.

One thread runs a long random sequence of operations: pwrite, O_APPEND
write, truncate, pread, read-only mmap reads, stat, create, unlink, rename
(replacing, across directories, between hard links), link, listings, fsync,
and transaction begin / commit (durable or ordered) / abort. The model keeps
the committed state (names -> inode -> bytes); a transaction works on a copy
taken at begin, which a commit installs and an abort drops. Every read,
stat and listing is compared with the model.

A second thread (outside any transaction: a transaction belongs to its
thread) checks isolation while a transaction is open: it reads committed
files and must see the committed model, never the transaction's changes; it
also writes files the transaction has not touched, which the transaction must
then either not see (snapshot at begin) or lose a conflict over.

Now and then the file system is unmounted (checkpoint) and BACKING compared
with the model byte for byte (names, contents, hard links), then remounted.

A failure prints the seed, the failing step and the last operations; the
same `--seed` replays the same sequence.

Usage: python3 reliability/fsx.py [--quick|--long] [--seed N] [--json OUT]
"""

from __future__ import annotations

import copy
import errno
import json
import mmap
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolation_mount import Mount, command, finish, in_mountinfo, parse_args, row, txfs, txfs_bin  # noqa: E402

NAMES = [f"f{i}" for i in range(6)] + [f"d/g{i}" for i in range(3)]
MAX_SIZE = 300_000


class State:
    """Names -> inode number; inode number -> contents."""

    def __init__(self) -> None:
        self.names: Dict[str, int] = {}
        self.data: Dict[int, bytearray] = {}
        self.next = 1

    def gc(self) -> None:
        live = set(self.names.values())
        for ino in list(self.data):
            if ino not in live:
                del self.data[ino]


class Failure(Exception):
    pass


class Fsx:
    def __init__(self, m: Mount, seed: int, nops: int) -> None:
        self.m = m
        self.root = os.path.join(m.mnt, "fsx")
        self.rng = random.Random(seed)
        self.seed = seed
        self.nops = nops
        self.c = State()  # committed
        self.w: Optional[State] = None  # the transaction's view
        self.touched: Set[int] = set()  # inodes the transaction named or used
        self.outside_wrote: Set[int] = set()  # inodes written by the outsider during the transaction
        self.log: List[str] = []
        self.step = 0
        self.ops = 0
        self.outside_checks = 0
        self.conflicts = 0
        self.commits = 0
        self.aborts = 0
        self.remounts = 0
        self.lost = 0
        self.outsider = ThreadPoolExecutor(1)
        # $FSX_TRACE: every operation also goes to this file as it happens
        # (a SIGBUS from an mmap read kills the process before it can print)
        trace = os.environ.get("FSX_TRACE")
        self.trace = open(trace, "a") if trace else None
        os.mkdir(self.root)
        os.mkdir(os.path.join(self.root, "d"))

    # ---- helpers -----------------------------------------------------------

    @property
    def s(self) -> State:
        return self.w if self.w is not None else self.c

    def p(self, name: str) -> str:
        return os.path.join(self.root, name)

    def note(self, text: str) -> None:
        line = f"{self.step:6d} {'T' if self.w is not None else ' '} {text}"
        self.log.append(line)
        if self.trace is not None:
            self.trace.write(line + "\n")
            self.trace.flush()

    def fail(self, text: str) -> None:
        raise Failure(text)

    def use(self, name: str) -> int:
        ino = self.s.names[name]
        if self.w is not None:
            self.touched.add(ino)
        return ino

    def data_of(self, name: str) -> bytearray:
        return self.s.data[self.use(name)]

    def pick_mut(self) -> Optional[str]:
        """A name to change the data of: not one whose file another thread
        wrote during this transaction (the model could not say which of the
        two writes a committed transaction keeps; reads of them are fine)."""
        names = sorted(n for n, i in self.s.names.items() if i not in self.outside_wrote)
        return self.rng.choice(names) if names else None

    def rand_bytes(self, n: int) -> bytes:
        return bytes(self.rng.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)

    # ---- operations ----------------------------------------------------------

    def op_write(self) -> None:
        name = self.pick_mut()
        if name is None:
            return
        d = self.data_of(name)
        off = self.rng.randrange(0, min(MAX_SIZE, len(d) + 9000))
        n = self.rng.choice((1, 7, 100, 4096, 5000, 12000))
        buf = self.rand_bytes(n)[:n]
        self.note(f"pwrite {name} off={off} len={n}")
        fd = os.open(self.p(name), os.O_WRONLY)
        try:
            if os.pwrite(fd, buf, off) != n:
                self.fail("short pwrite")
        finally:
            os.close(fd)
        if len(d) < off:
            d.extend(bytes(off - len(d)))
        d[off : off + n] = buf

    def op_append(self) -> None:
        name = self.pick_mut()
        if name is None:
            return
        d = self.data_of(name)
        if len(d) > MAX_SIZE:
            return self.op_truncate()
        n = self.rng.choice((1, 50, 3000, 9000))
        buf = self.rand_bytes(n)[:n]
        self.note(f"append {name} len={n} (at {len(d)})")
        fd = os.open(self.p(name), os.O_WRONLY | os.O_APPEND)
        try:
            if os.write(fd, buf) != n:
                self.fail("short append")
        finally:
            os.close(fd)
        d.extend(buf)

    def op_truncate(self) -> None:
        name = self.pick_mut()
        if name is None:
            return
        d = self.data_of(name)
        size = self.rng.choice((0, self.rng.randrange(0, len(d) + 1), len(d) + self.rng.randrange(1, 10000)))
        self.note(f"truncate {name} {len(d)} -> {size}")
        os.truncate(self.p(name), size)
        if size < len(d):
            del d[size:]
        else:
            d.extend(bytes(size - len(d)))

    def op_read(self) -> None:
        name = self.rng.choice(sorted(self.s.names))
        d = self.data_of(name)
        off = self.rng.randrange(0, len(d) + 100)
        n = self.rng.choice((1, 10, 4096, 10000, 70000))
        self.note(f"pread {name} off={off} len={n} (size {len(d)})")
        with open(self.p(name), "rb", buffering=0) as f:
            got = os.pread(f.fileno(), n, off)
        if got != bytes(d[off : off + n]):
            self.fail(f"pread {name} off={off} len={n}: {len(got)} bytes differ from the model's {len(d[off:off+n])} (first diff at {first_diff(got, d[off:off+n])})")

    def op_mread(self) -> None:
        if self.outside_wrote:
            # NB: this transaction may have lost a conflict; a mapping then
            # shows committed bytes (the fault cannot fail: SIGBUS), not an errno.
            return self.op_read()
        name = self.rng.choice(sorted(self.s.names))
        d = self.data_of(name)
        if not d:
            return self.op_read()
        off = self.rng.randrange(0, len(d))
        n = min(len(d) - off, self.rng.choice((1, 100, 5000, 40000)))
        self.note(f"mmap-read {name} off={off} len={n} (size {len(d)})")
        with open(self.p(name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != len(d):
                self.fail(f"fstat {name}: size {size}, model {len(d)}")
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                got = mm[off : off + n]
        if got != bytes(d[off : off + n]):
            self.fail(f"mmap read {name} off={off} len={n}: differs from the model (first diff at {first_diff(got, d[off:off+n])})")

    def op_stat(self) -> None:
        name = self.rng.choice(sorted(self.s.names))
        d = self.data_of(name)
        self.note(f"stat {name}")
        st = os.stat(self.p(name))
        if st.st_size != len(d):
            self.fail(f"stat {name}: size {st.st_size}, model {len(d)}")
        links = sum(1 for i in self.s.names.values() if i == self.s.names[name])
        if st.st_nlink != links:
            self.fail(f"stat {name}: nlink {st.st_nlink}, model {links}")

    def op_create(self) -> None:
        name = self.rng.choice(NAMES)
        exists = name in self.s.names
        self.note(f"create {name} O_EXCL{' (exists: EEXIST)' if exists else ''}")
        try:
            fd = os.open(self.p(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
        except FileExistsError:
            if exists:
                return
            raise
        if exists:
            self.fail(f"create {name}: O_EXCL succeeded over an existing name")
        ino = self.s.next
        self.s.next += 1
        self.s.names[name] = ino
        self.s.data[ino] = bytearray()
        if self.w is not None:
            self.touched.add(ino)
            self.c.next = max(self.c.next, self.s.next)

    def op_unlink(self) -> None:
        name = self.rng.choice(NAMES)
        exists = name in self.s.names
        self.note(f"unlink {name}{'' if exists else ' (missing: ENOENT)'}")
        if exists:
            self.use(name)
        try:
            os.unlink(self.p(name))
        except FileNotFoundError:
            if not exists:
                return
            raise
        if not exists:
            self.fail(f"unlink {name}: succeeded on a missing name")
        del self.s.names[name]
        self.s.gc()

    def op_rename(self) -> None:
        if not self.s.names:
            return self.op_create()
        a = self.rng.choice(sorted(self.s.names))
        b = self.rng.choice(NAMES)
        self.note(f"rename {a} -> {b}{' (replaces)' if b in self.s.names else ''}")
        self.use(a)
        if b in self.s.names:
            self.use(b)
        os.rename(self.p(a), self.p(b))
        if a == b or self.s.names.get(b) == self.s.names[a]:
            return  # POSIX: same file, nothing happens
        self.s.names[b] = self.s.names.pop(a)
        self.s.gc()

    def op_link(self) -> None:
        if not self.s.names:
            return self.op_create()
        a = self.rng.choice(sorted(self.s.names))
        b = self.rng.choice(NAMES)
        exists = b in self.s.names
        self.note(f"link {a} -> {b}{' (exists: EEXIST)' if exists else ''}")
        self.use(a)
        try:
            os.link(self.p(a), self.p(b))
        except FileExistsError:
            if exists:
                return
            raise
        if exists:
            self.fail(f"link {a} {b}: succeeded over an existing name")
        self.s.names[b] = self.s.names[a]

    def op_list(self) -> None:
        self.note("listdir")
        got = sorted(os.listdir(self.root)) + sorted("d/" + n for n in os.listdir(self.p("d")))
        want = sorted(["d"] + [n for n in self.s.names if "/" not in n]) + sorted(n for n in self.s.names if "/" in n)
        if got != want:
            self.fail(f"listing {got} != model {want}")

    def op_fsync(self) -> None:
        if not self.s.names:
            return
        name = self.rng.choice(sorted(self.s.names))
        self.note(f"fsync {name}")
        self.use(name)
        fd = os.open(self.p(name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---- transactions ---------------------------------------------------------

    def begin(self) -> None:
        self.note("BEGIN")
        txfs.begin(self.root)
        self.w = copy.deepcopy(self.c)
        self.touched = set()
        self.outside_wrote = set()

    def commit(self) -> None:
        durable = self.rng.random() < 0.3
        self.note(f"COMMIT {'durable' if durable else 'ordered'}")
        try:
            txfs.commit(durable=durable)
        except txfs.Conflict:
            self.note("  -> conflict")
            self.lost_conflict("commit")
            return
        assert self.w is not None
        for ino in self.outside_wrote:
            if ino in self.w.data:  # untouched by the transaction: the outsider's bytes
                self.w.data[ino] = self.c.data[ino]
        self.c = self.w
        self.w = None
        self.commits += 1

    def abort(self) -> None:
        self.note("ABORT")
        txfs.abort()
        self.w = None
        self.aborts += 1

    def lost_conflict(self, where: str) -> None:
        """A conflict is expected only after the outsider wrote while we ran."""
        self.conflicts += 1
        if txfs.in_transaction():
            try:
                txfs.abort()
            except OSError:
                pass
        self.w = None
        if not self.outside_wrote:
            self.fail(f"conflict at {where} though nobody else wrote during the transaction")

    # ---- the outsider ---------------------------------------------------------

    def outside_check(self) -> None:
        """Another thread (no transaction) must see the committed state."""
        if not self.c.names:
            return
        name = self.rng.choice(sorted(self.c.names))
        want = bytes(self.c.data[self.c.names[name]])
        self.note(f"outsider reads {name}")

        def look() -> Tuple[Optional[bytes], Optional[int]]:
            try:
                with open(self.p(name), "rb", buffering=0) as f:
                    return f.read(), None
            except OSError as e:
                return None, e.errno

        got, err = self.outsider.submit(look).result()
        self.outside_checks += 1
        if err is not None:
            self.fail(f"outsider: reading committed {name}: {errno.errorcode.get(err, err)}")
        if got != want:
            self.fail(f"outsider sees {name} with {len(got or b'')} bytes, committed model has {len(want)} (first diff at {first_diff(got or b'', want)}): a transaction leaked")

    def outside_write(self) -> None:
        """Another thread writes a file the transaction has not touched."""
        assert self.w is not None
        free = sorted(n for n, i in self.c.names.items() if i not in self.touched)
        if not free:
            return
        name = self.rng.choice(free)
        ino = self.c.names[name]
        d = self.c.data[ino]
        off = self.rng.randrange(0, len(d) + 100)
        buf = self.rand_bytes(300)[:300]
        self.note(f"outsider pwrite {name} off={off} len=300")

        def go() -> Optional[int]:
            try:
                fd = os.open(self.p(name), os.O_WRONLY)
                try:
                    os.pwrite(fd, buf, off)
                finally:
                    os.close(fd)
                return None
            except OSError as e:
                return e.errno

        err = self.outsider.submit(go).result()
        if err is not None:
            self.fail(f"outsider pwrite {name}: {errno.errorcode.get(err, err)} (outside transactions nothing may fail)")
        if len(d) < off:
            d.extend(bytes(off - len(d)))
        d[off : off + 300] = buf
        self.outside_wrote.add(ino)

    # ---- whole-state checks -------------------------------------------------------

    def verify_all(self) -> None:
        """Outside any transaction: every name and byte equals the model."""
        self.note("verify all")
        self.op_list()
        for name, ino in sorted(self.c.names.items()):
            with open(self.p(name), "rb") as f:
                got = f.read()
            if got != bytes(self.c.data[ino]):
                self.fail(f"verify: {name} differs from the model (first diff at {first_diff(got, self.c.data[ino])})")

    def verify_backing(self) -> int:
        """After unmount: BACKING holds exactly the model; returns mismatches."""
        base = os.path.join(self.m.backing, "fsx")
        bad = 0
        got_names = sorted(n for n in os.listdir(base) if n != "d") + sorted("d/" + n for n in os.listdir(os.path.join(base, "d")))
        if got_names != sorted(n for n in self.c.names if "/" not in n) + sorted(n for n in self.c.names if "/" in n):
            self.note(f"backing names {got_names} != model {sorted(self.c.names)}")
            bad += 1
        inos: Dict[int, int] = {}
        for name, ino in self.c.names.items():
            path = os.path.join(base, name)
            try:
                with open(path, "rb") as f:
                    got = f.read()
                st = os.stat(path)
            except OSError as e:
                self.note(f"backing {name}: {e}")
                bad += 1
                continue
            if got != bytes(self.c.data[ino]):
                self.note(f"backing {name}: contents differ from the model")
                bad += 1
            if inos.setdefault(ino, st.st_ino) != st.st_ino:
                self.note(f"backing {name}: should be a hard link of another name")
                bad += 1
        return bad

    # ---- the run ----------------------------------------------------------------

    def run(self, deadline: float) -> None:
        ops = [
            (self.op_write, 14), (self.op_append, 8), (self.op_truncate, 5), (self.op_read, 14),
            (self.op_mread, 7), (self.op_stat, 5), (self.op_create, 6), (self.op_unlink, 4),
            (self.op_rename, 6), (self.op_link, 3), (self.op_list, 2), (self.op_fsync, 1),
        ]
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        for name in ("f0", "f1", "d/g0"):
            self.op_create()
        remount_every = max(500, self.nops // 4)
        while self.step < self.nops and time.monotonic() < deadline:
            self.step += 1
            r = self.rng.random()
            try:
                if self.w is None and r < 0.04:
                    self.begin()
                elif self.w is not None and r < 0.03:
                    self.commit()
                elif self.w is not None and r < 0.045:
                    self.abort()
                elif self.w is not None and r < 0.08:
                    self.outside_check()
                elif self.w is not None and r < 0.09:
                    self.outside_write()
                else:
                    if not self.s.names:
                        self.op_create()
                    else:
                        self.rng.choices(fns, weights)[0]()
                    self.ops += 1
            except txfs.Conflict:
                self.note("  -> conflict")
                self.lost_conflict("an operation")
            except OSError as e:
                if e.errno == errno.EDEADLK and self.w is not None:
                    self.note("  -> conflict")
                    self.lost_conflict("an operation")
                else:
                    raise Failure(f"unexpected error: {e}") from e
            if self.w is None and self.step % 200 == 0:
                self.verify_all()
            if self.w is None and self.step % remount_every == 0:
                self.remount()
        if self.w is not None:
            self.commit()
        self.verify_all()

    def remount(self) -> None:
        self.note("UNMOUNT (checkpoint), compare BACKING, mount again")
        if not self.m.stop():
            self.fail(f"unmount was not clean: {self.m.stop_error}\n{self.m.log_tail(5)}")
        self.note(f"  unmounted in {self.m.umount_seconds:.1f} s")
        bad = self.verify_backing()
        if bad:
            self.fail(f"BACKING differs from the model after unmount ({bad} mismatches)")
        self.m.start()
        self.remounts += 1


def first_diff(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def run_one(m: Mount, fx: Fsx, deadline: float) -> Tuple[Optional[str], int]:
    """One exerciser run; the failure (or None) and how many files BACKING lost."""
    try:
        fx.run(deadline)
        if not m.alive():
            fx.fail(f"the daemon died:\n{m.log_tail()}")
        fx.note("final UNMOUNT")
        if not m.stop():
            fx.fail(f"final unmount was not clean: {m.stop_error}\n{m.log_tail(5)}")
        bad = fx.verify_backing()
        if bad:
            fx.lost = bad
            fx.fail(f"BACKING differs from the model after the final unmount ({bad} mismatches)")
        return None, 0
    except Failure as e:
        return str(e), fx.lost
    except OSError as e:
        return f"unexpected {e!r}", fx.lost


def run_in_child(seed: int, nops: int, deadline: float) -> Dict[str, Any]:
    """Run in a forked child: a signal (SIGBUS from a mapping) cannot take
    the mount with it, and the operation trace survives the crash."""
    res: Dict[str, Any] = dict(ops=0, step=0, commits=0, aborts=0, conflicts=0, outside=0, remounts=0, lost=0, failure=None)
    with Mount("fsx") as m:
        trace = os.path.join(m.base, "trace")
        out = os.path.join(m.base, "result.json")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.environ["FSX_TRACE"] = trace
                fx = Fsx(m, seed, nops)
                failure, lost = run_one(m, fx, deadline)
                fx.outsider.shutdown()
                r = dict(ops=fx.ops, step=fx.step, commits=fx.commits, aborts=fx.aborts, conflicts=fx.conflicts,
                         outside=fx.outside_checks, remounts=fx.remounts, lost=lost, failure=failure)
                with open(out, "w") as f:
                    json.dump(r, f)
                if failure:
                    print(f"FSX FAILURE (run seed {seed}, step {fx.step}): {failure}", flush=True)
                    print("last operations:\n  " + "\n  ".join(fx.log[-40:]), flush=True)
            except BaseException as e:  # noqa: BLE001
                print(f"fsx child: {e!r}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        _, st = os.waitpid(pid, 0)
        if os.path.exists(out):
            with open(out) as f:
                res = json.load(f)
        else:
            try:
                with open(trace) as f:
                    lines = f.readlines()
            except OSError:
                lines = []
            how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit {os.waitstatus_to_exitcode(st)}"
            step = lines[-1].split()[0] if lines else "?"
            res["step"] = step
            res["failure"] = f"the exerciser process died ({how}) at step {step}: {lines[-1].strip() if lines else ''}"
            print(f"FSX FAILURE (run seed {seed}): {res['failure']}\nlast operations:\n  " + "  ".join(lines[-40:]), flush=True)
        # a child that remounted started a daemon of its own: unmount by mount point
        if in_mountinfo(m.mnt) and (m.proc is None or m.proc.poll() is not None):
            subprocess.run([txfs_bin(), "umount", m.mnt], capture_output=True, timeout=120)
            if in_mountinfo(m.mnt):
                subprocess.run(["fusermount3", "-u", m.mnt], capture_output=True, timeout=30)
    return res


def main() -> None:
    args = parse_args("fsx-like random exerciser of a txfs mount, checked against a model.", "fsx.py", "fsx exerciser", "exerciser")
    t0 = time.monotonic()
    runs = 4 if args.mode == "quick" else 12
    nops = 4000 if args.mode == "quick" else 50000
    budget = 20.0 if args.mode == "quick" else 1500.0
    rng = random.Random(args.seed)
    print(f"fsx: seed {args.seed} ({args.mode}: {runs} runs x {nops} steps)", flush=True)
    total_ops = 0
    violations = 0
    lost = 0
    notes: List[str] = []
    stats = dict(commits=0, aborts=0, conflicts=0, outside=0, remounts=0)
    deadline = t0 + budget
    for r in range(runs):
        seed = rng.randrange(2**31)
        res = run_in_child(seed, nops, deadline)
        total_ops += res["ops"]
        for k in stats:
            stats[k] += res[k]
        if res["failure"]:
            violations += 1
            lost += res["lost"]
            notes.append(f"fsx run seed {seed} failed at step {res['step']}: {res['failure']}")
        print(f"  run {r} (seed {seed}): {res['step']} steps, {res['ops']} ops, {res['commits']} commits, "
              f"{res['aborts']} aborts, {res['conflicts']} conflicts{', FAILED' if res['failure'] else ''}", flush=True)
        if time.monotonic() > deadline:
            notes.append(f"fsx: time budget reached after {r + 1} runs")
            break
    notes.insert(0, f"fsx: {total_ops} operations checked against the model ({stats['commits']} commits, "
                 f"{stats['aborts']} aborts, {stats['conflicts']} conflicts, {stats['outside']} outside-view checks, "
                 f"{stats['remounts']} mid-run unmount/compare/mount cycles); seed {args.seed}")
    notes.append("fsx: by design, not counted: a mapping read by a transaction that has lost a conflict shows the "
                 "committed bytes, not the model's (its commit fails); the exerciser reads through pread instead once "
                 "another thread wrote during the transaction")
    finish(args, [row("fsx exerciser", "exerciser", total_ops, violations, lost, time.monotonic() - t0, command("fsx.py", args))], notes)


if __name__ == "__main__":
    main()
