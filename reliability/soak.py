#!/usr/bin/env python3
"""Soak: a bounded stress run (time- and count-limited) of many client
processes running transactions against one txfs mount, while the daemon's
memory (VmRSS) and open descriptors are sampled.

Clients (processes) mix: overwrite an own file (16-64 KiB) and append a line
to a shared log in one transaction; the write-temp-then-rename pattern;
files created and removed inside a transaction; read-modify-write of shared
counters (conflicts, re-run with txfs.retry); deliberate aborts of a mkdir
tree; plain non-transactional writes and reads. The working set of names is
bounded, so the committed state does not grow without bound either.

Violations:
  * any client error other than txfs.Conflict (or a conflict that outlives
    its retries);
  * memory that keeps growing: after a warm-up (the first quarter of the
    run), the peak VmRSS of the last quarter may exceed the peak of the
    second quarter by at most 25% + 32 MiB; open descriptors of the daemon
    by at most 32;
  * a client's own files at the end differ from its last committed write,
    a shared counter differs from the number of committed increments, or
    the daemon died.

Usage: python3 reliability/soak.py [--quick|--long] [--seed N] [--json OUT]
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolation_mount import Mount, command, finish, parse_args, row, txfs  # noqa: E402

OWN_FILES = 8
COUNTERS = 4


class Deliberate(Exception):
    pass


def client(root: str, c: int, seed: int, deadline: float, max_txs: int, out: str) -> None:
    rng = random.Random(seed)
    me = os.path.join(root, f"c{c}")
    os.mkdir(me)
    last: Dict[str, str] = {}  # own file -> sha256 of its last committed contents
    counts = dict(committed=0, conflicts=0, aborts=0, single=0, logged=0, increments=[0] * COUNTERS)
    errors: List[str] = []
    n = 0

    def blob() -> bytes:
        size = rng.choice((16, 64, 256)) * 1024
        return (rng.randbytes(64) * (size // 64))[:size]

    while n < max_txs and time.monotonic() < deadline:
        n += 1
        kind = rng.random()
        try:
            if kind < 0.35:  # overwrite an own file, append to the shared log
                name = f"f{rng.randrange(OWN_FILES)}"
                data = blob()

                def t1() -> None:
                    with txfs.transaction(durable=rng.random() < 0.5, mount=root):
                        with open(os.path.join(me, name), "wb") as f:
                            f.write(data)
                        with open(os.path.join(root, "log"), "ab") as f:
                            f.write(b"c%d %d\n" % (c, n))

                counts["conflicts"] += retried(t1)
                counts["logged"] += 1
                last[name] = hashlib.sha256(data).hexdigest()
            elif kind < 0.55:  # write a temp file, rename it over an own file
                name = f"f{rng.randrange(OWN_FILES)}"
                data = blob()

                def t2() -> None:
                    with txfs.transaction(mount=root):
                        tmp = os.path.join(me, f".{name}.tmp")
                        with open(tmp, "wb") as f:
                            f.write(data)
                            os.fsync(f.fileno())
                        os.rename(tmp, os.path.join(me, name))

                counts["conflicts"] += retried(t2)
                last[name] = hashlib.sha256(data).hexdigest()
            elif kind < 0.70:  # files born and dead inside one transaction
                def t3() -> None:
                    with txfs.transaction(durable=False, mount=root):
                        for i in range(rng.randrange(1, 20)):
                            p = os.path.join(me, f"scratch{i}")
                            with open(p, "wb") as f:
                                f.write(b"x" * rng.randrange(1, 9000))
                            os.unlink(p)

                counts["conflicts"] += retried(t3)
            elif kind < 0.85:  # read-modify-write of a shared counter: conflicts
                k = rng.randrange(COUNTERS)

                def t4() -> None:
                    with txfs.transaction(mount=root):
                        p = os.path.join(root, f"counter{k}")
                        with open(p, "rb") as f:
                            v = int(f.read() or b"0")
                        with open(p, "wb") as f:
                            f.write(b"%d" % (v + 1))

                counts["conflicts"] += retried(t4)
                counts["increments"][k] += 1
            elif kind < 0.92:  # a tree made and aborted
                try:
                    with txfs.transaction(mount=root):
                        os.makedirs(os.path.join(me, "tree", "a", "b"))
                        with open(os.path.join(me, "tree", "a", "b", "f"), "wb") as f:
                            f.write(b"gone")
                        raise Deliberate()
                except Deliberate:
                    counts["aborts"] += 1
                if os.path.exists(os.path.join(me, "tree")):
                    errors.append("an aborted tree is visible")
            else:  # plain operations outside transactions
                p = os.path.join(me, "plain")
                data = blob()
                with open(p, "wb") as f:
                    f.write(data)
                with open(p, "rb") as f:
                    if f.read() != data:
                        errors.append("a plain read after a plain write differs")
                counts["single"] += 1
                counts["committed"] -= 1
            counts["committed"] += 1
        except txfs.Conflict as e:
            errors.append(f"conflict after all retries: {e}")
        except OSError as e:
            errors.append(f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e}")
        if len(errors) > 20:
            break
    with open(out, "w") as f:
        json.dump({"counts": counts, "errors": errors, "last": last}, f)


def retried(fn: Any) -> int:
    """Run fn, re-running on Conflict (at most 50 times); how many conflicts."""
    lost = 0
    for attempt in range(50):
        try:
            fn()
            return lost
        except txfs.Conflict:
            lost += 1
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    fn()  # the last Conflict propagates
    return lost


def sample(m: Mount) -> Tuple[int, int]:
    try:
        fds = len(os.listdir(f"/proc/{m.pid}/fd"))
    except OSError:
        fds = 0
    return m.rss_kib(), fds


def main() -> None:
    args = parse_args("Soak a txfs mount with many clients; watch the daemon's memory.", "soak.py", "soak", "soak")
    t0 = time.monotonic()
    rng = random.Random(args.seed)
    if args.mode == "quick":
        clients, seconds, max_txs, every = 6, 18.0, 3000, 0.2
    else:
        clients, seconds, max_txs, every = 16, 900.0, 200000, 2.0
    print(f"soak: seed {args.seed} ({args.mode}: {clients} clients, {seconds:.0f} s)", flush=True)
    violations: List[str] = []
    notes: List[str] = []
    lost = 0
    with Mount("soak") as m:
        root = os.path.join(m.mnt, "soak")
        os.mkdir(root)
        for k in range(COUNTERS):
            with open(os.path.join(root, f"counter{k}"), "wb") as f:
                f.write(b"0")
        open(os.path.join(root, "log"), "wb").close()
        deadline = time.monotonic() + seconds
        pids = {}
        outs = []
        for c in range(clients):
            out = os.path.join(m.base, f"client{c}.json")
            outs.append(out)
            cseed = rng.randrange(2**31)
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    client(root, c, cseed, deadline, max_txs, out)
                except BaseException as e:  # noqa: BLE001
                    print(f"client {c}: {e!r}", file=sys.stderr, flush=True)
                    code = 1
                os._exit(code)
            pids[pid] = c
        samples: List[Tuple[float, int, int]] = []
        start = time.monotonic()
        while pids:
            done, st = os.waitpid(-1, os.WNOHANG)
            if done:
                if st != 0:
                    violations.append(f"client {pids[done]} crashed (status {st})")
                del pids[done]
                continue
            rss, fds = sample(m)
            samples.append((time.monotonic() - start, rss, fds))
            if not m.alive():
                violations.append(f"the daemon died:\n{m.log_tail()}")
                for p in pids:
                    os.kill(p, 9)
                break
            if time.monotonic() > deadline + 120:
                violations.append("clients did not stop within 120 s of the deadline (hang?)")
                for p in pids:
                    os.kill(p, 9)
                break
            time.sleep(every)
        elapsed = time.monotonic() - start
        status = txfs.status(m.mnt)
        # the results and the data
        total = dict(committed=0, conflicts=0, aborts=0, single=0, logged=0)
        increments = [0] * COUNTERS
        for c, out in enumerate(outs):
            try:
                with open(out) as f:
                    r = json.load(f)
            except OSError:
                continue
            for k in total:
                total[k] += r["counts"][k]
            for k in range(COUNTERS):
                increments[k] += r["counts"]["increments"][k]
            for e in r["errors"][:5]:
                violations.append(f"client {c}: {e}")
            for name, digest in r["last"].items():
                try:
                    with open(os.path.join(root, f"c{c}", name), "rb") as f:
                        got = hashlib.sha256(f.read()).hexdigest()
                except OSError as e:
                    got = str(e)
                if got != digest:
                    violations.append(f"client {c}: {name} is not its last committed contents")
                    lost += 1
        for k in range(COUNTERS):
            with open(os.path.join(root, f"counter{k}"), "rb") as f:
                v = int(f.read() or b"0")
            if v != increments[k]:
                violations.append(f"counter{k} = {v}, committed increments {increments[k]} (lost update)")
                lost += 1
        with open(os.path.join(root, "log"), "rb") as f:
            log_lines = f.read().count(b"\n")
        if log_lines != total["logged"]:
            violations.append(f"the shared log has {log_lines} lines, {total['logged']} appends committed")
            lost += abs(log_lines - total["logged"])
        if not m.stop():
            violations.append(f"unmount was not clean: {m.stop_error}")
    # the memory criterion
    mem = "no samples"
    if len(samples) >= 8:
        q = elapsed / 4
        second = [s for s in samples if q <= s[0] < 2 * q] or samples[len(samples) // 4 : len(samples) // 2]
        last = [s for s in samples if s[0] >= 3 * q] or samples[-len(samples) // 4 :]
        a_rss, b_rss = max(s[1] for s in second), max(s[1] for s in last)
        a_fd, b_fd = max(s[2] for s in second), max(s[2] for s in last)
        limit = a_rss * 1.25 + 32 * 1024
        mem = (f"daemon VmRSS: start {samples[0][1] / 1024:.0f} MiB, peak of 2nd quarter {a_rss / 1024:.0f} MiB, "
               f"peak of last quarter {b_rss / 1024:.0f} MiB (limit {limit / 1024:.0f} MiB), "
               f"max {max(s[1] for s in samples) / 1024:.0f} MiB; open fds {a_fd} -> {b_fd}; {len(samples)} samples")
        if b_rss > limit:
            violations.append(f"memory grows: {mem}")
        if b_fd > a_fd + 32:
            violations.append(f"descriptors grow: {a_fd} -> {b_fd}")
    txs = total["committed"] + total["aborts"]
    notes.append(
        f"soak: {clients} clients, {elapsed:.0f} s, {total['committed']} transactions committed, "
        f"{total['aborts']} aborted on purpose, {total['conflicts']} conflicts re-run, {total['single']} plain "
        f"operations, {log_lines} log lines; daemon counters {status}; {mem}; seed {args.seed}"
    )
    for v in violations[:20]:
        print("VIOLATION", v, flush=True)
        notes.append(f"soak violation: {v}")
    series = [(round(t, 1), r) for t, r, _ in samples[:: max(1, len(samples) // 20)]]
    notes.append(f"soak: VmRSS KiB over time (s, KiB): {series}")
    finish(args, [row("soak", "soak", txs + total["single"], len(violations), lost, time.monotonic() - t0, command("soak.py", args))], notes)


if __name__ == "__main__":
    main()
