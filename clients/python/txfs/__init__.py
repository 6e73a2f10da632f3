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
import itertools
import os
import random
import stat
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import IO, Any, Callable, Iterator, Optional, Type, TypedDict, TypeVar, cast, overload

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
    "atomic_write",
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


def _fd_ioctl(fd: int, mount: str, request: int, arg: bytes) -> bytes:
    try:
        return fcntl.ioctl(fd, request, arg)
    except OSError as e:
        code = errno.ENOTTY if e.errno == errno.ENOSYS else (e.errno or errno.EIO)
        if code == errno.EDEADLK:
            raise Conflict(code, os.strerror(code), mount) from None
        raise OSError(code, os.strerror(code), mount) from None


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
