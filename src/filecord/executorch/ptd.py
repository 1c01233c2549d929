"""The ``.ptd`` data file (FlatTensor): read, build, merge.

Byte map: the FlatTensor flatbuffer (identifier ``FT01``) with a 40-byte ``FH01`` header
inserted at offset 8 and padded to 48; zeros up to ``segment_base_offset``; the segments.  The
header is always present, even with no data.  ``flatbuffer_offset`` is the number of bytes
inserted, so the flatbuffer region readers load is ``[0, flatbuffer_offset +
flatbuffer_size)``.

We encode the FlatTensor with our own builder; ExecuTorch runs flatc on JSON, so its flatbuffer
bytes are ordered differently, but header, sizes and segments come out the same.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from filecord import _sys
from filecord._cord import Cord
from filecord._data import FileBackedData
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
    zero_fill,
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
from filecord.executorch.values import NamedBytes, PtdEntry, TensorLayout


@dataclass(frozen=True)
class PtdHeader:
    length: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int


@dataclass(frozen=True)
class PtdSegment:
    index: int
    offset: int  # relative to segment_base_offset
    size: int
    file_offset: int
    data: FileBackedData = field(repr=False)


@dataclass(frozen=True)
class PtdFile:
    path: str
    file_size: int
    header: PtdHeader
    flat_tensor: Table
    segments: tuple[PtdSegment, ...]
    entries: dict[str, PtdEntry]

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


def _layout(entry: Table, i: int) -> TensorLayout | None:
    t = entry["tensor_layout"]
    if t is None:
        return None
    try:
        return TensorLayout.from_table(t)
    except ValueError as exc:
        raise OutOfRangeError(
            str(exc), field=f"FlatTensor.named_data[{i}].tensor_layout", offset=None
        ) from None


def read_ptd(path: str | os.PathLike[str]) -> PtdFile:
    """Read a ``.ptd``: header, entries and segments, each segment a file-backed range.

    Entries that share a segment share one ``FileBackedData`` object.  Malformed input raises
    an :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass.
    """
    p = os.fspath(path)
    fd = _sys.open(p, os.O_RDONLY)
    try:
        file_size = _sys.fstat(fd).st_size
        head = _sys.read_all(fd, 0, min(file_size, 8 + PTD_HEADER_LENGTH))
        if len(head) >= 8 and head[4:8] != FLAT_TENSOR_SCHEMA.identifier:
            raise BadMagicError(
                f"file identifier is {bytes(head[4:8])!r}, expected "
                f"{FLAT_TENSOR_SCHEMA.identifier!r}",
                field="file identifier",
                offset=4,
            )
        header = parse_ptd_header(head, file_size)
        # A map, not a read: only the pages the decoder visits are read (see _fbread).
        region = _sys.map_read(fd, header.flatbuffer_offset + header.flatbuffer_size)
    finally:
        _sys.close(fd)
    with region:
        flat = _fbread.decode(region, FLAT_TENSOR_SCHEMA)
    for name in ("segments", "named_data"):
        if flat[name] is None:
            raise MissingFieldError(
                "required by the runtime", field=f"FlatTensor.{name}", offset=None
            )
    base = header.segment_base_offset
    layout = check_segments(flat["segments"], base, header.segment_data_size, "FlatTensor.segments")
    segments = tuple(
        PtdSegment(i, off, size, base + off, FileBackedData(p, offset=base + off, length=size))
        for i, (off, size) in enumerate(layout)
    )
    names = check_named_data(flat["named_data"], len(segments), "FlatTensor.named_data")
    entries = {
        key: PtdEntry(key, segments[index].data, _layout(raw, i), 1, index)
        for i, ((key, index), raw) in enumerate(zip(names, flat["named_data"], strict=True))
    }
    return PtdFile(p, file_size, header, flat, segments, entries)


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
    datas: list[NamedBytes] = []
    aligns: list[int] = []
    named = []
    for e in items:
        slot = slot_of.get(id(e.data))
        if slot is None:
            slot = slot_of[id(e.data)] = len(datas)
            datas.append(e.data)
            aligns.append(e.alignment)
        else:
            aligns[slot] = math.lcm(aligns[slot], e.alignment)
        named.append(
            flat_tensor_table(
                "NamedData",
                key=e.key,
                segment_index=slot,
                tensor_layout=None if e.layout is None else e.layout.to_table(),
            )
        )
    segs = [Aligned(d, a) for d, a in zip(datas, aligns, strict=True)]
    layout = plan_segments(((piece_length(s.data), s.alignment) for s in segs), segment_alignment)
    root = flat_tensor_table(
        "FlatTensor",
        version=0,
        segments=tuple(flat_tensor_table("DataSegment", offset=o, size=s) for o, s in layout),
        named_data=tuple(named),
    )
    flatbuffer = _fbwrite.encode(root, FLAT_TENSOR_SCHEMA)
    padded = round_up(PTD_HEADER_LENGTH, PTD_HEADER_ALIGNMENT)
    region = padded + len(flatbuffer)
    base = round_up(region, segment_alignment)
    data_size = layout[-1][0] + layout[-1][1] if layout else 0
    cord = Cord(insert_header(flatbuffer, ptd_header(len(flatbuffer), base, data_size)))
    zero_fill(cord, base - region)
    cord.append(segment_cord(segs, layout))
    return cord


def merge_ptd(paths: Sequence[str | os.PathLike[str]], *, segment_alignment: int = 128) -> Cord:
    """One data file holding every key of ``paths`` (the Python runtime takes only one).

    Equal contents are stored once; a key present in two inputs with different bytes raises
    :class:`~filecord.executorch.errors.NamedDataConflictError`.  Data stays file-backed.
    """
    from filecord.executorch.named_data import NamedDataStore  # the store builds on this module

    store = NamedDataStore()
    for path in paths:
        for key, entry in read_ptd(path).entries.items():
            data = entry.data
            if not isinstance(data, FileBackedData):  # pragma: no cover - read_ptd makes ranges
                raise TypeError(f"{key}: expected file-backed data from read_ptd")
            store.add_named_data(key, data, tensor_layout=entry.layout)
    return build_ptd(store.entries(), segment_alignment=segment_alignment)
