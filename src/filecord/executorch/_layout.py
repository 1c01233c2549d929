"""Segment layout and the extended headers both formats insert after a flatbuffer's first 8 bytes.

Layout rule (shared by ``.pte`` and ``.ptd``): segment *i* starts at the end of segment *i-1*
rounded up to ``lcm(segment_alignment, alignment_i)``, counted from the segment base; gaps are
zeros and nothing follows the last segment.  The base itself is aligned only to
``segment_alignment``, so a segment asking for more is aligned relative to the base, not to the
file (ExecuTorch does the same and its runtime expects exactly these offsets).

Inserting a header of ``n`` bytes at offset 8 shifts every flatbuffer object by ``n``; all inner
offsets are relative, so only the root offset at byte 0 is patched.  ``n`` is a multiple of the
largest ``force_align`` so force-aligned vectors keep their alignment after the shift.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from filecord._pieces.cord import Cord, PieceLike
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord.executorch.errors import OverlapError, TruncatedError

PTE_HEADER_MAGIC = b"eh00"
PTE_HEADER_LENGTH = 32  # magic, length, program_size, segment_base_offset, segment_data_size
PTE_HEADER_MIN_LENGTH = 24  # the runtime reads segment_data_size only from 32 on
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_LENGTH = 40
PTD_HEADER_ALIGNMENT = 16

_ZEROS = bytes(4096)


def round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Aligned:
    """A segment's data together with the alignment it asks for (relative to the segment base)."""

    data: PieceLike
    alignment: int = 1

    def __post_init__(self) -> None:
        positive_int(self.alignment, "segment alignment")


def piece_length(piece: PieceLike) -> int:
    if isinstance(piece, (bytes, bytearray)):
        return len(piece)
    if isinstance(piece, memoryview):
        return piece.nbytes
    return len(piece)  # FileBackedData and Cord both know their length


def plan_segments(
    items: Iterable[tuple[int, int]], segment_alignment: int
) -> list[tuple[int, int]]:
    """``(size, alignment)`` per segment -> ``(offset, size)`` relative to the segment base."""
    positive_int(segment_alignment, "segment_alignment")
    out: list[tuple[int, int]] = []
    end = 0
    for size, alignment in items:
        offset = round_up(end, math.lcm(segment_alignment, positive_int(alignment, "alignment")))
        out.append((offset, size))
        end = offset + size
    return out


def normalize_segments(segments: Sequence[PieceLike | Aligned]) -> list[Aligned]:
    return [s if isinstance(s, Aligned) else Aligned(s) for s in segments]


def zero_fill(cord: Cord, n: int) -> None:
    """Append ``n`` zero bytes as small in-memory pieces."""
    while n > 0:
        step = min(n, len(_ZEROS))
        cord.append(_ZEROS[:step])
        n -= step


def segment_cord(segments: Sequence[Aligned], layout: Sequence[tuple[int, int]]) -> Cord:
    """Segments at their planned offsets with zero gaps; file-backed pieces stay by reference."""
    cord = Cord()
    for seg, (offset, _size) in zip(segments, layout, strict=True):
        zero_fill(cord, offset - len(cord))
        data = seg.data
        cord.append(data if isinstance(data, (FileBackedData, FileRows, Cord, Derived))
                    else memoryview(data))
    return cord


def insert_header(flatbuffer: bytes, header: bytes) -> list[memoryview]:
    """The flatbuffer with ``header`` inserted at offset 8, as pieces (no copy of the body)."""
    root = struct.unpack_from("<I", flatbuffer, 0)[0] + len(header)
    head = struct.pack("<I", root) + bytes(flatbuffer[4:8]) + header
    return [memoryview(head), memoryview(flatbuffer)[8:]]


def pte_header(
    padded_length: int, program_size: int, segment_base_offset: int, segment_data_size: int
) -> bytes:
    fields = struct.pack(
        "<4sIQQQ",
        PTE_HEADER_MAGIC,
        PTE_HEADER_LENGTH,
        program_size,
        segment_base_offset,
        segment_data_size,
    )
    return fields + bytes(padded_length - len(fields))


def ptd_header(flatbuffer_size: int, segment_base_offset: int, segment_data_size: int) -> bytes:
    padded = round_up(PTD_HEADER_LENGTH, PTD_HEADER_ALIGNMENT)
    fields = struct.pack(
        "<4sIQQQQ",
        PTD_HEADER_MAGIC,
        PTD_HEADER_LENGTH,
        padded,
        flatbuffer_size,
        segment_base_offset,
        segment_data_size,
    )
    return fields + bytes(padded - len(fields))


def check_regions(
    prefix: str,
    *,
    region_end: int,
    region_field: tuple[str, int],
    base: int,
    base_field: tuple[str, int],
    data_size: int,
    data_field: tuple[str, int],
    file_size: int,
) -> None:
    """The header-declared layout of a ``.pte``/``.ptd`` fits its file: the flatbuffer region
    ends inside the file, the segments start after it, and the segments end inside the file.
    Each field is ``(name, header offset)`` for the error."""
    if region_end > file_size:
        raise TruncatedError(
            f"{prefix} ends at {region_end}, past the end of the {file_size}-byte file",
            field=region_field[0], offset=region_field[1],
        )
    if base < region_end:
        raise OverlapError(
            f"segment_base_offset {base} is inside the {prefix} (ends at {region_end})",
            field=base_field[0], offset=base_field[1],
        )
    if base + data_size > file_size:
        raise TruncatedError(
            f"segments end at {base + data_size}, past the end of the {file_size}-byte file",
            field=data_field[0], offset=data_field[1],
        )
