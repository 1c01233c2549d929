"""``filecord merge/reshard/convert/inspect`` on GGUF as a user runs them: a subprocess, real
files, byte-identical outputs, --json, --dry-run, --consume, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
rng = np.random.default_rng(3)
ARRAYS = [(f"blk.{i}.w", rng.standard_normal((i + 1, 32)).astype(np.float32))
          for i in range(5)]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], capture_output=True,
                          text=True, env=ENV, timeout=600, check=False)


def gguf_py(path: Path, **kw: int) -> None:
    w = gguf.GGUFWriter(str(path), "llama", **kw)
    w.add_string("general.name", "cli")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(10)])
    for name, a in ARRAYS:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_merge_reshard_roundtrip_with_consume(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    gguf_py(ref / "m.gguf")
    gguf_py(ref / "m.gguf", split_max_tensors=2)
    work = tmp_path / "work"
    work.mkdir()
    r = run("reshard", str(ref / "m.gguf"), "-o", str(work), "--max-tensors", "2", "-q")
    assert r.returncode == 0, r.stderr
    shards = sorted(os.listdir(work))
    assert shards == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for name in shards:
        assert (work / name).read_bytes() == (ref / name).read_bytes()
    out = tmp_path / "merged.gguf"
    r = run("merge", "-o", str(out), str(work / shards[0]), "--consume", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["dry_run"] is False
    assert out.read_bytes() == (ref / "m.gguf").read_bytes()
    assert os.listdir(work) == []


def test_dry_run_json_and_inspect(tmp_path: Path) -> None:
    gguf_py(tmp_path / "m.gguf", split_max_tensors=3)
    first = tmp_path / "m-00001-of-00002.gguf"
    before = sorted(os.listdir(tmp_path))
    r = run("merge", "-o", str(tmp_path / "o.gguf"), str(first), "--dry-run", "--consume",
            "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is True
    (tmp_path / "rs").mkdir()
    before = sorted(os.listdir(tmp_path))
    r = run("reshard", str(first), "-o", str(tmp_path / "rs"), "--max-shard-size", "200", "-n")
    assert r.returncode == 0, r.stderr
    assert "moved" not in r.stdout  # no --consume: a plan of copies
    assert not os.listdir(tmp_path / "rs")
    # Over its own set without --consume: the run would be refused, so the dry run is too.
    r = run("reshard", str(first), "-o", str(tmp_path), "--max-shard-size", "200", "-n")
    assert r.returncode == 1, r.stderr
    assert "--consume" in r.stderr
    assert sorted(os.listdir(tmp_path)) == before
    r = run("inspect", str(first), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "gguf"
    assert [len(f["tensors"]) for f in info["files"]] == [3, 2]
    assert info["kvs"]["tokenizer.ggml.tokens"]["type"] == "ARRAY[STRING]"
    t0 = info["files"][0]["tensors"][0]
    assert (t0["name"], t0["type"], t0["dims"], t0["size"]) == ("blk.0.w", "F32", [32, 1], 128)
    text = run("inspect", str(first))
    assert text.returncode == 0
    assert "blk.4.w: F32 ne=[32, 5]" in text.stdout
    assert "shard 2 of 2" in text.stdout
    second = run("inspect", str(tmp_path / "m-00002-of-00002.gguf"), "--json")
    assert second.returncode == 0, second.stderr
    alone = json.loads(second.stdout)
    assert [f["split"] for f in alone["files"]] == [[1, 2, 5]]
    assert list(alone["kvs"]) == ["split.no", "split.count", "split.tensors.count"]


def test_convert_and_refusal_exit_codes(tmp_path: Path) -> None:
    """A bare safetensors file is no Hugging Face model (no config.json): refused, exit 1,
    nothing written.  (Conversions that succeed: tests/gguf/test_gguf_hf*.py.)"""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    src = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(4, 2), "ids": torch.zeros(3, dtype=torch.int64)}, str(src))
    r = run("convert", str(src), "-o", str(tmp_path / "o.gguf"), "--consume")
    assert r.returncode == 1
    assert "no config.json" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    r = run("convert", str(src), "-o", str(tmp_path / "s.ptd"), "--max-tensors", "2")
    assert r.returncode == 2
    r = run("convert", str(src), str(tmp_path / "o.gguf"), "-o", str(tmp_path / "p.gguf"))
    assert r.returncode == 2
    assert "convert takes one input, got 2" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = run("inspect", str(bad))
    assert r.returncode == 1
    assert "LimitExceeded" not in r.stderr
    assert "tensor_count at offset 8" in r.stderr
    r = run("merge", "-o", str(tmp_path / "x.gguf"), str(bad))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
