"""Read the entries of a ``.ptd`` that is still a Cord (not yet a file), without copying its data.

``Program.save(merge_data=True)`` merges data files that exist only as Cords (ExecuTorch's
serialized output, or ours).  The header and flatbuffer come from the front of the Cord (small,
read into memory); every segment is handed back as the piece that holds it: the very
``bytes`` or ``FileBackedData`` object when the segment is exactly one piece (so a blob that
two tags share stays one object and is stored once), a ``FileBackedData.slice`` for part of a
file, or joined bytes when in-memory pieces had to be stitched together.
"""

from __future__ import annotations

from dataclasses import dataclass

from filecord._cord import Cord, Piece
from filecord._data import FileBackedData
from filecord.executorch import _fbread
from filecord.executorch._layout import PTD_HEADER_LENGTH
from filecord.executorch._ptecheck import check_named_data, check_segments
from filecord.executorch.errors import MissingFieldError, OutOfRangeError
from filecord.executorch.ptd import parse_ptd_header
from filecord.executorch.schema import FLAT_TENSOR_SCHEMA
from filecord.executorch.values import TensorLayout

Blob = bytes | FileBackedData


@dataclass(frozen=True)
class CordEntry:
    """One key of a data file held in a Cord: its bytes (one piece, never copied when file-backed)
    and its tensor layout."""

    key: str
    data: Blob
    layout: TensorLayout | None
    segment_index: int


def _spans(cord: Cord, start: int, length: int) -> list[tuple[Piece, int, int]]:
    """The pieces covering ``[start, start + length)``: (piece, offset in piece, length)."""
    out: list[tuple[Piece, int, int]] = []
    pos, end = 0, start + length
    for piece in cord.pieces:
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
        if isinstance(piece, FileBackedData):
            parts.append(piece.read_range(off, n))
        else:
            parts.append(bytes(piece[off : off + n]))
    return b"".join(parts)


def blob_at(cord: Cord, start: int, length: int) -> Blob:
    """The bytes at ``[start, start + length)`` as one piece, sharing the Cord's objects."""
    spans = _spans(cord, start, length)
    if len(spans) == 1:
        piece, off, n = spans[0]
        if isinstance(piece, FileBackedData):
            return piece if (off, n) == (0, len(piece)) else piece.slice(off, n)
        whole = piece.obj if isinstance(piece.obj, bytes) else None
        if whole is not None and off == 0 and n == len(whole) == piece.nbytes:
            return whole  # the caller's own bytes object: identity lets the store share it
        return bytes(piece[off : off + n])
    if any(isinstance(p, FileBackedData) for p, _o, _n in spans):
        raise ValueError(
            f"the data at [{start}, {start + length}) spans {len(spans)} pieces, some of them "
            "file-backed; merging such a data file would need a copy (build it with one piece "
            "per segment)"
        )
    return read_range(cord, start, length)


def cord_entries(cord: Cord, name: str) -> list[CordEntry]:
    """Every key of the data file ``cord`` (``name`` is used in error messages only)."""
    size = len(cord)
    head = read_range(cord, 0, min(size, 8 + PTD_HEADER_LENGTH))
    header = parse_ptd_header(head, size)
    region = read_range(cord, 0, header.flatbuffer_offset + header.flatbuffer_size)
    flat = _fbread.decode(region, FLAT_TENSOR_SCHEMA)
    for field in ("segments", "named_data"):
        if flat[field] is None:
            raise MissingFieldError(f"{name}: required", field=f"FlatTensor.{field}", offset=None)
    base = header.segment_base_offset
    layout = check_segments(flat["segments"], base, header.segment_data_size, "FlatTensor.segments")
    names = check_named_data(flat["named_data"], len(layout), "FlatTensor.named_data")
    blobs: dict[int, Blob] = {}
    out = []
    for i, ((key, index), raw) in enumerate(zip(names, flat["named_data"], strict=True)):
        if index not in blobs:
            off, n = layout[index]
            blobs[index] = blob_at(cord, base + off, n)
        tl = raw["tensor_layout"]
        try:
            tensor_layout = None if tl is None else TensorLayout.from_table(tl)
        except ValueError as exc:
            raise OutOfRangeError(
                f"{name}: {exc}", field=f"FlatTensor.named_data[{i}].tensor_layout", offset=None
            ) from None
        out.append(CordEntry(key, blobs[index], tensor_layout, index))
    return out
