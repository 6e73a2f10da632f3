#!/bin/sh
# Third-party suites on a fresh txfs mount: pjdfstest (POSIX conformance:
# every test file, on an allow_other mount, as on ext4) and xfstests'
# fsstress inside transactions (4 processes, mmap writes, fallocate and
# renames included): a `txfs run` without a view (TXFS_RUN_VIEW=0, what a
# non-root user gets) that commits must leave exactly the files its command
# saw, byte for byte; one that aborts must leave the tree as it was.
# Neither suite is part of txfs: build them elsewhere and pass their paths.
#
#   reliability/third_party.sh PJDFSTEST_DIR FSSTRESS [SEEDS]   (default 3)
#
# PJDFSTEST_DIR is a built pjdfstest checkout (its `pjdfstest` binary and
# `tests/`), run with `prove -r`; FSSTRESS is the fsstress binary
# (ltp/fsstress.c of xfstests). The txfs binary is $TXFS_BIN, else
# target/debug/txfs. Exit status 1 if anything failed.
set -eu

[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
PJD=$(realpath "$1")
FSSTRESS=$(realpath "$2")
SEEDS=${3:-3}
TXFS=$(realpath "${TXFS_BIN:-target/debug/txfs}")
work=$(mktemp -d /tmp/txfs-third-party-XXXXXX)
mnt=$work/mnt
mkdir "$work/backing" "$mnt"
fail=0

cleanup() {
    if grep -q " $mnt " /proc/self/mounts; then "$TXFS" umount "$mnt" || umount -l "$mnt"; fi
}
trap cleanup EXIT

sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r md5sum); }

"$TXFS" mount "$work/backing" "$mnt" -o allow_other
mkdir "$mnt/pjd"
if (cd "$mnt/pjd" && prove -r "$PJD/tests" >"$work/pjdfstest.log" 2>&1); then
    echo "ok    pjdfstest: $(grep -h '^Files=' "$work/pjdfstest.log")"
else
    echo "FAIL  pjdfstest: $work/pjdfstest.log"
    grep -h -A3 'Failed\|Wstat' "$work/pjdfstest.log" | head -40 | sed 's/^/      /'
    fail=1
fi

seed=1
while [ "$seed" -le "$SEEDS" ]; do
    w=$mnt/fss$seed
    # Committed: what the command saw inside its transaction is what stays.
    if TXFS_RUN_VIEW=0 "$TXFS" run --mount "$mnt" -- sh -c \
        "'$FSSTRESS' -p 4 -n 3000 -s $seed -d '$w' >/dev/null 2>&1; cd '$w' && find . -type f -print0 | sort -z | xargs -0 -r md5sum > '$work/inside$seed'"; then
        sums "$w" >"$work/after$seed"
        if cmp -s "$work/inside$seed" "$work/after$seed"; then
            echo "ok    fsstress seed $seed, committed run: $(wc -l <"$work/after$seed") files as the command saw them"
        else
            echo "FAIL  fsstress seed $seed: $(diff "$work/inside$seed" "$work/after$seed" | grep -c '^<') files differ after the commit"
            fail=1
        fi
    else
        echo "FAIL  fsstress seed $seed: the committed run failed"
        fail=1
    fi
    # Aborted: nothing of it stays.
    sums "$w" >"$work/before$seed"
    if TXFS_RUN_VIEW=0 "$TXFS" run --mount "$mnt" -- sh -c \
        "'$FSSTRESS' -p 4 -n 3000 -s $((seed + 100)) -d '$w' >/dev/null 2>&1; exit 3" 2>/dev/null; then
        echo "FAIL  fsstress seed $seed: a command that exited 3 committed"
        fail=1
    fi
    sums "$w" >"$work/aborted$seed"
    if cmp -s "$work/before$seed" "$work/aborted$seed"; then
        echo "ok    fsstress seed $((seed + 100)), aborted run: the tree is as it was"
    else
        echo "FAIL  fsstress seed $((seed + 100)): the aborted run left $(diff "$work/before$seed" "$work/aborted$seed" | grep -c '^>') changed files"
        fail=1
    fi
    seed=$((seed + 1))
done

# After a checkpoint (unmount) the backing holds what the mount showed.
sums "$mnt" | grep -v '^[0-9a-f]*  ./pjd/' >"$work/mounted"
"$TXFS" umount "$mnt"
sums "$work/backing" | grep -v '^[0-9a-f]*  ./pjd/' | grep -v '  ./.txfs/' >"$work/backed"
if cmp -s "$work/mounted" "$work/backed"; then
    echo "ok    the backing after the unmount holds what the mount showed"
else
    echo "FAIL  the backing after the unmount differs: $work/mounted $work/backed"
    fail=1
fi
[ $fail = 1 ] || rm -rf "$work"
exit $fail
