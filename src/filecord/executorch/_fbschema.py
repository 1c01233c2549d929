"""How we describe a flatbuffer schema without generated code, and the decoded value type.

A :class:`TableSpec` lists a table's fields in declaration order; a field's slot is its
declaration index, except that a union takes two slots (its type byte, then its value), which is
how flatc numbers them.  Decoded tables are :class:`Table` values: an immutable mapping from
field name to value, where an absent string, vector, table or union is ``None`` (absent and
empty encode differently, so the distinction is kept) and an absent scalar reads as its default
(an encoder omits a scalar equal to its default, so the two are indistinguishable on disk).
"""

from __future__ import annotations

import enum
import mmap
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class Scalar:
    """A scalar type: its struct code, width, and the ``flatbuffers.Builder`` method suffix."""

    name: str
    code: str
    size: int
    builder: str
    is_bool: bool = False

    def unpack(self, buf: bytes | mmap.mmap, pos: int) -> int | float | bool:
        value: int | float | bool = struct.unpack_from("<" + self.code, buf, pos)[0]
        return bool(value) if self.is_bool else value


BOOL = Scalar("bool", "B", 1, "Bool", is_bool=True)
I8 = Scalar("i8", "b", 1, "Int8")
U8 = Scalar("u8", "B", 1, "Uint8")
I32 = Scalar("i32", "i", 4, "Int32")
U32 = Scalar("u32", "I", 4, "Uint32")
I64 = Scalar("i64", "q", 8, "Int64")
U64 = Scalar("u64", "Q", 8, "Uint64")
F64 = Scalar("f64", "d", 8, "Float64")


class Kind(enum.Enum):
    SCALAR = "scalar"
    STRING = "string"
    TABLE = "table"
    UNION = "union"
    SCALAR_VECTOR = "[scalar]"
    TABLE_VECTOR = "[table]"
    BYTES = "[ubyte] force_align"  # a force-aligned byte vector, decoded as ``bytes``


@dataclass(frozen=True, slots=True)
class Field:
    """One declared field.  ``target`` names the table (or tables, by union tag) it points to."""

    name: str
    kind: Kind
    scalar: Scalar | None = None
    target: str | None = None
    members: tuple[str, ...] = ()  # union member table names; tag = index + 1 (0 is NONE)
    default: int | float | bool = 0
    align_key: str | None = None  # BYTES: which configured alignment applies when encoding


def scalar(name: str, typ: Scalar, *, default: int | float | bool = 0) -> Field:
    return Field(name, Kind.SCALAR, scalar=typ, default=default)


def string(name: str) -> Field:
    return Field(name, Kind.STRING)


def table(name: str, target: str) -> Field:
    return Field(name, Kind.TABLE, target=target)


def union(name: str, *members: str) -> Field:
    return Field(name, Kind.UNION, members=members)


def vector(name: str, typ: Scalar) -> Field:
    return Field(name, Kind.SCALAR_VECTOR, scalar=typ)


def tables(name: str, target: str) -> Field:
    return Field(name, Kind.TABLE_VECTOR, target=target)


def aligned_bytes(name: str, align_key: str) -> Field:
    return Field(name, Kind.BYTES, scalar=U8, align_key=align_key)


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    fields: tuple[Field, ...]
    slots: tuple[int, ...] = field(init=False)  # first slot of each field
    by_name: Mapping[str, Field] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        slots, nxt = [], 0
        for f in self.fields:
            slots.append(nxt)
            nxt += 2 if f.kind is Kind.UNION else 1
        object.__setattr__(self, "slots", tuple(slots))
        object.__setattr__(self, "by_name", MappingProxyType({f.name: f for f in self.fields}))

    @property
    def num_slots(self) -> int:
        return (
            (self.slots[-1] + (2 if self.fields[-1].kind is Kind.UNION else 1))
            if self.fields
            else 0
        )


@dataclass(frozen=True, slots=True)
class Schema:
    root: str
    identifier: bytes
    tables: Mapping[str, TableSpec]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", MappingProxyType(dict(self.tables)))

    def spec(self, name: str) -> TableSpec:
        return self.tables[name]


class Table(Mapping[str, Any]):
    """An immutable decoded table: ``t["field"]``, ``t.get(...)``, ``t.replace(field=value)``.

    Unset fields read as the schema's default (scalars) or ``None`` (everything else).
    """

    __slots__ = ("_spec", "_values")

    def __init__(self, spec: TableSpec, values: Mapping[str, Any] | None = None, **kw: Any) -> None:
        merged = dict(values or {})
        merged.update(kw)
        unknown = set(merged) - set(spec.by_name)
        if unknown:
            raise KeyError(f"{spec.name} has no field(s) {sorted(unknown)}")
        full: dict[str, Any] = {}
        for f in spec.fields:
            v = merged.get(f.name)
            full[f.name] = f.default if v is None and f.kind is Kind.SCALAR else v
        self._spec = spec
        self._values = full

    @property
    def spec(self) -> TableSpec:
        return self._spec

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Table):
            return NotImplemented
        return self._spec.name == other._spec.name and self._values == other._values

    __hash__ = None  # type: ignore[assignment]  # mutable-looking contents: not hashable

    def replace(self, **changes: Any) -> Table:
        """A copy with some fields changed (``None`` unsets one)."""
        return Table(self._spec, {**self._values, **changes})

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._values.items() if v is not None)
        return f"{self._spec.name}({shown})"
