"""Stages CREATED and FILLED: the temps, and every byte that is not moved.

Theory of operation
-------------------
Each temp ``.NAME.TOKEN.partial`` is created ``O_CREAT|O_EXCL`` with the replaced file's
permission bits (narrowed by the umask), so it is never readable beyond the old file from the
first instant; a discard output's temp (never published) is 0600.  In-memory pieces are
written, derived ones computed (``_pieces.derived``: a chunk of their sources at a time, read
here while every source is still whole) and file-backed ones cloned or copied at their final
offsets, in output order (the kernel clones a source's partial EOF block only at the temp's
end, so temps are not presized before the fill).  An output a source is adopted into is
filled after the adoption, around the source's blocks (``adopt.adopt``).  Clones and copies
never shorten a source, so rolling them back is deleting the temp.  After each file-backed
piece (a run of pieces adjacent in their source and in the output is copied as one, a piece of
rows run by run; the plain copies of one output are looked at once per source, after the
last) the source's size, mtime and ctime are compared with what they were when it was opened,
so a source rewritten during the copy is a ``DataChangedError``, never a silent mix.  Only
then do the temps get the replaced file's owner, group and exact mode (set-id bits last, on
complete content).  A crash here leaves temps that ``recover`` removes once the save's lock is free:
nothing destructive has happened.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mod
from dataclasses import dataclass, replace

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord._plan.facts import is_clone_refusal
from filecord._plan.types import BLOCK, CLONE_REFUSED, PAST_TAIL, PieceAction
from filecord._txn import transfer, undo
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import DataChangedError, SaveError

log = logging.getLogger(__name__)


def create_outputs(txn: Txn) -> None:
    for out, st in zip(txn.prep.plan.outputs, txn.prep.target_stats, strict=True):
        if out.direct:
            txn.temps.append(None)
            txn.fds.append(_sys.open(out.target, os.O_WRONLY))
            continue
        temp = _names.sibling(out.target, txn.token, _names.TEMP)
        # The replaced file's permission bits from the first instant (the umask may narrow
        # them further); set-id bits and the owner only once the content is complete.
        # A discard output holds other files' bytes and is never published: owner only.
        mode = (0o600 if out.discard else 0o666 if st is None
                else stat_mod.S_IMODE(st.st_mode) & 0o777)
        fd = _sys.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        txn.temps.append(temp)
        txn.fds.append(fd)


def finish_modes(txn: Txn) -> None:
    """Give each complete temp the replaced file's owner, group and exact mode."""
    adopted = txn.prep.plan.adopted
    for o, (fd, st) in enumerate(zip(txn.fds, txn.prep.target_stats, strict=True)):
        if fd is None or st is None or txn.temps[o] is None or o in adopted:
            continue
        undo.apply_owner_mode(fd, st.st_mode, st.st_uid, st.st_gid)


# Source descriptors a fill keeps open at once.  A copy into one output looks at each source
# after its last copy, so without a bound a merge of more shards than the descriptor limit
# (600 under `ulimit -n 256`) failed with EMFILE; past the bound the source opened first is
# looked at and closed, and held to the same baseline when it is opened again.
OPEN_SOURCES = 64


def _source_fd(txn: Txn, data: FileBackedData) -> int:
    ident = data.identity
    key = (ident.dev, ident.ino)
    if key not in txn.src_fds:
        if len(txn.src_fds) >= OPEN_SOURCES:
            _close_oldest_source(txn)
        fd = _open_source(txn, data)
        try:
            st = _sys.fstat(fd)
            was = txn.src_closed.pop(key, None)
            # The baseline every later look is compared with must itself be the captured
            # file, or a change between open_checked's look and this one would pass unseen;
            # a source opened again is held to its first baseline, change time included.
            if was is not None:
                _compare(data, was, st)
                st = was
            elif (st.st_size, st.st_mtime_ns) != (ident.size, ident.mtime_ns):
                raise DataChangedError(data.path, expected_size=ident.size,
                                       found_size=st.st_size,
                                       reason="another process changed it as it was opened")
            txn.src_fds[key] = (fd, st)
        except BaseException:
            _sys.close(fd)
            raise
    return txn.src_fds[key][0]


def _open_source(txn: Txn, data: FileBackedData) -> int:
    """Open a source to copy from, checked through the descriptor.  An output built around
    an adopted file is filled after the journal, when every consumed source that is not
    adopted is parked (``begin.park_sources``): one copied there (another hard link, another
    file system) is read at its parked name, never reported gone."""
    ident = data.identity
    record = txn.record
    parked = None if record is None or txn.stage is not Stage.MOVING else next(
        (record.parked(s) for s in record.sources
         if (s.dev, s.ino) == (ident.dev, ident.ino) and not s.adopt), None)
    if parked is None:
        return data.open_checked()
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


def _close_oldest_source(txn: Txn) -> None:
    key = next(iter(txn.src_fds))
    fd, was = txn.src_fds[key]
    now = _sys.fstat(fd)
    del txn.src_fds[key]
    _sys.close(fd)
    txn.src_closed[key] = was
    _compare(txn.prep.datas[key][0], was, now)


def _compare(data: FileBackedData, was: os.stat_result, now: os.stat_result) -> None:
    for what in ("st_size", "st_mtime_ns", "st_ctime_ns"):
        if getattr(now, what) != getattr(was, what):
            raise DataChangedError(
                data.path, expected_size=was.st_size, found_size=now.st_size,
                reason=f"another process changed it while it was copied ({what[3:]} differs)",
            )


def _recheck_source(txn: Txn, data: FileBackedData) -> None:
    """After copying from a source: it must be the file it was when we opened it (F-mix)."""
    _source_fd(txn, data)  # opened again (and compared) if it was closed meanwhile
    fd, was = txn.src_fds[(data.identity.dev, data.identity.ino)]
    _compare(data, was, _sys.fstat(fd))


def fill(txn: Txn) -> None:
    """Everything that is not moved, at its final offset; an output a source is adopted into
    is filled later, around that source, by :func:`fill_output` (``adopt.adopt``).

    Copies are batched: file-backed pieces that follow each other both in their source and
    in the output (slices of one file, in order: one placement of the plan) are one
    ``copy_file_range``, and every source an output's plain copies read is looked at once,
    after the last of them (rows interleaved from two shards: two looks, not one per row).
    The look is the same comparison with the same baseline (the source as it was opened),
    made once the output's last byte from that source is copied: a change at any moment of
    the copies is still there to be seen then (a size or mtime restored by hand still moves
    the ctime), and nothing of the output is final before it.  A piece of rows is its runs,
    copied in order, then one look.
    """
    p = txn.prep.plan
    adopted = p.adopted
    for o in range(len(p.outputs)):
        if o not in adopted:
            fill_output(txn, o)


def fill_output(txn: Txn, o: int) -> None:
    """Output ``o``'s pieces that are not moved (nor adopted), at their final offsets.

    The plan's placements are walked, not the pieces: a run of adjacent slices is one
    placement (``PieceRef.lengths``), copied as one range from its first piece's file."""
    p = txn.prep.plan
    out, cord = p.outputs[o], txn.prep.cords[o]
    fd = txn.fds[o]
    if fd is None:
        raise SaveError(f"{out.path}: output descriptor missing")
    pieces = cord.pieces
    run: _Run | None = None
    copied: dict[tuple[int, int], FileBackedData] = {}  # sources of the runs copied (_copy_run)
    for pos in p.actions.positions(o):
        r = p.actions.refs[pos]
        action = p.actions.action_of(pos)
        if action in ("moved", "adopted"):
            continue
        piece = pieces[r.index]
        if isinstance(piece, FileBackedData) and action == "copied":
            dst_off = None if out.direct else r.out_offset  # None: append to a stream
            if run is not None and run.extends(piece, dst_off):
                run.n += r.length
            else:
                if run is not None:
                    _copy_run(txn, fd, run, copied)
                run = _Run(piece, piece.offset, dst_off, r.length)
            continue
        if run is not None:
            _copy_run(txn, fd, run, copied)
            run = None
        if isinstance(piece, FileRows):
            _copy_rows(txn, piece, fd, None if out.direct else r.out_offset)
        elif isinstance(piece, Derived):
            _compute_piece(txn, piece, fd, None if out.direct else r.out_offset)
        elif not isinstance(piece, FileBackedData):
            dst = None if out.direct else r.out_offset
            transfer.write_bytes(fd, piece, dst, txn.counters, txn.advance)
        else:
            planned = p.actions.piece_action(pos)
            done = _copy_piece(txn, piece, fd, planned)
            if done != planned:
                txn.outcomes[pos] = done
    if run is not None:
        _copy_run(txn, fd, run, copied)
    for data in copied.values():  # one look per source, once its last run is copied
        _recheck_source(txn, data)
    if not out.direct:
        txn.dirty.add(fd)


def _compute_piece(txn: Txn, piece: Derived, fd: int, dst_off: int | None) -> None:
    """Write a derived piece a chunk at a time, reading its sources through the save's checked
    descriptors (before any source is parked or cut: the fill comes first), then prove each
    source did not change meanwhile, as for a copy."""
    def read(r: FileBackedData, start: int, n: int) -> bytes:
        return _sys.read_all(_source_fd(txn, r), r.offset + start, n)

    pos = dst_off
    try:
        for out in piece.chunks(read):
            transfer.write_bytes(fd, out, pos, txn.counters, txn.advance)
            if pos is not None:
                pos += len(out)
    except OSError:
        for r in piece.sources:
            if (r.identity.dev, r.identity.ino) in txn.src_fds:
                _recheck_source(txn, r)
        raise
    for r in piece.sources:
        _recheck_source(txn, r)


@dataclass(slots=True)
class _Run:
    """Bytes of one source to copy in one call: ``n`` from ``src_off`` to ``dst_off``."""

    data: FileBackedData  # the first piece: its file and the identity every read checks
    src_off: int
    dst_off: int | None  # None: appended to a stream
    n: int

    def extends(self, piece: FileBackedData, dst_off: int | None) -> bool:
        """Whether ``piece`` continues this run in its source and in the output."""
        d = self.data
        return (piece.offset == self.src_off + self.n
                and (piece.identity is d.identity or piece.identity == d.identity)
                and piece.path == d.path
                and (dst_off is None) == (self.dst_off is None)
                and (dst_off is None or dst_off == (self.dst_off or 0) + self.n))


def _copy_run(txn: Txn, fd: int, run: _Run, copied: dict[tuple[int, int], FileBackedData]
              ) -> None:
    """Copy a run of adjacent pieces; its source is looked at once the output's last run is
    copied (``copied``: the sources to look at then, by key).

    A copy that fails because the source shrank under it (EIO at an early end of file) is
    reported as the change it is, not as an I/O error.
    """
    src = _source_fd(txn, run.data)
    try:
        if run.dst_off is None:
            transfer.copy_to_stream(src, fd, run.src_off, run.n, txn.counters, txn.advance)
        else:
            transfer.copy_range(src, fd, run.src_off, run.dst_off, run.n, txn.counters,
                                txn.advance)
    except OSError:
        _recheck_source(txn, run.data)
        raise
    ident = run.data.identity
    copied.setdefault((ident.dev, ident.ino), run.data)


def _copy_rows(txn: Txn, rows: FileRows, fd: int, dst_off: int | None) -> None:
    """Copy a piece of rows run by run, in output order, then look at its source once."""
    src = _source_fd(txn, rows.base)
    at = dst_off
    try:
        for src_at, n in rows.runs():
            if at is None:
                transfer.copy_to_stream(src, fd, src_at, n, txn.counters, txn.advance)
            else:
                transfer.copy_range(src, fd, src_at, at, n, txn.counters, txn.advance)
                at += n
    except OSError:
        _recheck_source(txn, rows.base)
        raise
    _recheck_source(txn, rows.base)


def _copy_piece(txn: Txn, piece: FileBackedData, fd: int, act: PieceAction) -> PieceAction:
    """Clone one file-backed piece (the plan said so), then prove its source did not change
    meanwhile."""
    try:
        act = _clone_or_copy(txn, piece, fd, act)
    except OSError:
        if (piece.identity.dev, piece.identity.ino) in txn.src_fds:
            _recheck_source(txn, piece)
        raise
    _recheck_source(txn, piece)
    return act


def _clone_or_copy(txn: Txn, piece: FileBackedData, fd: int, act: PieceAction) -> PieceAction:
    """Clone the piece's aligned body (and its partial EOF block, where the plan said so),
    then copy the tail the plan left to copy; copy all of it if the file system refuses.

    The plan clones a partial last block only for a piece that reaches its source's end, and
    the kernel takes it only where the cloned range reaches the temp's end (EINVAL in the
    middle of a file).  Temps are filled in output order, so the temp is no longer than the
    piece's offset here; should it be (a temp presized by someone), the partial block is
    copied instead, with the reason, rather than refused.
    """
    src = _source_fd(txn, piece)
    n = len(piece)
    tail, why = act.tail, act.tail_reason
    block = next((p.block for p in txn.prep.plan.peaks if p.dev == piece.identity.dev), 0)
    block = block if block > 0 else BLOCK
    if tail == 0 and n % block and _sys.fstat(fd).st_size > act.out_offset + n:
        tail, why = n % block, PAST_TAIL
    body = n - tail
    try:
        if body:  # never a length of 0: FICLONERANGE reads it as "to the source's end"
            transfer.clone(src, piece.offset, body, fd, act.out_offset, txn.counters)
    except OSError as exc:
        if not is_clone_refusal(exc):
            raise
        log.info("clone of %s refused (%s); copying", piece.path, exc)
        transfer.copy_range(src, fd, piece.offset, act.out_offset, n, txn.counters,
                            txn.advance)
        return replace(act, action="copied", tail=0, tail_reason=None,
                       reason=CLONE_REFUSED if txn.prep.plan.consume else None)
    txn.advance(body)
    if tail:
        # Under one block, from a source that is never shortened: the copy needs no journal.
        transfer.copy_range(src, fd, piece.offset + body, act.out_offset + body, tail,
                            txn.counters, txn.advance)
    if not body:
        return replace(act, action="copied", reason=why if txn.prep.plan.consume else None)
    return replace(act, tail=tail, tail_reason=why)
