"""What a failed save does, by stage, and the error the caller sees.

Theory of operation
-------------------
``fail`` decides nothing itself: it asks ``decide`` (the stage and, past the journal, the
assessment of the files) and runs the function ``_ACTIONS`` gives for that row, every
descriptor let go first: its steps open the journal by name, as recover's do (never where
another name reaches it: ``liveness.open_regular``).  Before the journal the garbage goes
(temps, a pending journal, the lock files last).  From JOURNALED a durable ``rolling back`` step
comes first, so a crash continues the undo, then ``undo.roll_back`` runs on the live files as
``recover`` would.  A source changed by someone else, or a failed undo, keeps everything: the
locks only closed, the notes say which file holds which bytes and which ``filecord recover``
continues.  Past the commit point nothing is undone and the error names the journal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import assess, begin, journal, liveness, undo
from filecord._txn.decide import Action, Actor, Found, decide
from filecord._txn.journal import Journal
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import (
    DataChangedError,
    FilecordError,
    SaveError,
    SourceState,
    add_note,
)

log = logging.getLogger(__name__)


def drop_locks(txn: Txn, *, remove: bool) -> None:
    """Let go of every lock (``remove``: unlinking its file first)."""
    while txn.locks:
        path, fd = txn.locks.pop()
        if remove:
            try:
                liveness.release(path, fd)
            except OSError as exc:  # a lock file left behind is recover's garbage
                log.warning("could not remove the lock file %s (%s): `filecord recover %s` "
                            "removes it", path, exc, os.path.dirname(path))
        else:
            _sys.close_each([fd])


def close_descriptors(txn: Txn) -> list[OSError]:
    """Close every temp and source descriptor, all of them whatever fails; the errors."""
    fds = [fd for fd in txn.fds if fd is not None] + list(txn.src_fds.values())
    txn.fds = [None] * len(txn.fds)
    txn.src_fds.clear()
    return _sys.close_each(fds)


def reraise(exc: BaseException, message: str, notes: list[str], **kw: object) -> NoReturn:
    """A system call's error becomes a ``SaveError``; the caller's own error keeps its type
    (a DataChangedError stays one), the journal it leaves riding along as attributes."""
    if isinstance(exc, OSError) and not isinstance(exc, FilecordError):
        err = SaveError(f"{message}: {exc.strerror or exc}", errno=exc.errno,
                        **kw)  # type: ignore[arg-type]
        for n in notes:
            add_note(err, n)
        raise err from exc
    if isinstance(exc, FilecordError):
        for k, v in kw.items():
            setattr(exc, k, v)
    for n in [message, *notes]:
        add_note(exc, n)
    raise exc


def _states(record: Journal, seen: assess.Observed) -> tuple[SourceState, ...]:
    if seen.unreadable is not None:
        return ()
    states = []
    for s, f in zip(record.sources, seen.sources, strict=True):
        found = assess.locate(record, s, f)
        size = found[1].size if found else -1
        rest = tuple((record.temp(d.output), d.out_offset) for d in s.dests)
        states.append(SourceState(s.path, s.size, size, rest))
    return tuple(states)


def _keep(txn: Txn, f: _Failed, notes: list[str], *, held: bool = False) -> NoReturn:
    """Row KEEP: the journal and temps stay for recover (no byte changed, or the files could
    not be checked); the notes say where every source's bytes are.  Row HOLD (``held``: a
    source changed mid-move): the ``held`` step first, so no recover ever rolls back over the
    change (it would fill the gap with whatever the temps hold)."""
    if held:
        try:
            begin.append_step(txn, journal.step(Stage.HELD), Stage.HELD)
        except OSError as exc:
            notes.append(f"could not mark the journal held ({exc}): recover refuses it anyway "
                         "if the change shows in the source's size")
    drop_locks(txn, remove=False)
    record, log_ = txn.journaled()
    key = txn.moving or txn.changed
    during = assess.seen_mid_move(f.exc, key)  # the size the move last left it at
    left_at = {} if during is None or key is None else {key: during.expected_size}
    seen = assess.observe(record)  # afresh: the files may have changed since the assessment
    notes.extend(assess.whereabouts(record, seen, left_at, inserted=frozenset(txn.inserted),
                                    held=held))
    notes.append(f"{f.why}; run `filecord recover {log_.path}` once the cause is fixed")
    reraise(f.exc, f"saving {f.names} failed", notes, journal_path=log_.path,
           sources=_states(record, seen))


@dataclass(frozen=True, slots=True)
class _Failed:
    """The error to raise (the change found, else the cause), the outputs, why (in words)."""

    exc: BaseException
    names: str
    why: str = ""


def fail(txn: Txn, exc: BaseException) -> NoReturn:
    """Clean up after ``exc`` as the table says (from the stage and, past the journal, the
    files' assessment) and raise the error the caller sees; the save ends FAILED."""
    names = ", ".join(o.path for o in txn.prep.plan.outputs)
    # Every descriptor let go first: from here on each step, the assessment and the undo open
    # what they need by name, as recover does.
    notes = [f"could not close a descriptor: {e}"
             for e in close_descriptors(txn) + (txn.log.close() if txn.log else [])]
    try:
        if txn.stage not in (Stage.JOURNALED, Stage.MOVING):  # the stage alone decides
            _ACTIONS[decide(Actor.SAVE, txn.stage, Found.AS_LEFT)](txn, _Failed(exc, names), notes)
        record = txn.journaled()[0]
        # What the running save knows, as the records a crashed one would leave.
        records = assess.Records(Actor.SAVE, txn.stage, txn.moves_done, frozenset(txn.inserted),
                                 looks=txn.looks, cause=exc,
                                 during=assess.seen_mid_move(exc, txn.moving or txn.changed))
        found = assess.assess(record, records, assess.observe(record))
        txn.changed = found.changed or txn.changed  # for the notes: where the change is
        if found.found is Found.METADATA:  # no byte changed: recover may roll it back
            log.warning("%s; the save stops, recover may roll it back", found.error or exc)
        notes.extend(found.notes)
        _ACTIONS[decide(Actor.SAVE, txn.stage, found.found)](
            txn, _Failed(found.error or exc, names, found.why), notes)
    finally:
        txn.to(Stage.FAILED)


def _complete(txn: Txn, f: _Failed, notes: list[str]) -> NoReturn:
    """Row COMPLETE: e.g. Ctrl-C while the last lock file was being let go."""
    drop_locks(txn, remove=False)
    add_note(f.exc, f"the save of {f.names} had completed: every output is in place and "
             "durable (a lock file left behind is removed by `filecord recover`)")
    raise f.exc


def _finish(txn: Txn, f: _Failed, notes: list[str]) -> NoReturn:
    """Row FINISH: after the commit point nothing is undone; recover finishes (or, without a
    journal, the one rename was the commit and only its directory's fsync failed)."""
    drop_locks(txn, remove=txn.log is None)  # a journal's are recover's to remove
    if txn.log is not None:
        # RENAMED: every output is under its final name, so the save succeeded and only its
        # clean-up did not (``committed``: the CLI exits 0 with this as a warning).
        renamed = txn.stage is Stage.RENAMED
        left = ("every output is complete under its final name; run `filecord recover {}` to "
                "remove what is left of the consumed sources and the journal" if renamed else
                "the outputs are complete; run `filecord recover {}` to finish moving them to "
                "their final names and removing the consumed sources")
        notes.append(left.format(txn.log.path))
        what = "committed, but cleaning up after its commit point failed" if renamed else \
            "failed after its commit point"
        reraise(f.exc, f"saving {f.names} {what}", notes, journal_path=txn.log.path,
               committed=renamed)
    notes.append(f"{f.names} holds the complete new content, but syncing its directory "
                 "failed: after a power loss the old file may come back")
    reraise(f.exc, f"saving {f.names} failed after the rename", notes)


def _roll_back(txn: Txn, f: _Failed, notes: list[str]) -> NoReturn:
    """Row ROLL_BACK: append the ``rolling back`` step (durable), put every byte back on the
    live files exactly as recover would, then discard the rest.  A failure of the undo asks
    the table again, at the stage reached, with the files unreadable."""
    record, log_ = txn.journaled()
    try:
        begin.append_step(txn, journal.step(Stage.ROLLING_BACK), Stage.ROLLING_BACK)
        restored = undo.roll_back(record, txn.counters, frozenset(txn.inserted), {},
                                  lambda step: begin.append_step(txn, step))
    except BaseException as rexc:  # noqa: BLE001 - any failure here leaves the journal in charge
        notes.append(f"rolling back also failed: {rexc!r}")
        if log_.torn:
            notes.append("the step whose write or fsync failed could not be cut off the "
                         "journal: where it reads back whole `filecord recover` plays it (a "
                         "failed `committed` step: the save then completes, not rolled back)")
        _ACTIONS[decide(Actor.SAVE, txn.stage, Found.UNREADABLE)](
            txn, _Failed(f.exc, f.names, "the journal and temps are kept"), notes)
    if restored and isinstance(f.exc, DataChangedError):
        # Only whole files were involved (an adopted file is renamed, never cut): they are
        # back under their names, but the changed one holds the other process's change.
        notes.append(f"{restored} source file(s) were given back their names; {f.exc.path} "
                     "holds what another process made of it, not its original bytes")
    elif restored:
        notes.append(f"the moved bytes were put back into {restored} source file(s), byte-exact")
    _discard(txn, f, notes)


def _discard(txn: Txn, f: _Failed, notes: list[str]) -> NoReturn:
    """Row DISCARD (and the end of ROLL_BACK): nothing of the save is left but its garbage."""
    paths = [t for t in txn.temps if t is not None]
    if paths:  # a pending journal comes after the temps
        paths.append(begin.journal_name(txn, _names.PENDING))
    left = False
    for p in paths:  # each error is noted, never raised over the cause
        try:
            _sys.unlink_missing_ok(p)
        except OSError as exc:  # noqa: PERF203 - every path is tried
            notes.append(f"could not remove {p}: {exc}")
            left = True
    if txn.log is not None and not left:
        try:
            _sys.fsync_parents(paths)
            _sys.unlink_missing_ok(txn.log.path)
        except OSError as exc:
            notes.append(f"could not remove the journal {txn.log.path}: {exc}")
            left = True
    drop_locks(txn, remove=not left)
    streams = [o.path for o in txn.prep.plan.outputs if o.direct]
    if streams:
        notes.append(f"bytes already written to {', '.join(streams)} (not a regular file) "
                     "cannot be taken back")
    # A journal left (its last step ``rolling back``: the rollback is done) names sources a
    # retry may consume: recover removes it and what it lists first.
    kept = {"journal_path": txn.log.path} if left and txn.log else {}
    notes.append("no final name was changed and the sources are intact: the save can be "
                 "retried" + (f" once `filecord recover {txn.log.path}` has removed its "
                              "journal, temps and lock files" if kept and txn.log else ""))
    reraise(f.exc, f"saving {f.names} failed", notes, **kept)


# Each row of the table (``decide.Action``) and the one function that carries it out.
_ACTIONS: dict[Action, Callable[[Txn, _Failed, list[str]], NoReturn]] = {
    Action.DISCARD: _discard,
    Action.ROLL_BACK: _roll_back,
    Action.FINISH: _finish,
    Action.KEEP: _keep,
    Action.HOLD: partial(_keep, held=True),
    Action.COMPLETE: _complete,
}
