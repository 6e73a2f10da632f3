"""Load the txfs SQLite VFS into Python's sqlite3 module.

    import txfs_sqlite
    txfs_sqlite.load()                       # once per process
    conn = sqlite3.connect("file:/mnt/tx/app.db?vfs=txfs", uri=True)

load() uses Connection.load_extension when this Python's sqlite3 module has
it; builds without it (pyenv's default, some distributions) get the same
effect through ctypes: the extension is loaded into the libsqlite3 that the
sqlite3 module is linked against, where the VFS registration is global.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sqlite3
from typing import Optional

#: The extension next to this file (a checkout: clients/sqlite/txfs_vfs.so).
#: Installed from the txfs-client wheel there is none; then the dynamic
#: loader's search path finds "txfs_vfs" (``make -C clients/sqlite install``
#: puts it in PREFIX/lib), or set $TXFS_SQLITE_EXT to its path.
DEFAULT = os.path.join(os.path.dirname(os.path.realpath(__file__)), "txfs_vfs")


def _default() -> str:
    return DEFAULT if os.path.exists(DEFAULT + ".so") else "txfs_vfs"
_loaded = False


def _libsqlite3() -> ctypes.CDLL:
    import _sqlite3  # the module's own library comes first in its link map

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libsqlite3" in line and "/" in line}
        for p in paths:
            return ctypes.CDLL(p)
    except OSError:
        pass
    name = ctypes.util.find_library("sqlite3") or "libsqlite3.so.0"
    del _sqlite3
    return ctypes.CDLL(name)


def load(path: Optional[str] = None) -> None:
    """Register the "txfs" VFS in this process (idempotent)."""
    global _loaded
    if _loaded:
        return
    path = path or os.environ.get("TXFS_SQLITE_EXT") or _default()
    boot = sqlite3.connect(":memory:")
    try:
        if hasattr(boot, "enable_load_extension"):
            boot.enable_load_extension(True)
            boot.load_extension(path)
            _loaded = True
            return
    finally:
        boot.close()
    lib = _libsqlite3()
    db = ctypes.c_void_p()
    err = ctypes.c_char_p()
    lib.sqlite3_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.sqlite3_enable_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.sqlite3_load_extension.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.POINTER(ctypes.c_char_p)]
    lib.sqlite3_close.argtypes = [ctypes.c_void_p]
    if lib.sqlite3_open(b":memory:", ctypes.byref(db)) != 0:
        raise sqlite3.OperationalError("txfs_sqlite: cannot open a bootstrap connection")
    try:
        lib.sqlite3_enable_load_extension(db, 1)
        if lib.sqlite3_load_extension(db, os.fsencode(path), None, ctypes.byref(err)) != 0:
            msg = err.value.decode(errors="replace") if err.value else "unknown error"
            raise sqlite3.OperationalError(f"txfs_sqlite: cannot load {path}: {msg}")
    finally:
        lib.sqlite3_close(db)
    _loaded = True


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's SQLITE_BUSY: with this VFS, a lost conflict
    (roll back / abort, and run the whole transaction again)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF == 5  # SQLITE_BUSY, any extended code
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
