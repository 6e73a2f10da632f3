"""Unit tests that need no mount: wire protocol, mount resolution, and the
transaction logic against a fake daemon."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import txfs
from txfs import _wire, mounts

HEADER = Path(os.environ.get("TXFS_HEADER", Path(__file__).resolve().parents[2] / "c" / "txfs.h"))

# ---- wire protocol ------------------------------------------------------------

C_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "txfs.h"
#define N(x) printf("%s %llu\n", #x, (unsigned long long)(x))
#define S(t) printf("sizeof_%s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("offsetof_%s.%s %zu\n", #t, #f, offsetof(struct t, f))
int main(void) {
    N(TXFS_IOC_BEGIN); N(TXFS_IOC_COMMIT); N(TXFS_IOC_ABORT); N(TXFS_IOC_SYNC);
    N(TXFS_IOC_RUN); N(TXFS_IOC_STATUS); N(TXFS_IOC_STATE); N(TXFS_IOC_CHANGES);
    N(TXFS_IOC_MAGIC); N(TXFS_ECONFLICT); N(TXFS_COMMIT_ORDERED);
    N(TXFS_RUN_BEGIN); N(TXFS_RUN_COMMIT); N(TXFS_RUN_ABORT);
    S(txfs_ioc_flags); O(txfs_ioc_flags, flags); O(txfs_ioc_flags, reserved);
    S(txfs_ioc_run); O(txfs_ioc_run, pid); O(txfs_ioc_run, op); O(txfs_ioc_run, flags);
    O(txfs_ioc_run, reserved);
    S(txfs_ioc_status); O(txfs_ioc_status, commits); O(txfs_ioc_status, aborts);
    O(txfs_ioc_status, conflicts); O(txfs_ioc_status, live_txs);
    O(txfs_ioc_status, journal_bytes); O(txfs_ioc_status, journal_syncs);
    O(txfs_ioc_status, checkpoints); O(txfs_ioc_status, last_seq);
    S(txfs_ioc_state); O(txfs_ioc_state, tx); O(txfs_ioc_state, depth);
    O(txfs_ioc_state, flags);
    S(txfs_ioc_changes); O(txfs_ioc_changes, pid); O(txfs_ioc_changes, op);
    O(txfs_ioc_changes, offset); O(txfs_ioc_changes, index); O(txfs_ioc_changes, total);
    O(txfs_ioc_changes, len); O(txfs_ioc_changes, snap); O(txfs_ioc_changes, flags);
    O(txfs_ioc_changes, reserved); O(txfs_ioc_changes, data);
    N(TXFS_CHANGES_LIST); N(TXFS_CHANGES_OLD); N(TXFS_CHANGES_NEW); N(TXFS_CHANGES_LOST);
    N(TXFS_CHANGES_DATA); N(TXFS_CHANGE_HEAD);
    N(TXFS_CHANGE_CREATED); N(TXFS_CHANGE_DELETED); N(TXFS_CHANGE_MODIFIED); N(TXFS_CHANGE_RENAMED);
    N(TXFS_CHANGE_LINKED); N(TXFS_CHANGE_MODE); N(TXFS_CHANGE_OWNER); N(TXFS_CHANGE_XATTR);
    N(TXFS_CHANGE_TIMES); N(TXFS_CHANGE_REPLACED);
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, int]:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc) to compile the header probe")
    if not HEADER.is_file():
        pytest.skip(f"txfs.h not found at {HEADER} (set TXFS_HEADER)")
    d = tmp_path_factory.mktemp("probe")
    src, exe = d / "probe.c", d / "probe"
    src.write_text(C_PROBE)
    subprocess.run(
        [cc, "-Wall", "-Wextra", "-Werror", "-I", str(HEADER.parent), "-o", str(exe), str(src)],
        check=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_ioctl_numbers_match_c_header(c_values: Dict[str, int]) -> None:
    for name, number in _wire.IOCTLS.items():
        assert number == c_values[name], f"{name}: python {number:#x}, C {c_values[name]:#x}"
    assert _wire.TXFS_IOC_MAGIC == c_values["TXFS_IOC_MAGIC"]
    assert txfs.TXFS_ECONFLICT == c_values["TXFS_ECONFLICT"] == errno.EDEADLK
    assert txfs.TXFS_COMMIT_ORDERED == c_values["TXFS_COMMIT_ORDERED"]
    assert _wire.TXFS_RUN_BEGIN == c_values["TXFS_RUN_BEGIN"]
    assert _wire.TXFS_RUN_COMMIT == c_values["TXFS_RUN_COMMIT"]
    assert _wire.TXFS_RUN_ABORT == c_values["TXFS_RUN_ABORT"]
    for name in [n for n in c_values if n.startswith(("TXFS_CHANGES_", "TXFS_CHANGE_"))]:
        assert getattr(_wire, name) == c_values[name], name


def _offsets(fmt: struct.Struct) -> List[int]:
    """Field offsets of a '='-struct of plain integer codes."""
    out, off = [], 0
    codes = fmt.format.lstrip("=")
    count = ""
    for ch in codes:
        if ch.isdigit():
            count += ch
            continue
        if ch == "s":  # one field of `count` bytes
            out.append(off)
            off += int(count or "1")
        else:
            for _ in range(int(count or "1")):
                out.append(off)
                off += struct.calcsize("=" + ch)
        count = ""
    return out


@pytest.mark.parametrize(
    "cname, pystruct, fields",
    [
        ("txfs_ioc_flags", _wire.IOC_FLAGS, ["flags", "reserved"]),
        ("txfs_ioc_run", _wire.IOC_RUN, ["pid", "op", "flags", "reserved"]),
        ("txfs_ioc_status", _wire.IOC_STATUS, list(_wire.STATUS_FIELDS)),
        ("txfs_ioc_state", _wire.IOC_STATE, ["tx", "depth", "flags"]),
        (
            "txfs_ioc_changes",
            _wire.IOC_CHANGES,
            ["pid", "op", "offset", "index", "total", "len", "snap", "flags", "reserved", "data"],
        ),
    ],
)
def test_struct_layouts_match_c_header(
    c_values: Dict[str, int], cname: str, pystruct: struct.Struct, fields: List[str]
) -> None:
    assert pystruct.size == c_values[f"sizeof_{cname}"]
    assert _offsets(pystruct) == [c_values[f"offsetof_{cname}.{f}"] for f in fields]


def test_struct_sizes_without_compiler() -> None:
    assert (_wire.IOC_FLAGS.size, _wire.IOC_RUN.size, _wire.IOC_STATUS.size, _wire.IOC_STATE.size) == (
        8,
        16,
        64,
        16,
    )
    assert (_wire.IOC_CHANGES.size, _wire.TXFS_IOC_CHANGES) == (16368, 0xFFF0E70E)
    assert _wire.CHANGE_RECORD.size == _wire.TXFS_CHANGE_HEAD


def test_ioctl_encoding_per_architecture() -> None:
    g, a = _wire.GENERIC, _wire.ALTERNATE
    assert _wire.iow(0xE7, 1, 8, g) == 0x4008E701
    assert _wire.ior(0xE7, 6, 64, g) == 0x8040E706
    assert _wire.iow(0xE7, 1, 8, a) == 0x8008E701
    assert _wire.ior(0xE7, 6, 64, a) == 0x4040E706
    # well-known numbers: FS_IOC_GETFLAGS = _IOR('f', 1, long) on x86_64
    assert _wire.ior(ord("f"), 1, 8, g) == 0x80086601
    assert _wire.layout_for("x86_64") is g
    assert _wire.layout_for("aarch64") is g
    assert _wire.layout_for("ppc64le") is a
    assert _wire.layout_for("mips64") is a
    assert _wire.layout_for("sparc64") is a
    with pytest.raises(ValueError):
        _wire.ioc(1, 0xE7, 1, 1 << 14, g)


# ---- mount resolution -----------------------------------------------------------

EXT4_LINES = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
    "24 22 0:45 / /home/u/sshfs rw,nosuid shared:40 - fuse.sshfs u@h: rw,user_id=0\n"
    "25 22 0:46 / /media/x rw,nosuid - fuse other:/txfs rw,user_id=0\n"
    "26 22 0:47 / /media/y rw,nosuid - fuse txfsnot rw,user_id=0\n"
)


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake mountinfo file, also installed as txfs.mounts.MOUNTINFO."""
    p = tmp_path / "mountinfo"
    p.write_text(EXT4_LINES)
    monkeypatch.setattr(mounts, "MOUNTINFO", str(p))
    monkeypatch.delenv("TXFS_MOUNT", raising=False)
    return p


def _errno_of(fn: object, *args: object, **kw: object) -> Optional[int]:
    try:
        fn(*args, **kw)  # type: ignore[operator]
    except OSError as e:
        return e.errno
    return None


def test_no_txfs_mount_is_enodev(fake: Path) -> None:
    assert mounts.read_mountinfo() == []
    assert _errno_of(txfs.find_mount) == errno.ENODEV
    # the public API fails the same way, before any ioctl
    assert _errno_of(txfs.begin) == errno.ENODEV
    with pytest.raises(OSError) as ei:
        with txfs.transaction():
            pass  # pragma: no cover
    assert ei.value.errno == errno.ENODEV
    assert not txfs.in_transaction()


def test_one_txfs_mount_with_escaped_name(fake: Path) -> None:
    fake.write_text(
        EXT4_LINES + "40 22 0:50 / /mnt/my\\040txfs\\134x rw,nosuid shared:50 - fuse.txfs txfs rw,user_id=0\n"
    )
    assert txfs.find_mount() == "/mnt/my txfs\\x"
    assert txfs.find_mount(mountinfo=str(fake)) == "/mnt/my txfs\\x"
    (e,) = mounts.read_mountinfo()
    assert (e.major, e.minor, e.point, e.source) == (0, 50, "/mnt/my txfs\\x", "txfs")


def test_bind_mounts_of_one_file_system_count_once(fake: Path) -> None:
    fake.write_text(
        EXT4_LINES
        + "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n"
        + "41 22 0:50 /sub /mnt/b rw master:3 - fuse.txfs txfs rw\n"
        + "42 22 0:50 / /mnt/c rw - fuse txfs:/srv/backing rw\n"
    )
    assert txfs.find_mount() == "/mnt/a"


def test_several_txfs_mounts_is_enotuniq(fake: Path) -> None:
    fake.write_text(EXT4_LINES + "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n41 22 0:51 / /mnt/b rw - fuse.txfs t rw\n")
    assert _errno_of(txfs.find_mount) == errno.ENOTUNIQ
    assert _errno_of(txfs.begin) == errno.ENOTUNIQ
    with pytest.raises(OSError, match="TXFS_MOUNT"):
        txfs.find_mount()


def test_plain_fuse_with_txfs_source_counts(fake: Path) -> None:
    fake.write_text(EXT4_LINES + "41 22 0:51 / /mnt/b rw - fuse txfs:/srv/b rw\n")
    assert txfs.find_mount() == "/mnt/b"
    fake.write_text(EXT4_LINES + "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n41 22 0:51 / /mnt/b rw - fuse txfs rw\n")
    assert _errno_of(txfs.find_mount) == errno.ENOTUNIQ


def test_path_inside_a_mount(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pretend tmp_path (and, shorter, "/") is a txfs mount of tmp_path's device
    st = os.stat(tmp_path)
    real = os.path.realpath(tmp_path)
    maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
    fake.write_text(
        f"50 1 {maj}:{mnr} / / rw - fuse.txfs txfs rw\n"
        f"51 1 {maj}:{mnr} / {real.replace(' ', chr(92) + '040')} rw - fuse.txfs txfs rw\n"
        "52 1 0:99 / /elsewhere rw - fuse.txfs txfs rw\n"
    )
    (tmp_path / "sub").mkdir()
    assert txfs.find_mount(tmp_path / "sub") == real
    assert txfs.find_mount(str(fake)) == real
    assert _errno_of(txfs.find_mount, "/nonexistent/x") == errno.ENOENT
    assert _errno_of(txfs.find_mount, "/proc/self") == errno.ENOTTY
    assert _errno_of(txfs.begin, "/proc/self") == errno.ENOTTY
    monkeypatch.chdir("/proc")  # on neither device
    assert _errno_of(txfs.find_mount) == errno.ENOTUNIQ


def test_several_mounts_the_current_directorys(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # of several txfs mounts, the deepest holding the current directory
    st = os.stat(tmp_path)
    real = os.path.realpath(tmp_path)
    fake.write_text(
        "50 1 0:98 / /mnt/a rw - fuse.txfs txfs rw\n"
        f"51 1 {os.major(st.st_dev)}:{os.minor(st.st_dev)} / {real} rw - fuse.txfs txfs rw\n"
        "52 1 0:99 / /mnt/b rw - fuse txfs:/srv/b rw\n"
    )
    (tmp_path / "inner").mkdir()
    monkeypatch.chdir(tmp_path / "inner")
    assert txfs.find_mount() == real
    monkeypatch.chdir("/proc")
    with pytest.raises(OSError) as ei:
        txfs.find_mount()
    assert ei.value.errno == errno.ENOTUNIQ
    assert all(p in str(ei.value) for p in ("/mnt/a", "/mnt/b", real)), ei.value


def test_txfs_mount_variable(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.write_text(EXT4_LINES + "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n")
    # set but empty: as if unset
    assert txfs.find_mount(environ={"TXFS_MOUNT": ""}) == "/mnt/a"
    assert _errno_of(txfs.find_mount, environ={"TXFS_MOUNT": "/nonexistent/txfs"}) == errno.ENOENT
    assert _errno_of(txfs.find_mount, environ={"TXFS_MOUNT": str(tmp_path)}) == errno.ENOTTY
    monkeypatch.setenv("TXFS_MOUNT", str(tmp_path))
    assert _errno_of(txfs.begin) == errno.ENOTTY
    # an explicit mount= wins over the variable
    assert _errno_of(txfs.begin, "/nonexistent/y") == errno.ENOENT


def test_unreadable_mountinfo_trusts_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-mountinfo"
    f = tmp_path / "file"
    f.write_text("x")
    real = os.path.realpath(tmp_path)
    assert txfs.find_mount(tmp_path, mountinfo=missing) == real
    assert txfs.find_mount(f, mountinfo=missing) == real
    assert _errno_of(txfs.find_mount, None, mountinfo=missing, environ={}) == errno.ENOENT


def test_real_mountinfo_parses() -> None:
    # whatever is mounted here, parsing the real file works
    for e in mounts.read_mountinfo():
        assert e.point.startswith("/")


# ---- transaction logic against a fake daemon -----------------------------------


class FakeDaemon:
    """Stands in for the ioctls: per-thread depth, flattening, dooming."""

    def __init__(self) -> None:
        self.depth: Dict[int, int] = {}
        self.doomed: Dict[int, bool] = {}
        self.calls: List[Tuple[str, int, int]] = []  # (name, tid, flags)
        self.commits = 0
        self.aborts = 0
        self.fail_next_commit_with: Optional[int] = None
        self.lock = threading.Lock()

    def ioctl(self, mount: str, request: int, arg: bytes) -> bytes:
        tid = threading.get_native_id()
        names = {v: k for k, v in _wire.IOCTLS.items()}
        name = names[request]
        flags = _wire.IOC_FLAGS.unpack(arg)[0] if len(arg) == 8 else 0
        with self.lock:
            self.calls.append((name, tid, flags))
            d = self.depth.get(tid, 0)
            if name == "TXFS_IOC_BEGIN":
                if self.doomed.get(tid):
                    raise txfs.Conflict(errno.EDEADLK, "doomed", mount)
                self.depth[tid] = d + 1
            elif name == "TXFS_IOC_COMMIT":
                if d == 0:
                    raise OSError(errno.EINVAL, "no transaction", mount)
                if self.doomed.get(tid) or self.fail_next_commit_with == errno.EDEADLK:
                    self.fail_next_commit_with = None
                    self.doomed[tid] = True
                    raise txfs.Conflict(errno.EDEADLK, "conflict", mount)
                self.depth[tid] = d - 1
                if d == 1:
                    self.commits += 1
            elif name == "TXFS_IOC_ABORT":
                if d == 0:
                    raise OSError(errno.EINVAL, "no transaction", mount)
                self.depth[tid] = 0
                self.doomed[tid] = False
                self.aborts += 1
            elif name == "TXFS_IOC_STATE":
                if self.doomed.get(tid):
                    raise txfs.Conflict(errno.EDEADLK, "doomed", mount)
                return _wire.IOC_STATE.pack(tid if d else 0, d, 0)
            elif name == "TXFS_IOC_STATUS":
                return _wire.IOC_STATUS.pack(self.commits, self.aborts, 0, 0, 0, 0, 0, 0)
            return arg

    def doom(self) -> None:
        self.doomed[threading.get_native_id()] = True


@pytest.fixture()
def daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaemon]:
    d = FakeDaemon()
    monkeypatch.setattr(txfs, "_ioctl", d.ioctl)
    # the outermost begin opens (or reuses) a real descriptor: none here
    monkeypatch.setattr(txfs, "_begin_outermost", lambda root, arg: (d.ioctl(root, _wire.TXFS_IOC_BEGIN, arg), None)[1])
    monkeypatch.setattr(txfs, "find_mount", lambda path=None, **kw: "/fake/mnt")
    yield d
    assert not txfs.in_transaction()


def test_commit_on_exit_durable_and_ordered(daemon: FakeDaemon) -> None:
    with txfs.transaction() as tx:
        assert tx.mount == "/fake/mnt"
        assert txfs.in_transaction()
        assert txfs.state() == {"tx": threading.get_native_id(), "depth": 1, "doomed": False}
    with txfs.transaction(durable=False):
        pass
    commits = [c for c in daemon.calls if c[0] == "TXFS_IOC_COMMIT"]
    assert [c[2] for c in commits] == [0, txfs.TXFS_COMMIT_ORDERED]
    assert daemon.commits == 2
    assert txfs.status()["commits"] == 2


def test_exception_aborts_and_reraises(daemon: FakeDaemon) -> None:
    with pytest.raises(KeyError):
        with txfs.transaction():
            raise KeyError("boom")
    assert daemon.aborts == 1 and daemon.commits == 0
    assert not txfs.in_transaction()


def test_nested_flattens(daemon: FakeDaemon) -> None:
    with txfs.transaction():
        with txfs.transaction():
            assert txfs.state()["depth"] == 2
        assert daemon.commits == 0
        assert txfs.in_transaction()
        assert txfs.state()["depth"] == 1
    assert daemon.commits == 1


def test_inner_exception_aborts_everything(daemon: FakeDaemon) -> None:
    with pytest.raises(RuntimeError):
        with txfs.transaction():
            with txfs.transaction():
                raise RuntimeError("inner")
    assert daemon.aborts == 1  # the outer exit finds nothing left to abort
    assert daemon.commits == 0


def test_commit_conflict_raises_conflict_and_aborts(daemon: FakeDaemon) -> None:
    daemon.fail_next_commit_with = errno.EDEADLK
    with pytest.raises(txfs.Conflict) as ei:
        with txfs.transaction():
            pass
    assert ei.value.errno == errno.EDEADLK
    assert isinstance(ei.value, OSError)
    assert daemon.aborts == 1  # the doomed transaction was aborted
    assert not txfs.in_transaction()


def test_edeadlk_inside_block_becomes_conflict(daemon: FakeDaemon) -> None:
    with pytest.raises(txfs.Conflict) as ei:
        with txfs.transaction():
            daemon.doom()
            raise OSError(errno.EDEADLK, "write lost", "/fake/mnt/f")
    assert isinstance(ei.value.__cause__, OSError)
    assert ei.value.filename == "/fake/mnt/f"
    assert daemon.aborts == 1


def test_transaction_ended_inside_block(daemon: FakeDaemon) -> None:
    with txfs.transaction() as tx:
        tx.abort()
    assert daemon.aborts == 1 and daemon.commits == 0
    with pytest.raises(OSError) as ei:
        with txfs.transaction():
            txfs.abort()
    assert ei.value.errno == errno.EINVAL


def test_commit_and_abort_without_transaction(daemon: FakeDaemon) -> None:
    assert _errno_of(txfs.commit) == errno.EINVAL
    assert _errno_of(txfs.abort) == errno.EINVAL


def test_low_level_commit_conflict_keeps_doomed_tx_until_abort(daemon: FakeDaemon) -> None:
    txfs.begin()
    daemon.fail_next_commit_with = errno.EDEADLK
    with pytest.raises(txfs.Conflict):
        txfs.commit()
    assert txfs.in_transaction()  # doomed, still open: it must be aborted
    txfs.abort()
    assert not txfs.in_transaction()


def test_bookkeeping_is_per_thread(daemon: FakeDaemon) -> None:
    seen: List[bool] = []
    with txfs.transaction():
        t = threading.Thread(target=lambda: seen.append(txfs.in_transaction()))
        t.start()
        t.join()
    assert seen == [False]


def test_forked_child_does_not_inherit_the_transaction(daemon: FakeDaemon) -> None:
    with txfs.transaction():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os._exit(0 if not txfs.in_transaction() else 1)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_transaction_as_decorator(daemon: FakeDaemon) -> None:
    @txfs.transaction(durable=False)
    def f(x: int) -> int:
        assert txfs.in_transaction()
        return x * 2

    assert f(2) == 4 and f(3) == 6
    assert daemon.commits == 2


# ---- retry and transactional ------------------------------------------------------


def test_retry_reruns_on_conflict() -> None:
    calls: List[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise txfs.Conflict()
        return "done"

    assert txfs.retry(fn, attempts=5, backoff=0) == "done"
    assert len(calls) == 3


def test_retry_gives_up_and_reraises() -> None:
    calls: List[int] = []

    def fn() -> None:
        calls.append(1)
        raise OSError(errno.EDEADLK, "plain OSError with EDEADLK counts too")

    with pytest.raises(OSError) as ei:
        txfs.retry(fn, attempts=4, backoff=0)
    assert ei.value.errno == errno.EDEADLK
    assert len(calls) == 4
    with pytest.raises(ValueError):
        txfs.retry(fn, attempts=0)


def test_retry_does_not_retry_other_errors() -> None:
    calls: List[int] = []

    def fn() -> None:
        calls.append(1)
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(OSError):
        txfs.retry(fn, attempts=5, backoff=0)
    assert len(calls) == 1


def test_transactional_reruns_whole_transaction(daemon: FakeDaemon) -> None:
    runs: List[int] = []

    @txfs.transactional(attempts=5, backoff=0)
    def work(a: int, b: int = 0) -> int:
        runs.append(1)
        if len(runs) == 1:
            daemon.fail_next_commit_with = errno.EDEADLK
        return a + b

    assert work(1, b=2) == 3
    assert len(runs) == 2
    assert daemon.commits == 1 and daemon.aborts == 1
    assert work.__name__ == "work"

    @txfs.transactional
    def bare() -> str:
        return "ok"

    assert bare() == "ok"


def test_retry_inside_open_transaction_does_not_loop(daemon: FakeDaemon) -> None:
    calls: List[int] = []

    def fn() -> None:
        calls.append(1)
        raise txfs.Conflict()

    with pytest.raises(txfs.Conflict):
        with txfs.transaction():
            txfs.retry(fn, attempts=5, backoff=0)
    assert len(calls) == 1


def test_conflict_is_oserror_edeadlk() -> None:
    c = txfs.Conflict()
    assert isinstance(c, OSError) and c.errno == errno.EDEADLK
    assert txfs.Conflict(errno.EDEADLK, "x", "/m").filename == "/m"


# ---- atomic_write off txfs: temp file, fsync, rename, fsync(dir) ---------


def test_atomic_write_off_txfs_replaces_whole_and_durably(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "config"
    target.write_text("old")
    target.chmod(0o640)
    synced: list = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with txfs.atomic_write(target) as f:
        f.write("new ")
        f.flush()
        assert target.read_text() == "old", "nothing visible before the end"
        f.write("content")
    assert target.read_text() == "new content"
    assert synced == [False, True], "the file, then its directory"
    assert (target.stat().st_mode & 0o777) == 0o640, "a replaced file keeps its permissions"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "mountinfo"], "no temporary left"
    with txfs.atomic_write(tmp_path / "bin", "wb") as fb:
        fb.write(b"\0\1")
    assert (tmp_path / "bin").read_bytes() == b"\0\1"


def test_atomic_write_off_txfs_changes_nothing_on_an_exception(fake: Path, tmp_path: Path) -> None:
    target = tmp_path / "config"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with txfs.atomic_write(target) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "mountinfo"], "no temporary left"
    with pytest.raises(FileExistsError):
        with txfs.atomic_write(target, "x") as f:
            f.write("other")
    assert target.read_text() == "old"
    with txfs.atomic_write(tmp_path / "fresh", "x") as f:
        f.write("first")
    assert (tmp_path / "fresh").read_text() == "first"
    with pytest.raises(ValueError):
        with txfs.atomic_write(target, "a"):
            pass  # pragma: no cover


# ---- the change set against a fake daemon ------------------------------------------


def _record(
    path: bytes,
    what: int = _wire.TXFS_CHANGE_CREATED,
    from_: bytes = b"",
    old_target: bytes = b"",
    target: bytes = b"",
    xattrs: Tuple[bytes, ...] = (),
    sizes: Tuple[int, int] = (0, 1),
) -> bytes:
    """A record of a CHANGES listing, as the daemon encodes one (wire.rs
    encode_change); numbers that tell the fields apart."""
    names = b"".join(x + b"\0" for x in xattrs)
    tail = b"".join(len(s).to_bytes(4, "little") + s for s in (path, from_, old_target, target, names))
    head = _wire.CHANGE_RECORD.pack(0, what, 0o100000, 0o100644, 0o100600, 1, 2, 3, 4, 0, *sizes, 7, 8, 9)
    rec = head + tail
    return len(rec).to_bytes(4, "little") + rec[4:]


class FakeListings:
    """Stands in for CHANGES: one listing (a snapshot per LIST from 0) and
    the new side of each change, `contents[index]`."""

    def __init__(self, listing: bytes, contents: Dict[int, bytes], total: Optional[int] = None) -> None:
        self.listing, self.contents = listing, contents
        self.total = len(listing) if total is None else total
        self.snap = 0
        self.asked: List[Tuple[int, int]] = []  # (op, offset)

    def ioctl(self, mount: str, arg: bytes) -> bytes:
        pid, op, offset, index, _, _, snap, _, _, _ = _wire.IOC_CHANGES.unpack(arg)
        assert (pid, mount) == (0, "/fake/mnt")
        self.asked.append((op, offset))
        if op == _wire.TXFS_CHANGES_LIST and offset == 0:
            self.snap += 1
        elif snap != self.snap:
            raise OSError(errno.ESTALE, "stale", mount)
        if op == _wire.TXFS_CHANGES_LIST:
            data, total = self.listing[offset : offset + _wire.TXFS_CHANGES_DATA], self.total
        elif op == _wire.TXFS_CHANGES_NEW and index in self.contents:
            body = self.contents[index]
            data, total = body[offset : offset + _wire.TXFS_CHANGES_DATA], len(body)
        else:
            raise OSError(errno.ENOENT, "no file", mount)
        return _wire.IOC_CHANGES.pack(0, op, offset, index, total, len(data), self.snap, 0, 0, data)


@pytest.fixture()
def listings(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeListings]:
    big = b"d/" + b"p" * 3000
    recs = [_record(b"a%04d" % i + b"-" * (i % 50)) for i in range(300)]
    recs.append(_record(b"caf\xe9", _wire.TXFS_CHANGE_RENAMED, from_=b"old/caf\xe9", sizes=(5, 5)))
    recs.append(_record(big, _wire.TXFS_CHANGE_XATTR, xattrs=tuple(b"user.%04d" % i + b"x" * 190 for i in range(200))))
    recs.append(_record(b"lnk", _wire.TXFS_CHANGE_REPLACED, old_target=b"keep", target=b"kept"))
    fake = FakeListings(b"".join(recs), {300: b"0123456789" * 4000})
    monkeypatch.setattr(txfs, "_changes_ioctl", fake.ioctl)
    monkeypatch.setattr(txfs, "find_mount", lambda path=None, **kw: "/fake/mnt")
    yield fake


def test_changes_decode_records_across_pages(listings: FakeListings) -> None:
    got = list(txfs.changes("/fake/mnt"))
    assert len(got) == 303
    assert [c.index for c in got] == list(range(303))
    assert got[7].path == "a0007" + "-" * 7 and got[7].status == "created" and got[7].what == {"created"}
    c = got[7]
    assert (c.kind, c.old_mode, c.new_mode, c.old_uid, c.old_gid, c.new_uid, c.new_gid) == (
        0o100000,
        0o100644,
        0o100600,
        1,
        2,
        3,
        4,
    )
    assert (c.old_size, c.new_size, c.bytes_written, c.files, c.dirs) == (0, 1, 7, 8, 9)
    renamed = got[300]
    assert os.fsencode(renamed.path) == b"caf\xe9" and os.fsencode(renamed.from_) == b"old/caf\xe9"
    assert renamed.status == "renamed"
    big = got[301]  # a record longer than a page: three pages
    assert len(big.path) == 3002 and len(big.xattrs) == 200 and big.xattrs[199] == "user.0199" + "x" * 190
    assert big.what == {"xattr"} and big.status == "changed"
    assert (got[302].old_target, got[302].target, got[302].status) == ("keep", "kept", "replaced")
    pages = -(-listings.total // _wire.TXFS_CHANGES_DATA)
    assert [o for _, o in listings.asked] == [i * _wire.TXFS_CHANGES_DATA for i in range(pages)]


def test_changes_read_a_side_a_page_at_a_time(listings: FakeListings) -> None:
    got = list(txfs.changes("/fake/mnt"))
    assert got[300].read_new() == b"0123456789" * 4000
    assert got[300].read_new(39_995) == b"56789"
    assert got[300].read_new(16_000, 700) == (b"0123456789" * 4000)[16_000:16_700]
    with pytest.raises(OSError) as ei:
        got[300].read_old()
    assert ei.value.errno == errno.ENOENT


def test_changes_replaced_by_a_newer_listing_are_stale(listings: FakeListings) -> None:
    old = txfs.changes("/fake/mnt")
    assert next(old).index == 0
    newer = txfs.changes("/fake/mnt")
    for _ in range(2):  # (the failure stays)
        with pytest.raises(OSError) as ei:
            list(old)
        assert ei.value.errno == errno.ESTALE and "changes() again" in str(ei.value), ei.value
    assert len(list(newer)) == 303


def test_a_cut_listing_is_refused(listings: FakeListings) -> None:
    listings.total += 10  # the daemon says more than it has
    with pytest.raises(OSError) as ei:
        list(txfs.changes("/fake/mnt"))
    assert ei.value.errno == errno.EPROTO
    listings.total -= 10
    listings.listing = listings.listing[:-1]
    listings.total -= 1
    with pytest.raises(OSError) as ei:
        list(txfs.changes("/fake/mnt"))
    assert ei.value.errno == errno.EPROTO


def test_change_status_is_the_clis() -> None:
    def status(bits: int) -> str:
        fake = FakeListings(_record(b"x", bits), {})
        with pytest.MonkeyPatch.context() as m:
            m.setattr(txfs, "_changes_ioctl", fake.ioctl)
            m.setattr(txfs, "find_mount", lambda path=None, **kw: "/fake/mnt")
            return next(txfs.changes("/fake/mnt")).status

    w = _wire
    assert status(w.TXFS_CHANGE_RENAMED | w.TXFS_CHANGE_MODIFIED) == "renamed"
    assert status(w.TXFS_CHANGE_REPLACED | w.TXFS_CHANGE_MODIFIED) == "modified"
    assert status(w.TXFS_CHANGE_REPLACED) == "replaced"
    assert status(w.TXFS_CHANGE_LINKED | w.TXFS_CHANGE_MODE) == "linked"
    assert status(w.TXFS_CHANGE_MODE | w.TXFS_CHANGE_TIMES) == "changed"
