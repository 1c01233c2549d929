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
from filecord import Cord, FileBackedData, _plan

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
    assert (a.action, a.tail, a.tail_reason) == ("cloned", 1000, _plan.MID_TAIL)
    assert (b.action, b.tail) == ("cloned", 0)
    assert report.bytes_copied == 1000  # the tail, and nothing else
    assert report.bytes_cloned == first - 1000 + size - 2 * MiB - B
    assert report.copy_reasons() == {_plan.MID_TAIL: 1000}
    out = fs / "out.bin"
    assert out.read_bytes()[:B] == bytes(B)
    assert fskit.mismatch(out, B, first, 31) is None
    with open(out, "rb") as f:
        f.seek(B + first)
        assert f.read(-first % B) == bytes(-first % B)
        tail = f.read()
    assert tail == fskit.pattern(31, 2 * MiB + B, size - 2 * MiB - B)
    assert not src.exists()
