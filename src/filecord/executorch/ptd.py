"""The ``.ptd`` data file (FlatTensor): read, lay out, build.

Byte map: the FlatTensor flatbuffer (identifier ``FT01``) with a 40-byte ``FH01`` header
inserted at offset 8 and padded to 48; zeros up to ``segment_base_offset``; the segments.  The
header is always present, even with no data.  ``flatbuffer_offset`` is the number of bytes
inserted, so the flatbuffer region readers load is ``[0, flatbuffer_offset +
flatbuffer_size)``.

We encode the FlatTensor with our own builder; ExecuTorch runs flatc on JSON, so its flatbuffer
bytes are ordered differently, but header, sizes and segments come out the same.

The layout (:func:`ptd_layout`) depends on the keys, the segment lengths and alignments and the
tensor layouts, never on a data byte: a streaming writer plans the whole file first and then
writes each tensor at its offset.  Merging data files is ``_merge``'s work.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from filecord._io import syscalls as _sys
from filecord._kit.readfile import open_regular
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord.errors import reading
from filecord.executorch import _fbread, _fbwrite
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import (
    PTD_HEADER_ALIGNMENT,
    PTD_HEADER_LENGTH,
    PTD_HEADER_MAGIC,
    Aligned,
    check_regions,
    insert_header,
    piece_length,
    plan_segments,
    ptd_header,
    round_up,
    segment_cord,
)
from filecord.executorch._ptecheck import check_named_data, check_segments
from filecord.executorch.errors import (
    BadHeaderError,
    BadMagicError,
    MissingFieldError,
    OutOfRangeError,
    OverlapError,
    TruncatedError,
)
from filecord.executorch.schema import FLAT_TENSOR_SCHEMA, flat_tensor_table
from filecord.executorch.values import Blob, PtdEntry, Segment, TensorLayout


@dataclass(frozen=True, slots=True)
class PtdHeader:
    length: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int


@dataclass(frozen=True, slots=True)
class PtdFile:
    """What :func:`read_ptd` found; ``entries`` is read-only (key -> entry, in file order)."""

    path: str
    file_size: int
    header: PtdHeader
    flat_tensor: Table
    segments: tuple[Segment, ...]
    entries: Mapping[str, PtdEntry]

    @property
    def version(self) -> int:
        version: int = self.flat_tensor["version"]
        return version


def parse_ptd_header(head: bytes, file_size: int) -> PtdHeader:
    """The ``FH01`` header from the first 48 bytes, checked against the file size."""
    if len(head) < 12:
        raise TruncatedError(
            f"a data file needs at least 48 bytes, this one has {file_size}", field="FH01", offset=0
        )
    if head[8:12] != PTD_HEADER_MAGIC:
        raise BadMagicError(
            f"header magic is {bytes(head[8:12])!r}, expected {PTD_HEADER_MAGIC!r}",
            field="FH01.magic",
            offset=8,
        )
    if len(head) < 8 + PTD_HEADER_LENGTH:
        raise TruncatedError(f"header ends at {len(head)}", field="FH01", offset=8)
    length, fb_offset, fb_size, base, data_size = struct.unpack_from("<IQQQQ", head, 12)
    if length < PTD_HEADER_LENGTH:
        raise BadHeaderError(
            f"header length {length} is below {PTD_HEADER_LENGTH}", field="FH01.length", offset=12
        )
    if fb_offset < length:
        raise OverlapError(
            f"flatbuffer_offset {fb_offset} is inside the {length}-byte header",
            field="FH01.flatbuffer_offset",
            offset=16,
        )
    if fb_size < 8:
        raise BadHeaderError(
            f"flatbuffer_size {fb_size} is below 8", field="FH01.flatbuffer_size", offset=24
        )
    check_regions(
        "flatbuffer",
        region_end=fb_offset + fb_size,
        region_field=("FH01.flatbuffer_size", 24),
        base=base,
        base_field=("FH01.segment_base_offset", 32),
        data_size=data_size,
        data_field=("FH01.segment_data_size", 40),
        file_size=file_size,
    )
    return PtdHeader(length, fb_offset, fb_size, base, data_size)


@dataclass(frozen=True, slots=True)
class ParsedPtd:
    """A data file's structure, checked, from its first bytes alone: every segment as
    ``(offset relative to the base, size)`` and every key as ``(key, segment index, layout)``.
    The one parse behind :func:`read_ptd` (a file) and ``cord_entries`` (a Cord)."""

    header: PtdHeader
    flat_tensor: Table
    segments: tuple[tuple[int, int], ...]
    keys: tuple[tuple[str, int, TensorLayout | None], ...]


def parse_ptd(
    head: bytes, size: int, decode: Callable[[int], Table], *, name: str = ""
) -> ParsedPtd:
    """Parse a data file of ``size`` bytes: ``head`` is its first ``8 + PTD_HEADER_LENGTH``
    bytes (fewer if it is shorter), ``decode(n)`` the FlatTensor decoded from its first ``n``
    bytes.  ``name`` prefixes the messages of errors found after the header."""
    if len(head) >= 8 and head[4:8] != FLAT_TENSOR_SCHEMA.identifier:
        raise BadMagicError(
            f"file identifier is {bytes(head[4:8])!r}, expected {FLAT_TENSOR_SCHEMA.identifier!r}",
            field="file identifier",
            offset=4,
        )
    header = parse_ptd_header(head, size)
    flat = decode(header.flatbuffer_offset + header.flatbuffer_size)
    prefix = f"{name}: " if name else ""
    for part in ("segments", "named_data"):
        if flat[part] is None:
            raise MissingFieldError(
                f"{prefix}required by the runtime", field=f"FlatTensor.{part}", offset=None
            )
    base = header.segment_base_offset
    segments = check_segments(
        flat["segments"], base, header.segment_data_size, "FlatTensor.segments"
    )
    names = check_named_data(flat["named_data"], len(segments), "FlatTensor.named_data")
    keys = []
    for i, ((key, index), raw) in enumerate(zip(names, flat["named_data"], strict=True)):
        t = raw["tensor_layout"]
        try:
            layout = None if t is None else TensorLayout.from_table(t)
        except ValueError as exc:
            raise OutOfRangeError(
                f"{prefix}{exc}", field=f"FlatTensor.named_data[{i}].tensor_layout", offset=None
            ) from None
        keys.append((key, index, layout))
    return ParsedPtd(header, flat, tuple(segments), tuple(keys))


def read_ptd(path: str | os.PathLike[str]) -> PtdFile:
    """Read a ``.ptd``: header, entries and segments, each segment a file-backed range.

    Entries that share a segment share one ``FileBackedData`` object.  Malformed input raises
    an :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass naming the file.
    """
    with reading(os.fspath(path)):
        return _read_ptd(path)


def _read_ptd(path: str | os.PathLike[str]) -> PtdFile:
    """Read a ``.ptd``: header, entries and segments, each segment a file-backed range.

    Entries that share a segment share one ``FileBackedData`` object.  Malformed input raises
    an :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass.
    """
    p = os.fspath(path)
    fd = open_regular(p)

    def decode(n: int) -> Table:
        # A map, not a read: only the pages the decoder visits are read (see _fbread).
        with _sys.map_read(fd, n) as region:
            return _fbread.decode(region, FLAT_TENSOR_SCHEMA)

    try:
        file_size = _sys.fstat(fd).st_size
        head = _sys.read_all(fd, 0, min(file_size, 8 + PTD_HEADER_LENGTH))
        parsed = parse_ptd(head, file_size, decode)
    finally:
        _sys.close(fd)
    base = parsed.header.segment_base_offset
    segments = tuple(
        Segment(i, off, size, base + off, FileBackedData(p, offset=base + off, length=size))
        for i, (off, size) in enumerate(parsed.segments)
    )
    entries = {
        key: PtdEntry(key, segments[index].data, layout, 1, index)
        for key, index, layout in parsed.keys
    }
    return PtdFile(
        p, file_size, parsed.header, parsed.flat_tensor, segments, MappingProxyType(entries)
    )


@dataclass(frozen=True, slots=True)
class PtdLayout:
    """Where every byte of a ``.ptd`` goes, worked out from lengths alone: ``head`` is the
    file's first ``segment_base_offset`` bytes (header, flatbuffer, zero padding) and
    ``segments`` each segment's ``(offset relative to the base, size)``."""

    head: bytes
    segments: tuple[tuple[int, int], ...]

    @property
    def segment_base_offset(self) -> int:
        return len(self.head)

    @property
    def size(self) -> int:
        """The file's length: nothing follows the last segment."""
        offset, size = self.segments[-1] if self.segments else (0, 0)
        return len(self.head) + offset + size


def ptd_layout(
    keys: Sequence[tuple[str, int, TensorLayout | None]],
    segments: Sequence[tuple[int, int]],
    *,
    segment_alignment: int = 128,
) -> PtdLayout:
    """The layout of a ``.ptd`` holding ``keys`` (``(key, segment index, layout)``, in file
    order) over ``segments`` (``(size, alignment)``, in file order).  A pure function: it
    never sees a data byte, so a writer can plan the file before the data exists."""
    layout = plan_segments(segments, segment_alignment)
    root = flat_tensor_table(
        "FlatTensor",
        version=0,
        segments=tuple(flat_tensor_table("DataSegment", offset=o, size=s) for o, s in layout),
        named_data=tuple(
            flat_tensor_table(
                "NamedData",
                key=key,
                segment_index=index,
                tensor_layout=None if tl is None else tl.to_table(),
            )
            for key, index, tl in keys
        ),
    )
    flatbuffer = _fbwrite.encode(root, FLAT_TENSOR_SCHEMA)
    region = round_up(PTD_HEADER_LENGTH, PTD_HEADER_ALIGNMENT) + len(flatbuffer)
    base = round_up(region, segment_alignment)
    data_size = layout[-1][0] + layout[-1][1] if layout else 0
    pieces = insert_header(flatbuffer, ptd_header(len(flatbuffer), base, data_size))
    head = b"".join(pieces) + bytes(base - region)
    return PtdLayout(head, tuple(layout))


def build_ptd(
    entries: Mapping[str, PtdEntry] | Iterable[PtdEntry], *, segment_alignment: int = 128
) -> Cord:
    """A ``.ptd`` as a Cord.  One segment per distinct ``data`` object (by identity), in first-use
    order; its alignment is the lcm of the alignments of the entries that use it.

    ``build_ptd(read_ptd(p).entries)`` rebuilds an equivalent file.  File-backed data stays in
    the Cord by reference.
    """
    items = list(entries.values()) if isinstance(entries, Mapping) else list(entries)
    slot_of: dict[int, int] = {}
    datas: list[Blob] = []
    aligns: list[int] = []
    keys = []
    for e in items:
        slot = slot_of.get(id(e.data))
        if slot is None:
            slot = slot_of[id(e.data)] = len(datas)
            datas.append(e.data)
            aligns.append(e.alignment)
        else:
            aligns[slot] = math.lcm(aligns[slot], e.alignment)
        keys.append((e.key, slot, e.layout))
    layout = ptd_layout(
        keys,
        [(piece_length(d), a) for d, a in zip(datas, aligns, strict=True)],
        segment_alignment=segment_alignment,
    )
    cord = Cord([layout.head])
    cord.append(segment_cord([Aligned(d, a) for d, a in zip(datas, aligns, strict=True)],
                             layout.segments))
    return cord
