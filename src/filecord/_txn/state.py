"""The state of one running save, shared by the modules that run its stages.

No I/O here: ``save`` drives the stages, ``fill`` and ``begin`` run them, ``failure``
undoes them; each reads and changes this one object, and the stage moves only along
``stages``'s table.  What the save does comes from ``prep.plan`` alone (consume, window, every
piece's action): nothing below the plan takes those as arguments again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from filecord._plan.preflight import Facts
from filecord._plan.types import PieceAction, SavePlan
from filecord._txn import journal, liveness, transfer
from filecord._txn.stages import Stage, StageError, advance

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)
# where a range of a file lies on the device: (offset in the range, device offset, length)
Placed = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A save ready to run: what the preflight saw and the plan made from it."""

    facts: Facts
    plan: SavePlan


@dataclass
class Txn:
    """Mutable state of one running save: its stage and the descriptors it holds."""

    prep: Prepared
    token: str
    progress: ProgressCallback | None
    stage: Stage = Stage.CREATED
    fds: list[int | None] = field(default_factory=list)
    temps: list[str | None] = field(default_factory=list)
    locks: list[tuple[str, int]] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)
    src_fds: dict[tuple[int, int], int] = field(default_factory=dict)  # open, oldest first
    # each source as first opened: the baseline it is held to (``fill``)
    src_seen: dict[tuple[int, int], os.stat_result] = field(default_factory=dict)
    record: journal.Journal | None = None  # the head, once the journal has its name
    log: liveness.Appender | None = None  # its steps, at ``log.path`` (``fd``: to the commit)
    moving: tuple[int, int] | None = None  # the source being moved right now
    # per consumed source, the save's last look at it and the size a truncate in flight
    # leaves (None when none is): ``looks``
    looks: dict[tuple[int, int], transfer.Look] = field(default_factory=dict)
    changed: tuple[int, int] | None = None  # a source found changed since that look
    moves_done: int = 0  # moved sources (journal order) whose moves finished, marked durably
    # adopted sources whose inserted space is durable and recorded (the journal's step)
    inserted: set[tuple[int, int]] = field(default_factory=set)
    # per output an adopted file is written around in: its range in the temp (offset, size)
    # and where its bytes lie on the device once durable (``looks.blocks``)
    adopted_blocks: dict[int, tuple[int, int, Placed]] = field(default_factory=dict)
    durable: bool = True  # False: no fsync of the outputs and their directories (copy only)
    # files the commit removes (the journal's head): ``removed`` or kept as ``changed``
    removals: tuple[journal.JournalRemoval, ...] = ()
    removed: tuple[str, ...] = ()
    changed_removals: tuple[str, ...] = ()
    done: int = 0
    counters: transfer.Counters = field(default_factory=transfer.Counters)
    # placement -> the action the fill took where it differs from the plan's (a refused clone)
    outcomes: dict[int, PieceAction] = field(default_factory=dict)

    def to(self, stage: Stage) -> None:
        if stage is not self.stage:  # a stage several steps log (each move's) is entered once
            self.stage = advance(self.stage, stage)

    def journaled(self) -> tuple[journal.Journal, liveness.Appender]:
        """The head and log of a save past JOURNALED; a bug in filecord otherwise."""
        if self.record is None or self.log is None:  # pragma: no cover - the stages rule it out
            raise StageError(f"a save at {self.stage.value} without its journal")
        return self.record, self.log

    def advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.prep.plan.total_bytes)
