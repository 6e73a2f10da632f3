"""Finding the txfs mount, exactly as the C library (``clients/c/txfs.c``) does.

* No path: ``$TXFS_MOUNT`` if set and non-empty; else the only txfs file
  system in ``/proc/self/mountinfo`` (bind mounts of one file system count
  once); else, of several, the one holding the current directory (as ``txfs
  run`` chooses). None: ``ENODEV``; several and the current directory in
  none of them: ``ENOTUNIQ``, the message listing them.
* A path (any path inside a mount): the txfs mount on the same device, the
  longest mount point that is a prefix of the path's real path if there are
  several. A path on no txfs mount: ``ENOTTY``. If the mountinfo file cannot
  be read, the path itself (or, if not a directory, its parent) is used.
* A txfs mount is one of type ``fuse.txfs``, or of plain type ``fuse`` whose
  source is ``txfs`` or ``txfs:BACKING`` (a daemon mounting as root with
  mount(2) may lose the subtype).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import List, Mapping, NamedTuple, Optional, Union

PathArg = Union[str, "os.PathLike[str]"]

#: The mountinfo file read by default (read at each call): tests may point this
#: elsewhere, or pass ``mountinfo=`` to the functions below.
MOUNTINFO = "/proc/self/mountinfo"
FSTYPE = "fuse.txfs"
#: A root ``txfs run``'s transaction view, mounted over the shared mount in
#: the run's own mount namespace (its processes reach the mount through it).
VIEW_FSTYPE = "fuse.txfs-view"

_OCTAL = re.compile(r"\\([0-3][0-7][0-7])")


class MountEntry(NamedTuple):
    """One txfs line of mountinfo."""

    major: int
    minor: int
    point: str
    source: str


def unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` is a space)."""
    raw = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)
    # The kernel escapes bytes; re-decode them as the file system's bytes.
    return os.fsdecode(raw.encode("latin-1", "surrogateescape"))


def is_txfs(fstype: str, source: Optional[str]) -> bool:
    """Whether a mountinfo line's type and source name a txfs mount."""
    if fstype in (FSTYPE, VIEW_FSTYPE):
        return True
    if fstype != "fuse" or source is None:
        return False
    return source == "txfs" or source.startswith("txfs:")


def parse_mountinfo(text: str) -> List[MountEntry]:
    """The txfs mounts in the text of a mountinfo file, in order."""
    out: List[MountEntry] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or "-" not in fields[5:]:
            continue
        sep = fields.index("-", 5)
        if sep + 1 >= len(fields):
            continue
        fstype = fields[sep + 1]
        source = unescape(fields[sep + 2]) if sep + 2 < len(fields) else None
        if not is_txfs(fstype, source):
            continue
        try:
            major_s, minor_s = fields[2].split(":")
            major, minor = int(major_s), int(minor_s)
        except ValueError:
            continue
        out.append(MountEntry(major, minor, unescape(fields[4]), source or ""))
    return out


def read_mountinfo(mountinfo: Optional[PathArg] = None) -> List[MountEntry]:
    """The txfs mounts listed in ``mountinfo`` (default :data:`MOUNTINFO`)."""
    path = MOUNTINFO if mountinfo is None else mountinfo
    with open(path, encoding="latin-1", newline="\n") as f:
        text = f.read()
    # latin-1 maps bytes 1:1; unescape() turns them back into fs encoding
    return parse_mountinfo(text)


def _prefix_len(prefix: str, path: str) -> int:
    if prefix == "/":
        return 1
    if path == prefix or path.startswith(prefix + "/"):
        return len(prefix)
    return 0


def _error(code: int, message: str, filename: Optional[str] = None) -> OSError:
    if filename is None:
        return OSError(code, message)
    return OSError(code, message, filename)


def find_mount(
    path: Optional[PathArg] = None,
    *,
    mountinfo: Optional[PathArg] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> str:
    """The root of the txfs mount for ``path`` (see the module's doc).

    ``path=None`` uses ``$TXFS_MOUNT`` (from ``environ``, default
    :data:`os.environ`) or the only txfs mount. Raises :class:`OSError` with
    ``ENODEV``, ``ENOTUNIQ``, ``ENOTTY`` or the error of ``stat(path)``.
    """
    env = os.environ if environ is None else environ
    if path is None:
        value = env.get("TXFS_MOUNT")
        if value:
            path = value
    if path is not None:
        return _mount_of_path(os.fspath(path), mountinfo)
    entries = read_mountinfo(mountinfo)
    if not entries:
        raise _error(
            errno.ENODEV, "no txfs file system is mounted (mount one, or set TXFS_MOUNT)"
        )
    first = entries[0]
    devices = {(e.major, e.minor) for e in entries}
    if len(devices) > 1:
        by_cwd = _mount_of_cwd(entries)
        if by_cwd is not None:
            return by_cwd
        points = ", ".join(dict.fromkeys(e.point for e in entries))
        raise _error(
            errno.ENOTUNIQ,
            f"several txfs mounts ({points}) and the current directory is in none of them:"
            " set TXFS_MOUNT or pass mount=",
        )
    return first.point


def _mount_of_cwd(entries: List[MountEntry]) -> Optional[str]:
    """The deepest of ``entries`` holding the current directory, if any."""
    try:
        dev = os.stat(".").st_dev
        cwd = os.path.realpath(".")
    except OSError:
        return None
    best: Optional[str] = None
    best_len = 0
    for e in entries:
        if os.makedev(e.major, e.minor) != dev:
            continue
        n = _prefix_len(e.point, cwd)
        if n > best_len:
            best, best_len = e.point, n
    return best


def _mount_of_path(path: str, mountinfo: Optional[PathArg]) -> str:
    st = os.stat(path)
    real = os.path.realpath(path)
    try:
        entries = read_mountinfo(mountinfo)
    except OSError:
        # No mountinfo (no /proc?): trust the caller's path.
        return real if stat.S_ISDIR(st.st_mode) else os.path.dirname(real)
    best: Optional[str] = None
    best_len = -1
    for e in entries:
        if os.makedev(e.major, e.minor) != st.st_dev:
            continue
        n = _prefix_len(e.point, real)
        if best is None or n > best_len:
            best, best_len = e.point, n
    if best is None:
        raise _error(errno.ENOTTY, "not inside a txfs mount", path)
    return best
