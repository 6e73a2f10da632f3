"""The ioctl wire protocol of txfs, byte for byte as in ``clients/c/txfs.h``.

The numbers are computed the way Linux's ``_IOW``/``_IOR`` macros compute them
(``include/uapi/asm-generic/ioctl.h``, with the per-architecture variants of
powerpc, mips, sparc and alpha), and the structs are packed with :mod:`struct`
in native byte order with the C layout (every field is naturally aligned, so
there is no padding).

The daemon's definition is ``crates/txfs/src/wire.rs``; the test
``crates/txfs/tests/wire_headers.rs`` fails if a number, struct size or field
offset here differs from it.
"""

from __future__ import annotations

import platform
import struct
from typing import NamedTuple


class IocLayout(NamedTuple):
    """How an architecture encodes ioctl numbers."""

    nrbits: int
    typebits: int
    sizebits: int
    dirbits: int
    none: int
    write: int
    read: int


#: asm-generic (x86, arm, arm64, riscv, s390, loongarch, ...)
GENERIC = IocLayout(nrbits=8, typebits=8, sizebits=14, dirbits=2, none=0, write=1, read=2)
#: powerpc, mips, sparc, alpha: 13 size bits, 3 direction bits
ALTERNATE = IocLayout(nrbits=8, typebits=8, sizebits=13, dirbits=3, none=1, write=4, read=2)


def layout_for(machine: str) -> IocLayout:
    """The ioctl encoding of the architecture that ``platform.machine()`` names."""
    m = machine.lower()
    if m.startswith(("ppc", "powerpc", "mips", "sparc", "alpha")):
        return ALTERNATE
    return GENERIC


LAYOUT = layout_for(platform.machine())


def ioc(direction: int, typ: int, nr: int, size: int, layout: IocLayout = LAYOUT) -> int:
    """``_IOC(dir, type, nr, size)``."""
    if not 0 <= size < (1 << layout.sizebits):
        raise ValueError(f"ioctl argument size {size} does not fit in {layout.sizebits} bits")
    nrshift = 0
    typeshift = nrshift + layout.nrbits
    sizeshift = typeshift + layout.typebits
    dirshift = sizeshift + layout.sizebits
    return (direction << dirshift) | (typ << typeshift) | (nr << nrshift) | (size << sizeshift)


def iow(typ: int, nr: int, size: int, layout: IocLayout = LAYOUT) -> int:
    """``_IOW(type, nr, T)`` with ``sizeof(T) == size``."""
    return ioc(layout.write, typ, nr, size, layout)


def ior(typ: int, nr: int, size: int, layout: IocLayout = LAYOUT) -> int:
    """``_IOR(type, nr, T)`` with ``sizeof(T) == size``."""
    return ioc(layout.read, typ, nr, size, layout)


def iowr(typ: int, nr: int, size: int, layout: IocLayout = LAYOUT) -> int:
    """``_IOWR(type, nr, T)`` with ``sizeof(T) == size``."""
    return ioc(layout.read | layout.write, typ, nr, size, layout)


TXFS_IOC_MAGIC = 0xE7
TXFS_COMMIT_ORDERED = 0x1
TXFS_RUN_BEGIN = 1
TXFS_RUN_COMMIT = 2
TXFS_RUN_ABORT = 3

#: struct txfs_ioc_flags { uint32_t flags; uint32_t reserved; }
IOC_FLAGS = struct.Struct("=II")
#: struct txfs_ioc_run { uint32_t pid, op, flags, reserved; }
IOC_RUN = struct.Struct("=IIII")
#: struct txfs_ioc_status { uint64_t commits, aborts, conflicts, live_txs,
#:                          journal_bytes, journal_syncs, checkpoints, last_seq; }
IOC_STATUS = struct.Struct("=8Q")
STATUS_FIELDS = (
    "commits",
    "aborts",
    "conflicts",
    "live_txs",
    "journal_bytes",
    "journal_syncs",
    "checkpoints",
    "last_seq",
)
#: struct txfs_ioc_state { uint64_t tx; uint32_t depth; uint32_t flags; }
IOC_STATE = struct.Struct("=QII")
#: txfs_ioc_state.flags: the transaction lost a conflict; it can only abort
TXFS_STATE_DOOMED = 0x1
#: struct txfs_ioc_changes { uint32_t pid, op; uint64_t offset, index, total;
#:                           uint32_t len, snap, flags, reserved;
#:                           unsigned char data[TXFS_CHANGES_DATA]; }
IOC_CHANGES = struct.Struct("=IIQQQIIII16320s")

TXFS_CHANGES_LIST = 1
TXFS_CHANGES_OLD = 2
TXFS_CHANGES_NEW = 3
#: IOC_CHANGES flags, out: the transaction already lost a conflict
TXFS_CHANGES_LOST = 0x1
#: bytes of IOC_CHANGES's data
TXFS_CHANGES_DATA = 16320

#: The head of a record of a CHANGES listing (little-endian): its length,
#: what, kind, old_mode, new_mode, old_uid, old_gid, new_uid, new_gid, 0;
#: old_size, new_size, bytes, files, dirs. Then five strings, each a u32
#: length and its bytes: path, from, old_target, target, and the xattr
#: names each followed by a NUL.
CHANGE_RECORD = struct.Struct("<10I5Q")
TXFS_CHANGE_HEAD = 80
#: the length of one string of a record
CHANGE_STRLEN = struct.Struct("<I")

# what happened to a path: a record's `what` bits
TXFS_CHANGE_CREATED = 0x1
TXFS_CHANGE_DELETED = 0x2
TXFS_CHANGE_MODIFIED = 0x4
TXFS_CHANGE_RENAMED = 0x8
TXFS_CHANGE_LINKED = 0x10
TXFS_CHANGE_MODE = 0x20
TXFS_CHANGE_OWNER = 0x40
TXFS_CHANGE_XATTR = 0x80
TXFS_CHANGE_TIMES = 0x100
TXFS_CHANGE_REPLACED = 0x200

#: (bit, word) of every `what` bit, in the order `txfs diff --json` lists them
CHANGE_WORDS = (
    (TXFS_CHANGE_CREATED, "created"),
    (TXFS_CHANGE_DELETED, "deleted"),
    (TXFS_CHANGE_MODIFIED, "modified"),
    (TXFS_CHANGE_RENAMED, "renamed"),
    (TXFS_CHANGE_LINKED, "linked"),
    (TXFS_CHANGE_REPLACED, "replaced"),
    (TXFS_CHANGE_MODE, "mode"),
    (TXFS_CHANGE_OWNER, "owner"),
    (TXFS_CHANGE_XATTR, "xattr"),
    (TXFS_CHANGE_TIMES, "times"),
)

TXFS_IOC_BEGIN = iow(TXFS_IOC_MAGIC, 1, IOC_FLAGS.size)
TXFS_IOC_COMMIT = iow(TXFS_IOC_MAGIC, 2, IOC_FLAGS.size)
TXFS_IOC_ABORT = iow(TXFS_IOC_MAGIC, 3, IOC_FLAGS.size)
TXFS_IOC_SYNC = iow(TXFS_IOC_MAGIC, 4, IOC_FLAGS.size)
TXFS_IOC_RUN = iow(TXFS_IOC_MAGIC, 5, IOC_RUN.size)
TXFS_IOC_STATUS = ior(TXFS_IOC_MAGIC, 6, IOC_STATUS.size)
TXFS_IOC_STATE = ior(TXFS_IOC_MAGIC, 7, IOC_STATE.size)
# 13 size bits (powerpc, mips, sparc, alpha) cannot carry CHANGES's size:
# there it gets the asm-generic number, which no kernel there passes on.
_CHANGES_LAYOUT = LAYOUT if IOC_CHANGES.size < 1 << LAYOUT.sizebits else GENERIC
TXFS_IOC_CHANGES = iowr(TXFS_IOC_MAGIC, 14, IOC_CHANGES.size, _CHANGES_LAYOUT)

#: name -> number, as the C header spells them
IOCTLS = {
    "TXFS_IOC_BEGIN": TXFS_IOC_BEGIN,
    "TXFS_IOC_COMMIT": TXFS_IOC_COMMIT,
    "TXFS_IOC_ABORT": TXFS_IOC_ABORT,
    "TXFS_IOC_SYNC": TXFS_IOC_SYNC,
    "TXFS_IOC_RUN": TXFS_IOC_RUN,
    "TXFS_IOC_STATUS": TXFS_IOC_STATUS,
    "TXFS_IOC_STATE": TXFS_IOC_STATE,
    "TXFS_IOC_CHANGES": TXFS_IOC_CHANGES,
}
