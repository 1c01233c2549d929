"""The generic flatbuffer layer: round trips, presence rules, force alignment (no executorch)."""

from __future__ import annotations

import struct
from typing import Any

from et_helpers import DELEGATE_BLOB, sample_program
from hypothesis import given, settings
from hypothesis import strategies as st

from filecord.executorch._fbread import decode
from filecord.executorch._fbschema import F64, Field, Kind, Schema
from filecord.executorch._fbwrite import encode
from filecord.executorch.schema import (
    FLAT_TENSOR_SCHEMA,
    PROGRAM_SCHEMA,
    Table,
    encode_program,
    program_table,
)

_LIMITS = {
    "bool": None,
    "i8": (-128, 127),
    "u8": (0, 255),
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}


def _scalar(f: Field) -> st.SearchStrategy[Any]:
    assert f.scalar is not None
    if f.scalar.is_bool:
        return st.booleans()
    if f.scalar is F64:
        return st.floats(allow_nan=False, width=64)
    lo, hi = _LIMITS[f.scalar.name]
    return st.integers(lo, hi)


def tables_of(schema: Schema, name: str, depth: int = 0) -> st.SearchStrategy[Table]:
    """Random tables of ``name``: every field absent or present with a random value."""
    spec = schema.spec(name)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in spec.fields:
        if f.kind is Kind.SCALAR:
            value = _scalar(f)
        elif f.kind is Kind.STRING:
            value = st.text(max_size=8)
        elif f.kind is Kind.SCALAR_VECTOR:
            value = st.lists(_scalar(f), max_size=4).map(tuple)
        elif f.kind is Kind.BYTES:
            value = st.binary(max_size=40)
        elif depth > 4:
            value = st.none()
        elif f.kind is Kind.TABLE:
            assert f.target is not None
            value = st.deferred(lambda f=f: tables_of(schema, f.target or "", depth + 1))
        elif f.kind is Kind.UNION:
            value = st.sampled_from(f.members).flatmap(lambda m: tables_of(schema, m, depth + 1))
        else:
            assert f.target is not None
            value = st.lists(
                st.deferred(lambda f=f: tables_of(schema, f.target or "", depth + 1)), max_size=2
            ).map(tuple)
        fields[f.name] = st.none() | value
    return st.fixed_dictionaries(fields).map(lambda v: Table(spec, v))


@settings(max_examples=150, deadline=None)
@given(tables_of(PROGRAM_SCHEMA, "Program"))
def test_program_round_trip(program: Table) -> None:
    data = encode(program, PROGRAM_SCHEMA)
    assert data[4:8] == b"ET12"
    assert decode(data, PROGRAM_SCHEMA) == program
    # Encoding is a function of the value: decoding and re-encoding gives the same bytes.
    assert encode(decode(data, PROGRAM_SCHEMA), PROGRAM_SCHEMA) == data


@settings(max_examples=150, deadline=None)
@given(tables_of(FLAT_TENSOR_SCHEMA, "FlatTensor"))
def test_flat_tensor_round_trip(root: Table) -> None:
    data = encode(root, FLAT_TENSOR_SCHEMA)
    assert data[4:8] == b"FT01"
    assert decode(data, FLAT_TENSOR_SCHEMA) == root


def test_sample_program_round_trip() -> None:
    program = sample_program()
    assert decode(encode_program(program), PROGRAM_SCHEMA) == program


def test_absent_and_empty_vectors_differ() -> None:
    absent = program_table("Program", constant_buffer=None)
    empty = program_table("Program", constant_buffer=())
    a, e = encode_program(absent), encode_program(empty)
    assert a != e
    assert decode(a, PROGRAM_SCHEMA)["constant_buffer"] is None
    assert decode(e, PROGRAM_SCHEMA)["constant_buffer"] == ()


def _vtable(data: bytes) -> tuple[int, ...]:
    root = struct.unpack_from("<I", data, 0)[0]
    vt = root - struct.unpack_from("<i", data, root)[0]
    size = struct.unpack_from("<H", data, vt)[0]
    return struct.unpack_from(f"<{size // 2}H", data, vt)


def test_default_scalars_are_omitted() -> None:
    # DataSegment is (offset u64, size u64): a default offset leaves its vtable slot at 0.
    from filecord.executorch.schema import flat_tensor_table

    seg = flat_tensor_table("DataSegment", offset=0, size=5)
    data = encode(
        flat_tensor_table("FlatTensor", version=0, segments=(seg,), named_data=()),
        FLAT_TENSOR_SCHEMA,
    )
    vt = _vtable(data)
    assert vt[2] == 0  # version 0: no slot
    decoded = decode(data, FLAT_TENSOR_SCHEMA)["segments"][0]
    assert (decoded["offset"], decoded["size"]) == (0, 5)


def test_force_aligned_bytes_land_on_their_alignment() -> None:
    blob = b"\xab" * 24
    for align in (16, 64, 256):
        program = program_table("Program", constant_buffer=(program_table("Buffer", storage=blob),))
        data = encode_program(program, constant_tensor_alignment=align)
        pos = data.index(blob)
        assert pos % align == 0, (align, pos)
        assert struct.unpack_from("<I", data, pos - 4)[0] == len(blob)
    # The delegate alignment is a separate knob.
    program = program_table(
        "Program",
        backend_delegate_data=(program_table("BackendDelegateInlineData", data=DELEGATE_BLOB),),
    )
    data = encode_program(program, delegate_alignment=128)
    assert data.index(DELEGATE_BLOB) % 128 == 0
