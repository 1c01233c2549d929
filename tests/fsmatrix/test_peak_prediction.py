"""The plan's predicted peak is an upper bound on the disk a consuming save really takes.

Each case fills a fresh file system until its free space (``statvfs``, as the plan reads it) is
exactly the plan's ``needed``, then saves with the same explicit window: the save must succeed,
the used space sampled through the ``_sys`` seam before every truncate, fsync, rename and
unlink must stay within ``needed``, and the output must hold every byte at its offset.

The shapes are the ones an earlier prediction missed (the session 31 attack): in-memory pieces
between moved files (the fill allocates the blocks they share with the moved runs before any
move; 40 files of 1 MiB behind 100-byte headers overshot by 46 blocks on ext4), two files'
row runs interleaved (the first file's runs allocate every boundary block, its truncations free
only whole blocks), and XFS, which reserves extent-tree blocks for every range written before
writeback (2.3 MiB beyond the data for the 40 files, before temps were presized before the
fill).
"""

from __future__ import annotations

import os
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from filecord._plan import space
from filecord._plan.plan import make_plan
from filecord._plan.preflight import gather, normalize

pytestmark = [pytest.mark.root]

MiB = fskit.MiB
WINDOW = 4 * MiB


def _headers_between(work: Path) -> tuple[list[object], list[tuple[int, int, int]]]:
    pieces: list[object] = []
    want = []
    at = 0
    for i in range(40):
        p = work / f"s{i}.bin"
        fskit.write_pattern(p, MiB, seed=i + 1)
        head = fskit.pattern(100 + i, 0, 100)
        pieces += [head, FileBackedData(p, owned=True)]
        want.append((at + 100, i + 1, MiB))
        at += 100 + MiB
    return pieces, want


def _rows_interleaved(work: Path) -> tuple[list[object], list[tuple[int, int, int]]]:
    row, rows = 12 * 1024 + 100, 200  # off the block grid
    for name, seed in (("a", 51), ("b", 52)):
        fskit.write_pattern(work / f"{name}.bin", row * rows, seed=seed)
    pieces: list[object] = []
    for k in range(rows):
        for name in ("a", "b"):
            pieces.append(FileBackedData(work / f"{name}.bin", offset=k * row, length=row,
                                         owned=True))
    return pieces, []



@pytest.mark.parametrize("kind", ["ext4", "xfs"])
@pytest.mark.parametrize("shape", [_headers_between, _rows_interleaved],
                         ids=["headers-between", "rows-interleaved"])
def test_a_save_fits_the_free_space_its_plan_asks_for(mount, kind, shape):
    fs = mount(kind, 512 * MiB)
    work = fs / "w"
    work.mkdir()
    pieces, want = shape(work)
    originals = {p: p.read_bytes() for p in work.iterdir()} if not want else {}
    cord = Cord(pieces)
    report = filecord.plan(work / "out.bin", cord, consume=True, window=WINDOW)
    assert {a.action for a in report.file_actions()} == {"moved"}
    (peak,) = report.peaks
    # the plan itself, for the journal's bound
    f = gather(normalize(work / "out.bin", cord), consume=True)
    plan = make_plan(f.outputs, f.refs, f.sources, f.filesystems, consume=True, window=WINDOW)
    outputs, moves = plan.outputs, plan.moves
    fskit.leave_free(fs, peak.needed)

    start = fskit.fs_used(fs)  # a change in used is the same change in free
    journal = [0]  # the longest the journal got

    def used() -> int:
        for p in work.iterdir():
            if p.name.endswith((".filecord-journal", ".filecord-pending")):
                journal[0] = max(journal[0], p.stat().st_size)
        return fskit.fs_used(fs) - start

    sampler = fskit.Sampler(used)
    with _sys.use(sampler):
        filecord.save(work / "out.bin", cord, consume=True, window=WINDOW)
    sampler.sample()
    assert 0 < journal[0] <= space.journal_bytes(outputs, moves, ())

    assert sampler.peak <= peak.needed, (
        f"{kind}: the save took {sampler.peak} bytes, the plan said {peak.needed} "
        f"({(sampler.peak - peak.needed) // peak.block} blocks over)")
    out = work / "out.bin"
    for offset, seed, size in want:
        assert fskit.mismatch(out, offset, size, seed) is None
    if originals:  # the interleaved rows, each at its place
        row = 12 * 1024 + 100
        a, b = originals[work / "a.bin"], originals[work / "b.bin"]
        data = out.read_bytes()
        assert len(data) == len(a) + len(b)
        for k in (0, 1, 99, 199):
            assert data[2 * k * row:(2 * k + 1) * row] == a[k * row:(k + 1) * row]
            assert data[(2 * k + 1) * row:(2 * k + 2) * row] == b[k * row:(k + 1) * row]
    assert sorted(p.name for p in work.iterdir()) == ["out.bin"]


@pytest.mark.parametrize("consume", [False, True], ids=["copy", "consume"])
@pytest.mark.parametrize(("n", "size"), [(1, 16 * MiB), (20, MiB)], ids=["one", "twenty"])
def test_clones_on_xfs_fit_the_free_space_their_plan_asks_for(mount, consume, n, size):
    # The session 32 attack: an XFS remap transaction reserves blocks for the extent and
    # reference-count trees it may split; with exactly the plan's need free, the clone of a
    # 16 MiB file behind a 4 KiB header failed ENOSPC (it fitted with 40 blocks more). The
    # session 33 attack: 20 clones with a header before each, one output: each header is a
    # range XFS reserves for, and it failed until those were counted.
    fs = mount("xfs", 320 * MiB)
    pieces: list[object] = []
    for i in range(n):
        fskit.write_pattern(fs / f"w{i}.bin", size, seed=32 + i)
        pieces += [fskit.pattern(7 + i, 0, 4096), FileBackedData(fs / f"w{i}.bin",
                                                                  owned=consume)]
    cord = Cord(pieces)
    report = filecord.plan(fs / "out.bin", cord, consume=consume)
    assert {a.action for a in report.file_actions()} == {"cloned"}
    (peak,) = report.peaks
    fskit.leave_free(fs, peak.needed)
    filecord.save(fs / "out.bin", cord, consume=consume)
    with open(fs / "out.bin", "rb") as f:
        for i in range(n):
            f.seek(i * (4096 + size))
            assert f.read(4096) == fskit.pattern(7 + i, 0, 4096)
            assert fskit.mismatch(fs / "out.bin", i * (4096 + size) + 4096, size,
                                  seed=32 + i) is None
    assert all((fs / f"w{i}.bin").exists() is not consume for i in range(n))


@pytest.mark.parametrize(("kind", "how"), [("xfs", "reflinked"), ("btrfs", "reflinked"),
                                           ("btrfs", "plain"), ("btrfs", "compressed")])
def test_a_move_that_frees_late_fits_the_free_space_its_plan_asks_for(mount, kind, how):
    # The session 32 attack: a source sharing its extents with another file (`cp --reflink`,
    # the default of coreutils 9 on XFS and btrfs) frees nothing as it is cut, and btrfs frees
    # an extent only when no byte of it is referred to; both moves ran out of space mid-move
    # at exactly the plan's need. The plan now counts what FIEMAP says the cuts give back.
    # The session 33 attack: a compressed source (btrfs) frees only its compressed bytes, and
    # FIEMAP and st_blocks give the uncompressed length.
    import subprocess

    fs = mount(kind, 320 * MiB)
    src = fs / "w.bin"
    size = 40 * MiB
    if how == "reflinked":
        fskit.write_pattern(fs / "orig.bin", size, seed=33)
        subprocess.run(["cp", "--reflink=always", str(fs / "orig.bin"), str(src)], check=True)
    elif how == "compressed":
        src.touch()
        subprocess.run(["btrfs", "property", "set", str(src), "compression", "zstd"],
                       check=True)
        with open(src, "wb") as f:  # compressible: the same 64 KiB over and over
            f.write(fskit.pattern(33, 0, 64 * 1024) * (size // (64 * 1024)))
    else:
        fskit.write_pattern(src, size, seed=33)
    os.sync()
    want = src.read_bytes()
    head = fskit.pattern(8, 0, 100)  # off the block grid: moved, not cloned
    cord = Cord([head, FileBackedData(src, owned=True)])
    report = filecord.plan(fs / "out.bin", cord, consume=True, window=WINDOW)
    assert [a.action for a in report.file_actions()] == ["moved"]
    (peak,) = report.peaks
    if how != "plain":
        assert peak.needed > size  # cutting a shared or compressed file frees (almost) nothing
    fskit.leave_free(fs, peak.needed)
    filecord.save(fs / "out.bin", cord, consume=True, window=WINDOW)
    assert (fs / "out.bin").read_bytes() == head + want
    assert not src.exists()
