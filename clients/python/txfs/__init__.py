"""Transactions over a txfs mount, from Python.

    import txfs

    with txfs.transaction():            # the mount from $TXFS_MOUNT, or the only one
        with open("/mnt/tx/a", "w") as f:
            f.write("all or nothing")
        os.rename("/mnt/tx/b", "/mnt/tx/c")
    # committed (durably) here; an exception in the block aborts instead

    @txfs.transactional(attempts=10)    # re-run on conflict
    def bump(path): ...

A transaction belongs to the calling thread; nested transactions flatten into
the outermost one, which alone commits. A transaction that loses a conflict
fails with :class:`Conflict` (an :class:`OSError` with errno ``EDEADLK``, the
C header's ``TXFS_ECONFLICT``): abort it and run it again (:func:`retry`).

The transport is the ioctl protocol of ``txfs.h``; the mount is resolved
exactly as the C library's ``fs_tx_begin`` does (see :func:`find_mount` and
:mod:`txfs.mounts`, whose ``MOUNTINFO`` names the mountinfo file read).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import functools
import itertools
import os
import random
import stat
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import (
    IO,
    Any,
    Callable,
    FrozenSet,
    Iterator,
    NamedTuple,
    Optional,
    Tuple,
    Type,
    TypedDict,
    TypeVar,
    cast,
    overload,
)

from . import _wire, mounts
from ._wire import TXFS_COMMIT_ORDERED
from .mounts import MountEntry, PathArg, find_mount, parse_mountinfo, read_mountinfo

__version__ = "0.1.0"

__all__ = [
    "Change",
    "ChangeListing",
    "Conflict",
    "MountEntry",
    "Status",
    "TXFS_COMMIT_ORDERED",
    "TXFS_ECONFLICT",
    "Transaction",
    "TxState",
    "abort",
    "atomic_write",
    "begin",
    "changes",
    "commit",
    "find_mount",
    "in_transaction",
    "mounts",
    "parse_mountinfo",
    "read_mountinfo",
    "retry",
    "state",
    "status",
    "sync",
    "transaction",
    "transactional",
]

#: errno of a lost conflict (``TXFS_ECONFLICT`` in ``txfs.h``)
TXFS_ECONFLICT = errno.EDEADLK

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Conflict(OSError):
    """The transaction lost a conflict (errno ``EDEADLK``) and is doomed.

    Every later operation of it fails the same way until it is aborted.
    Abort it and run it again; :func:`retry` and :func:`transactional` do.
    """

    def __init__(self, *args: Any) -> None:
        if not args:
            args = (errno.EDEADLK, os.strerror(errno.EDEADLK))
        super().__init__(*args)


class Status(TypedDict):
    """Counters of a mount (``struct txfs_ioc_status``)."""

    commits: int
    aborts: int
    conflicts: int
    live_txs: int
    journal_bytes: int
    journal_syncs: int
    checkpoints: int
    last_seq: int


class TxState(TypedDict):
    """The calling thread's transaction (``struct txfs_ioc_state``)."""

    tx: int  # 0: none
    depth: int  # nesting depth; 0: none
    doomed: bool  # lost a conflict: it can only abort


# ---- per-thread bookkeeping --------------------------------------------------


class _Local(threading.local):
    def __init__(self) -> None:
        self.mount: Optional[str] = None
        self.depth = 0  # begins through this module, not yet ended
        self.tid = 0  # who wrote this record (a forked child inherits it)
        self.fd = -1  # the mount root, open for the outermost transaction
        self.owner: Optional[_Held] = None  # what closes `fd` if the thread ends
        self.kept: Optional[_Held] = None  # kept between transactions


_local = _Local()


def _valid() -> bool:
    return _local.depth > 0 and _local.tid == threading.get_native_id()


def _clear() -> None:
    # A forked child's copy names its parent's descriptor: not ours to close.
    if _local.owner is not None and _local.tid == threading.get_native_id():
        old, _local.kept = _local.kept, _local.owner  # for the next transaction
        if old is not None:
            old.drop()
    _local.owner = None
    _local.fd = -1
    _local.mount = None
    _local.depth = 0
    _local.tid = 0


# ---- descriptors kept between transactions -----------------------------------
#
# As in the C library (clients/c/txfs.c), each thread keeps the mount root's
# descriptor of its last transaction for its next one: a transaction then
# costs the daemon begin and commit, not OPENDIR and RELEASEDIR besides. The
# descriptor is opened O_DSYNC (meaningless for a directory) as the mark by
# which `txfs umount` recognises it and detaches a mount that only such
# descriptors hold. Every descriptor this module holds beyond one call is in
# `_held` with the identity it was opened with, and is used or closed only
# while it still names that (a program may close numbers behind our back and
# reuse them). Each is owned by a `_Held` record in the thread's local data:
# a thread that ends (inside a transaction or not) closes its descriptor when
# that record is finalized, and a forked child closes its copies of all of
# them at the fork.

_AT_EMPTY_PATH = 0x1000
_STATX_INO = 0x100
_O_DSYNC = getattr(os, "O_DSYNC", 0o10000)

_held_lock = threading.RLock()  # re-entrant: a finalizer may run inside
# fd -> (dev, ino, token): its identity when opened, and which `_Held` owns it
# (a number closed behind our back and reopened by another thread is that
# thread's, even though it names the same root)
_held: dict[int, tuple[int, int, int]] = {}
_tokens = itertools.count(1)


def _fd_identity(fd: int) -> Optional[tuple[int, int]]:
    """Device and inode of what ``fd`` names, as the kernel has them cached."""
    if _statx is not None:
        buf = _Statx()
        if _statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC, _STATX_INO, ctypes.byref(buf)) == 0:
            return os.makedev(buf.dev_major, buf.dev_minor), buf.ino
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _still_ours(fd: int, entry: tuple[int, int, int]) -> bool:
    try:
        marked = fcntl.fcntl(fd, fcntl.F_GETFL) & _O_DSYNC
    except OSError:
        return False
    return bool(marked) and _fd_identity(fd) == entry[:2]


class _Held:
    """A descriptor of the root of ``mount`` (device ``dev``) this module
    opened and holds: a transaction's, then the thread's kept one.

    Finalized with the thread's record when the thread ends, which closes
    it; believed only in the process that opened it."""

    __slots__ = ("fd", "mount", "dev", "token", "pid")

    def __init__(self, fd: int, mount: str, dev: int) -> None:
        self.fd, self.mount, self.dev, self.pid = fd, mount, dev, os.getpid()
        self.token = next(_tokens)

    def _entry(self, fd: int) -> Optional[tuple[int, int, int]]:
        """The registry entry of ``fd`` if this record owns it (lock held)."""
        entry = _held.get(fd)
        return entry if entry is not None and entry[2] == self.token else None

    def ours(self) -> bool:
        """Whether the descriptor is still registered to this record and
        names what was opened (if not, it is forgotten, never closed)."""
        with _held_lock:
            entry = self._entry(self.fd)
            if entry is None:
                self.fd = -1
                return False
            if not _still_ours(self.fd, entry):
                del _held[self.fd]
                self.fd = -1
                return False
            return True

    def drop(self) -> None:
        """Forget the descriptor; close it if it is still ours."""
        fd, self.fd = self.fd, -1
        if fd < 0 or self.pid != os.getpid():
            return
        with _held_lock:
            entry = self._entry(fd)
            if entry is None:
                return
            del _held[fd]
            if _still_ours(fd, entry):
                os.close(fd)

    def __del__(self) -> None:
        # At interpreter exit every thread's record is finalized in the main
        # thread, while daemon threads are frozen wherever they were (perhaps
        # holding `_held_lock`): the kernel closes descriptors at exit anyway.
        if sys.is_finalizing():
            return
        try:
            self.drop()
        except Exception:
            pass


def _open_held(mount: str) -> _Held:
    """Open the root of ``mount`` (marked) and register the descriptor."""
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | _O_DSYNC)
    ident = _fd_identity(fd)
    if ident is None:
        os.close(fd)
        raise OSError(errno.EIO, f"cannot stat the descriptor of {mount}", mount)
    h = _Held(fd, mount, ident[0])
    with _held_lock:
        _held[fd] = (ident[0], ident[1], h.token)
    return h


def _after_fork_child() -> None:
    for fd, entry in list(_held.items()):
        if _still_ours(fd, entry):
            try:
                os.close(fd)
            except OSError:
                pass
    _held.clear()
    _held_lock.release()


os.register_at_fork(
    before=_held_lock.acquire, after_in_parent=_held_lock.release, after_in_child=_after_fork_child
)


def _take_kept(mount: str) -> Optional[_Held]:
    """The thread's kept descriptor if it is of ``mount`` and that is still
    the same mount (its cached device); else None (a stale one is closed)."""
    k, _local.kept = _local.kept, None
    if k is None or k.fd < 0 or k.pid != os.getpid():
        return None
    if k.mount != mount or _cached_dev(mount) != k.dev:
        k.drop()
        return None
    return k if k.ours() else None


# ---- mount resolution, remembered per thread ---------------------------------
#
# Resolving a mount reads /proc/self/mountinfo and stats the path (a GETATTR
# to the daemon each, when the kernel has no fresh attributes). Each thread
# remembers its last answer and re-checks it by the device number the kernel
# has cached (statx with AT_STATX_DONT_SYNC: no request), as the C library
# does (the descriptor itself is kept: see above).

_AT_FDCWD = -100
_AT_STATX_DONT_SYNC = 0x4000
_STATX_TYPE = 0x1


class _Statx(ctypes.Structure):
    _fields_ = [
        ("mask", ctypes.c_uint32),
        ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64),
        ("nlink", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("mode", ctypes.c_uint16),
        ("_pad1", ctypes.c_uint16),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("attributes_mask", ctypes.c_uint64),
        ("times", ctypes.c_uint8 * 64),
        ("rdev_major", ctypes.c_uint32),
        ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32),
        ("dev_minor", ctypes.c_uint32),
        ("_spare", ctypes.c_uint64 * 14),
    ]


def _load_statx() -> Optional[Any]:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    fn.restype = ctypes.c_int
    return fn


_statx = _load_statx()


def _cached_dev(path: str) -> Optional[int]:
    """The device of ``path`` as the kernel has it cached, or None."""
    if _statx is None:
        return None
    buf = _Statx()
    if _statx(_AT_FDCWD, os.fsencode(path), _AT_STATX_DONT_SYNC, _STATX_TYPE, ctypes.byref(buf)) != 0:
        return None
    return os.makedev(buf.dev_major, buf.dev_minor)


class _Last(threading.local):
    def __init__(self) -> None:
        self.key: Optional[tuple[str, str, Optional[int]]] = None
        self.mount = ""
        self.dev = 0


_last = _Last()


def _resolve(mount: Optional[PathArg]) -> str:
    """:func:`find_mount`, answered from the thread's last resolution while
    the path is still on the same device."""
    path = os.fspath(mount) if mount is not None else os.environ.get("TXFS_MOUNT") or None
    # With no path, of several mounts the current directory's is taken: its
    # device is part of the question.
    cwd_dev = _cached_dev(".") if path is None else None
    key = (os.fsdecode(path) if path is not None else "", str(mounts.MOUNTINFO), cwd_dev)
    if _last.key == key and _cached_dev(key[0] or _last.mount) == _last.dev:
        return _last.mount
    root = find_mount(mount)
    dev = _cached_dev(root)
    _last.key = key if dev is not None else None
    _last.mount, _last.dev = root, dev or 0
    return root


def in_transaction() -> bool:
    """Whether the calling thread began a transaction here that is still open."""
    return _valid()


# ---- transport ---------------------------------------------------------------


def _ioctl_error(e: OSError, mount: str) -> OSError:
    """The error to raise for a failed ioctl on ``mount``."""
    code = errno.ENOTTY if e.errno == errno.ENOSYS else (e.errno or errno.EIO)
    if code == errno.EDEADLK:
        return Conflict(code, os.strerror(code), mount)
    return OSError(code, os.strerror(code), mount)


def _fd_ioctl(fd: int, mount: str, request: int, arg: bytes) -> bytes:
    try:
        return fcntl.ioctl(fd, request, arg)
    except OSError as e:
        raise _ioctl_error(e, mount) from None


def _fd_ioctl_into(fd: int, mount: str, request: int, buf: bytearray) -> None:
    """An ioctl whose argument ``buf`` the daemon answers in place (fcntl
    copies an immutable one into 1 KiB, too small for CHANGES)."""
    try:
        fcntl.ioctl(fd, request, buf, True)
    except OSError as e:
        raise _ioctl_error(e, mount) from None


def _ioctl(mount: str, request: int, arg: bytes) -> bytes:
    """One ioctl on ``mount``: through the thread's transaction descriptor
    when it is on that mount, else open, ioctl, close."""
    if _valid() and _local.fd >= 0 and mount == _local.mount:
        return _fd_ioctl(_local.fd, mount, request, arg)
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _fd_ioctl(fd, mount, request, arg)
    finally:
        os.close(fd)


# A kept descriptor whose mount went away (unmounted, its daemon gone)
# answers one of these: the begin is tried again on a fresh descriptor.
_GONE = (errno.ENOTCONN, errno.ECONNABORTED, errno.ENODEV, errno.ECANCELED)


def _begin_outermost(root: str, arg: bytes) -> Optional[_Held]:
    """Begin on the thread's kept descriptor of ``root`` or a fresh one;
    returns the descriptor's record, which then serves the transaction."""
    h = _take_kept(root)
    if h is not None:
        try:
            _fd_ioctl(h.fd, root, _wire.TXFS_IOC_BEGIN, arg)
            return h
        except OSError as e:
            h.drop()
            if e.errno not in _GONE:
                raise
    h = _open_held(root)
    try:
        _fd_ioctl(h.fd, root, _wire.TXFS_IOC_BEGIN, arg)
    except BaseException:
        h.drop()
        raise
    return h


def _flags(flags: int) -> bytes:
    return _wire.IOC_FLAGS.pack(flags, 0)


def _current_mount() -> str:
    if _valid():
        assert _local.mount is not None
        return _local.mount
    return _resolve(None)


# ---- the API -----------------------------------------------------------------


def begin(mount: Optional[PathArg] = None, flags: int = 0) -> None:
    """Begin (or, if the thread is in one, nest into) a transaction.

    ``mount`` is any path inside a txfs mount; ``None`` means ``$TXFS_MOUNT``
    or the only txfs mount. Raises :class:`OSError`: ``ENODEV`` (no txfs
    mount), ``ENOTUNIQ`` (several), ``ENOTTY`` (not a txfs path), ``EXDEV``
    (nested begin on another mount than the open transaction's), ...
    """
    root = _resolve(mount)
    nested = _valid()
    if nested and root != _local.mount:
        assert _local.mount is not None
        if os.stat(root).st_dev != os.stat(_local.mount).st_dev:
            raise OSError(
                errno.EXDEV,
                f"this thread's transaction is on {_local.mount}, not on {root}",
                os.fspath(mount) if mount is not None else root,
            )
    if nested:
        assert _local.mount is not None
        _ioctl(_local.mount, _wire.TXFS_IOC_BEGIN, _flags(flags))
        _local.depth += 1
        return
    owner = _begin_outermost(root, _flags(flags))
    _local.owner = owner
    _local.fd = owner.fd if owner is not None else -1
    _local.mount = root
    _local.tid = threading.get_native_id()
    _local.depth = 1


def _resync() -> None:
    """After a failed commit: ask the daemon whether the transaction lives on."""
    if not _valid():
        return
    assert _local.mount is not None
    try:
        raw = _ioctl(_local.mount, _wire.TXFS_IOC_STATE, bytes(_wire.IOC_STATE.size))
    except Conflict:
        return  # doomed but open: it still needs an abort
    except OSError:
        _clear()
        return
    tx, depth, _ = _wire.IOC_STATE.unpack(raw)
    if tx == 0 or depth == 0:
        _clear()
    elif depth < _local.depth:
        _local.depth = depth


def commit(durable: bool = True) -> None:
    """Commit the calling thread's transaction (an inner one: just end it).

    ``durable=True`` returns once the commit is on disk; ``durable=False``
    once its order is fixed (``TXFS_COMMIT_ORDERED``; :func:`sync` makes it
    durable). Raises :class:`Conflict` if the transaction lost a conflict.
    """
    mount = _current_mount()
    mine = _valid()
    flags = 0 if durable else TXFS_COMMIT_ORDERED
    try:
        _ioctl(mount, _wire.TXFS_IOC_COMMIT, _flags(flags))
    except OSError:
        if mine:
            _resync()
        raise
    if mine:
        _local.depth -= 1
        if _local.depth == 0:
            _clear()


def abort() -> None:
    """Abort the calling thread's transaction, nested levels and all."""
    mount = _current_mount()
    try:
        _ioctl(mount, _wire.TXFS_IOC_ABORT, _flags(0))
    finally:
        if _valid():
            _clear()


def sync(mount: Optional[PathArg] = None) -> None:
    """Make every earlier commit on the mount durable (``TXFS_IOC_SYNC``)."""
    root = find_mount(mount) if mount is not None else _current_mount()
    _ioctl(root, _wire.TXFS_IOC_SYNC, _flags(0))


def status(mount: Optional[PathArg] = None) -> Status:
    """The mount's counters: commits, aborts, conflicts, live_txs, ..."""
    root = find_mount(mount)
    raw = _ioctl(root, _wire.TXFS_IOC_STATUS, bytes(_wire.IOC_STATUS.size))
    values = _wire.IOC_STATUS.unpack(raw)
    return cast(Status, dict(zip(_wire.STATUS_FIELDS, values)))


def state(mount: Optional[PathArg] = None) -> TxState:
    """The calling thread's transaction as the daemon sees it."""
    root = find_mount(mount) if mount is not None else _current_mount()
    raw = _ioctl(root, _wire.TXFS_IOC_STATE, bytes(_wire.IOC_STATE.size))
    tx, depth, flags = _wire.IOC_STATE.unpack(raw)
    return {"tx": tx, "depth": depth, "doomed": bool(flags & _wire.TXFS_STATE_DOOMED)}


# ---- the change set -------------------------------------------------------------
#
# CHANGES (txfs.h, struct txfs_ioc_changes) answers a page of a listing that
# the daemon snapshots at offset 0, names by its `snap`, and keeps until the
# next listing from 0 or the transaction's end. A ChangeListing holds one
# page and decodes its records in place; one that straddles pages is joined
# from as many as it spans.


def _changes_ioctl(mount: str, arg: bytes) -> bytes:
    """One CHANGES ioctl on ``mount``, as :func:`_ioctl` issues one."""
    buf = bytearray(arg)
    if _valid() and _local.fd >= 0 and mount == _local.mount:
        _fd_ioctl_into(_local.fd, mount, _wire.TXFS_IOC_CHANGES, buf)
        return bytes(buf)
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _fd_ioctl_into(fd, mount, _wire.TXFS_IOC_CHANGES, buf)
    finally:
        os.close(fd)
    return bytes(buf)


class _Answer(NamedTuple):
    """What a CHANGES answer carries."""

    total: int
    snap: int
    flags: int
    data: bytes


def _ask_changes(mount: str, op: int, snap: int, index: int, offset: int) -> _Answer:
    arg = _wire.IOC_CHANGES.pack(0, op, offset, index, 0, 0, snap, 0, 0, b"")
    try:
        raw = _changes_ioctl(mount, arg)
    except OSError as e:
        if e.errno == errno.ESTALE:
            raise OSError(
                errno.ESTALE, "a newer listing of this transaction replaced this one: call txfs.changes() again", mount
            ) from None
        raise
    _, _, _, _, total, n, snap, flags, _, data = _wire.IOC_CHANGES.unpack(raw)
    if n > _wire.TXFS_CHANGES_DATA:
        raise OSError(errno.EPROTO, f"the daemon answered {n} bytes of change data", mount)
    return _Answer(total, snap, flags, data[:n])


def _cut(mount: str) -> OSError:
    return OSError(errno.EPROTO, "the daemon's change listing is not made of whole records", mount)


@dataclasses.dataclass(frozen=True)
class Change:
    """One path of a transaction's change set (what :func:`changes` yields).

    Paths are relative to the mount's root, ``str`` decoded with
    :func:`os.fsdecode` (``os.fsencode(c.path)`` gives the bytes back, also
    for names that are not UTF-8). ``what`` names what happened —
    ``"created"``, ``"deleted"``, ``"modified"``, ``"renamed"``,
    ``"linked"``, ``"replaced"``, ``"mode"``, ``"owner"``, ``"xattr"``,
    ``"times"`` — and ``what_bits`` is the same as ``TXFS_CHANGE_*`` bits;
    :attr:`status` is the one word ``txfs diff`` shows first.
    """

    path: str
    what: FrozenSet[str]
    what_bits: int
    #: ``S_IFMT`` bits of what ``path`` names (named before, if deleted)
    kind: int
    #: ``st_mode``, uid, gid and size before (mode 0: nothing there) and after
    old_mode: int
    new_mode: int
    old_uid: int
    old_gid: int
    new_uid: int
    new_gid: int
    old_size: int
    new_size: int
    #: bytes the transaction wrote into the file (a new file: its size)
    bytes_written: int
    #: a created or deleted directory: what was created or deleted below it
    #: with it (listed too)
    files: int
    dirs: int
    #: where it was before a rename; "" otherwise
    from_: str
    #: a symlink's target before and after; "" when none
    old_target: str
    target: str
    #: extended attributes set or removed
    xattrs: Tuple[str, ...]
    #: its position in the listing, from 0
    index: int
    _listing: "ChangeListing" = dataclasses.field(repr=False, compare=False)

    @property
    def status(self) -> str:
        """What happened, in one word: the first of created, deleted,
        renamed, linked, modified, replaced that applies, else changed."""
        for bit, word in (
            (_wire.TXFS_CHANGE_CREATED, "created"),
            (_wire.TXFS_CHANGE_DELETED, "deleted"),
            (_wire.TXFS_CHANGE_RENAMED, "renamed"),
            (_wire.TXFS_CHANGE_LINKED, "linked"),
            (_wire.TXFS_CHANGE_MODIFIED, "modified"),
            (_wire.TXFS_CHANGE_REPLACED, "replaced"),
        ):
            if self.what_bits & bit:
                return word
        return "changed"

    def read_old(self, offset: int = 0, size: int = -1) -> bytes:
        """The committed content of the file (before; at :attr:`from_` for a
        rename): ``size`` bytes at ``offset`` (fewer at its end; -1: to its
        end). Raises :class:`OSError`: ``ENOENT`` no file on that side (a
        created file), ``EISDIR`` a directory, ``EINVAL`` another kind,
        ``EACCES`` not readable by the caller's credentials, ``ESTALE`` a
        newer listing of the transaction replaced the one this came from."""
        return self._listing._read(self.index, False, offset, size)

    def read_new(self, offset: int = 0, size: int = -1) -> bytes:
        """The content the transaction would commit (after), as
        :meth:`read_old` reads the committed one (``ENOENT``: a deleted file)."""
        return self._listing._read(self.index, True, offset, size)


class ChangeListing:
    """The change set of the calling thread's transaction, one
    :class:`Change` at a time (what :func:`changes` returns).

    Fetched from the daemon a page at a time as it is iterated. ``snap`` is
    the daemon's snapshot it reads, ``total`` the listing's length in bytes,
    ``lost`` whether the transaction had already lost a conflict when it was
    listed (its commit will fail). A newer listing of the same transaction
    replaces this one's snapshot: iterating on then raises ``ESTALE`` (call
    :func:`changes` again), and so do the changes' reads.
    """

    def __init__(self, mount: str) -> None:
        self.mount = mount
        first = _ask_changes(mount, _wire.TXFS_CHANGES_LIST, 0, 0, 0)
        self.snap = first.snap
        self.total = first.total
        self.lost = bool(first.flags & _wire.TXFS_CHANGES_LOST)
        self._page = first.data
        self._at = 0  # bytes of the page consumed
        self._pos = 0  # bytes of the listing consumed
        self._index = 0
        self._failed: Optional[OSError] = None
        if self.total and not self._page:
            raise _cut(mount)

    def __iter__(self) -> "ChangeListing":
        return self

    def _take(self, n: int) -> bytes:
        """The listing's next ``n`` bytes, from as many pages as they span."""
        parts = []
        while n:
            if self._at == len(self._page):
                if self._pos >= self.total:
                    raise _cut(self.mount)
                page = _ask_changes(self.mount, _wire.TXFS_CHANGES_LIST, self.snap, 0, self._pos)
                if not page.data or page.snap != self.snap or page.total != self.total:
                    raise _cut(self.mount)
                self._page, self._at = page.data, 0
            k = min(n, len(self._page) - self._at)
            parts.append(self._page[self._at : self._at + k])
            self._at += k
            self._pos += k
            n -= k
        return b"".join(parts)

    def _decode(self, rec: bytes) -> Change:
        f = _wire.CHANGE_RECORD.unpack_from(rec)
        strs = []
        at = _wire.CHANGE_RECORD.size
        for _ in range(5):
            if at + 4 > len(rec):
                raise _cut(self.mount)
            (n,) = _wire.CHANGE_STRLEN.unpack_from(rec, at)
            if at + 4 + n > len(rec):
                raise _cut(self.mount)
            strs.append(rec[at + 4 : at + 4 + n])
            at += 4 + n
        if at != len(rec):
            raise _cut(self.mount)
        path, from_, old_target, target, names = (os.fsdecode(s) for s in strs)
        bits = f[1]
        return Change(
            path=path,
            what=frozenset(word for bit, word in _wire.CHANGE_WORDS if bits & bit),
            what_bits=bits,
            kind=f[2],
            old_mode=f[3],
            new_mode=f[4],
            old_uid=f[5],
            old_gid=f[6],
            new_uid=f[7],
            new_gid=f[8],
            old_size=f[10],
            new_size=f[11],
            bytes_written=f[12],
            files=f[13],
            dirs=f[14],
            from_=from_,
            old_target=old_target,
            target=target,
            xattrs=tuple(x for x in names.split("\0") if x),
            index=self._index,
            _listing=self,
        )

    def __next__(self) -> Change:
        if self._failed is not None:
            raise OSError(self._failed.errno, self._failed.strerror, self.mount)
        if self._pos >= self.total:
            raise StopIteration
        try:
            start = self._pos
            head = self._take(4)
            (n,) = _wire.CHANGE_STRLEN.unpack(head)
            if n < _wire.TXFS_CHANGE_HEAD or n > self.total - start:
                raise _cut(self.mount)
            change = self._decode(head + self._take(n - 4))
        except OSError as e:
            self._failed = e
            raise
        self._index += 1
        return change

    def _read(self, index: int, new: bool, offset: int, size: int) -> bytes:
        if offset < 0:
            raise ValueError("offset must not be negative")
        op = _wire.TXFS_CHANGES_NEW if new else _wire.TXFS_CHANGES_OLD
        out = bytearray()
        while size < 0 or len(out) < size:
            a = _ask_changes(self.mount, op, self.snap, index, offset + len(out))
            out += a.data if size < 0 else a.data[: size - len(out)]
            if not a.data or offset + len(out) >= a.total:
                break
        return bytes(out)


def changes(mount: Optional[PathArg] = None) -> ChangeListing:
    """The change set of the calling thread's transaction: what it would
    commit, one :class:`Change` a path, in path order.

        with txfs.transaction():
            ...
            for c in txfs.changes():
                print(c.status, c.path)          # "modified etc/app.conf"

    A file created and deleted inside the transaction is not there; a
    rename is one change at the new path (:attr:`Change.from_`: the old
    one); below a created or deleted directory every path is listed too.
    Looking records no read: it cannot make the transaction conflict.
    Each call takes a new snapshot on the daemon, which replaces the last
    one's (see :class:`ChangeListing`). Iterate in the thread of the
    transaction (or in a process of a ``txfs run``): the daemon answers
    for the caller's own.

    ``mount``: any path inside the txfs mount; default: the thread's open
    transaction's, else ``$TXFS_MOUNT`` or the only txfs mount. Raises
    :class:`OSError`: ``EINVAL`` not in a transaction, ``ENOTTY`` a daemon
    older than the change set (or not txfs).
    """
    root = find_mount(mount) if mount is not None else _current_mount()
    return ChangeListing(root)


def _abort_quietly() -> None:
    if _valid():
        try:
            abort()
        except OSError:
            pass


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EDEADLK


def _io_error(exc: BaseException) -> bool:
    """An OSError, or an error of the sqlite3 module: what reading a file
    inside a transaction that lost a conflict raises (SQLite turns the
    read's EDEADLK into "disk I/O error"); not the program's own
    exceptions, which are its business."""
    sqlite = sys.modules.get("sqlite3")
    return isinstance(exc, OSError) or (sqlite is not None and isinstance(exc, sqlite.Error))


def _doomed() -> bool:
    """Whether the calling thread's transaction has lost a conflict (it
    can only abort)."""
    if not _valid():
        return False
    assert _local.mount is not None
    try:
        raw = _ioctl(_local.mount, _wire.TXFS_IOC_STATE, bytes(_wire.IOC_STATE.size))
    except OSError as e:
        return _is_conflict(e)
    return bool(_wire.IOC_STATE.unpack(raw)[2] & _wire.TXFS_STATE_DOOMED)


class Transaction(contextlib.ContextDecorator):
    """What :func:`transaction` returns: a context manager (and decorator).

    On a normal exit it commits, on an exception it aborts and re-raises; an
    ``OSError`` with errno ``EDEADLK`` from inside the block is re-raised as
    :class:`Conflict` (chained), and so is a commit that loses a conflict,
    and any ``OSError`` or ``sqlite3.Error`` raised while the transaction
    had lost a conflict (SQLite says "disk I/O error" for the EDEADLK of
    its read), so that :func:`retry` and :func:`transactional` run it again.
    """

    def __init__(self, durable: bool = True, mount: Optional[PathArg] = None) -> None:
        self.durable = durable
        self.mount: Optional[str] = os.fspath(mount) if mount is not None else None
        self._active = False
        self._depth = 0

    def _recreate_cm(self) -> "Transaction":
        # as a decorator, each call is its own transaction
        return Transaction(self.durable, self.mount)

    def __enter__(self) -> "Transaction":
        begin(self.mount)
        self.mount = _local.mount
        self._active = True
        self._depth = _local.depth
        return self

    def abort(self) -> None:
        """Abort now; leaving the block then does nothing more."""
        if self._active:
            self._active = False
            abort()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._active:
            return
        self._active = False
        if exc is None:
            if not _valid() or _local.depth < self._depth:
                raise OSError(
                    errno.EINVAL,
                    "the transaction ended inside the with-block (aborted or committed there)",
                )
            try:
                commit(self.durable)
            except OSError as e:
                _abort_quietly()
                if _is_conflict(e) and not isinstance(e, Conflict):
                    raise Conflict(errno.EDEADLK, os.strerror(errno.EDEADLK)) from e
                raise
            return
        lost = _is_conflict(exc) or (_io_error(exc) and _doomed())
        _abort_quietly()
        if lost and not isinstance(exc, Conflict):
            filename = getattr(exc, "filename", None)
            raise Conflict(errno.EDEADLK, os.strerror(errno.EDEADLK), filename) from exc


def transaction(durable: bool = True, mount: Optional[PathArg] = None) -> Transaction:
    """A transaction of the calling thread for the duration of a ``with`` block.

    Commits on a normal exit (``durable=False``: an ordered commit, see
    :func:`commit`), aborts on an exception and re-raises it. A lost conflict
    raises :class:`Conflict`. ``mount``: any path inside the txfs mount;
    default ``$TXFS_MOUNT`` or the only txfs mount.
    """
    return Transaction(durable, mount)


def retry(
    fn: Callable[[], T],
    attempts: int = 5,
    backoff: float = 0.01,
    max_backoff: float = 1.0,
) -> T:
    """Call ``fn()``; while it raises :class:`Conflict`, call it again.

    At most ``attempts`` calls; before call ``n + 1`` it sleeps about
    ``backoff * 2**(n - 1)`` seconds (randomised ±50%, at most
    ``max_backoff``). The last :class:`Conflict` is re-raised. ``fn`` should
    run its own transaction (``with transaction(): ...``). Inside an open
    transaction of this thread there is nothing to retry (the conflict dooms
    the outer transaction): ``fn`` is called once and its Conflict propagates.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    if in_transaction():
        return fn()
    for n in range(1, attempts + 1):
        try:
            return fn()
        except OSError as e:
            if not _is_conflict(e) or n == attempts:
                raise
        delay = min(max_backoff, backoff * (2 ** (n - 1)) * random.uniform(0.5, 1.5))
        if delay > 0:
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


@overload
def transactional(func: F) -> F: ...


@overload
def transactional(
    *,
    durable: bool = True,
    mount: Optional[PathArg] = None,
    attempts: int = 5,
    backoff: float = 0.01,
) -> Callable[[F], F]: ...


def transactional(
    func: Optional[F] = None,
    *,
    durable: bool = True,
    mount: Optional[PathArg] = None,
    attempts: int = 5,
    backoff: float = 0.01,
) -> Any:
    """Decorator: run the function in a transaction, re-running it on conflict.

        @txfs.transactional                   # or @txfs.transactional(attempts=10)
        def move(src, dst): ...

    Each call is one transaction (see :func:`transaction` and :func:`retry`).
    """

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            def once() -> Any:
                with transaction(durable=durable, mount=mount):
                    return f(*args, **kwargs)

            return retry(once, attempts=attempts, backoff=backoff)

        return cast(F, wrapper)

    if func is not None:
        return decorate(func)
    return decorate


def _on_txfs(directory: str) -> bool:
    """Whether ``directory`` is inside a txfs mount."""
    try:
        find_mount(directory)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def atomic_write(
    path: PathArg,
    mode: str = "w",
    *,
    durable: bool = True,
    encoding: Optional[str] = None,
    newline: Optional[str] = None,
) -> Iterator[IO[Any]]:
    """Replace the file ``path`` with what the ``with`` block writes, all at once.

        with txfs.atomic_write("/mnt/data/config.json") as f:
            json.dump(config, f)

    On a normal exit the whole new content replaces the file atomically
    (readers see the old file or the new one, never a part) and, with
    ``durable=True``, durably; on an exception nothing changes. ``mode`` is
    ``"w"``/``"wb"`` (create or replace) or ``"x"``/``"xb"`` (the file must
    not exist: ``FileExistsError``). A new file gets mode 0666 less the
    umask; a replaced file keeps its permissions.

    On a txfs mount the block is one transaction of the calling thread that
    writes the file in place (so whatever else the thread does on the mount
    inside the block is part of it too; a lost conflict raises
    :class:`Conflict`). Elsewhere it writes a temporary file in the same
    directory, fsyncs it, renames it over ``path`` and fsyncs the directory.
    """
    if mode not in ("w", "wt", "wb", "x", "xt", "xb"):
        raise ValueError(f"atomic_write: mode {mode!r}: only w, wb, x, xb")
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    exclusive = mode.startswith("x")
    if _on_txfs(directory):
        with transaction(durable=durable, mount=directory):
            with open(target, mode, encoding=encoding, newline=newline) as f:
                yield f
        return
    try:
        perms = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        perms = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, perms)
        with open(fd, mode.replace("x", "w"), encoding=encoding, newline=newline) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, target)  # fails with FileExistsError, never replaces
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
