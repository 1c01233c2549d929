"""Read the entries of a ``.ptd`` that is still a Cord (not yet a file), without copying its data.

``Program.save(merge_data=True)`` merges data files that exist only as Cords (ExecuTorch's
serialized output, or ours).  The header and flatbuffer come from the front of the Cord (small,
read into memory); every segment is handed back as the piece that holds it: the very
``bytes`` or ``FileBackedData`` object when the segment is exactly one piece (so a blob that
two tags share stays one object and is stored once), a ``FileBackedData.slice`` for part of a
file, or joined bytes when in-memory pieces had to be stitched together.
"""

from __future__ import annotations

from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord.executorch import _fbread
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import PTD_HEADER_LENGTH
from filecord.executorch.ptd import parse_ptd
from filecord.executorch.schema import FLAT_TENSOR_SCHEMA
from filecord.executorch.values import Blob, PtdEntry


def _spans(cord: Cord, start: int, length: int
           ) -> list[tuple[FileBackedData | FileRows | memoryview, int, int]]:
    """The pieces covering ``[start, start + length)``: (piece, offset in piece, length).  A
    derived piece (computed bytes) is refused: a program's cords are bytes and file ranges."""
    out: list[tuple[FileBackedData | FileRows | memoryview, int, int]] = []
    pos, end = 0, start + length
    for piece in cord.pieces:
        if isinstance(piece, Derived):
            raise TypeError(f"{piece!r}: an ExecuTorch file cannot be read from a derived piece")
        n = len(piece)
        if pos + n > start and pos < end and n:
            lo = max(start, pos) - pos
            hi = min(end, pos + n) - pos
            out.append((piece, lo, hi - lo))
        pos += n
        if pos >= end:
            break
    return out


def read_range(cord: Cord, start: int, length: int) -> bytes:
    """``length`` bytes of the Cord from ``start`` into memory (only for small ranges)."""
    parts = []
    for piece, off, n in _spans(cord, start, length):
        if isinstance(piece, (FileBackedData, FileRows)):
            parts.append(piece.read_range(off, n))
        else:
            parts.append(bytes(piece[off : off + n]))
    return b"".join(parts)


def blob_at(cord: Cord, start: int, length: int) -> Blob:
    """The bytes at ``[start, start + length)`` as one piece, sharing the Cord's objects."""
    spans = _spans(cord, start, length)
    if len(spans) == 1:
        piece, off, n = spans[0]
        if isinstance(piece, FileRows) and len(piece.ranges(off, n)) == 1:
            return piece.ranges(off, n)[0]
        if isinstance(piece, FileBackedData):
            return piece if (off, n) == (0, len(piece)) else piece.slice(off, n)
        if isinstance(piece, FileRows):
            raise ValueError(f"the data at [{start}, {start + length}) is several ranges of "
                             f"{piece.path}; merging such a data file would need a copy")
        whole = piece.obj if isinstance(piece.obj, bytes) else None
        if whole is not None and off == 0 and n == len(whole) == piece.nbytes:
            return whole  # the caller's own bytes object: identity lets the store share it
        return bytes(piece[off : off + n])
    if any(isinstance(p, (FileBackedData, FileRows)) for p, _o, _n in spans):
        raise ValueError(
            f"the data at [{start}, {start + length}) spans {len(spans)} pieces, some of them "
            "file-backed; merging such a data file would need a copy (build it with one piece "
            "per segment)"
        )
    return read_range(cord, start, length)


def cord_entries(cord: Cord, name: str) -> list[PtdEntry]:
    """Every key of the data file ``cord`` (``name`` is used in error messages only); keys that
    share a segment share one data object."""
    size = len(cord)

    def decode(n: int) -> Table:
        return _fbread.decode(read_range(cord, 0, n), FLAT_TENSOR_SCHEMA)

    parsed = parse_ptd(read_range(cord, 0, min(size, 8 + PTD_HEADER_LENGTH)), size, decode,
                       name=name)
    base = parsed.header.segment_base_offset
    blobs: dict[int, Blob] = {}
    out = []
    for key, index, layout in parsed.keys:
        if index not in blobs:
            off, n = parsed.segments[index]
            blobs[index] = blob_at(cord, base + off, n)
        out.append(PtdEntry(key, blobs[index], layout, 1, index))
    return out
