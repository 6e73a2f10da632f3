#!/usr/bin/env python3
"""Bad input against a txfs mount: every attempt must give a clear errno (or
the documented success), the daemon must stay alive, and no data may be lost.

Groups (the daemon is checked after each, a sentinel file after each):
  escapes    symlinks planted in BACKING pointing out, `..`, .txfs hidden,
             rename/link out of and into the mount (EXDEV), a checkpoint
             that must not follow a symlink out of BACKING
  ioctl      unknown numbers, wrong sizes, unknown flags, commit/abort with
             no transaction, RUN with bad pids and ops, ioctls on files and
             O_PATH handles
  users      a process of another user (uid 65534) tries to commit, abort or
             take over a transaction it does not own
  names      every byte 1..255 but '/' in names, 255-byte names (256 →
             ENAMETOOLONG), long symlink targets
  paths      4096-byte paths (PATH_MAX → ENAMETOOLONG), deep trees, a deep
             tree made and aborted in one transaction
  many       a directory with very many entries (quick 20k, long 1M):
             readdir lists each exactly once; a transaction's 2,000 creates,
             aborted, leave no trace
At the end the mount is unmounted and BACKING compared with what was made.

Usage: python3 reliability/badinput.py [--quick|--long] [--seed N] [--json OUT]
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import stat
import struct
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Optional, Set

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolation_mount import Mount, command, finish, parse_args, row, txfs  # noqa: E402
from txfs import _wire  # noqa: E402

E = errno


class Groups:
    def __init__(self, m: Mount, mode: str, rng: random.Random) -> None:
        self.m = m
        self.mode = mode
        self.rng = rng
        self.tried = 0
        self.violations: List[str] = []
        self.lost = 0
        self.group = ""
        self.expect_backing: Dict[str, bytes] = {}  # relative path -> contents, checked after unmount

    # ---- bookkeeping ---------------------------------------------------------

    def bad(self, what: str) -> None:
        if len(what) > 400:
            what = what[:200] + " ... " + what[-150:]
        self.violations.append(f"[{self.group}] {what}")
        print(f"VIOLATION [{self.group}] {what}", flush=True)

    def attempt(self, what: str, fn: Callable[[], object], ok: bool = False, errs: Iterable[int] = ()) -> Optional[object]:
        """Run `fn`; it must succeed if `ok`, else fail with one of `errs`."""
        self.tried += 1
        errs = set(errs)
        try:
            r = fn()
        except OSError as e:
            if ok:
                self.bad(f"{what}: failed with {E.errorcode.get(e.errno or 0, e.errno)} ({e})")
            elif errs and e.errno not in errs:
                self.bad(f"{what}: {E.errorcode.get(e.errno or 0, e.errno)}, expected one of {sorted(E.errorcode.get(x, x) for x in errs)}")
            elif e.errno == E.EIO:
                self.bad(f"{what}: EIO is not a clear errno")
            return None
        if not ok:
            self.bad(f"{what}: succeeded, expected {sorted(E.errorcode.get(x, x) for x in errs)}")
        return r

    def expect(self, cond: bool, what: str) -> None:
        self.tried += 1
        if not cond:
            self.bad(what)

    def p(self, *parts: str) -> str:
        return os.path.join(self.m.mnt, *parts)

    def sentinel_ok(self) -> None:
        with open(self.p("sentinel"), "rb") as f:
            if f.read() != SENTINEL:
                self.bad("the sentinel file changed")
                self.lost += 1
        if not self.m.alive():
            self.bad(f"the daemon died:\n{self.m.log_tail()}")
            raise SystemExit(self.finish_early())

    def finish_early(self) -> int:
        return 1

    # ---- groups ----------------------------------------------------------------

    def escapes(self, outside: str) -> None:
        self.group = "escapes"
        # symlinks planted in BACKING before the mount (see main) point out
        self.attempt("lstat of a planted symlink", lambda: os.lstat(self.p("esc", "out")), ok=True)
        self.expect(os.readlink(self.p("esc", "out")) == outside, "readlink of a planted symlink")
        # replace the symlink by a directory inside a transaction; the checkpoint
        # must create a directory, not write through the old symlink
        def replace() -> None:
            with txfs.transaction(mount=self.m.mnt):
                os.unlink(self.p("esc", "out"))
                os.mkdir(self.p("esc", "out"))
                with open(self.p("esc", "out", "f"), "wb") as f:
                    f.write(b"inside")
        self.attempt("replace a planted symlink by a directory in a transaction", replace, ok=True)
        self.expect_backing["esc/out/f"] = b"inside"
        self.attempt("lookup of .txfs", lambda: os.stat(self.p(".txfs")), errs=[E.ENOENT, E.EACCES, E.EPERM])
        self.attempt("create .txfs", lambda: os.mkdir(self.p(".txfs")), errs=[E.EEXIST, E.EACCES, E.EPERM, E.EINVAL])
        self.attempt("open .txfs/journal", lambda: open(self.p(".txfs", "journal"), "rb"), errs=[E.ENOENT, E.EACCES, E.EPERM])
        self.expect(".txfs" not in os.listdir(self.m.mnt), ".txfs is listed in the mount root")
        self.expect(os.stat(self.p("..")).st_ino == os.stat(self.m.base).st_ino, "MNT/.. is the mount's parent")
        self.expect(os.stat(self.p("esc", "..")).st_ino == os.stat(self.m.mnt).st_ino, "MNT/esc/.. is MNT")
        with open(self.p("esc", "mine"), "wb") as f:
            f.write(b"mine")
        self.expect_backing["esc/mine"] = b"mine"
        outfile = os.path.join(outside, "victim")
        self.attempt("rename out of the mount", lambda: os.rename(self.p("esc", "mine"), outfile), errs=[E.EXDEV])
        self.attempt("link out of the mount", lambda: os.link(self.p("esc", "mine"), outfile), errs=[E.EXDEV])
        with open(outfile, "wb") as f:
            f.write(b"victim")
        self.attempt("rename into the mount", lambda: os.rename(outfile, self.p("esc", "in")), errs=[E.EXDEV])
        self.attempt("link into the mount", lambda: os.link(outfile, self.p("esc", "in")), errs=[E.EXDEV])
        def tx_rename_out() -> None:
            with txfs.transaction(mount=self.m.mnt):
                os.rename(self.p("esc", "mine"), outfile + "2")
        self.attempt("rename out of the mount in a transaction", tx_rename_out, errs=[E.EXDEV])
        self.attempt("rename a directory into its own child", lambda: os.rename(self.p("esc"), self.p("esc", "out", "x")), errs=[E.EINVAL])
        self.attempt("rmdir of a non-empty directory", lambda: os.rmdir(self.p("esc")), errs=[E.ENOTEMPTY, E.EEXIST])
        self.attempt("mknod of a fifo", lambda: os.mkfifo(self.p("esc", "fifo")), ok=True)
        self.expect(stat.S_ISFIFO(os.lstat(self.p("esc", "fifo")).st_mode), "a fifo made on the mount is not a fifo")
        self.attempt("mknod of a directory", lambda: os.mknod(self.p("esc", "dnod"), stat.S_IFDIR | 0o755), errs=[E.EPERM])
        self.attempt("mknod of an unknown type", lambda: os.mknod(self.p("esc", "unod"), 0o170000 | 0o644), errs=[E.EINVAL])
        self.sentinel_ok()

    def ioctls(self) -> None:
        self.group = "ioctl"
        fd = os.open(self.m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        ffd = os.open(self.p("sentinel"), os.O_RDONLY)
        try:
            def io(f: int, cmd: int, arg: bytes) -> Callable[[], object]:
                return lambda: fcntl.ioctl(f, cmd, arg)
            bad_errs = [E.ENOTTY, E.EINVAL, E.ENOSYS, E.EFAULT, E.EPERM, E.EOPNOTSUPP]
            # 8 BEGIN_STATE, 9 COMMIT_IF and 10 BATCH are known (below); 11 is
            # BEGIN_FILE only as _IOWR with 64 bytes, so these sizes stay unknown.
            for nr in list(range(11, 24)) + [0, 255]:
                for d, size in ((_wire.iow, 8), (_wire.ior, 16), (_wire.iow, 16)):
                    cmd = d(_wire.TXFS_IOC_MAGIC, nr, size)
                    self.attempt(f"unknown ioctl nr {nr} size {size}", io(fd, cmd, bytes(size)), errs=bad_errs)
            for name, nr in (("BEGIN", 1), ("COMMIT", 2), ("ABORT", 3), ("RUN", 5)):
                for size in (0, 1, 4, 12, 32, 1024):
                    cmd = _wire.iow(_wire.TXFS_IOC_MAGIC, nr, size)
                    self.attempt(f"{name} with a {size}-byte argument", io(fd, cmd, bytes(size)), errs=bad_errs)
            for size in (8, 63, 65):
                self.attempt(f"STATUS with a {size}-byte argument",
                             io(fd, _wire.ior(_wire.TXFS_IOC_MAGIC, 6, size), bytes(size)), errs=bad_errs)
            # other file systems' ioctl numbers
            for cmd in (0x80086601, 0x40086602, 0x5401, 0xC0109428, 0x8004667D, 0xdeadbeef & 0xFFFFFFFF):
                self.attempt(f"foreign ioctl {cmd:#x}", io(fd, cmd, bytes(16)), errs=bad_errs + [E.ENOTSUP])
            flags = _wire.IOC_FLAGS
            self.attempt("COMMIT without a transaction", io(fd, _wire.TXFS_IOC_COMMIT, flags.pack(0, 0)), errs=[E.EINVAL, E.ENOENT])
            self.attempt("ABORT without a transaction", io(fd, _wire.TXFS_IOC_ABORT, flags.pack(0, 0)), errs=[E.EINVAL, E.ENOENT])
            commit_if = _wire.iow(_wire.TXFS_IOC_MAGIC, 9, 16)
            batch = _wire.iow(_wire.TXFS_IOC_MAGIC, 10, 8)
            self.attempt("COMMIT_IF without a transaction", io(fd, commit_if, bytes(16)), errs=[E.ESTALE])
            self.attempt("BATCH on a directory", io(fd, batch, bytes(8)), errs=[E.EINVAL, E.EBADF])
            self.attempt("BATCH on a read-only file", io(ffd, batch, bytes(8)), errs=[E.EBADF])
            # unknown commit flags, reserved bits: either refused or harmless
            fcntl.ioctl(fd, _wire.TXFS_IOC_BEGIN, flags.pack(0xFFFFFFFF, 0xFFFFFFFF))
            with open(self.p("flagged"), "wb") as f:
                f.write(b"f")
            r = self.attempt_any("COMMIT with every flag bit set", io(fd, _wire.TXFS_IOC_COMMIT, flags.pack(0xFFFFFFFE, 0xFFFFFFFF)))
            if r is not None:  # refused: the transaction is still open
                fcntl.ioctl(fd, _wire.TXFS_IOC_ABORT, flags.pack(0, 0))
            else:
                self.expect_backing["flagged"] = b"f"
            self.expect(txfs.state(self.m.mnt)["tx"] == 0, "a transaction is left open after the flag tests")
            run = _wire.IOC_RUN
            for pid, op, what, errs in (
                (0, 1, "RUN_BEGIN pid 0", [E.EPERM, E.ESRCH, E.EINVAL]),
                (1, 1, "RUN_BEGIN of init", [E.EPERM]),
                (os.getpid(), 1, "RUN_BEGIN of oneself", [E.EPERM]),
                (0x7FFFFFFF, 1, "RUN_BEGIN of a pid that does not exist", [E.EPERM, E.ESRCH]),
                (0xFFFFFFFF, 2, "RUN_COMMIT of pid 2^32-1", [E.ENOENT, E.EPERM, E.ESRCH]),
                (os.getpid(), 3, "RUN_ABORT with no tree", [E.ENOENT, E.EPERM]),
                (os.getpid(), 99, "RUN with op 99", [E.EINVAL]),
                (os.getpid(), 0, "RUN with op 0", [E.EINVAL]),
            ):
                self.attempt(what, io(fd, _wire.TXFS_IOC_RUN, run.pack(pid & 0xFFFFFFFF, op, 0, 0)), errs=errs)
            # on a regular file, and through handles that cannot do ioctls
            self.attempt("STATE on a regular file", io(ffd, _wire.TXFS_IOC_STATE, bytes(16)), ok=True)
            pfd = os.open(self.p("sentinel"), os.O_PATH)
            try:
                self.attempt("ioctl on an O_PATH handle", io(pfd, _wire.TXFS_IOC_STATE, bytes(16)), errs=[E.EBADF])
            finally:
                os.close(pfd)
            # a random storm of numbers with our magic and random arguments
            for _ in range(300):
                nr = self.rng.randrange(0, 256)
                size = self.rng.randrange(0, 80)
                dirf = self.rng.choice((_wire.iow, _wire.ior))
                cmd = dirf(_wire.TXFS_IOC_MAGIC, nr, size)
                arg = bytes(self.rng.getrandbits(8) for _ in range(size))
                if nr in (1, 5):  # BEGIN (it works) and RUN with random pids: keep them out of the storm
                    continue
                self.tried += 1
                try:
                    fcntl.ioctl(fd, cmd, arg)
                except OSError as e:
                    if e.errno == E.EIO:
                        self.bad(f"ioctl {cmd:#x}: EIO")
            st = txfs.state(self.m.mnt)
            self.expect(st["tx"] == 0, f"the ioctl storm left a transaction open: {st}")
        finally:
            os.close(fd)
            os.close(ffd)
        self.sentinel_ok()

    def attempt_any(self, what: str, fn: Callable[[], object]) -> Optional[int]:
        """Either outcome is fine if clear: returns the errno, None on success."""
        self.tried += 1
        try:
            fn()
            return None
        except OSError as e:
            if e.errno == E.EIO:
                self.bad(f"{what}: EIO")
            return e.errno

    def users(self) -> None:
        self.group = "users"
        os.mkdir(self.p("owned"))
        os.chmod(self.p("owned"), 0o777)
        # a transaction of this thread, open while another user's process tries things
        txfs.begin(self.m.mnt)
        with open(self.p("owned", "secret"), "wb") as f:
            f.write(b"mine until commit")
        # and a process-tree transaction (what `txfs run` makes) for a child of ours
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        fd = os.open(self.m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(child, _wire.TXFS_RUN_BEGIN, 0, 0))
        finally:
            os.close(fd)
        me = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            out = []
            try:
                os.setgid(65534)
                os.setgroups([])
                os.setuid(65534)
                mfd = os.open(self.m.mnt, os.O_RDONLY | os.O_DIRECTORY)
                flags = _wire.IOC_FLAGS.pack(0, 0)
                for name, cmd, arg in (
                    ("COMMIT", _wire.TXFS_IOC_COMMIT, flags),
                    ("ABORT", _wire.TXFS_IOC_ABORT, flags),
                    ("RUN_COMMIT of the other user's tree", _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(child, 2, 0, 0)),
                    ("RUN_ABORT of the other user's tree", _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(child, 3, 0, 0)),
                    ("RUN_BEGIN of the other user's process", _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(me, 1, 0, 0)),
                    ("RUN_COMMIT of the other user's process", _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(me, 2, 0, 0)),
                    ("RUN_ABORT of the other user's process", _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(me, 3, 0, 0)),
                ):
                    try:
                        fcntl.ioctl(mfd, cmd, arg)
                        out.append(f"{name}=ok")
                    except OSError as e:
                        out.append(f"{name}={E.errorcode.get(e.errno or 0, e.errno)}")
                try:
                    open(os.path.join(self.m.mnt, "owned", "secret"), "rb").read()
                    out.append("see the uncommitted file=ok")
                except OSError as e:
                    out.append(f"see the uncommitted file={E.errorcode.get(e.errno or 0, e.errno)}")
                try:
                    with open(os.path.join(self.m.mnt, "sentinel"), "ab") as f:
                        f.write(b"x")
                    out.append("write the root-owned 0644 sentinel=ok")
                except OSError as e:
                    out.append(f"write the root-owned 0644 sentinel={E.errorcode.get(e.errno or 0, e.errno)}")
            except BaseException as e:  # noqa: BLE001
                out.append(f"setup={e!r}")
            os.write(w, "\n".join(out).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        got = dict(l.split("=", 1) for l in data.decode().splitlines() if "=" in l)
        print(f"    uid 65534 saw: {got}", flush=True)
        want = {
            "COMMIT": {"EINVAL", "ENOENT", "EPERM"},
            "ABORT": {"EINVAL", "ENOENT", "EPERM"},
            "RUN_COMMIT of the other user's tree": {"EPERM"},
            "RUN_ABORT of the other user's tree": {"EPERM"},
            "RUN_BEGIN of the other user's process": {"EPERM"},
            "RUN_COMMIT of the other user's process": {"ENOENT", "EPERM"},
            "RUN_ABORT of the other user's process": {"ENOENT", "EPERM"},
            "see the uncommitted file": {"ENOENT"},
            "write the root-owned 0644 sentinel": {"EACCES", "EPERM"},
        }
        for k, allowed in want.items():
            self.expect(got.get(k) in allowed, f"uid 65534: {k}: got {got.get(k)}, expected {sorted(allowed)} (all: {got})")
        # our transactions are intact: the tree one is still there, ours commits
        st = txfs.status(self.m.mnt)
        self.expect(st["live_txs"] >= 2, f"the other user's ioctls ended a transaction: {st}")
        txfs.commit()
        self.expect_backing["owned/secret"] = b"mine until commit"
        fd = os.open(self.m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.attempt("RUN_ABORT of our own tree", lambda: fcntl.ioctl(fd, _wire.TXFS_IOC_RUN, _wire.IOC_RUN.pack(child, 3, 0, 0)), ok=True)
        finally:
            os.close(fd)
        os.kill(child, 9)
        os.waitpid(child, 0)
        with open(self.p("owned", "secret"), "rb") as f:
            self.expect(f.read() == b"mine until commit", "our committed file")
        self.sentinel_ok()

    def names(self) -> None:
        self.group = "names"
        os.mkdir(self.p("names"))
        made: Dict[bytes, bytes] = {}
        base = os.fsencode(self.p("names"))
        for b in range(1, 256):
            if b == ord("/"):
                continue
            for name in ((bytes([b]) if b != ord(".") else b"..."), b"n" + bytes([b]) + b"x"):
                content = b"%d:" % b + name
                def mk(name: bytes = name, content: bytes = content) -> None:
                    with open(os.path.join(base, name), "wb") as f:
                        f.write(content)
                if self.attempt(f"create a name with byte {b}", mk, ok=True) is not None or os.path.exists(os.path.join(base, name)):
                    made[name] = content
        listed = set(os.listdir(base))
        self.expect(listed == set(made), f"listing of byte names: {len(listed)} listed, {len(made)} made, "
                    f"missing {sorted(set(made) - listed)[:5]}, extra {sorted(listed - set(made))[:5]}")
        for name, content in made.items():
            with open(os.path.join(base, name), "rb") as f:
                self.expect(f.read() == content, f"contents of name {name!r}")
            self.expect_backing["names/" + os.fsdecode(name)] = content
        # in a transaction too, and a rename among odd names
        def tx_names() -> None:
            with txfs.transaction(mount=self.m.mnt):
                for b in (1, 10, 127, 200, 255):
                    os.rename(os.path.join(base, b"n" + bytes([b]) + b"x"), os.path.join(base, b"t\n" + bytes([b])))
        self.attempt("renames among odd names in a transaction", tx_names, ok=True)
        for b in (1, 10, 127, 200, 255):
            old = b"n" + bytes([b]) + b"x"
            self.expect_backing["names/" + os.fsdecode(b"t\n" + bytes([b]))] = self.expect_backing.pop("names/" + os.fsdecode(old))
        n255 = os.path.join(base, b"L" * 255)
        def mk255() -> None:
            with open(n255, "wb") as f:
                f.write(b"255")
        self.attempt("a 255-byte name", mk255, ok=True)
        self.expect_backing["names/" + "L" * 255] = b"255"
        self.attempt("a 256-byte name", lambda: open(os.path.join(base, b"L" * 256), "wb"), errs=[E.ENAMETOOLONG])
        self.attempt("mkdir with a 256-byte name", lambda: os.mkdir(os.path.join(base, b"D" * 256)), errs=[E.ENAMETOOLONG])
        self.attempt("rename to a 256-byte name", lambda: os.rename(n255, os.path.join(base, b"M" * 256)), errs=[E.ENAMETOOLONG])
        self.attempt("a 255-byte name of multibyte UTF-8", lambda: open(os.path.join(base, ("é" * 127).encode() + b"x"), "wb").close(), ok=True)
        self.expect_backing["names/" + "é" * 127 + "x"] = b""
        self.attempt("a symlink with a 4095-byte target", lambda: os.symlink("t" * 4095, os.path.join(base, b"longlink")), ok=True)
        self.expect(os.readlink(os.path.join(base, b"longlink")) == b"t" * 4095, "readlink of a 4095-byte target")
        self.attempt("a symlink with a 4096-byte target", lambda: os.symlink("t" * 4096, os.path.join(base, b"toolong")), errs=[E.ENAMETOOLONG])
        self.attempt("setxattr with a 256-byte name", lambda: os.setxattr(n255, "user." + "x" * 251, b"v"), errs=[E.ERANGE, E.ENAMETOOLONG])
        self.attempt("setxattr with a 65537-byte value", lambda: os.setxattr(n255, "user.big", b"v" * 65537), errs=[E.E2BIG, E.ENOSPC, E.ERANGE])
        self.sentinel_ok()

    def paths(self) -> None:
        self.group = "paths"
        os.mkdir(self.p("long"))
        # a path of PATH_MAX - 1 bytes: absolute, through 250-byte components
        root = self.p("long")
        comps = []
        total = len(root)
        while total + 1 + 250 + 1 + 10 < 4095:
            comps.append("c" * 250)
            total += 251
        d = root
        dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        for c in comps:
            os.mkdir(c, dir_fd=dfd)
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
            d = os.path.join(d, c)
        os.close(dfd)
        last = "f" * (4095 - len(d) - 1)
        full = os.path.join(d, last)
        self.expect(len(full) == 4095, f"built a {len(full)}-byte path")
        def mkfull() -> None:
            with open(full, "wb") as f:
                f.write(b"deep")
        self.attempt("open a 4095-byte path", mkfull, ok=True)
        self.attempt("stat a 4095-byte path", lambda: os.stat(full), ok=True)
        self.attempt("open a 4096-byte path", lambda: open(full + "g", "wb"), errs=[E.ENAMETOOLONG])
        self.expect_backing[os.path.relpath(full, self.m.mnt)] = b"deep"
        # deep trees, by relative opens
        depth = 300 if self.mode == "quick" else 2000
        os.mkdir(self.p("deep"))
        dfd = os.open(self.p("deep"), os.O_RDONLY | os.O_DIRECTORY)
        fds = [dfd]
        ok = True
        for i in range(depth):
            try:
                os.mkdir("d", dir_fd=fds[-1])
                fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
            except OSError as e:
                self.bad(f"deep tree: mkdir at depth {i}: {e}")
                ok = False
                break
        self.tried += depth
        if ok:
            fd = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fds[-1])
            os.write(fd, b"leaf")
            os.close(fd)
            self.expect_backing["deep/" + "d/" * depth + "leaf"] = b"leaf"
        for f in fds:
            os.close(f)
        # a deep tree made in a transaction and aborted leaves nothing
        def tx_deep() -> None:
            with txfs.transaction(mount=self.m.mnt):
                os.makedirs(self.p("deep2", *(["e"] * 60)))
                with open(self.p("deep2", *(["e"] * 60), "x"), "wb") as f:
                    f.write(b"x")
                raise KeyError("abort")
        try:
            tx_deep()
        except KeyError:
            pass
        self.tried += 1
        self.expect(not os.path.exists(self.p("deep2")), "an aborted deep tree left a trace")
        self.sentinel_ok()

    def many(self) -> None:
        self.group = "many"
        n = 20_000 if self.mode == "quick" else 1_000_000
        os.mkdir(self.p("many"))
        dfd = os.open(self.p("many"), os.O_RDONLY | os.O_DIRECTORY)
        t0 = time.monotonic()
        try:
            for i in range(n):
                fd = os.open(f"e{i:07d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
                os.close(fd)
        except OSError as e:
            self.bad(f"creating entry {i} of {n}: {e}")
        finally:
            os.close(dfd)
        self.tried += n
        made = time.monotonic() - t0
        names = os.listdir(self.p("many"))
        self.expect(len(names) == n and len(set(names)) == n, f"readdir of {n} entries: {len(names)} listed, {len(set(names))} distinct")
        self.expect(set(names) == {f"e{i:07d}" for i in range(n)}, "readdir lists exactly the names made")
        for i in self.rng.sample(range(n), 50):
            self.attempt(f"stat entry {i}", lambda i=i: os.stat(self.p("many", f"e{i:07d}")), ok=True)
        # 2,000 creates in one transaction, aborted: the listing is unchanged
        def tx_many() -> None:
            with txfs.transaction(mount=self.m.mnt):
                for i in range(2000):
                    open(self.p("many", f"t{i}"), "wb").close()
                raise KeyError("abort")
        try:
            tx_many()
        except KeyError:
            pass
        self.tried += 2000
        self.expect(len(os.listdir(self.p("many"))) == n, "an aborted transaction's creates are listed")
        self.notes_many = f"{n} entries created in {made:.1f} s, listed in one readdir pass"
        self.sentinel_ok()

    def after_unmount(self) -> None:
        self.group = "backing"
        for rel, content in self.expect_backing.items():
            path = os.path.join(self.m.backing, rel)
            try:
                got = read_beneath(self.m.backing, rel)
            except OSError as e:
                self.bad(f"BACKING/{rel!r}: {e}")
                self.lost += 1
                continue
            if got != content:
                self.bad(f"BACKING/{rel!r}: contents differ")
                self.lost += 1
        self.tried += len(self.expect_backing)
        with open(os.path.join(self.m.backing, "sentinel"), "rb") as f:
            if f.read() != SENTINEL:
                self.bad("BACKING/sentinel differs")
                self.lost += 1


def read_beneath(root: str, rel: str) -> bytes:
    """Contents of ROOT/REL, walking with dir fds (REL may exceed PATH_MAX)."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for c in parts[:-1]:
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        with os.fdopen(ffd, "rb") as f:
            return f.read()
    finally:
        os.close(fd)


SENTINEL = b"committed before the bad input began\n" * 100


def main() -> None:
    args = parse_args("Bad input against a txfs mount: clear errnos, a live daemon, no data lost.", "badinput.py", "bad input", "bad input")
    t0 = time.monotonic()
    rng = random.Random(args.seed)
    print(f"badinput: seed {args.seed} ({args.mode})", flush=True)
    outside = tempfile.mkdtemp(prefix="txfs-rel-outside-", dir=os.environ.get("TXFS_REL_TMP") or None)
    notes: List[str] = []
    m = Mount("badinput", opts="allow_other")  # another user's process must reach it
    os.mkdir(os.path.join(m.backing, "esc"))
    os.symlink(outside, os.path.join(m.backing, "esc", "out"))
    os.symlink("../../..", os.path.join(m.backing, "esc", "up"))
    with m:
        g = Groups(m, args.mode, rng)
        with open(g.p("sentinel"), "wb") as f:
            f.write(SENTINEL)
        os.chmod(g.p("sentinel"), 0o644)
        for group in (g.escapes, g.ioctls, g.users, g.names, g.paths, g.many):
            tg = time.monotonic()
            n0, v0 = g.tried, len(g.violations)
            try:
                group(outside)  if group == g.escapes else group()
            except SystemExit:
                break
            except Exception as e:  # noqa: BLE001 — an unexpected error is a finding, keep going
                g.bad(f"unexpected {e!r}")
                if not m.alive():
                    break
                if txfs.in_transaction():
                    txfs.abort()
            print(f"  {g.group}: {g.tried - n0} tried, {len(g.violations) - v0} violations, {time.monotonic() - tg:.1f} s", flush=True)
        alive = m.alive()
        if not m.stop():
            g.bad(f"unmount was not clean: {m.stop_error}")
        if alive:
            g.after_unmount()
        leaked = sorted(os.listdir(outside))
        if leaked not in ([], ["victim"]):
            g.bad(f"files appeared outside the mount: {leaked}")
        shutil.rmtree(outside, ignore_errors=True)
    if hasattr(g, "notes_many"):
        notes.append(f"badinput: {g.notes_many}")
    notes.append(f"badinput: {g.tried} bad inputs tried in 6 groups, {len(g.violations)} violations; seed {args.seed}")
    notes += [f"badinput violation: {v}" for v in g.violations[:20]]
    finish(args, [row("bad input", "bad input", g.tried, len(g.violations), g.lost, time.monotonic() - t0, command("badinput.py", args))], notes)


if __name__ == "__main__":
    main()
