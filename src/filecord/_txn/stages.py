"""The stages of a save and the one table of legal moves between them.

A running save holds its stage in a variable; a crashed one's is its journal's last step that
checks (``journal``; the lock files hold ``created`` and ``journaled``), in a succession this
table allows (:func:`may_follow`).  What a failure or crash then does is ``decide``'s table.

=============  ================================================================
CREATED        lock files (a ``created`` step), empty temps
FILLED         complete copies in the temps
JOURNALED      the journal: its head, a ``journaled`` step, durable
MOVING         sources renamed and being shortened (``moving`` steps)
ROLLING_BACK   a ``rolling back`` step: bytes and names being put back (``rebuilt`` steps)
HELD           a ``held`` step: another process changed a source mid-move
COMMITTED      a ``committed`` step: finishing (renames, sources deleted)
RENAMED        final names replaced
DONE           nothing
=============  ================================================================

``FAILED`` is the poisoned state of h11's machines: a save that reached it is over.
"""

from __future__ import annotations

import enum


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


class StageError(RuntimeError):
    """A transition the table does not allow: a bug in filecord, never a user error."""


def advance(current: Stage, new: Stage) -> Stage:
    if new not in _LEGAL[current]:
        raise StageError(f"a save cannot go from {current.value} to {new.value}")
    return new


def may_follow(prev: Stage, new: Stage) -> bool:
    """Whether a step of ``new`` may follow one of ``prev`` in a log: a legal move, possibly
    through FILLED (which no step names), or another ``moving`` or ``rolling back`` step."""
    return (new in _LEGAL[prev] or (prev is new and new in (Stage.MOVING, Stage.ROLLING_BACK))
            or (Stage.FILLED in _LEGAL[prev] and new in _LEGAL[Stage.FILLED]))
