"""Hostile inputs: truncations, byte flips, oversize counts, crafted inconsistencies.

The only acceptable outcomes are a successful read or an ExecutorchFormatError subclass (a
FormatError/ValueError); any other exception, or a hang, fails.  Each test prints how many
cases it ran.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import subprocess
import sys
import time
import tracemalloc
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
    NamedDataStore,
    PtdEntry,
    ScalarType,
    TensorLayout,
    build_program,
    build_ptd,
    read_ptd,
    read_pte,
    verify,
)
from filecord.executorch.errors import (
    BadHeaderError,
    BadMagicError,
    DuplicateKeyError,
    ExecutorchFormatError,
    MalformedFlatbufferError,
    OutOfRangeError,
    OverlapError,
    TooManyObjectsError,
    TruncatedError,
)
from filecord.executorch.schema import encode_program, program_table


@pytest.fixture(scope="module")
def small_pte() -> bytes:
    store = NamedDataStore()
    store.add_named_data("nd", b"N" * 20, alignment=32)
    return bytes(build_program(sample_program(), store, mutable_data=[b"", b"abc"]).pte)


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


# --- verify and inspect on hostile files (issue 10) ------------------------------------------
#
# ``verify`` reads more of a program than the readers check: every tensor's scalar type, sizes
# and dim order, method inputs and outputs, and an XNNPACK delegate's payload (its own header
# and flatbuffer).  The acceptable outcomes are a Verification (problems listed) and, through
# the CLI, exit 0 or 1 with a message; anything else fails.  Each case is timed and its Python
# allocations measured; the worst of each is printed.


def _xnn_payload(keys: list[tuple[str, int]]) -> bytes:
    """A minimal XNNPACK payload: an ``XH00`` header and an XNNGraph whose constant table
    names ``keys`` (the rest of the graph is empty)."""
    b = flatbuffers.Builder(256)
    names = [b.CreateString(k) for k, _n in keys]
    tables = []
    for name, (_k, size) in zip(names, keys, strict=True):
        b.StartObject(3)
        b.PrependUint64Slot(0, (1 << 64) - 1, 0)
        b.PrependUint64Slot(1, size, 0)
        b.PrependUOffsetTRelativeSlot(2, name, 0)
        tables.append(b.EndObject())
    b.StartVector(4, len(tables), 4)
    for t in reversed(tables):
        b.PrependUOffsetTRelative(t)
    vec = b.EndVector()
    version = b.CreateString("1")
    b.StartObject(9)
    b.PrependUOffsetTRelativeSlot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(8, vec, 0)
    b.Finish(b.EndObject(), file_identifier=b"XN01")
    graph = bytes(b.Output())
    head = bytes(4) + b"XH00" + struct.pack("<HIIQ", 30, 32, len(graph), 32 + len(graph))
    return head + bytes(32 - len(head)) + graph


def _verify_program(graph_id: bytes = b"XN01") -> tuple[bytes, bytes]:
    """A program with a constant tensor, an external tensor and an XNNPACK delegate needing one
    key from its own named data and one from the data file; and that data file."""
    t = program_table
    constant = t("Tensor", scalar_type=6, sizes=(3,), dim_order=(0,), data_buffer_idx=1)
    external = t(
        "Tensor", scalar_type=6, sizes=(3, 4), dim_order=(0, 1),
        extra_tensor_info=t("ExtraTensorInfo", fully_qualified_name="lin.weight", location=1),
    )
    plan = t(
        "ExecutionPlan",
        name="forward",
        values=(t("EValue", val=constant), t("EValue", val=external),
                t("EValue", val=t("Int", int_val=3))),
        inputs=(0,),
        outputs=(1,),
        chains=(t("Chain", inputs=(), outputs=(), instructions=(
            t("Instruction", instr_args=t("DelegateCall", delegate_index=0, args=(0, 1))),)),),
        operators=(t("Operator", name="aten::add", overload="out"),),
        delegates=(t("BackendDelegate", id="XnnpackBackend",
                     processed=t("BackendDelegateDataReference", location=0, index=0),
                     compile_specs=()),),
        non_const_buffer_sizes=(0, 64),
    )
    payload = _xnn_payload([("in_program", 20), ("in_data", 16)]).replace(b"XN01", graph_id, 1)
    program = t(
        "Program",
        execution_plan=(plan,),
        constant_buffer=(t("Buffer", storage=b""), t("Buffer", storage=bytes(12))),
        backend_delegate_data=(t("BackendDelegateInlineData", data=payload),),
    )
    store = NamedDataStore()
    store.add_named_data("in_program", b"P" * 20)
    pte = bytes(build_program(program, store).pte)
    layout = TensorLayout.contiguous(ScalarType.FLOAT, (3, 4))
    ptd = bytes(build_ptd([PtdEntry("lin.weight", bytes(48), layout),
                           PtdEntry("in_data", b"D" * 16, None)]))
    return pte, ptd


@pytest.fixture(scope="module")
def verify_pair() -> tuple[bytes, bytes]:
    return _verify_program()


class _Meter:
    """Counts outcomes; keeps the worst time and Python allocation peak per call."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.worst_s = 0.0
        self.worst_bytes = 0

    def run(self, call: Callable[[], str]) -> str:
        tracemalloc.start()
        start = time.perf_counter()
        try:
            outcome = call()
        finally:
            elapsed = time.perf_counter() - start
            _cur, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        self.worst_s = max(self.worst_s, elapsed)
        self.worst_bytes = max(self.worst_bytes, peak)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome

    @property
    def count(self) -> int:
        return sum(self.outcomes.values())

    def line(self, what: str) -> str:
        return (f"{what}: {self.count} calls, outcomes {self.outcomes}, worst "
                f"{self.worst_s * 1000:.1f} ms and {self.worst_bytes / 1024:.0f} KiB per call")


def _verify_outcome(pte: Path, ptd: Path) -> str:
    result = verify(pte, [ptd], runtime=False)
    if result.ok:
        return "ok"
    return "problems"


def _cli_outcome(args: list[str]) -> str:
    from filecord.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    assert rc in (0, 1), (args, rc, err.getvalue()[-500:])
    assert "Traceback" not in err.getvalue()
    return f"exit {rc}"


def test_the_verify_base_case_is_sound(verify_pair: tuple[bytes, bytes], tmp_path: Path) -> None:
    pte, ptd = verify_pair
    (tmp_path / "m.pte").write_bytes(pte)
    (tmp_path / "d.ptd").write_bytes(ptd)
    result = verify(tmp_path / "m.pte", [tmp_path / "d.ptd"], runtime=False)
    assert result.ok, result.problems
    assert [(n.key, n.size, n.needed_by) for n in result.needs] == [
        ("lin.weight", 48, "tensor"), ("in_program", 20, "XnnpackBackend"),
        ("in_data", 16, "XnnpackBackend"),
    ]
    assert result.constant_tensors == 1
    alone = verify(tmp_path / "m.pte", [], runtime=False)
    assert [n.key for n in alone.missing] == ["lin.weight", "in_data"]


def test_a_later_xnnpack_graph_version_is_reported_not_read(tmp_path: Path) -> None:
    pte, ptd = _verify_program(graph_id=b"XN07")
    (tmp_path / "m.pte").write_bytes(pte)
    (tmp_path / "d.ptd").write_bytes(ptd)
    result = verify(tmp_path / "m.pte", [tmp_path / "d.ptd"], runtime=False)
    assert result.ok
    assert result.unparsed_delegates == ("XnnpackBackend",)
    assert [n.key for n in result.needs] == ["lin.weight"]  # the payload's keys are unknown
    assert _cli_outcome(["inspect", str(tmp_path / "m.pte")]) == "exit 0"


@pytest.mark.xdist_group("timed")  # a wall-clock bound: one such test at a time
@pytest.mark.parametrize("target", ["pte", "ptd"])
def test_verify_and_cli_survive_byte_flips(
    target: str, verify_pair: tuple[bytes, bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    pte, ptd = verify_pair
    d = tmp_path_factory.mktemp("vflips")
    pte_path, ptd_path = d / "m.pte", d / "d.ptd"
    data = pte if target == "pte" else ptd
    meter, cli_meter = _Meter(), _Meter()

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(flips=st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)),
                          min_size=1, max_size=8))
    def run(flips: list[tuple[int, int]]) -> None:
        mutated = bytearray(data)
        for pos, value in flips:
            mutated[pos] = value
        pte_path.write_bytes(bytes(mutated) if target == "pte" else pte)
        ptd_path.write_bytes(bytes(mutated) if target == "ptd" else ptd)
        meter.run(lambda: _verify_outcome(pte_path, ptd_path))
        main = pte_path if target == "pte" else ptd_path
        cli_meter.run(lambda: _cli_outcome(["inspect", str(main)]))
        cli_meter.run(lambda: _cli_outcome(["inspect", "--json", str(main)]))
        cli_meter.run(lambda: _cli_outcome(
            ["verify", "--no-runtime", str(pte_path), "--data", str(ptd_path)]))

    run()
    print(meter.line(f"verify, {target} flipped"))
    print(cli_meter.line(f"CLI inspect/inspect --json/verify, {target} flipped"))
    assert meter.count >= 300
    assert cli_meter.count >= 900
    assert meter.outcomes.get("problems", 0) >= 200  # the flips do break things
    assert meter.worst_s < 2.0


@pytest.mark.xdist_group("timed")  # a wall-clock bound: one such test at a time
def test_verify_survives_every_truncation_and_oversize_word(
    verify_pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    pte, ptd = verify_pair
    pte_path, ptd_path = tmp_path / "m.pte", tmp_path / "d.ptd"
    meter = _Meter()
    for target, data in (("pte", pte), ("ptd", ptd)):
        variants = [data[:n] for n in range(len(data))]
        for pos in range(0, len(data) - 3, 4):
            for value in (0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x00100000):
                mutated = bytearray(data)
                struct.pack_into("<I", mutated, pos, value)
                variants.append(bytes(mutated))
        for v in variants:
            pte_path.write_bytes(v if target == "pte" else pte)
            ptd_path.write_bytes(v if target == "ptd" else ptd)
            meter.run(lambda: _verify_outcome(pte_path, ptd_path))
    print(meter.line("verify, truncations and oversize words"))
    assert meter.count >= 3600
    assert meter.outcomes.get("problems", 0) >= 2900
    assert meter.worst_s < 2.0


def _tensor_program(**fields: Any) -> bytes:
    t = program_table
    tensor = t("Tensor", **{"scalar_type": 6, "sizes": (3, 4), "dim_order": (0, 1), **fields})
    plan = t("ExecutionPlan", name="forward", values=(t("EValue", val=tensor),), inputs=(0,),
             outputs=(0,))
    return encode_program(t("Program", execution_plan=(plan,)))


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"scalar_type": 99}, "<Tensor>", "scalar_type 99 is not an ExecuTorch ScalarType"),
        ({"scalar_type": -3}, "<Tensor>", "scalar_type -3 is not an ExecuTorch ScalarType"),
        ({"dim_order": (0, 0)}, "dim_order", "dim_order [0, 0] is not a permutation of 0..1"),
        ({"dim_order": (1, 2)}, "dim_order", "dim_order [1, 2] is not a permutation of 0..1"),
        # the runtime's "Dim order size mismatch": a 1-D tensor with an empty dim_order
        ({"sizes": (3,), "dim_order": ()}, "dim_order", "dim_order [] has 0 entries for a "
         "tensor of 1 dimensions (sizes [3]); the runtime refuses the program"),
        ({"dim_order": (0,)}, "dim_order", "dim_order [0] has 1 entries for a tensor of 2 "
         "dimensions (sizes [3, 4]); the runtime refuses the program"),
        ({"sizes": (3, -4)}, "sizes", "negative size in [3, -4]"),
        ({"sizes": (1,) * 17, "dim_order": tuple(range(17))}, "sizes",
         "17 dimensions; the runtime supports at most 16"),
        ({"shape_dynamism": 7}, "shape_dynamism", "shape_dynamism 7 is not 0, 1 or 2"),
        ({"storage_offset": -1}, "storage_offset", "storage_offset -1 is negative"),
        ({"extra_tensor_info": program_table("ExtraTensorInfo", location=5)},
         "extra_tensor_info.location", "location 5 is not SEGMENT (0) or EXTERNAL (1)"),
        ({"extra_tensor_info": program_table("ExtraTensorInfo", location=1)},
         "extra_tensor_info", "external tensor without a fully qualified name"),
    ],
)
def test_invalid_tensor_fields_are_named(
    fields: dict[str, Any], field: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "p.pte"
    path.write_bytes(_tensor_program(**fields))
    result = verify(path, [], runtime=False)
    (problem,) = result.problems
    assert problem.where == str(path)
    assert "execution_plan[0].values[0]<Tensor>" in problem.message
    assert field in problem.message
    assert problem.message.endswith(message)
    assert _cli_outcome(["inspect", str(path)]) == "exit 1"
    assert _cli_outcome(["verify", "--no-runtime", str(path)]) == "exit 1"


def test_method_value_indices_out_of_range_are_named(tmp_path: Path) -> None:
    t = program_table
    plan = t("ExecutionPlan", name="forward",
             values=(t("EValue", val=t("Int", int_val=1)),), inputs=(0,), outputs=(0, 7))
    path = tmp_path / "p.pte"
    path.write_bytes(encode_program(t("Program", execution_plan=(plan,))))
    (problem,) = verify(path, [], runtime=False).problems
    assert problem.message == (
        "execution_plan[0].outputs[1]: value index 7 but the method has 1 values"
    )
    assert _cli_outcome(["inspect", str(path)]) == "exit 1"


def _amplified(n: int) -> bytes:
    """A program whose one plan has ``n`` values, all offsets to ONE shared EValue: ``4 n``
    bytes that would decode (and be walked) as ``n`` objects."""
    b = flatbuffers.Builder(4 * n + 1024)
    b.StartObject(2)
    value = b.EndObject()
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependUOffsetTRelative(value)
    values = b.EndVector()
    b.StartObject(10)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    plan = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(plan)
    plans = b.EndVector()
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    b.Finish(b.EndObject(), file_identifier=b"ET12")
    return bytes(b.Output())


@pytest.mark.xdist_group("timed")  # a wall-clock bound: one such test at a time
def test_a_million_offsets_to_one_table_is_refused_at_once(tmp_path: Path) -> None:
    """The 3.9 MiB file of the report (1M offsets to one table: 11 s and 1 GiB before)."""
    path = tmp_path / "amplified.pte"
    path.write_bytes(_amplified(1_000_000))
    assert path.stat().st_size > 3_900_000
    meter = _Meter()

    errors: list[str] = []

    def read() -> str:
        try:
            read_pte(path)
        except TooManyObjectsError as exc:
            errors.append(str(exc))
            return "refused"
        return "ok"

    assert meter.run(read) == "refused"
    assert "a table reached twice (shared tables are refused)" in errors[0]
    meter.run(lambda: _cli_outcome(["inspect", str(path)]))
    meter.run(lambda: _cli_outcome(["verify", "--no-runtime", str(path)]))
    print(meter.line("amplification, 1M offsets to one table"))
    assert meter.outcomes == {"refused": 1, "exit 1": 2}
    assert meter.worst_s < 1.0
    assert meter.worst_bytes < 64 << 20


SPARSE_SIZE = 1_100_000_000


def _sparse_cases() -> dict[str, bytes]:
    """Heads of 1.1 GB sparse files: identifiers and headers that claim the whole file."""
    claim = SPARSE_SIZE
    return {
        "pte identifier only": bytes(4) + b"ET12",
        "pte header claims the file": bytes(4) + b"ET12" + b"eh00"
        + struct.pack("<IQQQ", 32, claim, claim, 0),
        "pte root offset into the zeros": struct.pack("<I", 900_000_000) + b"ET12",
        "ptd header claims the file": struct.pack("<I", 72) + b"FT01" + b"FH01"
        + struct.pack("<IQQQQ", 40, 48, claim - 48, claim, 0),
    }


@pytest.mark.xdist_group("timed")  # a wall-clock bound: one such test at a time
@pytest.mark.parametrize("case", list(_sparse_cases()))
def test_a_sparse_1_1_gb_file_is_not_read_whole(case: str, tmp_path: Path) -> None:
    """A child process inspects and verifies the file; its peak RSS stays small."""
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.write(_sparse_cases()[case])
        f.truncate(SPARSE_SIZE)
    assert path.stat().st_blocks * 512 < 1 << 20  # really sparse
    script = (
        "import resource, sys, time\n"
        "from filecord.cli import main\n"
        "import filecord.executorch\n"
        "rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "before, t = rss(), time.perf_counter()\n"
        "codes = [main(['inspect', sys.argv[1]]), main(['verify', '--no-runtime', sys.argv[1]])]\n"
        "print('RESULT', codes, time.perf_counter() - t, rss() - before)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, env=env, check=False, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT"))
    _tag, codes, seconds, rss_kib = line.split(" ", 1)[0], *line.split(" ", 1)[1].rsplit(" ", 2)
    print(f"sparse 1.1 GB, {case}: exit codes {codes}, {float(seconds) * 1000:.0f} ms, "
          f"peak RSS grew by {int(rss_kib)} KiB")
    assert codes == "[1, 1]"
    assert int(rss_kib) < 32 * 1024  # the file is 1.1 GB; reading it whole would show
    assert float(seconds) < 5.0
