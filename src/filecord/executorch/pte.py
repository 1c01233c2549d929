"""The ``.pte`` program file: read it, build one.

Byte map: the program flatbuffer (identifier ``ET12``), with an optional ``eh00`` extended header
inserted at offset 8; then zeros up to ``segment_base_offset``; then the segments, each at its
planned offset relative to the base, with no padding after the last one.  A file without segment
bytes has no header and is just the flatbuffer.

``read_pte`` reads only the program region into memory; every segment comes back as a
:class:`~filecord.FileBackedData` range of the file.  ``build_pte`` takes program bytes and
segment pieces and returns a :class:`~filecord.Cord` holding the very pieces it was given.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from filecord._io import syscalls as _sys
from filecord._kit.readfile import open_regular
from filecord._pieces.cord import Cord, PieceLike
from filecord._pieces.data import FileBackedData
from filecord.errors import reading
from filecord.executorch import _fbread
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import (
    PTE_HEADER_LENGTH,
    PTE_HEADER_MAGIC,
    PTE_HEADER_MIN_LENGTH,
    Aligned,
    check_regions,
    insert_header,
    normalize_segments,
    piece_length,
    plan_segments,
    pte_header,
    round_up,
    segment_cord,
    zero_fill,
)
from filecord.executorch._ptecheck import DataLocation, ProgramFacts, check_program
from filecord.executorch.errors import (
    BadHeaderError,
    BadMagicError,
    OverlapError,
    SegmentTableMismatchError,
    TruncatedError,
)
from filecord.executorch.schema import DEFAULT_FORCE_ALIGN, PROGRAM_SCHEMA
from filecord.executorch.values import Blob, Segment


@dataclass(frozen=True, slots=True)
class PteHeader:
    """The ``eh00`` extended header.  ``padded_length`` is the bytes inserted at offset 8
    (``length`` rounded up to the program's largest force_align), inferred from where the
    flatbuffer's objects begin."""

    length: int
    program_size: int
    segment_base_offset: int
    segment_data_size: int
    padded_length: int


@dataclass(frozen=True, slots=True)
class PteFile:
    """What :func:`read_pte` found.  ``program`` is the decoded Program table, ``region`` the
    program region of the file (header included), ``flatbuffer`` (read on use) the plain
    program flatbuffer (header removed), as ExecuTorch's encoder produced it."""

    path: str
    file_size: int
    header: PteHeader | None
    program: Table
    region: FileBackedData = field(repr=False)
    segments: tuple[Segment, ...]
    facts: ProgramFacts

    @property
    def flatbuffer(self) -> bytes:
        region = self.region.to_bytes()
        return region if self.header is None else strip_header(region, self.header.padded_length)

    @property
    def constant_segment(self) -> tuple[int, tuple[int, ...]] | None:
        """``(segment_index, offsets)`` or ``None``."""
        return self.facts.constant_segment

    @property
    def mutable_data_segments(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        return self.facts.mutable_data_segments

    @property
    def named_data(self) -> dict[str, int]:
        return dict(self.facts.named_data)

    @property
    def delegates(self) -> tuple[PteDelegate, ...]:
        out = []
        for d in self.facts.delegates:
            data: Blob = d.inline_data
            if d.location == "SEGMENT":
                data = self.segments[d.index].data
            out.append(PteDelegate(d.plan, d.position, d.id, d.location, d.index, len(data), data))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class PteDelegate:
    """A delegate's processed blob: INLINE (``index`` into ``backend_delegate_data``, ``data``
    is in-memory bytes from the program) or SEGMENT (``index`` into segments, file-backed)."""

    plan: int
    position: int
    id: str
    location: DataLocation
    index: int
    size: int
    data: Blob = field(repr=False)


def parse_pte_header(head: bytes, file_size: int) -> tuple[int, int, int, int] | None:
    """``(length, program_size, segment_base_offset, segment_data_size)`` from the first bytes
    of a file, or ``None`` when there is no ``eh00`` header.  Checks sizes against the file."""
    if len(head) < 12 or head[8:12] != PTE_HEADER_MAGIC:
        return None
    if len(head) < 16:
        raise TruncatedError("extended header ends early", field="eh00.length", offset=12)
    length = struct.unpack_from("<I", head, 12)[0]
    if length < PTE_HEADER_MIN_LENGTH:
        raise BadHeaderError(
            f"header length {length} is below {PTE_HEADER_MIN_LENGTH}",
            field="eh00.length",
            offset=12,
        )
    need = 8 + min(length, PTE_HEADER_LENGTH)
    if len(head) < need:
        raise TruncatedError(
            f"extended header needs {need} bytes, file has {len(head)}", field="eh00", offset=8
        )
    program_size, base = struct.unpack_from("<QQ", head, 16)
    data_size = struct.unpack_from("<Q", head, 32)[0] if length >= PTE_HEADER_LENGTH else 0
    if program_size < 8 + length:
        raise BadHeaderError(
            f"program_size {program_size} does not cover the header",
            field="eh00.program_size",
            offset=16,
        )
    check_regions(
        "program",
        region_end=program_size,
        region_field=("eh00.program_size", 16),
        base=base,
        base_field=("eh00.segment_base_offset", 24),
        data_size=data_size,
        data_field=("eh00.segment_data_size", 32),
        file_size=file_size,
    )
    return length, program_size, base, data_size


def infer_padded_length(region: _fbread.Buffer, length: int) -> int:
    """The inserted header size: the largest 32 * 2**k the flatbuffer's first object clears.

    The builder's output starts right after its own finish padding, which is smaller than its
    largest alignment and therefore smaller than the true header size; so exactly one candidate
    fits (see DESIGN/research notes on the extended header).
    """
    start = _fbread.root_object_start(region)
    best, candidate = 0, PTE_HEADER_LENGTH
    while candidate < length:
        candidate *= 2
    while 8 + candidate <= start:
        best, candidate = candidate, candidate * 2
    if not best:
        raise OverlapError(
            "the program's root table lies inside the extended header",
            field="Program",
            offset=start,
        )
    return best


def strip_header(region: bytes, padded_length: int) -> bytes:
    """The plain flatbuffer: bytes ``8 .. 8+padded_length`` removed, root offset patched back."""
    root = struct.unpack_from("<I", region, 0)[0] - padded_length
    return struct.pack("<I", root) + region[4:8] + region[8 + padded_length :]


def read_pte(path: str | os.PathLike[str]) -> PteFile:
    """Read a ``.pte``: header, decoded program, and every segment as a file-backed range.

    Raises a :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass naming the
    file, the field and the offset for any malformed, truncated or inconsistent input.
    """
    with reading(os.fspath(path)):
        return _read_pte(path)


def _read_pte(path: str | os.PathLike[str]) -> PteFile:
    """Read a ``.pte``: header, decoded program, and every segment as a file-backed range.

    Raises a :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass naming the
    field and offset for any malformed, truncated or inconsistent input.
    """
    p = os.fspath(path)
    fd = open_regular(p)
    try:
        file_size = _sys.fstat(fd).st_size
        head = _sys.read_all(fd, 0, min(file_size, 8 + PTE_HEADER_LENGTH))
        if len(head) < 8 or head[4:8] != PROGRAM_SCHEMA.identifier:
            raise BadMagicError(
                f"file identifier is {bytes(head[4:8])!r}, expected "
                f"{PROGRAM_SCHEMA.identifier!r}",
                field="file identifier",
                offset=4,
            )
        parsed = parse_pte_header(head, file_size)
        region_size = parsed[1] if parsed else file_size
        # A map, not a read: only the pages the decoder visits are read (see _fbread).
        region = _sys.map_read(fd, region_size)
    finally:
        _sys.close(fd)
    with region:
        program = _fbread.decode(region, PROGRAM_SCHEMA)
        header: PteHeader | None = None
        if parsed is not None:
            length, program_size, base, data_size = parsed
            padded = infer_padded_length(region, length)
            header = PteHeader(length, program_size, base, data_size, padded)
    facts = check_program(
        program,
        segment_base_offset=header.segment_base_offset if header else None,
        segment_data_size=header.segment_data_size if header else 0,
    )
    base = header.segment_base_offset if header else 0
    segments = tuple(
        Segment(i, off, size, base + off, FileBackedData(p, offset=base + off, length=size))
        for i, (off, size) in enumerate(facts.segments)
    )
    whole = FileBackedData(p, offset=0, length=region_size)
    return PteFile(p, file_size, header, program, whole, segments, facts)


def build_pte(
    program: bytes,
    segments: Sequence[PieceLike | Aligned],
    *,
    segment_alignment: int = 128,
    max_force_align: int = DEFAULT_FORCE_ALIGN,
) -> Cord:
    """A ``.pte`` as a Cord: header (when there are segment bytes), program, padding, segments.

    ``program`` is the plain Program flatbuffer (``filecord.executorch.schema.encode_program``);
    its ``segments`` table must already list the offsets this layout gives (``plan_segments``,
    importable from this module), which is checked.  ``segments`` are bytes,
    ``FileBackedData`` or Cords, optionally wrapped in :class:`Aligned` (also from this module)
    to ask for more than ``segment_alignment``.  ``max_force_align`` is the largest force_align
    the program was encoded with (16 unless a tensor or delegate alignment was raised): the
    inserted header is padded to it.  File-backed pieces end up in the Cord
    by reference; padding pieces are small in-memory bytes.
    """
    decoded = _fbread.decode(bytes(program), PROGRAM_SCHEMA)
    items = normalize_segments(segments)
    layout = plan_segments(((piece_length(s.data), s.alignment) for s in items), segment_alignment)
    table = [(s["offset"], s["size"]) for s in decoded["segments"] or ()]
    if table != layout:
        raise SegmentTableMismatchError(
            f"the program lists segments {table[:8]}{'...' if len(table) > 8 else ''}, but the "
            f"pieces given lay out as {layout[:8]}{'...' if len(layout) > 8 else ''}"
        )
    data_size = layout[-1][0] + layout[-1][1] if layout else 0
    if data_size == 0:
        return Cord([program])
    padded = round_up(PTE_HEADER_LENGTH, _check_pow2(max_force_align))
    program_size = padded + len(program)
    base = round_up(program_size, segment_alignment)
    cord = Cord(insert_header(program, pte_header(padded, program_size, base, data_size)))
    zero_fill(cord, base - program_size)
    cord.append(segment_cord(items, layout))
    return cord


def _check_pow2(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ValueError(f"max_force_align must be a positive power of two, got {value!r}")
    return value
