"""filecord.gguf's writer against gguf-py 0.19's ``GGUFWriter``: the same calls, the same bytes.

Each case is one script of writer calls run on both writers (the method names are the same);
the files must be byte-identical, and each file filecord writes must read back with gguf-py's
reader to the same key-values and tensors, and with filecord's strict reader.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as T  # noqa: E402

import filecord.gguf as fg  # noqa: E402
from filecord._pieces.data import FileBackedData  # noqa: E402
from filecord.gguf._read import read_gguf_file  # noqa: E402
from filecord.gguf._types import BLOCKS  # noqa: E402
from filecord.gguf.errors import GGUFFormatError  # noqa: E402

Script = Callable[[Any], None]
rng = np.random.default_rng(7)


def _files(d: Path) -> dict[str, bytes]:
    return {os.path.basename(p): Path(p).read_bytes() for p in sorted(glob.glob(str(d / "*")))
            if not os.path.basename(p).startswith(".")}


def run_both(tmp_path: Path, script: Script, **kw: Any) -> tuple[dict[str, bytes], Path]:
    """Run ``script`` on gguf-py and on filecord; assert the files are byte-identical."""
    ref, ours = tmp_path / "ref", tmp_path / "ours"
    ref.mkdir()
    ours.mkdir()
    w = gguf.GGUFWriter(str(ref / "m.gguf"), "llama", **kw)
    script(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = fg.GGUFWriter(ours / "m.gguf", "llama", **kw)
    script(f)
    f.write_header_to_file()
    f.write_kv_data_to_file()
    f.write_tensors_to_file()
    report = f.close()
    assert not report.dry_run
    a, b = _files(ref), _files(ours)
    assert list(a) == list(b)
    for name in a:
        assert a[name] == b[name], name
    assert not [n for n in os.listdir(ours) if n.startswith(".")]  # no scratch left behind
    return b, ours


def _py(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def check_readback(d: Path) -> int:
    """Every file reads back with gguf-py's reader and with ours to the same contents."""
    n = 0
    for p in sorted(glob.glob(str(d / "*.gguf"))):
        r = gguf.GGUFReader(p)
        mine = read_gguf_file(p)
        theirs = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
        assert list(theirs) == list(mine.kvs)
        for k, fld in theirs.items():
            kv = mine.kvs[k]
            got = fld.contents()
            want = kv.value if isinstance(kv.value, (int, float, str)) else list(kv.value)
            if isinstance(want, float) or (isinstance(want, list) and want
                                           and isinstance(want[0], float)):
                np.testing.assert_array_equal(np.asarray(got, dtype=np.float64),
                                              np.asarray(want, dtype=np.float64))
            else:
                assert got == want, k
        assert [t.name for t in r.tensors] == list(mine.tensors)
        for rt in r.tensors:
            t = mine.tensors[rt.name]
            assert int(rt.tensor_type) == int(t.type)
            assert [int(x) for x in rt.shape] == list(t.dims)
            assert bytes(np.ascontiguousarray(rt.data).view(np.uint8).reshape(-1)) == \
                t.data.to_bytes()  # type: ignore[union-attr]
            n += 1
    return n


def _kv_all_types(w: Any) -> None:
    w.add_uint8("u8", 255)
    w.add_int8("i8", -128)
    w.add_uint16("u16", 65535)
    w.add_int16("i16", -32768)
    w.add_uint32("u32", 2**32 - 1)
    w.add_int32("i32", -(2**31))
    w.add_float32("f32", 1.5)
    w.add_uint64("u64", 2**64 - 1)
    w.add_int64("i64", -(2**63))
    w.add_float64("f64", -0.1)
    w.add_bool("bt", True)
    w.add_bool("bf", False)
    w.add_string("s", "héllo wörld ✓")
    w.add_string("empty", "")  # skipped by both
    w.add_array("empty_arr", [])  # skipped by both
    w.add_array("ai", [1, -2, 3])
    w.add_array("af", [0.5, 2.25])
    w.add_array("ab", [True, False, True])
    w.add_array("as", ["a", "", "ü" * 70])
    w.add_array("abytes", b"\x00\x01\xff")
    w.add_array("tuple", (7, 8))
    w.add_key_value("kv_f64", 3, T.FLOAT64)
    w.add_key_value("kv_u8arr", [1, 2, 3], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("kv_i64arr", [-1, 2**40], T.ARRAY, sub_type=T.INT64)
    w.add_key_value("kv_f64arr", [1.0, -2.5], T.ARRAY, sub_type=T.FLOAT64)
    w.add_key_value("kv_strarr", ["x", "yz"], T.ARRAY, sub_type=T.STRING)
    w.add_key_value("kv_emptystr", "", T.STRING)  # add_key_value keeps empty strings
    w.add_uint32("u32", 7)  # replaced in place
    w.add_string("general.architecture", "other")  # replaces the constructor's value in place
    w.add_string("ключ.名前", "unicode key")


KV_CASES: dict[str, Script] = {
    "no_kvs": lambda w: None,
    "all_value_types": _kv_all_types,
    "alignment_64": lambda w: (w.add_custom_alignment(64), w.add_uint8("after", 1)),
    "alignment_4096": lambda w: w.add_custom_alignment(4096),
    "long_vocab": lambda w: w.add_array("tokenizer.ggml.tokens",
                                        [f"tok{i}" for i in range(3000)]),
}


@pytest.mark.parametrize("case", list(KV_CASES))
def test_key_values_byte_identical(tmp_path: Path, case: str) -> None:
    _, d = run_both(tmp_path, KV_CASES[case])
    check_readback(d)


NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64"]
SHAPES = [(), (0,), (1,), (3,), (2, 3), (0, 4), (2, 1, 3), (1, 1, 1, 5), (7, 5)]


def _arr(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) * 100).astype(dtype)


def test_every_numpy_dtype_and_shape(tmp_path: Path) -> None:
    arrays = {f"t.{d}.{i}": _arr(d, s) for d in NUMPY_DTYPES for i, s in enumerate(SHAPES)}

    def script(w: Any) -> None:
        w.add_uint32("n", len(arrays))
        for name, a in arrays.items():
            w.add_tensor(name, a)

    _, d = run_both(tmp_path, script)
    n = check_readback(d)
    print(f"{n} tensors ({len(NUMPY_DTYPES)} dtypes x {len(SHAPES)} shapes) byte-identical")
    assert n == len(NUMPY_DTYPES) * len(SHAPES) == 63


# every type gguf-py 0.19 can write as raw bytes
RAW_TYPES = [q for q in Q if q.name in fg.GGMLType.__members__]


def test_every_raw_tensor_type(tmp_path: Path) -> None:
    tensors: list[tuple[str, np.ndarray, Any]] = []
    for q in RAW_TYPES:
        blck, size = gguf.GGML_QUANT_SIZES[q]
        for rows in (0, 1, 3):
            raw = rng.integers(0, 256, (rows, 2 * size), dtype=np.uint8)
            tensors.append((f"{q.name}.{rows}", raw, q))
        assert BLOCKS[fg.GGMLType(int(q))] == (blck, size)

    def script(w: Any) -> None:
        for name, raw, q in tensors:
            w.add_tensor(name, raw, raw_dtype=q)

    _, d = run_both(tmp_path, script)
    n = check_readback(d)
    print(f"{len(RAW_TYPES)} raw ggml types x 3 row counts: {n} tensors byte-identical")
    assert len(RAW_TYPES) == 34
    assert n == 102


def test_bf16_from_uint16_and_noncontiguous(tmp_path: Path) -> None:
    bf = rng.integers(0, 2**16, (3, 4), dtype=np.uint16)
    nc = _arr("float32", (4, 6)).T
    flat = _arr("float32", (6,))

    def script(w: Any) -> None:
        w.add_tensor("bf16", bf, raw_dtype=Q.BF16)
        w.add_tensor("transposed", nc)
        w.add_tensor("reshaped", flat, raw_shape=(2, 3))

    _, d = run_both(tmp_path, script)
    assert check_readback(d) == 3


def test_unicode_names_custom_alignment_with_tensors(tmp_path: Path) -> None:
    a, b = _arr("float32", (3, 5)), _arr("float16", (7,))

    def script(w: Any) -> None:
        w.add_custom_alignment(256)
        w.add_tensor("ünïcödé.веса", a)
        w.add_tensor("名前", b)

    _, d = run_both(tmp_path, script)
    assert check_readback(d) == 2
    assert read_gguf_file(d / "m.gguf").alignment == 256


def test_streaming_calls_byte_identical(tmp_path: Path) -> None:
    arrays = [_arr("float32", (4, 8)), _arr("float16", (3,)), _arr("int32", (0,))]
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    for cls, p in ((gguf.GGUFWriter, ref), (fg.GGUFWriter, ours)):
        w = cls(str(p), "llama")
        w.add_uint32("k", 1)
        for i, a in enumerate(arrays):
            w.add_tensor_info(f"t{i}", a.shape, a.dtype, a.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for a in arrays:
            w.write_tensor_data(a)
        w.close()
    assert ref.read_bytes() == ours.read_bytes()


def test_callables_and_file_ranges_and_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    a = _arr("float32", (64, 16))
    b = _arr("float16", (33,))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"xx" + a.tobytes() + b"yy")
    calls: list[str] = []

    def produce(name: str, arr: np.ndarray) -> Callable[[], np.ndarray]:
        def f() -> np.ndarray:
            calls.append(name)
            return arr.copy()
        return f

    ref = tmp_path / "ref.gguf"
    w = gguf.GGUFWriter(str(ref), "llama")
    w.add_tensor("a", a)
    w.add_tensor("b", b)
    w.add_tensor("c", a)
    w.add_tensor("d", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "out" / "ours.gguf"
    out.parent.mkdir()
    f = fg.GGUFWriter(out, "llama")
    f.add_tensor("a", FileBackedData(blob, offset=2, length=a.nbytes), raw_shape=a.shape,
                 raw_dtype=Q.F32)
    f.add_tensor("b", produce("b", b))
    f.add_tensor("c", lambda: torch.from_numpy(a.copy()))
    f.add_tensor("d", produce("d", b))
    assert calls == []
    f.close()
    assert calls == ["b", "d"]
    assert ref.read_bytes() == out.read_bytes()
    assert os.listdir(out.parent) == ["ours.gguf"]  # the scratch file was moved, not left
    assert blob.stat().st_size == a.nbytes + 4  # the caller's file is untouched


def test_torch_bf16_byte_identical_to_raw(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 8).to(torch.bfloat16)
    raw = t.view(torch.int16).numpy().view(np.uint16)

    def script_ref(w: Any) -> None:
        w.add_tensor("w", raw, raw_dtype=Q.BF16)

    ref = tmp_path / "r.gguf"
    w = gguf.GGUFWriter(str(ref), "llama")
    script_ref(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = fg.GGUFWriter(tmp_path / "o.gguf", "llama")
    f.add_tensor("w", t)
    f.close()
    assert ref.read_bytes() == (tmp_path / "o.gguf").read_bytes()


SPLITS: dict[str, dict[str, Any]] = {
    "by_count_2": {"split_max_tensors": 2},
    "by_count_1": {"split_max_tensors": 1},
    "by_size": {"split_max_size": 100},
    "by_size_tiny": {"split_max_size": 1},
    "both": {"split_max_tensors": 3, "split_max_size": 300},
    "small_first": {"split_max_tensors": 2, "small_first_shard": True},
    "no_split_needed": {"split_max_tensors": 100},
}


@pytest.mark.parametrize("case", list(SPLITS))
def test_splits_byte_identical(tmp_path: Path, case: str) -> None:
    arrays = [_arr("float32", (i + 1, 7)) for i in range(7)]

    def script(w: Any) -> None:
        w.add_string("general.name", "tiny")
        w.add_array("tokenizer.ggml.tokens", ["a", "b"])
        for i, a in enumerate(arrays):
            w.add_tensor(f"blk.{i}.w", a)

    files, d = run_both(tmp_path, script, **SPLITS[case])
    assert check_readback(d) == 7
    first = sorted(files)[0]
    model = fg.read_gguf(d / first)
    assert list(model.tensors) == [f"blk.{i}.w" for i in range(7)]
    assert len(model.shards) == len(files)


def test_split_with_custom_alignment_is_readable(tmp_path: Path) -> None:
    """gguf-py pads later shards to the custom alignment without the key (they read wrong);
    filecord writes the key into every shard, and the first shard is byte-identical."""
    arrays = [_arr("float32", (3,)) for _ in range(3)]
    ref = tmp_path / "ref"
    ref.mkdir()
    w = gguf.GGUFWriter(str(ref / "m.gguf"), "llama", split_max_tensors=1)
    w.add_custom_alignment(64)
    f = fg.GGUFWriter(tmp_path / "m.gguf", "llama", split_max_tensors=1)
    f.add_custom_alignment(64)
    for i, a in enumerate(arrays):
        w.add_tensor(f"t{i}", a)
        f.add_tensor(f"t{i}", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f.close()
    name = "m-00001-of-00003.gguf"
    assert (ref / name).read_bytes() == (tmp_path / name).read_bytes()
    model = fg.read_gguf(tmp_path / name)
    for i, a in enumerate(arrays):
        assert model.tensors[f"t{i}"].data.to_bytes() == a.tobytes()  # type: ignore[union-attr]
    with pytest.raises(GGUFFormatError):  # gguf-py's second shard: padding without a key
        read_gguf_file(ref / "m-00002-of-00003.gguf")


REFUSED: dict[str, Script] = {
    "empty_key": lambda w: w.add_uint8("", 1),
    "nested_array": lambda w: w.add_array("n", [[1], [2]]),
    "five_dims": lambda w: w.add_tensor("t", np.zeros((1, 1, 1, 1, 2), np.float32)),
    "long_name": lambda w: w.add_tensor("x" * 64, np.zeros(2, np.float32)),
    "mixed_array": lambda w: w.add_array("m", [1, 2.0]),
    "u8_out_of_range": lambda w: w.add_uint8("u", 256),
    "uint8_tensor": lambda w: w.add_tensor("t", np.zeros(2, np.uint8)),
    "big_endian": lambda w: w.add_tensor("t", np.zeros(2, ">f4")),
    "dup_tensor": lambda w: (w.add_tensor("t", np.zeros(2, np.float32)),
                             w.add_tensor("t", np.zeros(2, np.float32))),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_write_nothing(tmp_path: Path, case: str) -> None:
    def attempt() -> None:
        f = fg.GGUFWriter(tmp_path / "m.gguf", "llama")
        REFUSED[case](f)
        f.close()

    with pytest.raises((ValueError, TypeError)):
        attempt()
    assert os.listdir(tmp_path) == []


def test_differential_case_counts() -> None:
    counts = {"kv": len(KV_CASES), "splits": len(SPLITS), "refused": len(REFUSED),
              "raw_types": len(RAW_TYPES), "numpy_dtypes": len(NUMPY_DTYPES)}
    print(counts)
    assert counts == {"kv": 5, "splits": 7, "refused": 9, "raw_types": 34, "numpy_dtypes": 7}


def test_sha_of_a_model_matches(tmp_path: Path) -> None:
    """A tiny Llama-shaped model (tokenizer arrays, hparams, F32/F16/Q8_0 tensors)."""
    emb, norm = _arr("float16", (32, 16)), _arr("float32", (16,))
    q8 = rng.integers(0, 256, (16, 34), dtype=np.uint8)

    def script(w: Any) -> None:
        w.add_string("general.name", "tiny")
        w.add_uint32("llama.context_length", 64)
        w.add_uint32("llama.block_count", 1)
        w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", [f"<{i}>" for i in range(32)])
        w.add_array("tokenizer.ggml.scores", [float(-i) for i in range(32)])
        w.add_array("tokenizer.ggml.token_type", [1] * 32)
        w.add_tensor("token_embd.weight", emb)
        w.add_tensor("blk.0.attn_norm.weight", norm)
        w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=Q.Q8_0)

    files, _ = run_both(tmp_path, script)
    print({k: hashlib.sha256(v).hexdigest()[:16] for k, v in files.items()})


def test_callables_stream_with_one_tensor_in_memory(tmp_path: Path) -> None:
    """20 tensors of 4 MiB produced by callables: traced peak stays near one tensor (gguf-py
    keeps every tensor until the write); the file equals gguf-py's."""
    import tracemalloc

    n, size = 20, 1 << 20  # float32 elements: 4 MiB each

    def make(i: int) -> Callable[[], np.ndarray]:
        return lambda: np.full(size, i, dtype=np.float32)

    f = fg.GGUFWriter(tmp_path / "ours.gguf", "llama")
    for i in range(n):
        f.add_tensor(f"t{i}", make(i))
    tracemalloc.start()
    f.close()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{n} x 4 MiB tensors produced and saved; traced peak {peak / 2**20:.1f} MiB")
    assert peak < 3 * 4 * size
    w = gguf.GGUFWriter(str(tmp_path / "ref.gguf"), "llama")
    for i in range(n):
        w.add_tensor(f"t{i}", make(i)())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()


def test_failing_producer_leaves_nothing(tmp_path: Path) -> None:
    old = tmp_path / "m.gguf"
    old.write_bytes(b"previous model")
    f = fg.GGUFWriter(old, "llama")
    f.add_tensor("a", lambda: np.ones(4, np.float32))

    def boom() -> np.ndarray:
        raise MemoryError("out of memory while producing b")

    f.add_tensor("b", boom)
    with pytest.raises(MemoryError):
        f.close()
    assert os.listdir(tmp_path) == ["m.gguf"]  # no scratch, no temp, no partial file
    assert old.read_bytes() == b"previous model"
    with pytest.raises(ValueError, match="start a new one"):
        f.close()


def test_consume_moves_owned_file_ranges(tmp_path: Path) -> None:
    a = _arr("float32", (256, 16))
    blob = tmp_path / "weights.bin"
    blob.write_bytes(a.tobytes())
    f = fg.GGUFWriter(tmp_path / "m.gguf", "llama", consume=True)
    f.add_tensor("a", FileBackedData(blob, owned=True), raw_shape=a.shape, raw_dtype=Q.F32)
    report = f.close()
    assert [x.action for x in report.actions if x.length and x.action != "written"] == ["moved"]
    assert not blob.exists()
    t = fg.read_gguf(tmp_path / "m.gguf").tensors["a"]
    assert t.data.to_bytes() == a.tobytes()  # type: ignore[union-attr]


def test_gguf_py_named_helpers_run_against_our_writer(tmp_path: Path) -> None:
    """A conversion script's named calls (``add_context_length``...) port unchanged."""
    def script(w: Any) -> None:
        w.add_name("tiny")
        w.add_context_length(2048)
        w.add_block_count(2)
        w.add_embedding_length(64)
        w.add_head_count(4)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_file_type(1)
        w.add_tokenizer_model("llama")
        w.add_token_list(["<s>", "</s>", "a"])
        w.add_token_scores([0.0, -1.0, -2.0])
        w.add_token_types([3, 3, 1])
        w.add_bos_token_id(0)
        w.add_quantization_version(2)

    _, d = run_both(tmp_path, script)
    f = read_gguf_file(d / "m.gguf")
    assert f.kvs["llama.context_length"].value == 2048
    assert len(f.kvs) == 14
    with pytest.raises(AttributeError):
        fg.GGUFWriter(tmp_path / "x.gguf", "llama").add_no_such_thing  # noqa: B018


def test_without_consume_callers_owned_files_stay(tmp_path: Path) -> None:
    """Produced tensors are moved out of their scratch file, but a caller's owned file is only
    read when ``consume`` is not given."""
    a = _arr("float32", (8, 8))
    blob = tmp_path / "w.bin"
    blob.write_bytes(a.tobytes())
    d = FileBackedData(blob, owned=True)
    f = fg.GGUFWriter(tmp_path / "m.gguf", "llama")
    f.add_tensor("a", d, raw_shape=a.shape, raw_dtype=Q.F32)
    f.add_tensor("b", lambda: a * 2)
    report = f.close()
    by_source = {os.path.basename(x.source): x.action for x in report.file_actions()}
    assert by_source["w.bin"] == "copied"
    assert [v for k, v in by_source.items() if k.endswith(".gguf-tensors")] == ["moved"]
    assert blob.read_bytes() == a.tobytes()
    d.detach_cleanup()
    m = fg.read_gguf(tmp_path / "m.gguf")
    assert m.tensors["b"].data.to_bytes() == (a * 2).tobytes()  # type: ignore[union-attr]
    assert sorted(os.listdir(tmp_path)) == ["m.gguf", "w.bin"]


@pytest.mark.parametrize("owned", [True, False])
def test_without_consume_a_file_rewritten_after_capture_is_a_data_change(
        tmp_path: Path, owned: bool) -> None:
    """An owned (or borrowed) range next to a callable: the writer saves consuming its scratch
    and only reads the caller's file, and still checks it against what was captured."""
    from filecord.errors import DataChangedError

    a = _arr("float32", (8, 8))
    blob = tmp_path / "w.bin"
    blob.write_bytes(a.tobytes())
    d = FileBackedData(blob, owned=owned)
    f = fg.GGUFWriter(tmp_path / "m.gguf", "llama")
    f.add_tensor("a", d, raw_shape=a.shape, raw_dtype=Q.F32)
    f.add_tensor("b", lambda: a * 2)
    new = (a + 1).tobytes()  # same size, other bytes, as another process would rewrite it
    blob.write_bytes(new)
    os.utime(blob, ns=(1, 1))
    with pytest.raises(DataChangedError):
        f.close()
    d.detach_cleanup()
    assert blob.read_bytes() == new
    assert sorted(os.listdir(tmp_path)) == ["w.bin"]  # no output, no scratch left


def test_without_consume_no_copy_warning_for_the_callers_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = _arr("float32", (8, 8))
    blob = tmp_path / "w.bin"
    blob.write_bytes(a.tobytes())
    f = fg.GGUFWriter(tmp_path / "m.gguf", "llama")
    f.add_tensor("a", FileBackedData(blob), raw_shape=a.shape, raw_dtype=Q.F32)
    f.add_tensor("b", lambda: a * 2)
    with caplog.at_level("INFO", logger="filecord"):
        report = f.close()
    assert [x.reason for x in report.file_actions() if x.action == "copied"] == ["not owned"]
    assert not [r for r in caplog.records if "consume=True copied" in r.getMessage()]
    with caplog.at_level("INFO", logger="filecord"):  # an asked-for consume still warns
        g = fg.GGUFWriter(tmp_path / "n.gguf", "llama", consume=True)
        g.add_tensor("a", FileBackedData(blob), raw_shape=a.shape, raw_dtype=Q.F32)
        g.close()
    assert [r for r in caplog.records if "consume=True copied 1" in r.getMessage()]
