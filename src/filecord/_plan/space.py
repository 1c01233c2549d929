"""Pure space arithmetic: how many bytes each file system must have free at a save's worst
instant, and the refusal when it has not.

Nothing here touches the disk: the facts (lengths, block sizes, free bytes, allocated bytes of
sparse sources) come from ``facts`` through the plan, and the plan (``plan.make_plan``)
decides what is cloned, moved or copied; this module only counts what those decisions
allocate and free: new bytes are rounded up to whole blocks, only whole blocks count as shared
by a clone or freed by a truncation, a move holds one sync window twice, and a margin
(:func:`space_margin`) covers file-system metadata of new files and the journal.
``window.choose`` calls :func:`peaks_at` once per candidate window.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from filecord._plan.types import (
    BLOCK,
    FsFacts,
    FsPeak,
    MiB,
    MoveSource,
    OutputFacts,
    PieceAction,
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


def space_margin(files: int, data: int, block: int, *, journal: bool) -> int:
    """The bytes the space check adds beyond the data's own blocks: file-system metadata of
    ``files`` new files holding ``data`` bytes, and a journal's file when one is written."""
    blocks = MARGIN_BLOCKS_PER_FILE * files + -(-data // MARGIN_DATA_PER_BLOCK)
    return block * (blocks + (MARGIN_JOURNAL_BLOCKS if journal else 0))


def peaks_at(
    outputs: Sequence[OutputFacts],
    actions: Sequence[PieceAction],
    moves: Sequence[MoveSource],
    sources: Mapping[tuple[int, int], SourceFacts],
    filesystems: Mapping[int, FsFacts],
    window: int,
) -> tuple[FsPeak, ...]:
    """Bytes each file system must find free at the worst instant of the save.

    New bytes are the outputs' lengths, each rounded up to whole blocks, minus what is shared
    (cloned) or moved (each moved run counts once, in whole blocks; a second destination of the
    same bytes is new data).  A move also holds one sync window twice before the source is
    shortened.  The margin (:func:`space_margin`) covers the metadata of new files.
    """
    needed: dict[int, int] = {}
    files: dict[int, int] = {}
    data: dict[int, int] = {}

    def block_of(dev: int) -> int:
        fs = filesystems.get(dev)
        return fs.block if fs is not None and fs.block > 0 else BLOCK

    for out in outputs:
        if not out.direct:
            b = block_of(out.dev)
            needed[out.dev] = needed.get(out.dev, 0) + -(-out.length // b) * b
            files[out.dev] = files.get(out.dev, 0) + 1
            data[out.dev] = data.get(out.dev, 0) + out.length
    dev_of = {o.path: o.dev for o in outputs}
    for a in actions:
        if a.action == "cloned":
            # Whole blocks only: a partial last block is copied (a tail), or cloned and then
            # unshared by the kernel as soon as the output grows past it.
            dev = dev_of[a.output]
            needed[dev] -= a.length // block_of(dev) * block_of(dev)
    extra: dict[int, int] = {}
    journal: set[int] = set()
    for m in moves:
        dev = m.key[0]
        run = m.size - m.run_start
        b = block_of(dev)
        journal.add(dev)
        if m.adopt:  # a rename allocates nothing: the output is the file's own blocks
            needed[dev] = needed.get(dev, 0) - -(-run // b) * b
            continue
        # Truncating frees only what the source had allocated: a sparse source's holes are
        # written into the temps as data, so only its allocated bytes are saved.
        alloc = sources[m.key].allocated
        freed = run if alloc < 0 else min(run, alloc)
        needed[dev] = needed.get(dev, 0) - freed // b * b
        # One window held twice, in whole blocks; a window off the block grid straddles one
        # block more.
        held = -(-min(window, run) // b) * b + (b if window % b else 0)
        extra[dev] = max(extra.get(dev, 0), held)
    peaks = []
    for dev, n in sorted(needed.items()):
        fs = filesystems.get(dev)
        margin = space_margin(
            files.get(dev, 0), data.get(dev, 0), block_of(dev), journal=dev in journal
        )
        peaks.append(
            FsPeak(
                dev=dev,
                fs_type=fs.fs_type if fs else "unknown",
                needed=max(0, n) + extra.get(dev, 0) + margin,
                free=fs.free if fs else 0,
                margin=margin,
                block=block_of(dev),
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
