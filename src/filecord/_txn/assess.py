"""The assessment: from the journal, its records and the files, what ``decide`` is asked about.

Theory of operation
-------------------
Both paths that clean up after a save ask the same questions in the same order and turn the
answer into one :class:`~filecord._txn.decide.Found`:

* :func:`failed_save` (the in-process failure path): the error itself (a change seen during
  the move, by its typed ``ChangeKind``), then every parked source against the save's last look
  (``looks.changed_since_look``), then the proof recover asks for too (``undo.check_strict``:
  every source at a size this save's moves leave, in their order, the journal's ``moved``
  count included).
* :func:`crashed_save` (``recover``): the record's checksums (a record that does not check is
  DAMAGED, never "another process"), then by stage: ``undo.check_strict`` and
  ``undo.check_temps_hold`` before a rollback, ``undo.check_committed`` before a finish.

:func:`of_change` is the one place a ``DataChangedError`` becomes a finding: by its ``kind``,
never by its message.  The checks read the files (stat, SEEK_HOLE, FIEMAP) and change nothing;
the action the table picks is carried out by ``failure`` or ``recover``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from filecord._txn import journal, looks, undo
from filecord._txn.decide import Found
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import ChangeKind, DataChangedError, RecoverError

log = logging.getLogger(__name__)

HELD_WHY = ("a source was changed by another process, so nothing was put back over it: the "
            "journal (held) and temps are kept")
KEPT_WHY = "the journal and temps are kept"


@dataclass(frozen=True, slots=True)
class Assessment:
    """What was found, the error that says so (raised to the caller), notes and why."""

    found: Found
    error: BaseException | None = None
    notes: tuple[str, ...] = ()
    why: str = ""


def of_change(exc: DataChangedError) -> Found:
    """A change, by its typed kind: a link or a ctime alone changed no byte."""
    return {ChangeKind.LINKED: Found.LINKED,
            ChangeKind.METADATA: Found.METADATA}.get(exc.kind, Found.CHANGED)


def failed_save(txn: Txn, exc: BaseException) -> Assessment:
    """The in-process failure, after the journal: may the save roll back?"""
    record = txn.record
    if record is None:  # pragma: no cover - asked only once there is a journal
        return Assessment(Found.AS_LEFT, exc)
    if isinstance(exc, DataChangedError) and (txn.moving or txn.changed) is not None:
        # Bytes were being moved out of the changed file.  A new hard link or a ctime alone
        # (chmod, chattr) changed no byte: recover may put the bytes back.  A write, append or
        # truncate did: hold the journal.
        found = of_change(exc)
        if found is Found.METADATA:
            log.warning("%s: %s; the save stops, recover may roll it back", exc.path, exc.reason)
        return Assessment(found, exc, why="a source changed under the move, so nothing was put "
                          "back over it: the journal and temps are kept" +
                          ("" if found is not Found.CHANGED else
                           " (held: recover will not undo over the change)"))
    try:
        seen = looks.changed_since_look(txn)
    except OSError as cexc:
        return Assessment(Found.UNREADABLE, exc, (f"could not check the sources: {cexc}",),
                          KEPT_WHY)
    if seen is not None:
        seen.__context__ = exc
        found = of_change(seen)
        if found is Found.METADATA:
            log.warning("%s: %s", seen.path, seen.reason)
            why = ("a source's metadata was changed by another process: the journal and temps "
                   "are kept (not held)")
        else:
            why = HELD_WHY
        return Assessment(found, seen, (f"the save had failed first: {exc}",), why)
    try:
        undo.check_strict(record, txn.moves_done)
    except DataChangedError as cexc:
        return Assessment(Found.CHANGED, exc, (f"{cexc}",), HELD_WHY)
    except OSError as cexc:
        return Assessment(Found.UNREADABLE, exc, (f"could not check the sources: {cexc}",),
                          KEPT_WHY)
    return Assessment(Found.AS_LEFT, exc)


def damaged(exc: journal.JournalDamagedError) -> Assessment:
    return Assessment(Found.DAMAGED, exc, why=f"{exc}; nothing was touched")


def crashed_save(log_: journal.Log, stage: Stage) -> Assessment:
    """A crashed save's journal (its records already checked): may recover act at ``stage``?"""
    j = log_.journal
    try:
        if stage is Stage.HELD:
            return Assessment(Found.CHANGED, why=(
                "the save stopped because another process changed a source mid-move; nothing "
                "is undone over that change (the notes say where every byte is)"))
        if stage is Stage.COMMITTED:
            try:
                undo.check_committed(j, log_.looked)
            except RecoverError as exc:
                return Assessment(Found.UNFINISHED, exc, why=f"{exc}; {KEPT_WHY}")
        elif stage is Stage.MOVING:
            undo.check_strict(j, log_.moved)
            temps = undo.open_temps(j)
            try:
                undo.check_temps_hold(j, temps)
            finally:
                undo.close_all(temps)
    except DataChangedError as exc:
        return Assessment(of_change(exc) if exc.kind is not ChangeKind.METADATA
                          else Found.CHANGED, exc, why=f"{exc}; {KEPT_WHY}")
    except (RecoverError, OSError) as exc:
        return Assessment(Found.UNREADABLE, exc, why=f"{exc}; {KEPT_WHY}")
    return Assessment(Found.AS_LEFT)
