#!/bin/sh
# xfstests' fsx (ltp/fsx.c) on a fresh txfs mount, with fallocate, punch
# hole and zero range on; and the same runs on the machine's own disk for
# comparison. fsx is not part of txfs: build it elsewhere and pass its path.
#
#   reliability/xfstests_fsx.sh /path/to/fsx [NUMOPS]     (default 10000)
#
# Runs, for seeds 1-3: fsx outside any transaction and inside `txfs run`
# (one transaction, committed when fsx exits 0), each with the default file
# size and with 8 MiB files and 1 MiB operations; and fsx on a folder of
# $TXFS_TEST_DIR (default /var/tmp). fsx checks every read against its own
# copy of the file. After each run on the mount its file is copied as the
# mount shows it (inside the run: still inside the transaction); after an
# unmount (a checkpoint) and a remount, the backing files and the files on
# the mount must equal those copies.
#
# Collapse range, insert range and unshare range are switched off (-C -I -u):
# FUSE does not forward them (txfs answers EOPNOTSUPP; fsx would find that
# out by itself and say so). The native runs use the same flags, plus one
# run with everything on. The txfs binary is $TXFS_BIN, else
# target/debug/txfs. Exit status 1 if any run or comparison failed.
set -eu

[ $# -ge 1 ] || { sed -n '2,8p' "$0"; exit 2; }
FSX=$(realpath "$1")
N=${2:-10000}
TXFS=$(realpath "${TXFS_BIN:-target/debug/txfs}")
work=$(mktemp -d /tmp/txfs-fsx-XXXXXX)
native=$(mktemp -d "${TXFS_TEST_DIR:-/var/tmp}/txfs-fsx-native-XXXXXX")
mkdir "$work/backing" "$work/mnt" "$work/logs" "$work/copies"
mnt=$work/mnt
fail=0

cleanup() {
    if grep -q " $mnt " /proc/self/mounts; then "$TXFS" umount "$mnt" || umount -l "$mnt"; fi
}
trap cleanup EXIT

# run LABEL CMD...: one fsx run, its output in $work/logs/LABEL.log.
run() {
    label=$1
    shift
    if "$@" >"$work/logs/$label.log" 2>&1; then
        echo "ok    $label: $(grep -h 'operations completed' "$work/logs/$label.log" | tail -1)"
    else
        echo "FAIL  $label (exit $?): $work/logs/$label.log"
        tail -20 "$work/logs/$label.log" | sed 's/^/      /'
        fail=1
    fi
}

FLAGS="-q -C -I -u -N $N"
"$TXFS" mount "$work/backing" "$mnt"
for seed in 1 2 3; do
    run "mount-plain-s$seed" "$FSX" $FLAGS -S $seed -P "$work/logs" "$mnt/plain$seed"
    cp "$mnt/plain$seed" "$work/copies/plain$seed"
    run "mount-plain-8MiB-s$seed" "$FSX" $FLAGS -S $seed -l 8388608 -o 1048576 -P "$work/logs" "$mnt/big$seed"
    cp "$mnt/big$seed" "$work/copies/big$seed"
    run "mount-txfs-run-s$seed" "$TXFS" run --mount "$mnt" -- sh -c \
        "'$FSX' $FLAGS -S $seed -P '$work/logs' '$mnt/run$seed' && cp '$mnt/run$seed' '$work/copies/run$seed'"
    run "mount-txfs-run-8MiB-s$seed" "$TXFS" run --mount "$mnt" -- sh -c \
        "'$FSX' $FLAGS -S $seed -l 8388608 -o 1048576 -P '$work/logs' '$mnt/runbig$seed' && cp '$mnt/runbig$seed' '$work/copies/runbig$seed'"
    run "native-s$seed" "$FSX" $FLAGS -S $seed -P "$work/logs" "$native/plain$seed"
    run "native-8MiB-s$seed" "$FSX" $FLAGS -S $seed -l 8388608 -o 1048576 -P "$work/logs" "$native/big$seed"
done
run "native-every-mode-s1" "$FSX" -q -N "$N" -S 1 -P "$work/logs" "$native/every"

"$TXFS" umount "$mnt"
for f in "$work"/copies/*; do
    name=$(basename "$f")
    cmp -s "$f" "$work/backing/$name" || { echo "FAIL  $name: the backing file after the unmount differs"; fail=1; }
done
"$TXFS" mount "$work/backing" "$mnt"
for f in "$work"/copies/*; do
    name=$(basename "$f")
    cmp -s "$f" "$mnt/$name" || { echo "FAIL  $name: the file after a remount differs"; fail=1; }
done
[ $fail = 0 ] && echo "ok    the files on the mount, in the backing after the unmount and after a remount agree"
rm -rf "$native"
exit $fail
