#!/usr/bin/env python3
"""How long listing a big transaction's change set takes (issue 29:
"100 000 paths or 2 GiB of data under a second plus output time").

Mounts txfs over a fresh backing directory and runs, under `txfs run`, a
shell that makes N files in one directory (or writes GIB GiB into one
file), then times `txfs diff --json > /dev/null` inside the same run (the
listing, its transfer a page at a time, and JSON output to /dev/null),
and `txfs diff > /dev/null` (the human form), then aborts.

    python3 bench/adhoc/changes_listing.py [N] [GIB]    (default 100000 2)
    TXFS_BIN=target/release/txfs  (default: the checkout's release build)
Needs root (/dev/fuse).
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Absolute: the shell in the run works in the mount.
BIN = os.path.abspath(os.environ.get("TXFS_BIN") or os.path.join(ROOT, "target", "release", "txfs"))


def timed_diffs(m: str, make: str, what: str) -> None:
    # `date +%s.%N` around each listing, printed by the shell in the run.
    script = (
        f"cd {m} && {make} && "
        f"a=$(date +%s.%N); {BIN} diff --json > /dev/null; b=$(date +%s.%N); "
        f"{BIN} diff > /dev/null; c=$(date +%s.%N); "
        'echo "$a $b $c"; exit 1'
    )
    out = subprocess.run([BIN, "run", "--mount", m, "--", "sh", "-c", script], capture_output=True, text=True)
    a, b, c = (float(x) for x in out.stdout.split())
    print(f"{what}: txfs diff --json {b - a:.3f} s, txfs diff {c - b:.3f} s")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    gib = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    d = tempfile.mkdtemp(prefix="txfs-changes-", dir="/var/tmp")
    b, m = os.path.join(d, "b"), os.path.join(d, "m")
    os.mkdir(b)
    os.mkdir(m)
    subprocess.run([BIN, "mount", b, m], check=True)
    try:
        make = f"mkdir many && python3 -c 'import os\nfor i in range({n}): open(\"many/f%06d\" % i, \"w\").close()'"
        timed_diffs(m, make, f"{n} new files")
        make = f"head -c {gib << 30} /dev/zero > big"
        timed_diffs(m, make, f"one new file of {gib} GiB")
        make = f"mkdir d && head -c {gib << 30} /dev/zero > d/big && mv d e"
        timed_diffs(m, make, f"{gib} GiB in a new file, its directory renamed")
    finally:
        subprocess.run([BIN, "umount", m], check=False)
        subprocess.run(["rm", "-rf", d], check=False)


if __name__ == "__main__":
    main()
