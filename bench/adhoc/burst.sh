#!/usr/bin/env bash
# NOTES item 45: the worst read latency on a txfs mount while a burst of
# 20 000 new files sits committed and the mount goes quiet (an idle
# checkpoint would create all those names under the engine lock).
#   bench/adhoc/burst.sh TXFS_BINARY      (root; /var/tmp)
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
D=/var/tmp/txfs-burst B=/var/tmp/txfs-burst/b M=/var/tmp/txfs-burst/m
rm -rf "$D"; mkdir -p "$B" "$M"
cc -O2 -o "$D/probe" "$HERE/probe.c"
"$BIN" mount "$B" "$M"
trap '"$BIN" umount "$M" 2>/dev/null || true' EXIT
echo probe > "$M/probe"; mkdir "$M/d"
sleep 7
python3 -c "
import os, sys
for i in range(20000):
    os.close(os.open(os.path.join(sys.argv[1], 'f%05d' % i), os.O_WRONLY | os.O_CREAT, 0o644))
" "$M/d"
"$D/probe" "$M/probe" 8 | sed "s/^/$(basename "$BIN"): /"
