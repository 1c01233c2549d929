"""The decision table: (who asks, stage, what the assessment found) -> what to do.  Pure.

The trust rule
--------------
A journal is **untrusted input for what it may touch** and **trusted for what happened once
its records check** (SQLite's rule: a journal that checks is played back).

* *What it may touch*: every path it names is confined (``journal.confine``) and every act is
  bound to proof on the files: a file is changed or removed only if its name carries the
  save's token in a directory whose lock file recover holds (and which names this journal),
  or it is a parked source of the save (token-named, its inode the journaled one), or it is
  a file the save recorded for removal, in such a directory or beside such a parked source,
  and still the recorded file (``undo.proven_directories``).  Names alone do not confine a
  write: a token name may be a hard link to any file on the file system, so an inode is
  written (bytes, times, mode, owner) only where the token name is its one link
  (``undo.open_own``); one with another name is copied out or refused, never written.  A
  checksum proves a record intact, not who wrote it, so no record widens this.
* *What happened*: the stage is the last step that checks; the ``moving`` count, the
  ``inserted`` steps and the ``committed`` step's looks are taken as written, never re-proved
  from the files.  A forged record that checks is therefore played back, and what it can do
  is bounded by the confinement above: it can damage the save's own files (its outputs,
  temps and parked sources), never a file elsewhere.  A real crash never forges: it tears the
  last append (which then does not check) or leaves every record whole.
* *What the files still decide*: what another process may have changed (each file's
  identity, size and times against what the records say: a change is refused or kept, never
  overwritten) and what a crash can leave differing from a record (a truncate or rename that
  did not reach the disk; a torn or lost last step, where an output under its final name
  proves the commit point was passed, ``assess.renamed``, unless whole records disprove
  it).  What neither proves is refused as damage, naming the files, never blamed on another
  process.

The failure path and ``recover`` branch on :func:`decide` alone (the stage from ``stages``,
the finding from ``assess``); every ``recover`` result is a row, reported by its word
(:data:`OUTCOME`).

Invariants (DESIGN.md section 4; the sweeps check them at every crash and fault point)
-------------------------------------------------------------------------------------
1. Every byte of every consumed source is durably in the source or at its journaled offset
   in a temp, at every instant, even after a crash that loses every unsynced write: a window
   is fsynced in the temps and its ``cut`` step in the journal before it is cut, a ``moving``
   step only after the source's last cut is fsynced, a put-back fsynced before the temp lets
   go.  Tests: tests/sweeps/test_power_cuts.py, tests/sweeps/test_fault_points.py,
   tests/sweeps/test_fsync_order.py.
2. The final name holds its old content or the complete new file, never a mix (one rename per
   output after the commit point).  Tests: tests/sweeps/test_kill_points.py,
   tests/sweeps/test_fault_points.py.
3. A failed save leaves its sources byte-exact, or a journal ``recover`` turns into that
   (rows ROLL_BACK, KEEP).  Tests: tests/sweeps/test_fault_points.py,
   tests/sweeps/test_kill_points.py.
4. ``recover`` is idempotent and crash-safe: every row is judged from the files, so running it
   again continues.  Tests: tests/sweeps/test_kill_points.py (recover killed too),
   tests/sweeps/test_recover_races.py.
5. ``recover`` acts only on proof: a held lock is skipped; a record that does not check (or
   steps in an order the stage table forbids, or files past a last record that does not
   check) is DAMAGED and refused, never blamed on another process; every path is derived
   from the token, a file without the token is removed only in a directory proven the
   save's, and an inode another name reaches is never written (the trust rule above).
   Tests: tests/sweeps/test_hostile_journals.py, tests/unit/txn/test_log.py,
   tests/sweeps/test_damaged_records.py, tests/sweeps/test_recover_guards.py,
   tests/txn/test_recover_confined.py, tests/txn/test_recover_never_writes_a_linked_inode.py.
6. Owned sources outlive a failed save: only a committed consuming save deletes them
   (rows FINISH only after the commit point).  Tests: tests/sweeps/test_recover_acts_on_proof.py.
7. A source changed by someone else is an error with a typed kind (``ChangeKind``), never
   mixed, cut or "restored" with bytes not its own: CHANGED holds the journal, LINKED and
   METADATA keep it for recover.  Tests: tests/sweeps/test_second_party.py,
   tests/sweeps/test_looks_order_and_records.py, tests/unit/txn/test_decide.py.
8. A save that committed never raises for what comes after its commit point but a kept,
   changed source (``committed=True``); row COMPLETE reports, never undoes; recover finishes
   a save whose outputs are under their final names even when its last steps are damaged.
   Tests: tests/sweeps/test_recover_acts_on_proof.py (Ctrl-C after completion),
   tests/sweeps/test_looks_order_and_records.py, tests/txn/test_recover_completed_save.py,
   tests/txn/test_finish_and_rollback_decisions.py.
9. An adopted source is only ever at a size its adoption leaves: its own, or at least its own
   plus the space inserted in front of it (fsynced before a byte lands in it); the undo judges
   from that size alone and any other size is CHANGED, never cut.  Tests:
   tests/unit/txn/test_assess.py (the adopted rows), tests/unit/txn/test_log.py,
   tests/fsmatrix/test_adopt_in_place.py, and the ``inplace`` scenario of
   tests/sweeps/test_kill_points.py, test_fault_points.py and test_power_cuts.py.
"""

from __future__ import annotations

import enum
from typing import Literal

from filecord._txn.stages import Stage


class Actor(enum.Enum):
    SAVE = "the failed save"
    RECOVER = "recover"


class Found(enum.Enum):
    """What the assessment found (``assess``)."""

    AS_LEFT = "every file as the save left it"
    LINKED = "a source linked to another name (no byte changed)"
    METADATA = "a source's change time moved (no byte changed)"
    CHANGED = "a source changed by another process"
    UNREADABLE = "the files could not be checked (or the undo itself failed)"
    DAMAGED = "a record or a lock file does not check out"
    # recover only: what the lock files and names prove, before the files are assessed
    BUSY = "a lock of the save is held: it is running (or another recover is)"
    UNPROVEN = "files of the save, but nothing proves it is over or that no journal needs them"
    FOREIGN = "not this save's to touch: a path or lock beyond it, or another version's journal"


class Action(enum.Enum):
    DISCARD = "remove the temps: nothing destructive happened"
    ROLL_BACK = "roll back: put every byte back"
    FINISH = "finish: rename the temps, delete the consumed sources"
    KEEP = "keep the journal and temps, and report where every byte is"
    HOLD = "keep them, the journal held: recover never undoes over the change"
    REFUSE = "refuse: touch nothing, say why and where every byte is"
    COMPLETE = "the save had completed: report it"
    SKIP = "skip it: its save (or another recover) is running"


# What recover reports each of its actions as: the one vocabulary of the library
# (``Recovered.action``), the CLI and the docs.
Outcome = Literal["finished", "restored", "discarded", "skipped", "refused"]
OUTCOME: dict[Action, Outcome] = {
    Action.FINISH: "finished", Action.ROLL_BACK: "restored", Action.DISCARD: "discarded",
    Action.SKIP: "skipped", Action.REFUSE: "refused",
}


_UNDOABLE = (Stage.JOURNALED, Stage.MOVING)
_BEFORE_JOURNAL = (Stage.CREATED, Stage.FILLED)
_AFTER_COMMIT = (Stage.COMMITTED, Stage.RENAMED)
# recover's stages: CREATED a save without a journal, MOVING one at ``journaled`` or ``moving``
_RECOVERED = (Stage.CREATED, Stage.MOVING, Stage.ROLLING_BACK, Stage.COMMITTED, Stage.HELD)

# The one table.  Rows not listed are impossible; :func:`decide` raises for them.
TABLE: dict[tuple[Actor, Stage, Found], Action] = {
    **{(Actor.SAVE, s, Found.AS_LEFT): Action.DISCARD for s in _BEFORE_JOURNAL},
    **{(Actor.SAVE, s, Found.AS_LEFT): Action.ROLL_BACK for s in _UNDOABLE},
    **{(Actor.SAVE, s, f): Action.KEEP for s in _UNDOABLE
       for f in (Found.LINKED, Found.METADATA, Found.UNREADABLE)},
    **{(Actor.SAVE, s, Found.CHANGED): Action.HOLD for s in _UNDOABLE},
    (Actor.SAVE, Stage.ROLLING_BACK, Found.UNREADABLE): Action.KEEP,  # the undo itself failed
    **{(Actor.SAVE, s, Found.AS_LEFT): Action.FINISH for s in _AFTER_COMMIT},
    (Actor.SAVE, Stage.DONE, Found.AS_LEFT): Action.COMPLETE,
    # recover (a save whose outputs are under their final names is past COMMITTED, lost step
    # or not: ``assess.renamed``)
    (Actor.RECOVER, Stage.CREATED, Found.AS_LEFT): Action.DISCARD,
    (Actor.RECOVER, Stage.MOVING, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.RECOVER, Stage.ROLLING_BACK, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.RECOVER, Stage.COMMITTED, Found.AS_LEFT): Action.FINISH,
    **{(Actor.RECOVER, s, Found.BUSY): Action.SKIP for s in _RECOVERED},
    **{(Actor.RECOVER, s, f): Action.REFUSE for s in _RECOVERED for f in Found
       if f is not Found.BUSY and (s is Stage.HELD or f is not Found.AS_LEFT)},
}


class NoRowError(RuntimeError):
    """A (stage, finding) the table has no row for: a bug in filecord, never a user error."""


def decide(actor: Actor, stage: Stage, found: Found) -> Action:
    try:
        return TABLE[(actor, stage, found)]
    except KeyError:
        raise NoRowError(f"{actor.value}: no action for {found.value} at {stage.value}") from None
