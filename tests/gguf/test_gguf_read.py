"""The GGUF reader: exact bytes at exact offsets, one error per rule, and hostile input.

Files are built here with ``struct`` from the byte map (not with filecord's encoder), so the
reader is checked against the format, not against itself.  The hostile suite cuts a file at
every length, flips every byte, mutates at random, and forges huge counts and lengths, nested
arrays, bad alignments and bad offsets: every call must return or raise a ``GGUFFormatError``
subclass, within a time and memory bound.  The suites print and assert their own sizes.
"""

from __future__ import annotations

import array
import random
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import filecord.gguf as fg
from filecord._pieces.data import FileBackedData
from filecord.gguf import errors as E
from filecord.gguf._encode import encode_header, encode_kv
from filecord.gguf._parse import parse_header
from filecord.gguf._read import read_gguf_file
from filecord.gguf._types import BLOCKS, tensor_nbytes


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def ti(name: str, dims: list[int], gtype: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<II", gtype, 0)[:4] + struct.pack("<Q", offset))


def gguf_bytes(kvs: list[bytes], infos: list[bytes], data: bytes, *, n_tensors: int | None = None,
               n_kv: int | None = None, version: int = 3, align: int = 32) -> bytes:
    head = (b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                  len(kvs) if n_kv is None else n_kv)
            + b"".join(kvs) + b"".join(infos))
    return head + bytes(-len(head) % align) + data


def sample() -> bytes:
    """Every value type, a string array, three tensors (F32, F16, Q8_0) with padding."""
    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("u8", 0, b"\x07"), kv("i8", 1, b"\xff"), kv("u16", 2, struct.pack("<H", 513)),
        kv("i16", 3, struct.pack("<h", -2)), kv("u32", 4, struct.pack("<I", 70000)),
        kv("i32", 5, struct.pack("<i", -70000)), kv("f32", 6, struct.pack("<f", 0.5)),
        kv("bool", 7, b"\x01"), kv("u64", 10, struct.pack("<Q", 2**40)),
        kv("i64", 11, struct.pack("<q", -(2**40))), kv("f64", 12, struct.pack("<d", 0.25)),
        kv("arr.s", 9, struct.pack("<IQ", 8, 2) + s("ab") + s("ü")),
        kv("arr.i", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)),
    ]
    infos = [ti("a", [3, 2], 0, 0), ti("b", [5], 1, 32), ti("q", [32], 8, 64)]
    data = (bytes(range(24)) + bytes(8) + bytes(range(10)) + bytes(22) + bytes(range(34))
            + bytes(30))
    return gguf_bytes(kvs, infos, data)


def write(tmp_path: Path, raw: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def test_exact_fields_and_offsets(tmp_path: Path) -> None:
    raw = sample()
    f = read_gguf_file(write(tmp_path, raw))
    assert f.header.version == 3
    assert f.file_size == len(raw)
    assert f.alignment == 32
    v = {k: tuple(x.value) if isinstance(x.value, array.array) else x.value
         for k, x in f.kvs.items()}
    assert v == {"general.architecture": "llama", "u8": 7, "i8": -1, "u16": 513, "i16": -2,
                 "u32": 70000, "i32": -70000, "f32": 0.5, "bool": True, "u64": 2**40,
                 "i64": -(2**40), "f64": 0.25, "arr.s": ("ab", "ü"), "arr.i": (1, -2, 3)}
    assert f.kvs["arr.s"].sub_type is fg.ValueType.STRING
    packed = f.kvs["arr.i"].value
    assert isinstance(packed, array.array)
    assert packed.itemsize == 4  # numbers stay packed: memory is the file's bytes
    start = f.data_start
    assert start % 32 == 0
    assert start == len(raw) - 128
    a, b, q = f.tensors.values()
    assert (a.type, a.dims, a.shape, a.nbytes) == (fg.GGMLType.F32, (3, 2), (2, 3), 24)
    assert (b.type, b.dims, b.nbytes) == (fg.GGMLType.F16, (5,), 10)
    assert (q.type, q.dims, q.nbytes) == (fg.GGMLType.Q8_0, (32,), 34)
    for t, off in ((a, 0), (b, 32), (q, 64)):
        assert isinstance(t.data, FileBackedData)
        assert t.data.offset == start + off
        assert t.data.to_bytes() == raw[start + off:start + off + t.nbytes]
    assert a.to_named().shape == (2, 3)
    with pytest.raises(ValueError, match="no dense dtype"):
        q.to_named()


def test_header_over_one_read_and_zero_tensors(tmp_path: Path) -> None:
    big = [s(f"token-{i:07d}") for i in range(120_000)]  # ~2.3 MiB: several growing reads
    raw = gguf_bytes([kv("tok", 9, struct.pack("<IQ", 8, len(big)) + b"".join(big))], [], b"")
    f = read_gguf_file(write(tmp_path, raw))
    assert len(f.kvs["tok"].value) == 120_000  # type: ignore[arg-type]
    assert f.tensors == {}
    assert f.kvs["tok"].encoded == raw[24:].rstrip(b"\0")
    unpadded = raw.rstrip(b"\0")  # a file without tensors may end before the padding
    assert read_gguf_file(write(tmp_path, unpadded, "u.gguf")).data_start == len(raw)


def _err(tmp_path: Path, raw: bytes) -> E.GGUFFormatError:
    with pytest.raises(E.GGUFFormatError) as info:
        read_gguf_file(write(tmp_path, raw, "bad.gguf"))
    return info.value


ARCH = kv("general.architecture", 8, s("llama"))
ONE = [ti("t", [8], 0, 0)]
DATA = bytes(32)

RULES: dict[str, tuple[bytes, type[E.GGUFFormatError], str, int | None]] = {
    "magic": (b"GGUX" + sample()[4:], E.BadMagicError, "magic", 0),
    "version1": (gguf_bytes([ARCH], ONE, DATA, version=1), E.UnsupportedVersionError,
                 "version", 4),
    "version4": (gguf_bytes([ARCH], ONE, DATA, version=4), E.UnsupportedVersionError,
                 "version", 4),
    "big_endian": (gguf_bytes([ARCH], ONE, DATA, version=3 << 24), E.UnsupportedVersionError,
                   "version", 4),
    "kv_count_i64": (gguf_bytes([ARCH], ONE, DATA, n_kv=2**63), E.LimitExceededError,
                     "kv_count", 16),
    "kv_count_huge": (gguf_bytes([ARCH], ONE, DATA, n_kv=2**40), E.TruncatedError,
                      "kv_count", 16),
    "tensor_count_huge": (gguf_bytes([ARCH], ONE, DATA, n_tensors=2**40), E.TruncatedError,
                          "tensor_count", 8),
    "tensor_count_i64": (gguf_bytes([ARCH], ONE, DATA, n_tensors=2**64 - 1),
                         E.LimitExceededError, "tensor_count", 8),
    "empty_key": (gguf_bytes([kv("", 0, b"\x01")], [], b""), E.InvalidKeyError, "kv[0].key", 24),
    "dup_key": (gguf_bytes([kv("a", 0, b"\x01"), kv("a", 0, b"\x02")], [], b""),
                E.InvalidKeyError, "kv[1].key", 24 + 14),
    "key_not_utf8": (gguf_bytes([kv("a\xff", 0, b"\x01").replace(b"a\xc3\xbf", b"a\xff\xfe")
                                 .replace(struct.pack("<Q", 3), struct.pack("<Q", 3), 1)],
                                [], b""), E.InvalidKeyError, "kv[0].key", 33),
    "value_type": (gguf_bytes([kv("a", 13, b"")], [], b""), E.InvalidValueError, "'a' type", 33),
    "bool_2": (gguf_bytes([kv("a", 7, b"\x02")], [], b""), E.InvalidValueError, "'a'", 37),
    "nested_array": (gguf_bytes([kv("a", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 0))],
                                [], b""), E.InvalidValueError, "'a' element type", 37),
    "array_type": (gguf_bytes([kv("a", 9, struct.pack("<IQ", 99, 0))], [], b""),
                   E.InvalidValueError, "'a' element type", 37),
    "array_2_30": (gguf_bytes([kv("a", 9, struct.pack("<IQ", 0, 2**30 + 1))], [], b""),
                   E.LimitExceededError, "'a' count", 41),
    "array_past_end": (gguf_bytes([kv("a", 9, struct.pack("<IQ", 8, 2**20))], [], b""),
                       E.TruncatedError, "'a' count", 41),
    "string_1gib": (gguf_bytes([kv("a", 8, struct.pack("<Q", 2**30 + 1))], [], b""),
                    E.LimitExceededError, "'a'", 37),
    "string_past_end": (gguf_bytes([kv("a", 8, struct.pack("<Q", 2**29))], [], b""),
                        E.TruncatedError, "'a'", 45),
    "align_zero": (gguf_bytes([kv("general.alignment", 4, struct.pack("<I", 0))], [], b""),
                   E.InvalidAlignmentError, "general.alignment", None),
    "align_3": (gguf_bytes([kv("general.alignment", 4, struct.pack("<I", 3))], [], b""),
                E.InvalidAlignmentError, "general.alignment", None),
    "align_u64": (gguf_bytes([kv("general.alignment", 10, struct.pack("<Q", 32))], [], b""),
                  E.InvalidAlignmentError, "general.alignment", None),
    "name_64": (gguf_bytes([], [ti("x" * 64, [8], 0, 0)], DATA), E.InvalidTensorInfoError,
                "tensor '" + "x" * 64 + "'.name", 24),
    "dup_name": (gguf_bytes([], [ti("t", [8], 0, 0), ti("t", [8], 0, 32)], DATA * 2),
                 E.InvalidTensorInfoError, "tensor 't'.name", 24 + 33),
    "five_dims": (gguf_bytes([], [ti("t", [8, 1, 1, 1, 1], 0, 0)], DATA),
                  E.InvalidTensorInfoError, "tensor 't'.n_dims", 33),
    "dim_i64": (gguf_bytes([], [ti("t", [8, 2**63], 0, 0)], DATA), E.InvalidTensorInfoError,
                "tensor 't'.dims", 37),
    "overflow": (gguf_bytes([], [ti("t", [2**32, 2**32], 0, 0)], DATA),
                 E.InvalidTensorInfoError, "tensor 't'.dims", 37),
    "retired_type": (gguf_bytes([], [ti("t", [8], 4, 0)], DATA), E.InvalidTensorInfoError,
                     "tensor 't'.type", 45),
    "unknown_type": (gguf_bytes([], [ti("t", [8], 43, 0)], DATA), E.InvalidTensorInfoError,
                     "tensor 't'.type", 45),
    "partial_block": (gguf_bytes([], [ti("t", [16], 8, 0)], DATA), E.InvalidTensorInfoError,
                      "tensor 't'.dims", 37),
    "gap": (gguf_bytes([], [ti("t", [8], 0, 32)], DATA * 2), E.InvalidOffsetsError,
            "tensor 't'.offset", 24),
    "unaligned": (gguf_bytes([], [ti("t", [8], 0, 0), ti("u", [1], 0, 33)], DATA * 3),
                  E.InvalidOffsetsError, "tensor 'u'.offset", 24 + 33),
    "overlap": (gguf_bytes([], [ti("t", [16], 0, 0), ti("u", [8], 0, 32)], DATA * 3),
                E.InvalidOffsetsError, "tensor 'u'.offset", 24 + 33),
    "shared": (gguf_bytes([], [ti("t", [8], 0, 0), ti("u", [8], 0, 0)], DATA * 2),
               E.InvalidOffsetsError, "tensor 'u'.offset", 24 + 33),
    "unordered": (gguf_bytes([], [ti("t", [8], 0, 32), ti("u", [8], 0, 0)], DATA * 2),
                  E.InvalidOffsetsError, "tensor 't'.offset", 24),
    "data_past_end": (gguf_bytes([], ONE, bytes(31)), E.TruncatedError, "tensor 't'.offset",
                      24),
    "trailing": (gguf_bytes([], ONE, DATA + b"\0"), E.TrailingDataError, "data", 96),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_one_error_per_rule(tmp_path: Path, rule: str) -> None:
    raw, cls, field, offset = RULES[rule]
    err = _err(tmp_path, raw)
    assert type(err) is cls, (rule, err)
    assert err.field == field, (rule, err)
    assert err.offset == offset, (rule, err)
    assert isinstance(err, ValueError)


def test_rule_count() -> None:
    print(f"{len(RULES)} rules, one error class, field and offset each")
    assert len(RULES) == 37


def _attempt(path: Path) -> str:
    """Read; return 'ok' or the error class name.  Anything but a format error fails."""
    try:
        fg.read_gguf(path)
    except E.GGUFFormatError as exc:
        return type(exc).__name__
    return "ok"


def _bounded(tmp_path: Path, variants: list[bytes], label: str) -> dict[str, int]:
    p = tmp_path / "h.gguf"
    outcomes: dict[str, int] = {}
    worst_t, worst_mem = 0.0, 0
    for raw in variants:
        p.write_bytes(raw)
        tracemalloc.start()
        t0 = time.perf_counter()
        got = _attempt(p)
        worst_t = max(worst_t, time.perf_counter() - t0)
        worst_mem = max(worst_mem, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        outcomes[got] = outcomes.get(got, 0) + 1
    print(f"{label}: {len(variants)} files, outcomes {outcomes}, worst {worst_t * 1e3:.1f} ms, "
          f"peak {worst_mem} B traced")
    assert worst_t < 1.0
    assert worst_mem < 64 * len(variants[0]) + (1 << 20)
    return outcomes


def test_every_truncation(tmp_path: Path) -> None:
    raw = sample()
    out = _bounded(tmp_path, [raw[:n] for n in range(len(raw))], "truncations")
    assert sum(out.values()) == len(raw) == 608
    # only the 30 cuts inside the last tensor's padding read (a last padding may be missing)
    assert out == {"TruncatedError": len(raw) - 30, "ok": 30}


def test_every_byte_flipped(tmp_path: Path) -> None:
    raw = sample()
    variants = []
    for i in range(len(raw)):
        for x in (0xFF, 0x01, 0x80):
            b = bytearray(raw)
            b[i] ^= x
            variants.append(bytes(b))
    out = _bounded(tmp_path, variants, "byte flips")
    assert sum(out.values()) == 3 * len(raw)
    assert len(out) >= 8  # many different rules fire
    assert out.get("ok", 0) < len(variants) // 2


def test_random_mutations(tmp_path: Path) -> None:
    rnd = random.Random(16)  # noqa: S311 - reproducible mutations, not secrets
    raw = sample()
    variants = []
    for _ in range(1500):
        b = bytearray(raw)
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(len(b))
            if rnd.random() < 0.3 and i + 8 <= len(b):  # forge a length or count
                b[i:i + 8] = struct.pack("<Q", rnd.choice([2**64 - 1, 2**63, 2**30 + 1, 2**32,
                                                           rnd.randrange(1 << 20)]))
            else:
                b[i] = rnd.randrange(256)
        variants.append(bytes(b[:rnd.randint(len(b) - 64, len(b))]))
    out = _bounded(tmp_path, variants, "random mutations")
    assert sum(out.values()) == 1500


def test_forged_counts_and_lengths(tmp_path: Path) -> None:
    variants = []
    for n in (2**30, 2**30 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1):
        variants.append(gguf_bytes([kv("a", 9, struct.pack("<IQ", 10, n))], [], b""))
        variants.append(gguf_bytes([kv("a", 9, struct.pack("<IQ", 8, n))], [], b""))
        variants.append(gguf_bytes([kv("a", 8, struct.pack("<Q", n))], [], b""))
        variants.append(gguf_bytes([ARCH], ONE, DATA, n_kv=n))
        variants.append(gguf_bytes([ARCH], ONE, DATA, n_tensors=n))
        variants.append(gguf_bytes([], [ti("t", [8, n], 0, 0)], DATA))
        variants.append(gguf_bytes([], [ti("t", [8], 0, n)], DATA))
        variants.append(gguf_bytes([], [s("t") + struct.pack("<I", max(n & 0xFFFFFFFF, 5))], DATA))
    out = _bounded(tmp_path, variants, "forged counts/lengths")
    assert "ok" not in out
    assert sum(out.values()) == 48


def _split_set(tmp_path: Path, count: int = 3, total: int | None = None) -> list[Path]:
    paths = []
    for no in range(count):
        keys = ([ARCH] if no == 0 else []) + [
            kv("split.no", 2, struct.pack("<H", no)),
            kv("split.count", 2, struct.pack("<H", count)),
            kv("split.tensors.count", 5, struct.pack("<i", count if total is None else total))]
        raw = gguf_bytes(keys, [ti(f"t{no}", [8], 0, 0)], DATA)
        paths.append(write(tmp_path, raw, f"m-{no + 1:05d}-of-{count:05d}.gguf"))
    return paths


def test_split_set_from_first_shard(tmp_path: Path) -> None:
    paths = _split_set(tmp_path)
    m = fg.read_gguf(paths[0])
    assert list(m.tensors) == ["t0", "t1", "t2"]
    assert [f.path for f in m.shards] == [str(p) for p in paths]
    assert "split.no" not in m.kvs
    assert list(m.kvs) == ["general.architecture"]
    with pytest.raises(E.InvalidSplitError, match="first shard"):
        fg.read_gguf(paths[1])
    assert read_gguf_file(paths[1]).split() == (1, 3, 3)


def test_split_set_errors(tmp_path: Path) -> None:
    paths = _split_set(tmp_path, total=4)
    with pytest.raises(E.InvalidSplitError, match="4 tensors expected, 3 found"):
        fg.read_gguf(paths[0])
    for p in paths:
        p.unlink()
    paths = _split_set(tmp_path)
    paths[2].unlink()
    with pytest.raises(E.InvalidSplitError, match="shard 3 of 3 is missing"):
        fg.read_gguf(paths[0])
    _split_set(tmp_path)
    paths[1].write_bytes(paths[2].read_bytes())  # shard 2 holds shard 3's content
    with pytest.raises(E.InvalidSplitError, match="expected \\(1, 3, 3\\)"):
        fg.read_gguf(paths[0])
    renamed = tmp_path / "model.gguf"
    renamed.write_bytes(paths[0].read_bytes())
    with pytest.raises(E.InvalidSplitError, match="first shard"):
        fg.read_gguf(renamed)


def test_owned_read_failure_keeps_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, sample()[:-40])
    with pytest.raises(E.TruncatedError):
        fg.read_gguf(p, owned=True)
    import gc

    gc.collect()
    assert p.exists()


def test_a_huge_numeric_array_costs_its_bytes_not_python_objects(tmp_path: Path) -> None:
    n = 8 << 20  # 8 Mi float32 values: 32 MiB
    raw = gguf_bytes([kv("scores", 9, struct.pack("<IQ", 6, n) + bytes(4 * n))], [], b"")
    p = write(tmp_path, raw)
    tracemalloc.start()
    f = read_gguf_file(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(f.kvs["scores"].value) == n  # type: ignore[arg-type]
    print(f"{len(raw) >> 20} MiB header read with a traced peak of {peak / len(raw):.2f}x")
    assert peak < 4 * len(raw)  # prefix reads, the record's bytes, the packed array


# --- pure round trip: encoder -> parser, no disk -----------------------------------------


_VT = fg.ValueType


@st.composite
def _kv(draw: st.DrawFn) -> fg.KeyValue:
    key = draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=10))
    kind = draw(st.sampled_from(["u32", "i64", "f64", "bool", "str", "arr_i8", "arr_str"]))
    if kind == "u32":
        return fg.KeyValue(key, _VT.UINT32, draw(st.integers(0, 2**32 - 1)))
    if kind == "i64":
        return fg.KeyValue(key, _VT.INT64, draw(st.integers(-(2**63), 2**63 - 1)))
    if kind == "f64":
        return fg.KeyValue(key, _VT.FLOAT64, draw(st.floats(allow_nan=False)))
    if kind == "bool":
        return fg.KeyValue(key, _VT.BOOL, draw(st.booleans()))
    if kind == "str":
        return fg.KeyValue(key, _VT.STRING, draw(st.text(st.characters(codec="utf-8"))))
    if kind == "arr_i8":
        return fg.KeyValue(key, _VT.ARRAY, tuple(draw(st.lists(st.integers(-128, 127)))),
                           _VT.INT8)
    return fg.KeyValue(key, _VT.ARRAY, tuple(draw(st.lists(st.text(max_size=5)))), _VT.STRING)


_TYPES = [t for t in fg.GGMLType if t.name in ("F32", "F16", "Q8_0", "Q4_K", "I8", "MXFP4")]


@st.composite
def _info(draw: st.DrawFn) -> tuple[str, fg.GGMLType, tuple[int, ...], int]:
    t = draw(st.sampled_from(_TYPES))
    blck = BLOCKS[t][0]
    dims = (blck * draw(st.integers(0, 3)), *draw(st.lists(st.integers(0, 3), max_size=3)))
    name = draw(st.text(st.characters(codec="utf-8"), max_size=8))
    return name, t, dims, tensor_nbytes(t, dims)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(kvs=st.lists(_kv(), max_size=6, unique_by=lambda kv: kv.key),
       infos=st.lists(_info(), max_size=6, unique_by=lambda i: i[0]),
       align=st.sampled_from([None, 1, 16, 4096]))
def test_encoder_parser_round_trip(kvs: list[fg.KeyValue], infos: list[Any],
                                   align: int | None) -> None:
    if align is not None:
        kvs = [*[k for k in kvs if k.key != "general.alignment"],
               fg.KeyValue("general.alignment", _VT.UINT32, align)]
    elif any(k.key == "general.alignment" for k in kvs):
        return
    a = align or 32
    head = encode_header(kvs, infos)
    assert len(head) % a == 0
    data = b"".join(bytes([i % 251]) * n + bytes(-n % a) for i, (_, _, _, n) in enumerate(infos))
    h = parse_header(head + data, len(head) + len(data))
    assert h.alignment == a
    assert h.data_start == len(head)
    assert [(k, v.type, v.value if not isinstance(v.value, array.array) else tuple(v.value),
             v.sub_type) for k, v in h.kvs.items()] == \
        [(k.key, k.type, k.value, k.sub_type) for k in kvs]
    assert [(i.name, i.type, i.dims, i.nbytes) for i in h.infos] == infos
    assert [encode_kv(v) for v in h.kvs.values()] == [encode_kv(k) for k in kvs]
