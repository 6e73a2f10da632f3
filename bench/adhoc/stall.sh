#!/usr/bin/env bash
# NOTES item 44: the worst read latency on a txfs mount across a checkpoint
# of 200 renames while another program keeps rewriting a 1 GB file on the
# same disk.   bench/adhoc/stall.sh TXFS_BINARY      (root; /var/tmp)
# The checkpoint is the idle one (item 43): a binary without it shows none.
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
D=/var/tmp/txfs-stall B=/var/tmp/txfs-stall/b M=/var/tmp/txfs-stall/m J=/var/tmp/txfs-stall.junk
rm -rf "$D" "$J"; mkdir -p "$B" "$M"
cc -O2 -o "$D/probe" "$HERE/probe.c"
"$BIN" mount "$B" "$M"
trap '"$BIN" umount "$M" 2>/dev/null || true; rm -f "$J"' EXIT
mkdir "$M/d"; for i in $(seq 200); do echo x > "$M/d/f$i"; done
echo probe > "$M/probe"
sleep 7 # the idle checkpoint puts them in the backing tree
for i in $(seq 200); do mv "$M/d/f$i" "$M/d/g$i"; done
# The next idle checkpoint moves those names; meanwhile the disk stays dirty.
( end=$((SECONDS + 9)); while [ $SECONDS -lt $end ]; do
    dd if=/dev/zero of="$J" bs=1M count=1000 conv=notrunc status=none; done ) &
W=$!
"$D/probe" "$M/probe" 8.5 | sed "s/^/$(basename "$BIN"): /"
wait $W
