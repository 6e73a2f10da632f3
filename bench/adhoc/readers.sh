#!/usr/bin/env bash
# NOTES items 42-43: cold 4 KiB random reads of a 1 GiB file on a txfs mount,
# one process and then four at once (different seeds), reads per second.
#   bench/adhoc/readers.sh TXFS_BINARY [fresh]
# "fresh": the file is written through the mount and read 7 s later (item 43:
# the idle checkpoint); otherwise it is written once and the mount remounted.
# Root; uses /var/tmp/txfs-readers (on the machine's disk).
set -euo pipefail
BIN=$1 MODE=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
D=/var/tmp/txfs-readers B=/var/tmp/txfs-readers/b M=/var/tmp/txfs-readers/m
cc -O2 -o "$D.rread" "$HERE/rread.c"
rm -rf "$D"; mkdir -p "$B" "$M"
"$BIN" mount "$B" "$M"
trap '"$BIN" umount "$M" 2>/dev/null || true' EXIT
dd if=/dev/zero bs=1M count=1024 status=none | tr '\0' s > "$M/seq"
if [ "$MODE" = fresh ]; then sleep 7; else "$BIN" umount "$M"; "$BIN" mount "$B" "$M"; fi
rate() { python3 -c "import sys; print(round($1 / ($3 - $2)))"; }
sync; echo 3 > /proc/sys/vm/drop_caches
t0=$(date +%s.%N); "$D.rread" "$M/seq" 20000 1024 1; t1=$(date +%s.%N)
sync; echo 3 > /proc/sys/vm/drop_caches
t2=$(date +%s.%N)
for i in 1 2 3 4; do "$D.rread" "$M/seq" 20000 1024 "$i" & done; wait
t3=$(date +%s.%N)
echo "$(basename "$BIN")${MODE:+ ($MODE)}: one reader $(rate 20000 "$t0" "$t1") reads/s, four readers $(rate 80000 "$t2" "$t3") reads/s"
