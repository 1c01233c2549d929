"""``filecord merge / reshard / convert / inspect`` on safetensors and .ptd, as a user runs them:
a real subprocess, real files, exit codes 0/1/2, ``--json``, ``--dry-run`` and ``--consume``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from filecord import save
from filecord.executorch import PtdEntry, ScalarType, TensorLayout, build_ptd, read_ptd
from filecord.safetensors import DType, NamedTensor, SafetensorsFile, build_file, read_safetensors

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def run(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *map(os.fspath, args)],
                          capture_output=True, text=True, env=ENV, timeout=600, check=False)


def make(path: Path, seed: int, n: int = 5) -> bytes:
    ts = [NamedTensor(f"s{seed}.t{i}", DType.F32, (i + 1, 2),
                      (hashlib.sha256(f"{seed}{i}".encode()).digest() * 2)[: 8 * (i + 1)])
          for i in range(n)]
    save(path, build_file(ts, {"format": "pt"}))
    return path.read_bytes()


def listing(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_merge_dry_run_json_then_consume_then_reshard_and_merge_back(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    make(a, 1)
    make(b, 2)
    before = listing(tmp_path)
    out = tmp_path / "m.safetensors"

    r = run("merge", "-o", out, a, b, "--consume", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] is True
    assert {p["action"] for p in plan["pieces"] if p["source"]} == {"moved"}
    assert {p["source"] for p in plan["pieces"] if p["source"]} == {os.fspath(a), os.fspath(b)}
    assert listing(tmp_path) == before

    r = run("merge", "-o", out, a, b, "--consume", "-q")
    assert r.returncode == 0, r.stderr
    assert not a.exists()
    assert not b.exists()
    merged = out.read_bytes()

    shards = tmp_path / "shards"
    shards.mkdir()
    r = run("reshard", out, "-o", shards, "--max-shard-size", "64", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is False
    assert out.read_bytes() == merged  # not consumed
    assert (shards / "model.safetensors.index.json").exists()

    r = run("merge", "-o", tmp_path / "again.safetensors", shards / "model.safetensors.index.json",
            "--consume")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again.safetensors").read_bytes() == merged
    assert list(shards.iterdir()) == []
    assert "moved" in r.stdout


def test_convert_both_ways_and_inspect(tmp_path):
    src = tmp_path / "w.safetensors"
    make(src, 3)
    r = run("convert", src, "-o", tmp_path / "w.ptd", "--json")
    assert r.returncode == 0, r.stderr
    ptd = read_ptd(tmp_path / "w.ptd")
    assert len(ptd.entries) == 5
    assert next(iter(ptd.entries.values())).layout.scalar_type is ScalarType.FLOAT  # type: ignore[union-attr]
    r = run("convert", tmp_path / "w.ptd", "-o", tmp_path / "back.safetensors", "--consume")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "w.ptd").exists()
    back = read_safetensors(tmp_path / "back.safetensors")
    assert isinstance(back, SafetensorsFile)
    assert list(back.tensors) == [f"s3.t{i}" for i in range(5)]

    r = run("inspect", src, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "safetensors"
    f = info["files"][0]
    assert f["metadata"] == {"format": "pt"}
    assert [t["name"] for t in f["tensors"]] == [f"s3.t{i}" for i in range(5)]
    assert f["tensors"][0]["offset"] == f["data_start"]
    r = run("inspect", src)
    assert "s3.t4: F32 [5, 2]" in r.stdout


def test_merge_ptd_files_with_consume(tmp_path):
    lay = TensorLayout.contiguous(ScalarType.FLOAT, (2,))
    save(tmp_path / "a.ptd", build_ptd([PtdEntry("x", b"\1" * 8, lay, 16)]))
    save(tmp_path / "b.ptd", build_ptd([PtdEntry("y", b"\2" * 8, lay, 16),
                                        PtdEntry("x", b"\1" * 8, lay, 16)]))
    r = run("merge", "-o", tmp_path / "m.ptd", tmp_path / "a.ptd", tmp_path / "b.ptd", "-n",
            "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is True
    assert not (tmp_path / "m.ptd").exists()
    r = run("merge", "-o", tmp_path / "m.ptd", tmp_path / "a.ptd", tmp_path / "b.ptd", "--consume")
    assert r.returncode == 0, r.stderr
    got = read_ptd(tmp_path / "m.ptd")
    assert {k: e.data.to_bytes() for k, e in got.entries.items()} == {  # type: ignore[union-attr]
        "x": b"\1" * 8, "y": b"\2" * 8}
    assert not (tmp_path / "a.ptd").exists()
    assert not (tmp_path / "b.ptd").exists()


@pytest.mark.parametrize("args", [
    ("merge", "-o", "OUT.bin", "IN"),
    ("merge", "-o", "OUT.safetensors", "missing.safetensors"),
    ("reshard", "IN", "-o", "IN"),
    ("reshard", "IN", "not-a-dir"),  # the old form: refused with the new one shown
    ("convert", "IN", "-o", "out.bin"),
    ("convert", "IN", "out.bin"),  # the old form
    ("merge", "OUT.safetensors", "IN"),  # the old form
])
def test_usage_errors_exit_2_and_touch_nothing(tmp_path, args):
    src = tmp_path / "in.safetensors"
    make(src, 4)
    before = listing(tmp_path)
    r = run(*[os.fspath(src) if a == "IN" else os.fspath(tmp_path / a) if "." in a or a ==
              "not-a-dir" else a for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error" in r.stderr
    assert listing(tmp_path) == before


def test_unrepresentable_and_malformed_inputs_exit_1(tmp_path):
    bad = tmp_path / "c.safetensors"
    save(bad, build_file([NamedTensor("z", DType.C64, (1,), b"\0" * 8)], None))
    r = run("convert", bad, "-o", tmp_path / "c.ptd")
    assert r.returncode == 1
    assert "'z'" in r.stderr
    junk = tmp_path / "j.safetensors"
    junk.write_bytes(b"\x05\0\0\0\0\0\0\0{}  x")
    for cmd in (("merge", "-o", tmp_path / "o.safetensors", junk), ("inspect", junk)):
        r = run(*cmd)
        assert r.returncode == 1, r.stderr
        assert "header" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "j.safetensors"]
