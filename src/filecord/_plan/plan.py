"""Pure planning: outputs + options + facts about files -> what a save will do, and why.

Nothing here touches the disk.  ``facts.py`` gathers the stat results and file-system
capabilities at the edge; this module turns them into a :class:`SavePlan` that lists, for every
file-backed piece, whether it will be cloned, moved or copied (with the reason for every copy
made under ``consume=True``) and the predicted peak disk per file system (counted by
``space``).  Because every decision is a function of plain values, each rule is
unit-testable without a disk.

In-memory pieces are "written" and derived ones "computed" (new bytes the fill makes of its
sources while they are whole: never moved or cloned, and no placement of a source).

Decision rules (``consume=True``; without it, pieces are only cloned or copied):

* clone: source and output on one file system that can clone, and the output offset and the
  source offset block-aligned.  The piece's block-aligned body is cloned; so is a partial last
  block when the piece reaches its source's end (the kernel clones a source's partial EOF
  block only where the cloned range reaches the destination's end, which holds because temps
  are filled in output order and never presized before the fill).  Otherwise the unaligned
  tail (under one block) is copied, and the action says so (``tail``, ``tail_reason``).  A
  piece shorter than a block that does not reach its source's end is copied.  An owned file
  that could be moved is cloned only if *all* its pieces start block-aligned on both sides, so
  that one file is never half cloned, half moved: clones and copies never shorten a source,
  so such a file needs no journal entry to be rolled back (only the deletion at commit).
* move: the file is owned (by every object naming it), regular, not reached through a symlink,
  has one hard link, is writable, lives on the output's file system, that file system keeps
  holes, the output is a temp file we create, and the pieces' ranges, merged, reach the end of
  the file.  Ranges below a gap are copied ("a gap below the moved range"); without a run that
  reaches the end of the file nothing is moved.  A range used by several outputs, or several
  times in one, is still moved: every destination is written before the source is shortened.
* consumed (deleted at commit): every owned source of the save, except one written to a
  direct output (FIFO, device): a stream is not storage, so such a source is copied and kept.
* adopted in place (:func:`in_place`): a moved source that is used once, whole, at a multiple
  of the block of an output on a file system that inserts ranges (probed), on the output's
  mount, can become that output's file: the largest such source per output.  The plan always
  lists them (``SavePlan.in_place``); with ``adopt=True`` (what a consuming save passes
  unless ``in_place=False``) its pieces say "adopted" and the transaction builds the
  output around it (``_txn.save``); without, they are moved.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from filecord._plan.space import peaks_at, shape_of
from filecord._plan.types import (
    ADOPTED,
    BLOCK,
    GAP,
    GAP_TO_END,
    HARDLINK,
    MID_TAIL,
    NO_HOLES,
    NOT_OUR_FILE,
    NOT_OWNED,
    OTHER_FS,
    READ_ONLY,
    SYMLINK,
    WINDOWS,
    Action,
    FsFacts,
    FsPeak,
    InPlace,
    MoveSource,
    OutputFacts,
    PieceActions,
    PieceRef,
    Reason,
    SavePlan,
    SourceFacts,
    WindowChoice,
)
from filecord._plan.window import choose


def clone_tail(
    ref: PieceRef, src: SourceFacts, out: OutputFacts, fs: FsFacts | None
) -> int | None:
    """Bytes at the end of ``ref`` to copy after cloning the rest; None: no clone at all.

    Both offsets must be multiples of the file system's block.  A piece reaching its source's
    end clones whole (the kernel takes a partial EOF block where the cloned range reaches the
    destination's end, and the fill writes each temp in output order); otherwise the part of
    its last block that is partial is copied.  The caller copies a piece whose tail is all of it.
    """
    if (out.direct or fs is None or not fs.can_clone or src.key[0] != out.dev or ref.length == 0
            or ref.rows is not None):  # rows are copied run by run (a copy_file_range each)
        return None
    block = fs.block if fs.block > 0 else BLOCK
    if ref.out_offset % block or ref.src_offset % block:
        return None
    if ref.src_offset + ref.length == src.size:
        return 0
    return ref.length % block


def _clone_ok(ref: PieceRef, src: SourceFacts, out: OutputFacts, fs: FsFacts | None) -> bool:
    """Whether every byte of ``ref`` is cloned (no tail copied)."""
    return clone_tail(ref, src, out, fs) == 0


def _move_refusal(
    src: SourceFacts, outs: Iterable[OutputFacts], fs_of: Mapping[int, FsFacts]
) -> Reason | None:
    if sys.platform == "win32":  # pragma: no cover - no sparse files by default there
        return WINDOWS
    if not src.owned:
        return NOT_OWNED
    if src.symlink:
        return SYMLINK
    if not src.regular:
        return NOT_OUR_FILE
    if src.nlink != 1:
        return HARDLINK
    if not src.writable:
        return READ_ONLY
    for out in outs:
        if out.direct:
            return NOT_OUR_FILE
        if out.dev != src.key[0]:
            return OTHER_FS
        fs = fs_of.get(out.dev)
        if fs is not None and not fs.keeps_holes:
            return NO_HOLES
    return None


def _deletable(src: SourceFacts, outs: Iterable[OutputFacts]) -> bool:
    """Whether a consuming save takes the file over (deletes it at commit).

    Never a file reached through a symlink (the link would go, not the data), one the save
    could not delete (read-only directory or mount: known now, not after the commit point), or
    one streamed into a FIFO or device (no atomic output to hand its bytes to).
    """
    return (src.owned and not src.symlink and src.regular and src.deletable
            and not any(o.direct for o in outs))


def _adoptable(
    moved: tuple[PieceRef, ...], src: SourceFacts, nonempty: dict[int, int],
    outputs: Sequence[OutputFacts],
) -> bool:
    """The whole file is the whole of one output, used once: rename it instead of copying.

    ``nonempty[o]`` counts the pieces of output ``o`` that hold at least one byte, so the
    test is O(1) per source (the save of N files into N outputs stays linear).  A rename
    across two mounts of one file system fails (EXDEV), so those are moved window by window.
    """
    if len(moved) != 1 or moved[0].src_offset != 0 or moved[0].length != src.size:
        return False
    if src.mount != outputs[moved[0].output].mount:
        return False
    return nonempty.get(moved[0].output, 0) == 1  # ``moved[0]`` itself holds bytes


def merged_runs(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge half-open ranges that overlap or touch; sorted, non-empty ranges only."""
    runs: list[tuple[int, int]] = []
    start = end = -1  # the run being merged: one tuple per run, not one per range merged
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if end >= 0 and lo <= end:
            if hi > end:
                end = hi
            continue
        if end >= 0:
            runs.append((start, end))
        start, end = lo, hi
    if end >= 0:
        runs.append((start, end))
    return runs


def cover(
    dests: Sequence[PieceRef], lo: int, hi: int
) -> list[tuple[int, int, PieceRef]]:
    """Non-overlapping segments ``(start, end, ref)`` of ``[lo, hi)``, each held by ``ref``.

    Used to put moved bytes back: any one destination holding a byte will do (at each point,
    the one that holds the longest run from there).  Raises ``ValueError`` if some byte of
    ``[lo, hi)`` is held by no destination.  One pass over ``dests`` and a sort of the ones
    that meet the range: O(N + k log k), not a scan of every destination per segment.
    """
    meeting = sorted(
        (d for d in dests if d.length and d.src_offset < hi and d.src_offset + d.length > lo),
        key=lambda d: d.src_offset,
    )
    segs: list[tuple[int, int, PieceRef]] = []
    pos = lo
    i = 0
    best: PieceRef | None = None
    while pos < hi:
        # Of every destination starting at or before ``pos``, keep the one reaching furthest.
        while i < len(meeting) and meeting[i].src_offset <= pos:
            d = meeting[i]
            if best is None or d.src_offset + d.length > best.src_offset + best.length:
                best = d
            i += 1
        if best is None or best.src_offset + best.length <= pos:
            raise ValueError(f"no destination holds source byte {pos}")
        end = min(hi, best.src_offset + best.length)
        segs.append((pos, end, best))
        pos = end
    return segs


def expand(refs: Iterable[PieceRef]) -> Iterator[PieceRef]:
    """Each placement of a piece of rows as one placement per run of its rows (in output
    order, keeping its index); other placements as they are.  What a move copies, journals and
    puts back are byte ranges, so a moved piece of rows is its runs there (only there: the
    plan decides, and the report speaks, for the piece as a whole)."""
    for r in refs:
        if r.rows is None:
            yield r
            continue
        at = r.out_offset
        for src_at, n in r.rows.runs():
            yield PieceRef(r.output, r.index, at, n, r.source, src_at)
            at += n


def coalesce(refs: Iterable[PieceRef]) -> tuple[PieceRef, ...]:
    """Runs of placements adjacent both in their output and in their source, each as one.

    The moves copy, journal and put back byte ranges, not pieces: 100,000 slices that follow
    each other in one file and in one output are one range to copy per window, one journal
    entry, one segment to restore.  A merged placement keeps its first piece's index and is one
    range (no ``lengths``: a byte range, not pieces).  The report is not touched: it still
    lists every piece the caller gave.
    """
    merged: list[PieceRef] = []
    first: PieceRef | None = None
    end_out = end_src = 0
    for r in refs:
        if (first is not None and r.out_offset == end_out and r.src_offset == end_src
                and r.output == first.output and r.source == first.source):
            end_out += r.length
            end_src += r.length
            continue
        if first is not None:
            merged.append(_run_of(first, end_out))
        first, end_out, end_src = r, r.out_offset + r.length, r.src_offset + r.length
    if first is not None:
        merged.append(_run_of(first, end_out))
    return tuple(merged)


def _run_of(first: PieceRef, end_out: int) -> PieceRef:
    length = end_out - first.out_offset
    if length == first.length and first.lengths is None:
        return first
    return PieceRef(first.output, first.index, first.out_offset, length, first.source,
                    first.src_offset)


def in_place(
    outputs: Sequence[OutputFacts],
    moves: Sequence[MoveSource],
    sources: Mapping[tuple[int, int], SourceFacts],
    filesystems: Mapping[int, FsFacts],
    pieces: Mapping[tuple[int, int], Sequence[PieceRef]],
) -> tuple[InPlace, ...]:
    """Per output, the largest moved source it can be built around in place (pure).

    Eligible: a move (so owned, regular, one link, writable, on the output's file system)
    that is not already a whole-output rename, whose one destination (adjacent slices merged)
    is the whole source, non-empty, at a multiple of the file system's block, in an output on
    a file system that inserts ranges and on the source's mount (the file is renamed to the
    output's temp), mapped by extents (``SourceFacts.block_mapped``).  ``pieces[key]``: the
    placements of each source (their indexes are reported).  Ties go to the first in the
    plan's order.
    """
    best: dict[int, InPlace] = {}
    for m in moves:
        if m.adopt or m.run_start != 0 or len(m.dests) != 1 or m.size == 0:
            continue
        d = m.dests[0]
        if d.src_offset != 0 or d.length != m.size:
            continue
        out = outputs[d.output]
        fs = filesystems.get(out.dev)
        src = sources[m.key]
        if (out.direct or fs is None or not fs.can_insert or out.mount != src.mount
                or src.block_mapped):
            continue
        if d.out_offset % BLOCK or d.out_offset % (fs.block if fs.block > 0 else BLOCK):
            continue
        have = best.get(d.output)
        if have is None or m.size > have.length:
            idx = tuple(i for r in pieces[m.key] if r.length
                        for i in range(r.index, r.index + r.count))
            best[d.output] = InPlace(d.output, m.key, m.path, d.out_offset, m.size, idx)
    return tuple(best[o] for o in sorted(best))


def _by_source(
    refs: Sequence[PieceRef],
) -> tuple[dict[tuple[int, int], list[int]], dict[int, int]]:
    """Positions in ``refs`` per source, and per output its pieces that hold bytes."""
    by_source: dict[tuple[int, int], list[int]] = {}
    nonempty: dict[int, int] = {}
    for pos, r in enumerate(refs):  # once per placement: no list made per lookup
        key = r.source
        if key is not None:
            held = by_source.get(key)
            if held is None:
                by_source[key] = [pos]
            else:
                held.append(pos)
        if r.length:
            o = r.output
            nonempty[o] = nonempty.get(o, 0) + (1 if r.lengths is None else len(r.lengths))
    return by_source, nonempty


def _may_clone(
    key: tuple[int, int], out_ids: Iterable[int], sources: Mapping[tuple[int, int], SourceFacts],
    outputs: Sequence[OutputFacts], filesystems: Mapping[int, FsFacts],
) -> bool:
    """Whether one of these outputs could clone some piece of source ``key`` at all."""
    return any(clone_tail(PieceRef(o, 0, 0, 1, key, 0), sources[key], outputs[o],
                          filesystems.get(outputs[o].dev)) is not None for o in out_ids)


def _pieces_of(r: PieceRef) -> Iterator[PieceRef]:
    """A run's pieces as one-piece placements (a one-piece placement as it is)."""
    if r.lengths is None:
        yield r
        return
    at, src_at = r.out_offset, r.src_offset
    for k, n in enumerate(r.lengths):
        yield PieceRef(r.output, r.index + k, at, n, r.source, src_at)
        at += n
        src_at += n


def make_plan(
    outputs: Sequence[OutputFacts],
    refs: Sequence[PieceRef],
    sources: Mapping[tuple[int, int], SourceFacts],
    filesystems: Mapping[int, FsFacts],
    *,
    consume: bool,
    window: int,
    adopt: bool = False,
) -> SavePlan:
    """Decide every piece's action, the sync window and the peak disk per file system (pure).

    ``adopt``: the sources :func:`in_place` finds are adopted in place: their pieces say
    "adopted" instead of "moved", their :class:`MoveSource` has ``adopt`` set (the
    transaction renames them onto the output's temp and inserts the space in front of them)
    and they come first in ``moves``.

    ``window`` left at :data:`DEFAULT_WINDOW` may grow or shrink to the largest that fits the
    free space (``window.choose``); any other value is used as is.

    Cost: linear in the pieces plus a sort per moved source, with per-piece work kept to list
    indexing (decisions are kept by a piece's position in ``refs``, never in a dict keyed by a
    dataclass, whose hash builds a tuple each time), so 100,000 pieces plan in well under a
    second.
    """
    if window < BLOCK:
        raise ValueError(f"the sync window must be at least {BLOCK} bytes, got {window}")
    refs, by_source, nonempty = _split_clonable_runs(refs, sources, outputs, filesystems)
    acts, whys, tails, moves = _decide_sources(refs, by_source, nonempty, sources, outputs,
                                               filesystems, consume=consume)
    moves, adoptable, note = _choose_in_place(refs, by_source, acts, moves, sources, outputs,
                                              filesystems, adopt=adopt and consume)
    actions = PieceActions(refs, acts, whys, tails, [o.path for o in outputs],
                           {k: s.path for k, s in sources.items()})
    consumed = tuple(
        k for k, s in sources.items()
        if consume and k in by_source
        and _deletable(s, [outputs[o] for o in {refs[i].output for i in by_source[k]}])
    )
    choice, peaks = _fit_window(outputs, refs, sources, filesystems, acts, actions, moves,
                                consumed, window=window, consume=consume)
    return SavePlan(
        outputs=tuple(outputs),
        actions=actions,
        moves=tuple(moves),
        consumed=consumed,
        peaks=peaks,
        consume=consume,
        window=choice.used,
        window_choice=choice,
        in_place=adoptable,
        in_place_note=note,
    )


def _split_clonable_runs(
    refs: Sequence[PieceRef], sources: Mapping[tuple[int, int], SourceFacts],
    outputs: Sequence[OutputFacts], filesystems: Mapping[int, FsFacts],
) -> tuple[Sequence[PieceRef], dict[tuple[int, int], list[int]], dict[int, int]]:
    """Phase 1: the placements, with the runs of a source some output could clone from taken
    apart again (a clone is decided per piece: its offsets' alignment, its tail, so a run
    decides as its pieces did); per source its positions, per output its non-empty pieces."""
    by_source, nonempty = _by_source(refs)
    split = {key for key, positions in by_source.items()
             if any(refs[i].lengths is not None for i in positions)
             and _may_clone(key, {refs[i].output for i in positions}, sources, outputs,
                            filesystems)}
    if split:
        refs = tuple(one for r in refs
                     for one in (_pieces_of(r) if r.source in split else (r,)))
        by_source, nonempty = _by_source(refs)
    return refs, by_source, nonempty


def _decide_sources(
    refs: Sequence[PieceRef], by_source: Mapping[tuple[int, int], list[int]],
    nonempty: dict[int, int], sources: Mapping[tuple[int, int], SourceFacts],
    outputs: Sequence[OutputFacts], filesystems: Mapping[int, FsFacts], *, consume: bool,
) -> tuple[list[Action], list[Reason | None], list[int], list[MoveSource]]:
    """Phase 2: per source, each placement cloned, copied (and why) or moved; the moves."""
    n = len(refs)
    acts: list[Action] = ["written"] * n
    whys: list[Reason | None] = [None] * n
    tails: list[int] = [0] * n
    moves: list[MoveSource] = []
    for key, positions in by_source.items():
        src = sources[key]
        placements = [refs[i] for i in positions]
        out_ids = {r.output for r in placements}
        outs = [outputs[o] for o in sorted(out_ids)]
        # clone_tail per piece only where some output could clone from this file at all.
        clones = {o for o in out_ids if _may_clone(key, (o,), sources, outputs, filesystems)}
        if clones:
            clonable = [
                clone_tail(r, src, outputs[r.output], filesystems.get(outputs[r.output].dev))
                if r.output in clones else None
                for r in placements
            ]
        else:
            clonable = [None] * len(placements)
        refusal = _move_refusal(src, outs, filesystems) if consume else None
        # A file whose every piece clones (at least its aligned body) need not be shortened
        # at all: clone it and copy the tails, never move a part of it.
        all_clone = bool(clones) and all(
            c is not None for r, c in zip(placements, clonable, strict=True) if r.length
        )
        if not clones:
            all_clone = not any(r.length for r in placements)
        if not consume or refusal is not None or all_clone:
            for i, r, c in zip(positions, placements, clonable, strict=True):
                if c is None:
                    acts[i], whys[i] = "copied", refusal
                elif c == r.length:  # shorter than a block, mid-source: nothing to clone
                    acts[i], whys[i] = "copied", MID_TAIL if consume else refusal
                else:
                    acts[i] = "cloned"
                    tails[i] = c
            continue
        segs = coalesce(expand(placements))  # adjacent slices: one range, not thousands
        runs = merged_runs((r.src_offset, r.src_offset + r.length) for r in segs)
        top = runs[-1] if runs else None
        if top is None or top[1] != src.size:
            for i, r in zip(positions, placements, strict=True):
                acts[i], whys[i] = "copied", GAP_TO_END if r.length else None
            continue
        moved: list[PieceRef] = []
        for i, r in zip(positions, placements, strict=True):
            # its lowest source byte (a piece of rows: its lowest row's), inline: once a piece
            if r.length and (r.src_offset if r.rows is None else r.rows.lowest) >= top[0]:
                acts[i] = "moved"
                moved.append(r)
            else:
                acts[i], whys[i] = "copied", GAP if r.length else None
        dests = segs if len(moved) == len(placements) else coalesce(expand(moved))
        moves.append(MoveSource(key, src.path, src.size, top[0], dests,
                                _adoptable(dests, src, nonempty, outputs)))
    return acts, whys, tails, moves


def _choose_in_place(
    refs: Sequence[PieceRef], by_source: Mapping[tuple[int, int], list[int]],
    acts: list[Action], moves: list[MoveSource], sources: Mapping[tuple[int, int], SourceFacts],
    outputs: Sequence[OutputFacts], filesystems: Mapping[int, FsFacts], *, adopt: bool,
) -> tuple[list[MoveSource], tuple[InPlace, ...], str | None]:
    """Phase 3: the sources that could be adopted in place (always listed) and, with
    ``adopt``, those adopted: their pieces' actions say so and their moves come first; why
    an output with a source lying whole and aligned is not built around it."""
    adoptable = in_place(
        outputs, moves, sources, filesystems,
        {m.key: [refs[i] for i in by_source[m.key]] for m in moves if not m.adopt},
    ) if any(f.can_insert for f in filesystems.values()) else ()
    note = None
    if adopt and len(adoptable) < len({d.output for m in moves if not m.adopt
                                       for d in m.dests}):
        note = _why_not_in_place(outputs, moves, sources, filesystems, by_source, refs,
                                 {ip.output for ip in adoptable})
    if adopt and adoptable:
        chosen_keys = {ip.key for ip in adoptable}
        for ip in adoptable:
            for i in by_source[ip.key]:
                if refs[i].length:
                    acts[i] = ADOPTED
        # An adoption runs before every move: the other sources' bytes are moved into the
        # adopted file, so their undo (newest first) runs before the adoption's own.
        moves = ([replace(m, adopt=True) for m in moves if m.key in chosen_keys]
                 + [m for m in moves if m.key not in chosen_keys])
    return moves, adoptable, note


def _fit_window(
    outputs: Sequence[OutputFacts], refs: Sequence[PieceRef],
    sources: Mapping[tuple[int, int], SourceFacts], filesystems: Mapping[int, FsFacts],
    acts: list[Action], actions: PieceActions, moves: list[MoveSource],
    consumed: tuple[tuple[int, int], ...], *, window: int, consume: bool,
) -> tuple[WindowChoice, tuple[FsPeak, ...]]:
    """Phase 4: the peak disk per file system, with the window fitted to it."""
    # all peaks_at reads of the actions (clones are one-piece placements: see ``split``)
    cloned = [actions.piece_action(i) for i, a in enumerate(acts) if a == "cloned"]
    moving = {m.key for m in moves}
    shape = shape_of(
        outputs, moves, refs=refs, acts=acts,
        block={d: f.block if f.block > 0 else BLOCK for d, f in filesystems.items()},
        journaled=bool(moves or consumed or any(o.discard for o in outputs)
                       or sum(not o.direct for o in outputs) > 1),
        consumed=[sources[k].path for k in consumed if k not in moving],
    )
    # One window serves every file system, so it is fitted to the one that moves least: a
    # window of 1/36 of the bytes moved there keeps each file system's peak under 1.03x.
    per_fs: dict[int, int] = {}
    for m in moves:
        if not m.adopt:
            per_fs[m.key[0]] = per_fs.get(m.key[0], 0) + m.size - m.run_start
    least = min(per_fs, key=lambda dev: per_fs[dev], default=None)
    choice, chosen = choose(
        lambda w: peaks_at(outputs, cloned, moves, sources, filesystems, w, shape), window,
        moves=bool(moves), moved=0 if least is None else per_fs[least],
        moved_on=(filesystems[least].fs_type if least is not None and len(per_fs) > 1
                  and least in filesystems else None),
    )
    peaks = tuple(chosen)
    if not consume and any(s.owned for s in sources.values()) and not all(p.fits for p in peaks):
        # Say what consume=True would need only where it was worked out, never as a guess.
        alt = {
            p.dev: p.needed
            for p in make_plan(
                outputs, refs, sources, filesystems, consume=True, window=window
            ).peaks
        }
        peaks = tuple(replace(p, consume_needed=alt.get(p.dev)) for p in peaks)
    return choice, peaks


def _why_not_in_place(
    outputs: Sequence[OutputFacts], moves: Sequence[MoveSource],
    sources: Mapping[tuple[int, int], SourceFacts], filesystems: Mapping[int, FsFacts],
    by_source: Mapping[tuple[int, int], list[int]], refs: Sequence[PieceRef], have: set[int],
) -> str | None:
    """Why an output that has a source lying whole at a block-aligned offset (as
    :func:`in_place` would take it on a file system that inserts ranges) is not built around
    it: its file system does not insert ranges.  None when there is no such output."""
    able = {dev: replace(f, can_insert=True) for dev, f in filesystems.items()}
    missed = [ip for ip in in_place(outputs, moves, sources, able,
                                    {m.key: [refs[i] for i in by_source[m.key]]
                                     for m in moves if not m.adopt})
              if ip.output not in have]
    if not missed:
        return None
    kinds = sorted({filesystems[outputs[ip.output].dev].fs_type for ip in missed})
    return (f"not adopted in place ({len(missed)} source(s) lie whole at a block-aligned "
            f"offset): {', '.join(kinds)} does not insert ranges, so they were moved")
