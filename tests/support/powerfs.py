"""A page-cache model: what a power cut keeps and what it forgets (RocksDB-style, for small files).

The backend runs every call on the real files and keeps, beside them, what the disk would hold
if the power failed now:

* per inode, its **durable content**: the bytes at its last ``fsync`` (files that existed when
  the model started count as synced; a file created since starts empty);
* per watched directory, its **durable names** (name -> inode) at its last ``fsync_dir``.

Worst cases are chosen where the file system may legally do either:

* ``ftruncate``, ``punch_hole``, ``insert_range`` and ``collapse_range`` reach the disk at
  once, before any data written earlier (metadata journaled ahead of data), so they shorten,
  zero or shift the durable content too;
* ``fsync`` of a file does not make its directory entry durable (POSIX does not promise it);
* unsynced writes are dropped (``drop``), or all kept while name operations are still lost
  (``keep``: a kernel that flushed the data but not the directory).

The opposite shape, a name kept whose data was lost, is the **eager** modes: every name
operation (create, rename, unlink) is durable at once, as on a file system that journals
metadata ahead of data, while unsynced data is dropped (``eager-drop``: each file holds what
its last ``fsync`` left) or half-written (``eager-torn``: the size is the current one, the
first half of the unsynced change reached the disk and the rest reads as the old bytes or
zeros).  That is how a journal, a lock or a temp can survive under its name with torn content.

At the crash point the hook raises :class:`Crash` (a ``BaseException``, so filecord's cleanup,
which catches ``OSError``, cannot swallow it) and every later call but ``close`` raises it
too: the process is dead to the disk.  :meth:`PowerFS.apply_crash` then rewrites the real
directories into the durable state: names go back to their last synced inode (inodes that lost
their last name are kept alive in a shadow directory by a hard link made just before the
``unlink`` or the ``rename`` over them, so the inode numbers the journal records stay true),
names never synced disappear, and each surviving inode gets its durable content.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import Any

from filecord._io import syscalls as _sys
from support.faultfs import DESTRUCTIVE_OPS, is_point

# mode -> (names, data): which name operations survive, and what unsynced data becomes.
MODES = {
    "drop": ("lazy", "drop"),
    "keep": ("lazy", "keep"),
    "eager-drop": ("eager", "drop"),
    "eager-torn": ("eager", "torn"),
}


def torn(durable: bytes, current: bytes) -> bytes:
    """What a half-written file holds: the current size; of the range that differs from the
    durable bytes (zeros past them), the first half is new and the rest old."""
    n = len(current)
    old = durable[:n].ljust(n, b"\0")
    if old == current:
        return current
    i = next(k for k in range(n) if old[k] != current[k])
    j = next(k for k in range(n - 1, -1, -1) if old[k] != current[k])
    mid = i + (j + 1 - i) // 2
    return current[:mid] + old[mid:]


class Crash(BaseException):
    """The simulated power cut."""


class ModelError(AssertionError):
    """The model met a case it does not handle (the test is wrong, not the code)."""


def _read_fd(fd: int) -> bytes:
    # Reopen through /proc: the descriptor may be write-only (the journal is).
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        size = os.fstat(rfd).st_size
        return os.pread(rfd, size, 0) if size else b""
    finally:
        os.close(rfd)


class PowerFS(_sys.Backend):
    """Real I/O plus the durable state; crashes before the ``crash_at``-th call in ``ops``.

    With ``fault_at``, that call (counting all calls) fails with EIO first, and ``crash_at``
    counts only the calls after it.
    """

    def __init__(
        self,
        dirs: list[str],
        shadow: str,
        *,
        crash_at: int | None = None,
        ops: frozenset[str] = DESTRUCTIVE_OPS,
        fault_at: int | None = None,
    ) -> None:
        self.shadow = os.path.realpath(shadow)
        os.makedirs(self.shadow, exist_ok=True)
        self.crash_at = crash_at
        self.ops = ops
        self.fault_at = fault_at
        self.calls = 0
        self.seen = 0
        self.dead = False
        self.durable: dict[int, bytes] = {}
        self.names: dict[str, dict[str, int]] = {}
        self.fd_ino: dict[int, int] = {}
        self.shadowed: set[int] = set()
        self.torn_files = 0  # files an eager-torn crash left half-written (a model statistic)
        for d in dirs:
            d = os.path.realpath(d)
            self.names[d] = self._listing(d)
            for name, ino in self.names[d].items():
                with open(os.path.join(d, name), "rb") as f:
                    self.durable[ino] = f.read()

    # --- bookkeeping ---------------------------------------------------------------------------
    @staticmethod
    def _listing(d: str) -> dict[str, int]:
        out = {}
        for name in os.listdir(d):
            st = os.lstat(os.path.join(d, name))
            if stat_mod.S_ISREG(st.st_mode):
                out[name] = st.st_ino
        return out

    def _watched(self, path: str) -> bool:
        return os.path.dirname(os.path.realpath(path)) in self.names

    def _keep_inode(self, path: str) -> None:
        """Before a name goes away, keep its inode alive so a crash can bring it back."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not self._watched(path) or st.st_ino in self.shadowed:
            return
        if st.st_ino not in self.durable:
            raise ModelError(f"{path}: inode {st.st_ino} was never seen by the model")
        os.link(path, os.path.join(self.shadow, f"ino-{st.st_ino}"))
        self.shadowed.add(st.st_ino)

    # --- the hook: the crash point -------------------------------------------------------------
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if self.dead:
            if op == "close":
                return  # let descriptors go; closing changes nothing durable
            raise Crash(f"dead: {op}")
        self.calls += 1
        if self.fault_at is not None:
            # Fail one call with EIO, then count crash points from there: a crash during the
            # rollback that the failure starts.
            if self.calls == self.fault_at:
                raise OSError(errno.EIO, f"injected at call {self.calls}: {op}")
            if self.calls < self.fault_at:
                return
        if is_point(op, args, self.ops):
            self.seen += 1
            if self.seen == self.crash_at:
                self.dead = True
                raise Crash(f"power cut before {op}{args}")

    # --- calls that change the model -----------------------------------------------------------
    def open(self, path: str, flags: int, mode: int) -> int:
        fd = super().open(path, flags, mode)
        tmpfile = getattr(os, "O_TMPFILE", 0)
        unnamed = bool(tmpfile) and flags & tmpfile == tmpfile
        if self._watched(path) or (unnamed and os.path.realpath(path) in self.names):
            ino = os.fstat(fd).st_ino
            self.durable.setdefault(ino, b"")  # a new file: nothing of it is on disk yet
            self.fd_ino[fd] = ino
        return fd

    def close(self, fd: int) -> None:
        self.fd_ino.pop(fd, None)
        super().close(fd)

    # The model is the durability: the real fsyncs would only slow the sweeps down.
    def fsync(self, fd: int) -> None:
        if fd in self.fd_ino:
            self.durable[self.fd_ino[fd]] = _read_fd(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        super().ftruncate(fd, size)
        ino = self.fd_ino.get(fd)
        if ino is not None and size < len(self.durable[ino]):
            self.durable[ino] = self.durable[ino][:size]

    def punch_hole(self, fd: int, offset: int, length: int) -> None:
        super().punch_hole(fd, offset, length)
        ino = self.fd_ino.get(fd)
        if ino is not None:
            old = self.durable[ino]
            end = min(len(old), offset + length)
            if offset < end:
                self.durable[ino] = old[:offset] + bytes(end - offset) + old[end:]

    # Inserting and collapsing ranges are metadata, journaled ahead of data like a truncate:
    # they reach the disk at once, shifting the durable content (the worst case for an undo
    # that judges from the size: it meets the shift without the data written after it).
    def insert_range(self, fd: int, offset: int, length: int) -> None:
        super().insert_range(fd, offset, length)
        ino = self.fd_ino.get(fd)
        if ino is not None and offset < len(self.durable[ino]):
            old = self.durable[ino]
            self.durable[ino] = old[:offset] + bytes(length) + old[offset:]

    def collapse_range(self, fd: int, offset: int, length: int) -> None:
        super().collapse_range(fd, offset, length)
        ino = self.fd_ino.get(fd)
        if ino is not None:
            old = self.durable[ino]
            self.durable[ino] = old[:offset] + old[offset + length:]

    def fsync_dir(self, path: str) -> None:
        d = os.path.realpath(path)
        if d in self.names:
            self.names[d] = self._listing(d)

    def rename(self, src: str, dst: str) -> None:
        self._keep_inode(dst)  # the file it replaces may come back after a crash
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        self._keep_inode(path)
        super().unlink(path)

    # --- the crash -----------------------------------------------------------------------------
    def leftover_fds(self) -> list[int]:
        return list(self.fd_ino)

    def apply_crash(self, mode: str = "drop") -> None:
        """Turn the real directories into what the disk held at the crash (see :data:`MODES`)."""
        names_mode, data_mode = MODES[mode]
        for fd in self.leftover_fds():  # descriptors a dead save never closed (its lock too)
            self.close(fd)
        if names_mode == "eager":  # every name operation reached the disk at once
            self.names = {d: self._listing(d) for d in self.names}
        current: dict[int, bytes] = {}
        # 1. Every watched name's inode goes to the shadow directory, keyed by inode.
        for d in self.names:
            for name, ino in self._listing(d).items():
                path = os.path.join(d, name)
                if data_mode != "drop":
                    with open(path, "rb") as f:
                        current[ino] = f.read()
                dest = os.path.join(self.shadow, f"ino-{ino}")
                if os.path.exists(dest):
                    # A second name of one inode (a hard link, as a cross-directory rename
                    # caught between its two directory syncs leaves): the inode is already
                    # shadowed; drop this name, step 2 restores the durable ones.
                    os.unlink(path)
                    continue
                os.rename(path, dest)
        for ino in self.shadowed:
            if data_mode != "drop" and ino not in current:
                with open(os.path.join(self.shadow, f"ino-{ino}"), "rb") as f:
                    current[ino] = f.read()
        # 2. The durable names come back, each on its durable inode.
        placed: dict[int, str] = {}
        for d, names in self.names.items():
            for name, ino in names.items():
                src = os.path.join(self.shadow, f"ino-{ino}")
                if ino in placed:
                    # Durable under two names: each directory was synced on its own around a
                    # rename between them (per-directory durability, the weaker model).
                    os.link(placed[ino], os.path.join(d, name))
                    continue
                if not os.path.exists(src):
                    raise ModelError(f"{d}/{name}: inode {ino} is not available")
                os.rename(src, os.path.join(d, name))
                placed[ino] = os.path.join(d, name)
                # 3. ... with its durable content.
                durable = self.durable.get(ino)
                if durable is None:
                    raise ModelError(f"{d}/{name}: inode {ino} was never seen by the model")
                want = {
                    "drop": durable,
                    "keep": current.get(ino, durable),
                    "torn": torn(durable, current.get(ino, durable)),
                }[data_mode]
                if want != durable:
                    self.torn_files += int(data_mode == "torn")
                with open(os.path.join(d, name), "r+b") as f:
                    if f.read() != want:
                        f.seek(0)
                        f.truncate(0)
                        f.write(want)
        # 4. Inodes with no durable name are gone.
        for leftover in os.listdir(self.shadow):
            os.unlink(os.path.join(self.shadow, leftover))
        self.shadowed.clear()
