"""Clone-ready layouts: every segment of a ``.pte`` and a ``.ptd`` on a 4 KiB file offset.

A btrfs/XFS save shares a file-backed piece's extents (clones it) only where the piece's source
offset and output offset are both multiples of the file system's block.  ExecuTorch aligns
segments to 128 bytes (``segment_alignment``) and named data to its own alignment, so ranges
never clone.  The formats allow more: the segment base is ``program_size`` (``.pte``) or the
flatbuffer's end (``.ptd``) rounded up to ``segment_alignment``, and each segment starts at the
previous one's end rounded up to ``lcm(segment_alignment, its alignment)`` relative to that base,
so ``segment_alignment=4096`` puts every segment on a 4 KiB *file* offset.  The runtime reads
``segment_base_offset`` and each segment's offset from the file (see
``shared/research/executorch-formats.md`` §1.3 and the ``align4096`` interop program), so it
loads such a program as it loads any other.

Re-laying an assembled ``.pte`` changes only the numbers: the ``eh00`` header's base and data
size and the ``segments`` table's offsets.  The program table is decoded, its ``segments``
replaced, and encoded again (the inserted header keeps the padding it had, so force-aligned
vectors keep their alignment); every segment keeps its pieces by reference.  A segment keeps
at least the power-of-two alignment its old offset had, so no key's alignment is lost.  A
``.ptd`` is rebuilt from its entries with ``merge_ptd(segment_alignment=4096)``.

The constant segment holds every constant tensor of a non-delegated program, packed at the
constant-tensor alignment (16) with ``constant_segment.offsets`` saying where each starts.
Those offsets are free numbers too, so each non-empty tensor is moved to a 4 KiB offset within
the segment (which itself starts on 4 KiB); the bytes between are zeros.  Mutable-data
segments are left packed: the runtime fills them from the program at load, they are no file's
bytes worth cloning.
"""

from __future__ import annotations

import math

from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._pieces.rows import FileRows
from filecord.executorch import _fbread
from filecord.executorch._cordptd import _spans, read_range
from filecord.executorch._layout import PTE_HEADER_LENGTH, Aligned, plan_segments
from filecord.executorch.pte import (
    build_pte,
    infer_padded_length,
    parse_pte_header,
    strip_header,
)
from filecord.executorch.schema import (
    DEFAULT_FORCE_ALIGN,
    PROGRAM_SCHEMA,
    encode_program,
    program_table,
)

CLONE_ALIGNMENT = 4096  # the block of btrfs and XFS as made by default on x86-64 and arm64
_KEEP_ALIGNMENT_UP_TO = 1 << 20  # a larger power of two dividing an old offset is chance


def _sub_cord(cord: Cord, start: int, length: int) -> Cord:
    """``cord[start:start+length]`` as pieces of the same objects (file-backed ones sliced)."""
    out = Cord()
    for piece, off, n in _spans(cord, start, length):
        if isinstance(piece, FileBackedData):
            out.append(piece if (off, n) == (0, len(piece)) else piece.slice(off, n))
        elif isinstance(piece, FileRows):
            out.extend(piece.ranges(off, n))
        else:
            out.append(piece[off : off + n])
    return out


def _kept_alignment(offset: int) -> int:
    """The power-of-two alignment an old segment offset had (capped), 1 for offset 0."""
    if offset == 0:
        return 1
    return min(offset & -offset, _KEEP_ALIGNMENT_UP_TO)


def _spread_constants(
    segment: Cord, offsets: tuple[int, ...], alignment: int
) -> tuple[Cord, tuple[int, ...]]:
    """The constant segment with each non-empty tensor at a multiple of ``alignment``.

    The offsets are free numbers: nothing makes them ascend, and two tensors may share one.
    So the layout is by the distinct start offsets, sorted: each spans up to the next distinct
    start (the last: to the segment's end), its padding to the constant alignment included
    (zeros, kept as they are); every tensor then maps through its start, so aliases stay
    aliases and an order that does not ascend keeps each tensor's bytes.
    """
    size = len(segment)
    starts = sorted(set(offsets))
    out, moved = Cord(), {}
    for start, end in zip(starts, (*starts[1:], max(size, starts[-1])), strict=True):
        n = max(0, min(end, size) - start)
        if n:
            out.append(bytes(-len(out) % alignment))
        moved[start] = len(out)
        if n:
            out.append(_sub_cord(segment, start, n))
    return out, tuple(moved[o] for o in offsets)


def clone_ready_pte(cord: Cord, alignment: int = CLONE_ALIGNMENT) -> Cord:
    """The same program with every segment at a multiple of ``alignment`` in the file.

    A program without segment bytes (no ``eh00`` header) is returned as it is: it holds no
    file-backed data to clone.
    """
    size = len(cord)
    parsed = parse_pte_header(read_range(cord, 0, min(size, 8 + PTE_HEADER_LENGTH)), size)
    if parsed is None:
        return cord
    length, program_size, base, _data_size = parsed
    region = read_range(cord, 0, program_size)
    padded = infer_padded_length(region, length)
    program = _fbread.decode(strip_header(region, padded), PROGRAM_SCHEMA)
    old = [(s["offset"], s["size"]) for s in program["segments"] or ()]
    parts = [_sub_cord(cord, base + off, n) for off, n in old]
    constant = program["constant_segment"]
    if constant is not None and constant["offsets"] and constant["segment_index"] < len(parts):
        k = constant["segment_index"]
        parts[k], offsets = _spread_constants(parts[k], tuple(constant["offsets"]), alignment)
        program = program.replace(constant_segment=constant.replace(offsets=offsets))
    items = [
        Aligned(part, math.lcm(alignment, _kept_alignment(off)))
        for part, (off, _n) in zip(parts, old, strict=True)
    ]
    layout = plan_segments(((len(s.data), s.alignment) for s in items), alignment)
    program = program.replace(
        segments=tuple(program_table("DataSegment", offset=o, size=n) for o, n in layout)
    )
    # The header was padded to the program's largest force_align (32 bytes: the default 16);
    # encoding with that alignment keeps every force-aligned vector where the runtime wants it.
    force = max(DEFAULT_FORCE_ALIGN, padded if padded > PTE_HEADER_LENGTH else DEFAULT_FORCE_ALIGN)
    encoded = encode_program(program, constant_tensor_alignment=force, delegate_alignment=force)
    return build_pte(encoded, items, segment_alignment=alignment, max_force_align=force)
