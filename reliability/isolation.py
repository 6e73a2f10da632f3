#!/usr/bin/env python3
"""Isolation checker: Elle-style reasoning over files instead of keys.

Several processes, each with a few threads, run random transactions through
a real txfs mount (`with txfs.transaction()`, re-run on `txfs.Conflict`),
mixed with single operations outside any transaction. Every run is a
*history*; the checker then reasons over it.

Objects
  list files  `kN`: an append writes one unique token (`P.T.N.I;`, sometimes
              padded so the files span several pages) with O_APPEND; a read
              reads the whole file, so every read reveals a prefix of the
              file's version order, and the final content is that order.
  set dirs    `sN`: an add creates a file named by a unique token; a read
              lists the directory (phantoms, dirty names).

Anomalies reported (each a violation; txfs claims serializability):
  G1a  aborted-read        a read saw a token of an aborted transaction
  G1b  intermediate-read   a read saw a token but not a later append of the
                           same transaction to the same file
       garbage-read        a read saw bytes no transaction wrote
       incompatible-order  a read that is not a prefix of the final file
       internal            a transaction did not see its own appends
       non-repeatable      two reads of one object in one transaction differ
                           (beyond its own appends)
       lost-append         a committed append is missing at the end (data lost)
       aborted-write       an aborted append is present at the end
       duplicate           a token is present twice
  G0/G1c/G-single/G2       a cycle in the direct serialization graph over
                           committed transactions: ww (version order), wr
                           (read the version), rw (read the version before
                           another transaction's write). Lost updates, write
                           skew, read skew (fractured reads) show up here.
       session             a cycle only through per-thread order (po): a
                           thread's transaction did not see its own earlier
                           committed transaction.

Usage: python3 reliability/isolation.py [--quick|--long] [--seed N] [--json OUT]
"""

from __future__ import annotations

import errno
import json
import os
import random
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolation_mount import Mount, command, finish, parse_args, row, txfs  # noqa: E402


class Deliberate(Exception):
    """Raised inside a transaction to abort it on purpose."""


# ---- running a history -------------------------------------------------------


def read_list(path: str) -> List[str]:
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for rec in data.split(b";"):
        if rec:
            out.append(rec.rstrip(b"-").decode("latin-1"))
    return out


def append(path: str, token: str, pad: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        rec = (token + "-" * pad + ";").encode()
        n = os.write(fd, rec)
        if n != len(rec):
            raise OSError(errno.EIO, f"short append {n}/{len(rec)}")
    finally:
        os.close(fd)


def read_set(path: str) -> List[str]:
    return sorted(os.listdir(path))


def add(path: str, token: str) -> None:
    fd = os.open(os.path.join(path, token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)


def run_thread(root: str, cfg: Dict[str, Any], who: str, seed: int, deadline: float, out: List[Dict[str, Any]]) -> None:
    rng = random.Random(seed)
    lists = [f"k{i}" for i in range(cfg["lists"])]
    sets = [f"s{i}" for i in range(cfg["sets"])]
    n = 0
    while n < cfg["txs"] and time.monotonic() < deadline:
        n += 1
        single = rng.random() < cfg["single"]
        nops = 1 if single else rng.randint(1, cfg["max_ops"])
        plan = []
        for i in range(nops):
            if sets and rng.random() < 0.2:
                key = rng.choice(sets)
                plan.append(("add", key, f"{who}.{n}.{i}") if rng.random() < 0.4 else ("read", key, None))
            else:
                key = rng.choice(lists)
                plan.append(("append", key, f"{who}.{n}.{i}") if rng.random() < 0.5 else ("read", key, None))
        deliberate = not single and rng.random() < cfg["abort"]
        durable = rng.random() < 0.5
        ops: List[List[Any]] = []

        def execute() -> None:
            for f, key, tok in plan:
                p = os.path.join(root, key)
                if f == "read":
                    v = read_set(p) if key.startswith("s") else read_list(p)
                    ops.append(["r", key, v])
                elif f == "append":
                    ops.append(["a", key, tok])  # recorded before: a failed append may still have landed
                    append(p, tok, rng.choice((0, 0, 0, 200, 1500)))
                else:
                    ops.append(["a", key, tok])
                    add(p, tok)
            if deliberate:
                raise Deliberate()

        t0 = time.monotonic()
        rec: Dict[str, Any] = {"id": f"{who}.{n}", "proc": who, "single": single, "ops": ops}
        try:
            if single:
                execute()
            else:
                with txfs.transaction(durable=durable, mount=root):
                    execute()
            rec["type"] = "ok"
        except Deliberate:
            rec["type"] = "fail"
            rec["why"] = "abort"
        except txfs.Conflict:
            rec["type"] = "fail"
            rec["why"] = "conflict"
        except OSError as e:
            rec["type"] = "info"
            rec["why"] = f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e}"
        rec["t"] = [round(t0, 6), round(time.monotonic(), 6)]
        out.append(rec)


def run_process(root: str, cfg: Dict[str, Any], p: int, seed: int, deadline: float, path: str) -> None:
    hist: List[Dict[str, Any]] = []
    threads = []
    per: List[List[Dict[str, Any]]] = []
    for t in range(cfg["threads"]):
        out: List[Dict[str, Any]] = []
        per.append(out)
        th = threading.Thread(target=run_thread, args=(root, cfg, f"{p}.{t}", seed * 1000 + p * 10 + t, deadline, out))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    for out in per:
        hist.extend(out)
    with open(path, "w") as f:
        json.dump(hist, f)


def run_history(mnt: str, name: str, cfg: Dict[str, Any], seed: int, budget: float) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    root = os.path.join(mnt, name)
    os.mkdir(root)
    for i in range(cfg["lists"]):
        open(os.path.join(root, f"k{i}"), "wb").close()
    for i in range(cfg["sets"]):
        os.mkdir(os.path.join(root, f"s{i}"))
    deadline = time.monotonic() + budget
    pids = []
    files = []
    for p in range(cfg["procs"]):
        path = os.path.join(os.path.dirname(mnt), f"{name}.p{p}.json")
        files.append(path)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_process(root, cfg, p, seed, deadline, path)
            except BaseException as e:  # noqa: BLE001 — report anything from the child
                print(f"worker {p}: {e!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    bad = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        bad += st != 0
    if bad:
        raise RuntimeError(f"{bad} worker processes failed")
    hist: List[Dict[str, Any]] = []
    for path in files:
        with open(path) as f:
            hist.extend(json.load(f))
        os.unlink(path)
    final = {}
    for i in range(cfg["lists"]):
        final[f"k{i}"] = read_list(os.path.join(root, f"k{i}"))
    for i in range(cfg["sets"]):
        final[f"s{i}"] = read_set(os.path.join(root, f"s{i}"))
    return hist, final


# ---- checking a history ------------------------------------------------------


def check(hist: List[Dict[str, Any]], final: Dict[str, List[str]]) -> Tuple[List[Dict[str, Any]], int]:
    """Anomalies of one history, and how many committed appends are lost."""
    anomalies: List[Dict[str, Any]] = []
    by_id = {t["id"]: t for t in hist}
    writer: Dict[str, str] = {}  # token -> transaction id
    appends: Dict[Tuple[str, str], List[str]] = defaultdict(list)  # (tx, key) -> tokens in order
    for t in hist:
        for f, key, v in t["ops"]:
            if f == "a":
                writer[v] = t["id"]
                appends[(t["id"], key)].append(v)

    def bad(kind: str, **kw: Any) -> None:
        anomalies.append({"type": kind, **kw})

    lost = 0
    # final states
    present: Dict[str, Set[str]] = defaultdict(set)  # tx -> tokens present at the end
    pos: Dict[str, Dict[str, int]] = {}
    for key, lst in final.items():
        seen: Set[str] = set()
        pos[key] = {}
        for i, tok in enumerate(lst):
            if tok in seen:
                bad("duplicate", key=key, token=tok)
            seen.add(tok)
            pos[key].setdefault(tok, i)
            w = writer.get(tok)
            if w is None:
                bad("garbage-final", key=key, token=tok)
                continue
            present[w].add(tok)
            if by_id[w]["type"] == "fail":
                bad("aborted-write", key=key, token=tok, tx=w, why=by_id[w].get("why"))
        for (w, k), toks in appends.items():
            if k != key:
                continue
            t = by_id[w]
            if t["type"] == "ok":
                for tok in toks:
                    if tok not in seen:
                        bad("lost-append", key=key, token=tok, tx=w)
                        lost += 1
    for t in hist:
        if t["type"] == "info":
            mine = {v for f, _, v in t["ops"] if f == "a"}
            if present[t["id"]] and present[t["id"]] != mine:
                bad("partial-commit", tx=t["id"], present=sorted(present[t["id"]]), wrote=sorted(mine))

    def visible(wid: str) -> bool:
        t = by_id[wid]
        return t["type"] == "ok" or (t["type"] == "info" and bool(present[wid]))

    committed = [t for t in hist if visible(t["id"])]
    edges: Dict[str, Dict[str, str]] = defaultdict(dict)  # a -> b -> label

    def edge(a: str, b: str, label: str) -> None:
        if a != b and label not in edges[a].get(b, ""):
            edges[a][b] = (edges[a].get(b, "") + "," + label).strip(",")

    # reads
    for t in hist:
        own: Dict[str, List[str]] = defaultdict(list)
        first: Dict[str, List[str]] = {}
        for f, key, v in t["ops"]:
            if f == "a":
                own[key].append(v)
                continue
            vals = list(v)
            for tok in vals:
                w = writer.get(tok)
                if w is None:
                    bad("garbage-read", tx=t["id"], key=key, token=tok)
                elif w != t["id"] and by_id[w]["type"] == "fail":
                    bad("G1a", tx=t["id"], key=key, token=tok, writer=w, why=by_id[w].get("why"))
            mine = own[key]
            if key.startswith("k"):
                n = len(mine)
                ext, tail = (vals[:-n], vals[-n:]) if n else (vals, [])
                if tail != mine or any(writer.get(x) == t["id"] for x in ext):
                    if t["type"] == "ok":
                        bad("internal", tx=t["id"], key=key, read=vals, own=mine)
                    continue
                if t["type"] != "ok":
                    continue
                fin = final[key]
                if fin[: len(ext)] != ext:
                    bad("incompatible-order", tx=t["id"], key=key, read=ext, final=fin[: len(ext) + 3])
                    continue
                if ext:
                    w = writer.get(ext[-1])
                    if w is not None:
                        later = appends[(w, key)]
                        if later and later[-1] != ext[-1] and w != t["id"]:
                            bad("G1b", tx=t["id"], key=key, saw=ext[-1], missed=later[later.index(ext[-1]) + 1 :], writer=w)
                        edge(w, t["id"], "wr")
                if len(ext) < len(fin):
                    nxt = writer.get(fin[len(ext)])
                    if nxt is not None:
                        edge(t["id"], nxt, "rw")
            else:
                ext = [x for x in vals if x not in mine]
                if sorted(set(mine) - set(vals)):
                    if t["type"] == "ok":
                        bad("internal", tx=t["id"], key=key, read=vals, own=mine)
                    continue
                if t["type"] != "ok":
                    continue
                for tok in ext:
                    w = writer.get(tok)
                    if w is not None:
                        edge(w, t["id"], "wr")
                seen = set(vals)
                for tok in final[key]:
                    w = writer.get(tok)
                    if tok not in seen and w is not None:
                        edge(t["id"], w, "rw")
            if t["type"] == "ok":
                if key in first and first[key] != ext:
                    bad("non-repeatable", tx=t["id"], key=key, first=first[key], then=ext)
                first.setdefault(key, ext)
    # version order
    for key, lst in final.items():
        if not key.startswith("k"):
            continue
        prev = None
        for tok in lst:
            w = writer.get(tok)
            if w is None:
                continue
            if prev is not None:
                edge(prev, w, "ww")
            prev = w
    ids = {t["id"] for t in committed}
    graph = {a: {b: l for b, l in bs.items() if b in ids} for a, bs in edges.items() if a in ids}
    for cyc in cycles(graph):
        labels = [graph[cyc[i]][cyc[(i + 1) % len(cyc)]] for i in range(len(cyc))]
        rw = sum("rw" in l and "ww" not in l and "wr" not in l for l in labels)
        kind = "G0" if all("ww" in l for l in labels) else "G1c" if rw == 0 else "G-single" if rw == 1 else "G2"
        bad(kind, cycle=cyc, edges=labels, ops={c: by_id[c]["ops"] for c in cyc})
    # per-thread order, only for cycles the graph above does not already have
    po = {a: dict(bs) for a, bs in graph.items()}
    last: Dict[str, str] = {}
    for t in sorted(committed, key=lambda t: (t["proc"], int(t["id"].split(".")[-1]))):
        if t["proc"] in last:
            po.setdefault(last[t["proc"]], {}).setdefault(t["id"], "po")
        last[t["proc"]] = t["id"]
    if not any(a["type"] in ("G0", "G1c", "G-single", "G2") for a in anomalies):
        for cyc in cycles(po):
            labels = [po[cyc[i]][cyc[(i + 1) % len(cyc)]] for i in range(len(cyc))]
            bad("session", cycle=cyc, edges=labels, ops={c: by_id[c]["ops"] for c in cyc})
    return anomalies, lost


def cycles(graph: Dict[str, Dict[str, str]]) -> List[List[str]]:
    """One concrete cycle per non-trivial strongly connected component."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on: Set[str] = set()
    stack: List[str] = []
    sccs: List[List[str]] = []
    counter = [0]
    nodes = set(graph)
    for bs in graph.values():
        nodes.update(bs)
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    pushed = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)
    out = []
    for comp in sccs:
        members = set(comp)
        start = min(comp)
        # shortest cycle through start: BFS back to it
        prev: Dict[str, Optional[str]] = {start: None}
        queue = [start]
        found = None
        while queue and found is None:
            nq = []
            for v in queue:
                for w in sorted(graph.get(v, {})):
                    if w == start:
                        found = v
                        break
                    if w in members and w not in prev:
                        prev[w] = v
                        nq.append(w)
                if found is not None:
                    break
            queue = nq
        cyc = []
        v: Optional[str] = found
        while v is not None:
            cyc.append(v)
            v = prev[v]
        out.append(list(reversed(cyc)))
    return out


# ---- the checker checks itself -------------------------------------------


def selftest() -> List[str]:
    """Hand-made histories with one known anomaly each; what the checker missed."""

    def tx(i: str, typ: str, *ops: List[Any]) -> Dict[str, Any]:
        return {"id": i, "proc": i.rsplit(".", 1)[0], "type": typ, "ops": [list(o) for o in ops]}

    cases = {
        "G1a": ([tx("a.1", "fail", ["a", "k0", "x"]), tx("b.1", "ok", ["r", "k0", ["x"]])], {"k0": []}),
        "G2": (  # write skew
            [tx("a.1", "ok", ["r", "k0", []], ["r", "k1", []], ["a", "k0", "x"]),
             tx("b.1", "ok", ["r", "k0", []], ["r", "k1", []], ["a", "k1", "y"])],
            {"k0": ["x"], "k1": ["y"]},
        ),
        "G-single": (  # lost update: both read [], both appended
            [tx("a.1", "ok", ["r", "k0", []], ["a", "k0", "x"]), tx("b.1", "ok", ["r", "k0", []], ["a", "k0", "y"])],
            {"k0": ["x", "y"]},
        ),
        "fractured": (
            [tx("a.1", "ok", ["a", "k0", "x"], ["a", "k1", "y"]), tx("b.1", "ok", ["r", "k0", ["x"]], ["r", "k1", []])],
            {"k0": ["x"], "k1": ["y"]},
        ),
        "lost-append": ([tx("a.1", "ok", ["a", "k0", "x"])], {"k0": []}),
        "aborted-write": ([tx("a.1", "fail", ["a", "k0", "x"])], {"k0": ["x"]}),
        "non-repeatable": (
            [tx("a.1", "ok", ["r", "k0", []], ["r", "k0", ["y"]]), tx("b.1", "ok", ["a", "k0", "y"])],
            {"k0": ["y"]},
        ),
        "G1b": (
            [tx("a.1", "ok", ["a", "k0", "x"], ["a", "k0", "z"]), tx("b.1", "ok", ["r", "k0", ["x"]])],
            {"k0": ["x", "z"]},
        ),
        "set-phantom": (  # a set read missed an add it serialised after, and saw one after it
            [tx("a.1", "ok", ["a", "s0", "x"], ["r", "s1", []]), tx("b.1", "ok", ["a", "s1", "y"], ["r", "s0", []])],
            {"s0": ["x"], "s1": ["y"]},
        ),
        "session": (
            [tx("a.1", "ok", ["a", "k0", "x"]), tx("a.2", "ok", ["r", "k0", []])],
            {"k0": ["x"]},
        ),
    }
    missed = []
    for name, (hist, final) in cases.items():
        found, _ = check(hist, final)
        if not found:
            missed.append(name)
    found, _ = check([tx("a.1", "ok", ["r", "k0", []], ["a", "k0", "x"]), tx("b.1", "ok", ["r", "k0", ["x"]])], {"k0": ["x"]})
    if found:
        missed.append(f"false alarm: {found}")
    return missed


# ---- main --------------------------------------------------------------------

PLANS = {
    # (name, procs, threads, lists, sets, txs per thread, max ops, single, abort)
    "quick": [
        ("hot", 3, 2, 3, 1, 150, 4, 0.2, 0.05),
        ("wide", 2, 2, 8, 2, 150, 5, 0.15, 0.05),
        ("skew", 4, 1, 2, 0, 150, 3, 0.1, 0.0),
    ],
    "long": [
        ("hot", 4, 2, 3, 1, 1500, 4, 0.2, 0.05),
        ("wide", 3, 3, 12, 3, 1200, 6, 0.15, 0.05),
        ("skew", 6, 1, 2, 0, 1500, 3, 0.1, 0.0),
        ("threads", 1, 6, 4, 1, 1200, 4, 0.2, 0.05),
        ("singles", 4, 2, 4, 1, 1200, 2, 0.5, 0.05),
    ]
    * 2,
}


def main() -> None:
    args = parse_args("Record histories of concurrent transactions on a txfs mount and check them for anomalies.", "isolation.py", "isolation histories", "isolation")
    t_start = time.monotonic()
    rng = random.Random(args.seed)
    print(f"isolation: seed {args.seed} ({args.mode})", flush=True)
    budget = 12.0 if args.mode == "quick" else 240.0
    histories = 0
    txs = 0
    committed = 0
    anomalies: List[Dict[str, Any]] = []
    lost = 0
    notes: List[str] = []
    errors: Dict[str, int] = defaultdict(int)
    missed = selftest()
    if missed:
        anomalies.append({"type": "checker-selftest", "missed": missed})
    with Mount("isolation") as m:
        for h, plan in enumerate(PLANS[args.mode]):
            name, procs, threads, lists, sets, ntx, max_ops, single, abort_p = plan
            cfg = dict(procs=procs, threads=threads, lists=lists, sets=sets, txs=ntx, max_ops=max_ops, single=single, abort=abort_p)
            hseed = rng.randrange(2**31)
            hist, final = run_history(m.mnt, f"h{h}-{name}", cfg, hseed, budget)
            found, l = check(hist, final)
            histories += 1
            txs += len(hist)
            committed += sum(t["type"] == "ok" for t in hist)
            for t in hist:
                if t["type"] == "info":
                    errors[t["why"]] += 1
            for a in found:
                a["history"] = f"h{h}-{name} (seed {hseed})"
            anomalies += found
            lost += l
            conflicts = sum(t.get("why") == "conflict" for t in hist)
            print(f"  history h{h}-{name}: {len(hist)} txs, {conflicts} conflicts, {len(found)} anomalies", flush=True)
            if not m.alive():
                anomalies.append({"type": "daemon-died", "history": name, "log": m.log_tail()})
                break
    for why, n in errors.items():
        anomalies.append({"type": "unexpected-error", "error": why, "count": n})
    kinds: Dict[str, int] = defaultdict(int)
    for a in anomalies:
        kinds[a["type"]] += 1
    for a in anomalies[:10]:
        print("ANOMALY", json.dumps(a)[:2000])
    notes.append(
        f"isolation: {histories} histories, {txs} transactions ({committed} committed), "
        f"anomalies: {dict(kinds) if kinds else 'none'}; seed {args.seed}"
    )
    finish(
        args,
        [row("isolation histories", "isolation", txs, len(anomalies), lost, time.monotonic() - t_start, command("isolation.py", args))],
        notes,
    )


if __name__ == "__main__":
    main()
