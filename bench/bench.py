"""The benchmark suite of issue 5: every workload native vs inside txfs.

Run through bench/run (which builds the release daemon and the C drivers).
Each trial is one subprocess (a C driver from bench/c or a Python sqlite3
worker) that checks its own result and prints {"seconds", "ops"}; sides are
alternated A/B/A/B... over the rounds; medians and spreads are reported.

Counters per trial: fsync-family calls of the workload's process tree and of
the txfs daemon (LD_PRELOAD fsynccount.so; the daemon's are the syncs that
reach the disk), bytes written by the process tree (rusage ru_oublock, i.e.
/proc/PID/io write_bytes of reaped children) plus the daemon's write_bytes,
and the backing device's sectors written (/proc/diskstats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
import re
import resource

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "clients", "python"))
import txfs  # noqa: E402

PY = sys.executable
SQL = os.path.join(HERE, "sqlite_work.py")

QUICK = dict(
    rounds=1, big_rounds=1,
    w1=(2, 300), w2=(200, 4096), w3=1, w4=(2000, 1, 1000), w5=(2000, 10, 1024), w6=(100, 50),
    w7=1000, w8=dict(stat=20000, files=1000, mb=64, rand=2000), w9=(300, 100), w10=(64, 48),
    w11=(30, 1000, 100), w12=dict(sizes=((1, 100), (10, 50), (100, 10)), rm=1000), w13=((2, 4, 8), 8),
)
FULL = dict(
    rounds=5, big_rounds=3,
    w1=(2, 5000), w2=(2000, 4096), w3=10, w4=(20000, 3, 10000), w5=(100000, 200, 1024), w6=(1000, 500),
    w7=20000, w8=dict(stat=200000, files=10000, mb=1024, rand=20000), w9=(2000, 500), w10=(2048, 200),
    w11=(300, 10000, 2000), w12=dict(sizes=((1, 1000), (10, 300), (100, 50)), rm=20000), w13=((2, 4, 8), 256),
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*argv, check=True, **kw):
    return subprocess.run([str(a) for a in argv], check=check, **kw)


class Counters:
    """Syncs, bytes written and disk sectors; snapshot() before and after a trial."""

    def __init__(self, root: str) -> None:
        st = os.stat(root)
        self.dev = (os.major(st.st_dev), os.minor(st.st_dev))
        self.daemon_pid = None
        self.daemon_sync_file = None

    def disk_bytes(self) -> int:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if (int(p[0]), int(p[1])) == self.dev:
                    return int(p[9]) * 512
        return 0

    @staticmethod
    def syncs(path) -> int:
        try:
            with open(path, "rb") as f:
                return sum(struct.unpack("4Q", f.read(32)))
        except (OSError, struct.error):
            return 0

    def daemon_write_bytes(self) -> int:
        if not self.daemon_pid:
            return 0
        try:
            with open(f"/proc/{self.daemon_pid}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def snapshot(self) -> dict:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return dict(
            disk=self.disk_bytes(), app_bytes=ru.ru_oublock * 512, daemon_bytes=self.daemon_write_bytes(),
            daemon_syncs=self.syncs(self.daemon_sync_file) if self.daemon_sync_file else 0,
        )


class Mount:
    """A txfs daemon in the foreground (so its pid is ours), logging at warn."""

    def __init__(self, ctx, backing: str, point: str, env_extra: dict | None = None) -> None:
        self.ctx, self.backing, self.point = ctx, backing, point
        os.makedirs(backing, exist_ok=True)
        os.makedirs(point, exist_ok=True)
        self.sync_file = backing + ".syncs"
        env = dict(os.environ, TXFS_LOG="warn", LD_PRELOAD=ctx.shim, BENCH_FSYNC_FILE=self.sync_file)
        env.update(env_extra or {})
        self.logf = open(backing + ".log", "ab")
        self.proc = subprocess.Popen([ctx.txfs, "mount", "-f", backing, point], env=env,
                                     stdout=self.logf, stderr=self.logf)
        deadline = time.time() + 60
        while not self.mounted():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"txfs mount failed, see {backing}.log")
            time.sleep(0.05)
        ctx.mounts.append(self)

    def mounted(self) -> bool:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == self.point for line in f)

    def vm_hwm_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def reset_hwm(self) -> None:
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def umount(self) -> None:
        if self in self.ctx.mounts:
            self.ctx.mounts.remove(self)
        if self.proc.poll() is None:
            sh(self.ctx.txfs, "umount", self.point, check=False)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.mounted():
            sh("umount", "-l", self.point, check=False)


class Ctx:
    def __init__(self, args) -> None:
        self.args = args
        self.backing = args.backing
        self.cfg = QUICK if args.quick else FULL
        self.root = args.root
        self.txfs = args.txfs
        self.drivers = args.drivers
        self.shim = args.shim
        self.passthrough = args.passthrough
        self.mounts: list[Mount] = []
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.rss: dict[str, int] = {}  # the main daemon's VmHWM (MiB) per workload
        self.native = os.path.join(self.root, "native")
        self.scratch = os.path.join(self.root, "scratch")
        os.makedirs(self.native)
        os.makedirs(self.scratch)
        self.counters = Counters(self.root)
        self.tag = args.tag
        self.mnt = f"/tmp/bench-{self.tag}-mnt"
        self.main = Mount(self, os.path.join(self.root, "backing"), self.mnt)
        self.counters.daemon_pid = self.main.proc.pid
        self.counters.daemon_sync_file = self.main.sync_file
        self.trace = None
        if not args.no_trace:
            try:
                self.trace = FuseTrace(self.mnt, f"bench-{self.tag}")
            except OSError as e:
                self.notes.append(f"FUSE request tracing unavailable ({e}).")

    def fresh(self, side_dir: str) -> str:
        if os.path.exists(side_dir):
            shutil.rmtree(side_dir)
        os.makedirs(side_dir)
        return side_dir

    def workdir(self, side: str, name: str) -> str:
        base = self.mnt if side.startswith("txfs") or side == "vfs" else self.native
        if side == "passthrough_ll":
            base = self.pt_mnt
        return os.path.join(base, name)


class FuseTrace:
    """Counts the FUSE requests to one mount by opcode, with their latency
    (request sent -> answered), from the kernel's fuse tracepoints in a private
    ftrace instance. Enabled only around txfs trials; costs ~1 µs per request."""

    def __init__(self, point: str, tag: str) -> None:
        self.dir = f"/sys/kernel/tracing/instances/{tag}"
        if not os.path.isdir("/sys/kernel/tracing/instances"):
            # tracefs is not mounted on a fresh machine (it was not in the
            # 2026-11-23 run): mount it, as root may.
            subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        st = os.stat(point)
        os.makedirs(self.dir, exist_ok=True)
        self.w("buffer_size_kb", "65536")
        flt = f"connection == {os.minor(st.st_dev)}" if os.major(st.st_dev) == 0 else "0"
        self.w("events/fuse/fuse_request_send/filter", flt)
        self.w("events/fuse/fuse_request_end/filter", flt)

    def w(self, name: str, val: str) -> None:
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(val)

    def start(self, enable: bool = True) -> None:
        self.w("events/fuse/enable", "0")
        self.w("trace", "")
        if enable:
            self.w("events/fuse/enable", "1")

    def stop(self) -> dict:
        """{opcode: [count, total seconds]}"""
        self.w("events/fuse/enable", "0")
        sent: dict = {}
        ops: dict = {}
        with open(os.path.join(self.dir, "trace")) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                try:
                    head, ev = line.split(": fuse_request_", 1)
                    ts = float(head.split()[-1])
                    req = int(ev.split(" req ")[1].split()[0])
                except (ValueError, IndexError):
                    continue
                if ev.startswith("send"):
                    sent[req] = (ts, ev.split("(")[1].split(")")[0].replace("FUSE_", ""))
                elif req in sent:
                    t0, op = sent.pop(req)
                    c = ops.setdefault(op, [0, 0.0])
                    c[0] += 1
                    c[1] += ts - t0
        return ops

    def close(self) -> None:
        try:
            self.w("events/fuse/enable", "0")
            os.rmdir(self.dir)
        except OSError:
            pass


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def trial(ctx: Ctx, argv: list, env_extra: dict | None = None, cwd: str | None = None, drop=False) -> dict:
    """One measured subprocess; returns its JSON plus the counters' deltas."""
    os.sync()
    if drop:
        drop_caches()
    sync_file = os.path.join(ctx.root, "app.syncs")
    if os.path.exists(sync_file):
        os.unlink(sync_file)
    env = dict(os.environ, LD_PRELOAD=ctx.shim, BENCH_FSYNC_FILE=sync_file, TXFS_MOUNT=ctx.mnt)
    env.update(env_extra or {})
    tracing = ctx.trace is not None and env["TXFS_MOUNT"] == ctx.mnt and any(
        str(a).startswith(ctx.mnt) for a in list(argv) + [cwd or ""])
    if tracing:
        # our drivers trace their measured part themselves; other commands wholly
        self_traced = str(argv[0]) in (ctx.drivers, PY)
        ctx.trace.start(enable=not self_traced)
        if self_traced:
            env["BENCH_TRACE_ENABLE"] = os.path.join(ctx.trace.dir, "events/fuse/enable")
    before = ctx.counters.snapshot()
    t0 = time.perf_counter()
    p = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = ctx.counters.snapshot()
    fuse_ops = ctx.trace.stop() if tracing else None
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {"seconds": wall, "ops": 1}
    out.update({k: after[k] - before[k] for k in after})
    out["app_syncs"] = Counters.syncs(sync_file)
    if fuse_ops is not None:
        out["fuse"] = fuse_ops
    return out


def compare(ctx: Ctx, sides: dict, rounds: int | None = None) -> dict:
    """sides: name -> fn() returning a trial result. Alternates the order every round."""
    rounds = rounds or ctx.cfg["rounds"]
    names = list(sides)
    res: dict = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            res[n].append(sides[n]())
    return res


def per_op(trials: list) -> tuple:
    xs = [t["seconds"] / max(t["ops"], 1) for t in trials]
    med = statistics.median(xs)
    spread = (max(xs) - min(xs)) / med if med and len(xs) > 1 else 0.0
    return med, spread


def add_row(ctx: Ctx, wid: str, label: str, res: dict, base: str, cand: str, target: float | None,
            target_text: str, seed: str, unit: str = "us", extra: dict | None = None) -> None:
    """A table row: cand vs base, ratio = base time per op / cand time per op (higher is better)."""
    b, bs = per_op(res[base])
    c, cs = per_op(res[cand])
    ratio = b / c if c else float("nan")

    def syncs_per_op(trials, side):
        n = sum(t["ops"] for t in trials)
        disk = sum(t["app_syncs"] + (t["daemon_syncs"] if side.startswith("txfs") or side == "vfs" else 0) for t in trials)
        return disk / n

    def bytes_per_op(trials, side):
        n = sum(t["ops"] for t in trials)
        own = sum(t["app_bytes"] + (t["daemon_bytes"] if side.startswith("txfs") or side == "vfs" else 0) for t in trials)
        return own / n, sum(t["disk"] for t in trials) / n

    scale = {"us": 1e6, "ms": 1e3, "s": 1}[unit]
    # The ratio's range: each round's baseline against the same round's txfs
    # side (the order alternates within a round), min to max. A target is
    # met only when the worst round clears it, missed when the best does
    # not, and within noise between.
    pairs = [(bt["seconds"] / max(bt["ops"], 1)) / (ct["seconds"] / max(ct["ops"], 1))
             for bt, ct in zip(res[base], res[cand]) if ct["seconds"] > 0]
    lo, hi = (min(pairs), max(pairs)) if pairs else (ratio, ratio)
    row = dict(
        id=wid, label=label, base=base, cand=cand, base_val=b * scale, cand_val=c * scale, unit=unit,
        base_spread=bs, cand_spread=cs, ratio=ratio, target=target, target_text=target_text, seed=seed,
        met=verdict(lo, hi, target), ratio_lo=lo, ratio_hi=hi, backing=ctx.backing,
        base_syncs=syncs_per_op(res[base], base), cand_syncs=syncs_per_op(res[cand], cand),
        base_bytes=bytes_per_op(res[base], base), cand_bytes=bytes_per_op(res[cand], cand),
        rounds=len(res[base]), conflicts=sum(t.get("conflicts", 0) for t in res[cand]),
    )
    fuse: dict = {}
    for t in res[cand]:
        for op, (n, secs) in t.get("fuse", {}).items():
            c = fuse.setdefault(op, [0, 0.0])
            c[0] += n
            c[1] += secs
    if fuse:
        nops = sum(t["ops"] for t in res[cand] if "fuse" in t)
        row["fuse"] = {op: (n / nops, secs / nops * 1e6, secs / n * 1e6) for op, (n, secs) in fuse.items()}
    row.update(extra or {})
    ctx.rows.append(row)
    log(f"{wid} {label}: {base} {row['base_val']:.1f}{unit}/op, {cand} {row['cand_val']:.1f}{unit}/op, ratio {ratio:.2f}")


def verdict(lo: float, hi: float, target: float | None):
    """True: met (the worst round clears the target); False: missed (the
    best round does not); "noise": the rounds straddle it; None: no target."""
    if target is None:
        return None
    if lo >= target:
        return True
    if hi < target:
        return False
    return "noise"


def met_text(met) -> str:
    return {None: "—", True: "yes", False: "**no**", "noise": "within noise"}[met]


def drv(ctx: Ctx, *args):
    return [ctx.drivers, *args]


# ---- the workloads ----------------------------------------------------------
def w1(ctx: Ctx) -> None:
    threads, n = ctx.cfg["w1"]
    res = compare(ctx, {
        "native": lambda: trial(ctx, drv(ctx, "createunlink", "native", ctx.fresh(ctx.workdir("native", "w1")), threads, n)),
        "txfs": lambda: trial(ctx, drv(ctx, "createunlink", "txfs", ctx.fresh(ctx.workdir("txfs", "w1")), threads, n)),
    })
    add_row(ctx, "W1", f"create/unlink/fsync(dir), {threads} threads", res, "native", "txfs", 1.5, "≥ 1.5×", "133×")


def w2(ctx: Ctx) -> None:
    n, size = ctx.cfg["w2"]
    res = compare(ctx, {
        "native": lambda: trial(ctx, drv(ctx, "logproto", "native", ctx.fresh(ctx.workdir("native", "w2")), n, size, "log")),
        "txfs": lambda: trial(ctx, drv(ctx, "logproto", "txfs", ctx.fresh(ctx.workdir("txfs", "w2")), n, size, "log")),
        "txfs-nolog": lambda: trial(ctx, drv(ctx, "logproto", "txfs", ctx.fresh(ctx.workdir("txfs", "w2")), n, size, "nolog")),
    })
    add_row(ctx, "W2", "logging protocol (Fig. 1b) in a transaction", res, "native", "txfs", 1.5, "≥ 1.5×", "1.20×")
    add_row(ctx, "W2", "same update, log dropped", res, "native", "txfs-nolog", 2.0, "≥ 2×", "—")


def w3(ctx: Ctx) -> None:
    mb = ctx.cfg["w3"]
    res = compare(ctx, {
        "native": lambda: trial(ctx, drv(ctx, "ordering", "native", ctx.fresh(ctx.workdir("native", "w3")), mb)),
        "txfs": lambda: trial(ctx, drv(ctx, "ordering", "txfs", ctx.fresh(ctx.workdir("txfs", "w3")), mb)),
    })
    add_row(ctx, "W3", f"ordering: 3×{mb} MB new files, then {mb} of {4 * mb} MB", res, "native", "txfs",
            1.4, "≥ 1.4×", "1.38×", unit="ms")


def vfs_available() -> bool:
    return os.path.exists(os.path.join(REPO, "clients", "sqlite", "txfs_vfs.so"))


def sqlite_sides(ctx: Ctx, make) -> dict:
    """make(mode, side_dir) -> argv; the template copy is done by make too."""
    sides = {}
    for mode in ("delete", "truncate", "wal"):
        sides[mode] = (lambda m=mode: make(m, ctx.fresh(ctx.workdir("native", f"sq-{m}"))))
    sides["txfs"] = lambda: make("txfs", ctx.fresh(ctx.workdir("txfs", "sq-txfs")))
    if vfs_available():
        sides["vfs"] = lambda: make("vfs", ctx.fresh(ctx.workdir("txfs", "sq-vfs")))
    return sides


def w4(ctx: Ctx) -> None:
    rows, ntx, per_tx = ctx.cfg["w4"]
    tmpl = os.path.join(ctx.scratch, "w4.db")
    sh(PY, SQL, "populate-w4", tmpl, rows)
    for op in ("insert", "update"):
        def make(mode, d, op=op):
            db = os.path.join(d, "t.db")
            shutil.copyfile(tmpl, db)
            return trial(ctx, [PY, SQL, "w4", mode, db, op, ntx, per_tx])
        sides = sqlite_sides(ctx, make)
        if "vfs" in sides:
            # The VFS gives each connection a 64 MiB page cache (its reads
            # cannot use the kernel's): rollback with the same cache, too.
            sides["delete-64m"] = lambda: make("delete-64m", ctx.fresh(ctx.workdir("native", "sq-delete-64m")))
        res = compare(ctx, sides)
        if op == "update":
            add_row(ctx, "W4", "SQLite 1 KB updates vs rollback (DELETE)", res, "delete", "txfs", 1.3, "≥ 1.3×", "1.31×")
            add_row(ctx, "W4", "SQLite 1 KB updates vs TRUNCATE", res, "truncate", "txfs", None, "—", "—")
            add_row(ctx, "W4", "SQLite 1 KB updates vs WAL", res, "wal", "txfs", 1.0, "≥ 1.0×", "—")
        else:
            add_row(ctx, "W4", "SQLite 1 KB inserts vs rollback (DELETE)", res, "delete", "txfs", 0.95, "≥ 0.95×", "0.95×")
            add_row(ctx, "W4", "SQLite 1 KB inserts vs TRUNCATE", res, "truncate", "txfs", None, "—", "—")
            add_row(ctx, "W4", "SQLite 1 KB inserts vs WAL", res, "wal", "txfs", None, "—", "—")
        # SQLite through the txfs VFS is SQLite inside txfs transactions too:
        # the workload's targets apply to it as well.
        targets = {"delete": (1.3, "≥ 1.3×"), "wal": (1.0, "≥ 1.0×")} if op == "update" else {"delete": (0.95, "≥ 0.95×")}
        vfs_row(ctx, "W4", f"SQLite 1 KB {op}s", res, targets=targets)
        if "delete-64m" in res:
            add_row(ctx, "W4", f"SQLite 1 KB {op}s, txfs VFS vs rollback, both with a 64 MiB page cache", res,
                    "delete-64m", "vfs", None, "—", "—")


def vfs_row(ctx: Ctx, wid: str, what: str, res: dict, unit: str = "us", targets: dict | None = None) -> None:
    """The third variant: clients/sqlite's txfs VFS (SQLite's commit is the txfs commit).
    targets: {"delete"|"wal": (ratio, label)} where the workload's target applies to it too."""
    if "vfs" in res:
        t = targets or {}
        for base, name in (("delete", "rollback"), ("wal", "WAL")):
            target, label = t.get(base, (None, "—"))
            add_row(ctx, wid, f"{what}, txfs VFS vs {name}", res, base, "vfs", target, label, "—", unit=unit)


def w5(ctx: Ctx) -> None:
    rows, n, kb = ctx.cfg["w5"]
    tmpl = os.path.join(ctx.scratch, "w5.db")
    sh(PY, SQL, "populate-w5", tmpl, rows)

    def make(mode, d):
        shutil.copyfile(tmpl, os.path.join(d, "mail.db"))
        return trial(ctx, [PY, SQL, "w5", mode, d, n, kb])
    sides = sqlite_sides(ctx, make)
    sides.pop("truncate")
    # The application's long-lived connection as it is (rollback or WAL,
    # synchronous=FULL), opened before its transactions (issue 24).
    for m in ("txfs-delete", "txfs-wal"):
        sides[m] = lambda m=m: make(m, ctx.fresh(ctx.workdir("txfs", f"sq-{m}")))
    res = compare(ctx, sides)
    add_row(ctx, "W5", f"Android Mail: {kb} KiB attachment + row vs rollback", res, "delete", "txfs", 2.0, "≥ 2×", "2.31×", unit="ms")
    add_row(ctx, "W5", f"Android Mail: {kb} KiB attachment + row vs WAL", res, "wal", "txfs", 1.5, "≥ 1.5×", "1.98×", unit="ms")
    add_row(ctx, "W5", "Android Mail, the app's own rollback connection inside txfs vs rollback", res, "delete", "txfs-delete",
            2.0, "≥ 2×", "2.31×", unit="ms")
    add_row(ctx, "W5", "Android Mail, the app's own WAL connection inside txfs vs WAL", res, "wal", "txfs-wal",
            1.5, "≥ 1.5×", "1.98×", unit="ms")
    vfs_row(ctx, "W5", "Android Mail", res, unit="ms", targets={"delete": (2.0, "≥ 2×"), "wal": (1.5, "≥ 1.5×")})


def w6(ctx: Ctx) -> None:
    rows, n = ctx.cfg["w6"]
    tmpl = ctx.fresh(os.path.join(ctx.scratch, "w6"))
    sh(PY, SQL, "populate-w6", tmpl, rows)

    def make(mode, d):
        for f in os.listdir(tmpl):
            shutil.copyfile(os.path.join(tmpl, f), os.path.join(d, f))
        return trial(ctx, [PY, SQL, "w6", mode, d, 2, n])
    sides = sqlite_sides(ctx, make)
    sides.pop("truncate")
    res = compare(ctx, sides)
    add_row(ctx, "W6", "2 threads × 12 DBs: read → SHA-256 → insert, vs rollback", res, "delete", "txfs", 2.0, "≥ 2×", "3.3×")
    add_row(ctx, "W6", "same, vs WAL", res, "wal", "txfs", None, "—", "—")
    vfs_row(ctx, "W6", "2 threads × 12 DBs", res, targets={"delete": (2.0, "≥ 2×")})


def populate_files(d: str, n: int) -> None:
    for i in range(n):
        os.close(os.open(os.path.join(d, f"f{i:05d}"), os.O_WRONLY | os.O_CREAT, 0o644))


def w7(ctx: Ctx) -> None:
    n = ctx.cfg["w7"]

    def run(side):
        d = ctx.fresh(ctx.workdir(side, "w7"))
        populate_files(d, n)
        sh("git", "init", "-q", d)
        argv = ["git", "add", "-A"] if side == "native" else [ctx.txfs, "run", "--mount", ctx.mnt, "--", "git", "add", "-A"]
        out = trial(ctx, argv, cwd=d)
        out["ops"] = n
        listed = subprocess.run(["git", "ls-files"], cwd=d, stdout=subprocess.PIPE, text=True, check=True).stdout.split()
        if len(listed) != n:
            raise RuntimeError(f"git add: {len(listed)} files in the index, want {n}")
        return out
    res = compare(ctx, {"native": lambda: run("native"), "txfs": lambda: run("txfs")})
    add_row(ctx, "W7", f"git add -A of {n} empty files (txfs run)", res, "native", "txfs", 0.5, "≤ 2× time", "1.0×")


def start_passthrough(ctx: Ctx) -> subprocess.Popen | None:
    if not ctx.passthrough:
        ctx.notes.append("W8: passthrough_ll was not built (libfuse3-dev missing); its column is empty.")
        return None
    src = os.path.join(ctx.root, "pt-src")
    os.makedirs(src)
    ctx.pt_mnt = f"/tmp/bench-{ctx.tag}-pt"
    os.makedirs(ctx.pt_mnt, exist_ok=True)
    p = subprocess.Popen([ctx.passthrough, "-f", "-o", f"source={src}", ctx.pt_mnt],
                         stdout=subprocess.DEVNULL, stderr=open(src + ".log", "wb"))
    deadline = time.time() + 30
    while True:
        with open("/proc/self/mounts") as f:
            if any(line.split()[1] == ctx.pt_mnt for line in f):
                break
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError("passthrough_ll did not mount")
        time.sleep(0.05)
    return p


def w8(ctx: Ctx) -> None:
    c = ctx.cfg["w8"]
    pt = start_passthrough(ctx)
    try:
        sides = ["native", "txfs"] + (["passthrough_ll"] if pt else [])
        dirs = {s: ctx.fresh(ctx.workdir(s, "w8")) for s in sides}

        def mode(s):
            return "txfs" if s == "txfs" else "native"

        def sub(name, argv_tail, drop=False, ops_label=""):
            res = compare(ctx, {s: (lambda s=s: trial(ctx, drv(ctx, name, "native", dirs[s], *argv_tail), drop=drop)) for s in sides})
            return res
        specs = [
            ("stat", (c["stat"],), False, f"stat of a hot file ×{c['stat']}", 1 / 1.5, "≤ 1.5× time", "us"),
            ("createunlink1", (c["files"],), False, f"create + unlink of {c['files']} files", None, "≥ passthrough_ll", "us"),
            ("seqwrite", (c["mb"],), False, f"sequential write {c['mb']} MiB + fsync (per MiB)", 0.7, "≥ 0.7×", "ms"),
            ("seqread", (c["mb"],), True, f"sequential read {c['mb']} MiB, cold (per MiB)", 0.7, "≥ 0.7×", "ms"),
            ("randread", (c["rand"], c["mb"]), True, f"4 KiB random reads ×{c['rand']}, cold", None, "≥ passthrough_ll", "us"),
        ]
        for name, tail, drop, label, target, ttext, unit in specs:
            res = sub(name, tail, drop)
            extra = {}
            if pt:
                pb, _ = per_op(res["native"])
                pp, _ = per_op(res["passthrough_ll"])
                tc, _ = per_op(res["txfs"])
                extra = {"pt_ratio": pb / pp, "vs_pt": pp / tc}
            add_row(ctx, "W8", label, res, "native", "txfs", target, ttext, "—", unit=unit, extra=extra)
        # What a live transaction costs everyone else: while any is live the
        # mount answers uncached (the cache gate, DESIGN §9) — here a root
        # `txfs run` idling beside plain creates and unlinks.
        argv = drv(ctx, "createunlink1", "native", dirs["txfs"], c["files"])
        res = compare(ctx, {"txfs": lambda: trial(ctx, argv), "beside-run": lambda: beside_live_run(ctx, argv)})
        add_row(ctx, "W8", f"create + unlink of {c['files']} files beside a live `txfs run` (vs none)", res,
                "txfs", "beside-run", None, "—", "—")
    finally:
        if pt:
            sh("fusermount3", "-u", ctx.pt_mnt, check=False)
            try:
                pt.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pt.kill()


def live_txs(ctx: Ctx) -> int:
    out = subprocess.run([ctx.txfs, "status", ctx.mnt], capture_output=True, text=True).stdout
    m = re.search(r"live_txs\s+(\d+)", out)
    return int(m.group(1)) if m else -1


def wait_live(ctx: Ctx, want_any: bool) -> None:
    deadline = time.monotonic() + 20
    while (live_txs(ctx) > 0) != want_any:
        if time.monotonic() > deadline:
            raise RuntimeError(f"txfs status never showed {'a' if want_any else 'no'} live transaction")
        time.sleep(0.05)


def beside_live_run(ctx: Ctx, argv: list) -> dict:
    """`argv` measured while `txfs run -- sleep` holds a transaction open (it changes nothing; killed after)."""
    run = subprocess.Popen([ctx.txfs, "run", "--mount", ctx.mnt, "--", "sleep", "3600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_live(ctx, True)
        return trial(ctx, argv)
    finally:
        run.terminate()
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        wait_live(ctx, False)


def w9(ctx: Ctx) -> None:
    n1, n8 = ctx.cfg["w9"]
    res = compare(ctx, {
        "native": lambda: trial(ctx, drv(ctx, "commit4k", "native", ctx.fresh(ctx.workdir("native", "w9")), 1, n1)),
        "txfs": lambda: trial(ctx, drv(ctx, "commit4k", "txfs", ctx.fresh(ctx.workdir("txfs", "w9")), 1, n1)),
    })
    add_row(ctx, "W9", "4 KiB durable commit vs pwrite + fdatasync (latency)", res, "native", "txfs", 1 / 1.5, "≤ 1.5× latency", "—")
    res8 = compare(ctx, {
        "txfs-1": lambda: trial(ctx, drv(ctx, "commit4k", "txfs", ctx.fresh(ctx.workdir("txfs", "w9")), 1, n8)),
        "txfs-8": lambda: trial(ctx, drv(ctx, "commit4k", "txfs", ctx.fresh(ctx.workdir("txfs", "w9")), 8, n8)),
        "native-8": lambda: trial(ctx, drv(ctx, "commit4k", "native", ctx.fresh(ctx.workdir("native", "w9")), 8, n8)),
    })
    add_row(ctx, "W9", "8 committers vs 1 (group commit, commits/s)", res8, "txfs-1", "txfs-8", 3.0, "≥ 3×", "—")
    add_row(ctx, "W9", "8 committers: txfs vs 8 native pwrite + fdatasync", res8, "native-8", "txfs-8", None, "—", "—")


def w10(ctx: Ctx) -> None:
    mb, rec_mb = ctx.cfg["w10"]
    m = Mount(ctx, os.path.join(ctx.root, "backing-big"), f"/tmp/bench-{ctx.tag}-big")
    saved = (ctx.counters.daemon_pid, ctx.counters.daemon_sync_file, ctx.mnt)
    ctx.counters.daemon_pid, ctx.counters.daemon_sync_file, ctx.mnt = m.proc.pid, m.sync_file, m.point
    hwm = []
    try:
        def txside():
            m.reset_hwm()
            f = os.path.join(m.point, "big")
            if os.path.exists(f):
                os.unlink(f)
            out = trial(ctx, drv(ctx, "bigtx", "txfs", m.point, mb, "big"))
            hwm.append(m.vm_hwm_kib())
            return out

        def native():
            f = os.path.join(ctx.native, "big")
            if os.path.exists(f):
                os.unlink(f)
            return trial(ctx, drv(ctx, "bigtx", "native", ctx.native, mb, "big"))
        res = compare(ctx, {"native": native, "txfs": txside}, rounds=ctx.cfg["big_rounds"] if not ctx.args.quick else 1)
        os.unlink(os.path.join(m.point, "big"))
        os.unlink(os.path.join(ctx.native, "big"))
        peak = max(hwm) / 1024
        add_row(ctx, "W10", f"{mb} MiB in one transaction vs write + fsync (per MiB)", res, "native", "txfs", None,
                "commits; RSS ≤ 256 MiB", "—", unit="ms",
                extra={"note": f"daemon peak RSS {peak:.0f} MiB ({'meets' if peak <= 256 else 'misses'} ≤ 256 MiB)"})
        ctx.notes.append(f"W10: daemon peak RSS (VmHWM) during the {mb} MiB transaction: {peak:.0f} MiB (target ≤ 256 MiB).")
        m.umount()
        # recovery: a fresh mount whose backing already holds the file (written natively), one
        # transaction overwriting it, SIGKILL right after the commit, then `txfs recover`. The
        # transaction keeps all of it in memory (TXFS_SPILL_BYTES, TXFS_STAGE_BYTES), so its
        # record carries the bytes and recovery replays the journal: with the defaults the
        # overwrite would be a shadow data file, which recovery renames into place (DESIGN §2a).
        rb = os.path.join(ctx.root, "backing-rec")
        os.makedirs(rb)
        sh(ctx.drivers, "bigtx", "native", rb, rec_mb, "victim", stdout=subprocess.DEVNULL)
        m = Mount(ctx, rb, f"/tmp/bench-{ctx.tag}-rec", {"TXFS_SPILL_BYTES": str((rec_mb + 16) << 20),
                                                             "TXFS_STAGE_BYTES": str((rec_mb + 16) << 20)})
        ctx.counters.daemon_pid, ctx.counters.daemon_sync_file, ctx.mnt = m.proc.pid, m.sync_file, m.point
        trial(ctx, drv(ctx, "bigtx", "txfs", m.point, rec_mb, "victim", m.proc.pid))
        m.proc.wait(timeout=60)
        sh("umount", "-l", m.point, check=False)
        meta = os.path.join(m.backing, ".txfs")
        jdir = os.path.join(meta, "journal")
        jbytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(jdir) for f in fs)
        ddir = os.path.join(meta, "data")
        dbytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ddir) for f in fs)
        mbytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(meta) for f in fs)
        ctx.notes.append(f"W10: after SIGKILL, .txfs/journal held {jbytes / 2**20:.0f} MiB and .txfs/data "
                         f"{dbytes / 2**20:.0f} MiB (all of .txfs/: {mbytes / 2**20:.0f} MiB) for a {rec_mb} MiB "
                         "overwrite (that mount keeps the whole transaction in memory, so the record carries its "
                         "bytes; with the defaults the overwrite would be a shadow data file that recovery "
                         "renames into place instead of copying). A 1 GiB "
                         "journal cannot be left behind with the default options: a commit that takes the journal "
                         "and data files past checkpoint_bytes (256 MiB) checkpoints them, so the recovery is "
                         "measured below that size.")
        if mbytes < (rec_mb << 20) // 2:
            raise RuntimeError(f".txfs/ holds {mbytes} bytes after a {rec_mb} MiB commit and SIGKILL: nothing to recover")

        def recover():
            t0 = time.perf_counter()
            sh(ctx.txfs, "recover", m.backing, stdout=subprocess.DEVNULL, env=dict(os.environ, TXFS_LOG="warn"))
            return {"seconds": time.perf_counter() - t0, "ops": rec_mb}
        rec = trial_wrap(ctx, recover)
        with open(os.path.join(m.backing, "victim"), "rb") as f:
            for off in range(0, rec_mb << 20, 1 << 20):
                f.seek(off)
                if f.read(4096) != b"B" * 4096:
                    raise RuntimeError("recovery: the committed overwrite is not in the file")
        ddf = os.path.join(ctx.native, "dd")
        dd = trial(ctx, ["dd", "if=/dev/zero", f"of={ddf}", "bs=1M", f"count={rec_mb}", "conv=fdatasync", "status=none"])
        dd["ops"] = rec_mb
        os.unlink(ddf)
        add_row(ctx, "W10", f"recovery of {rec_mb} MiB committed ({jbytes / 2**20:.0f} MiB journal, "
                f"{dbytes / 2**20:.0f} MiB data files) vs dd {rec_mb} MiB conv=fdatasync", {"dd": [dd], "recover": [rec]},
                "dd", "recover", 0.5, "≤ 2× time", "—", unit="ms")
        os.unlink(os.path.join(m.backing, "victim"))
    finally:
        ctx.counters.daemon_pid, ctx.counters.daemon_sync_file, ctx.mnt = saved
        m.umount()


def trial_wrap(ctx: Ctx, fn) -> dict:
    os.sync()
    before = ctx.counters.snapshot()
    out = fn()
    after = ctx.counters.snapshot()
    out.update({k: after[k] - before[k] for k in after})
    out["app_syncs"] = 0
    return out


def w11(ctx: Ctx) -> None:
    customers, items, n = ctx.cfg["w11"]
    tmpl = os.path.join(ctx.scratch, "tpcc.db")
    sh(PY, SQL, "populate-tpcc", tmpl, customers, items)

    def make(mode, d):
        db = os.path.join(d, "tpcc.db")
        shutil.copyfile(tmpl, db)
        return trial(ctx, [PY, SQL, "tpcc", mode, db, n])
    sides = sqlite_sides(ctx, make)
    sides.pop("truncate")
    res = compare(ctx, sides)
    add_row(ctx, "W11", f"TPC-C mix, 1 warehouse ({customers} customers/district, {items} items) vs rollback", res,
            "delete", "txfs", 1.3, "≥ 1.3×", "1.61×", unit="ms")
    add_row(ctx, "W11", "TPC-C mix vs WAL", res, "wal", "txfs", None, "—", "—", unit="ms")
    vfs_row(ctx, "W11", "TPC-C mix", res, unit="ms", targets={"delete": (1.3, "≥ 1.3×")})


def w12(ctx: Ctx) -> None:
    c = ctx.cfg["w12"]
    for k, n in c["sizes"]:
        res = compare(ctx, {
            "native": lambda: trial(ctx, drv(ctx, "faust", "native", ctx.fresh(ctx.workdir("native", "w12")), k, n)),
            "txfs": lambda: trial(ctx, drv(ctx, "faust", "txfs", ctx.fresh(ctx.workdir("txfs", "w12")), k, n)),
        })
        add_row(ctx, "W12", f"{k} × 4 KiB writes per transaction vs + fsync", res, "native", "txfs", 1 / 1.5, "≤ 1.5× time", "Faust T4.3")
    rm = c["rm"]
    res = compare(ctx, {
        "native": lambda: trial(ctx, drv(ctx, "rmfiles", "native", ctx.fresh(ctx.workdir("native", "w12")), rm)),
        "txfs": lambda: trial(ctx, drv(ctx, "rmfiles", "txfs", ctx.fresh(ctx.workdir("txfs", "w12")), rm)),
    })
    add_row(ctx, "W12", f"remove {rm} files in one transaction vs unlink + fsync(dir)", res, "native", "txfs", 1 / 1.5, "≤ 1.5× time", "Faust T4.4")


def w13(ctx: Ctx) -> None:
    procs, mb = ctx.cfg["w13"]

    def overwrite(name: str, p: int) -> dict:
        # The files are written first, then the machine settles (the native
        # side's dirty pages, txfs's checkpoint of the fill): the trial times
        # the overwrite alone, not the aftermath of setting it up.
        d = ctx.fresh(ctx.workdir(name, "w13"))
        sh(*drv(ctx, "valorfill", name, d, p, mb))
        settle(ctx)
        return trial(ctx, drv(ctx, "valor", name, d, p, mb, "nofill"))
    for p in procs:
        res = compare(ctx, {
            "native": lambda: overwrite("native", p),
            "txfs": lambda: overwrite("txfs", p),
        }, rounds=ctx.cfg["big_rounds"])
        for side in res.values():
            for t in side:
                t["ops"] = t.get("mb", p * mb)  # per MiB written
        add_row(ctx, "W13", f"{p} processes each overwriting {mb} MiB (per MiB)", res, "native", "txfs", 0.5, "≥ 0.5×",
                "Valor: 0.33–0.43×", unit="ms")


WORKLOADS = {f"W{i}": f for i, f in enumerate([w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13], 1)}


# ---- the report ---------------------------------------------------------------
def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        with open("/sys/module/fuse/parameters/enable_uring") as f:
            uring = f.read().strip() == "Y"
    except OSError:
        uring = False
    transport = "FUSE over io_uring" if uring else "/dev/fuse"
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, kernel {platform.release()}, txfs requests over {transport}"


def disk_desc(root: str) -> str:
    st = os.stat(root)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    name, fstype = "?", "?"
    with open("/proc/self/mountinfo") as f:
        best = ""
        for line in f:
            p = line.split()
            if p[2] == dev and root.startswith(p[4]) and len(p[4]) >= len(best):
                best = p[4]
                sep = p.index("-")
                fstype, name = p[sep + 1], p[sep + 2]
    return f"{name} ({fstype}, device {dev})"


def fmt_bytes(b: float) -> str:
    return f"{b / 1024:.1f}" if b < 10 * 2**20 else f"{b / 2**20:.0f} Mi"


def merge_previous(ctx: Ctx, out_dir: str, only: list) -> None:
    """--only: keep the other workloads' rows of the last report in out_dir."""
    path = os.path.join(out_dir, "benchmarks", f"{ctx.backing}.json")
    if not only or not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    keep = [r for r in old.get("rows", []) if r["id"] not in only]
    order = list(WORKLOADS)
    ctx.rows = sorted(keep + ctx.rows, key=lambda r: order.index(r["id"]))
    ctx.notes = [n for n in old.get("notes", []) if n.split(":")[0].split()[0] not in only] + ctx.notes
    ctx.notes.append(f"{', '.join(only)} rerun separately ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); "
                     "the other rows come from the previous run.")


def notebook_link(out_dir: str) -> str:
    """bench/NOTES.md relative to the report (docs/ for a full run)."""
    return os.path.relpath(os.path.join(HERE, "NOTES.md"), os.path.abspath(out_dir))


def missed_targets(rows: list, out_dir: str) -> list:
    """The table of the rows that missed their target in this report. What
    each one's time is made of, and what would close the gap, is the lab
    notebook's to tell (bench/NOTES.md, "Targets not met, and why"): the
    report links it rather than pasting the notebook."""
    L = ["## Targets missed in this run", ""]
    missed = [r for r in rows if r["met"] is False or r["met"] == "noise"]
    if not missed:
        return L + ["Every row with a target met it."]
    L += ["| # | workload | ratio (rounds' range) | target | verdict |", "|---|---|---|---|---|"]
    for r in missed:
        L.append(
            f"| {r['id']} | {r['label']} | **{r['ratio']:.2f}×** ({rng(r)}) | {r['target_text']} | {met_text(r['met'])} |"
        )
    link = notebook_link(out_dir)
    return L + [
        "",
        f"What each missed row's time is made of, and what would close the gap: [bench/NOTES.md]({link}#targets-not-met-and-why); "
        f"how each workload is run: [bench/NOTES.md]({link}#how-each-workload-is-run).",
    ]


def rng(r: dict) -> str:
    return f"{r.get('ratio_lo', r['ratio']):.2f}–{r.get('ratio_hi', r['ratio']):.2f}"


BACKINGS = {
    "ext4-journal": "journaled ext4 (made by the bench on a loop image: default mkfs.ext4, data=ordered — the paper's setup and most users')",
    "disk": "the machine's disk as it is (ext4 without a journal: a native fsync is unusually cheap there)",
}


def write_report(ctx: Ctx, out_dir: str, elapsed: float) -> None:
    """This backing's full table (out_dir/benchmarks/<backing>.md, .json,
    .png), then the reader's summary of every backing measured
    (out_dir/BENCHMARKS.md)."""
    detail = os.path.join(out_dir, "benchmarks")
    os.makedirs(detail, exist_ok=True)
    meta = dict(backing=ctx.backing, disk=disk_desc(ctx.root), machine=machine(), elapsed=elapsed,
                when=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), quick=bool(ctx.args.quick),
                rounds=ctx.cfg["rounds"], big_rounds=ctx.cfg["big_rounds"], rss=ctx.rss)
    with open(os.path.join(detail, f"{ctx.backing}.json"), "w") as f:
        json.dump({"rows": ctx.rows, "notes": ctx.notes, "meta": meta}, f, indent=1)
    mode = "--quick (smoke-test sizes: the figures mean little)" if ctx.args.quick else "full"
    L = [
        f"# Benchmarks on {ctx.backing}: every row",
        "",
        "Generated by `bench/run` — do not edit by hand. The summary of every backing is "
        "[BENCHMARKS.md](../BENCHMARKS.md); why a row misses its target, and the profiles and "
        f"experiments behind these figures, are in the lab notebook, [bench/NOTES.md]({notebook_link(detail)}).",
        "",
        f"- Backing: {BACKINGS.get(ctx.backing, ctx.backing)}.",
        f"- Machine: {machine()}; disk: {disk_desc(ctx.root)}; backing and native directories both under "
        f"`{os.path.dirname(ctx.root)}` on that disk.",
        f"- Run: {mode}, {ctx.cfg['rounds']} rounds (big workloads {ctx.cfg['big_rounds']}), sides alternated each round; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {elapsed / 60:.1f} min. Sizes are scaled to 2 cores / 24 GiB "
        "(see `bench/bench.py`, `FULL`).",
        "- **ratio** = baseline time per op ÷ txfs time per op: higher is better, > 1 means txfs is faster. "
        "Targets phrased as \"≤ k× time\" are ratio ≥ 1/k.",
        "- **syncs/op**: fsync-family calls that reach the disk (the native program's own; for txfs the daemon's, counted "
        "by an LD_PRELOAD shim — the program's fsyncs into the mount are FUSE requests, not disk syncs). "
        "**KiB/op**: bytes written by the program's processes plus, for txfs, the daemon (`write_bytes`); "
        "**dev KiB/op**: the backing device's sectors written (/proc/diskstats; includes ext4's journal and "
        "anything else the machine wrote meanwhile).",
        "- Spread = (max − min) / median over the rounds. **ratio** is the median; the range is each round's "
        "baseline against the same round's txfs side, min to max. **met**: the worst round clears the target; "
        "**no**: the best round does not; **within noise**: the rounds straddle it.",
        "",
        "| # | workload | baseline | txfs | ratio (range) | target | met | seed | syncs/op base → txfs | KiB/op base → txfs | dev KiB/op base → txfs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ctx.rows:
        met = met_text(r["met"])
        u = r["unit"]
        L.append(
            f"| {r['id']} | {r['label']}{' — ' + r['note'] if r.get('note') else ''} | {r['base']}: {r['base_val']:.1f} {u} ±{r['base_spread'] * 50:.0f}% "
            f"| {r['cand']}: {r['cand_val']:.1f} {u} ±{r['cand_spread'] * 50:.0f}% | **{r['ratio']:.2f}×** ({rng(r)}) | {r['target_text']} | {met} "
            f"| {r['seed']} | {r['base_syncs']:.2f} → {r['cand_syncs']:.2f} | {fmt_bytes(r['base_bytes'][0])} → {fmt_bytes(r['cand_bytes'][0])} "
            f"| {fmt_bytes(r['base_bytes'][1])} → {fmt_bytes(r['cand_bytes'][1])} |"
        )
    L += [""] + missed_targets(ctx.rows, detail)
    pt_rows = [r for r in ctx.rows if "pt_ratio" in r]
    if pt_rows:
        L += ["", "W8 against libfuse's `passthrough_ll` (built from Debian's libfuse3-dev examples, default options, same disk):", "",
              "| operation | passthrough_ll vs native | txfs vs native | txfs vs passthrough_ll |", "|---|---|---|---|"]
        for r in pt_rows:
            L.append(f"| {r['label']} | {r['pt_ratio']:.2f}× | {r['ratio']:.2f}× | {r['vs_pt']:.2f}× |")
    traced = [r for r in ctx.rows if r.get("fuse")]
    if traced:
        L += ["", "## Where the txfs side's time goes: FUSE requests per operation", "",
              "From the kernel's `fuse:fuse_request_send/end` tracepoints, filtered to the txfs mount, during the measured "
              "part of the txfs trials (the drivers switch tracing on and off around their timed loop; `git`, `txfs run` "
              "and `txfs recover` are traced whole): requests per workload operation by opcode, µs of request latency (sent → answered, including "
              "queueing) per operation, and mean µs per request. Top five opcodes by time.", "",
              "| # | workload (txfs side) | requests/op | top opcodes: n/op, µs/op (µs each) |", "|---|---|---|---|"]
        for r in traced:
            ops = sorted(r["fuse"].items(), key=lambda kv: -kv[1][1])
            total = sum(v[0] for v in r["fuse"].values())
            top = "; ".join(f"{op} {n:.2f}, {us:.0f} ({each:.0f})" for op, (n, us, each) in ops[:5])
            L.append(f"| {r['id']} | {r['label']} [{r['cand']}] | {total:.1f} | {top} |")
    if ctx.notes:
        L += ["", "Notes from this run:", ""] + [f"- {n}" for n in ctx.notes]
    L += ["", f"![ratios]({ctx.backing}.png)", ""]
    with open(os.path.join(detail, f"{ctx.backing}.md"), "w") as f:
        f.write("\n".join(L))
    chart(ctx.rows, os.path.join(detail, f"{ctx.backing}.png"), ctx.backing)
    summarize(out_dir)


def summarize(out_dir: str) -> None:
    """BENCHMARKS.md for a reader: what the figures say, then one table of
    the targets with every backing's ratio, its range and verdict, and the
    daemon's peak RSS per workload; the full tables are linked."""
    detail = os.path.join(out_dir, "benchmarks")
    runs = {}
    for b in BACKINGS:
        path = os.path.join(detail, f"{b}.json")
        if os.path.exists(path):
            with open(path) as f:
                runs[b] = json.load(f)
    if not runs:
        return
    names = list(runs)
    L = ["# Benchmarks", "",
         "Generated by `bench/run` — do not edit by hand. txfs against the native protocol each workload uses today "
         "(the seeds' fsync/rename dances, SQLite's own journal), side by side in one run, on "
         + " and on ".join(f"**{b}** — {BACKINGS[b]}" for b in names) + ". "
         "**ratio** = native time per operation ÷ txfs time: above 1 txfs is faster. Each figure is the median of the "
         "rounds, with the range of the rounds (each round's native side against the same round's txfs side). "
         f"Lab notebook (how each workload runs, why rows miss): [bench/NOTES.md]({notebook_link(out_dir)}).", ""]
    for b in names:
        m = runs[b].get("meta", {})
        L.append(f"- {b}: {m.get('disk', '?')}; {'--quick' if m.get('quick') else 'full'} run of {m.get('when', '?')}, "
                 f"{m.get('rounds', '?')} rounds (big workloads {m.get('big_rounds', '?')}), {m.get('elapsed', 0) / 60:.1f} min; "
                 f"every row: [benchmarks/{b}.md](benchmarks/{b}.md).")
    m0 = runs[names[0]].get("meta", {})
    L += [f"- Machine: {m0.get('machine', '?')}.", ""]
    # What the figures say.
    L += ["## In short", ""]
    for b in names:
        rows = [r for r in runs[b]["rows"] if r.get("target") is not None]
        n = {k: sum(1 for r in rows if r["met"] == k) for k in (True, "noise", False)}
        faster = sorted((r for r in runs[b]["rows"] if r.get("ratio_lo", r["ratio"]) > 1.0), key=lambda r: -r["ratio"])
        slower = sorted((r for r in runs[b]["rows"] if r.get("ratio_hi", r["ratio"]) < 1.0), key=lambda r: r["ratio"])
        L.append(f"- **{b}**: of {len(rows)} targets, {n[True]} met, {n['noise']} within noise, {n[False]} missed. "
                 f"txfs is faster in every round in {len(faster)} rows (most: "
                 + ", ".join(f"{r['id']} {r['label'][:40]} {r['ratio']:.2f}×" for r in faster[:3])
                 + f"); slower in every round in {len(slower)} (most: "
                 + ", ".join(f"{r['id']} {r['label'][:40]} {r['ratio']:.2f}×" for r in slower[:3]) + ").")
    L += ["", "## Targets", "",
          "| # | workload | target | " + " | ".join(f"{b}: ratio (range) | {b}: met" for b in names) + " | daemon peak RSS MiB |",
          "|---|---|---|" + "---|---|" * len(names) + "---|"]
    keyed = {b: {(r["id"], r["label"]): r for r in runs[b]["rows"]} for b in names}
    order = []
    for b in names:
        for r in runs[b]["rows"]:
            if r.get("target") is not None and (r["id"], r["label"]) not in order:
                order.append((r["id"], r["label"]))
    for k in order:
        cells = []
        tt = ""
        for b in names:
            r = keyed[b].get(k)
            if r is None:
                cells += ["—", "—"]
                continue
            tt = r["target_text"]
            cells += [f"**{r['ratio']:.2f}×** ({rng(r)})", met_text(r["met"])]
        rss = "/".join(str(runs[b].get("meta", {}).get("rss", {}).get(k[0], "—")) for b in names)
        L.append(f"| {k[0]} | {k[1]} | {tt} | " + " | ".join(cells) + f" | {rss} |")
    L += ["", "Daemon peak RSS: the mount's VmHWM over the workload (" + " / ".join(names) + "); the limit is 256 MiB.",
          "", "![ratios with the rounds' range](benchmarks/targets.png)", ""]
    with open(os.path.join(out_dir, "BENCHMARKS.md"), "w") as f:
        f.write("\n".join(L))
    chart_targets(runs, order, os.path.join(detail, "targets.png"))


def chart_targets(runs: dict, order: list, path: str) -> None:
    """The targets' ratios per backing, with the rounds' range as error bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(runs)
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(order) * max(1, len(names)) / 1.5 + 1.5))
    h = 0.8 / max(1, len(names))
    for i, b in enumerate(names):
        rows = {(r["id"], r["label"]): r for r in runs[b]["rows"]}
        ys, xs, lo, hi = [], [], [], []
        for y, k in enumerate(order):
            r = rows.get(k)
            if r is None:
                continue
            ys.append(y - 0.4 + h * (i + 0.5))
            xs.append(r["ratio"])
            lo.append(r["ratio"] - r.get("ratio_lo", r["ratio"]))
            hi.append(r.get("ratio_hi", r["ratio"]) - r["ratio"])
        ax.barh(ys, xs, height=h, xerr=[lo, hi], label=b, capsize=2)
    for y, k in enumerate(order):
        t = next((r["target"] for b in names for r in runs[b]["rows"] if (r["id"], r["label"]) == k), None)
        if t:
            ax.plot([t, t], [y - 0.45, y + 0.45], color="black", lw=1.5)
    ax.axvline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_yticks(list(range(len(order))))
    ax.set_yticklabels([f"{k[0]} {k[1][:48]}" for k in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio: native time / txfs time (higher is better; bars: the rounds' range; black tick = target)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart(rows: list, path: str, backing: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no chart (the table is written)")
        return
    labels = [f"{r['id']} {r['label'][:48]}" for r in rows]
    fig, ax = plt.subplots(figsize=(11, 0.34 * len(rows) + 1.5))
    ys = range(len(rows))
    colors = ["#2a9d8f" if r["met"] is True else ("#e76f51" if r["met"] is False else "#8d99ae") for r in rows]
    err = [[r["ratio"] - r.get("ratio_lo", r["ratio"]) for r in rows], [r.get("ratio_hi", r["ratio"]) - r["ratio"] for r in rows]]
    ax.barh(list(ys), [r["ratio"] for r in rows], color=colors, xerr=err, capsize=2)
    for y, r in zip(ys, rows):
        if r["target"]:
            ax.plot([r["target"], r["target"]], [y - 0.4, y + 0.4], color="black", lw=1.5)
    ax.axvline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio: baseline time / txfs time (higher is better; black tick = target)")
    ax.set_title(f"txfs vs the native protocol on {backing} (green: met, red: missed, grey: within noise or no target)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def settle(ctx: Ctx, limit: float = 60.0) -> None:
    """Before a workload: let the previous one's aftermath finish — the
    daemons' background checkpoints and the page cache they dirtied. After
    W8's 1 GiB write a W9 that started at once ran 335–484 µs per commit
    for a second or more, 230–260 µs once the checkpoint's ~0.5 GiB of dirty
    pages were written (bench/NOTES item 30). Waits until every daemon used
    no CPU for 0.5 s and Dirty + Writeback is under 64 MiB, at most `limit` s."""
    def ticks() -> int:
        total = 0
        for m in ctx.mounts:
            try:
                with open(f"/proc/{m.proc.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):
                pass
        return total

    def dirty_kib() -> int:
        n = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(("Dirty:", "Writeback:")):
                    n += int(line.split()[1])
        return n

    t_end = time.time() + limit
    while time.time() < t_end:
        os.sync()
        before = ticks()
        time.sleep(0.5)
        if ticks() == before and dirty_kib() < 64 << 10:
            return
    log(f"settle: still busy after {limit:.0f} s; going on")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--txfs", required=True)
    ap.add_argument("--drivers", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--passthrough", default="")
    ap.add_argument("--no-trace", action="store_true", help="no FUSE request counting (fuse tracepoints)")
    ap.add_argument("--backing", default="disk", choices=list(BACKINGS), help="what --root is on (the report's name)")
    args = ap.parse_args()
    only = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    for w in only:
        if w not in WORKLOADS:
            sys.exit(f"unknown workload {w} (W1..W13)")
    t0 = time.time()
    ctx = Ctx(args)
    failed = []
    try:
        for wid, fn in WORKLOADS.items():
            if only and wid not in only:
                continue
            settle(ctx)
            log(f"{wid} ...")
            w0 = time.time()
            try:
                ctx.main.reset_hwm()
            except OSError:
                pass
            try:
                fn(ctx)
            except Exception as e:  # one workload's failure must not hide the others
                failed.append(wid)
                log(f"{wid} FAILED: {e}")
                ctx.notes.append(f"{wid} failed: {str(e).splitlines()[0][:200]}")
            try:
                ctx.rss[wid] = ctx.main.vm_hwm_kib() // 1024
            except OSError:
                pass
            log(f"{wid} done in {time.time() - w0:.1f} s")
    finally:
        if ctx.trace:
            ctx.trace.close()
        for m in list(ctx.mounts):
            m.umount()
    merge_previous(ctx, args.out, only)
    write_report(ctx, args.out, time.time() - t0)
    log(f"wrote {args.out}/BENCHMARKS.md ({len(ctx.rows)} rows) in {time.time() - t0:.0f} s")
    if failed:
        sys.exit(f"workloads failed: {', '.join(failed)}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
