"""The save transaction: preflight, lock, temps, fill, journal, park, move, commit, or undo.

Theory of operation
-------------------
Every file the save creates or renames carries its token; ``Txn.stage`` moves only along
``stages``'s table (what each stage leaves, and how a failure there is undone).

1. Preflight and plan (``_plan``): every decision (each piece's action, adoption, the sync
   window, the peak, which must fit) before anything exists; from here on the plan alone
   says what is consumed and why.
2. CREATED, FILLED: lock files and temps (``begin``, ``fill``), every byte that is not moved.
3. JOURNALED only where a crash needs it (a move, a consumed source, several renames, a
   discard output or a removal: ``begin.write_journal``); MOVING: the sources parked, then
   adopted (``adopt``) or moved window by window (``transfer.move_source``).
4. COMMITTED: temps fsynced and closed, the parked sources compared with their last look
   (``looks.check``), the ``committed`` step appended: its fsync is the commit point (without
   a journal, the single rename is); a failed one is cut off and rolled back
   (``begin.append_step``).  RENAMED: temps renamed, directories fsynced, then
   ``undo.discard_and_remove`` and ``undo.unlink_parked`` (recover's finish runs both), the
   journal, the lock files.
5. Before the commit point a failure is undone (``failure``); after it nothing is, and the
   error names the journal ``recover`` finishes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path
from filecord._pieces.cord import Cord
from filecord._plan.plan import make_plan
from filecord._plan.preflight import (
    CordLike,
    Target,
    gather,
    normalize,
    refuse_replaced_sources,
    replaces_a_source,
)
from filecord._plan.report import SaveReport
from filecord._plan.space import check_space
from filecord._plan.types import MoveSource, PieceActions, SavePlan
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn import adopt, begin, fill, journal, looks, transfer, undo
from filecord._txn.failure import close_descriptors, drop_locks, reraise
from filecord._txn.failure import fail as _fail
from filecord._txn.stages import Stage
from filecord._txn.state import Prepared, Txn
from filecord._txn.state import ProgressCallback as ProgressCallback
from filecord.errors import DataChangedError, FilecordError, SaveError

log = logging.getLogger(__name__)

def save(
    path: Target,
    cord: CordLike,
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    durable: bool = True,
    in_place: bool = True,
) -> SaveReport:
    """Write ``cord`` to ``path`` atomically and durably; see :func:`save_many`."""
    return _run(normalize(path, cord), consume=consume, window=window, progress=progress,
                durable=durable, in_place=in_place)[0]


def save_many(
    outputs: Mapping[Target, CordLike],
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    durable: bool = True,
    in_place: bool = True,
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

    ``window``: the sync window of a move (bytes copied, fsynced and cut from a source at a
    time; a move's peak disk holds one window twice).  Left at :data:`DEFAULT_WINDOW`, it halves
    from 64 MiB down to 4 MiB to fit the free space, refused only if 4 MiB does not
    (``report.window_note`` says so); one passed explicitly is used as is (a refusal then says
    whether the default would have fit).

    ``in_place`` (consume only): a source used once, whole, at a block-aligned offset of its
    output, on a file system that inserts ranges, becomes the output's file with the space in
    front of it inserted (no byte copied; the report's action is "adopted").  ``False`` moves
    such a source window by window, as on every other file system (to measure the move, or to
    keep the output's blocks apart from the source's).
    """
    return _run(normalize(outputs, None), consume=consume, window=window, progress=progress,
                durable=durable, in_place=in_place)[0]


def plan(
    target: Target | Mapping[Target, CordLike],
    cord: CordLike | None = None,
    *,
    consume: bool = False,
    window: int = DEFAULT_WINDOW,
    in_place: bool = True,
) -> SaveReport:
    """A dry run of :func:`save_many` with these arguments, writing nothing: what it would do to
    each piece and why (``report.peaks``: whether it fits, ``report.window``: its window)."""
    p = _plan(normalize(target, cord), consume=consume, window=window, in_place=in_place).plan
    return _report(p, p.actions, dry_run=True)


def _plan(items: list[tuple[str, Cord]], *, consume: bool, window: int, in_place: bool,
          discard: frozenset[str] = frozenset()) -> Prepared:
    """The preflight's facts and the plan made of them (insertion probed only if asked)."""
    adopt_in_place = consume and in_place
    facts = gather(items, consume=consume, discard=discard, probe_insert=adopt_in_place)
    p = make_plan(facts.outputs, facts.refs, facts.sources, facts.filesystems, consume=consume,
                  window=window, adopt=adopt_in_place and not replaces_a_source(facts))
    refuse_replaced_sources(facts, p.consumed)
    return Prepared(facts, p)


def _report(
    p: SavePlan, actions: PieceActions, *, dry_run: bool,
    elapsed: float = 0.0, used_journal: bool = False, counters: transfer.Counters | None = None,
) -> SaveReport:
    c = counters or transfer.Counters()
    return SaveReport(
        outputs=tuple(o.path for o in p.outputs),
        sizes=tuple(o.length for o in p.outputs),
        actions=actions,
        peaks=p.peaks,
        consume=p.consume,
        window=p.window,
        dry_run=dry_run,
        elapsed_s=elapsed,
        fsyncs=c.fsyncs,
        journal=used_journal,
        bytes_copied=c.copied,
        bytes_cloned=c.cloned,
        bytes_written=c.written,
        bytes_moved=c.moved,
        window_note=p.window_choice.note(),
        adopt_note=p.in_place_note,
    )


@dataclass(frozen=True, slots=True)
class Removal:
    """A file that is not the save's, unlinked after the commit point only while it is still
    ``identity`` (st_dev, st_ino, st_size, st_mtime_ns as the caller read it), and only when
    the plan consumes every one of ``with_sources`` (else it is not recorded at all)."""

    path: str
    identity: tuple[int, int, int, int]
    with_sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Removals:
    """What the commit did with the :class:`Removal` s: ``removed``, ``changed`` (kept: no
    longer the file read), ``skipped`` (not recorded: a source it goes with is kept)."""

    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def save_many_finishing(
    outputs: Mapping[Target, CordLike], *, consume: bool, window: int,
    progress: ProgressCallback | None, discard: frozenset[str] = frozenset(),
    remove: Sequence[Removal] = (), quiet_reasons: frozenset[str] = frozenset(),
    in_place: bool = True,
) -> tuple[SaveReport, Removals]:
    """``save_many`` with ``discard`` outputs (built, then unlinked at the commit) and
    ``remove`` files (:class:`Removal`): steps after the commit point the journal carries, so
    the save and ``recover`` finish them alike.  A copy for a reason in ``quiet_reasons``
    (pieces the caller keeps on purpose and reports itself) is not warned about."""
    return _run(normalize(outputs, None), consume=consume, window=window, progress=progress,
                quiet_reasons=quiet_reasons, discard=discard, remove=remove, in_place=in_place)


def _run(
    items: list[tuple[str, Cord]],
    *,
    consume: bool,
    window: int,
    progress: ProgressCallback | None,
    durable: bool = True,
    in_place: bool = True,
    quiet_reasons: frozenset[str] = frozenset(),
    discard: frozenset[str] = frozenset(),
    remove: Sequence[Removal] = (),
) -> tuple[SaveReport, Removals]:
    if consume and not durable:
        raise ValueError("durable=False is for copy saves only: a consuming save deletes its "
                         "sources, so its outputs must be on disk first")
    start = time.perf_counter()
    prep = _prepare(items, consume=consume, window=window, in_place=in_place, discard=discard)
    plan = prep.plan  # from here on, consume and the window are the plan's
    txn = Txn(prep, _names.new_token(), progress, durable=durable)
    txn.removals, skipped, given = _removals(prep, remove)
    with _sys.pinned():  # what _execute pins, its failure path acts in too
        try:
            _execute(txn)
        except BaseException as exc:  # noqa: BLE001 - fail() cleans up and always raises
            _fail(txn, exc)
    actions = plan.actions.with_outcomes(txn.outcomes)
    loud = {why: n for why, n in actions.reasons().items() if why not in quiet_reasons}
    if plan.consume and loud:
        log.warning("consume=True copied %d file-backed piece(s) instead of moving them: %s",
                    sum(loud.values()), "; ".join(sorted(loud)))
    if plan.window_choice.why == "shrunk":
        log.info("consume=True: sync window %s", plan.window_choice.note())
    report = _report(plan, actions, dry_run=False, elapsed=time.perf_counter() - start,
                     used_journal=txn.record is not None, counters=txn.counters)
    named = Removals(tuple(given.get(p, p) for p in txn.removed),  # as the caller named them
                     tuple(given.get(p, p) for p in txn.changed_removals), skipped)
    return report, named


def _prepare(items: list[tuple[str, Cord]], *, consume: bool, window: int, in_place: bool,
             discard: frozenset[str]) -> Prepared:
    """The preflight and the plan, its scratch files detached (the save owns their fate)."""
    try:
        unknown = discard - {p for p, _c in items}
        if unknown:
            raise ValueError(f"discard names no output: {', '.join(sorted(unknown))}")
        prep = _plan(items, consume=consume, window=window, in_place=in_place, discard=discard)
        check_space(prep.plan)
    except OSError as exc:
        if isinstance(exc, FilecordError):
            raise
        # A system call of the preflight failed (stat, statvfs, ...): still a SaveError, as
        # documented, and nothing exists yet to clean up.
        reraise(exc, f"saving {', '.join(p for p, _c in items)} failed",
                ["nothing was created or changed: the save can be retried"])
    for group in prep.facts.datas.values():
        for d in group:
            d.detach_cleanup()
    return prep


def _removals(prep: Prepared, remove: Sequence[Removal]
              ) -> tuple[tuple[journal.JournalRemoval, ...], tuple[str, ...], dict[str, str]]:
    """The removals the head records, those skipped (a source they go with is not consumed),
    and each recorded path -> the name the caller gave."""
    keys = {d.path: key for key, ds in prep.facts.datas.items() for d in ds}
    consumed = set(prep.plan.consumed)
    outputs = {o.target for o in prep.plan.outputs}
    recorded: list[journal.JournalRemoval] = []
    skipped: list[str] = []
    given: dict[str, str] = {}
    for r in remove:
        try:
            path = kernel_path(r.path)
        except OSError:  # its directory is gone: nothing of it to record
            skipped.append(r.path)
            continue
        if path in outputs or r.identity[:2] in prep.facts.datas:
            continue  # replaced by the commit, or a source of the save: never a removal
        if any(keys.get(s) not in consumed for s in r.with_sources):
            skipped.append(r.path)
            continue
        recorded.append(journal.JournalRemoval(path, *r.identity))
        given[path] = r.path
    return tuple(recorded), tuple(skipped), given


def _execute(txn: Txn) -> None:
    p = txn.prep.plan
    begin.lock_directories(txn)
    # Checks and acts from here on reach the directories the lock was taken in (see _io).
    _sys.pin(os.path.dirname(f) for f in [
        *(o.target for o in p.outputs), *(r.path for r in txn.removals),
        *(d.path for ds in txn.prep.facts.datas.values() for d in ds)])
    fill.create_outputs(txn)
    _presize_for_moves(txn, before_fill=True)
    for o in range(len(p.outputs)):
        if o not in p.adopted:  # one built around an adopted file is filled by ``adopt``
            fill.fill_output(txn, o)
    txn.to(Stage.FILLED)
    fill.finish_modes(txn)
    # Only where a crash needs it (the theory's step 3); direct outputs are never renamed.
    if (p.moves or p.consumed or txn.removals or any(o.discard for o in p.outputs)
            or sum(not o.direct for o in p.outputs) > 1):
        begin.park_sources(txn, begin.write_journal(txn))
    _presize_for_moves(txn)
    for m in p.moves:
        _move(txn, m)
    _commit(txn)


def _presize_for_moves(txn: Txn, *, before_fill: bool = False) -> None:
    """Before the fill, only temps that clone no partial last block (cloned only at the end)."""
    p = txn.prep.plan
    for o in sorted(p.receiving):
        block = fill.block_of(p, p.outputs[o].dev)
        cloned = (p.actions.piece_action(pos) for pos in p.actions.positions(o)
                  if p.actions.action_of(pos) == "cloned")
        if not (before_fill and any(a.tail == 0 and a.length % block for a in cloned)):
            fill.presize(txn, o)


def _move(txn: Txn, m: MoveSource) -> None:
    record = txn.journaled()[0]
    src = record.by_key()[m.key]
    txn.to(Stage.MOVING)
    if m.adopt:
        adopt.adopt(txn, m, src)
        return
    fd = _sys.open(record.parked(src), os.O_RDWR)
    try:
        st = _sys.fstat(fd)
        was = txn.prep.facts.datas[m.key][0].identity
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (*m.key, m.size, was.mtime_ns):
            raise DataChangedError(m.path, expected_size=m.size, found_size=st.st_size,
                                   reason="another process changed it before it was moved")
        temps = [fd_ if fd_ is not None else -1 for fd_ in txn.fds]
        txn.moving = m.key
        txn.looks[m.key] = transfer.Look(transfer.Facts.of(st))
        transfer.move_source(fd, m, temps, txn.prep.plan.window, txn.counters, txn.advance,
                             looks=txn.looks, log_cut=lambda lo: begin.append_step(
                                 txn, journal.step(Stage.MOVING, cut=[*m.key, lo])))
        txn.moving = None
        # This move is over: recover may insist on the kept prefix.  The last cut is durable
        # first (btrfs's fsync persists one inode): the mark never outlives the cut.
        txn.moves_done += 1
        txn.counters.fsync(fd)
        begin.append_step(txn, journal.step(Stage.MOVING, moved=txn.moves_done))
    except BaseException:
        _sys.close_each([fd])  # never let a close error hide why the move stopped
        raise
    _sys.close(fd)
    txn.dirty.difference_update(txn.fds[ref.output] for ref in m.dests)  # fsynced by the move


def _seal(txn: Txn) -> None:
    """Every temp durable, at its length, its adopted file as the save left it, closed."""
    p = txn.prep.plan
    for o, fd in enumerate(txn.fds):
        if fd is None or p.outputs[o].direct:
            continue
        if fd in txn.dirty and txn.durable:
            txn.counters.fsync(fd)
        st = _sys.fstat(fd)
        if o in p.adopted:
            adopt.check_at_commit(txn, o, fd, st)
        if st.st_size != p.outputs[o].length:
            raise SaveError(f"{p.outputs[o].path}: temp is {st.st_size} bytes, expected "
                            f"{p.outputs[o].length}")
    # Closed before the commit point: NFS reports some write errors only at close.
    errors = close_descriptors(txn)
    if errors:
        raise errors[0]


def _commit(txn: Txn) -> None:
    _seal(txn)
    p = txn.prep.plan
    if txn.counters.moved != sum(d.length for m in p.moves if not m.adopt for d in m.dests):
        raise RuntimeError(f"a bug in filecord: {txn.counters.moved} bytes moved, not the plan's")
    record = txn.record
    if record is not None:
        seen = looks.check(txn, record)  # the last look, just before the commit point
        begin.append_step(txn, journal.step(Stage.COMMITTED, looked=[
            [*k, *v] for k, v in seen.items()]), Stage.COMMITTED)
        errors = txn.journaled()[1].close()
        if errors:  # its steps all fsynced: a close error is raised
            raise errors[0]
        adopt.take_owner_modes(txn, record)
    finals: list[str] = []
    for out, temp in zip(p.outputs, txn.temps, strict=True):
        if temp is not None and not out.discard:  # a discard temp is unlinked below
            _sys.rename(temp, out.target)  # without a journal, this one rename is the commit
            finals.append(out.target)
    txn.to(Stage.COMMITTED)  # without a journal, the rename above
    txn.to(Stage.RENAMED)
    if txn.durable:
        txn.counters.fsyncs += _sys.fsync_parents(finals)
    kept = None
    if record is not None:
        # Removals first: the parked sources prove their directories the save's to recover.
        txn.removed, txn.changed_removals = undo.discard_and_remove(record)
        kept = undo.unlink_parked(record, seen, txn.counters)
        _sys.unlink(txn.journaled()[1].path)
    txn.to(Stage.DONE)
    drop_locks(txn, remove=True)
    if kept is not None:  # the outputs are complete; a source written after the last look
        raise kept
