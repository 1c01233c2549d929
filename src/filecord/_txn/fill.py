"""Stages CREATED and FILLED: the temps, and every byte that is not moved.

Theory of operation
-------------------
Each temp ``.NAME.TOKEN.partial`` is created ``O_CREAT|O_EXCL`` with the replaced file's
permission bits (a discard output's: 0600), never readable beyond the old file.  Pieces are
written, computed (derived: their sources read while whole), cloned or copied at their final
offsets in output order (the kernel clones a partial EOF block only at the temp's end); an
output a source is adopted into is filled after the adoption, around it.  Nothing here
shortens a source: undoing it is deleting the temp.  Each source is compared (size, mtime,
ctime) with itself as opened once the output's last bytes from it are copied: a rewrite during
the copy is a ``DataChangedError``, never a silent mix.  Then the temps get the replaced file's
owner and exact mode (set-id bits on complete content).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass, replace

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord._plan.facts import is_clone_refusal
from filecord._plan.types import BLOCK, CLONE_REFUSED, PAST_TAIL, PieceAction, SavePlan
from filecord._txn import transfer, undo
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import DataChangedError, SaveError

log = logging.getLogger(__name__)


def create_outputs(txn: Txn) -> None:
    for out, st in zip(txn.prep.plan.outputs, txn.prep.facts.target_stats, strict=True):
        temp = None if out.direct else _names.sibling(out.target, txn.token, _names.TEMP)
        mode = (0o600 if out.discard else 0o666 if st is None
                else stat_mod.S_IMODE(st.st_mode) & 0o777)
        txn.fds.append(_sys.open(out.target, os.O_WRONLY) if temp is None
                       else _sys.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode))
        txn.temps.append(temp)


def presize(txn: Txn, o: int) -> None:
    """Output ``o``'s temp at its final length (a hole) before moved bytes land: moves write
    from the end backwards, and XFS keeps the speculative space of each extending write
    (measured: 2.3 MiB beyond the data for 40 runs of 1 MiB), so the peak stays one window."""
    fd, length = txn.fds[o], txn.prep.plan.outputs[o].length
    if fd is not None and _sys.fstat(fd).st_size < length:
        _sys.ftruncate(fd, length)


def block_of(p: SavePlan, dev: int) -> int:
    return next((k.block for k in p.peaks if k.dev == dev), 0) or BLOCK


def finish_modes(txn: Txn) -> None:
    for o, (fd, st) in enumerate(zip(txn.fds, txn.prep.facts.target_stats, strict=True)):
        if fd is None or st is None or txn.temps[o] is None or o in txn.prep.plan.adopted:
            continue
        undo.apply_owner_mode(fd, st.st_mode, st.st_uid, st.st_gid)


# Source descriptors a fill keeps open at once (a merge of 600 shards under `ulimit -n 256`
# failed with EMFILE): past it the oldest is closed.  Every source is looked at after its
# bytes are copied, so one closed is opened again and compared then.
OPEN_SOURCES = 64


def _source_fd(txn: Txn, data: FileBackedData) -> int:
    """Its descriptor, the file held to the plan's look and to itself as first opened."""
    ident = data.identity
    key = (ident.dev, ident.ino)
    fd = txn.src_fds.get(key)
    if fd is not None:
        return fd
    if len(txn.src_fds) >= OPEN_SOURCES:
        _sys.close(txn.src_fds.pop(next(iter(txn.src_fds))))
    fd = _open_source(txn, data)
    try:
        st = _sys.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (ident.size, ident.mtime_ns):
            raise DataChangedError(data.path, expected_size=ident.size, found_size=st.st_size,
                                   reason="another process changed it as it was opened")
        _compare(data, txn.src_seen.setdefault(key, st), st)
    except BaseException:
        _sys.close(fd)
        raise
    txn.src_fds[key] = fd
    return fd


def _open_source(txn: Txn, data: FileBackedData) -> int:
    """A source checked through its descriptor; read at its parked name when an output built
    around an adopted file is filled after the parking (a source copied, not moved)."""
    ident, record = data.identity, txn.record
    s = None if record is None else record.by_key().get((ident.dev, ident.ino))
    if record is None or s is None or s.adopt or txn.stage is not Stage.MOVING:
        return data.open_checked()
    parked = record.parked(s)
    try:
        fd = _sys.open(parked, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise DataChangedError(parked, expected_size=ident.size, found_size=None,
                               reason="the parked source is gone") from None
    st = _sys.fstat(fd)
    if (st.st_dev, st.st_ino) != (ident.dev, ident.ino):
        _sys.close(fd)
        raise DataChangedError(parked, expected_size=ident.size, found_size=st.st_size,
                               reason="the parked name now holds another file")
    return fd


def _compare(data: FileBackedData, was: os.stat_result, now: os.stat_result) -> None:
    for what in ("st_size", "st_mtime_ns", "st_ctime_ns"):
        if getattr(now, what) != getattr(was, what):
            raise DataChangedError(
                data.path, expected_size=was.st_size, found_size=now.st_size,
                reason=f"another process changed it while it was copied ({what[3:]} differs)",
            )


def _recheck_source(txn: Txn, data: FileBackedData) -> None:
    """The source must be the file it was when first opened; reopened if closed meanwhile."""
    fd = _source_fd(txn, data)
    _compare(data, txn.src_seen[(data.identity.dev, data.identity.ino)], _sys.fstat(fd))


@contextlib.contextmanager
def _as_change(txn: Txn, *datas: FileBackedData) -> Iterator[None]:
    """A copy that failed because its source shrank (EIO at an early end) is that change."""
    try:
        yield
    except OSError:
        for d in datas:
            if (d.identity.dev, d.identity.ino) in txn.src_fds:
                _recheck_source(txn, d)
        raise


def fill_output(txn: Txn, o: int) -> None:
    """Output ``o``'s pieces that are not moved nor adopted, at their final offsets.  Pieces
    adjacent in their source and in the output are one copy; each source of the plain copies
    is looked at once, after its last (rows from two shards: two looks, not one per row)."""
    p = txn.prep.plan
    out, pieces = p.outputs[o], txn.prep.facts.cords[o].pieces  # a property: built once here
    fd = txn.fds[o]
    if fd is None:
        raise SaveError(f"{out.path}: output descriptor missing")
    runs: list[_Run] = []  # copies not made yet: adjacent ones join (building them calls nothing)
    copied: dict[tuple[int, int], FileBackedData] = {}  # sources of the runs copied
    for pos in p.actions.positions(o):
        r = p.actions.refs[pos]
        action = p.actions.action_of(pos)
        if action in ("moved", "adopted"):
            continue
        piece = pieces[r.index]
        dst_off = None if out.direct else r.out_offset  # None: append to a stream
        if isinstance(piece, FileRows) or (isinstance(piece, FileBackedData)
                                           and action == "copied"):
            base, spans = ((piece.base, list(piece.runs())) if isinstance(piece, FileRows)
                           else (piece, [(piece.offset, r.length)]))
            for src_off, n in spans:
                if not (runs and runs[-1].extends(base, src_off, dst_off)):
                    runs.append(_Run(base, src_off, dst_off, 0))
                runs[-1].n += n
                dst_off = None if dst_off is None else dst_off + n
            continue
        _copy_runs(txn, fd, runs, copied)
        if isinstance(piece, Derived):
            _compute_piece(txn, piece, fd, dst_off)
        elif not isinstance(piece, FileBackedData):
            transfer.write_bytes(fd, piece, dst_off, txn.counters, txn.advance)
        else:
            planned = p.actions.piece_action(pos)
            with _as_change(txn, piece):
                done = _clone_or_copy(txn, piece, fd, planned)
            _recheck_source(txn, piece)
            if done != planned:
                txn.outcomes[pos] = done
    _copy_runs(txn, fd, runs, copied)
    for data in copied.values():
        _recheck_source(txn, data)
    if not out.direct:
        txn.dirty.add(fd)


def _compute_piece(txn: Txn, piece: Derived, fd: int, dst_off: int | None) -> None:
    """A derived piece a chunk at a time, its sources read through the checked descriptors
    (the fill comes before any source is parked or cut) and looked at after."""
    def read(r: FileBackedData, start: int, n: int) -> bytes:
        return _sys.read_all(_source_fd(txn, r), r.offset + start, n)

    pos = dst_off
    with _as_change(txn, *piece.sources):
        for out in piece.chunks(read):
            transfer.write_bytes(fd, out, pos, txn.counters, txn.advance)
            if pos is not None:
                pos += len(out)
    for r in piece.sources:
        _recheck_source(txn, r)


@dataclass(slots=True)
class _Run:
    """Bytes of one source to copy in one call: ``n`` from ``src_off`` to ``dst_off``."""

    data: FileBackedData  # the first piece: its file and the identity every read checks
    src_off: int
    dst_off: int | None  # None: appended to a stream
    n: int

    def extends(self, data: FileBackedData, src_off: int, dst_off: int | None) -> bool:
        d = self.data
        # (one output's offsets are all None, a stream, or none is)
        return (src_off == self.src_off + self.n
                and (data.identity is d.identity or data.identity == d.identity)
                and data.path == d.path
                and (dst_off is None or dst_off == (self.dst_off or 0) + self.n))


def _copy_runs(txn: Txn, fd: int, runs: list[_Run],
               copied: dict[tuple[int, int], FileBackedData]) -> None:
    for run in runs:
        src = _source_fd(txn, run.data)
        with _as_change(txn, run.data):
            transfer.copy_range(src, fd, run.src_off, run.dst_off, run.n, txn.counters,
                                txn.advance)
        copied.setdefault((run.data.identity.dev, run.data.identity.ino), run.data)
    runs.clear()


def _clone_or_copy(txn: Txn, piece: FileBackedData, fd: int, act: PieceAction) -> PieceAction:
    """Clone the aligned body (and the partial EOF block where the plan said so), copy the
    tail; copy it all where the file system refuses.  A temp already longer than the piece's
    end (presized by someone) cannot take a partial block: it is copied, with the reason."""
    src = _source_fd(txn, piece)
    n = len(piece)
    tail, why = act.tail, act.tail_reason
    block = block_of(txn.prep.plan, piece.identity.dev)
    if tail == 0 and n % block and _sys.fstat(fd).st_size > act.out_offset + n:
        tail, why = n % block, PAST_TAIL
    body = n - tail
    try:  # (a length of 0 is "to the source's end" to FICLONERANGE: never asked)
        if body > 0:  # an unaligned end must be the source's and reach the temp's (else EINVAL)
            _sys.clone_range(src, piece.offset, body, fd, act.out_offset)
            txn.counters.cloned += body
    except OSError as exc:
        if not is_clone_refusal(exc):
            raise
        log.info("clone of %s refused (%s); copying", piece.path, exc)
        transfer.copy_range(src, fd, piece.offset, act.out_offset, n, txn.counters, txn.advance)
        return replace(act, action="copied", tail=0, tail_reason=None,
                       reason=CLONE_REFUSED if txn.prep.plan.consume else None)
    txn.advance(body)
    if tail:  # under one block, from a source never shortened: no journal needed
        transfer.copy_range(src, fd, piece.offset + body, act.out_offset + body, tail,
                            txn.counters, txn.advance)
    if not body:
        return replace(act, action="copied", reason=why if txn.prep.plan.consume else None)
    return replace(act, tail=tail, tail_reason=why)
