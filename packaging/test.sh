#!/usr/bin/env bash
# Packaging checks against a real mount (< 30 s): the Python wheel installs
# and works outside the source tree, with the SQLite helper (txfs_sqlite)
# loading the VFS that `make -C clients/sqlite install` put in a DESTDIR;
# `make install` of clients/c gives a
# pkg-config file that a program compiles and links with; the systemd unit
# passes systemd-analyze. Needs $TXFS_BIN (the txfs binary); python3 with
# setuptools and wheel (or setuptools >= 70.1); a C compiler; pkg-config.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TXFS_BIN=${TXFS_BIN:-$ROOT/target/debug/txfs}
T=$(mktemp -d "/tmp/${TXFS_TMP_PREFIX:-txfs-packaging.}XXXXXX")
cleanup() {
    if grep -q " $T/mnt " /proc/self/mounts; then "$TXFS_BIN" umount "$T/mnt" || fusermount3 -u "$T/mnt" || true; fi
    grep -q " $T/mnt " /proc/self/mounts || rm -rf "$T"
}
trap cleanup EXIT
mkdir -p "$T/backing" "$T/mnt"
"$TXFS_BIN" mount "$T/backing" "$T/mnt"
export TXFS_MOUNT=$T/mnt

echo "== python wheel"
if ! python3 -c 'import setuptools, sys; from setuptools.command import bdist_wheel' 2>/dev/null &&
   ! python3 -c 'import wheel' 2>/dev/null; then
    echo "  SKIPPED: no offline wheel builder (pip install wheel, or setuptools >= 70.1)"
else
cp -rL clients/python "$T/src"     # build outside the tree: no build/ or egg-info left in it
                                   # (-L: txfs_sqlite.py links to clients/sqlite's)
rm -rf "$T/src/build" "$T/src"/*.egg-info
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$T/dist" "$T/src" 2>&1 | grep -v "running pip as the 'root'" || true
whl=$(ls "$T"/dist/txfs_client-*.whl)
python3 -m pip install -q --no-deps --no-index --target "$T/site" "$whl" 2>&1 | grep -v "Running pip as the 'root'" || true
(cd "$T" && PYTHONPATH="$T/site" python3 - <<'PY'
import os, txfs
assert txfs.__file__.startswith(os.environ["PYTHONPATH"]), txfs.__file__
assert os.path.exists(os.path.join(os.path.dirname(txfs.__file__), "py.typed"))
before = txfs.status()["commits"]
with txfs.transaction():
    with open(os.path.join(os.environ["TXFS_MOUNT"], "from-wheel"), "w") as f:
        f.write("ok")
assert txfs.status()["commits"] > before
print("  wheel", os.path.basename(os.environ.get("WHL", "")) or "ok", "imports from", os.path.dirname(txfs.__file__))
PY
)
fi

echo "== SQLite VFS: make install DESTDIR=, loaded by name through the wheel's txfs_sqlite"
make -s -C clients/sqlite install DESTDIR="$T/dest" PREFIX=/usr >/dev/null
test -x "$T/dest/usr/lib/txfs_vfs.so"
make -s -C clients/sqlite uninstall DESTDIR="$T/dest" PREFIX=/usr >/dev/null
test ! -e "$T/dest/usr/lib/txfs_vfs.so"
make -s -C clients/sqlite install DESTDIR="$T/dest" PREFIX=/usr >/dev/null
if [ -d "$T/site" ]; then
(cd "$T" && LD_LIBRARY_PATH="$T/dest/usr/lib" PYTHONPATH="$T/site" python3 - <<'PY'
import os, sqlite3, txfs, txfs_sqlite
site, mnt = os.environ["PYTHONPATH"], os.environ["TXFS_MOUNT"]
assert txfs_sqlite.__file__.startswith(site), txfs_sqlite.__file__
txfs_sqlite.load()  # no extension next to it: found by name (LD_LIBRARY_PATH here, PREFIX/lib when installed)
db = sqlite3.connect(f"file:{mnt}/from-wheel.db?vfs=txfs", uri=True)
db.execute("CREATE TABLE t(x)")
with txfs.transaction():  # rows and a plain file in one commit
    db.execute("INSERT INTO t VALUES (1)")
    db.commit()
    with open(f"{mnt}/from-wheel.attachment", "w") as f:
        f.write("ok")
assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 1
assert not os.path.exists(f"{mnt}/from-wheel.db-journal")
print("  txfs_sqlite from the wheel loaded the installed txfs_vfs.so; a row and a file committed together")
PY
)
fi

echo "== C library: make install, pkg-config"
make -s -C clients/c install PREFIX="$T/prefix" >/dev/null
export PKG_CONFIG_PATH=$T/prefix/lib/pkgconfig
pkg-config --exists txfs
# what a distribution ships names no placeholder address
! grep -En 'https?://(…|\.\.\.|example)' "$T/prefix/include/txfs.h" clients/python/pyproject.toml crates/*/Cargo.toml ||
    { echo "a placeholder URL in a shipped file"; exit 1; }
cat > "$T/prog.c" <<'C'
#include <stdio.h>
#include <txfs.h>
int main(int argc, char **argv) {
    if (fs_tx_begin() != 0) { perror("fs_tx_begin"); return 1; }
    FILE *f = fopen(argv[1], "w");
    if (!f || fputs("ok\n", f) < 0 || fclose(f) != 0) { perror(argv[1]); fs_tx_abort(); return 1; }
    if (fs_tx_commit() != 0) { perror("fs_tx_commit"); return 1; }
    return argc == 2 ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -o "$T/prog" "$T/prog.c" $(pkg-config --cflags --libs txfs) -Wl,-rpath,"$(pkg-config --variable=libdir txfs)"
"$T/prog" "$T/mnt/from-c"
test "$(cat "$T/mnt/from-c")" = ok
cc -static-libgcc -o "$T/prog-static" "$T/prog.c" -I"$T/prefix/include" "$T/prefix/lib/libtxfs.a"
"$T/prog-static" "$T/mnt/from-c-static"
echo "  pkg-config: $(pkg-config --cflags --libs txfs)"

echo "== man page and shell completions (generated from the argument grammar)"
subs="mount umount status run recover check completions"
mkdir -p "$T/man"
"$TXFS_BIN" __man > "$T/man/txfs.1"
"$TXFS_BIN" __man "$T/man"
if command -v man >/dev/null; then
    page=$(MANWIDTH=80 man -l "$T/man/txfs.1" 2>&1)
else
    page=$(cat "$T/man/txfs.1") # no man(1) here: the roff itself
fi
grep -q '^\.TH txfs 1' "$T/man/txfs.1"
for s in $subs; do
    grep -q "txfs-$s" <<<"$page" || { echo "txfs(1) does not list $s:"; echo "$page"; exit 1; }
    grep -q "^\.TH txfs-$s 1" "$T/man/txfs-$s.1"
done
! grep -q "__heal\|__man" "$T/man/txfs.1" || { echo "txfs(1) lists a hidden subcommand"; exit 1; }
"$TXFS_BIN" completions bash > "$T/txfs.bash"
# shellcheck disable=SC2016
offered=$(bash -c 'source "$1"; COMP_WORDS=(txfs ""); COMP_CWORD=1; _txfs txfs "" txfs; echo "${COMPREPLY[*]}"' _ "$T/txfs.bash")
for s in $subs; do
    grep -qw -- "$s" <<<"$offered" || { echo "bash completion of 'txfs <TAB>' lacks $s: $offered"; exit 1; }
done
for sh in zsh fish; do "$TXFS_BIN" completions "$sh" | grep -q umount; done
echo "  txfs(1) and txfs-SUBCOMMAND(1) render; bash completes: $offered"

echo "== release binary: no DWARF in it; debug info split off beside it"
# The release profile strips debug info (cargo install ships that binary).
awk '/^\[profile\.release\]/ { r = 1; next } /^\[/ { r = 0 } r && /^strip *= *"(debuginfo|symbols)"|^strip *= *true/ { ok = 1 }
     END { exit !ok }' Cargo.toml || { echo "[profile.release] in Cargo.toml does not strip debug info"; exit 1; }
# The documented split, on this (debug) binary: stripped, linked to its .debug.
packaging/split-debug "$TXFS_BIN" "$T/dist" >/dev/null
! readelf -S "$T/dist/txfs" | grep -q '\.debug_info' || { echo "split-debug left DWARF in the binary"; exit 1; }
readelf -S "$T/dist/txfs" | grep -q '\.gnu_debuglink'
readelf -S "$T/dist/txfs.debug" 2>/dev/null | grep -q '\.debug_info'
[ "$(stat -c %s "$T/dist/txfs")" -lt "$(stat -c %s "$TXFS_BIN")" ]
"$T/dist/txfs" --version >/dev/null
echo "  split-debug: $(du -h "$TXFS_BIN" | cut -f1) -> $(du -h "$T/dist/txfs" | cut -f1) + txfs.debug"

echo "== systemd unit"
if command -v systemd-analyze >/dev/null; then
    mkdir -p "$T/unit"
    sed "s|/usr/local/bin/txfs|$TXFS_BIN|" packaging/txfs@.service > "$T/unit/txfs@data.service"
    # --man=no: its Documentation= page need not be installed where this runs
    systemd-analyze verify --man=no "$T/unit/txfs@data.service"
    echo "  systemd-analyze verify: ok"
else
    echo "  (systemd-analyze not installed: skipped)"
fi
echo "packaging: ok"
