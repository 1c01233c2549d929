"""The format operations take the output first; a call in the old order (source first) fails
before anything is written: no new file appears and every input keeps its bytes and mtime."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import filecord.gguf as fg
import filecord.safetensors as fst
from filecord import save
from filecord.errors import SourceIsOutputError
from filecord.safetensors import DType, NamedTensor, build_file


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and mtime (symlinks by their target name)."""
    out: dict[str, tuple[bytes, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = (os.readlink(p).encode(), 0)
            elif p.is_file():
                out[rel] = (p.read_bytes(), p.stat().st_mtime_ns)
            else:
                out[rel] = (b"<dir>", 0)
    return out


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A safetensors file, a sharded checkpoint (index + shards), a .ptd and a .gguf."""
    ts = [NamedTensor(f"w{i}", DType.F32, (4, 8), bytes([i]) * 128) for i in range(4)]
    save(tmp_path / "model.safetensors", build_file(ts, {"format": "pt"}))
    (tmp_path / "ckpt").mkdir()
    fst.reshard(tmp_path / "ckpt", [tmp_path / "model.safetensors"], max_shard_size=300)
    fst.convert(tmp_path / "model.ptd", tmp_path / "model.safetensors")
    save(tmp_path / "model.gguf", fg.build_gguf(
        [fg.KeyValue("general.architecture", fg.ValueType.STRING, "llama")],
        [fg.GGUFTensor(t.name, fg.GGMLType.F32, (8, 4), t.data) for t in ts]))
    return tmp_path


def refused(work: Path, call: Callable[[], object], error: type[BaseException],
            match: str) -> None:
    before = snapshot(work)
    with pytest.raises(error, match=match):
        call()
    assert snapshot(work) == before  # nothing created, nothing changed


INDEX = "ckpt/model.safetensors.index.json"


@pytest.mark.parametrize(("call", "error", "match"), [
    # inputs where the output goes: a list is never a path
    (lambda w: fst.merge([w / INDEX], w / "m.safetensors"), TypeError,
     r"merge\(output, inputs\)"),
    (lambda w: fst.merge((w / "model.safetensors",), w / "m.safetensors"), TypeError,
     "tuple of inputs first"),
    (lambda w: fst.reshard([w / "model.safetensors"], w / "ckpt"), TypeError,
     r"reshard\(directory, inputs\)"),
    (lambda w: fg.merge([w / "model.gguf"], w / "m.gguf"), TypeError,
     r"gguf.merge\(output, inputs\)"),
    (lambda w: fg.reshard([w / "model.gguf"], w / "m.gguf", max_tensors=1), TypeError,
     r"gguf.reshard\(output, inputs\)"),
    # a single path where the list of inputs goes
    (lambda w: fst.merge(w / "m.safetensors", w / "model.safetensors"), TypeError,
     "single path"),
    (lambda w: fg.merge(w / "m.gguf", str(w / "model.gguf")), TypeError, "single path"),
    # the output's suffix is one the operation never writes
    (lambda w: fst.merge(w / INDEX, [w / "model.safetensors"]), ValueError,
     r"writes \.safetensors"),
    (lambda w: fst.reshard(w / "model.safetensors", [w / "ckpt"]), ValueError,
     "into a directory"),
    (lambda w: fst.convert(w / INDEX, w / "model.ptd"), ValueError,
     r"writes \.ptd or \.safetensors"),
    (lambda w: fg.merge(w / "model.safetensors", [w / "model.gguf"]), ValueError,
     r"writes \.gguf"),
    (lambda w: fg.convert(w / "model.safetensors", w / "model.gguf"), ValueError,
     r"writes \.gguf"),
    (lambda w: fg.convert(w / INDEX, w / "model.gguf"), ValueError, r"writes \.gguf"),
    # the source's suffix does not fit the output's
    (lambda w: fst.convert(w / "model.ptd", w / "model.ptd"), ValueError,
     "takes a .safetensors file"),
    (lambda w: fg.convert(w / "x.gguf", w / "model.gguf"), ValueError,
     "takes a model directory"),
    # old order whose source (the intended output) does not exist yet
    (lambda w: fst.convert(w / "model.safetensors", w / "new.ptd"), FileNotFoundError,
     r"convert\(output, source\)"),
])
def test_old_order_fails_before_writing(work: Path, call: Callable[[Path], object],
                                        error: type[BaseException], match: str) -> None:
    refused(work, lambda: call(work), error, match)


def test_an_output_naming_the_index_json_is_refused(work: Path) -> None:
    # An index JSON is no tensor source of the save, so the save's own check cannot see it:
    # the operation checks by name and by inode.
    (work / "alias.ptd").symlink_to(work / INDEX)
    (work / "alias.gguf").symlink_to(work / INDEX)
    refused(work, lambda: fst.convert(work / "alias.ptd", work / INDEX),
            SourceIsOutputError, "also one of the inputs")
    refused(work, lambda: fg.convert(work / "alias.gguf", work / INDEX),
            SourceIsOutputError, "also one of the inputs")


def test_merge_onto_an_input_is_refused_by_name(work: Path) -> None:
    refused(work, lambda: fst.merge(work / "model.safetensors", [work / "model.safetensors"]),
            SourceIsOutputError, "also one of the inputs")
    refused(work, lambda: fg.merge(work / "model.gguf", [work / "model.gguf"]),
            SourceIsOutputError, "also one of the inputs")


def test_keywords_still_name_the_arguments(work: Path) -> None:
    fst.convert(source=work / "model.ptd", output=work / "back.safetensors")
    fg.merge(inputs=[work / "model.gguf"], output=work / "again.gguf")
    assert (work / "back.safetensors").stat().st_size > 0
    assert (work / "again.gguf").read_bytes() == (work / "model.gguf").read_bytes()


def test_an_existing_directory_may_have_any_name(work: Path) -> None:
    d = work / "shards.json"
    d.mkdir()
    fst.reshard(d, [work / "model.safetensors"], max_shard_size=300)
    assert (d / "model.safetensors.index.json").exists()


def test_cli_gguf_pattern_of_another_suffix_still_names_the_shards(work: Path) -> None:
    from filecord.cli import main

    out = work / "out"
    out.mkdir()
    assert main(["reshard", str(work / "model.gguf"), "-o", str(out), "--pattern", "x{suffix}.bin",
                 "--max-tensors", "2", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["x.bin-00001-of-00002.gguf",
                                                     "x.bin-00002-of-00002.gguf"]
