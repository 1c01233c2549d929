"""The save transaction: preflight, lock, temps, fill, journal, park, move, commit, or undo.

Theory of operation
-------------------
Every file the save creates or renames carries its random token (``_names``); the stage is
held in ``_Txn.stage`` and moves only along ``_stage``'s table.

1. Preflight (``preflight.py``): sources hold their bytes, no output is a source, directories
   exist and are writable, the predicted peak fits.  Nothing exists yet.
2. CREATED: a lock file ``.NAME.TOKEN.filecord-lock`` is created and ``flock``ed in every
   directory that will hold a temp (``_lockfile``), then temps ``.NAME.TOKEN.partial``
   ``O_CREAT|O_EXCL`` with the replaced file's permission bits from the first instant (never
   wider; owner, group and set-id bits are applied once the temp is complete).  A crash here
   leaves garbage that ``recover`` removes once the lock is free.
3. FILLED: in-memory pieces written, file-backed pieces cloned or copied at their offsets; each
   source's size, mtime and ctime are re-checked after its bytes are copied.
4. JOURNALED (when something is moved or consumed, or there are several outputs): the record is
   written to ``.filecord-pending``, fsynced; every directory of the save is fsynced; the file
   is renamed to ``.filecord-journal`` and its directory fsynced.  A crash before the rename
   leaves no journal name, which proves nothing destructive happened.
5. MOVING: every source the save will shorten or delete is renamed to
   ``.NAME.TOKEN.filecord-src`` (its directory fsynced), so nothing but this save's token names
   it while it is incomplete; then adoption renames and moves (``transfer.move_source``: per
   window copy, fsync the temps, check the source is still the size the move left it, truncate).
6. COMMITTED: temps fsynced, the journal renamed to ``.filecord-committed`` and its directory
   fsynced (the commit point; without a journal, the single rename is).  RENAMED: each temp
   renamed onto its final name, directories fsynced; then the parked sources are unlinked, the
   journal, then the lock files.
7. A failure before the commit point is undone by ``_undo.roll_back`` on the live files, after
   the journal is renamed to ``.filecord-rollback`` (a crash then continues the rollback); a
   source another process changed mid-move is never rolled back over: the journal and temps
   stay and the error says where every byte is.  After the commit point nothing is undone; the
   error names the journal ``recover`` finishes.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mod
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from filecord import _lockfile, _names, _sys, _undo, journal, transfer
from filecord._failure import close_descriptors, close_descriptors_quietly
from filecord._failure import fail as _fail
from filecord._stage import Stage, advance
from filecord.cord import Cord
from filecord.data import FileBackedData
from filecord.errors import DataChangedError, FilecordError, SaveError, add_note
from filecord.facts import is_clone_refusal, kernel_path
from filecord.plan import CLONE_REFUSED, DEFAULT_WINDOW, MoveSource, PieceAction
from filecord.preflight import CordLike, Prepared, Target, check_space, normalize, prepare
from filecord.report import SaveReport

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class _Txn:
    """Mutable state of one running save: its stage and the descriptors it holds."""

    prep: Prepared
    token: str
    progress: ProgressCallback | None
    stage: Stage = Stage.CREATED
    fds: list[int | None] = field(default_factory=list)
    temps: list[str | None] = field(default_factory=list)
    locks: list[tuple[str, int]] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)
    src_fds: dict[tuple[int, int], tuple[int, os.stat_result]] = field(default_factory=dict)
    record: journal.Journal | None = None
    journal_path: str | None = None  # the journal's current name, once it has one
    moving: tuple[int, int] | None = None  # the source being moved right now
    durable: bool = True  # False: no fsync of the outputs and their directories (copy only)
    done: int = 0
    counters: transfer.Counters = field(default_factory=transfer.Counters)
    actions: list[PieceAction] = field(default_factory=list)

    def to(self, stage: Stage) -> None:
        self.stage = advance(self.stage, stage)

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
    durable: bool = True,
) -> SaveReport:
    """Write ``cord`` to ``path`` atomically and durably; see :func:`save_many`."""
    return _run(normalize(path, cord), consume=consume, window=window, progress=progress,
                durable=durable)


def save_many(
    outputs: Mapping[Target, CordLike],
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    durable: bool = True,
) -> SaveReport:
    """Write several files in one transaction: all final names change only after all are done.

    With ``consume=True`` owned file-backed pieces are moved (or cloned) into the outputs and
    the owned source files are deleted at commit.  On any failure a ``SaveError`` (an
    ``OSError``) or ``DataChangedError`` is raised: before the commit point the final names and
    the sources are as they were and the save can be retried; after it, the error names the
    journal that ``filecord recover`` finishes.  ``progress(done, total)`` is called as bytes
    land.  A final name that is not a regular file (FIFO, device) is streamed into directly,
    without atomicity.

    ``durable=False`` (copy saves only) skips the fsync of the outputs and their directories:
    readers still see the old file or the whole new one while the machine stays up, but after
    a power loss a new file may be lost or empty.  For iterating on exports, never for the only
    copy of anything; a consuming save is always durable (it refuses ``durable=False``).
    """
    return _run(normalize(outputs, None), consume=consume, window=window, progress=progress,
                durable=durable)


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
    durable: bool = True,
) -> SaveReport:
    if consume and not durable:
        raise ValueError("durable=False is for copy saves only: a consuming save deletes its "
                         "sources, so its outputs must be on disk first")
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
    # A save that is given a scratch file owns its fate from now on: never a finalizer.
    for group in prep.datas.values():
        for d in group:
            d.detach_cleanup()
    txn = _Txn(prep, _names.new_token(), progress, durable=durable)
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
        fsyncs=txn.counters.fsyncs, used_journal=txn.record is not None,
    )


def _execute(txn: _Txn) -> None:
    p = txn.prep.plan
    _lock_directories(txn)
    _create_outputs(txn)
    _fill(txn)
    txn.to(Stage.FILLED)
    _finish_modes(txn)
    if _needs_journal(txn.prep):
        _write_journal(txn)
        _park_sources(txn)
    _presize_for_moves(txn)
    for m in p.moves:
        _move(txn, m)
    _commit(txn)


def _journal_name(txn: _Txn, suffix: str) -> str:
    first = next(o for o in txn.prep.plan.outputs if not o.direct)
    return _names.sibling(first.target, txn.token, suffix)


def _lock_directories(txn: _Txn) -> None:
    """One locked lock file per directory that will hold a temp, before any temp exists."""
    outs = [o for o in txn.prep.plan.outputs if not o.direct]
    if not outs:
        return
    content = os.fsencode(_journal_name(txn, _names.JOURNAL)) + b"\n"
    firsts = {os.path.dirname(o.target): o.target for o in reversed(outs)}
    for directory in dict.fromkeys(os.path.dirname(o.target) for o in outs):
        path = _names.sibling(firsts[directory], txn.token, _names.LOCK)
        try:
            fd = _lockfile.create(path, content)
        except _lockfile.LockBusyError as exc:
            raise SaveError(f"{path}: {exc.strerror}; nothing was written, retry the save",
                            errno=exc.errno) from exc
        txn.locks.append((path, fd))


def _create_outputs(txn: _Txn) -> None:
    for out, st in zip(txn.prep.plan.outputs, txn.prep.target_stats, strict=True):
        if out.direct:
            txn.temps.append(None)
            txn.fds.append(_sys.open(out.target, os.O_WRONLY))
            continue
        temp = _names.sibling(out.target, txn.token, _names.TEMP)
        # The replaced file's permission bits from the first instant (the umask may narrow
        # them further); set-id bits and the owner only once the content is complete.
        mode = 0o666 if st is None else stat_mod.S_IMODE(st.st_mode) & 0o777
        fd = _sys.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        txn.temps.append(temp)
        txn.fds.append(fd)


def _finish_modes(txn: _Txn) -> None:
    """Give each complete temp the replaced file's owner, group and exact mode."""
    adopted = {m.dests[0].output for m in txn.prep.plan.moves if m.adopt}
    for o, (fd, st) in enumerate(zip(txn.fds, txn.prep.target_stats, strict=True)):
        if fd is None or st is None or txn.temps[o] is None or o in adopted:
            continue
        _undo.apply_owner_mode(fd, st.st_mode, st.st_uid, st.st_gid)


def _source_fd(txn: _Txn, data: FileBackedData) -> int:
    ident = data.identity
    key = (ident.dev, ident.ino)
    if key not in txn.src_fds:
        fd = data.open_checked()
        try:
            txn.src_fds[key] = (fd, _sys.fstat(fd))
        except BaseException:
            _sys.close(fd)
            raise
    return txn.src_fds[key][0]


def _recheck_source(txn: _Txn, data: FileBackedData) -> None:
    """After copying from a source: it must be the file it was when we opened it (F-mix)."""
    fd, was = txn.src_fds[(data.identity.dev, data.identity.ino)]
    now = _sys.fstat(fd)
    for what in ("st_size", "st_mtime_ns", "st_ctime_ns"):
        if getattr(now, what) != getattr(was, what):
            raise DataChangedError(
                data.path, expected_size=was.st_size, found_size=now.st_size,
                reason=f"another process changed it while it was copied ({what[3:]} differs)",
            )


def _fill(txn: _Txn) -> None:
    """Everything that is not moved, at its final offset."""
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
            if isinstance(piece, FileBackedData):
                _recheck_source(txn, piece)
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


def _umask() -> int:
    try:
        for line in _sys.read_text("/proc/self/status").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _record(txn: _Txn) -> journal.Journal:
    p = txn.prep.plan
    moves = {m.key: m for m in p.moves}
    adopted_out = {m.dests[0].output: m.key for m in p.moves if m.adopt}
    sources = []
    for key in sorted(set(moves) | set(p.consumed)):
        data = txn.prep.datas[key][0]
        st = _sys.stat(data.path)
        m = moves.get(key)
        sources.append(journal.JournalSource(
            path=kernel_path(data.path), dev=key[0], ino=key[1],
            size=st.st_size, run_start=m.run_start if m else st.st_size,
            atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns, mode=st.st_mode,
            dests=m.dests if m else (), adopt=bool(m and m.adopt),
            dense=st.st_blocks * 512 >= st.st_size,
        ))
    outputs = []
    for o, (out, fd, tst) in enumerate(
        zip(p.outputs, txn.fds, txn.prep.target_stats, strict=True)
    ):
        if out.direct or fd is None:
            outputs.append(journal.JournalOutput(out.target, 0, 0, out.length, direct=True))
            continue
        mine = _sys.fstat(fd)
        dev, ino = adopted_out.get(o, (mine.st_dev, mine.st_ino))
        mode, uid, gid = (-1, -1, -1) if tst is None else (tst.st_mode, tst.st_uid, tst.st_gid)
        if o in adopted_out and tst is None:
            mode = 0o666 & ~_umask()  # what open() would have given a new file
        old = (0, 0) if tst is None else (tst.st_dev, tst.st_ino)
        outputs.append(journal.JournalOutput(out.target, dev, ino, out.length, mode, uid, gid,
                                             old_dev=old[0], old_ino=old[1]))
    return journal.Journal(txn.token, p.window, tuple(outputs), tuple(sources))


def _write_journal(txn: _Txn) -> None:
    """Pending record, fsync, fsync every directory, rename to the journal name, fsync."""
    txn.record = _record(txn)
    pending = _journal_name(txn, _names.PENDING)
    fd = _sys.open(pending, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _sys.write_all(fd, journal.encode(txn.record), 0)
        txn.counters.fsync(fd)
    finally:
        _sys.close(fd)
    # Every name the rollback needs (temps, lock files) must be durable before the journal
    # name can be: fsyncing a file does not persist its directory entry.
    temps = [t for t in txn.temps if t is not None]
    txn.counters.fsyncs += _sys.fsync_parents([pending, *temps])
    final = _journal_name(txn, _names.JOURNAL)
    _sys.rename(pending, final)
    txn.journal_path = final
    txn.counters.fsyncs += _sys.fsync_parents([final])
    txn.to(Stage.JOURNALED)
    for _path, lock_fd in txn.locks:
        _lockfile.mark_journaled(lock_fd)


def _park_sources(txn: _Txn) -> None:
    """Rename every source the save will shorten or delete to its token name, durably."""
    record = txn.record
    if record is None:
        return
    parked: list[str] = []
    for s in record.sources:
        if s.adopt:
            continue
        if txn.stage is not Stage.MOVING:
            txn.to(Stage.MOVING)
        current = txn.prep.datas[(s.dev, s.ino)][0].path
        if _undo.same_file(current, s.dev, s.ino) is None:
            txn.prep.datas[(s.dev, s.ino)][0].check()
            raise SaveError(f"{current} was replaced during the save")
        _sys.rename(current, record.parked(s))
        parked.append(record.parked(s))
    txn.counters.fsyncs += _sys.fsync_parents(parked)


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


def _move(txn: _Txn, m: MoveSource) -> None:
    record = txn.record
    if record is None:  # pragma: no cover - moves always write a journal
        raise SaveError("a move without a journal")
    src = next(s for s in record.sources if (s.dev, s.ino) == m.key)
    if txn.stage is not Stage.MOVING:
        txn.to(Stage.MOVING)
    if m.adopt:
        _adopt(txn, m, src)
        return
    path = record.parked(src)
    fd = _sys.open(path, os.O_RDWR)
    try:
        st = _sys.fstat(fd)
        was = txn.prep.datas[m.key][0].identity
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (*m.key, m.size, was.mtime_ns):
            raise DataChangedError(m.path, expected_size=m.size, found_size=st.st_size,
                                   reason="another process changed it before it was moved")
        temps = [fd_ if fd_ is not None else -1 for fd_ in txn.fds]
        txn.moving = m.key
        transfer.move_source(fd, m, temps, txn.prep.plan.window, txn.counters, txn.advance)
        txn.moving = None
    except BaseException:
        close_descriptors_quietly([fd])  # never let a close error hide why the move stopped
        raise
    _sys.close(fd)
    for ref in m.dests:
        txn.dirty.discard(txn.fds[ref.output] or -1)


def _adopt(txn: _Txn, m: MoveSource, src: journal.JournalSource) -> None:
    """Rename the whole source onto its output's temp: the move of a file that is an output.

    The empty temp claimed the name (O_EXCL) and the journal names both paths, so a crash on
    either side of the rename is undone or finished by ``recover``.  Both directories are
    fsynced so the move is durable before the commit can be.
    """
    o = m.dests[0].output
    temp = txn.temps[o]
    if temp is None:  # pragma: no cover - the plan adopts only into temps
        raise SaveError(f"{m.path}: no temp to adopt into")
    current = txn.prep.datas[m.key][0].path
    st = _undo.same_file(current, *m.key)
    if st is None or st.st_size != m.size:
        txn.prep.datas[m.key][0].check()
        raise SaveError(f"{current} was replaced during the save")
    _sys.rename(current, temp)
    txn.counters.fsyncs += _sys.fsync_parents([temp, src.path])
    old = txn.fds[o]
    txn.fds[o] = None
    if old is not None:
        _sys.close(old)  # the empty temp's inode, replaced by the rename
        txn.dirty.discard(old)
    fd = _sys.open(temp, os.O_RDWR)
    txn.fds[o] = fd
    txn.dirty.add(fd)  # whoever wrote the source may never have synced it


def _commit(txn: _Txn) -> None:
    p = txn.prep.plan
    for o, fd in enumerate(txn.fds):
        if fd is None or p.outputs[o].direct:
            continue
        if fd in txn.dirty and txn.durable:
            txn.counters.fsync(fd)
            txn.dirty.discard(fd)
        size = _sys.fstat(fd).st_size
        if size != p.outputs[o].length:
            raise SaveError(f"{p.outputs[o].path}: temp is {size} bytes, expected "
                            f"{p.outputs[o].length}")
    # Closing before the commit point: a close error still rolls back (NFS reports some
    # write errors only at close).
    errors = close_descriptors(txn)
    if errors:
        raise errors[0]
    record = txn.record
    if record is not None and txn.journal_path is not None:
        committed = _journal_name(txn, _names.COMMITTED)
        _sys.rename(txn.journal_path, committed)
        txn.journal_path = committed
        txn.to(Stage.COMMITTED)
        txn.counters.fsyncs += _sys.fsync_parents([committed])
        for m in p.moves:  # adopted files take the replaced file's owner and mode now
            if m.adopt:
                o = m.dests[0].output
                jout = record.outputs[o]
                _undo.apply_owner_mode_at(record.temp(o), jout.dev, jout.ino, jout.mode,
                                          jout.uid, jout.gid)
    finals: list[str] = []
    for out, temp in zip(p.outputs, txn.temps, strict=True):
        if temp is not None:
            _sys.rename(temp, out.target)  # without a journal, this one rename is the commit
            finals.append(out.target)
    if txn.stage is not Stage.COMMITTED:
        txn.to(Stage.COMMITTED)
    txn.to(Stage.RENAMED)
    if txn.durable:
        txn.counters.fsyncs += _sys.fsync_parents(finals)
    if record is not None and txn.journal_path is not None:
        parked = [record.parked(s) for s in record.sources if not s.adopt]
        for s, path in zip((s for s in record.sources if not s.adopt), parked, strict=True):
            if _undo.same_file(path, s.dev, s.ino) is not None:
                _sys.unlink(path)
        txn.counters.fsyncs += _sys.fsync_parents(parked)
        _sys.unlink(txn.journal_path)
    txn.to(Stage.DONE)
    while txn.locks:
        path, fd = txn.locks.pop()
        try:
            _lockfile.release(path, fd)
        except OSError as exc:  # the save is complete; a stale lock file is recover's garbage
            log.warning("the save is complete, but its lock file %s stays (%s): "
                        "`filecord recover %s` removes it", path, exc, os.path.dirname(path))
