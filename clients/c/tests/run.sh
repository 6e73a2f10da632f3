#!/usr/bin/env bash
# Mount a fresh txfs over a temporary backing directory, run the C tests
# against it, and always unmount and stop the daemon again.
#   TXFS_BIN   the daemon (default: this checkout's target/debug/txfs)
# Without the binary the run fails, saying how to build it.
# The last line of output is "N passed, M failed[, ...]".
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cdir=$(dirname "$here")
bin=${TXFS_BIN:-$(cd "$cdir/../.." && pwd)/target/debug/txfs}
test_prog="$here/test_txfs"

make -s -C "$cdir" tests/test_txfs >&2 || { echo "build of the C tests failed" >&2; echo "0 passed, 1 failed"; exit 1; }

if [ ! -x "$bin" ]; then
    echo "no txfs daemon at $bin: build it (cargo build -p txfs-fuse at the repository root) or set TXFS_BIN" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

tmp=$(mktemp -d /tmp/txfs-ctest.XXXXXX)
backing="$tmp/backing"
mnt="$tmp/mnt"
log="$tmp/daemon.log"
mkdir -p "$backing" "$mnt"
daemon=""

is_mounted() {
    # mount point is field 5; fs type and source follow the " - " separator.
    # fuse.txfs, or plain fuse with source txfs:BACKING (a root mount(2)
    # without the subtype).
    awk -v m="$mnt" '$5 == m { for (i = 6; i <= NF; i++) if ($i == "-") { print $(i + 1), $(i + 2); exit } }' \
        /proc/self/mountinfo | grep -Eq '^(fuse\.txfs |fuse txfs(:| |$))'
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if is_mounted || grep -q " $mnt " /proc/self/mountinfo; then
        fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null ||
            umount -l "$mnt" || echo "WARNING: could not unmount $mnt" >&2
    fi
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
        kill -TERM "$daemon" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$daemon" 2>/dev/null
    fi
    [ -n "$daemon" ] && wait "$daemon" 2>/dev/null
    if [ "$rc" -ne 0 ] && [ -s "$log" ]; then
        echo "---- daemon log (last 40 lines) ----" >&2
        tail -n 40 "$log" >&2
    fi
    if ! grep -q " $mnt " /proc/self/mountinfo; then
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

"$bin" mount "$backing" "$mnt" -f >"$log" 2>&1 &
daemon=$!

for _ in $(seq 600); do
    is_mounted && break
    if ! kill -0 "$daemon" 2>/dev/null; then
        echo "txfs daemon exited before mounting:" >&2
        cat "$log" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
    sleep 0.1
done
if ! is_mounted; then
    echo "txfs did not mount $mnt within 60 s" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

# Two real mounts, no TXFS_MOUNT: fs_tx_begin takes the one holding the
# current directory, and from outside both fails with ENOTUNIQ listing them.
two_mounts_check() {
    local b2="$tmp/backing2" m2="$tmp/mnt2" ok=0
    mkdir -p "$b2" "$m2" "$mnt/cwd-dir"
    "$bin" mount "$b2" "$m2" >>"$log" 2>&1 || { echo "FAIL - a second txfs mount"; return 1; }
    local a b
    a=$(cd "$mnt/cwd-dir" && env -u TXFS_MOUNT "$test_prog" cwd-begin 2>&1)
    b=$(cd "$tmp" && env -u TXFS_MOUNT "$test_prog" cwd-none 2>&1)
    [ -f "$mnt/cwd-dir/cwd-chosen" ] && [ ! -e "$m2/cwd-chosen" ] && [ "$a" = committed ] || ok=1
    case "$b" in *ENOTUNIQ*"$mnt"*"$m2"* | *ENOTUNIQ*"$m2"*"$mnt"*) ;; *) ok=1 ;; esac
    "$bin" umount "$m2" >>"$log" 2>&1 || { echo "FAIL - txfs umount of the second mount"; return 1; }
    if [ "$ok" -ne 0 ]; then
        echo "FAIL - two mounts: in $mnt/cwd-dir: $a; outside both: $b"
        return 1
    fi
    echo "ok - two mounts: fs_tx_begin takes the current directory's; outside both, ENOTUNIQ listing them"
}
if ! two_mounts_check; then
    echo "0 passed, 1 failed"
    exit 1
fi

# The descriptor libtxfs keeps between transactions, end to end: `txfs
# umount` must unmount while an idle client holds one (and checkpoint), the
# client's next begin must fail cleanly (no txfs there), and after a new
# mount at the same place it must begin there.
hold_check() {
    local fifo="$tmp/hold.fifo" out="$tmp/hold.out"
    mkfifo "$fifo"
    TXFS_MOUNT="$mnt" timeout 60 "$test_prog" fresh-hold <"$fifo" >"$out" 2>&1 &
    local holder=$!
    exec 7>"$fifo"
    for _ in $(seq 600); do grep -q ready "$out" && break; sleep 0.1; done
    grep -q ready "$out" || { echo "FAIL - hold: the client did not commit: $(cat "$out")"; return 1; }
    if ! "$bin" umount "$mnt"; then
        echo "FAIL - txfs umount with an idle libtxfs client holding its kept descriptor"
        return 1
    fi
    wait "$daemon"
    daemon=""
    ls "$backing"/held-* >/dev/null 2>&1 || { echo "FAIL - hold: the committed file is not in BACKING"; return 1; }
    echo go >&7
    for _ in $(seq 600); do grep -q "^begin" "$out" && break; sleep 0.1; done
    if ! grep -q "^begin ENOTTY" "$out"; then
        echo "FAIL - hold: with the mount gone, the client's begin: $(tail -1 "$out")"
        return 1
    fi
    "$bin" mount "$backing" "$mnt" -f >>"$log" 2>&1 &
    daemon=$!
    for _ in $(seq 600); do is_mounted && break; sleep 0.1; done
    echo go >&7
    exec 7>&-
    wait "$holder"
    if ! grep -q "begin 0 write 0 commit 0" "$out"; then
        echo "FAIL - hold: after unmount and a new mount, the client's next transaction: $(tail -1 "$out")"
        return 1
    fi
    echo "ok - an idle client's kept descriptor: txfs umount detaches it, the next begin finds the new mount"
}
if ! hold_check; then
    echo "0 passed, 1 failed"
    exit 1
fi

TXFS_MOUNT="$mnt" timeout 600 "$test_prog"
