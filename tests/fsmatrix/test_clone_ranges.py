"""Issue 13: ranged clones on XFS (reflink) and btrfs, exact bytes at exact offsets.

* Pieces that start on a 4 KiB boundary in source and output and end their source are cloned
  whole, partial last block included, even in the middle of the output: the fill writes each
  temp in output order, so every clone reaches the temp's end, the one place the kernel takes
  a source's partial EOF block.  The transfer counters show 0 bytes copied.
* The zero padding after such a piece, inside its last block, reads back as zeros (the bytes
  past a source's end in its last block read as zeros, even when the source once held other
  bytes there and was truncated).
* A range that ends mid-block inside its source clones its aligned body and copies only the
  tail, and the report says how much and why.
"""

from __future__ import annotations

import os
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._plan.types import MID_TAIL, PAST_TAIL

pytestmark = pytest.mark.root

MiB = fskit.MiB
B = 4096


def _pad(n: int) -> bytes:
    return bytes(-n % B)


def _dirty_tail(path: Path, data: bytes) -> None:
    """Write ``data`` with other bytes after it in its last block, then cut them off, fsynced:
    the on-disk block past the end held non-zero bytes once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, data + b"\xff" * (B - len(data) % B), 0)
        os.fsync(fd)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_unaligned_sources_clone_whole_and_copy_nothing(mount, kind):
    fs = mount(kind, 512 * MiB)
    sizes = [3 * MiB + 1808, 5000, 2 * MiB + 7]  # none a multiple of 4096
    datas = [fskit.pattern(20 + i, 0, n) for i, n in enumerate(sizes)]
    paths = [fs / f"seg{i}.bin" for i in range(len(sizes))]
    for p, d in zip(paths, datas, strict=True):
        _dirty_tail(p, d)
    header = fskit.pattern(9, 0, 100) + bytes(B - 100)
    cord = Cord([header])
    for i, p in enumerate(paths):
        cord.append(FileBackedData(p, owned=True))
        if i + 1 < len(paths):
            cord.append(_pad(sizes[i]))
    os.sync()
    before = fskit.fs_used(fs)
    report = filecord.save(fs / "out.bin", cord, consume=True)
    os.sync()
    after = fskit.fs_used(fs)

    acts = [(a.action, a.tail, a.tail_reason) for a in report.file_actions()]
    assert acts == [("cloned", 0, None)] * 3, report.to_dict()["pieces"]
    assert report.bytes_copied == 0
    assert report.bytes_moved == 0
    assert report.bytes_cloned == sum(sizes)
    assert report.bytes_by_action()["cloned"] == sum(sizes)
    # Exact bytes at exact offsets: each piece, and the zeros after it inside its last block.
    out = (fs / "out.bin").read_bytes()
    want = header
    for i, d in enumerate(datas):
        want += d + (_pad(len(d)) if i + 1 < len(datas) else b"")
    assert len(out) == len(want)
    pos = len(header)
    for i, d in enumerate(datas):
        assert out[pos:pos + len(d)] == d, f"piece {i} at {pos}"
        pos += len(d)
        if i + 1 < len(datas):
            gap = -len(d) % B
            assert out[pos:pos + gap] == bytes(gap), f"padding after piece {i} at {pos}"
            pos += gap
    assert out == want
    assert not any(p.exists() for p in paths)  # consumed: deleted at commit
    # The data's extents live on in the output: the file system grew by the header and, per
    # piece followed by more output, the one block the kernel unshares to zero its end.
    assert after - before < 1 * MiB, f"{kind}: {after - before} bytes new for {sum(sizes)}"


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_a_range_ending_mid_source_clones_its_body_and_copies_its_tail(mount, kind):
    fs = mount(kind, 512 * MiB)
    size = 4 * MiB
    src = fs / "blob.bin"
    fskit.write_pattern(src, size, seed=31)
    first = 2 * MiB + 1000  # ends mid-block, mid-source
    whole = FileBackedData(src, owned=True)
    cord = Cord([bytes(B), whole.slice(0, first), _pad(first),
                 whole.slice(2 * MiB + B, size - 2 * MiB - B)])
    report = filecord.save(fs / "out.bin", cord, consume=True)

    a, b = report.file_actions()
    assert (a.action, a.tail, a.tail_reason) == ("cloned", 1000, MID_TAIL)
    assert (b.action, b.tail) == ("cloned", 0)
    assert report.bytes_copied == 1000  # the tail, and nothing else
    assert report.bytes_cloned == first - 1000 + size - 2 * MiB - B
    assert report.copy_reasons() == {MID_TAIL: 1000}
    out = fs / "out.bin"
    assert out.read_bytes()[:B] == bytes(B)
    assert fskit.mismatch(out, B, first, 31) is None
    with open(out, "rb") as f:
        f.seek(B + first)
        assert f.read(-first % B) == bytes(-first % B)
        tail = f.read()
    assert tail == fskit.pattern(31, 2 * MiB + B, size - 2 * MiB - B)
    assert not src.exists()


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_pack_align_4096_consume_clones_files_of_any_length(mount, kind):
    """The issue's case: ``pack --align 4096 --consume`` used to clone only a file whose length
    is a multiple of 4096 or that ended the output, and move the rest."""
    import json
    import subprocess
    import sys

    from filecord.executorch import read_ptd

    fs = mount(kind, 512 * MiB)
    sizes = {"a": 1 * MiB + 123, "b": 4096 * 3, "c": 77_777}
    for i, (key, n) in enumerate(sizes.items()):
        fskit.write_pattern(fs / f"{key}.bin", n, seed=40 + i)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "filecord.cli", "pack", "-o", str(fs / "w.ptd"),
         *(f"{k}={fs / k}.bin" for k in sizes), "--align", "4096", "--consume", "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(p["action"], p["tail"]) for p in report["pieces"] if p["source"]] == [
        ("cloned", 0)] * 3
    assert report["transfer"]["copied"] == 0
    assert report["transfer"]["moved"] == 0
    ptd = read_ptd(fs / "w.ptd")
    for i, (seg, n) in enumerate(zip(ptd.segments, sizes.values(), strict=True)):
        assert seg.file_offset % B == 0
        assert fskit.mismatch(fs / "w.ptd", seg.file_offset, n, 40 + i) is None
    assert not any((fs / f"{k}.bin").exists() for k in sizes)


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_safetensors_clone_ready_order_clones_every_whole_block_tensor(mount, kind):
    """Within the format (contiguous data): whole-block tensors first, each on 4 KiB."""
    import numpy as np
    from safetensors.numpy import load_file

    from filecord.safetensors import build_file, read_safetensors
    from filecord.tensors import DType, NamedTensor

    fs = mount(kind, 512 * MiB)
    shapes = {"w1": (1024, 64), "b1": (1024,), "w2": (256, 1024), "b2": (256,), "norm": (10,)}
    arrays = {}
    tensors = []
    for i, (name, shape) in enumerate(shapes.items()):
        arrays[name] = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        path = fs / f"{name}.bin"
        path.write_bytes(arrays[name].tobytes())
        tensors.append(NamedTensor(name, DType.F32, shape, FileBackedData(path, owned=True)))
    report = filecord.save(fs / "m.safetensors", build_file(tensors, order="clone_ready"),
                           consume=True)

    acts = {os.path.basename(a.source or ""): (a.action, a.tail)
            for a in report.file_actions()}
    # b1, w1, w2 fill whole blocks; b2 is the first of the rest (aligned start, ends its
    # source: cloned whole); norm starts mid-block: no clone possible, so it is moved.
    assert acts == {"b1.bin": ("cloned", 0), "w1.bin": ("cloned", 0), "w2.bin": ("cloned", 0),
                    "b2.bin": ("cloned", 0), "norm.bin": ("moved", 0)}
    assert report.bytes_copied == 0
    assert report.bytes_moved == 40
    f = read_safetensors(fs / "m.safetensors")
    assert f.data_start % B == 0  # type: ignore[union-attr]
    loaded = load_file(str(fs / "m.safetensors"))
    assert set(loaded) == set(arrays)
    for name, arr in arrays.items():
        assert np.array_equal(loaded[name], arr), name
    assert not any((fs / f"{n}.bin").exists() for n in shapes)


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_a_presized_temp_copies_the_partial_block_instead_of_failing(mount, kind, monkeypatch):
    """Should a temp ever be presized before the fill, the kernel would refuse the partial EOF
    block mid-file (EINVAL); the fill sees the temp's size first, clones the body and copies
    the tail, and says why."""
    from filecord._txn import fill as _fill

    fs = mount(kind, 512 * MiB)
    n = 1 * MiB + 555
    src = fs / "a.bin"
    fskit.write_pattern(src, n, seed=50)
    real = _fill.create_outputs

    def presized(txn):  # type: ignore[no-untyped-def]
        real(txn)
        for fd, out in zip(txn.fds, txn.prep.plan.outputs, strict=True):
            os.ftruncate(fd, out.length)

    monkeypatch.setattr(_fill, "create_outputs", presized)
    small = fskit.pattern(51, 0, 700)  # shorter than a block: nothing but its partial block
    (fs / "b.bin").write_bytes(small)
    cord = Cord([bytes(B), FileBackedData(src, owned=True), _pad(n),
                 FileBackedData(fs / "b.bin", owned=True), _pad(700), b"trailer"])
    report = filecord.save(fs / "out.bin", cord, consume=True)
    a, b = report.file_actions()
    assert (a.action, a.tail, a.tail_reason) == ("cloned", 555, PAST_TAIL)
    assert (b.action, b.reason) == ("copied", PAST_TAIL)
    assert report.bytes_copied == 555 + 700
    assert fskit.mismatch(fs / "out.bin", B, n, 50) is None
    with open(fs / "out.bin", "rb") as f:
        f.seek(B + n)
        assert f.read() == _pad(n) + small + _pad(700) + b"trailer"
    assert not src.exists()
