"""Differential tests against the installed ``safetensors`` and ``huggingface_hub`` packages.

``save_file`` must write the very bytes ``safetensors.torch.save_file`` writes, and
``save_sharded`` the very shards and index ``huggingface_hub.save_torch_state_dict`` writes,
for many state dicts.  One documented exception: ``safetensors`` writes ``__metadata__`` from
a hash map, so with two or more metadata keys its key order changes from run to run; there the
headers are compared as JSON and everything else byte for byte.
"""

from __future__ import annotations

import errno
import json
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed")

from safetensors import safe_open  # noqa: E402

from filecord._io import syscalls as _sys  # noqa: E402
from filecord.safetensors import SafetensorsFile, read_safetensors, save_file, save_sharded  # noqa: E402
from filecord.safetensors.errors import SharedTensorsError  # noqa: E402

ALL_DTYPES = [
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "float8_e5m2", "float8_e4m3fn",
    "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
]


def rand(shape: tuple[int, ...], name: str, gen: torch.Generator) -> Any:
    dtype = getattr(torch, name)
    if dtype.itemsize == 1 or dtype in (torch.bool,):
        raw = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        return raw.view(dtype) if dtype != torch.bool else raw % 2 == 1
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=gen).to(dtype)


def random_state_dict(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    gen = torch.Generator().manual_seed(seed)
    names = ["w", "bias", "layer.0.weight", "é", "日本", "a b", "z\"q", "_", "Z", "x/y", "😀"]
    sd: dict[str, Any] = {}
    for i in range(rng.randint(0, 12)):
        shape = tuple(rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 3)))
        dt = rng.choice(ALL_DTYPES)
        if dt == "float4_e2m1fn_x2" and not shape:
            shape = (2,)
        sd[f"{rng.choice(names)}.{i}"] = rand(shape, dt, gen)
    return sd


def fixed_state_dicts() -> dict[str, dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    every = {f"t.{n}": rand((3, 4), n, gen) for n in ALL_DTYPES}
    every.update({f"s.{n}": rand((), n, gen) for n in ALL_DTYPES if n != "float4_e2m1fn_x2"})
    every.update({f"e.{n}": rand((0, 2), n, gen) for n in ALL_DTYPES})
    return {
        "empty": {},
        "every dtype, scalars, empty": every,
        "unicode and escapes": {k: torch.ones(2) for k in
                                ["é", "€", "😀", "q\"", "b\\s", "c\x01", "n\n", "\x7f", "/"]},
        "disjoint views of one storage": (lambda w: {"a": w[:2], "b": w[2:]})(torch.arange(8.0)),
        "many": {f"layer.{i}.{p}": torch.randn(7, 3, generator=gen)
                 for i in range(40) for p in ("w", "b")},
    }


def header(blob: bytes) -> tuple[int, Any]:
    n = struct.unpack("<Q", blob[:8])[0]
    return n, json.loads(blob[8:8 + n])


def assert_same_file(ours: Path, theirs: Path, *, metadata_keys: int) -> None:
    a, b = ours.read_bytes(), theirs.read_bytes()
    if metadata_keys <= 1:
        assert a == b
        return
    (na, ha), (nb, hb) = header(a), header(b)  # hash-map order of __metadata__ differs by run
    assert na == nb
    assert ha == hb
    assert a[8 + na:] == b[8 + nb:]


def assert_loads_equal(path: Path, sd: dict[str, Any]) -> None:
    with safe_open(os.fspath(path), "pt") as f:
        assert set(f.keys()) == set(sd)
        for k in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            got, want = f.get_tensor(k), sd[k]
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            assert torch.equal(got.contiguous().view(-1).view(torch.uint8),
                               want.contiguous().view(-1).view(torch.uint8))


METADATAS = [None, {}, {"format": "pt"}, {"k": "v", "é": "日本", "format": "np"}]


@pytest.mark.parametrize("name", list(fixed_state_dicts()))
@pytest.mark.parametrize("metadata", METADATAS, ids=["none", "empty", "format", "three"])
def test_save_file_is_byte_identical_to_safetensors(tmp_path, name, metadata):
    sd = fixed_state_dicts()[name]
    if not sd and metadata == {}:
        pytest.skip("safetensors writes an unreadable file here: see the test below")
    st_torch.save_file(sd, os.fspath(tmp_path / "theirs.safetensors"), metadata=metadata)
    report = save_file(sd, tmp_path / "ours.safetensors", metadata=metadata)
    assert report.outputs == (os.fspath(tmp_path / "ours.safetensors"),)
    assert_same_file(tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors",
                     metadata_keys=len(metadata or {}))
    assert_loads_equal(tmp_path / "ours.safetensors", sd)


def test_empty_state_dict_with_empty_metadata_is_valid_unlike_safetensors(tmp_path):
    """safetensors 0.8 writes ``{},"__metadata__":{}}`` here, which it cannot read back; we
    write the valid ``{"__metadata__":{}}`` (a deliberate difference)."""
    st_torch.save_file({}, os.fspath(tmp_path / "t.safetensors"), metadata={})
    with pytest.raises(Exception, match="JSON"):
        st_torch.load_file(os.fspath(tmp_path / "t.safetensors"))
    save_file({}, tmp_path / "o.safetensors", metadata={})
    assert (tmp_path / "o.safetensors").read_bytes() == (
        b"\x18" + bytes(7) + b'{"__metadata__":{}}' + b" " * 5)
    assert st_torch.load_file(os.fspath(tmp_path / "o.safetensors")) == {}


@pytest.mark.parametrize("seed", range(40))
def test_save_file_matches_safetensors_on_random_state_dicts(tmp_path, seed):
    sd = random_state_dict(seed)
    meta = [None, {"format": "pt"}][seed % 2]
    st_torch.save_file(sd, os.fspath(tmp_path / "t.safetensors"), metadata=meta)
    save_file(sd, tmp_path / "o.safetensors", metadata=meta)
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()
    assert_loads_equal(tmp_path / "o.safetensors", sd)
    f = read_safetensors(tmp_path / "o.safetensors")
    assert isinstance(f, SafetensorsFile)
    assert set(f.tensors) == set(sd)


def _refusal(fn: Any) -> type[BaseException] | None:
    try:
        fn()
    except (RuntimeError, ValueError) as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("case", ["tied", "overlap", "row of whole", "same row other dtype",
                                  "non-contiguous"])
def test_refusals_match_safetensors(tmp_path, case):
    w = torch.zeros(4, 4)
    sd = {
        "tied": {"a": w, "b": w},
        "overlap": {"a": w[:3], "b": w[2:]},
        "row of whole": {"a": w, "b": w[0]},
        "same row other dtype": {"a": w[0], "b": w[0].view(torch.int32)},
        "non-contiguous": {"a": w.t()},
    }[case]
    theirs = _refusal(lambda: st_torch.save_file(sd, os.fspath(tmp_path / "t.safetensors")))
    out = tmp_path / "o.safetensors"
    ours = _refusal(lambda: save_file(sd, out))
    assert theirs is not None
    assert ours is not None
    assert issubclass(ours, theirs) or (theirs is RuntimeError and ours is SharedTensorsError)
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == []  # no temp left behind either


def test_mode_is_what_open_gives_and_a_replaced_file_keeps_its_mode(tmp_path):
    sd = {"a": torch.ones(3)}
    old = os.umask(0o022)
    try:
        save_file(sd, tmp_path / "new.safetensors")
        st_torch.save_file(sd, os.fspath(tmp_path / "theirs.safetensors"))
        (tmp_path / "kept.safetensors").write_bytes(b"old")
        os.chmod(tmp_path / "kept.safetensors", 0o640)
        save_file(sd, tmp_path / "kept.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "new.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "theirs.safetensors").stat().st_mode & 0o777 == 0o600  # upstream bug
    assert (tmp_path / "kept.safetensors").stat().st_mode & 0o777 == 0o640


def test_a_failed_save_leaves_the_old_file(tmp_path):
    target = tmp_path / "m.safetensors"
    target.write_bytes(b"old contents")

    class FailFsync(_sys.Backend):
        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "fsync":
                raise OSError(errno.EIO, "injected")

    with _sys.use(FailFsync()), pytest.raises(OSError, match="injected"):
        save_file({"a": torch.ones(1000)}, target)
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


# --- sharding against huggingface_hub ----------------------------------------------------

def _listing(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def assert_same_checkpoint(ours: Path, theirs: Path, *, metadata_keys: int) -> None:
    a, b = _listing(ours), _listing(theirs)
    assert sorted(a) == sorted(b)
    for name in a:
        if name.endswith(".json"):
            assert a[name] == b[name]
        else:
            single = len([n for n in a if n.endswith(".safetensors")]) == 1
            assert_same_file(ours / name, theirs / name,
                             metadata_keys=metadata_keys if single else 1)


def hub_and_ours(tmp_path: Path, sd: dict[str, Any], **kw: Any) -> tuple[Path, Path]:
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    theirs.mkdir(exist_ok=True)
    ours.mkdir(exist_ok=True)
    hub.save_torch_state_dict(dict(sd), theirs, **kw)  # it deletes dropped names from the dict
    save_sharded(sd, ours, **kw)
    return ours, theirs


@pytest.mark.parametrize("seed", range(30))
def test_save_sharded_is_identical_to_huggingface_hub(tmp_path, seed):
    sd = random_state_dict(seed)
    size = random.Random(seed).choice([1, 16, 64, 200, 1000, "5GB"])  # noqa: S311 - test data
    ours, theirs = hub_and_ours(tmp_path, sd, max_shard_size=size)
    assert_same_checkpoint(ours, theirs, metadata_keys=1)


def test_many_shards_pattern_and_user_metadata_like_huggingface_hub(tmp_path):
    gen = torch.Generator().manual_seed(3)
    sd = {f"model.layers.{i}.{p}": torch.randn(50, generator=gen) for i in range(12)
          for p in ("q", "k")}
    for kw in ({"max_shard_size": 1000}, {"max_shard_size": "1KB",
                                          "filename_pattern": "pytorch_model{suffix}.safetensors"},
               {"max_shard_size": 700, "metadata": {"x": "y", "format": "np"}},
               {"max_shard_size": 10**6, "metadata": {"x": "y"}}):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        ours, theirs = hub_and_ours(d, sd, **kw)
        keys = len({"format": "pt", **kw.get("metadata", {})})  # type: ignore[dict-item]
        assert_same_checkpoint(ours, theirs, metadata_keys=keys)
    assert len(os.listdir(tmp_path / "0" / "ours")) == 6  # 5 shards of 5 tensors, the index


@pytest.mark.parametrize("case", ["tied", "three tied", "tied across shards", "partial view",
                                  "discard", "two groups", "non-contiguous"])
def test_shared_tensors_are_dropped_like_huggingface_hub(tmp_path, case):
    w, x = torch.randn(8), torch.randn(3)
    big = torch.randn(30)
    sd, kw = {
        "tied": ({"a": w, "b": w, "c": big}, {}),
        "three tied": ({"z": w, "m": w, "b": w, "c": x}, {}),
        "tied across shards": ({"p": w, "c": big, "o": w}, {"max_shard_size": 60}),
        "partial view": ({"full": w, "part": w[:4]}, {}),
        "discard": ({"a": w, "b": w}, {"shared_tensors_to_discard": ["a"]}),
        "two groups": ({"p": w, "o": w, "r": x, "q": x}, {}),
        "non-contiguous": ({"t": torch.randn(3, 4).t()}, {}),
    }[case]
    ours, theirs = hub_and_ours(tmp_path, sd, **kw)
    assert_same_checkpoint(ours, theirs, metadata_keys=3)


def test_a_view_that_covers_no_storage_is_refused_like_huggingface_hub(tmp_path):
    big = torch.zeros(100)
    sd = {"v": big[:10], "w": torch.zeros(3)}
    (tmp_path / "t").mkdir()
    with pytest.raises(Exception, match=r"covering|storage"):
        hub.save_torch_state_dict(sd, tmp_path / "t")
    with pytest.raises(SharedTensorsError, match="storage"):
        save_sharded(sd, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_stale_files_are_removed_like_huggingface_hub_and_others_kept(tmp_path):
    pre = ["model.safetensors", "model-00001-of-00009.safetensors", "model.safetensors.index.json",
           "other.txt", "model-00001-of-00002.safetensors.bak", "modelX.safetensors"]
    sd = {"a": torch.zeros(20), "b": torch.zeros(20)}
    for size in (50, 1000):
        for side in ("theirs", "ours"):
            d = tmp_path / str(size) / side
            d.mkdir(parents=True)
            for p in pre:
                (d / p).write_text("old")
        hub.save_torch_state_dict(sd, tmp_path / str(size) / "theirs", max_shard_size=size)
        save_sharded(sd, tmp_path / str(size) / "ours", max_shard_size=size)
        assert_same_checkpoint(tmp_path / str(size) / "ours", tmp_path / str(size) / "theirs",
                               metadata_keys=1)


def test_shards_and_index_change_in_one_transaction(tmp_path):
    """A failure at any fsync leaves the old checkpoint exactly as it was (nothing deleted
    first, no shard of the new one under its final name)."""
    sd_old = {f"w{i}": torch.full((30,), float(i)) for i in range(4)}
    save_sharded(sd_old, tmp_path, max_shard_size=250)
    before = _listing(tmp_path)
    assert len(before) == 3
    sd_new = {f"w{i}": torch.full((30,), -float(i)) for i in range(6)}
    calls = 0

    class FailNthFsync(_sys.Backend):
        def __init__(self, n: int) -> None:
            self.n = n

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            nonlocal calls
            if op == "fsync":
                calls += 1
                if calls == self.n:
                    raise OSError(errno.EIO, "injected")

    failures = 0
    for n in range(1, 30):
        calls = 0
        try:
            with _sys.use(FailNthFsync(n)):
                save_sharded(sd_new, tmp_path, max_shard_size=250)
        except OSError:
            failures += 1
            assert _listing(tmp_path) == before, n
            continue
        break
    assert failures >= 3
    after = _listing(tmp_path)
    assert len(after) == 4  # 3 new shards and the index
    assert_loads_equal_index(tmp_path, sd_new)


def assert_loads_equal_index(d: Path, sd: dict[str, Any]) -> None:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    seen = set()
    for name, shard in index["weight_map"].items():
        with safe_open(os.fspath(d / shard), "pt") as f:
            assert torch.equal(f.get_tensor(name), sd[name])
        seen.add(name)
    assert seen == set(sd)


# --- merge and reshard against loading and saving with the packages -------------------------

def test_merge_equals_load_then_save_file_and_reshard_equals_the_hub(tmp_path):
    from filecord.safetensors import merge, reshard

    sd = random_state_dict(7) | {f"l.{i}": torch.randn(40) for i in range(6)}
    (tmp_path / "in").mkdir()
    hub.save_torch_state_dict(dict(sd), tmp_path / "in", max_shard_size=300)
    index = tmp_path / "in" / "model.safetensors.index.json"
    merge(tmp_path / "ours.safetensors", [index])
    loaded: dict[str, Any] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        loaded |= st_torch.load_file(os.fspath(tmp_path / "in" / shard))
    st_torch.save_file(loaded, os.fspath(tmp_path / "theirs.safetensors"),
                       metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "theirs.safetensors").read_bytes()

    # reshard of the index (weight_map order) == the hub on the tensors in that order
    ordered = {k: loaded[k] for k in json.loads(index.read_text())["weight_map"]}
    for size in (100, 500, 10**9):
        o, t = tmp_path / f"o{size}", tmp_path / f"t{size}"
        o.mkdir()
        t.mkdir()
        reshard(o, [index], max_shard_size=size)
        hub.save_torch_state_dict(dict(ordered), t, max_shard_size=size)
        assert_same_checkpoint(o, t, metadata_keys=1)


def test_off_host_tensors_go_through_a_scratch_file_and_give_the_same_bytes(tmp_path,
                                                                            monkeypatch):
    """The path a GPU tensor takes (streamed to an owned scratch file beside the target, then
    moved into the output), driven on CPU: same bytes, no scratch file left."""
    from filecord.safetensors import _torch

    sd = fixed_state_dicts()["every dtype, scalars, empty"]
    monkeypatch.setattr(_torch, "_on_host", lambda t: False)
    report = save_file(sd, tmp_path / "o.safetensors", metadata={"format": "pt"})
    st_torch.save_file(sd, os.fspath(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()
    assert report.bytes_by_action().get("moved", 0) > 0
    assert sorted(os.listdir(tmp_path)) == ["o.safetensors", "t.safetensors"]


def test_conjugate_and_negative_views_are_written_by_value_unlike_safetensors(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    sd = {"c": z.conj(), "n": torch.tensor([1.0, 2.0])._neg_view()}
    st_torch.save_file(sd, os.fspath(tmp_path / "t.safetensors"))
    theirs = st_torch.load_file(os.fspath(tmp_path / "t.safetensors"))
    assert torch.equal(theirs["c"], z)  # upstream writes the memory, not the value
    save_file(sd, tmp_path / "o.safetensors")
    ours = st_torch.load_file(os.fspath(tmp_path / "o.safetensors"))
    assert torch.equal(ours["c"], z.conj().resolve_conj())
    assert torch.equal(ours["n"], torch.tensor([-1.0, -2.0]))


# --- load_mapped: the checkpoint as views of its files' pages ----------------------------------


def _state(gen: torch.Generator) -> dict[str, Any]:
    state = {f"t.{name}": rand((3, 4), name, gen) for name in ALL_DTYPES
             if getattr(torch, name, None) is not None}
    state["scalar"] = torch.tensor(2.5)
    state["empty"] = torch.empty(0, 7)
    return state


def _same(a: Any, b: Any) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.reshape(-1).view(torch.uint8).tolist()
            == b.reshape(-1).view(torch.uint8).tolist())


def _mapped_ranges(path: Path) -> list[tuple[int, int, int]]:
    """(start, end, anonymous kB) of this process's mappings of ``path``."""
    from filecord.executorch._mapped import parse_smaps

    inode = path.stat().st_ino
    return [(m.start, m.end, m.anonymous_kb) for m in parse_smaps(
        Path("/proc/self/smaps").read_text()) if m.inode == inode]


def test_load_mapped_gives_safetensors_tensors_as_views_of_the_files_pages(
    tmp_path: Path,
) -> None:
    from filecord.safetensors import load_mapped

    state = _state(torch.Generator().manual_seed(3))
    path = tmp_path / "model.safetensors"
    st_torch.save_file(state, str(path))
    before = path.read_bytes()
    got = load_mapped(path)
    theirs = st_torch.load_file(str(path))
    assert list(got) == list(theirs)
    assert all(_same(got[k], theirs[k]) for k in theirs)
    weight = got["t.float32"]

    def mine() -> list[int]:  # anonymous kB of the mapping holding the weight
        return [anon for start, end, anon in _mapped_ranges(path)
                if start <= weight.data_ptr() < end]

    assert mine() == [0]  # a clean mapping of the file itself
    with torch.no_grad():
        weight.fill_(7.0)  # copy-on-write: this process's page, never the file
    assert path.read_bytes() == before
    assert mine()[0] > 0


def test_load_mapped_reads_a_sharded_checkpoint_through_its_index_or_folder(
    tmp_path: Path,
) -> None:
    from filecord.safetensors import load_mapped

    gen = torch.Generator().manual_seed(4)
    state = {f"w{i}": torch.randn(64, 64, generator=gen) for i in range(6)}
    hub.save_torch_state_dict(state, str(tmp_path), max_shard_size="40KB")
    assert len(list(tmp_path.glob("*.safetensors"))) >= 3
    for given in (tmp_path, tmp_path / "model.safetensors.index.json"):
        got = load_mapped(given)
        assert sorted(got) == sorted(state)
        assert all(torch.equal(got[k], state[k]) for k in state)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        load_mapped(tmp_path / "empty")
