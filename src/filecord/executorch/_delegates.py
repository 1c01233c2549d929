"""What a delegate needs from named data: the keys its payload refers to, with their sizes.

A delegate's payload is its backend's own format; the program does not list the named-data keys
a payload will ask the runtime for.  For XNNPACK we read them from the payload (our own field
table, from the field order of the format's schema and the bytes of real payloads; no
generated code):

* optionally a header: magic ``XH00`` at byte 4, a u16 header length at 8 (30 in every payload
  we saw), a u32 flatbuffer offset at 10 and a u32 flatbuffer size at 14 (little-endian, relative
  to the payload), then the constant-data region's offset, which we do not need;
* the XNNGraph flatbuffer (identifier ``XN00`` or ``XN01``), whose field 8, ``constant_data``,
  lists ``ConstantDataOffset`` tables: ``offset`` u64, ``size`` u64, ``named_key`` string.  An
  entry with a non-empty ``named_key`` is a blob of ``size`` bytes the runtime looks up by that
  key, in the program's named data or in a data file.

Only the flatbuffer part of the payload is read; other backends' payloads are not parsed, and
the caller says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from filecord._pieces.data import FileBackedData
from filecord.executorch import _fbread
from filecord.executorch._fbschema import U32, U64, Schema, TableSpec, scalar, string, tables
from filecord.executorch.errors import (
    BadHeaderError,
    BadMagicError,
    ExecutorchFormatError,
    TruncatedError,
)
from filecord.executorch.values import Blob

XNNPACK_ID = "XnnpackBackend"
_XNN_HEADER_MAGIC = b"XH00"
_XNN_HEADER_FIELDS = 18  # magic, length, flatbuffer offset and size: the bytes we read
_XNN_IDENTIFIERS = (b"XN00", b"XN01")

# Fields 1..7 are placeholders that keep the slot numbering (their contents are not needed; a
# u32 reads an offset field harmlessly).
XNN_SCHEMA = Schema(
    root="XNNGraph",
    identifier=b"XN01",
    tables={
        "XNNGraph": TableSpec(
            "XNNGraph",
            (
                string("version"),
                scalar("xnodes", U32),
                scalar("xvalues", U32),
                scalar("num_externs", U32),
                scalar("input_ids", U32),
                scalar("output_ids", U32),
                scalar("constant_buffer", U32),
                scalar("mem_buffer_sizes", U32),
                tables("constant_data", "ConstantDataOffset"),
            ),
        ),
        "ConstantDataOffset": TableSpec(
            "ConstantDataOffset",
            (scalar("offset", U64), scalar("size", U64), string("named_key")),
        ),
    },
)


@dataclass(frozen=True, slots=True)
class DelegateKey:
    """A named-data key a delegate's payload refers to, and the bytes it needs there."""

    key: str
    size: int


def _read(data: Blob, offset: int, length: int) -> bytes:
    if isinstance(data, FileBackedData):
        return data.slice(offset, length).to_bytes()
    return bytes(data[offset : offset + length])


def xnnpack_keys(
    data: Blob, *, where: str
) -> tuple[DelegateKey, ...] | None:
    """The named keys of an XNNPACK payload (first use of each key, in table order), or
    ``None`` for a graph of a schema version other than ``XN00``/``XN01`` (not read).

    Raises an :class:`~filecord.executorch.errors.ExecutorchFormatError` subclass whose field
    starts with ``where`` for a payload that is not a well-formed XNNPACK graph.
    """
    total = len(data)
    head = _read(data, 0, min(total, _XNN_HEADER_FIELDS))
    if len(head) < 8:
        raise TruncatedError(f"a {total}-byte payload", field=where, offset=None)
    if head[4:8] == _XNN_HEADER_MAGIC:
        if len(head) < _XNN_HEADER_FIELDS:
            raise TruncatedError("header ends early", field=f"{where} XH00", offset=None)
        length, fb_offset, fb_size = struct.unpack_from("<HII", head, 8)
        if fb_offset < _XNN_HEADER_FIELDS or fb_offset + fb_size > total:
            raise BadHeaderError(
                f"header length {length}, flatbuffer [{fb_offset}, {fb_offset + fb_size}) in a "
                f"{total}-byte payload",
                field=f"{where} XH00",
                offset=None,
            )
    elif head[4:8] in _XNN_IDENTIFIERS:
        fb_offset, fb_size = 0, total
    else:
        raise BadMagicError(
            f"payload starts {bytes(head[:8])!r}: neither an XH00 header nor an XNNPACK graph",
            field=where,
            offset=None,
        )
    graph_bytes = _read(data, fb_offset, fb_size)
    if len(graph_bytes) < 8:
        raise TruncatedError(f"a {len(graph_bytes)}-byte graph", field=f"{where} XNNGraph",
                             offset=None)
    if graph_bytes[4:8] not in _XNN_IDENTIFIERS:
        if graph_bytes[4:6] == b"XN":
            return None  # a later schema version: its needs are not known here
        raise BadMagicError(
            f"graph identifier is {bytes(graph_bytes[4:8])!r}",
            field=f"{where} XNNGraph",
            offset=None,
        )
    try:
        graph = _fbread.decode(graph_bytes, XNN_SCHEMA, check_identifier=False)
    except ExecutorchFormatError as exc:
        raise type(exc)(exc.message, field=f"{where} {exc.field}", offset=None) from None
    seen: dict[str, int] = {}
    for entry in graph["constant_data"] or ():
        key = entry["named_key"]
        if key and key not in seen:
            seen[key] = entry["size"]
    return tuple(DelegateKey(k, n) for k, n in seen.items())
