"""Shared mappings made before a transaction, moved into it.

A shared mapping is of one kernel inode's page cache, and a store into it
never reaches the file system: it is a plain write of every process that
maps the file. A transaction's own opens are of private nodes (other kernel
inodes with the same ``st_ino``), whose pages are the transaction's. So at
an outermost begin the calling process's shared mappings of files on the
mount are moved onto private nodes, and at the end back onto the shared
ones (``clients/c/txfs.c`` does the same, step for step):

1. before BEGIN: each shared mapping of the mount (asked of
   ``/proc/self/maps`` with ``PROCMAP_QUERY``, Linux >= 6.11: a few
   microseconds; else read from its text, which grows with the process) is
   written back (``msync``: what it holds is the committed state's, plain
   writes made before the transaction), and its file opened by path, a
   descriptor of the shared inode kept for the way back;
2. after BEGIN: the file is opened again, now inside the transaction (a
   private node; ``st_ino`` the same), mapped at a fresh address, and moved
   over the old range with ``mremap`` — one call, so the range is never
   unmapped, and a failure leaves the old mapping in place;
3. at the end: before ABORT (the private pages are then thrown away) or
   after COMMIT (which writes them back into the transaction first), each
   range that still maps that file is moved back onto the kept descriptor.

This is what SQLite in WAL mode needs: its index (``-shm``) is such a
mapping, made when the connection opened, usually long before
``with txfs.transaction():``. Its stores inside the transaction are then the
transaction's: other connections read the committed index, and an abort
takes the index back with the WAL.

The mappings are the process's, not the thread's: while a thread's
transaction holds them, the process's other threads see its pages too.
Ranges moved by one thread's transaction are left alone by another's. A
mapping made *during* the transaction through a descriptor opened before
it stays shared (docs/LIMITS.md item 6).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct
import threading
from typing import List, NamedTuple, Optional

_PROT = {"r": 0x1, "w": 0x2, "x": 0x4}
_MAP_SHARED = 0x01
_MS_SYNC = 0x4
_MREMAP_MAYMOVE = 0x1
_MREMAP_FIXED = 0x2
_MAP_FAILED = ctypes.c_void_p(-1).value
_DELETED = " (deleted)"

MAPS = "/proc/self/maps"

# linux/fs.h of Linux 6.11: struct procmap_query, 104 bytes
_QUERY = struct.Struct("=9Q4I2Q")
_PROCMAP_QUERY = 0xC0686611  # _IOWR('f', 17, struct procmap_query)
_Q_READABLE, _Q_WRITABLE, _Q_EXECUTABLE, _Q_SHARED = 0x1, 0x2, 0x4, 0x8
_Q_COVERING_OR_NEXT, _Q_FILE_BACKED = 0x10, 0x20
_NAME_MAX = 4096

#: False once PROCMAP_QUERY was refused (an older kernel), or for tests
use_query = True


def _load_libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mmap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        libc.mremap.restype = ctypes.c_void_p
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


class Mapping(NamedTuple):
    """One shared mapping of a file on the mount, as ``/proc/self/maps``
    shows it."""

    lo: int
    hi: int
    prot: int
    offset: int
    ino: int
    path: str


def parse_maps(text: str, dev: int) -> List[Mapping]:
    """The shared mappings of files on device ``dev`` in a maps listing.

    A file whose dentry a transaction displaced reads ``PATH (deleted)``:
    the suffix is cut, and the inode is checked when the path is opened.
    Paths the kernel escaped (a newline in a name) are left out."""
    found = []
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[3] != want or fields[1][3] != "s":
            continue
        span, perms, offset, _, ino, path = fields
        if not path.startswith("/") or "\\" in path:
            continue
        if path.endswith(_DELETED):
            path = path[: -len(_DELETED)]
        lo, hi = (int(x, 16) for x in span.split("-"))
        prot = sum(bit for flag, bit in _PROT.items() if flag in perms[:3])
        found.append(Mapping(lo, hi, prot, int(offset, 16), int(ino), path))
    return found


class Moved(NamedTuple):
    """A mapping a transaction holds, and the shared descriptor to put
    back."""

    where: Mapping
    shared: int  # descriptor of the shared inode, opened before BEGIN
    tid: int


_lock = threading.Lock()
_moved: dict[int, Moved] = {}  # by start address: every live transaction's


def _query(fd: int, addr: int, covering: bool, name: ctypes.Array) -> Optional[tuple]:
    """One PROCMAP_QUERY: the shared file mapping covering ``addr`` (or,
    unless ``covering``, the next one), or None; OSError if refused."""
    flags = _Q_FILE_BACKED | _Q_SHARED | (0 if covering else _Q_COVERING_OR_NEXT)
    buf = bytearray(_QUERY.pack(_QUERY.size, flags, addr, 0, 0, 0, 0, 0, 0, 0, 0, _NAME_MAX, 0, ctypes.addressof(name), 0))
    try:
        fcntl.ioctl(fd, _PROCMAP_QUERY, buf, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    return _QUERY.unpack(buf)


def _from_query(q: tuple, name: ctypes.Array, dev: int) -> Optional[Mapping]:
    _, _, _, lo, hi, vflags, _, offset, ino, major, minor = q[:11]
    if os.makedev(major, minor) != dev:
        return None
    path = os.fsdecode(name.value)
    if path.endswith(_DELETED):
        path = path[: -len(_DELETED)]
    if not path.startswith("/"):
        return None
    prot = (
        (_PROT["r"] if vflags & _Q_READABLE else 0)
        | (_PROT["w"] if vflags & _Q_WRITABLE else 0)
        | (_PROT["x"] if vflags & _Q_EXECUTABLE else 0)
    )
    return Mapping(lo, hi, prot, offset, ino, path)


def _queried(dev: int, at: Optional[int] = None) -> Optional[List[Mapping]]:
    """The shared mappings on ``dev`` by PROCMAP_QUERY (with ``at``: only
    the one covering that address, if it is on ``dev``), or None when the
    kernel refuses the query."""
    global use_query
    if not use_query:
        return None
    name = ctypes.create_string_buffer(_NAME_MAX)
    found: List[Mapping] = []
    try:
        fd = os.open(MAPS, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        addr = at or 0
        while True:
            q = _query(fd, addr, at is not None, name)
            if q is None:
                return found
            m = _from_query(q, name, dev)
            if m is not None:
                found.append(m)
            if at is not None:
                return found
            addr = q[4]
    except OSError:
        use_query = False
        return None
    finally:
        os.close(fd)


def _read_maps(dev: int, at: Optional[int] = None) -> List[Mapping]:
    found = _queried(dev, at)
    if found is not None:
        return found
    try:
        with open(MAPS, encoding="utf-8", errors="surrogateescape") as f:
            return parse_maps(f.read(), dev)
    except OSError:
        return []


def _open_same(m: Mapping, dev: int) -> int:
    """``m``'s file opened by path, if it is still that file; else -1."""
    for flags in (os.O_RDWR, os.O_RDONLY):
        if flags == os.O_RDONLY and m.prot & _PROT["w"]:
            return -1
        try:
            fd = os.open(m.path, flags | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                continue
            return -1
        st = os.fstat(fd)
        if st.st_dev == dev and st.st_ino == m.ino:
            return fd
        os.close(fd)
        return -1
    return -1


def _move(m: Mapping, fd: int) -> bool:
    """Map ``fd`` over ``m``'s range in one step (never leaving it unmapped)."""
    assert _libc is not None
    size = m.hi - m.lo
    fresh = _libc.mmap(None, size, m.prot, _MAP_SHARED, fd, m.offset)
    if fresh is None or fresh == _MAP_FAILED:
        return False
    if _libc.mremap(fresh, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, m.lo) != m.lo:
        _libc.munmap(fresh, size)
        return False
    return True


def prepare(dev: int) -> List[Moved]:
    """Step 1: the process's shared mappings of device ``dev`` that no live
    transaction holds, written back, each with a shared descriptor."""
    if _libc is None:
        return []
    ready = []
    tid = threading.get_native_id()
    for m in _read_maps(dev):
        with _lock:
            if any(x.where.lo < m.hi and m.lo < x.where.hi for x in _moved.values()):
                continue
        if m.prot & _PROT["w"] and _libc.msync(m.lo, m.hi - m.lo, _MS_SYNC) != 0:
            continue
        fd = _open_same(m, dev)
        if fd >= 0:
            ready.append(Moved(m, fd, tid))
    return ready


def forget(ready: List[Moved]) -> None:
    for r in ready:
        os.close(r.shared)


def take(ready: List[Moved], dev: int) -> List[Moved]:
    """Step 2, inside the transaction: move each range onto a private node."""
    taken = []
    for r in ready:
        fd = _open_same(r.where, dev)
        moved = fd >= 0 and _move(r.where, fd)
        if fd >= 0:
            os.close(fd)
        if not moved:
            os.close(r.shared)
            continue
        with _lock:
            _moved[r.where.lo] = r
        taken.append(r)
    return taken


def give_back(taken: List[Moved], dev: int) -> None:
    """Step 3: each range that still maps its file goes back onto the shared
    inode (a range the program unmapped or mapped anew is left as it is)."""
    for r in taken:
        m = r.where
        now = _read_maps(dev, m.lo)
        if any(
            n.lo <= m.lo and m.hi <= n.hi and n.ino == m.ino and n.offset + (m.lo - n.lo) == m.offset
            for n in now
        ):
            _move(m, r.shared)
        os.close(r.shared)
        with _lock:
            _moved.pop(m.lo, None)


def after_fork_child() -> None:
    """A forked child keeps its copies of the mappings but none of the
    transactions: its shared descriptors are closed and forgotten."""
    for r in _moved.values():
        try:
            os.close(r.shared)
        except OSError:
            pass
    _moved.clear()
    global _lock
    _lock = threading.Lock()
