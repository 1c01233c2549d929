"""The save transaction: preflight, temp files, copy/clone, journal, move, commit, or undo.

Theory of operation
-------------------
1. Preflight (``preflight.py``): every source still holds its bytes, no output is a source, the
   directories exist and are writable, the predicted peak fits.  Nothing exists yet, so a
   refusal leaves nothing behind.
2. Temps ``.NAME.TOKEN.partial`` are created ``O_CREAT|O_EXCL`` beside each final name (mode of
   a new file, or the replaced file's mode).  A crash from here to step 4 leaves only temps,
   which are garbage: the final names and the sources are untouched.
3. In-memory pieces are written and file-backed pieces cloned or copied at their offsets.
4. A journal ``.NAME.TOKEN.filecord-journal`` is written, fsynced, and its directory fsynced,
   when the save moves or consumes sources or has several outputs.  From here a crash is
   finished by ``recover``: it rolls back (uncommitted) or completes (committed).
5. Moves (``transfer.move_source``): per window copy, fsync the temps, then truncate the
   source.  The sources' sizes are the progress record.
6. Commit: fsync the temps, append the commit line to the journal and fsync it (the commit
   point), rename every temp onto its final name, fsync the directories, delete the consumed
   sources (and fsync their directories), delete the journal.  Without a journal the single
   rename is the commit point.
7. Failure before the commit point: moved bytes are put back (``transfer.restore_source``:
   copy back, fsync the source, then release the temp's copy), the sources' times restored,
   temps and journal removed, and the error raised with a note that the save can be retried.
   If that rollback fails, the journal stays and the error names it.  After the commit point
   the outputs are complete in the temps or under their names; the error names the journal
   that ``recover`` uses to finish.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat as stat_mod
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from filecord import _sys, journal, transfer
from filecord._rollback import fail as _fail
from filecord.cord import Cord
from filecord.data import FileBackedData
from filecord.errors import FilecordError, SaveError, add_note
from filecord.facts import is_clone_refusal
from filecord.plan import CLONE_REFUSED, DEFAULT_WINDOW, MoveSource, PieceAction
from filecord.preflight import CordLike, Prepared, Target, check_space, normalize, prepare
from filecord.report import SaveReport

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class _Txn:
    """Mutable state of one running save (what exists, so failure knows what to undo)."""

    prep: Prepared
    token: str
    progress: ProgressCallback | None
    fds: list[int | None] = field(default_factory=list)
    temps: list[str | None] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)
    src_fds: dict[tuple[int, int], int] = field(default_factory=dict)
    started: list[tuple[MoveSource, int]] = field(default_factory=list)
    journal_path: str | None = None
    committed: bool = False
    done: int = 0
    counters: transfer.Counters = field(default_factory=transfer.Counters)
    actions: list[PieceAction] = field(default_factory=list)
    renamed: list[int] = field(default_factory=list)
    times: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    def advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.prep.plan.total_bytes)


def save(
    path: Target,
    cord: CordLike,
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """Write ``cord`` to ``path`` atomically and durably; see :func:`save_many`."""
    return _run(normalize(path, cord), consume=consume, window=window, progress=progress)


def save_many(
    outputs: Mapping[Target, CordLike],
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """Write several files in one transaction: all final names change only after all are done.

    With ``consume=True`` owned file-backed pieces are moved (or cloned) into the outputs and
    the owned source files are deleted at commit.  On any failure a ``SaveError`` (an
    ``OSError``) or ``DataChangedError`` is raised: before the commit point the final names and
    the sources are as they were and the save can be retried; after it, the error names the
    journal that ``filecord recover`` finishes.  ``progress(done, total)`` is called as bytes
    land.  A final name that is not a regular file (FIFO, device) is streamed into directly,
    without atomicity.
    """
    return _run(normalize(outputs, None), consume=consume, window=window, progress=progress)


def plan(
    target: Target | Mapping[Target, CordLike],
    cord: CordLike | None = None,
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
) -> SaveReport:
    """A dry run: what ``save``/``save_many`` with these arguments would do to each piece, and why.

    Nothing is written.  ``report.peaks`` says per file system whether the save would fit.
    """
    prep = prepare(normalize(target, cord), consume=consume, window=window)
    return _report(prep, prep.plan.actions, dry_run=True)


def _report(
    prep: Prepared, actions: tuple[PieceAction, ...] | list[PieceAction], *, dry_run: bool,
    elapsed: float = 0.0, fsyncs: int = 0, used_journal: bool = False,
) -> SaveReport:
    p = prep.plan
    return SaveReport(
        outputs=tuple(o.path for o in p.outputs),
        sizes=tuple(o.length for o in p.outputs),
        actions=tuple(actions),
        peaks=p.peaks,
        consume=p.consume,
        window=p.window,
        dry_run=dry_run,
        elapsed_s=elapsed,
        fsyncs=fsyncs,
        journal=used_journal,
    )


def _needs_journal(prep: Prepared) -> bool:
    p = prep.plan
    # Direct outputs are never renamed: only several renames need a journal to finish them.
    return bool(p.moves or p.consumed) or sum(not o.direct for o in p.outputs) > 1


def _run(
    items: list[tuple[str, Cord]],
    *,
    consume: bool,
    window: int,
    progress: ProgressCallback | None,
) -> SaveReport:
    start = time.perf_counter()
    try:
        prep = prepare(items, consume=consume, window=window)
        check_space(prep.plan)
    except OSError as exc:
        if isinstance(exc, FilecordError):
            raise
        # A system call of the preflight failed (stat, statvfs, ...): still a SaveError, as
        # documented, and nothing exists yet to clean up.
        names = ", ".join(p for p, _c in items)
        err = SaveError(f"saving {names} failed: {exc.strerror or exc}", errno=exc.errno)
        add_note(err, "nothing was created or changed: the save can be retried")
        raise err from exc
    txn = _Txn(prep, secrets.token_hex(6), progress)
    try:
        _execute(txn)
    except BaseException as exc:
        _fail(txn, exc)
        raise  # _fail raises; this keeps the original traceback if it ever returns
    if consume and any(a.reason for a in txn.actions):
        reasons = {a.reason for a in txn.actions if a.reason}
        log.warning(
            "consume=True copied %d file-backed piece(s) instead of moving them: %s",
            sum(1 for a in txn.actions if a.reason), "; ".join(sorted(reasons)),
        )
    return _report(
        prep, txn.actions, dry_run=False, elapsed=time.perf_counter() - start,
        fsyncs=txn.counters.fsyncs, used_journal=txn.journal_path is not None,
    )


def _execute(txn: _Txn) -> None:
    p = txn.prep.plan
    _create_outputs(txn)
    _fill(txn)
    if _needs_journal(txn.prep):
        _write_journal(txn)
    _presize_for_moves(txn)
    for m in p.moves:
        _move(txn, m)
    _commit(txn)


def _presize_for_moves(txn: _Txn) -> None:
    """Give every temp that receives moved bytes its final length (a hole) first.

    Moves write each temp from its end backwards; on XFS each write that extends the file
    reserves speculative space past the new end until close, so a move would hold about two
    windows.  A temp already at its final length is never extended, so the peak stays at
    one window on every file system.
    """
    p = txn.prep.plan
    for o in sorted({d.output for m in p.moves if not m.adopt for d in m.dests}):
        fd = txn.fds[o]
        if fd is not None and _sys.fstat(fd).st_size < p.outputs[o].length:
            _sys.ftruncate(fd, p.outputs[o].length)


def _create_outputs(txn: _Txn) -> None:
    for out, st in zip(txn.prep.plan.outputs, txn.prep.target_stats, strict=True):
        if out.direct:
            txn.temps.append(None)
            txn.fds.append(_sys.open(out.target, os.O_WRONLY))
            continue
        directory, name = os.path.split(out.target)
        temp = os.path.join(directory, f".{name}.{txn.token}{journal.TEMP_SUFFIX}")
        fd = _sys.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        txn.temps.append(temp)
        txn.fds.append(fd)
        if st is not None:
            _sys.fchmod(fd, stat_mod.S_IMODE(st.st_mode))


def _source_fd(txn: _Txn, data: FileBackedData) -> int:
    ident = data.identity
    key = (ident.dev, ident.ino)
    if key not in txn.src_fds:
        txn.src_fds[key] = data.open_checked()
    return txn.src_fds[key]


def _fill(txn: _Txn) -> None:
    """Step 3: everything that is not moved, at its final offset."""
    p = txn.prep.plan
    by_piece = {(a.output, a.index): a for a in p.actions}
    for o, (out, cord) in enumerate(zip(p.outputs, txn.prep.cords, strict=True)):
        fd = txn.fds[o]
        if fd is None:
            raise SaveError(f"{out.path}: output descriptor missing")
        for i, piece in enumerate(cord.pieces):
            act = by_piece[(out.path, i)]
            dst_off = None if out.direct else act.out_offset  # None: append to a stream
            if act.action == "moved":
                txn.actions.append(act)
                continue
            if not isinstance(piece, FileBackedData):
                transfer.write_bytes(fd, piece, dst_off, txn.counters, txn.advance)
            elif dst_off is None:
                src = _source_fd(txn, piece)
                transfer.copy_to_stream(src, fd, piece.offset, len(piece), txn.counters,
                                        txn.advance)
            elif act.action == "cloned":
                act = _clone_or_copy(txn, piece, fd, act)
            else:
                src = _source_fd(txn, piece)
                transfer.copy_range(src, fd, piece.offset, dst_off, len(piece), txn.counters,
                                    txn.advance)
            txn.actions.append(act)
        if not out.direct:
            txn.dirty.add(fd)


def _clone_or_copy(txn: _Txn, piece: FileBackedData, fd: int, act: PieceAction) -> PieceAction:
    src = _source_fd(txn, piece)
    try:
        transfer.clone(src, piece.offset, len(piece), fd, act.out_offset, txn.counters)
    except OSError as exc:
        if not is_clone_refusal(exc):
            raise
        log.info("clone of %s refused (%s); copying", piece.path, exc)
        transfer.copy_range(src, fd, piece.offset, act.out_offset, len(piece), txn.counters,
                            txn.advance)
        return replace(act, action="copied",
                       reason=CLONE_REFUSED if txn.prep.plan.consume else None)
    txn.advance(len(piece))
    return act


def _write_journal(txn: _Txn) -> None:
    p = txn.prep.plan
    first = next(o for o in p.outputs if not o.direct)
    directory, name = os.path.split(first.target)
    path = os.path.join(directory, f".{name}.{txn.token}{journal.SUFFIX}")
    moves = {m.key: m for m in p.moves}
    sources = []
    for key in sorted(set(moves) | set(p.consumed)):
        data = txn.prep.datas[key][0]
        st = _sys.stat(data.path)
        txn.times[key] = (st.st_atime_ns, st.st_mtime_ns)
        m = moves.get(key)
        sources.append(
            journal.JournalSource(
                path=os.path.abspath(data.path), dev=key[0], ino=key[1], size=st.st_size,
                run_start=m.run_start if m else st.st_size, atime_ns=st.st_atime_ns,
                mtime_ns=st.st_mtime_ns, unlink_at_commit=key in p.consumed,
                dests=m.dests if m else (),
                adopted_to=(txn.temps[m.dests[0].output] or "") if m and m.adopt else "",
            )
        )
    # Direct outputs (no temp) keep their slot with an empty temp so indexes stay aligned.
    outputs = [
        _journal_output(o.target, t, fd, o.length)
        for o, t, fd in zip(p.outputs, txn.temps, txn.fds, strict=True)
    ]
    for m in p.moves:
        if m.adopt:  # the final name will be the adopted source's inode, not the empty temp's
            o = m.dests[0].output
            outputs[o] = replace(outputs[o], dev=m.key[0], ino=m.key[1])
    record = journal.encode(journal.Journal(txn.token, tuple(outputs), tuple(sources)))
    fd = _sys.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    txn.journal_path = path
    try:
        _sys.write_all(fd, record, 0)
        txn.counters.fsync(fd)
    finally:
        _sys.close(fd)
    # The journal's name and every temp's name must be durable before the first truncate:
    # fsyncing a file does not persist its directory entry, so a temp in another directory
    # could vanish in a power cut together with the bytes moved into it.
    txn.counters.fsyncs += _sys.fsync_parents([path, *(t for t in txn.temps if t is not None)])


def _journal_output(
    final: str, temp: str | None, fd: int | None, length: int
) -> journal.JournalOutput:
    if temp is None or fd is None:
        return journal.JournalOutput(final, "")
    st = _sys.fstat(fd)
    return journal.JournalOutput(final, temp, st.st_dev, st.st_ino, length)


def _move(txn: _Txn, m: MoveSource) -> None:
    datas = txn.prep.datas[m.key]
    fd = _sys.open(datas[0].path, os.O_RDWR)
    try:
        st = _sys.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) != (m.key[0], m.key[1], m.size):
            datas[0].check()  # raises DataChangedError with the details
            raise SaveError(f"{m.path} changed during the save")
    except BaseException:
        _sys.close(fd)
        raise
    for d in datas:
        d.detach_cleanup()  # F9: never let a finalizer delete a half-moved source
    if m.adopt:
        _sys.close(fd)
        _adopt(txn, m)
        return
    txn.started.append((m, fd))
    temps = [fd_ if fd_ is not None else -1 for fd_ in txn.fds]
    transfer.move_source(fd, m, temps, txn.prep.plan.window, txn.counters, txn.advance)
    for ref in m.dests:
        txn.dirty.discard(txn.fds[ref.output] or -1)


def _adopt(txn: _Txn, m: MoveSource) -> None:
    """Rename the whole source onto its output's temp: the move of a file that is an output.

    The empty temp claimed the name (O_EXCL) and the journal names both paths, so a crash on
    either side of the rename is undone or finished by ``recover``.  Both directories are
    fsynced so the move is durable before the commit line can be.
    """
    o = m.dests[0].output
    temp = txn.temps[o]
    if temp is None:  # pragma: no cover - the plan adopts only into temps
        raise SaveError(f"{m.path}: no temp to adopt into")
    txn.started.append((m, -1))
    _sys.rename(m.path, temp)
    txn.counters.fsyncs += _sys.fsync_parents([temp, m.path])
    old = txn.fds[o]
    txn.fds[o] = None
    if old is not None:
        _sys.close(old)  # the empty temp's inode, replaced by the rename
    txn.dirty.discard(old if old is not None else -1)
    fd = _sys.open(temp, os.O_RDWR)
    txn.fds[o] = fd
    txn.dirty.add(fd)  # whoever wrote the source may never have synced it


def _commit(txn: _Txn) -> None:
    p = txn.prep.plan
    for o, fd in enumerate(txn.fds):
        if fd is None or p.outputs[o].direct:
            continue
        if fd in txn.dirty:
            txn.counters.fsync(fd)
            txn.dirty.discard(fd)
        size = _sys.fstat(fd).st_size
        if size != p.outputs[o].length:
            raise SaveError(f"{p.outputs[o].path}: temp is {size} bytes, expected "
                            f"{p.outputs[o].length}")
    if txn.journal_path is not None:
        fd = _sys.open(txn.journal_path, os.O_WRONLY)
        try:
            _sys.write_all(fd, journal.COMMIT_LINE, _sys.fstat(fd).st_size)
            txn.counters.fsync(fd)
        finally:
            _sys.close(fd)
        txn.committed = True
    _close_all(txn)
    finals: list[str] = []
    for o, (out, temp) in enumerate(zip(p.outputs, txn.temps, strict=True)):
        if temp is None:
            continue
        _sys.rename(temp, out.target)
        txn.renamed.append(o)
        finals.append(out.target)
    txn.counters.fsyncs += _sys.fsync_parents(finals)
    consumed: list[str] = []
    for key in p.consumed:
        for d in txn.prep.datas[key]:
            d.detach_cleanup()
        consumed.append(txn.prep.datas[key][0].path)
        _sys.unlink_if_same(consumed[-1], *key)
    if txn.journal_path is not None:
        txn.counters.fsyncs += _sys.fsync_parents(consumed)
        _sys.unlink(txn.journal_path)


def close_descriptors(txn: _Txn) -> list[OSError]:
    """Close every descriptor the save holds and forget them; returns the close errors.

    A failed close must not skip the rest: Linux releases a descriptor even when close
    reports an error, so all are closed and the caller decides what an error means.
    """
    fds = [fd for fd in txn.fds if fd is not None] + list(txn.src_fds.values())
    fds += [fd for _m, fd in txn.started if fd >= 0]
    txn.fds = [None] * len(txn.fds)
    txn.src_fds.clear()
    txn.started = [(m, -1) for m, _fd in txn.started]
    return [e for e in map(_close_reporting, fds) if e is not None]


def _close_reporting(fd: int) -> OSError | None:
    try:
        _sys.close(fd)
    except OSError as exc:
        return exc
    return None


def _close_all(txn: _Txn) -> None:
    errors = close_descriptors(txn)
    if errors:
        raise errors[0]

