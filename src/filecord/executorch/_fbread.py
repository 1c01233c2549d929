"""A strict flatbuffer decoder driven by our field tables.

Theory of operation
-------------------
Every position is computed in Python integers and checked against the buffer before a byte is
unpacked, so a hostile file can only produce an :class:`ExecutorchFormatError` naming the field
and the absolute offset, never an ``IndexError``/``struct.error``.  Unsigned offsets only point
forward and our schemas are not recursive, so decoding always ends; the one remaining way to
make it slow is amplification (a vector of a million offsets to one table).  Two rules stop it:
a table reached twice is refused (no writer we know shares tables: ExecuTorch's packer and flatc
build every object once; vtables, which writers do share, are not tables), so every decoded
table is a distinct region of the buffer; and decoding may visit at most a few times as many
bytes as the buffer holds (strings and vectors, shared or not, are charged every time they are
reached).  Work and memory are therefore proportional to the buffer's size.

The buffer may be an ``mmap`` of the file: only the pages the decoder touches are read, so a
huge (or sparse) file is rejected after reading a few pages, not after loading it.

Alignment is checked as the C++ verifier does by default: tables and vector lengths on 4 bytes,
vtables on 2, scalars on their width (all relative to the buffer start).
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

from filecord.executorch._fbschema import Field, Kind, Schema, Table, TableSpec
from filecord.executorch.errors import (
    BadMagicError,
    MalformedFlatbufferError,
    TooManyObjectsError,
    TruncatedError,
)

Buffer = bytes | mmap.mmap  # what the decoder reads from (never modified)

_BUDGET_FACTOR = 4
_BUDGET_SLACK = 4096


class _Reader:
    def __init__(self, buf: Buffer, schema: Schema, base: int) -> None:
        self.buf = buf
        self.schema = schema
        self.base = base  # absolute file offset of buf[0], for messages only
        self.budget = _BUDGET_FACTOR * len(buf) + _BUDGET_SLACK
        self.seen: set[int] = set()

    # --- checked primitives ----------------------------------------------------------------
    def need(self, pos: int, n: int, what: str) -> None:
        if pos < 0 or n < 0 or pos + n > len(self.buf):
            raise TruncatedError(
                f"needs {n} bytes but the flatbuffer ends at {self.base + len(self.buf)}",
                field=what,
                offset=self.base + pos,
            )

    def aligned(self, pos: int, align: int, what: str) -> None:
        if pos % align:
            raise MalformedFlatbufferError(
                f"not aligned to {align} bytes", field=what, offset=self.base + pos
            )

    def spend(self, n: int, what: str, pos: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise TooManyObjectsError(
                f"refers to more data than the {len(self.buf)}-byte flatbuffer holds",
                field=what,
                offset=self.base + pos,
            )

    def u16(self, pos: int, what: str) -> int:
        self.need(pos, 2, what)
        value: int = struct.unpack_from("<H", self.buf, pos)[0]
        return value

    def u32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        value: int = struct.unpack_from("<I", self.buf, pos)[0]
        return value

    def i32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        value: int = struct.unpack_from("<i", self.buf, pos)[0]
        return value

    def follow(self, pos: int, what: str) -> int:
        """Target of the uoffset stored at ``pos`` (always forward)."""
        self.aligned(pos, 4, what)
        target = pos + self.u32(pos, what)
        self.need(target, 4, what)
        return target

    # --- objects ---------------------------------------------------------------------------
    def table(self, pos: int, spec: TableSpec, path: str) -> Table:
        self.aligned(pos, 4, path)
        if pos in self.seen:
            raise TooManyObjectsError(
                "a table reached twice (shared tables are refused)",
                field=path,
                offset=self.base + pos,
            )
        self.seen.add(pos)
        self.spend(4, path, pos)
        vtable = pos - self.i32(pos, path)
        what = f"{path} (vtable)"
        self.need(vtable, 4, what)
        self.aligned(vtable, 2, what)
        vt_size = self.u16(vtable, what)
        obj_size = self.u16(vtable + 2, what)
        if vt_size < 4 or vt_size % 2:
            raise MalformedFlatbufferError(
                f"vtable size {vt_size} is invalid", field=what, offset=self.base + vtable
            )
        self.need(vtable, vt_size, what)
        if obj_size < 4:
            raise MalformedFlatbufferError(
                f"object size {obj_size} is below 4", field=what, offset=self.base + vtable
            )
        self.need(pos, obj_size, path)

        def slot(n: int, width: int, name: str) -> int:
            entry = 4 + 2 * n
            if entry + 2 > vt_size:
                return 0
            off = self.u16(vtable + entry, name)
            if off and off + width > obj_size:
                raise MalformedFlatbufferError(
                    f"field lies outside its {obj_size}-byte table",
                    field=name,
                    offset=self.base + pos + off,
                )
            return off

        values: dict[str, Any] = {}
        for f, first in zip(spec.fields, spec.slots, strict=True):
            name = f"{path}.{f.name}"
            if f.kind is Kind.UNION:
                values[f.name] = self.union(
                    pos, slot(first, 1, name), slot(first + 1, 4, name), f, name
                )
                continue
            width = f.scalar.size if f.kind is Kind.SCALAR and f.scalar else 4
            off = slot(first, width, name)
            if off:
                values[f.name] = self.value(pos + off, f, name)
        return Table(spec, values)

    def union(self, pos: int, type_off: int, value_off: int, f: Field, name: str) -> Table | None:
        tag = self.buf[pos + type_off] if type_off else 0
        if tag == 0:
            return None
        if tag > len(f.members):
            raise MalformedFlatbufferError(
                f"union type {tag} is not one of {len(f.members)} members",
                field=name,
                offset=self.base + pos + type_off,
            )
        if not value_off:
            raise MalformedFlatbufferError(
                f"union type {tag} set without a value", field=name, offset=self.base + pos
            )
        member = f.members[tag - 1]
        target = self.follow(pos + value_off, name)
        return self.table(target, self.schema.spec(member), f"{name}<{member}>")

    def value(self, pos: int, f: Field, name: str) -> Any:
        kind = f.kind
        if kind is Kind.SCALAR and f.scalar is not None:
            self.aligned(pos, f.scalar.size, name)
            self.need(pos, f.scalar.size, name)
            return f.scalar.unpack(self.buf, pos)
        target = self.follow(pos, name)
        if kind is Kind.TABLE and f.target is not None:
            return self.table(target, self.schema.spec(f.target), name)
        count = self.u32(target, name)
        start = target + 4
        if kind is Kind.STRING:
            self.need(start, count + 1, name)
            self.spend(count + 1, name, target)
            if self.buf[start + count] != 0:
                raise MalformedFlatbufferError(
                    "string is not NUL-terminated", field=name, offset=self.base + start + count
                )
            try:
                return bytes(self.buf[start : start + count]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedFlatbufferError(
                    f"string is not UTF-8 ({exc.reason})", field=name, offset=self.base + start
                ) from None
        if kind is Kind.TABLE_VECTOR and f.target is not None:
            self.need(start, 4 * count, name)
            self.spend(4 * count, name, target)
            spec = self.schema.spec(f.target)
            out = []
            for i in range(count):
                elem = f"{name}[{i}]"
                out.append(self.table(self.follow(start + 4 * i, elem), spec, elem))
            return tuple(out)
        if f.scalar is None:  # pragma: no cover - every remaining kind has an element type
            raise TypeError(f"field {f.name} has no element type")
        size = f.scalar.size
        self.need(start, size * count, name)
        self.spend(size * count, name, target)
        if kind is Kind.BYTES:
            return bytes(self.buf[start : start + count])
        self.aligned(start, size, name)
        items = struct.unpack_from(f"<{count}{f.scalar.code}", self.buf, start)
        return tuple(bool(x) for x in items) if f.scalar.is_bool else items


def decode(buf: Buffer, schema: Schema, *, base: int = 0, check_identifier: bool = True) -> Table:
    """Decode a whole flatbuffer (root offset at ``buf[0]``) into a :class:`Table`.

    ``base`` is the absolute file offset of ``buf[0]``, used only in error messages.
    """
    reader = _Reader(buf, schema, base)
    reader.need(0, 8, "root offset and file identifier")
    if check_identifier and buf[4:8] != schema.identifier:
        raise BadMagicError(
            f"file identifier is {bytes(buf[4:8])!r}, expected {schema.identifier!r}",
            field="file identifier",
            offset=base + 4,
        )
    root = reader.follow(0, "root offset")
    return reader.table(root, schema.spec(schema.root), schema.root)


def root_object_start(buf: Buffer) -> int:
    """Lowest position of the root table or its vtable: where the builder's output began.

    The caller has already decoded ``buf``, so these reads are known to be in range.
    """
    root: int = struct.unpack_from("<I", buf, 0)[0]
    vtable: int = root - struct.unpack_from("<i", buf, root)[0]
    return min(root, vtable)
