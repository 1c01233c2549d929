"""Byte movers: copy, clone, move and put back: a save's moves shorten sources here, and the
rollback of a failed save and ``recover`` give the bytes back here (:func:`restore_source`).

Theory of operation
-------------------
*Copy* uses ``copy_file_range`` in bounded segments (fast, little CPU, and a free clone on
btrfs/XFS), falling back to ``pread``/``pwrite`` through one reused buffer when the kernel
refuses (``EXDEV``, ``EOPNOTSUPP``, ``ENOSYS``, ``EINVAL``) or returns 0 early.  Streams (pipes,
devices) take ``sendfile`` and then ``read``/``write``.  Every loop checks the full length: a
short count is continued, a zero count is an error, never silently accepted (F3).

*Move* shortens a source from its end, one sync window at a time:

1. copy the window's bytes to every destination that uses them, at their final offsets, in
   parts of at most :data:`WRITE_BEHIND` bytes, starting the writeback of each
   :data:`WRITE_BEHIND` bytes copied while more are left (a hint that makes nothing durable:
   it only lets the disk write while the rest is copied);
2. ``fsync`` every destination touched;
3. ``fstat`` the source: it must still be exactly as long as the last truncate left it (an
   append or truncate by another process is a ``DataChangedError``, never silently cut);
4. only then ``ftruncate`` the source to the window's start.

Between 2 and 3 the cut is logged (a ``cut`` step appended to the journal and fsynced), so
the check stays right before the truncate.  A
crash after 1 or 2 leaves the bytes in the source (still full length) and maybe in the temps;
a crash after the step leaves them durably in the temps.  So at every instant each byte is
durable in the source or at its journaled offset, and the log says how far the move got: the
source is at its own size or at a size a ``cut`` step names, never below the last (a truncate
may not reach the disk, none runs before its step).  A failed or uncertain fsync raises before
step 3.

*Restore* (rollback and recovery) runs the same discipline in reverse: copy the bytes back to
the end of the source, ``fsync`` the source, and only then punch the hole in the temp that held
them (best effort, to free space; the temp is deleted afterwards anyway).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from filecord._io import syscalls as _sys
from filecord._plan.plan import cover
from filecord._plan.types import MoveSource, PieceRef
from filecord.errors import ChangeKind, DataChangedError

log = logging.getLogger(__name__)

SEGMENT = 256 << 20  # one copy_file_range call; also the progress granularity
BUFFER = 8 << 20
# A move copies a window in parts of at most this size and, each time this many bytes have been
# copied and more of the window is left, starts their writeback (``start_writeback``, one call
# per temp over the range copied since the last), so the disk writes while the rest of the
# window is read and copied, and the window's fsync waits for little more than the last part.
# A window of at most this size makes no such call.  0: one copy per piece, no hint.
# bench/consume_window.py measures it against 0 in the same run (docs/benchmarks.md).
WRITE_BEHIND = 16 << 20

_CFR_FALLBACK = frozenset(
    {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF, errno.ETXTBSY}
)

Progress = Callable[[int], None]
Tally = Literal["copied", "moved", "restored"]


@dataclass
class Counters:
    """Per-save mutable state: the fsync and byte tallies, and the one reused copy buffer.

    The byte tallies count what filecord asked of the kernel: ``copied`` file-backed bytes
    copied into outputs (``copy_file_range`` or read/write), ``cloned`` bytes whose extents
    were shared, ``written`` in-memory bytes, ``moved`` bytes copied window by window and then
    cut from their source, ``restored`` bytes a rollback put back.
    """

    fsyncs: int = 0
    copied: int = 0
    cloned: int = 0
    written: int = 0
    moved: int = 0
    restored: int = 0
    _buf: memoryview | None = field(default=None, repr=False)

    def tally(self, kind: Tally, n: int) -> None:
        setattr(self, kind, getattr(self, kind) + n)

    def buffer(self) -> memoryview:
        if self._buf is None:
            self._buf = memoryview(bytearray(BUFFER))
        return self._buf

    def fsync(self, fd: int) -> None:
        _sys.fsync(fd)
        self.fsyncs += 1


def _nop(_n: int) -> None:
    return None


def _buffered_copy(
    src: int, dst: int, src_off: int, dst_off: int | None, n: int, c: Counters, progress: Progress
) -> None:
    buf = c.buffer()
    done = 0
    while done < n:
        view = buf[: min(len(buf), n - done)]
        got = _sys.preadinto(src, view, src_off + done)
        if got <= 0:
            raise OSError(errno.EIO, f"source ended {n - done} bytes early at {src_off + done}")
        _sys.write_all(dst, view[:got], None if dst_off is None else dst_off + done)
        done += got
        progress(got)


def copy_range(
    src: int, dst: int, src_off: int, dst_off: int, n: int, c: Counters,
    progress: Progress = _nop, *, kind: Tally = "copied",
) -> None:
    """Copy ``n`` bytes between two regular files at the given offsets, completely.

    ``kind`` names the tally the bytes count in (a move's and a rollback's copies are not
    copies of the save)."""
    done = 0
    while done < n:
        try:
            got = _sys.copy_file_range(
                src, dst, min(SEGMENT, n - done), src_off + done, dst_off + done
            )
        except OSError as exc:
            if exc.errno not in _CFR_FALLBACK:
                raise
            got = 0
        if got <= 0:
            # Refused, or 0 at a place that should have data: finish through the buffer, which
            # raises EIO on a real premature end of file.
            _buffered_copy(src, dst, src_off + done, dst_off + done, n - done, c, progress)
            break
        done += got
        progress(got)
    c.tally(kind, n)  # counted once complete: a failed copy raises and the save is undone


def copy_to_stream(
    src: int, dst: int, src_off: int, n: int, c: Counters, progress: Progress = _nop
) -> None:
    """Append ``n`` bytes to a stream (pipe, device, O_APPEND file): sendfile, else read/write."""
    done = 0
    while done < n:
        try:
            got = _sys.sendfile(dst, src, src_off + done, min(SEGMENT, n - done))
        except OSError as exc:
            if exc.errno not in _CFR_FALLBACK:
                raise
            got = 0
        if got <= 0:
            _buffered_copy(src, dst, src_off + done, None, n - done, c, progress)
            break
        done += got
        progress(got)
    c.copied += n


def write_bytes(
    dst: int, data: memoryview, dst_off: int | None, c: Counters, progress: Progress = _nop
) -> None:
    """Write an in-memory piece in bounded slices (so progress moves and no slice is huge)."""
    c.written += len(data)
    for start in range(0, len(data), BUFFER):
        part = data[start : start + BUFFER]
        _sys.write_all(dst, part, None if dst_off is None else dst_off + start)
        progress(len(part))


def clone(src: int, src_off: int, n: int, dst: int, dst_off: int, c: Counters) -> None:
    """Share ``n`` bytes' extents (raises OSError when the file system refuses).

    A range that ends unaligned must end at the source's end and reach the destination's end
    (the kernel refuses a partial EOF block cloned into the middle of a file, EINVAL)."""
    if n <= 0:  # FICLONERANGE takes a length of 0 as "to the source's end": never ask that
        return
    _sys.clone_range(src, src_off, n, dst, dst_off)
    c.cloned += n


def move_source(
    src: int,
    m: MoveSource,
    temps: Sequence[int],
    window: int,
    c: Counters,
    progress: Progress = _nop,
    *,
    seen: os.stat_result | None = None,
    looks: dict[tuple[int, int], tuple[os.stat_result, int | None]] | None = None,
    log_cut: Callable[[int], None] = _nop,
) -> None:
    """Move ``m``'s run into the temps, shortening the source one window at a time.

    ``log_cut(lo)`` makes the cut about to happen durable in the journal (its ``cut`` step),
    after the window's fsync in the temps and before the truncate: recover reads how far the
    move got from the log, never infers it from the source's size.

    ``looks[m.key]`` is kept as the last look at the source and the size a truncate in
    flight leaves, so whoever cleans up after a failure can tell the save's cut from anyone
    else's change.

    ``temps[i]`` is the open temp file of output ``i``.  ``seen`` is the caller's checked look
    at the source (its size ``m.size`` and its captured times): every later look is compared
    with it, so nothing can change unseen between the check and the move.
    """
    buckets = _by_window(m, window)
    if seen is None:
        seen = _sys.fstat(src)
    pos, k = m.size, 0
    while pos > m.run_start:
        lo = max(m.run_start, pos - window)
        parts = [(max(d.src_offset, lo), min(d.src_offset + d.length, pos), d)
                 for d in buckets.get(k, ())]
        try:
            touched = _copy_window(src, [(a, b, d) for a, b, d in parts if a < b], temps, c)
        except OSError as exc:
            _check_unchanged(src, m, pos, seen, exc)
            raise
        if lo > m.run_start:  # read the next window while this one's fsync writes
            _sys.prefetch(src, max(m.run_start, lo - window), lo - max(m.run_start, lo - window))
        for fd in sorted(touched):
            c.fsync(fd)  # raises on failure: the truncate below never runs after a bad fsync
        log_cut(lo)  # before the check: nothing but the check may stand before the cut
        _check_unchanged(src, m, pos, seen, None)
        seen = _cut(src, m, lo, seen, looks)
        progress(pos - lo)
        pos, k = lo, k + 1


def _copy_window(src: int, parts: Sequence[tuple[int, int, PieceRef]], temps: Sequence[int],
                 c: Counters) -> set[int]:
    """Copy one window's ``(start, end, destination)`` parts; the temps written.  The
    writeback of every ``WRITE_BEHIND`` bytes copied is started while more are left."""
    touched: set[int] = set()
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
                # a part's worth copied and more to come: the disk writes it meanwhile
                for fd, (p, q) in sorted(behind.items()):
                    _sys.start_writeback(fd, p, q - p)
                behind, since = {}, 0
        touched.add(tfd)
    return touched


def _cut(src: int, m: MoveSource, lo: int, seen: os.stat_result,
         looks: dict[tuple[int, int], tuple[os.stat_result, int | None]] | None
         ) -> os.stat_result:
    """Truncate the source to ``lo`` (its window durable in the temps); the look after.  The
    size in flight is kept in ``looks`` first, so a failure can tell this cut from a change."""
    if looks is not None:
        looks[m.key] = (seen, lo)
    _sys.ftruncate(src, lo)
    seen = _sys.fstat(src)
    if looks is not None:
        looks[m.key] = (seen, None)
    if seen.st_nlink != 1:
        # Linked between the check and the truncate: the other name now holds only the
        # kept prefix.  Stop before the commit deletes the rest; the journal and temps
        # hold every byte, and a rollback puts them back into the shared inode.
        raise DataChangedError(m.path, expected_size=lo, found_size=seen.st_size,
                               reason="another name was linked to it while it was being "
                               "moved", kind=ChangeKind.LINKED)
    return seen


def _by_window(m: MoveSource, window: int) -> dict[int, list[PieceRef]]:
    """The destinations meeting each window (window 0 ends at ``m.size``), so a move of N
    pieces in W windows costs O(N + W) lookups, not O(N * W)."""
    buckets: dict[int, list[PieceRef]] = {}
    for d in m.dests:
        if d.length <= 0:
            continue
        first = (m.size - (d.src_offset + d.length)) // window
        last = (m.size - d.src_offset - 1) // window
        for k in range(first, last + 1):
            buckets.setdefault(k, []).append(d)
    return buckets


# The reason of a DataChangedError for a change of ctime alone (chmod, chown, chattr), whose
# kind is ChangeKind.METADATA: no byte changed as far as a stat can tell, so the save stops but
# its journal is not held, and ``recover`` may roll it back (a rewrite that keeps size and
# mtime is not seen either way).
METADATA_ONLY = ("only its change time moved (a chmod, chown or chattr?): no byte changed as "
                 "far as size and modification time tell")


def _check_unchanged(
    src: int, m: MoveSource, pos: int, seen: os.stat_result, cause: OSError | None
) -> None:
    """Raise DataChangedError unless the source is as the last truncate left it: that length,
    one name, and no write since (modification and change times as they were then).

    Someone else appended, truncated, rewrote or linked it: truncating now would lose their
    bytes (or empty their link), and a later put-back would fill a gap with whatever the temps
    hold there.
    """
    now = _sys.fstat(src)
    why, kind = None, ChangeKind.CONTENT
    if now.st_size != pos:
        why = "another process changed its size while it was being moved"
    elif now.st_nlink != 1:
        why, kind = "another name was linked to it while it was being moved", ChangeKind.LINKED
    elif now.st_mtime_ns != seen.st_mtime_ns:
        why = "another process wrote to it while it was being moved"
    elif now.st_ctime_ns != seen.st_ctime_ns:
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
    punch: bool,
    dense: bool = False,
) -> int:
    """Put back the bytes a move took from ``src``; returns how many were restored.

    Works from the source's current size up, so it is idempotent and resumable: rerun after a
    crash, it continues where the size says.  ``temps[i]`` may be None for outputs that hold no
    bytes of this source.  With ``dense`` (the source had no holes), a hole in a temp where
    moved bytes should be proves they were never moved (someone shortened the source since):
    ``DataChangedError``, before anything is written.  File systems without ``SEEK_HOLE``
    report no holes, and the check passes.
    """
    start = _sys.fstat(src).st_size
    if start > m.size:
        raise OSError(errno.EIO, f"{m.path} is longer ({start}) than recorded ({m.size})")
    if start < m.run_start:
        raise OSError(
            errno.EIO, f"{m.path} is shorter ({start}) than the journal allows ({m.run_start})"
        )
    pos = start
    pending = cover(m.dests, start, m.size) if start < m.size else []
    i = 0
    while pos < m.size:
        hi = min(m.size, pos + window)
        segs: list[tuple[int, int, PieceRef]] = []
        while i < len(pending) and pending[i][0] < hi:  # one sweep over the cover, clipped
            a, b, d = pending[i]
            segs.append((a, min(b, hi), d))
            if b > hi:
                pending[i] = (hi, b, d)
                break
            i += 1
        _restore_window(src, m, segs, temps, c, punch=punch, dense=dense)
        pos = hi
    return m.size - start


def _restore_window(src: int, m: MoveSource, segs: Sequence[tuple[int, int, PieceRef]],
                    temps: Sequence[int | None], c: Counters, *, punch: bool,
                    dense: bool) -> None:
    """One window's segments copied back into the source, fsynced, then (``punch``) let go
    of in the temps.  Every temp is checked before a byte is written."""
    held: list[tuple[int, int, int, int]] = []  # (temp, offset there, source offset, length)
    for a, b, d in segs:
        tfd = temps[d.output]
        if tfd is None:
            raise OSError(errno.ENOENT, f"the temp file holding {m.path}[{a}:{b}] is missing")
        if dense:
            _check_holds_data(tfd, d.out_offset + (a - d.src_offset), b - a, m, a)
        held.append((tfd, d.out_offset + (a - d.src_offset), a, b - a))
    for tfd, at, a, n in held:
        copy_range(tfd, src, at, a, n, c, kind="restored")
    c.fsync(src)  # the bytes are durable in the source before any temp lets go of them
    if punch:
        for tfd, at, _a, n in held:
            _punch_best_effort(tfd, at, n)


def _check_holds_data(fd: int, offset: int, n: int, m: MoveSource, src_at: int) -> None:
    try:
        hole = _sys.lseek(fd, offset, getattr(os, "SEEK_HOLE", 4))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENXIO, errno.EOPNOTSUPP):
            return
        raise
    if hole < offset + n:
        raise DataChangedError(
            m.path, expected_size=m.size, found_size=src_at,
            reason=f"the temp holds no data for its bytes from {src_at + hole - offset} on: "
            "they were never moved, so the source was shortened by someone else",
        )


def _punch_best_effort(fd: int, offset: int, length: int) -> None:
    # Freeing the temp's copy early only saves disk; the temp is unlinked right after the
    # rollback, so a refusal (EOPNOTSUPP on file systems without holes) changes nothing durable.
    try:
        _sys.punch_hole(fd, offset, length)
    except OSError as exc:
        log.debug("punch_hole refused (%s); the temp keeps its copy until it is removed", exc)
