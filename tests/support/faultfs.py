"""``_sys`` backends for the reliability suites: trace, fail the Nth call, shorten, kill.

Every backend counts calls in ``hook``, which ``_sys`` calls before each operation, so "the Nth
call" means the same call in every run of a deterministic save (the call sequence up to the
first fault does not depend on anything random).  The fault model follows SQLite's test VFS:
fail the Nth call once, or fail it and every later call of the same operation (persistent).
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys

# A short count is only meaningful for calls that transfer bytes and return how many.
WRITE_OPS = frozenset({"pwrite", "write", "copy_file_range", "sendfile"})
READ_OPS = frozenset({"pread", "preadinto"})
# The calls a crash point is placed before (issue 3): the ones that change what is durable, and
# (as "create") every open that creates a name: the lock, a temp, the pending journal.
DESTRUCTIVE_OPS = frozenset(
    {"ftruncate", "rename", "link", "unlink", "fsync", "fsync_dir", "create", "insert_range"}
)
# Recovery and rollback also punch temps, put back the sources' times and modes, and owners.
RECOVER_OPS = DESTRUCTIVE_OPS | {"punch_hole", "futimens", "fchmod", "fchown", "collapse_range"}

# The kinds of destructive call (of :data:`DESTRUCTIVE_OPS`, an open that creates a name as
# ``open``) each scenario's save makes: the same on ext4 and on tmpfs, so a sweep that judges
# what recover decides may run there (``ram_path``, ``model_disk_path``) and asserts them.
# ``inplace`` stays on the disk: it adopts in place where the file system inserts ranges,
# which tmpfs cannot.
_ALL_KINDS = frozenset({"open", "ftruncate", "rename", "link", "unlink", "fsync", "fsync_dir",
                        "insert_range"})
_NO_CUTS = frozenset({"open", "rename", "link", "unlink", "fsync", "fsync_dir"})
POINT_KINDS = {"consume3": _ALL_KINDS, "copy3": _NO_CUTS, "single": _NO_CUTS,
               "adopt2": _ALL_KINDS, "onsrc": _ALL_KINDS, "discard2": _ALL_KINDS}

ERRNOS = {"eio": errno.EIO, "enospc": errno.ENOSPC}
KINDS = ("eio", "enospc", "short-write", "short-read")


def count_arg(op: str, args: tuple[Any, ...]) -> int:
    """How many bytes a transfer call asked for (from the hook's arguments)."""
    if op in ("pwrite", "write", "pread", "preadinto"):
        return int(args[1])
    if op == "copy_file_range":
        return int(args[2])
    if op == "sendfile":
        return int(args[3])
    return 0


class Recorder(_sys.Backend):
    """The real system calls, each recorded as (op, args): what a test of hints and their
    order reads back."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple[Any, ...]]] = []

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.ops.append((op, args))


class SimFS(_sys.Backend):
    """The real system, optionally without ``copy_file_range`` (as across file systems).

    With ``cfr=False`` every ``copy_file_range`` fails with ``EXDEV``, which sends every copy
    through the ``preadinto``/``pwrite`` loop: that is where short reads can happen.
    """

    def __init__(self, *, cfr: bool = True) -> None:
        self.cfr = cfr

    def copy_file_range(self, src: int, dst: int, count: int, src_off: int, dst_off: int) -> int:
        if not self.cfr:
            raise OSError(errno.EXDEV, "copy_file_range disabled by the test backend")
        return super().copy_file_range(src, dst, count, src_off, dst_off)


@dataclass(frozen=True)
class Call:
    index: int  # 1-based position among all calls of the run
    op: str
    args: tuple[Any, ...]
    path: str = ""  # the path the call names, or the one its descriptor was opened from


class Tracer(SimFS):
    """Records every call; the counting run that fixes N."""

    def __init__(self, *, cfr: bool = True) -> None:
        super().__init__(cfr=cfr)
        self.calls: list[Call] = []
        self.paths: dict[int, str] = {}  # fd -> path it was opened from (latest)

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], str):
            path = args[0]
        elif args and isinstance(args[0], int):
            path = self.paths.get(args[0], "")
        else:
            path = ""
        self.calls.append(Call(len(self.calls) + 1, op, args, path))

    def open(self, path: str, flags: int, mode: int) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def link_fd(self, fd: int, dst: str) -> None:
        super().link_fd(fd, dst)
        self.paths[fd] = dst  # an unnamed file (a lock file) is known by its name from here


class FaultFS(SimFS):
    """Fail (or shorten) the ``at``-th call; with ``persistent``, also every later call of its op.

    ``kind`` is one of :data:`KINDS`.  Errors are raised before the call runs, except ``close``:
    Linux releases the descriptor even when ``close`` reports an error, so it is closed first.
    A short write or read transfers half of what was asked (at least one byte is always left
    out, so the caller must loop).  ``fired`` lists the calls that were hit.
    """

    def __init__(self, at: int, kind: str, *, persistent: bool, cfr: bool = True) -> None:
        super().__init__(cfr=cfr)
        if kind not in KINDS:
            raise ValueError(kind)
        self.at = at
        self.kind = kind
        self.persistent = persistent
        self.calls = 0
        self.op_at: str | None = None
        self.fired: list[Call] = []
        self.enabled = True
        self._short = False

    def _hit(self, op: str) -> bool:
        if not self.enabled:
            return False
        if self.calls == self.at:
            self.op_at = op
            return True
        return self.persistent and self.calls > self.at and op == self.op_at

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls += 1
        if not self._hit(op):
            return
        if self.kind in ERRNOS:
            self.fired.append(Call(self.calls, op, args))
            if op == "close":
                os.close(args[0])
            code = ERRNOS[self.kind]
            raise OSError(code, f"{os.strerror(code)} (injected at call {self.calls}: {op})")
        ops = WRITE_OPS if self.kind == "short-write" else READ_OPS
        if op in ops and count_arg(op, args) > 1:
            self.fired.append(Call(self.calls, op, args))
            self._short = True

    def _take_short(self) -> bool:
        short, self._short = self._short, False
        return short

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if self._take_short():
            data = memoryview(data)[: len(data) // 2]
        return super().pwrite(fd, data, offset)

    def write(self, fd: int, data: memoryview | bytes) -> int:
        if self._take_short():
            data = memoryview(data)[: len(data) // 2]
        return super().write(fd, data)

    def copy_file_range(self, src: int, dst: int, count: int, src_off: int, dst_off: int) -> int:
        if self._take_short():
            count //= 2
        return super().copy_file_range(src, dst, count, src_off, dst_off)

    def sendfile(self, dst: int, src: int, src_off: int, count: int) -> int:
        if self._take_short():
            count //= 2
        return super().sendfile(dst, src, src_off, count)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        if self._take_short():
            n //= 2
        return super().pread(fd, n, offset)

    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int:
        if self._take_short():
            buf = buf[: len(buf) // 2]
        return super().preadinto(fd, buf, offset)


class ZeroWriteFS(SimFS):
    """The ``at``-th call, a write, returns 0 without writing: an error, never a silent loss."""

    def __init__(self, at: int, *, cfr: bool = True) -> None:
        super().__init__(cfr=cfr)
        self.at = at
        self.calls = 0
        self.fired = False

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls += 1

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if self.calls == self.at:
            self.fired = True
            return 0
        return super().pwrite(fd, data, offset)


class KillFS(SimFS):
    """SIGKILL this process right before the ``at``-th call whose op is in ``ops``."""

    def __init__(self, at: int, ops: frozenset[str] = DESTRUCTIVE_OPS) -> None:
        super().__init__()
        self.at = at
        self.ops = ops
        self.seen = 0

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if is_point(op, args, self.ops):
            self.seen += 1
            if self.seen == self.at:
                os.kill(os.getpid(), signal.SIGKILL)


class CountFS(SimFS):
    """Counts the calls whose op is in ``ops`` (a run's crash points)."""

    def __init__(self, ops: frozenset[str] = DESTRUCTIVE_OPS) -> None:
        super().__init__()
        self.ops = ops
        self.points: list[str] = []

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if is_point(op, args, self.ops):
            self.points.append(point_op(op, args))


# --- the v2 protocol's names ---------------------------------------------------------------------
# Every file a save creates is ``.{stem}.{TOKEN}{suffix}`` (filecord._io.names.token_name).
LOCK_SUFFIX = ".filecord-lock"
TEMP_SUFFIX = ".partial"
PENDING_SUFFIX = ".filecord-pending"
JOURNAL_SUFFIX = ".filecord-journal"
SRC_SUFFIX = ".filecord-src"
# Journal version 3's stage names (a rename each); version 4 appends step records instead, so
# a save never makes these: they are kept so a leftover is still seen as filecord's.
COMMITTED_SUFFIX = ".filecord-committed"
ROLLBACK_SUFFIX = ".filecord-rollback"
SUFFIXES = (LOCK_SUFFIX, TEMP_SUFFIX, PENDING_SUFFIX, JOURNAL_SUFFIX, SRC_SUFFIX,
            COMMITTED_SUFFIX, ROLLBACK_SUFFIX)
# A crash point is also placed before each open that creates a name (the lock, the temps, the
# pending journal): "create" in an ops set means such an open.
CREATE = "create"


_PROBE_OPS = frozenset({"open", "pwrite", "write", "insert_range", "collapse_range",
                        "clone_range", "close"})


def in_probe(calls: list[Call], k: int) -> bool:
    """Whether call k belongs to a file-system probe (``facts.probe_clone``/``probe_insert``):
    a call on a ``.filecord-probe.*`` name, or one of the run of calls on a directory that an
    ``O_TMPFILE`` open of it begins (the probe's unnamed files carry the directory's path)."""
    hit = calls[k - 1]
    if os.path.basename(hit.path).startswith(".filecord-probe."):
        return True
    tmpfile = getattr(os, "O_TMPFILE", 0)
    for i in range(k - 1, -1, -1):
        c = calls[i]
        if c.path != hit.path or c.op not in _PROBE_OPS:
            return False
        if (c.op == "open" and tmpfile and len(c.args) > 1 and isinstance(c.args[1], int)
                and c.args[1] & tmpfile == tmpfile):
            # a lock file is made unnamed too, and locked at once: not a probe
            return not (i + 1 < len(calls) and calls[i + 1].op == "flock")
    return False


def is_filecord_name(name: str) -> bool:
    """Whether a file name is one a save or recover of the v2 protocol creates."""
    base = os.path.basename(name)
    return base.startswith(".") and base.endswith(SUFFIXES)


def point_op(op: str, args: tuple[Any, ...]) -> str:
    """The crash-point class of a call: its op, or ``create`` for an open with ``O_CREAT``."""
    if op == "open" and len(args) > 1 and int(args[1]) & os.O_CREAT:
        return CREATE
    return op


def is_point(op: str, args: tuple[Any, ...], ops: frozenset[str]) -> bool:
    return point_op(op, args) in ops


def _dst(c: Call) -> str:
    return str(c.args[1]) if c.op == "rename" else ""


def _journal_writes(calls: list[Call]) -> list[Call]:
    """The writes to the journal: its head under the pending name, then each appended step
    (through the same descriptor, so the tracer names it by the pending path it was opened
    from)."""
    return [c for c in calls if c.op == "pwrite" and c.path.endswith(PENDING_SUFFIX)]


def commit_point(calls: list[Call]) -> int:
    """Index of the call that commits a traced successful save.

    With a journal: the write of its ``committed`` step, the last step appended before the
    first rename onto a final name.  Without one: the rename of the (only) temp onto its final
    name.
    """
    first = final_renames(calls)[0]
    steps = [c.index for c in _journal_writes(calls) if c.index < first]
    return steps[-1] if steps else first


def has_journal(calls: list[Call]) -> bool:
    return bool(_journal_writes(calls))


def final_renames(calls: list[Call]) -> list[int]:
    """Renames onto final names (a rename onto any filecord name is a step before the commit:
    the journal's, a source's onto ``.filecord-src``, an adoption onto a temp)."""
    return [c.index for c in calls if c.op == "rename" and not is_filecord_name(_dst(c))]


def commit_sync(calls: list[Call]) -> int:
    """Index of the fsync that makes the commit durable: the journal's, after its committed
    step (without a journal, the fsync of the directory the temp was renamed in)."""
    cp = commit_point(calls)
    hit = calls[cp - 1]
    if hit.op == "pwrite":
        for c in calls[cp:]:
            if c.op == "fsync" and c.args[0] == hit.args[0]:
                return c.index
        raise AssertionError(f"no fsync of the journal after its committed step {cp}")
    directory = os.path.dirname(_dst(hit))
    for c in calls[cp:]:
        if c.op == "fsync_dir" and os.path.realpath(str(c.args[0])) == os.path.realpath(
                directory):
            return c.index
    raise AssertionError(f"no fsync of {directory} after the commit rename {cp}")


def commit_bounds(calls: list[Call]) -> tuple[int, int]:
    """``(last_pre, first_post)`` call indexes of a traced successful save.

    A fault at a call ``<= last_pre`` happens at or before the commit point (a failed write of
    the committed step, or a failed rename, leaves the save uncommitted), so the save must
    leave everything as it was.  A fault at ``>=
    first_post`` happens after the commit is durable, so the outputs must end complete (after
    ``recover``).  Between them lies only the fsync that makes the commit durable (and
    anything up to it): the save may undo the rename or keep it, so both
    outcomes are accepted there, and each must be exact.
    """
    cp = commit_point(calls)
    return cp, commit_sync(calls) + 1


def destructive_points(calls: list[Call], ops: frozenset[str] = DESTRUCTIVE_OPS) -> list[Call]:
    return [c for c in calls if is_point(c.op, c.args, ops)]


COMMITTED_STEP = b'"stage":"committed"'  # in the payload of the journal's committed step


class FailCommitStep(SimFS):
    """The write of the journal's ``committed`` step (the commit point) fails with ``errno``:
    the save is not committed and must roll back."""

    def __init__(self, err: int = errno.EIO, message: str = "injected EIO at the commit point"
                 ) -> None:
        super().__init__()
        self.err, self.message = err, message

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if COMMITTED_STEP in bytes(data):
            raise OSError(self.err, self.message)
        return super().pwrite(fd, data, offset)


@dataclass(frozen=True)
class Share:
    """One of ``of`` interleaved shares of a sweep's points (``number`` from 1): a sweep of
    minutes runs as several tests that pytest-xdist spreads over its workers, every point in
    exactly one share.  Its floor of points is the whole sweep's floor over ``of``."""

    number: int
    of: int

    def __str__(self) -> str:
        return "whole" if self.of == 1 else f"share{self.number}of{self.of}"

    def mine(self, i: int) -> bool:
        """Whether the point with ordinal ``i`` (from 0) is in this share."""
        return i % self.of == self.number - 1

    def floor(self, whole: int) -> int:
        return whole // self.of


def shares(of: int) -> list[Share]:
    return [Share(n, of) for n in range(1, of + 1)]
