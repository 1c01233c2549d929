"""Pure checks of a decoded Program's data-locating fields against its extended header.

Everything the runtime would later index with (segment indices, subsegment offsets, delegate
references) is checked here once, in Python integers, so readers and ``inspect`` can trust the
:class:`ProgramFacts` they get.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from filecord.executorch._fbschema import Table
from filecord.executorch.errors import (
    DuplicateKeyError,
    MissingFieldError,
    OutOfRangeError,
    OverlapError,
)
from filecord.executorch.schema import DATA_LOCATION_INLINE, DATA_LOCATION_SEGMENT

DataLocation = Literal["INLINE", "SEGMENT"]
"""Where a delegate's processed blob is: in the program flatbuffer, or in a segment."""

_LOCATIONS: dict[int, DataLocation] = {
    DATA_LOCATION_INLINE: "INLINE", DATA_LOCATION_SEGMENT: "SEGMENT"
}


@dataclass(frozen=True, slots=True)
class DelegateFact:
    plan: int
    position: int
    id: str
    location: DataLocation
    index: int
    inline_data: bytes  # the blob for INLINE, empty for SEGMENT


@dataclass(frozen=True, slots=True)
class ProgramFacts:
    segments: tuple[tuple[int, int], ...]  # (offset relative to the base, size)
    constant_segment: tuple[int, tuple[int, ...]] | None
    mutable_data_segments: tuple[tuple[int, tuple[int, ...]], ...]
    named_data: tuple[tuple[str, int], ...]
    delegates: tuple[DelegateFact, ...]


def check_segments(
    segments: Sequence[Table], base: int | None, data_size: int, field: str
) -> tuple[tuple[int, int], ...]:
    """Each segment inside ``[0, data_size)`` of the segment region, none overlapping.

    ``base`` is ``None`` when the file has no segment region; then only empty segments are
    allowed (the runtime cannot load a segment without a header).
    """
    out = []
    for i, seg in enumerate(segments):
        off, size = seg["offset"], seg["size"]
        where = None if base is None else base + off
        if size and base is None:
            raise OutOfRangeError(
                f"segment of {size} bytes but the file has no segment region",
                field=f"{field}[{i}]",
                offset=None,
            )
        if size and off + size > data_size:
            raise OutOfRangeError(
                f"segment [{off}, {off + size}) runs past segment_data_size {data_size}",
                field=f"{field}[{i}]",
                offset=where,
            )
        out.append((off, size))
    ordered = sorted((off, size, i) for i, (off, size) in enumerate(out) if size)
    for (a_off, a_size, a_i), (b_off, _b_size, b_i) in itertools.pairwise(ordered):
        if b_off < a_off + a_size:
            raise OverlapError(
                f"segment {b_i} starts inside segment {a_i} [{a_off}, {a_off + a_size})",
                field=f"{field}[{b_i}]",
                offset=None if base is None else base + b_off,
            )
    return tuple(out)


def _subsegment(
    sub: Table, segments: Sequence[tuple[int, int]], field: str
) -> tuple[int, tuple[int, ...]]:
    index, offsets = sub["segment_index"], tuple(sub["offsets"] or ())
    if offsets:
        if index >= len(segments):
            raise OutOfRangeError(
                f"segment_index {index} but there are {len(segments)} segments",
                field=f"{field}.segment_index",
                offset=None,
            )
        size = segments[index][1]
        for j, off in enumerate(offsets):
            if off > size:
                raise OutOfRangeError(
                    f"offset {off} is past the end of segment {index} ({size} bytes)",
                    field=f"{field}.offsets[{j}]",
                    offset=None,
                )
    return index, offsets


def check_named_data(
    named: Sequence[Table], n_segments: int, field: str
) -> tuple[tuple[str, int], ...]:
    seen: dict[str, int] = {}
    for i, entry in enumerate(named):
        key, index = entry["key"], entry["segment_index"]
        if key is None:
            raise MissingFieldError("named data without a key", field=f"{field}[{i}]", offset=None)
        if key in seen:
            raise DuplicateKeyError(
                f"key {key!r} already named by entry {seen[key]}",
                field=f"{field}[{i}]",
                offset=None,
            )
        if index >= n_segments:
            raise OutOfRangeError(
                f"key {key!r} names segment {index} but there are {n_segments}",
                field=f"{field}[{i}].segment_index",
                offset=None,
            )
        seen[key] = i
    return tuple((e["key"], e["segment_index"]) for e in named)


def _delegates(program: Table, n_segments: int) -> tuple[DelegateFact, ...]:
    inline = program["backend_delegate_data"] or ()
    out = []
    for p, plan in enumerate(program["execution_plan"] or ()):
        for d, delegate in enumerate(plan["delegates"] or ()):
            field = f"execution_plan[{p}].delegates[{d}].processed"
            ref = delegate["processed"]
            if ref is None:
                raise MissingFieldError("delegate without processed data", field=field, offset=None)
            location, index = _LOCATIONS.get(ref["location"]), ref["index"]
            limit = n_segments if location == "SEGMENT" else len(inline)
            if location is None:
                raise OutOfRangeError(
                    f"unknown data location {ref['location']}",
                    field=f"{field}.location",
                    offset=None,
                )
            if index >= limit:
                raise OutOfRangeError(
                    f"{location} index {index} but there are {limit}",
                    field=f"{field}.index",
                    offset=None,
                )
            blob = (inline[index]["data"] or b"") if location == "INLINE" else b""
            out.append(DelegateFact(p, d, delegate["id"] or "", location, index, blob))
    return tuple(out)


def check_program(
    program: Table, *, segment_base_offset: int | None, segment_data_size: int
) -> ProgramFacts:
    """Validate and extract the data-locating fields of a decoded Program."""
    segments = check_segments(
        program["segments"] or (), segment_base_offset, segment_data_size, "Program.segments"
    )
    constant = program["constant_segment"]
    mutable = program["mutable_data_segments"] or ()
    return ProgramFacts(
        segments=segments,
        constant_segment=None
        if constant is None
        else _subsegment(constant, segments, "Program.constant_segment"),
        mutable_data_segments=tuple(
            _subsegment(m, segments, f"Program.mutable_data_segments[{i}]")
            for i, m in enumerate(mutable)
        ),
        named_data=check_named_data(
            program["named_data"] or (), len(segments), "Program.named_data"
        ),
        delegates=_delegates(program, len(segments)),
    )
