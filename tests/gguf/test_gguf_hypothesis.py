"""Random models written by gguf-py 0.19 and by filecord: byte-identical, and read back by
filecord's strict reader to the same key-values and tensors (Hypothesis, seeded examples)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGUFValueType as T  # noqa: E402

import filecord.gguf as fg  # noqa: E402

INT_RANGES = {T.UINT8: (0, 2**8 - 1), T.INT8: (-(2**7), 2**7 - 1), T.UINT16: (0, 2**16 - 1),
              T.INT16: (-(2**15), 2**15 - 1), T.UINT32: (0, 2**32 - 1),
              T.INT32: (-(2**31), 2**31 - 1), T.UINT64: (0, 2**64 - 1),
              T.INT64: (-(2**63), 2**63 - 1)}
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=12).filter(lambda s: len(s.encode()) < 64)
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
# the split keys are filecord's to write (a deliberate difference, tested below)
keys = names.filter(lambda s: s not in SPLIT_KEYS) | st.sampled_from(["general.name", "split"])


def scalar(t: Any) -> st.SearchStrategy[Any]:
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.integers(lo, hi)
    if t is T.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if t is T.FLOAT64:
        return st.floats(allow_nan=False)
    if t is T.BOOL:
        return st.booleans()
    return st.text(max_size=20)


SCALARS = [*INT_RANGES, T.FLOAT32, T.FLOAT64, T.BOOL, T.STRING]


@st.composite
def key_value(draw: st.DrawFn) -> tuple[str, Any, Any, Any]:
    key = draw(keys)
    if draw(st.booleans()):
        t = draw(st.sampled_from(SCALARS))
        return key, draw(scalar(t)), t, None
    sub = draw(st.sampled_from(SCALARS))
    return key, draw(st.lists(scalar(sub), min_size=1, max_size=6)), T.ARRAY, sub


DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64"]


@st.composite
def tensor(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * np.dtype(dtype)
                                               .itemsize, dtype=np.uint8)
    return draw(names), raw.view(dtype).reshape(shape)


def _unique(items: list[tuple[str, Any]]) -> list[Any]:
    seen: set[str] = set()
    return [x for x in items if not (x[0] in seen or seen.add(x[0]))]  # type: ignore[func-returns-value]


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(kvs=st.lists(key_value(), max_size=6), tensors=st.lists(tensor(), max_size=5),
       align=st.sampled_from([None, 1, 8, 64, 4096]),
       split=st.sampled_from([{}, {"split_max_tensors": 1}, {"split_max_size": 40}]))
def test_random_models_byte_identical(kvs: list[Any], tensors: list[Any], align: int | None,
                                      split: dict[str, int]) -> None:
    kvs = _unique(kvs)
    tensors = _unique(tensors)
    if align is not None and split:
        split = {}  # gguf-py's later shards lack the alignment key (tested separately)

    def script(w: Any) -> None:
        if align is not None:
            w.add_custom_alignment(align)
        for key, value, t, sub in kvs:
            w.add_key_value(key, value, t, sub_type=sub)
        for name, a in tensors:
            w.add_tensor(name, a)

    with tempfile.TemporaryDirectory() as d:
        ref, ours = os.path.join(d, "ref"), os.path.join(d, "ours")
        os.mkdir(ref)
        os.mkdir(ours)
        w = gguf.GGUFWriter(os.path.join(ref, "m.gguf"), "arch", **split)
        script(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        f = fg.GGUFWriter(os.path.join(ours, "m.gguf"), "arch", **split)
        script(f)
        f.close()
        files = sorted(os.listdir(ref))
        assert sorted(os.listdir(ours)) == files
        for name in files:
            with open(os.path.join(ref, name), "rb") as a, open(os.path.join(ours, name),
                                                                 "rb") as b:
                assert a.read() == b.read(), name
        model = fg.read_gguf(os.path.join(ours, files[0]))
        assert list(model.tensors) == [n for n, _ in tensors]
        for name, a in tensors:
            t = model.tensors[name]
            assert t.shape == a.shape
            assert t.data.to_bytes() == a.tobytes()  # type: ignore[union-attr]
        for key, value, _t, _sub in kvs:
            got = model.kvs[key].value
            assert (got if isinstance(got, (int, float, str)) else list(got)) == value


@pytest.mark.parametrize("key", SPLIT_KEYS)
def test_split_keys_a_caller_gives_are_dropped_where_gguf_py_keeps_them(tmp_path: Any,
                                                                        key: str) -> None:
    # Found by this file's Hypothesis run in CI (a random key named "split.no"): filecord writes
    # the split keys itself, into the shards of a split set only; a single file that carried
    # one would send llama.cpp looking for shards that do not exist.
    for make, where in ((gguf.GGUFWriter, tmp_path / "ref.gguf"),
                        (fg.GGUFWriter, tmp_path / "ours.gguf")):
        w = make(str(where), "arch")
        w.add_key_value(key, 1, T.UINT16)
        w.add_tensor("t", np.arange(4, dtype=np.float32))
        if make is gguf.GGUFWriter:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        w.close()
    assert key in gguf.GGUFReader(str(tmp_path / "ref.gguf")).fields
    ours = fg.read_gguf(str(tmp_path / "ours.gguf"))
    assert key not in ours.kvs
    assert np.array_equal(np.frombuffer(ours.tensors["t"].data.to_bytes(), np.float32),
                          np.arange(4, dtype=np.float32))

