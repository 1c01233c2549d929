"""The plan's value types: facts in, decisions out (a leaf: imports nothing of filecord).

The preflight (``facts``, ``preflight``) fills the facts (:class:`SourceFacts`, :class:`FsFacts`,
:class:`OutputFacts`, :class:`PieceRef`); the plan (``plan``, ``space``, ``window``) turns them
into a :class:`SavePlan` of :class:`PieceAction`, :class:`MoveSource`, :class:`FsPeak` and a
:class:`WindowChoice`; the transaction and the report read them.  They live in this leaf, not
next to the code that computes them, so that every module of the plan can name every type
without importing another (``plan`` uses ``space`` and ``window``; ``space`` needs the plan's
types: with the types beside ``plan`` that was a cycle).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from filecord._pieces.rows import FileRows

MiB = 1 << 20
BLOCK = 4096

WindowWhy = Literal["asked", "default", "fitted", "shrunk", "grown"]


def size_text(n: int) -> str:
    """``n`` bytes in MiB for people: whole MiB exactly, else one decimal; under 1 MiB in
    bytes (one decimal of a MiB would read 0.0)."""
    if 0 < n < MiB:
        return f"{n} bytes"
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n / MiB:.1f} MiB"

# Why the last partial block of a cloned piece is copied rather than cloned.
TailReason = Literal[
    "its last block is partial and not its source's last",
    "the output already reaches past it, so its partial last block cannot be cloned",
]
# Reasons a piece was copied although consume=True asked to move it (a piece shorter than a
# block, mid-source, is copied for its tail's reason).
Reason = Literal[
    TailReason,
    "not owned", "a symlink", "another hard link", "read-only", "another file system",
    "a gap below the moved range", "bytes after the range are not part of the save",
    "the output is not a regular file we created", "the file system keeps no holes", "Windows",
    "the file system refused the clone", "kept with the set it belongs to",
    "content the output does not carry", "a mount point",
]
# What happens to a piece: in-memory bytes are "written"; derived ones (``_pieces.derived``:
# bytes a function makes of file ranges, a chunk at a time) "computed"; file-backed ones one of
# the others.
# "adopted": the source becomes its output's file in place (space inserted in front of its
# blocks, nothing copied); planned with ``make_plan(adopt=True)``.
Action = Literal["written", "computed", "copied", "cloned", "moved", "adopted"]
ADOPTED: Action = "adopted"
IN_PLACE_WHY = ("it lies whole at a block-aligned offset of its output, on a file system that "
                "inserts ranges: space is inserted in front of its blocks, no byte copied")
NOT_OWNED: Reason = "not owned"
SYMLINK: Reason = "a symlink"
HARDLINK: Reason = "another hard link"
READ_ONLY: Reason = "read-only"
OTHER_FS: Reason = "another file system"
GAP: Reason = "a gap below the moved range"
GAP_TO_END: Reason = "bytes after the range are not part of the save"
NOT_OUR_FILE: Reason = "the output is not a regular file we created"
NO_HOLES: Reason = "the file system keeps no holes"
WINDOWS: Reason = "Windows"
CLONE_REFUSED: Reason = "the file system refused the clone"
IN_KEPT_SET: Reason = "kept with the set it belongs to"
NOT_CARRIED: Reason = "content the output does not carry"
MOUNT_POINT: Reason = "a mount point"
MID_TAIL: TailReason = "its last block is partial and not its source's last"
PAST_TAIL: TailReason = (
    "the output already reaches past it, so its partial last block cannot be cloned"
)

CLONING_FILESYSTEMS = frozenset({"btrfs", "xfs", "bcachefs", "ocfs2"})
NO_HOLE_FILESYSTEMS = frozenset({"vfat", "msdos", "exfat", "hfs", "hfsplus", "fuseblk"})


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """One distinct source file, as stat saw it during the preflight."""

    key: tuple[int, int]  # (dev, ino)
    path: str
    size: int
    owned: bool  # every FileBackedData naming this file owns it
    symlink: bool
    nlink: int
    regular: bool
    writable: bool
    deletable: bool = True  # its directory is writable on a read-write mount
    # bytes that cutting it gives back (st_blocks, less what it shares with other files and,
    # on btrfs, its largest extent: ``facts.freeable``); -1: unknown
    allocated: int = -1
    mount: int = 0  # mount id (two mounts of one file system share st_dev but not renames)
    # an ext4 file mapped by block lists, not extents (made before the extent feature was on):
    # ext4 inserts no range into it, so it is never adopted in place
    block_mapped: bool = False
    flags: int = -1  # its attribute flags (FS_IOC_GETFLAGS) for an owned file; -1: not read


@dataclass(frozen=True, slots=True)
class FsFacts:
    dev: int
    fs_type: str
    free: int
    can_clone: bool
    keeps_holes: bool
    block: int = BLOCK  # the unit the file system allocates in (statvfs f_frsize)
    # Inserts and collapses block ranges (fallocate INSERT_RANGE / COLLAPSE_RANGE), probed
    # only when asked (``gather(probe_insert=True)``): False means "no" or "not asked".
    can_insert: bool = False


@dataclass(frozen=True, slots=True)
class PieceRef:
    """One placement of a piece in an output (``source`` is None for in-memory bytes)."""

    output: int
    index: int
    out_offset: int
    length: int
    source: tuple[int, int] | None = None
    src_offset: int = 0
    # A piece of rows (:class:`FileRows`): its bytes are these source ranges, in order, not
    # ``[src_offset, src_offset + length)``; the plan decides for the piece as one unit.
    rows: FileRows | None = None
    computed: bool = False  # a derived piece: new bytes, never a placement of a source
    # A run of pieces ``index, index + 1, ...`` of these lengths (each non-empty), adjacent in
    # the output and in one source, read through one identity and one owner: the preflight
    # hands them over as this one placement, decided as one unit (100,000 slices that follow
    # each other in one file are one placement).  None: one piece of ``length`` bytes.
    lengths: tuple[int, ...] | None = None

    @property
    def count(self) -> int:
        """How many of the caller's pieces this placement stands for."""
        return 1 if self.lengths is None else len(self.lengths)


@dataclass(frozen=True, slots=True)
class OutputFacts:
    path: str  # the name the caller gave
    target: str  # the file actually replaced (a symlink at ``path`` is followed)
    dev: int
    length: int
    direct: bool  # not a regular file (FIFO, device): written in place, streamed
    mount: int = 0  # mount id of its directory (see SourceFacts.mount)
    discard: bool = False  # built in a temp that the commit unlinks: never published


@dataclass(frozen=True, slots=True)
class PieceAction:
    """What happens to one piece; ``reason`` explains every copy under ``consume=True``."""

    output: str
    index: int
    out_offset: int
    length: int
    action: Action
    source: str | None = None
    src_offset: int = 0
    reason: Reason | None = None
    # For "cloned": the bytes at the piece's end that are copied, not cloned (under one block),
    # and why (``MID_TAIL``, ``PAST_TAIL``); 0 and None when every byte is cloned.
    tail: int = 0
    tail_reason: TailReason | None = None
    # For a piece of rows (:class:`FileRows`): the source ranges it reads (adjacent rows
    # count once), 0 for any other piece.  ``src_offset`` is then its base range's start.
    runs: int = 0


def _output_of(r: PieceRef) -> int:
    return r.output


class PieceActions(Sequence[PieceAction]):
    """Every piece's :class:`PieceAction`, in output order, kept as one decision per placement.

    The plan decides per :class:`PieceRef`, and one stands for a whole run of adjacent pieces
    (``PieceRef.lengths``), so a run's pieces share one action and reason and differ only in
    index and offsets.  The per-piece values are made when first read (then kept): a save of
    100,000 slices decides and fills in a few placements, and builds the 100,000 values only
    for a caller that looks at them.  It reads as a tuple of them (length, index, slice,
    iteration, equality with a tuple, hash).  ``outcomes``: position -> the action as the fill
    carried it out, where that differs from the plan (a clone refused, so copied); only ever a
    one-piece placement.
    """

    __slots__ = ("_acts", "_all", "_count", "_outcomes", "_paths", "_refs", "_src_paths",
                 "_tails", "_whys")

    def __init__(
        self, refs: Sequence[PieceRef], acts: Sequence[Action],
        whys: Sequence[Reason | None], tails: Sequence[int], paths: Sequence[str],
        src_paths: Mapping[tuple[int, int], str],
        outcomes: Mapping[int, PieceAction] | None = None,
    ) -> None:
        self._refs = tuple(refs)
        self._acts = tuple(acts)
        self._whys = tuple(whys)
        self._tails = tuple(tails)
        self._paths = tuple(paths)
        self._src_paths = src_paths
        self._outcomes: Mapping[int, PieceAction] = outcomes or {}
        self._count = sum(r.count for r in self._refs)
        self._all: tuple[PieceAction, ...] | None = None

    @property
    def refs(self) -> tuple[PieceRef, ...]:
        """The placements decided, in output order."""
        return self._refs

    def positions(self, output: int) -> range:
        """The positions of output ``output``'s placements (placements are in output order)."""
        lo = bisect_left(self._refs, output, key=_output_of)
        return range(lo, bisect_left(self._refs, output + 1, lo, key=_output_of))

    def action_of(self, pos: int) -> Action:
        """What the plan decided for placement ``pos`` (every piece of it)."""
        return self._acts[pos]

    def piece_action(self, pos: int) -> PieceAction:
        """The action of one-piece placement ``pos`` (the first piece of a run)."""
        return next(self._expand(pos))

    def with_outcomes(self, outcomes: Mapping[int, PieceAction]) -> PieceActions:
        """The same, with the actions the fill carried out differently (see the class)."""
        if not outcomes:
            return self
        return PieceActions(self._refs, self._acts, self._whys, self._tails, self._paths,
                            self._src_paths, {**self._outcomes, **outcomes})

    def reasons(self) -> dict[Reason, int]:
        """Pieces per reason for a copy (``reason``), counted without building them."""
        out: dict[Reason, int] = {}
        for pos, r in enumerate(self._refs):
            done = self._outcomes.get(pos)
            why = done.reason if done is not None else self._whys[pos] if r.length else None
            if why is not None:
                out[why] = out.get(why, 0) + r.count
        return out

    def _expand(self, pos: int) -> Iterator[PieceAction]:
        done = self._outcomes.get(pos)
        if done is not None:
            yield done
            return
        r = self._refs[pos]
        out = self._paths[r.output]
        if r.source is None:
            yield PieceAction(out, r.index, r.out_offset, r.length,
                              "computed" if r.computed else "written")
            return
        act, src = self._acts[pos], self._src_paths[r.source]
        why = self._whys[pos] if r.length else None
        if r.lengths is None:
            tail = self._tails[pos]
            yield PieceAction(out, r.index, r.out_offset, r.length, act, src, r.src_offset,
                              why, tail, MID_TAIL if tail else None,
                              0 if r.rows is None else r.rows.run_count)
            return
        at, src_at = r.out_offset, r.src_offset
        for k, n in enumerate(r.lengths):
            yield PieceAction(out, r.index + k, at, n, act, src, src_at, why)
            at += n
            src_at += n

    def _every(self) -> tuple[PieceAction, ...]:
        if self._all is None:
            self._all = tuple(a for pos in range(len(self._refs)) for a in self._expand(pos))
        return self._all

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[PieceAction]:
        return iter(self._every())

    @overload
    def __getitem__(self, i: int) -> PieceAction: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[PieceAction, ...]: ...
    def __getitem__(self, i: int | slice) -> PieceAction | tuple[PieceAction, ...]:
        return self._every()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PieceActions, tuple)):
            return self._every() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._every())

    def __repr__(self) -> str:
        return repr(self._every())


@dataclass(frozen=True, slots=True)
class MoveSource:
    """A source shortened from its end down to ``run_start``; ``dests`` are its placements.

    ``adopt``: the source is not copied at all: it is renamed onto its one destination's temp
    (no bytes move, no extra disk).  Either it is the whole of that output and nothing else,
    or it is adopted in place (:class:`InPlace`): its destination's ``out_offset`` bytes are
    inserted in front of it and the rest of the output is written around it.
    """

    key: tuple[int, int]
    path: str
    size: int
    run_start: int
    dests: tuple[PieceRef, ...]
    adopt: bool = False


@dataclass(frozen=True, slots=True)
class InPlace:
    """An owned source that can become its output's file where it lies (adoption in place).

    Its bytes are the output's ``[out_offset, out_offset + length)``, the whole source, at a
    multiple of the file system's block, on a file system that inserts ranges: the output is
    built around its blocks (``out_offset`` bytes inserted in front, what follows appended),
    and the undo is a collapse and a truncate.  One per output at most: the largest.
    ``pieces``: the indexes of the caller's pieces it stands for (adjacent slices count).
    """

    output: int
    key: tuple[int, int]
    path: str
    out_offset: int
    length: int
    pieces: tuple[int, ...]
    why: str = IN_PLACE_WHY


@dataclass(frozen=True, slots=True)
class FsPeak:
    """``needed``: bytes the file system must have free at the save's worst instant: the data it
    allocates, rounded up to ``block``-byte blocks, plus ``margin`` (see :func:`space_margin`).
    ``consume_needed``: what ``consume=True`` would need instead, when it was asked for."""

    dev: int
    fs_type: str
    needed: int
    free: int
    margin: int = 0
    block: int = BLOCK
    consume_needed: int | None = None

    @property
    def fits(self) -> bool:
        return self.needed <= self.free

@dataclass(frozen=True, slots=True)
class WindowChoice:
    """The window a plan uses and why.

    ``why``: "asked" (passed explicitly), "default" (the default, unchanged), "fitted" (the
    default cut to 1/36 of the ``moved`` bytes, so the window adds under 3% to the peak),
    "shrunk" (the default halved to fit the free space) or "grown" (the default doubled: the
    save moves enough bytes and the free space holds it with a window to spare).  ``free``
    and ``fs_type``: the file system whose free space decided (the tightest one).
    ``default_fits``: for an explicit window that does not fit, the window the default would
    have shrunk to and that fits (None when none would, or when it fits).
    """

    used: int
    asked: int
    why: WindowWhy
    free: int | None = None
    fs_type: str | None = None
    default_fits: int | None = None
    # for "fitted": the bytes the save moves (on the file system that moves least, named by
    # ``fs_type`` when it moves on several)
    moved: int | None = None

    def note(self) -> str | None:
        """"shrunk from 64 MiB to 16 MiB: 20.6 MiB free on ext4", "grown from 64 MiB to
        512 MiB: ...", "fitted from 64 MiB to 28 MiB: 1024 MiB moved", or None when the
        window is the one asked for or the default."""
        if self.why == "fitted" and self.moved is not None:
            on = f" on {self.fs_type}, the file system that moves least" if self.fs_type else ""
            return (f"fitted from {size_text(self.asked)} to {size_text(self.used)}: "
                    f"{size_text(self.moved)} moved{on}")
        if self.why not in ("shrunk", "grown"):
            return None
        where = f" on {self.fs_type}" if self.fs_type else ""
        free = "" if self.free is None else f": {size_text(self.free)} free{where}"
        return f"{self.why} from {size_text(self.asked)} to {size_text(self.used)}{free}"


@dataclass(frozen=True, slots=True)
class SavePlan:
    outputs: tuple[OutputFacts, ...]
    actions: PieceActions  # one per piece, read as a tuple; decided per placement
    moves: tuple[MoveSource, ...]
    # Owned sources deleted at commit (consume=True); never one written to a direct output.
    consumed: tuple[tuple[int, int], ...]
    peaks: tuple[FsPeak, ...]
    consume: bool
    window: int  # the window the moves use: the one asked for, or the default shrunk to fit
    window_choice: WindowChoice
    # The sources that could be adopted in place (:class:`InPlace`), whether or not the plan
    # was asked to (``make_plan(adopt=...)``); only with it do their pieces say "adopted".
    in_place: tuple[InPlace, ...] = ()
    # Why a source that lies whole at a block-aligned offset of its output is not adopted in
    # place (its file system does not insert ranges, or was not asked); None when none is.
    in_place_note: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(o.length for o in self.outputs)

    @property
    def adopted(self) -> dict[int, tuple[int, int]]:
        """Output -> the source adopted as its file (renamed onto its temp, whole or in
        place)."""
        return {m.dests[0].output: m.key for m in self.moves if m.adopt}

    @property
    def receiving(self) -> set[int]:
        """The outputs that receive bytes moved window by window."""
        return {d.output for m in self.moves if not m.adopt for d in m.dests}
