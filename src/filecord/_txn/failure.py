"""What a failed save does, by stage, and the error the caller sees.

Theory of operation
-------------------
* Before the journal (CREATED, FILLED): nothing destructive happened.  Descriptors are closed,
  the temps and a pending journal unlinked, then the lock files (last, so a crash in between
  leaves a lock file beside the garbage and ``recover`` may remove it).
* JOURNALED, MOVING: the journal is first renamed to ``.filecord-rollback`` (directory
  fsynced), so a crash during the undo continues it; then ``undo.roll_back`` runs on the live
  files, exactly as ``recover`` would; then temps, journal and lock files are removed.  If the
  failure is a source changed by another process, or the undo itself fails, everything stays:
  the lock files are only closed (their ``flock`` dropped), and the error's notes say which
  file holds which bytes and which ``filecord recover`` command continues.
* COMMITTED, RENAMED: nothing is undone.  Descriptors and locks are dropped (the files stay)
  and the error names the committed journal that ``recover`` finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import assess, liveness, undo
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
T = TypeVar("T")



def _drop_locks(txn: Txn, *, remove: bool) -> None:
    while txn.locks:
        path, fd = txn.locks.pop()
        if remove:
            try:
                liveness.release(path, fd)
            except OSError as exc:  # a lock file left behind is removed by recover
                log.warning("could not remove the lock file %s: %s", path, exc)
        else:
            _sys.close_each([fd])


def close_descriptors(txn: Txn) -> list[OSError]:
    """Close every temp and source descriptor the save holds; returns the close errors.

    A failed close must not skip the rest: Linux releases a descriptor even when close
    reports an error, so all are closed and the caller decides what an error means.
    """
    fds = [fd for fd in txn.fds if fd is not None] + [fd for fd, _st in txn.src_fds.values()]
    txn.fds = [None] * len(txn.fds)
    txn.src_fds.clear()
    return _sys.close_each(fds)


def close_descriptors_quietly(fds: list[int]) -> None:
    _sys.close_each(fds)  # never let a close error hide why the save stopped


def _attempt(fn: Callable[[T], None], arg: T) -> OSError | None:
    """Run one cleanup call; its error is returned for the notes, never raised over the cause."""
    try:
        fn(arg)
    except OSError as exc:
        return exc
    return None


def _close(txn: Txn, notes: list[str]) -> None:
    fds = [] if txn.journal_fd is None else [txn.journal_fd]
    txn.journal_fd = None
    errors = close_descriptors(txn) + _sys.close_each(fds)
    notes.extend(f"could not close a descriptor: {exc}" for exc in errors)


def _raise(exc: BaseException, message: str, notes: list[str], **kw: object) -> NoReturn:
    if isinstance(exc, FilecordError):
        # Keep the caller's error type (a DataChangedError stays one); the journal it leaves
        # behind rides along as attributes.
        for k, v in kw.items():
            setattr(exc, k, v)
        for n in [message, *notes]:
            add_note(exc, n)
        raise exc
    if isinstance(exc, OSError):
        err = SaveError(
            f"{message}: {exc.strerror or exc}", errno=exc.errno, **kw  # type: ignore[arg-type]
        )
        for n in notes:
            add_note(err, n)
        raise err from exc
    for n in [message, *notes]:
        add_note(exc, n)
    raise exc


def _states(record: Journal, seen: assess.Observed) -> tuple[SourceState, ...]:
    states = []
    for s, f in zip(record.sources, seen.sources, strict=True):
        found = assess.locate(record, s, f)
        size = found[1].size if found else -1
        rest = tuple((record.temp(d.output), d.out_offset) for d in s.dests)
        states.append(SourceState(s.path, s.size, size, rest))
    return tuple(states)


def records_of(txn: Txn, exc: BaseException) -> assess.Records:
    """What a running save knows, as the records a crashed one leaves: its stage, its count of
    finished moves, its last looks, and the change it saw mid-move."""
    during = (exc if isinstance(exc, DataChangedError)
              and (txn.moving or txn.changed) is not None else None)
    looks = {k: assess.Look(assess.Facts.of(st), pending) for k, (st, pending) in txn.looks.items()}
    return assess.Records(Actor.SAVE, txn.stage, txn.moves_done, looks=looks, during=during,
                          cause=exc)


def _hold(txn: Txn, notes: list[str]) -> None:
    """A source changed under the move: rename the journal ``.filecord-held`` so no recover
    ever rolls back over the change (it would fill the gap with whatever the temps hold)."""
    if txn.journal_path is None or not txn.journal_path.endswith(_names.JOURNAL):
        return
    held = _names.restage(txn.journal_path, _names.HELD)
    try:
        _sys.rename(txn.journal_path, held)
        txn.journal_path = held
        txn.to(Stage.HELD)
        _sys.fsync_parents([held])
    except OSError as exc:
        notes.append(f"could not mark the journal held ({exc}): recover refuses it anyway if "
                     "the change shows in the source's size")


def _keep_all(txn: Txn, exc: BaseException, names: str, notes: list[str], why: str,
              *, hold: bool = False) -> NoReturn:
    if hold:
        _hold(txn, notes)
    _close(txn, notes)
    _drop_locks(txn, remove=False)
    states: tuple[SourceState, ...] = ()
    left_at = {}
    changed = txn.moving if txn.moving is not None else txn.changed
    if isinstance(exc, DataChangedError) and changed is not None:
        left_at = {changed: exc.expected_size}
    if txn.record is not None:
        seen = assess.observe(txn.record, records_of(txn, exc))
        if seen.unreadable is not None:
            notes.append("could not look at the sources to say where their bytes are: "
                         f"{seen.unreadable}")
        else:
            notes.extend(assess.whereabouts(txn.record, seen, left_at))
            states = _states(txn.record, seen)
    notes.append(f"{why}; run `filecord recover {txn.journal_path}` once the cause is fixed")
    _raise(exc, f"saving {names} failed", notes, journal_path=txn.journal_path, sources=states)


def fail(txn: Txn, exc: BaseException) -> NoReturn:
    """Clean up after ``exc`` and raise the error the caller sees; the save ends FAILED."""
    try:
        _fail(txn, exc)
    finally:
        txn.to(Stage.FAILED)


def _fail(txn: Txn, exc: BaseException) -> NoReturn:
    names = ", ".join(o.path for o in txn.prep.plan.outputs)
    notes: list[str] = []
    stage = txn.stage
    if txn.record is None or txn.journal_path is None or stage not in (
        Stage.JOURNALED, Stage.MOVING
    ):
        action = decide(Actor.SAVE, stage, Found.AS_LEFT)
    else:
        records = records_of(txn, exc)
        found = assess.assess(txn.record, records, assess.observe(txn.record, records))
        txn.changed = found.changed or txn.changed  # for the notes: where the change is
        if found.found is Found.METADATA:  # no byte changed: recover may roll it back
            log.warning("%s; the save stops, recover may roll it back", found.error or exc)
        notes.extend(found.notes)
        action = decide(Actor.SAVE, stage, found.found)
        if action in (Action.KEEP, Action.HOLD):
            _keep_all(txn, found.error or exc, names, notes, found.why,
                      hold=action is Action.HOLD)
    if action is Action.COMPLETE:  # e.g. Ctrl-C while the last lock file was being let go
        _close(txn, notes)
        _drop_locks(txn, remove=False)
        add_note(exc, f"the save of {names} had completed: every output is in place and "
                 "durable (a lock file left behind is removed by `filecord recover`)")
        raise exc
    if action is Action.FINISH:
        _close(txn, notes)
        if txn.journal_path is not None:
            _drop_locks(txn, remove=False)
            notes.append(
                f"the outputs are complete; run `filecord recover {txn.journal_path}` to "
                "finish moving them to their final names and removing the consumed sources"
            )
            _raise(exc, f"saving {names} failed after its commit point", notes,
                   journal_path=txn.journal_path)
        _drop_locks(txn, remove=True)
        notes.append(f"{names} holds the complete new content, but syncing its directory "
                     "failed: after a power loss the old file may come back")
        _raise(exc, f"saving {names} failed after the rename", notes)
    restored = 0
    if action is Action.ROLL_BACK and txn.record is not None and txn.journal_path is not None:
        try:
            rollback = _names.restage(txn.journal_path, _names.ROLLBACK)
            _sys.rename(txn.journal_path, rollback)
            txn.journal_path = rollback
            txn.to(Stage.ROLLING_BACK)
            _sys.fsync_parents([rollback])
            _close(txn, notes)  # the undo opens what it needs by name, as recover does
            temps = undo.open_temps(txn.record)
            try:
                restored = undo.roll_back(txn.record, temps, txn.counters)
            finally:
                undo.close_all(temps)
        except BaseException as rexc:  # noqa: BLE001 - any failure here leaves the journal in charge
            notes.append(f"rolling back also failed: {rexc!r}")
            keep = decide(Actor.SAVE, Stage.ROLLING_BACK if txn.stage is Stage.ROLLING_BACK
                          else stage, Found.UNREADABLE)
            _keep_all(txn, exc, names, notes, "the journal and temps are kept",
                      hold=keep is Action.HOLD)
    # DISCARD, or the rollback done: nothing of the save is left but its garbage.
    _close(txn, notes)
    left = _remove_garbage(txn, notes)
    _drop_locks(txn, remove=not left)
    if restored and isinstance(exc, DataChangedError):
        # Only whole files were involved (an adopted file is renamed, never cut): they are back
        # under their names, but the changed one holds the other process's change.
        notes.append(f"{restored} source file(s) were given back their names; {exc.path} holds "
                     "what another process made of it, not its original bytes")
    elif restored:
        notes.append(f"the moved bytes were put back into {restored} source file(s), byte-exact")
    streams = [o.path for o in txn.prep.plan.outputs if o.direct]
    if streams:
        notes.append(f"bytes already written to {', '.join(streams)} (not a regular file) "
                     "cannot be taken back")
    notes.append("no final name was changed and the sources are intact: the save can be retried")
    _raise(exc, f"saving {names} failed", notes)


def _remove_garbage(txn: Txn, notes: list[str]) -> bool:
    """Unlink temps, a pending journal and the journal; True if something could not go."""
    paths = [t for t in txn.temps if t is not None]
    first = next((o for o in txn.prep.plan.outputs if not o.direct), None)
    if first is not None:
        paths.append(_names.sibling(first.target, txn.token, _names.PENDING))
    attempts = ((p, _attempt(_sys.unlink_missing_ok, p)) for p in paths)
    failed = [(p, e) for p, e in attempts if e is not None]
    notes.extend(f"could not remove {p}: {e}" for p, e in failed)
    left = bool(failed)
    if txn.journal_path is not None and not left:
        try:
            _sys.fsync_parents(paths)
            _sys.unlink_missing_ok(txn.journal_path)
        except OSError as exc:
            notes.append(f"could not remove the journal {txn.journal_path}: {exc}")
            left = True
    return left
