"""Byte movers: copy, clone, move (a save's moves shorten sources here) and restore (the
rollback and ``recover`` give the bytes back here).

Theory of operation
-------------------
*Copy*: ``copy_file_range`` (``sendfile`` into a stream) in bounded segments, else
``pread``/``pwrite`` through one reused buffer where the kernel refuses or returns 0 early; a
short count is continued, a zero count is an error (F3).

*Move* shortens a source from its end, a sync window at a time: copy the window into every
temp that uses it (starting writeback every :data:`WRITE_BEHIND` bytes, a hint); ``fsync``
those temps; append and ``fsync`` the window's ``cut`` step; ``fstat`` the source (as the last
truncate left it, else ``DataChangedError``; right before the truncate, so a change made while
the step is written is seen); only then ``ftruncate`` it to the window's start.  Each byte is
always durable in the source or at its journaled offset, and the source is at its own size or
at a size a ``cut`` step names, never below the last.

*Restore* runs it in reverse through the same windows (``_windows``): copy back to the
source's end, ``fsync`` the source, only then punch the temp (best effort), never a temp
another name links to (a user's rescue copy, or a forged journal's file elsewhere: not the
save's to change).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from filecord._io import syscalls as _sys
from filecord._plan.plan import cover
from filecord._plan.types import MoveSource, PieceRef
from filecord.errors import ChangeKind, DataChangedError

log = logging.getLogger(__name__)

SEGMENT = 256 << 20  # one copy_file_range call; also the progress granularity
BUFFER = 8 << 20
# A move's copy part, and the writeback started after each one while more of the window is
# left, so its fsync waits for little more than the last part (0: no hint; measured against 0
# by bench/consume_window.py).
WRITE_BEHIND = 16 << 20

_CFR_FALLBACK = frozenset(
    {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF, errno.ETXTBSY}
)


@dataclass(frozen=True, slots=True)
class Facts:
    """One ``lstat`` of a file (``assess`` keeps the names holding the expected inode)."""

    size: int
    mtime_ns: int
    ctime_ns: int = 0

    @classmethod
    def of(cls, st: os.stat_result) -> Facts:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class Look:
    """A running save's last look at a parked source, and the size its truncate in flight
    leaves (None when none is)."""

    facts: Facts
    pending: int | None = None


Progress = Callable[[int], None]
Tally = Literal["copied", "moved", "restored"]


@dataclass
class Counters:
    """Per-save tallies (bytes as asked of the kernel) and the one reused copy buffer."""

    fsyncs: int = 0
    copied: int = 0
    cloned: int = 0
    written: int = 0
    moved: int = 0
    restored: int = 0

    @functools.cached_property
    def buffer(self) -> memoryview:  # allocated on the first buffered copy
        return memoryview(bytearray(BUFFER))

    def fsync(self, fd: int) -> None:
        _sys.fsync(fd)
        self.fsyncs += 1


def copy_range(
    src: int, dst: int, src_off: int, dst_off: int | None, n: int, c: Counters,
    progress: Progress = lambda _n: None, *, kind: Tally = "copied",
) -> None:
    """Copy ``n`` bytes completely, at ``dst_off`` or (None) appended to a stream."""
    done, buffered = 0, False
    while done < n:
        at = None if dst_off is None else dst_off + done
        if not buffered:
            size = min(SEGMENT, n - done)
            try:
                got = (_sys.sendfile(dst, src, src_off + done, size) if at is None
                       else _sys.copy_file_range(src, dst, size, src_off + done, at))
            except OSError as exc:
                if exc.errno not in _CFR_FALLBACK:
                    raise
                got = 0
            buffered = got <= 0  # refused, or 0 where data should be: EIO below at a real end
        if buffered:
            view = c.buffer[: min(BUFFER, n - done)]
            got = _sys.preadinto(src, view, src_off + done)
            if got <= 0:
                raise OSError(errno.EIO, f"source ended {n - done} bytes early at {src_off + done}")
            _sys.write_all(dst, view[:got], at)
        done += got
        progress(got)
    setattr(c, kind, getattr(c, kind) + n)  # counted once complete: a failed copy raises


def write_bytes(
    dst: int, data: memoryview, dst_off: int | None, c: Counters, progress: Progress
) -> None:
    """Write an in-memory piece in bounded slices (so progress moves and no slice is huge)."""
    c.written += len(data)
    for start in range(0, len(data), BUFFER):
        part = data[start : start + BUFFER]
        _sys.write_all(dst, part, None if dst_off is None else dst_off + start)
        progress(len(part))


def move_source(
    src: int,
    m: MoveSource,
    temps: Sequence[int],
    window: int,
    c: Counters,
    progress: Progress,
    *,
    looks: dict[tuple[int, int], Look],
    log_cut: Callable[[int], None],
) -> None:
    """Move ``m``'s run into the temps (``temps[i]``: output ``i``'s), one window at a time.

    ``looks[m.key]``: the caller's checked look at the source, then the last one and the size
    of a truncate in flight, so the failure path can tell the save's cut from anyone else's
    change.  ``log_cut(lo)`` makes the ``cut`` step durable."""
    spans = [(d.src_offset, d.src_offset + d.length, d) for d in m.dests]
    for lo, pos, parts in _windows(m, spans, m.run_start, window):
        try:
            _copy_window(src, parts, temps, c)
        except OSError as exc:
            _check_unchanged(src, m, pos, looks[m.key].facts, exc)
            raise
        if lo > m.run_start:  # read the next window while this one's fsync writes
            _sys.prefetch(src, max(m.run_start, lo - window), lo - max(m.run_start, lo - window))
        for fd in sorted({temps[d.output] for _a, _b, d in parts}):
            c.fsync(fd)  # raises on failure: the truncate below never runs after a bad fsync
        log_cut(lo)  # before the check: nothing but the check may stand before the cut
        _check_unchanged(src, m, pos, looks[m.key].facts, None)
        looks[m.key] = Look(looks[m.key].facts, lo)  # the size in flight, for the failure path
        _sys.ftruncate(src, lo)
        seen = _sys.fstat(src)
        looks[m.key] = Look(Facts.of(seen))
        if seen.st_nlink != 1:
            # Linked between the check and the truncate: the other name now holds only the
            # kept prefix.  Stop before the commit deletes the rest; a rollback puts it back.
            raise DataChangedError(m.path, expected_size=lo, found_size=seen.st_size,
                                   reason="another name was linked to it while it was being "
                                   "moved", kind=ChangeKind.LINKED)
        progress(pos - lo)


def _copy_window(src: int, parts: Sequence[tuple[int, int, PieceRef]], temps: Sequence[int],
                 c: Counters) -> None:
    left = sum(b - a for a, b, _d in parts)
    behind: dict[int, tuple[int, int]] = {}  # temp -> its range copied since the last hint
    since = 0
    for a, b, d in parts:
        tfd, at = temps[d.output], d.out_offset + (a - d.src_offset)
        step = WRITE_BEHIND or (b - a)
        for x in range(a, b, step):
            n = min(step, b - x)
            o = at + (x - a)
            copy_range(src, tfd, x, o, n, c, kind="moved")
            lo_hi = behind.get(tfd, (o, o + n))
            behind[tfd] = (min(lo_hi[0], o), max(lo_hi[1], o + n))
            since, left = since + n, left - n
            if WRITE_BEHIND and since >= WRITE_BEHIND and left > 0:
                for fd, (p, q) in sorted(behind.items()):
                    _sys.start_writeback(fd, p, q - p)
                behind, since = {}, 0


def _windows(m: MoveSource, spans: Sequence[tuple[int, int, PieceRef]], start: int,
             window: int) -> list[tuple[int, int, list[tuple[int, int, PieceRef]]]]:
    """``[start, m.size)`` in sync windows ending at ``m.size`` (the one a move cuts first
    comes first), each with the parts of ``spans`` inside it; in O(N + W)."""
    buckets: dict[int, list[tuple[int, int, PieceRef]]] = {}
    for a, b, d in spans:
        for k in range((m.size - b) // window, (m.size - max(a, start) - 1) // window + 1):
            buckets.setdefault(k, []).append((a, b, d))
    out: list[tuple[int, int, list[tuple[int, int, PieceRef]]]] = []
    hi = m.size
    while hi > start:
        lo = max(start, hi - window)
        parts = [(max(a, lo), min(b, hi), d) for a, b, d in buckets.get(len(out), ())]
        out.append((lo, hi, [(a, b, d) for a, b, d in parts if a < b]))
        hi = lo
    return out


# The reason for a change of ctime alone (ChangeKind.METADATA: chmod, chown, chattr): the save
# stops but its journal is not held, and ``recover`` may roll it back.
METADATA_ONLY = ("only its change time moved (a chmod, chown or chattr?): no byte changed as "
                 "far as size and modification time tell")


def _check_unchanged(src: int, m: MoveSource, pos: int, seen: Facts, cause: OSError | None
                     ) -> None:
    """DataChangedError unless the source is as the last truncate left it: cutting another
    writer's file would lose their bytes."""
    now = _sys.fstat(src)
    why, kind = None, ChangeKind.CONTENT
    if now.st_size != pos:
        why = "another process changed its size while it was being moved"
    elif now.st_nlink != 1:
        why, kind = "another name was linked to it while it was being moved", ChangeKind.LINKED
    elif now.st_mtime_ns != seen.mtime_ns:
        why = "another process wrote to it while it was being moved"
    elif now.st_ctime_ns != seen.ctime_ns:
        why, kind = METADATA_ONLY, ChangeKind.METADATA
    if why is not None:
        raise DataChangedError(m.path, expected_size=pos, found_size=now.st_size,
                               reason=why, kind=kind) from cause


def restore_source(
    src: int,
    m: MoveSource,
    temps: Sequence[int | None],
    window: int,
    c: Counters,
    *,
    dense: bool = False,
    free: bool = True,
) -> None:
    """Put back the bytes a move took from ``src``, from its current size up (so a rerun
    continues).  ``temps[i]`` None: output ``i`` holds none of them.  ``dense``
    (the source had no holes): a hole in a temp where moved bytes should be proves they were
    never moved, a ``DataChangedError`` before anything is written.  ``free`` False: the
    temps' copies are kept (``src`` has no name yet: a crash would take it with it)."""
    start = _sys.fstat(src).st_size  # within the run: the caller checked it
    for _lo, _hi, segs in reversed(_windows(m, cover(m.dests, start, m.size), start, window)):
        held: list[tuple[int, int, int, int]] = []  # (temp, offset there, source offset, length)
        for a, b, d in segs:
            tfd = temps[d.output]
            if tfd is None:
                raise OSError(errno.ENOENT, f"the temp file holding {m.path}[{a}:{b}] is missing")
            at = d.out_offset + (a - d.src_offset)
            hole = first_hole(tfd, at) if dense else None
            if hole is not None and hole < at + b - a:
                raise DataChangedError(
                    m.path, expected_size=m.size, found_size=a,
                    reason=f"the temp holds no data for its bytes from {a + hole - at} on: "
                    "they were never moved, so the source was shortened by someone else")
            held.append((tfd, at, a, b - a))
        for tfd, at, a, n in held:
            copy_range(tfd, src, at, a, n, c, kind="restored")
        c.fsync(src)
        for tfd, at, _a, n in held if free else []:
            try:  # frees disk early only: the temp is unlinked right after the rollback (one
                # another name links to is open read-only, ``undo.open_own``: the punch fails)
                _sys.punch_hole(tfd, at, n)
            except OSError as exc:  # noqa: PERF203 - best effort, each range
                log.debug("punch_hole refused (%s); the temp keeps its copy until removed", exc)


def first_hole(fd: int, offset: int) -> int | None:
    """Where the first hole from ``offset`` on begins (the file's end is one); None where the
    file system cannot say (no ``SEEK_HOLE``: no holes reported)."""
    try:
        return _sys.lseek(fd, offset, getattr(os, "SEEK_HOLE", 4))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENXIO, errno.EOPNOTSUPP):
            return None
        raise
