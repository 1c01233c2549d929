"""Issue 26 item 1: the layouts that put a blob at a 4 KiB offset are adopted in place on ext4.

* ``filecord pack --align 4096 --consume``: the largest file is adopted (the CLI says "adopted
  ... in place"), the others moved; ``read_ptd`` reads every entry's exact bytes.
* GGUF with ``general.alignment`` 4096 (``build_gguf(alignment=4096)``) saved with
  ``consume=True``: the largest tensor's file is adopted; the tensors read back exact.
* An ExecuTorch program (XNNPACK, weights external) saved clone-ready with ``consume=True``:
  the ``.ptd`` and the ``.pte`` each adopt their largest segment, 0 bytes of them copied, and
  the ExecuTorch runtime runs the result to PyTorch's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import FileBackedData
from filecord.executorch import read_ptd

pytestmark = pytest.mark.root

MiB = fskit.MiB
ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def test_pack_align_4096_consume_adopts_the_largest_file(mount) -> None:
    fs = mount("ext4", 128 * MiB)
    fskit.write_pattern(fs / "big.bin", 6 * MiB + 11, seed=1)
    fskit.write_pattern(fs / "small.bin", 100_003, seed=2)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "pack", "small=small.bin",
                        "big=big.bin", "-o", "out.ptd", "--consume", "--align", "4096"],
                       capture_output=True, text=True, env=ENV, cwd=fs, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "adopted in place" in r.stdout
    assert any("adopted" in line and "big.bin" in line and "no byte copied" in line
               for line in r.stdout.splitlines()), r.stdout
    assert not (fs / "big.bin").exists()
    assert not (fs / "small.bin").exists()
    ptd = read_ptd(fs / "out.ptd")
    seg = {k: ptd.segments[e.segment_index] for k, e in ptd.entries.items()}
    assert seg["big"].file_offset % 4096 == 0
    assert fskit.mismatch(fs / "out.ptd", seg["big"].file_offset, 6 * MiB + 11, seed=1) is None
    assert fskit.mismatch(fs / "out.ptd", seg["small"].file_offset, 100_003, seed=2) is None


def test_gguf_with_4096_alignment_adopts_the_largest_tensor_file(mount) -> None:
    from filecord.gguf import GGMLType, GGUFTensor, KeyValue, ValueType, build_gguf, read_gguf

    fs = mount("ext4", 128 * MiB)
    sizes = {"blk.0.big": 2 * MiB, "blk.0.small": 64 * 1024}
    tensors = []
    for n, (name, size) in enumerate(sizes.items()):
        fskit.write_pattern(fs / f"{name}.bin", size, seed=10 + n)
        tensors.append(GGUFTensor(name, GGMLType.F32, (size // 4,),
                                  FileBackedData(str(fs / f"{name}.bin"), owned=True)))
    cord = build_gguf([KeyValue("general.architecture", ValueType.STRING, "llama")], tensors,
                      alignment=4096)
    report = filecord.save(str(fs / "m.gguf"), cord, consume=True)
    adopted = [a for a in report.actions if a.action == "adopted"]
    assert [a.source for a in adopted] == [str(fs / "blk.0.big.bin")]
    assert adopted[0].out_offset % 4096 == 0
    assert report.bytes_copied == 0
    model = read_gguf(fs / "m.gguf")
    for n, (name, size) in enumerate(sizes.items()):
        data = model.tensors[name].data
        assert isinstance(data, FileBackedData)
        assert fskit.mismatch(fs / "m.gguf", data.offset, size, seed=10 + n) is None
    assert sorted(os.listdir(fs)) == ["lost+found", "m.gguf"]


def _pack(fs: Path, *inputs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "pack", *inputs,
                           "-o", "out.ptd", "--consume", "--align", "4096"],
                          capture_output=True, text=True, env=ENV, cwd=fs, timeout=120,
                          check=False)


@pytest.mark.parametrize("why", ["hard-link", "other-fs"])
def test_pack_align_copies_an_ineligible_largest_file_with_its_reason(mount, why: str) -> None:
    """The largest file cannot be adopted (a second hard link; another file system): the plan
    says so and copies it, and the next largest is adopted in place; never a DataChangedError
    for a file nobody touched (the copy reads it wherever the save parked it)."""
    fs = mount("ext4", 128 * MiB)
    where = fs if why == "hard-link" else mount("ext4", 64 * MiB)
    fskit.write_pattern(where / "big.bin", 6 * MiB + 11, seed=1)
    fskit.write_pattern(fs / "small.bin", 100_003, seed=2)
    if why == "hard-link":
        os.link(where / "big.bin", where / "big2.bin")
    r = _pack(fs, "small=small.bin", f"big={where / 'big.bin'}")
    assert r.returncode == 0, r.stderr
    reason = "another hard link" if why == "hard-link" else "another file system"
    assert any("copied" in line and "big.bin" in line and reason in line
               for line in r.stdout.splitlines()), r.stdout
    assert any("adopted" in line and "small.bin" in line for line in r.stdout.splitlines())
    ptd = read_ptd(fs / "out.ptd")
    seg = {k: ptd.segments[e.segment_index] for k, e in ptd.entries.items()}
    assert fskit.mismatch(fs / "out.ptd", seg["big"].file_offset, 6 * MiB + 11, seed=1) is None
    assert fskit.mismatch(fs / "out.ptd", seg["small"].file_offset, 100_003, seed=2) is None
    assert not (fs / "small.bin").exists()
    if why == "hard-link":  # the other name still holds the bytes
        assert fskit.mismatch(where / "big2.bin", 0, 6 * MiB + 11, seed=1) is None
    assert [n for n in os.listdir(fs) if ".filecord-" in n] == []
    assert [n for n in os.listdir(where) if ".filecord-" in n] == []
