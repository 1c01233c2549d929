"""GGUF merge, reshard and convert on real files: byte-identical to gguf-py writing the same
model, with and without consume, dry runs, refusals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import filecord.gguf as fg  # noqa: E402
from filecord.errors import SourceIsOutputError  # noqa: E402
from filecord.gguf._read import read_gguf_file  # noqa: E402
from filecord.gguf.errors import DuplicateTensorError  # noqa: E402

rng = np.random.default_rng(16)
ARRAYS = [(f"blk.{i}.w", (rng.standard_normal((i + 2, 8)) * 10).astype(
    "float16" if i % 2 else "float32")) for i in range(6)]
Q8 = rng.integers(0, 256, (4, 34), dtype=np.uint8)


def gguf_py(path: Path, **kw: Any) -> None:
    """The model as gguf-py writes it (optionally split)."""
    w = gguf.GGUFWriter(str(path), "llama", **kw)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_float32("f", float("nan"))
    for name, a in ARRAYS:
        w.add_tensor(name, a)
    w.add_tensor("q", Q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    return d


@pytest.mark.parametrize("consume", [False, True])
@pytest.mark.parametrize("split", [{"split_max_tensors": 2}, {"split_max_size": 200}])
def test_merge_equals_gguf_py_single_file(tmp_path: Path, consume: bool,
                                          split: dict[str, int]) -> None:
    gguf_py(_dir(tmp_path, "one") / "m.gguf")
    src = _dir(tmp_path, "split")
    gguf_py(src / "m.gguf", **split)
    shards = sorted(os.listdir(src))
    assert len(shards) > 2
    out = tmp_path / "merged.gguf"
    report = fg.merge(out, [src / shards[0]], consume=consume)
    assert out.read_bytes() == (tmp_path / "one" / "m.gguf").read_bytes()
    assert sorted(os.listdir(src)) == ([] if consume else shards)
    if consume:
        assert {a.action for a in report.actions if a.length and a.action != "written"} \
            == {"moved"}


@pytest.mark.parametrize("consume", [False, True])
@pytest.mark.parametrize("split", [{"max_tensors": 3}, {"max_tensors": 1}, {"max_shard_size": 100}])
def test_reshard_equals_gguf_py_split(tmp_path: Path, consume: bool,
                                      split: dict[str, int]) -> None:
    ref = _dir(tmp_path, "ref")
    gguf_py_names = {"max_tensors": "split_max_tensors", "max_shard_size": "split_max_size"}
    gguf_py(ref / "m.gguf", **{gguf_py_names[k]: v for k, v in split.items()})
    src = _dir(tmp_path, "src")
    gguf_py(src / "in.gguf")
    out = _dir(tmp_path, "out")
    fg.reshard(out / "m.gguf", [src / "in.gguf"], consume=consume, **split)
    assert sorted(os.listdir(out)) == sorted(os.listdir(ref))
    for name in os.listdir(ref):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert os.listdir(src) == ([] if consume else ["in.gguf"])


def test_reshard_names_the_new_keyword_for_the_old_one(tmp_path: Path) -> None:
    src = _dir(tmp_path, "src")
    gguf_py(src / "m.gguf")
    with pytest.raises(TypeError, match=r"max_shard_size=, not max_size="):
        fg.reshard(tmp_path / "o.gguf", [src / "m.gguf"], max_size=100)  # type: ignore[call-arg]
    assert not (tmp_path / "o.gguf").exists()


def test_dry_runs_write_nothing(tmp_path: Path) -> None:
    src = _dir(tmp_path, "src")
    gguf_py(src / "m.gguf", split_max_tensors=3)
    before = {p: (src / p).read_bytes() for p in os.listdir(src)}
    first = src / sorted(before)[0]
    r1 = fg.merge(tmp_path / "o.gguf", [first], consume=True, dry_run=True)
    r2 = fg.reshard(tmp_path / "r.gguf", [first], max_tensors=1, consume=True, dry_run=True)
    assert r1.dry_run
    assert r2.dry_run
    assert len(r2.outputs) == 7
    assert sorted(os.listdir(tmp_path)) == ["src"]
    assert {p: (src / p).read_bytes() for p in os.listdir(src)} == before


def test_alignment_4096_pages_and_roundtrip(tmp_path: Path) -> None:
    gguf_py(tmp_path / "m.gguf")
    fg.merge(tmp_path / "a.gguf", [tmp_path / "m.gguf"], alignment=4096)
    f = read_gguf_file(tmp_path / "a.gguf")
    assert f.alignment == 4096
    assert all(t.data.offset % 4096 == 0 for t in f.tensors.values())  # type: ignore[union-attr]
    fg.merge(tmp_path / "b.gguf", [tmp_path / "a.gguf"], alignment=32)
    # general.alignment stays in its slot (now 32): same as gguf-py with add_custom_alignment
    w = gguf.GGUFWriter(str(tmp_path / "ref.gguf"), "llama")
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_float32("f", float("nan"))
    w.add_custom_alignment(32)
    for name, a in ARRAYS:
        w.add_tensor(name, a)
    w.add_tensor("q", Q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    r = gguf.GGUFReader(str(tmp_path / "a.gguf"))
    for rt in r.tensors:
        assert bytes(np.asarray(rt.data).view(np.uint8).reshape(-1)) == \
            f.tensors[rt.name].data.to_bytes()  # type: ignore[union-attr]


def test_merge_refuses_duplicate_tensor(tmp_path: Path) -> None:
    gguf_py(tmp_path / "a.gguf")
    gguf_py(tmp_path / "b.gguf")
    with pytest.raises(DuplicateTensorError, match=r"blk\.0\.w"):
        fg.merge(tmp_path / "o.gguf", [tmp_path / "a.gguf", tmp_path / "b.gguf"])
    assert not (tmp_path / "o.gguf").exists()


def _safetensors(path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    save_file({k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
               for k, v in tensors.items()}, str(path), metadata=metadata)


def test_reshard_over_its_own_set_needs_consume_and_removes_stale_shards(tmp_path: Path) -> None:
    gguf_py(tmp_path / "m.gguf", split_max_tensors=2)  # m-0000k-of-00004.gguf
    gguf_py(tmp_path / "m.gguf")  # the single file too
    old = sorted(os.listdir(tmp_path))
    assert len(old) == 5
    first = tmp_path / "m-00001-of-00004.gguf"
    # Without consume, a new set over its own input set would leave the old shards beside it
    # (a mixed set of one stem): refused, nothing changed, and the message names --consume.
    with pytest.raises(SourceIsOutputError, match="consume"):
        fg.reshard(tmp_path / "m.gguf", [first], max_tensors=3)
    assert sorted(os.listdir(tmp_path)) == old
    fg.reshard(tmp_path / "m.gguf", [first], max_tensors=3, consume=True)
    # the new set (3 shards) replaced the old one (consumed); the stale single file is removed
    assert sorted(os.listdir(tmp_path)) == [
        "m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    fg.reshard(tmp_path / "m.gguf", [tmp_path / "m-00001-of-00003.gguf"], max_tensors=7,
               consume=True)
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]
    assert fg.read_gguf(tmp_path / "m.gguf").tensors.keys() == {n for n, _ in ARRAYS} | {"q"}


@pytest.mark.parametrize("align", [4096, 64, 32])
def test_consumed_merge_moves_everything_to_an_equal_or_larger_alignment(tmp_path: Path,
                                                                align: int) -> None:
    """A 32-aligned split set merged into a 4096-aligned file (or 64, or 32) with consume:
    every tensor range moves (each takes as much of its own padding as the output needs), none
    is copied below a gap; the result equals gguf-py with add_custom_alignment."""
    src = _dir(tmp_path, "src")
    gguf_py(src / "m.gguf", split_max_tensors=3)
    out = tmp_path / "m.gguf"
    report = fg.merge(out, [src / "m-00001-of-00003.gguf"], consume=True, alignment=align)
    assert {a.action for a in report.file_actions()} == {"moved"}
    assert os.listdir(src) == []
    f = read_gguf_file(out)
    assert f.alignment == align
    ref = read_gguf_file(_reference(tmp_path, align))
    assert [t.data.to_bytes() for t in f.tensors.values()] == \
        [t.data.to_bytes() for t in ref.tensors.values()]  # type: ignore[union-attr]


def _reference(tmp_path: Path, align: int) -> Path:
    p = tmp_path / "ref.gguf"
    gguf_py(p)
    return p


def test_a_split_set_with_a_fifo_shard_is_refused_not_waited_on(tmp_path: Path) -> None:
    import signal

    from filecord.errors import NotRegularFileError

    src = _dir(tmp_path, "src")
    gguf_py(src / "m.gguf", split_max_tensors=3)
    shards = sorted(src.iterdir())
    assert len(shards) == 3
    shards[2].unlink()
    os.mkfifo(shards[2])

    def expire(*_: object) -> None:
        raise TimeoutError("blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    try:
        with pytest.raises(NotRegularFileError, match="FIFO"):
            fg.merge(tmp_path / "o.gguf", [shards[0]], consume=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(src.iterdir()) == shards
    assert not (tmp_path / "o.gguf").exists()


def test_consuming_reshard_with_an_immutable_shard_commits_and_keeps_it(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    src = _dir(tmp_path, "src")
    gguf_py(src / "m.gguf", split_max_tensors=3)
    shards = sorted(src.iterdir())
    ref = _dir(tmp_path, "ref")
    gguf_py(ref / "m.gguf")
    before = shards[1].read_bytes()
    subprocess.run(["chattr", "+i", str(shards[1])], check=True)
    try:  # in place, as one file: the immutable shard keeps its whole split set, loadable
        report = fg.reshard(src / "m.gguf", [shards[0]], max_tensors=0, consume=True)
        assert shards[1].read_bytes() == before
        assert [(os.path.basename(k.path), k.reason.name) for k in report.kept] == [
            (shards[1].name, "IMMUTABLE")]
        assert sorted(p.name for p in src.iterdir()) == sorted(
            ["m.gguf", *(s.name for s in shards)])
        fg.merge(tmp_path / "again.gguf", [shards[0]])  # the kept set still loads
        assert (tmp_path / "again.gguf").read_bytes() == (ref / "m.gguf").read_bytes()
        assert (src / "m.gguf").read_bytes() == (ref / "m.gguf").read_bytes()
    finally:
        subprocess.run(["chattr", "-i", str(shards[1])], check=False)


def test_consuming_convert_of_a_hugging_face_cache_snapshot_keeps_it_loadable(
        tmp_path: Path) -> None:
    """Every file of the snapshot is a symlink into blobs/: the shards are copied and kept, and
    so is the index link (it used to be deleted, leaving the kept checkpoint unloadable)."""
    import hashlib

    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from tests.support.hf_models import tiny_model

    plain = tiny_model(tmp_path / "plain", dtype="float32")
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(plain.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        os.replace(f, blobs / digest)
        (snap / f.name).symlink_to(os.path.relpath(blobs / digest, snap))
    index = snap / "model.safetensors.index.json"
    links = {p.name: os.readlink(p) for p in snap.iterdir()}
    shards = [n for n in links if n.endswith(".safetensors")]
    report = fg.convert(tmp_path / "m.gguf", snap, consume=True)
    assert {p.name: os.readlink(p) for p in snap.iterdir()} == links
    kept = {os.path.basename(k.path): k.reason.name for k in report.kept}
    assert kept.pop(index.name) == "SHARDS_KEPT"
    assert set(kept.values()) == {"SYMLINK"}
    assert sorted(kept) == sorted(shards)
    assert len(fg.read_gguf(tmp_path / "m.gguf").tensors) == 21  # 2 layers of 9, and 3
    fg.convert(tmp_path / "again.gguf", snap)  # still readable through its index
    assert (tmp_path / "again.gguf").read_bytes() == (tmp_path / "m.gguf").read_bytes()
