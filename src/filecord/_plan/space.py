"""Pure space arithmetic: how many bytes each file system must have free at a save's worst
instant, and the refusal when it has not.

Nothing here touches the disk: the facts (lengths, block sizes, free bytes, allocated bytes of
sparse sources) come from ``facts`` through the plan, and the plan (``plan.make_plan``)
decides what is cloned, moved or copied; this module only counts what those decisions
allocate and free: new bytes are rounded up to whole blocks, only whole blocks count as shared
by a clone or freed by a truncation, a move holds one sync window twice, and a margin
(:func:`space_margin`) covers file-system metadata of new files and the journal.
``window.choose`` calls :func:`peaks_at` once per candidate window; what does not depend on
the window (:class:`Shape`: the order of the moves, the journal, the lock files) is counted once
per plan by :func:`shape_of`.

Why the order of the moves matters.  The fill writes every byte that is not moved before the
first move, and a block holding the boundary between two pieces is allocated by whichever of
them is written first.  A moved run that starts or ends mid-block therefore finds its edge
blocks already allocated when a neighbour was written before it, and allocates them itself
when it comes first; its source frees only whole blocks either way.  Counted over the moves in
the order they run, the disk can stand higher after an early move than at the end (one block
per row run of the first of two interleaved shards); :func:`shape_of` walks that order once and
keeps the highest point above the end state.

XFS reserves, for every range written but not yet allocated (delayed allocation), the extent
tree blocks its worst case could need (about one block per 250 of the range, plus one per tree
level) until writeback allocates it; every range the fill leaves dirty in an output that
receives moves, and every run a window writes, holds such a reservation at the first window's
fsync (measured on a 1 GiB XFS: 16 MiB window 21 blocks, each 1 MiB run 5).  An adoption's
insert range splits extent-tree blocks too (32 to 48 blocks measured), and so does a clone:
each remap transaction reserves blocks for the extent and reference-count trees it may split
(a 16 MiB clone at exactly the rest of the plan's need failed until 33 to 40 blocks more
were free).  Transactions run one at a time and give back what they did not use, so one
clone's reservation is counted per file system, not one per clone.

btrfs writes every change of metadata to new blocks, from the pool ``statvfs`` counts free
when the file system is small enough to mix data and metadata (under 1 GiB by default): a
move of a file that shares its extents, at exactly the rest of the plan's need, failed to
append its journal step until 8 blocks more were free; :data:`BTRFS_BLOCKS` are kept for it.
What a cut gives back on btrfs (only whole extents) comes from ``facts.freeable``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from filecord._plan.types import (
    BLOCK,
    FsFacts,
    FsPeak,
    MiB,
    MoveSource,
    OutputFacts,
    PieceAction,
    PieceRef,
    SavePlan,
    SourceFacts,
    size_text,
)
from filecord.errors import InsufficientSpaceError

# The space check's margin, in blocks of the file system: per output file, its inode's overflow
# (extent tree or indirect blocks: one per started 128 MiB of data) and its directory entry's
# share of a directory block; and, when a journal is written, its file and directory entry.
MARGIN_BLOCKS_PER_FILE = 2
MARGIN_DATA_PER_BLOCK = 128 * MiB
MARGIN_JOURNAL_BLOCKS = 2
# XFS's delayed-allocation reservation (see the module's docstring), in blocks: per dirty range,
# and one per this many blocks of it; what an adoption's insert range may split on XFS.
XFS_BLOCKS_PER_RANGE = 6
XFS_RANGE_BLOCKS_PER_BLOCK = 250
XFS_INSERT_BLOCKS = 64
XFS_REMAP_BLOCKS = 64
BTRFS_BLOCKS = 16
# A bound on the journal's bytes (``_txn.journal``: the head, then the steps): fixed fields
# per output, per source and per destination, beside the paths themselves.  The head is
# counted twice (journal version 5 wrote it twice; version 6 once): a looser bound, never a
# smaller one, so no plan that fitted before is refused now.
JOURNAL_FIXED = 1024
JOURNAL_PER_OUTPUT = 256
JOURNAL_PER_SOURCE = 512  # its fields in the head, and its look in the committed step


def space_margin(files: int, data: int, block: int, *, journal: bool) -> int:
    """The bytes the space check adds beyond the data's own blocks: file-system metadata of
    ``files`` new files holding ``data`` bytes, and a journal's file when one is written."""
    blocks = MARGIN_BLOCKS_PER_FILE * files + -(-data // MARGIN_DATA_PER_BLOCK)
    return block * (blocks + (MARGIN_JOURNAL_BLOCKS if journal else 0))


@dataclass(frozen=True, slots=True)
class Shape:
    """What a file system's peak needs besides the data, whatever the window.

    ``files``: new files besides the outputs and the journal (the lock files, one per
    directory a temp is made in); ``journal``: bytes of the journal, when it is on this file
    system (its own file and directory entry are ``space_margin``'s ``journal=True``);
    ``dirty``: ranges the fill leaves unallocated in outputs that receive moves (XFS reserves
    for each); ``filled``: the first and last block, ``(output, block)``, of every range the
    fill writes in an output that receives moves (the blocks a moved run may find allocated).
    """

    files: int = 0
    journal: int = 0
    dirty: int = 0
    filled: frozenset[tuple[int, int]] = frozenset()


def journal_bytes(outputs: Sequence[OutputFacts], moves: Sequence[MoveSource],
                  consumed: Sequence[str]) -> int:
    """A bound on the journal's length: twice its head, and every step it can append."""
    def path(p: str) -> int:  # as JSON, made absolute and resolved (up to 256 bytes more)
        return len(json.dumps(p)) + 256

    # a destination is four numbers: its output's index, its offset and length there (at most
    # the longest output's digits) and its source offset (at most the source size's)
    out_digits = len(str(max((o.length for o in outputs), default=0)))
    index_digits = len(str(len(outputs)))
    head = JOURNAL_FIXED + sum(JOURNAL_PER_OUTPUT + path(o.target) for o in outputs)
    head += sum(JOURNAL_PER_SOURCE + path(m.path)
                + (6 + index_digits + 2 * out_digits + len(str(m.size))) * len(m.dests)
                for m in moves)
    head += sum(JOURNAL_PER_SOURCE + path(c) for c in consumed)
    return 2 * head + JOURNAL_FIXED + JOURNAL_PER_SOURCE * (len(moves) + len(consumed))


def shape_of(
    outputs: Sequence[OutputFacts],
    moves: Sequence[MoveSource],
    *,
    refs: Sequence[PieceRef] = (),
    acts: Sequence[str] = (),
    journaled: bool | None = None,
    consumed: Sequence[str] = (),
    block: Mapping[int, int] | None = None,
) -> dict[int, Shape]:
    """Per file system, what :func:`peaks_at` adds whatever the window (:class:`Shape`).

    ``refs`` and ``acts``: every placement and its action, for the bytes the fill writes
    before the moves (none given: the moved bytes are all there is); ``journaled``: whether
    the save writes a journal (None: when it moves); ``consumed``: the paths of the sources
    the journal lists without moving them; ``block``: each file system's block (default
    :data:`BLOCK`)."""
    sizes = block or {}
    files: dict[int, int] = {}
    for dev, _directory in {(o.dev, os.path.dirname(o.target)) for o in outputs
                            if not o.direct}:
        files[dev] = files.get(dev, 0) + 1  # its lock file
    journal: dict[int, int] = {}
    if journaled if journaled is not None else bool(moves):
        first = next((o for o in outputs if not o.direct), None)
        if first is not None:
            journal[first.dev] = journal_bytes(outputs, moves, consumed)
    receiving = {d.output for m in moves if not m.adopt for d in m.dests}
    filled: dict[int, set[tuple[int, int]]] = {}
    dirty: dict[int, int] = {}
    last_end: dict[int, int] = {}
    for r, act in zip(refs, acts, strict=True):
        if r.output not in receiving or not r.length or act == "moved":
            continue
        dev = outputs[r.output].dev
        b = sizes.get(dev, BLOCK)
        end = r.out_offset + r.length
        edges = filled.setdefault(dev, set())
        edges.add((r.output, r.out_offset // b))
        edges.add((r.output, (end - 1) // b))
        if last_end.get(r.output) != r.out_offset:  # a new range the fill leaves dirty
            dirty[dev] = dirty.get(dev, 0) + 1
        last_end[r.output] = end
    return {
        dev: Shape(files=files.get(dev, 0), journal=journal.get(dev, 0),
                   dirty=dirty.get(dev, 0), filled=frozenset(filled.get(dev, ())))
        for dev in {*files, *journal, *filled}
    }


def _freed(m: MoveSource, sources: Mapping[tuple[int, int], SourceFacts]) -> int:
    """Bytes a move's truncations free: only what the source had allocated (a sparse
    source's holes are written into the temps as data)."""
    run = m.size - m.run_start
    source = sources.get(m.key)
    alloc = -1 if source is None else source.allocated
    return run if alloc < 0 else min(run, alloc)


def _highest(
    moves: Sequence[MoveSource], sources: Mapping[tuple[int, int], SourceFacts],
    block_of: Callable[[int], int], window: int, shape: Mapping[int, Shape],
) -> dict[int, tuple[int, int]]:
    """Per file system, in blocks: the highest the moves take the disk above where the fill
    left it (at a window written and not yet cut from its source), and where they leave it.

    The moves are replayed as ``_txn.transfer.move_source`` runs them: in the plan's order,
    each source window by window from its end, every part of a run the window holds written
    before the source is cut below the window.  A part allocates the blocks it spans but its
    first and last when something written before it (the fill, an earlier part) holds them;
    a cut frees the source's blocks above it, counted late for a sparse source (its holes may
    be anywhere), so that the end state frees ``_freed``'s whole blocks."""
    touched: set[tuple[int, int]] = set()
    for sh in shape.values():
        touched |= sh.filled
    level: dict[int, int] = {}
    high: dict[int, int] = {}
    for m in moves:
        if m.adopt or m.size <= m.run_start:
            continue
        dev = m.key[0]
        b = block_of(dev)
        cut_total = -(-m.size // b) - -(-m.run_start // b)
        short = cut_total - _freed(m, sources) // b  # blocks a cut frees only on paper
        windows: dict[int, list[PieceRef]] = {}
        for d in m.dests:
            if d.length > 0:
                for k in range((m.size - d.src_offset - d.length) // window,
                               (m.size - d.src_offset - 1) // window + 1):
                    windows.setdefault(k, []).append(d)
        now = top = level.get(dev, 0)
        freed = 0
        for k in sorted(windows):
            pos = m.size - k * window
            lo = max(m.run_start, pos - window)
            for d in windows[k]:
                start = max(d.src_offset, lo)
                n = min(d.src_offset + d.length, pos) - start
                if n <= 0:
                    continue
                at = d.out_offset + start - d.src_offset
                first, last = at // b, (at + n - 1) // b
                now += last - first + 1
                for edge in ((d.output, first), (d.output, last)) if last > first else (
                        (d.output, first),):
                    if edge in touched:
                        now -= 1
                    else:
                        touched.add(edge)
            top = max(top, now)
            cut = max(0, -(-m.size // b) - -(-lo // b) - short)
            now -= cut - freed
            freed = cut
        now -= max(0, cut_total - short) - freed  # a run's last windows held no part
        level[dev] = now
        high[dev] = max(high.get(dev, 0), top)
    return {dev: (high[dev], level[dev]) for dev in level}


def peaks_at(
    outputs: Sequence[OutputFacts],
    actions: Sequence[PieceAction],
    moves: Sequence[MoveSource],
    sources: Mapping[tuple[int, int], SourceFacts],
    filesystems: Mapping[int, FsFacts],
    window: int,
    shape: Mapping[int, Shape] | None = None,
) -> tuple[FsPeak, ...]:
    """Bytes each file system must find free at the worst instant of the save.

    New bytes are the outputs' lengths, each rounded up to whole blocks, minus what is shared
    (cloned), adopted, or freed by the moves (each source's whole blocks; a second destination
    of the same bytes is new data).  The moves can stand higher than where they end: a window
    is held twice before its source is cut, and a run off its source's block grid can take a
    block its source does not give back until a later run shares it (:func:`_highest`, on the
    fill's blocks in ``shape``, from :func:`shape_of`: computed from the moves alone when not
    given).  The margin covers the metadata of new files, the journal and XFS's reservations.
    """
    def block_of(dev: int) -> int:
        fs = filesystems.get(dev)
        return fs.block if fs is not None and fs.block > 0 else BLOCK

    if shape is None:
        shape = shape_of(outputs, moves, block={d: block_of(d) for d in filesystems})
    needed: dict[int, int] = {}
    files: dict[int, int] = {}
    data: dict[int, int] = {}
    ranges: dict[int, int] = {}  # ranges dirty at once, that XFS reserves for
    receiving = {d.output for m in moves if not m.adopt for d in m.dests}
    for o, out in enumerate(outputs):
        if not out.direct:
            b = block_of(out.dev)
            needed[out.dev] = needed.get(out.dev, 0) + -(-out.length // b) * b
            files[out.dev] = files.get(out.dev, 0) + 1
            data[out.dev] = data.get(out.dev, 0) + out.length
            if o not in receiving:  # written whole, dirty until its fsync
                ranges[out.dev] = ranges.get(out.dev, 0) + 1
    dev_of = {o.path: o.dev for o in outputs}
    clones: set[int] = set()
    for a in actions:
        if a.action == "cloned":
            # Whole blocks only: a partial last block is copied (a tail), or cloned and then
            # unshared by the kernel as soon as the output grows past it.
            dev = dev_of[a.output]
            needed[dev] -= a.length // block_of(dev) * block_of(dev)
            clones.add(dev)
            # what is written between two clones is a range of its own (XFS reserves per range)
            ranges[dev] = ranges.get(dev, 0) + 1
    inserts: dict[int, int] = {}
    for m in moves:
        dev = m.key[0]
        b = block_of(dev)
        if m.adopt:  # a rename allocates nothing: the output is the file's own blocks
            needed[dev] = needed.get(dev, 0) - -(-(m.size - m.run_start) // b) * b
            if m.dests and m.dests[0].out_offset:
                inserts[dev] = inserts.get(dev, 0) + 1
            continue
        needed[dev] = needed.get(dev, 0) - _freed(m, sources) // b * b
        # the runs one window writes at once, each a range XFS reserves for
        per_window = min(len(m.dests), window * len(m.dests) // max(1, m.size - m.run_start)
                         + 2)
        ranges[dev] = max(ranges.get(dev, 0), per_window)
    above = {dev: max(0, hi - end) * block_of(dev)
             for dev, (hi, end) in _highest(moves, sources, block_of, window, shape).items()}
    peaks = []
    for dev, n in sorted(needed.items()):
        fs = filesystems.get(dev)
        b = block_of(dev)
        sh = shape.get(dev, Shape())
        margin = space_margin(files.get(dev, 0) + sh.files, data.get(dev, 0), b,
                              journal=sh.journal > 0) + -(-sh.journal // b) * b
        held = max(0, n) + above.get(dev, 0)
        if fs is not None and fs.fs_type == "xfs":
            margin += b * (XFS_BLOCKS_PER_RANGE * (sh.dirty + ranges.get(dev, 0))
                           + -(-held // b) // XFS_RANGE_BLOCKS_PER_BLOCK
                           + XFS_INSERT_BLOCKS * inserts.get(dev, 0)
                           + XFS_REMAP_BLOCKS * (dev in clones))
        elif fs is not None and fs.fs_type == "btrfs":
            margin += b * BTRFS_BLOCKS
        peaks.append(
            FsPeak(
                dev=dev,
                fs_type=fs.fs_type if fs else "unknown",
                needed=held + margin,
                free=fs.free if fs else 0,
                margin=margin,
                block=b,
            )
        )
    return tuple(peaks)


def check_space(plan: SavePlan) -> None:
    """Refuse, before anything is created, a save that cannot fit at its peak."""
    choice = plan.window_choice
    for peak in plan.peaks:
        if peak.fits:
            continue
        where = ", ".join(o.path for o in plan.outputs if o.dev == peak.dev)
        window = ""
        if choice.why == "shrunk":
            window = f" with the smallest sync window, {size_text(choice.used)},"
        hint = ""
        if peak.consume_needed is not None and peak.consume_needed < peak.needed:
            hint = f"; consume=True would need {peak.consume_needed}"
        if choice.default_fits is not None:
            hint += (f"; window={choice.asked} was given: the default window would shrink to "
                     f"{size_text(choice.default_fits)} and fit")
        raise InsufficientSpaceError(
            f"not enough free space on the {peak.fs_type} file system holding {where}: "
            f"the save needs {peak.needed} bytes at its peak{window} (its data in "
            f"{peak.block}-byte blocks, plus a margin of {peak.margin} bytes for file-system "
            f"metadata and the journal) and {peak.free} are free{hint}",
            errno=errno.ENOSPC,
        )
