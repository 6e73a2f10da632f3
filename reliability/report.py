"""The reporting protocol every reliability/*.py check shares with reliability/run:
one row per check, written as JSON (--json) and printed; exit 1 on any violation."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List


def row(check: str, level: str, tried: int, violations: int, data_lost: int, seconds: float, cmd: str) -> Dict[str, Any]:
    return {"check": check, "level": level, "tried": int(tried), "violations": int(violations),
            "data_lost": int(data_lost), "seconds": round(float(seconds), 2), "command": cmd}


def finish(args: argparse.Namespace, rows: List[Dict[str, Any]], notes: List[str]) -> None:
    """Write the JSON (if asked), print a summary; exit 1 on any violation."""
    out = {"rows": rows, "notes": notes}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    for r in rows:
        print(f"{r['check']}: tried {r['tried']}, violations {r['violations']}, "
              f"data lost {r['data_lost']}, {r['seconds']} s  ({r['command']})")
    for n in notes:
        print(f"note: {n}")
    # A row marked known_bug (an open bug with an ignored regression test) is reported, not failed.
    sys.exit(1 if any((r["violations"] or r["data_lost"]) and not r.get("known_bug") for r in rows) else 0)
