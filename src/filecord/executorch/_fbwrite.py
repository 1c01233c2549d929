"""Encode a :class:`Table` with ``flatbuffers.Builder``, in the order ExecuTorch's encoder uses.

Byte identity with ExecuTorch depends only on the order of builder calls, which is the order of
flatc's Python object API ``Pack``: for each field in declaration order, build its child first
(a string; a scalar vector prepended back to front; a table vector whose elements are packed in
ascending order and whose offsets are then prepended back to front; a sub-table or union value);
then start the table and add every field in declaration order, scalars only when they differ
from the default.  The builder deduplicates vtables itself, exactly as it did for ExecuTorch.

Force-aligned byte vectors (constant tensors and inline delegate blobs) start a byte vector with
the configured alignment and copy the bytes in one block below the builder's head: prepending
them one at a time would give the same bytes at Python-loop speed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flatbuffers

from filecord.executorch._fbschema import Field, Kind, Schema, Table

_DEFAULT_ALIGN = 16


def _check_align(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ValueError(f"{what} must be a positive power of two, got {value!r}")
    return value


class _Packer:
    def __init__(self, schema: Schema, alignments: Mapping[str, int]) -> None:
        self.schema = schema
        self.alignments = {k: _check_align(v, f"{k} alignment") for k, v in alignments.items()}
        self.b = flatbuffers.Builder(1024)

    def child(self, f: Field, value: Any) -> int:
        b = self.b
        kind = f.kind
        if kind is Kind.STRING:
            if not isinstance(value, str):
                raise TypeError(f"{f.name} must be str, not {type(value).__name__}")
            return int(b.CreateString(value))
        if kind in (Kind.TABLE, Kind.UNION):
            return self.pack(value)
        if kind is Kind.TABLE_VECTOR:
            offsets = [self.pack(item) for item in value]
            b.StartVector(4, len(offsets), 4)
            for off in reversed(offsets):
                b.PrependUOffsetTRelative(off)
            return int(b.EndVector())
        if kind is Kind.BYTES:
            return self.aligned_bytes(f, value)
        if f.scalar is None:  # pragma: no cover - schema construction guarantees it
            raise TypeError(f"field {f.name} has no element type")
        prepend = getattr(b, "Prepend" + f.scalar.builder)
        b.StartVector(f.scalar.size, len(value), f.scalar.size)
        for item in reversed(value):
            prepend(item)
        return int(b.EndVector())

    def aligned_bytes(self, f: Field, value: Any) -> int:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"{f.name} must be in-memory bytes to be encoded inline, not {type(value).__name__}"
            )
        data = memoryview(value).cast("B")
        align = self.alignments.get(f.align_key or "", _DEFAULT_ALIGN)
        b = self.b
        b.StartVector(1, len(data), align)
        b.head = b.head - len(data)
        b.Bytes[b.head : b.head + len(data)] = data
        return int(b.EndVector())

    def pack(self, t: Table) -> int:
        if not isinstance(t, Table):
            raise TypeError(f"expected a Table, not {type(t).__name__}")
        spec = t.spec
        if self.schema.tables.get(spec.name) is not spec:
            raise TypeError(f"{spec.name} is not a table of the {self.schema.root} schema")
        b = self.b
        children: dict[str, int] = {}
        for f in spec.fields:
            value = t[f.name]
            if f.kind is not Kind.SCALAR and value is not None:
                children[f.name] = self.child(f, value)
        b.StartObject(spec.num_slots)
        for f, slot in zip(spec.fields, spec.slots, strict=True):
            value = t[f.name]
            if f.kind is Kind.SCALAR and f.scalar is not None:
                getattr(b, f"Prepend{f.scalar.builder}Slot")(slot, value, f.default)
            elif f.kind is Kind.UNION:
                tag = 0 if value is None else f.members.index(value.spec.name) + 1
                b.PrependUint8Slot(slot, tag, 0)
                if value is not None:
                    b.PrependUOffsetTRelativeSlot(slot + 1, children[f.name], 0)
            elif value is not None:
                b.PrependUOffsetTRelativeSlot(slot, children[f.name], 0)
        return int(b.EndObject())


def encode(root: Table, schema: Schema, *, alignments: Mapping[str, int] | None = None) -> bytes:
    """The plain flatbuffer (no extended header) for ``root``, with the schema's identifier.

    ``alignments`` maps a force-aligned field's ``align_key`` to its alignment (default 16).
    """
    if root.spec.name != schema.root:
        raise TypeError(f"the root must be a {schema.root}, not a {root.spec.name}")
    packer = _Packer(schema, alignments or {})
    offset = packer.pack(root)
    packer.b.Finish(offset, file_identifier=schema.identifier)
    return bytes(packer.b.Output())
