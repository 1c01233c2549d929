"""Issue 3, disk: a consuming save of 1 GiB on ext4 holds the data once plus one sync window.

The disk is measured from inside the save: a ``_sys`` backend sums ``st_blocks`` of every file
in the directory (sources, temps, journal) right before each ``ftruncate``, ``fsync``,
``rename`` and ``unlink``, and once after.  On ext4 ``st_blocks`` counts delayed allocations
too, so a sample is what the file system has promised, synced or not.  A plain copy, measured
the same way, holds the data twice: the contrast shows the measure sees what it should.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys

pytestmark = [pytest.mark.root, pytest.mark.slow]

MiB = fskit.MiB
GiB = 1 << 30
SIZE = GiB
WINDOW = 16 * MiB
HEADER = fskit.pattern(99, 0, 3000)  # unaligned on purpose: a move does not need alignment


def _save_measured(fs: Path, *, consume: bool) -> tuple[filecord.SaveReport, fskit.Sampler]:
    work = fs / ("consume" if consume else "copy")
    work.mkdir()
    src = work / "weights.bin"
    fskit.write_pattern(src, SIZE, seed=3)
    sampler = fskit.Sampler(lambda: fskit.allocated(work))
    sampler.sample("before")
    cord = Cord([HEADER, FileBackedData(src, owned=consume)])
    with _sys.use(sampler):
        report = filecord.save(work / "model.bin", cord, consume=consume, window=WINDOW)
    sampler.sample()
    out = work / "model.bin"
    assert out.stat().st_size == len(HEADER) + SIZE
    with open(out, "rb") as f:
        assert f.read(len(HEADER)) == HEADER
    assert fskit.mismatch(out, len(HEADER), SIZE, seed=3) is None
    assert src.exists() is not consume
    assert not any(p.name.endswith((".partial", ".filecord-journal")) for p in work.iterdir())
    shutil.rmtree(work)  # room for the next run
    return report, sampler


def test_consume_holds_data_once_plus_one_window_and_copy_holds_it_twice(mount):
    fs = mount("ext4", 3 * GiB)
    out_size = len(HEADER) + SIZE

    report, moved = _save_measured(fs, consume=True)
    assert [a.action for a in report.file_actions()] == ["moved"]
    # One ftruncate presizes the temp; then one per window, sampled at the window's fullest.
    assert moved.calls["ftruncate"] == 1 + SIZE // WINDOW
    assert report.fsyncs >= SIZE // WINDOW
    assert moved.peak <= out_size + WINDOW + MiB, (
        f"consume peak {moved.peak / MiB:.1f} MiB > output {out_size / MiB:.1f} MiB + window"
    )
    assert moved.peak >= SIZE  # the measure saw the data (it cannot be below it)

    report, copied = _save_measured(fs, consume=False)
    assert [a.action for a in report.file_actions()] == ["copied"]
    assert copied.peak >= 2 * SIZE  # source and complete temp, side by side
    print(f"\n1 GiB on ext4, window {WINDOW // MiB} MiB: consume peak "
          f"{moved.peak / SIZE:.4f}x the data, copy peak {copied.peak / SIZE:.4f}x")
