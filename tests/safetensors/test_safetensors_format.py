"""The safetensors reader and header writer without torch: exact bytes, every rule, hostile input.

The only acceptable outcome of reading a damaged file is a successful read or a
``SafetensorsFormatError`` subclass (a ``FormatError``), each call bounded in time and memory.
The suites assert their own size so a broken enumerator cannot pass by testing nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filecord import FileBackedData, save
from filecord._io import syscalls as _sys
from filecord.errors import FormatError
from filecord.safetensors import (
    DType,
    NamedTensor,
    SafetensorsFile,
    SafetensorsIndex,
    build_file,
    read_safetensors,
)
from filecord.safetensors._format import canonical_order, encode_header, parse_header, split_shards
from filecord.safetensors.errors import (
    DuplicateKeyError,
    HeaderTooLargeError,
    InvalidHeaderError,
    InvalidIndexError,
    InvalidOffsetsError,
    SafetensorsFormatError,
    ShapeMismatchError,
    TruncatedFileError,
    UnknownDtypeError,
)


def raw_file(header: bytes | dict[str, Any], data: bytes = b"") -> bytes:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(hb)) + hb + data


def write(tmp_path: Path, blob: bytes, name: str = "f.safetensors") -> str:
    p = tmp_path / name
    p.write_bytes(blob)
    return os.fspath(p)


E = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}


# --- exact bytes ---------------------------------------------------------------------------

def test_header_bytes_are_exactly_the_documented_layout():
    h = encode_header([("b", DType.F32, (2,), 8), ("a", DType.U8, (3,), 3)], {"k": "v"})
    text = b'{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' \
           b'"a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}'
    pad = -(8 + len(text)) % 8
    assert h == struct.pack("<Q", len(text) + pad) + text + b" " * pad
    assert len(h) % 8 == 0


def test_alignment_4096_starts_data_on_a_page_and_is_still_valid(tmp_path):
    t = NamedTensor("w", DType.I16, (3,), b"\x01\x00\x02\x00\x03\x00")
    cord = build_file([t], None, alignment=4096)
    path = tmp_path / "a.safetensors"
    save(path, cord)
    blob = path.read_bytes()
    assert len(blob) == 4096 + 6
    assert blob[4096:] == b"\x01\x00\x02\x00\x03\x00"
    assert blob[8:].split(b"}}", 1)[1].rstrip(b"\x01\x02\x03\x00") == b" " * (4096 - 8 - len(
        blob[8:].split(b"}}", 1)[0]) - 2)
    f = read_safetensors(path)
    assert isinstance(f, SafetensorsFile)
    assert f.data_start == 4096
    with pytest.raises(ValueError, match="power of two"):
        encode_header([], None, alignment=12)


def test_reader_gives_file_backed_ranges_at_exact_offsets_and_reads_no_tensor_bytes(tmp_path):
    data = bytes(range(40))
    hdr = {"__metadata__": {"m": "1"},
           "b": {"dtype": "I32", "shape": [2, 2], "data_offsets": [8, 24]},
           "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
           "c": {"dtype": "F64", "shape": [2], "data_offsets": [24, 40]},
           "z": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [40, 40]}}
    blob = raw_file(hdr, data)
    path = write(tmp_path, blob)
    reads: list[int] = []

    class Count(_sys.Backend):
        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op in ("pread", "preadinto"):
                reads.append(args[1] if op == "pread" else len(args[1]))

    with _sys.use(Count()):
        f = read_safetensors(path)
    assert isinstance(f, SafetensorsFile)
    start = 8 + len(json.dumps(hdr))
    assert sum(reads) == start  # the length and the header, nothing else
    assert f.metadata == {"m": "1"}
    assert f.data_start == start
    assert list(f.tensors) == ["a", "b", "c", "z"]  # data order
    for name, lo, hi in (("a", 0, 8), ("b", 8, 24), ("c", 24, 40), ("z", 40, 40)):
        d = f.tensors[name].data
        assert isinstance(d, FileBackedData)
        assert (d.offset, len(d)) == (start + lo, hi - lo)
        assert d.to_bytes() == data[lo:hi]
    assert f.tensors["b"].shape == (2, 2)
    assert f.tensors["b"].dtype is DType.I32


def test_rebuilding_a_read_file_is_byte_identical_and_joins_adjacent_ranges(tmp_path):
    tensors = [NamedTensor(f"t{i}", DType.F32, (i,), bytes(range(4 * i))) for i in range(1, 6)]
    p = tmp_path / "x.safetensors"
    save(p, build_file(tensors, {"format": "pt"}))
    f = read_safetensors(p)
    assert isinstance(f, SafetensorsFile)
    cord = build_file(f.tensors, f.metadata, wholes=[f.whole])
    assert bytes(cord) == p.read_bytes()
    assert len(cord.pieces) == 2  # the header, then one run of the file's data


# --- strictness: one error class per rule, with field and offset ----------------------------

CASES: list[tuple[str, bytes, type[SafetensorsFormatError], str]] = [
    ("short", b"\x01\x00", TruncatedFileError, "header_size"),
    ("header past end", struct.pack("<Q", 100) + b"{}", TruncatedFileError, "header_size"),
    ("huge header", struct.pack("<Q", 2**63) + b"{}", HeaderTooLargeError, "header_size"),
    ("not brace", raw_file(b' {"a":1}'), InvalidHeaderError, "header"),
    ("not utf8", raw_file(b'{"\xff":{}}'), InvalidHeaderError, "header"),
    ("bad json", raw_file(b'{"a":'), InvalidHeaderError, "header"),
    ("tab pad", raw_file(json.dumps({"a": E}).encode() + b"\t", b"\0" * 4), InvalidHeaderError,
     "header"),
    ("nul pad", raw_file(json.dumps({"a": E}).encode() + b"\0", b"\0" * 4), InvalidHeaderError,
     "header"),
    ("dup key", raw_file(b'{"a":' + json.dumps(E).encode() + b',"a":'
                         + json.dumps(E).encode() + b"}", b"\0" * 4), DuplicateKeyError,
     "header"),
    ("dup field", raw_file(b'{"a":{"dtype":"F32","dtype":"F32","shape":[1],'
                           b'"data_offsets":[0,4]}}', b"\0" * 4), DuplicateKeyError, "header"),
    ("float", raw_file(b'{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', b"\0" * 4),
     InvalidHeaderError, "header"),
    ("nan", raw_file(b'{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', b"\0" * 4),
     InvalidHeaderError, "header"),
    ("bigint", raw_file(b'{"a":{"dtype":"F32","shape":[1' + b"0" * 5000 + b'],'
                        b'"data_offsets":[0,4]}}', b"\0" * 4), InvalidHeaderError, "header"),
    ("deep", raw_file(b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}"), InvalidHeaderError,
     "header"),
    ("entry not object", raw_file({"a": [1]}), InvalidHeaderError, "a"),
    ("missing", raw_file({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), InvalidHeaderError,
     "a.data_offsets"),
    ("extra field", raw_file({"a": {**E, "x": 1}}, b"\0" * 4), InvalidHeaderError, "a"),
    ("dtype", raw_file({"a": {**E, "dtype": "f32"}}, b"\0" * 4), UnknownDtypeError, "a.dtype"),
    ("neg dim", raw_file({"a": {**E, "shape": [-1]}}, b"\0" * 4), InvalidHeaderError, "a.shape"),
    ("bool dim", raw_file({"a": {**E, "shape": [True]}}, b"\0" * 4), InvalidHeaderError,
     "a.shape"),
    ("dim 2**64", raw_file({"a": {**E, "shape": [2**64]}}, b"\0" * 4), InvalidHeaderError,
     "a.shape"),
    ("3 offsets", raw_file({"a": {**E, "data_offsets": [0, 4, 4]}}, b"\0" * 4),
     InvalidHeaderError, "a.data_offsets"),
    ("begin>end", raw_file({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}},
                           b"\0" * 4), InvalidOffsetsError, "a.data_offsets"),
    ("size", raw_file({"a": {**E, "shape": [2]}}, b"\0" * 4), ShapeMismatchError,
     "a.data_offsets"),
    ("sub-byte", raw_file({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}},
                          b"\0" * 2), ShapeMismatchError, "a.shape"),
    ("huge shape", raw_file({"a": {**E, "shape": [2**63, 2**63, 2**63]}}, b"\0" * 4),
     ShapeMismatchError, "a.data_offsets"),
    ("gap", raw_file({"a": {**E, "data_offsets": [4, 8]}}, b"\0" * 8), InvalidOffsetsError,
     "a.data_offsets"),
    ("overlap", raw_file({"a": E, "b": E}, b"\0" * 4), InvalidOffsetsError, "b.data_offsets"),
    ("trailing", raw_file({"a": E}, b"\0" * 5), InvalidOffsetsError, "data"),
    ("past end", raw_file({"a": {**E, "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),
     TruncatedFileError, "a.data_offsets"),
    ("metadata type", raw_file({"__metadata__": {"x": 1}}), InvalidHeaderError, "__metadata__"),
    ("metadata list", raw_file({"__metadata__": E}), InvalidHeaderError, "__metadata__"),
]


@pytest.mark.parametrize(("name", "blob", "error", "field"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_raises_its_error_with_field_and_offset(tmp_path, name, blob, error, field):
    path = write(tmp_path, blob)
    with pytest.raises(error) as info:
        read_safetensors(path)
    assert isinstance(info.value, FormatError)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert info.value.offset is None or 0 <= info.value.offset <= len(blob)
    assert field in str(info.value)


def test_error_offsets_point_at_the_problem(tmp_path):
    blob = raw_file({"ok": E, "bad": {**E, "dtype": "Q9", "data_offsets": [4, 8]}}, b"\0" * 8)
    with pytest.raises(UnknownDtypeError) as info:
        read_safetensors(write(tmp_path, blob))
    assert blob[info.value.offset: info.value.offset + 5] == b'"bad"'
    blob = raw_file(b'{"a":' + json.dumps(E).encode() + b"}  x", b"\0" * 4)
    with pytest.raises(InvalidHeaderError) as info2:
        read_safetensors(write(tmp_path, blob))
    assert blob[info2.value.offset:info2.value.offset + 1] == b"x"


@pytest.mark.xdist_group("timed")  # a wall-clock bound: one such test at a time
def test_accepted_variants_of_the_format(tmp_path):
    # Offsets in any JSON order, empty tensors at a boundary, metadata anywhere or null,
    # whitespace inside the JSON, sub-byte types that fill whole bytes.
    ok = [
        raw_file({"b": {**E, "data_offsets": [4, 8]}, "a": E}, b"\0" * 8),
        raw_file({"a": E, "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                  "z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}, b"\0" * 4),
        raw_file({"a": E, "__metadata__": None}, b"\0" * 4),
        raw_file(b'{ "a" : {"dtype":"F32", "shape":[1], "data_offsets":[0,4]} }   ', b"\0" * 4),
        raw_file({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"\0" * 3),
        raw_file({"a": {"dtype": "F4", "shape": [0, 2**63], "data_offsets": [0, 0]}}),
        raw_file({}),
    ]
    for blob in ok:
        assert isinstance(read_safetensors(write(tmp_path, blob)), SafetensorsFile)


# --- hostile input: only FormatError subclasses, bounded ------------------------------------

def _valid() -> bytes:
    tensors = [NamedTensor("w", DType.F32, (2, 3), bytes(24)),
               NamedTensor("b", DType.BF16, (3,), bytes(6)),
               NamedTensor("é", DType.U8, (0,), b""),
               NamedTensor("f4", DType.F4, (4,), b"\x12\x34")]
    return bytes(build_file(tensors, {"format": "pt"}))


def _read_bounded(path: str, size: int) -> None:
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        read_safetensors(path)
    except SafetensorsFormatError:
        pass
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 5.0
    assert peak < 64 * size + (1 << 20), peak  # bounded by the file's size


def test_every_truncation_and_every_byte_flip(tmp_path):
    blob = _valid()
    path = os.fspath(tmp_path / "h.safetensors")
    cases = 0
    for n in range(len(blob)):
        Path(path).write_bytes(blob[:n])
        with pytest.raises(SafetensorsFormatError):
            read_safetensors(path)
        cases += 1
    for i in range(len(blob)):
        for flip in (0x01, 0x80, 0xFF):
            mutated = bytearray(blob)
            mutated[i] ^= flip
            Path(path).write_bytes(bytes(mutated))
            with contextlib.suppress(SafetensorsFormatError):
                read_safetensors(path)
            cases += 1
    assert cases >= 4 * len(blob) > 1000


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=2**64 - 1))
def test_random_headers_raise_only_format_errors(tmp_path_factory, body, n):
    path = os.fspath(tmp_path_factory.mktemp("r") / "r.safetensors")
    for blob in (struct.pack("<Q", len(body)) + body, struct.pack("<Q", n) + body,
                 struct.pack("<Q", len(body)) + b"{" + body):
        Path(path).write_bytes(blob)
        _read_bounded(path, len(blob))


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids,
                                                              max_size=4),
    max_leaves=20), st.binary(max_size=64))
def test_random_json_headers_raise_only_format_errors(tmp_path_factory, value, data):
    path = os.fspath(tmp_path_factory.mktemp("j") / "j.safetensors")
    for header in ({"a": value}, {"a": {"dtype": "U8", "shape": value, "data_offsets": [0, 1]}},
                   {"a": {"dtype": "U8", "shape": [1], "data_offsets": value}},
                   {"__metadata__": value}):
        blob = raw_file(header, data)
        Path(path).write_bytes(blob)
        _read_bounded(path, len(blob))


def test_huge_header_lengths_are_refused_without_reading(tmp_path):
    path = write(tmp_path, b"")
    for n in (MAX := 100_000_001, 2**32, 2**64 - 1):
        Path(path).write_bytes(struct.pack("<Q", n) + b"{}")
        with pytest.raises(HeaderTooLargeError):
            read_safetensors(path)
    assert MAX > 100_000_000


# --- pure writer pieces ---------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=0, max_size=6).filter(lambda s: s != "__metadata__"),
                          st.sampled_from(list(DType)),
                          st.lists(st.integers(0, 5), max_size=3)),
                unique_by=lambda x: x[0], max_size=8),
       st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
       st.sampled_from([8, 64, 4096]))
def test_encode_then_parse_round_trips(entries, metadata, alignment):
    rows = []
    for name, dtype, shape in entries:
        n = 1
        for d in shape:
            n *= d
        if n * dtype.bits % 8:
            shape = [*shape, 8]
            n *= 8
        rows.append((name, dtype, tuple(shape), n * dtype.bits // 8))
    try:
        head = encode_header(rows, metadata, alignment=alignment)
    except ValueError:  # a lone surrogate cannot be UTF-8: refused, never written
        return
    data_len = sum(r[3] for r in rows)
    assert len(head) % alignment == 0
    parsed = parse_header(head[8:], len(head) + data_len)
    assert parsed.metadata == metadata
    assert parsed.data_start == len(head)
    got = {e.name: (e.dtype, e.shape, e.end - e.begin) for e in parsed.entries}
    assert got == {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_canonical_order_groups_by_dtype_then_name():
    items = [("b", DType.F32), ("a", DType.BOOL), ("c", DType.I64), ("a2", DType.F32),
             ("z", DType.U64), ("é", DType.F32), ("Z", DType.F32)]
    assert canonical_order(items) == ["z", "c", "Z", "a2", "b", "é", "a"]


def test_split_shards_rules():
    assert split_shards([("a", 100), ("b", 100), ("c", 1)], 200) == [["a", "b"], ["c"]]
    assert split_shards([("z", 40), ("a", 120), ("m", 40), ("b", 4), ("big", 400)], 100) == [
        ["a"], ["big"], ["z", "m", "b"]]
    assert split_shards([], 10) == []
    assert split_shards([("e", 0), ("f", 0)], 1) == [["e", "f"]]


# --- sharded checkpoints --------------------------------------------------------------------

def _shards(tmp_path: Path) -> Path:
    a = [NamedTensor("x", DType.F32, (1,), b"\0\0\x80?")]
    b = [NamedTensor("y", DType.U8, (2,), b"\x01\x02")]
    save(tmp_path / "m-1.safetensors", build_file(a, {"format": "pt"}))
    save(tmp_path / "m-2.safetensors", build_file(b, {"format": "pt"}))
    return tmp_path / "m.safetensors.index.json"


def test_index_is_read_with_its_shards_in_weight_map_order(tmp_path):
    idx = _shards(tmp_path)
    idx.write_text(json.dumps({"metadata": {"total_size": 6},
                               "weight_map": {"y": "m-2.safetensors", "x": "m-1.safetensors"}}))
    got = read_safetensors(idx)
    assert isinstance(got, SafetensorsIndex)
    assert list(got.tensors) == ["y", "x"]
    assert len(got.shards) == 2
    assert got.tensors["x"].data.to_bytes() == b"\0\0\x80?"  # type: ignore[union-attr]


@pytest.mark.parametrize("weight_map", [
    {"x": "m-1.safetensors", "z": "m-2.safetensors"},          # no z; y not listed
    {"x": "m-1.safetensors", "y": "m-1.safetensors"},          # wrong shard
    {"x": "../m-1.safetensors", "y": "m-2.safetensors"},       # outside the directory
    {"x": "/etc/passwd", "y": "m-2.safetensors"},
    {"x": 3, "y": "m-2.safetensors"},
])
def test_index_disagreeing_with_its_shards_is_refused(tmp_path, weight_map):
    idx = _shards(tmp_path)
    idx.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(InvalidIndexError):
        read_safetensors(idx)


def test_index_with_duplicate_keys_or_no_weight_map_is_refused(tmp_path):
    idx = _shards(tmp_path)
    idx.write_text('{"weight_map": {"x": "m-1.safetensors", "x": "m-1.safetensors"}}')
    with pytest.raises(DuplicateKeyError):
        read_safetensors(idx)
    idx.write_text('{"metadata": {}}')
    with pytest.raises(InvalidIndexError):
        read_safetensors(idx)


@settings(max_examples=150, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(
        ["m-1.safetensors", "m-2.safetensors", "x", "../m-1.safetensors", "", "/", "."]),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["x", "y", "weight_map", "metadata"]), kids, max_size=3),
    max_leaves=12), st.binary(max_size=16))
def test_random_indexes_raise_only_format_errors(tmp_path_factory, value, junk):
    d = tmp_path_factory.mktemp("idx")
    idx = _shards(d)
    for text in (json.dumps(value).encode(), json.dumps({"weight_map": value}).encode(),
                 json.dumps({"weight_map": value}).encode() + junk):
        idx.write_bytes(text)
        with contextlib.suppress(SafetensorsFormatError):
            read_safetensors(idx)


def test_index_naming_a_missing_shard_or_a_directory_is_refused(tmp_path):
    idx = _shards(tmp_path)
    (tmp_path / "sub").mkdir()
    for name in ("missing.safetensors", "sub"):
        idx.write_text(json.dumps({"weight_map": {"x": name}}))
        with pytest.raises(InvalidIndexError, match="shard"):
            read_safetensors(idx)


@pytest.mark.parametrize("depth", [127, 128, 100_000])
def test_nesting_is_refused_before_parsing_past_the_safetensors_packages_limit(tmp_path, depth):
    """A header nesting more than 127 levels (where the safetensors package stops with
    "recursion limit exceeded") is an InvalidHeaderError at the bracket that opens level 128,
    found before the JSON parser, which recurses once per level, runs; 127 levels are parsed
    (and this header then refused for its unknown field, as it would be at any depth)."""
    junk = "[" * (depth - 2) + "]" * (depth - 2)
    header = ('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"junk":' + junk
              + "}}").encode()
    blob = raw_file(header, b"\0" * 4)
    path = write(tmp_path, blob)
    with pytest.raises(InvalidHeaderError) as info:
        read_safetensors(path)
    if depth <= 127:
        assert info.value.field == "x"
        assert "unknown field(s) ['junk']" in str(info.value)
    else:
        assert info.value.field == "header"
        assert info.value.offset == 8 + header.index(b'"junk":') + 7 + 125
        assert str(info.value) == (
            f"{path}: header at offset {info.value.offset}: JSON nested more than 127 deep")
    if depth <= 128:
        from safetensors import SafetensorError, safe_open

        if depth <= 127:
            with safe_open(path, "np") as f:
                assert list(f.keys()) == ["x"]
        else:
            with pytest.raises(SafetensorError, match="recursion limit exceeded"):
                safe_open(path, "np")


def test_an_index_nested_too_deeply_is_a_format_error_naming_it(tmp_path):
    idx = _shards(tmp_path)
    idx.write_text('{"metadata": {"x": ' + "[" * 200 + "]" * 200 + '}, "weight_map": {}}')
    with pytest.raises(SafetensorsFormatError) as info:
        read_safetensors(idx)
    assert info.value.field == "index"
    assert info.value.offset == len('{"metadata": {"x": ') + 125
    assert str(idx) in str(info.value)
