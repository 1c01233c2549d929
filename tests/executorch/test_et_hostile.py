"""Hostile inputs: truncations, byte flips, oversize counts, crafted inconsistencies.

The only acceptable outcomes are a successful read or an ExecutorchFormatError subclass (a
FormatError/ValueError); any other exception, or a hang, fails.  Each test prints how many
cases it ran.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flatbuffers
import pytest
from et_helpers import sample_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filecord.errors import FormatError
from filecord.executorch import (
    BadHeaderError,
    BadMagicError,
    DuplicateKeyError,
    ExecutorchFormatError,
    MalformedFlatbufferError,
    NamedDataStore,
    OutOfRangeError,
    OverlapError,
    PtdEntry,
    ScalarType,
    TensorLayout,
    TooManyObjectsError,
    TruncatedError,
    build_ptd,
    encode_program,
    program_table,
    read_ptd,
    read_pte,
    serialize_program,
)


@pytest.fixture(scope="module")
def small_pte() -> bytes:
    store = NamedDataStore()
    store.add_named_data("nd", b"N" * 20, alignment=32)
    return bytes(serialize_program(sample_program(), store, mutable_data=[b"", b"abc"]).pte)


@pytest.fixture(scope="module")
def small_ptd() -> bytes:
    layout = TensorLayout.contiguous(ScalarType.FLOAT, (3, 4))
    return bytes(
        build_ptd([PtdEntry("w", bytes(range(48)), layout), PtdEntry("b", b"b" * 12, None)])
    )


def _reader(kind: str) -> Callable[[Path], Any]:
    return read_pte if kind == "pte" else read_ptd


def _outcome(read: Callable[[Path], Any], path: Path, data: bytes) -> str:
    path.write_bytes(data)
    error: ExecutorchFormatError | None = None
    try:
        read(path)
    except ExecutorchFormatError as exc:  # anything else propagates and fails the test
        error = exc
    if error is None:
        return "ok"
    assert isinstance(error, FormatError)
    assert error.field  # every error names the field it was checking
    return type(error).__name__


@pytest.mark.parametrize("kind", ["pte", "ptd"])
def test_every_truncation_raises(
    kind: str, small_pte: bytes, small_ptd: bytes, tmp_path: Path
) -> None:
    data = small_pte if kind == "pte" else small_ptd
    read = _reader(kind)
    assert _outcome(read, tmp_path / "f", data) == "ok"
    seen: dict[str, int] = {}
    for n in range(len(data)):
        outcome = _outcome(read, tmp_path / "f", data[:n])
        assert outcome != "ok", f"a {n}-byte truncation read without error"
        seen[outcome] = seen.get(outcome, 0) + 1
    print(f"{kind}: {len(data)} truncations, errors {seen}")


@pytest.mark.parametrize("kind", ["pte", "ptd"])
def test_byte_flips(
    kind: str, small_pte: bytes, small_ptd: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data = small_pte if kind == "pte" else small_ptd
    read = _reader(kind)
    path = tmp_path_factory.mktemp("flips") / "f"
    seen: dict[str, int] = {}

    @settings(
        max_examples=400,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(
        flips=st.lists(
            st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), min_size=1, max_size=8
        )
    )
    def run(flips: list[tuple[int, int]]) -> None:
        mutated = bytearray(data)
        for pos, value in flips:
            mutated[pos] = value
        outcome = _outcome(read, path, bytes(mutated))
        seen[outcome] = seen.get(outcome, 0) + 1

    run()
    print(f"{kind}: {sum(seen.values())} byte-flip cases, outcomes {seen}")


@pytest.mark.parametrize("kind", ["pte", "ptd"])
def test_oversize_words_everywhere(
    kind: str, small_pte: bytes, small_ptd: bytes, tmp_path: Path
) -> None:
    """Every aligned 32-bit word (counts, offsets, vtable entries) set to huge values."""
    data = small_pte if kind == "pte" else small_ptd
    read = _reader(kind)
    if kind == "pte":
        end = struct.unpack_from("<Q", data, 16)[0]  # program_size
    else:
        fb_offset, fb_size = struct.unpack_from("<QQ", data, 16)
        end = fb_offset + fb_size
    seen: dict[str, int] = {}
    cases = 0
    for pos in range(0, end - 3, 4):
        for value in (0xFFFFFFFF, 0x7FFFFFFF, 0x00100000, 0x10000):
            mutated = bytearray(data)
            struct.pack_into("<I", mutated, pos, value)
            outcome = _outcome(read, tmp_path / "f", bytes(mutated))
            seen[outcome] = seen.get(outcome, 0) + 1
            cases += 1
    print(f"{kind}: {cases} oversize-word cases, outcomes {seen}")


def _raw_pte(program: Any, segment_bytes: bytes, *, length: int = 32) -> bytes:
    """A .pte put together by hand (no layout checks), to express inconsistent files."""
    flatbuffer = encode_program(program)
    program_size = 32 + len(flatbuffer)
    base = (program_size + 127) // 128 * 128
    header = struct.pack("<4sIQQQ", b"eh00", length, program_size, base, len(segment_bytes))
    root = struct.unpack_from("<I", flatbuffer, 0)[0] + 32
    head = struct.pack("<I", root) + flatbuffer[4:8] + header + flatbuffer[8:]
    return head + bytes(base - program_size) + segment_bytes


def _segments(*pairs: tuple[int, int]) -> tuple[Any, ...]:
    return tuple(program_table("DataSegment", offset=o, size=s) for o, s in pairs)


def test_crafted_inconsistencies(tmp_path: Path) -> None:
    path = tmp_path / "x.pte"

    def fails(data: bytes, error: type[ExecutorchFormatError], field: str) -> None:
        path.write_bytes(data)
        with pytest.raises(error) as info:
            read_pte(path)
        assert field in info.value.field, info.value

    ok = _raw_pte(program_table("Program", segments=_segments((0, 10))), b"x" * 10)
    path.write_bytes(ok)
    assert read_pte(path).segments[0].data.to_bytes() == b"x" * 10

    fails(
        _raw_pte(program_table("Program", segments=_segments((0, 10), (5, 10))), b"x" * 15),
        OverlapError,
        "Program.segments[1]",
    )
    fails(
        _raw_pte(program_table("Program", segments=_segments((8, 10))), b"x" * 10),
        OutOfRangeError,
        "Program.segments[0]",
    )
    named = (program_table("NamedData", key="k", segment_index=3),)
    fails(
        _raw_pte(program_table("Program", segments=_segments((0, 1)), named_data=named), b"x"),
        OutOfRangeError,
        "named_data[0].segment_index",
    )
    dup = (program_table("NamedData", key="k"), program_table("NamedData", key="k"))
    fails(
        _raw_pte(program_table("Program", segments=_segments((0, 1)), named_data=dup), b"x"),
        DuplicateKeyError,
        "named_data[1]",
    )
    const = program_table("SubsegmentOffsets", segment_index=0, offsets=(0, 11))
    fails(
        _raw_pte(
            program_table("Program", segments=_segments((0, 10)), constant_segment=const),
            b"x" * 10,
        ),
        OutOfRangeError,
        "constant_segment.offsets[1]",
    )
    fails(_raw_pte(program_table("Program"), b"x", length=20), BadHeaderError, "eh00.length")
    wrong_id = bytearray(ok)
    wrong_id[4:8] = b"ET99"
    fails(bytes(wrong_id), BadMagicError, "file identifier")
    # A segment but no header: the runtime could not load it.
    fails(
        encode_program(program_table("Program", segments=_segments((0, 4)))),
        OutOfRangeError,
        "Program.segments[0]",
    )


def test_ptd_errors_name_field_and_offset(small_ptd: bytes, tmp_path: Path) -> None:
    path = tmp_path / "x.ptd"
    bad = bytearray(small_ptd)
    bad[8:12] = b"FH02"
    path.write_bytes(bytes(bad))
    with pytest.raises(BadMagicError) as info:
        read_ptd(path)
    assert (info.value.field, info.value.offset) == ("FH01.magic", 8)
    path.write_bytes(small_ptd[:-1])
    with pytest.raises(TruncatedError) as trunc:
        read_ptd(path)
    assert (trunc.value.field, trunc.value.offset) == ("FH01.segment_data_size", 40)


def test_amplification_is_refused(tmp_path: Path) -> None:
    """2000 plan offsets to one plan holding 2000 offsets to one value: 4M tables to decode
    from 16 KiB.  The budget stops it quickly instead of hanging."""
    n = 2000
    b = flatbuffers.Builder(1024)
    b.StartObject(2)  # EValue with no value
    value = b.EndObject()
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependUOffsetTRelative(value)
    values = b.EndVector()
    b.StartObject(10)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    plan = b.EndObject()
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependUOffsetTRelative(plan)
    plans = b.EndVector()
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    b.Finish(b.EndObject(), file_identifier=b"ET12")
    path = tmp_path / "bomb.pte"
    path.write_bytes(bytes(b.Output()))
    with pytest.raises(TooManyObjectsError):
        read_pte(path)


def test_bad_utf8_is_a_format_error(tmp_path: Path) -> None:
    program = program_table(
        "Program",
        execution_plan=(
            program_table(
                "ExecutionPlan",
                name="abc",
                values=(program_table("EValue", val=program_table("Int", int_val=1)),),
            ),
        ),
    )
    data = bytearray(encode_program(program))
    bad_name = bytearray(data)
    bad_name[data.index(b"abc\0")] = 0xFF
    path = tmp_path / "p.pte"
    path.write_bytes(bytes(bad_name))
    with pytest.raises(MalformedFlatbufferError, match="UTF-8"):
        read_pte(path)
