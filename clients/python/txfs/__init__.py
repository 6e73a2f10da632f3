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
import errno
import fcntl
import functools
import os
import random
import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional, Type, TypedDict, TypeVar, cast, overload

from . import _wire, mounts
from ._wire import TXFS_COMMIT_ORDERED
from .mounts import MountEntry, PathArg, find_mount, parse_mountinfo, read_mountinfo

__version__ = "0.1.0"

__all__ = [
    "Conflict",
    "MountEntry",
    "Status",
    "TXFS_COMMIT_ORDERED",
    "TXFS_ECONFLICT",
    "Transaction",
    "TxState",
    "abort",
    "begin",
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


# ---- per-thread bookkeeping --------------------------------------------------


class _Local(threading.local):
    def __init__(self) -> None:
        self.mount: Optional[str] = None
        self.depth = 0  # begins through this module, not yet ended
        self.tid = 0  # who wrote this record (a forked child inherits it)
        self.fd = -1  # the mount root, open for the outermost transaction


_local = _Local()


def _valid() -> bool:
    return _local.depth > 0 and _local.tid == threading.get_native_id()


def _clear() -> None:
    # A forked child's copy names its parent's descriptor: not ours to close.
    if _local.fd >= 0 and _local.tid == threading.get_native_id():
        os.close(_local.fd)
    _local.fd = -1
    _local.mount = None
    _local.depth = 0
    _local.tid = 0


# ---- mount resolution, remembered per thread ---------------------------------
#
# Resolving a mount reads /proc/self/mountinfo and stats the path (a GETATTR
# to the daemon each, when the kernel has no fresh attributes). Each thread
# remembers its last answer and re-checks it by the device number the kernel
# has cached (statx with AT_STATX_DONT_SYNC: no request), as the C library
# does: a transaction then costs OPENDIR, begin, commit and RELEASEDIR.

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
        self.key: Optional[tuple[str, str]] = None
        self.mount = ""
        self.dev = 0


_last = _Last()


def _resolve(mount: Optional[PathArg]) -> str:
    """:func:`find_mount`, answered from the thread's last resolution while
    the path is still on the same device."""
    path = os.fspath(mount) if mount is not None else os.environ.get("TXFS_MOUNT") or None
    key = (os.fsdecode(path) if path is not None else "", str(mounts.MOUNTINFO))
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


def _fd_ioctl(fd: int, mount: str, request: int, arg: bytes) -> bytes:
    try:
        return fcntl.ioctl(fd, request, arg)
    except OSError as e:
        code = errno.ENOTTY if e.errno == errno.ENOSYS else (e.errno or errno.EIO)
        if code == errno.EDEADLK:
            raise Conflict(code, os.strerror(code), mount) from None
        raise OSError(code, os.strerror(code), mount) from None


def _ioctl(mount: str, request: int, arg: bytes, keep: bool = False) -> bytes:
    """One ioctl on ``mount``: through the thread's transaction descriptor
    when it is on that mount, else open, ioctl, close. ``keep`` (the outermost
    begin) keeps the descriptor for the transaction, which :func:`_clear`
    closes: fewer requests per transaction, and none outlives it."""
    if _valid() and _local.fd >= 0 and mount == _local.mount:
        return _fd_ioctl(_local.fd, mount, request, arg)
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        out = _fd_ioctl(fd, mount, request, arg)
    except BaseException:
        os.close(fd)
        raise
    if keep:
        _local.fd = fd
    else:
        os.close(fd)
    return out


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
    _ioctl(root, _wire.TXFS_IOC_BEGIN, _flags(flags), keep=True)
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
    tx, depth, _ = _wire.IOC_STATE.unpack(raw)
    return {"tx": tx, "depth": depth}


def _abort_quietly() -> None:
    if _valid():
        try:
            abort()
        except OSError:
            pass


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EDEADLK


class Transaction(contextlib.ContextDecorator):
    """What :func:`transaction` returns: a context manager (and decorator).

    On a normal exit it commits, on an exception it aborts and re-raises; an
    ``OSError`` with errno ``EDEADLK`` from inside the block is re-raised as
    :class:`Conflict` (chained), and so is a commit that loses a conflict.
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
        _abort_quietly()
        if _is_conflict(exc) and not isinstance(exc, Conflict):
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
