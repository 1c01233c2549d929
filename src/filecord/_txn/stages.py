"""The stages of a save and the one table of legal moves between them.

A running save holds its stage in a variable; a crashed one is read back from the names of its
files, because every stage that matters after a crash is entered by an atomic rename whose
directory is fsynced:

=============  ==================================  ===========================================
stage          what exists                          what a failure or crash is undone by
=============  ==================================  ===========================================
CREATED        lock files, empty temps              removing temps (nothing destructive yet)
FILLED         complete copies in the temps         removing temps
JOURNALED      ``.filecord-journal`` (durable)      rolling back (sources still whole)
MOVING         sources renamed, being shortened     rolling back: put bytes and names back
ROLLING_BACK   ``.filecord-rollback``               rolling back, continued
HELD           ``.filecord-held``                   nothing: another process changed a source
                                                    mid-move; recover refuses and says where
                                                    every byte is
COMMITTED      ``.filecord-committed``              finishing: renames, delete sources
RENAMED        final names replaced                 finishing: delete sources
DONE           nothing                              nothing
=============  ==================================  ===========================================

``FAILED`` is the poisoned state of h11's machines: a save that reached it is over.
"""

from __future__ import annotations

import enum

from filecord._io import names as _names


class Stage(enum.Enum):
    CREATED = "created"
    FILLED = "filled"
    JOURNALED = "journaled"
    MOVING = "moving"
    ROLLING_BACK = "rolling back"
    HELD = "held"
    COMMITTED = "committed"
    RENAMED = "renamed"
    DONE = "done"
    FAILED = "failed"


_LEGAL: dict[Stage, frozenset[Stage]] = {
    Stage.CREATED: frozenset({Stage.FILLED, Stage.FAILED}),
    Stage.FILLED: frozenset({Stage.JOURNALED, Stage.COMMITTED, Stage.FAILED}),
    Stage.JOURNALED: frozenset({Stage.MOVING, Stage.COMMITTED, Stage.ROLLING_BACK, Stage.HELD,
                                Stage.FAILED}),
    Stage.MOVING: frozenset({Stage.COMMITTED, Stage.ROLLING_BACK, Stage.HELD, Stage.FAILED}),
    Stage.ROLLING_BACK: frozenset({Stage.FAILED}),
    Stage.HELD: frozenset({Stage.FAILED}),
    Stage.COMMITTED: frozenset({Stage.RENAMED, Stage.FAILED}),
    Stage.RENAMED: frozenset({Stage.DONE, Stage.FAILED}),
    Stage.DONE: frozenset({Stage.FAILED}),  # an interrupt after completion: reported, not undone
    Stage.FAILED: frozenset(),
}

# Who performs each transition (the only places ``Txn.to`` is called with it):
#   FILLED        save._execute, once every temp is filled
#   JOURNALED     begin.write_journal, at the journal's rename into place
#   MOVING        begin.park_sources / save._move, before the first source is renamed or cut
#   COMMITTED     save._commit, at the journal's rename to -committed (or the single rename)
#   RENAMED       save._commit, once every temp is renamed onto its final name
#   DONE          save._commit, once the sources, journal and locks are gone
#   ROLLING_BACK  failure._roll_back, at the journal's rename to -rollback
#   HELD          failure._hold, at the journal's rename to -held
#   FAILED        failure.fail, as the error leaves (every failure ends there)


class StageError(RuntimeError):
    """A transition the table does not allow: a bug in filecord, never a user error."""


def advance(current: Stage, new: Stage) -> Stage:
    if new not in _LEGAL[current]:
        raise StageError(f"a save cannot go from {current.value} to {new.value}")
    return new


def of_journal_suffix(suffix: str) -> Stage:
    """The stage a crashed save was in, from its journal's name."""
    return {
        _names.JOURNAL: Stage.MOVING,  # moving or only journaled: the files tell which
        _names.ROLLBACK: Stage.ROLLING_BACK,
        _names.COMMITTED: Stage.COMMITTED,
        _names.HELD: Stage.HELD,
    }[suffix]
