"""Free-space preflight on real file systems (issues 2 and 3).

A save that cannot fit is refused before anything is created; with ``consume=True`` the
preflight counts the move's peak (one sync window), so a save that only fits by moving is let
through and really does fit.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from filecord.errors import InsufficientSpaceError

pytestmark = pytest.mark.root

MiB = fskit.MiB


def _listing(d: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in d.iterdir())


def test_tmpfs_too_small_is_refused_before_anything_is_created(mount, tmp_path):
    small = mount("tmpfs", 16 * MiB)
    (small / "keep.bin").write_bytes(b"k" * 4096)
    src = tmp_path / "blob.bin"  # on another file system: the tmpfs must take all of it
    fskit.write_pattern(src, 24 * MiB, seed=1)
    before = _listing(small)
    free_before = os.statvfs(small).f_bavail

    for cord in (Cord([b"h" * 100, FileBackedData(src)]), Cord([bytes(20 * MiB)])):
        predicted = filecord.plan(small / "out.bin", cord)
        assert [p.fits for p in predicted.peaks] == [False]
        with pytest.raises(InsufficientSpaceError) as info:
            filecord.save(small / "out.bin", cord)
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value, OSError)
        assert "tmpfs" in str(info.value)
        assert _listing(small) == before  # no output, no temp, no journal, no probe file
        assert os.statvfs(small).f_bavail == free_before

    # The same file system takes a save that fits: the refusal above was about size.
    report = filecord.save(small / "out.bin", Cord([b"h" * 100, FileBackedData(src, length=MiB)]))
    assert report.sizes == (100 + MiB,)
    assert (small / "out.bin").read_bytes() == b"h" * 100 + fskit.pattern(1, 0, MiB)
    assert fskit.mismatch(src, 0, 24 * MiB, seed=1) is None


def test_save_that_only_fits_by_moving_is_refused_as_copy_and_done_as_consume(mount):
    fs = mount("ext4", 300 * MiB)
    size, window, header = 160 * MiB, 16 * MiB, b"H" * 4000
    src = fs / "engine.bin"
    fskit.write_pattern(src, size, seed=2)
    free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
    # The layout this test needs: after the source, room for one window but not the data again.
    assert window + 2 * MiB < free < size

    copy_cord = Cord([header, FileBackedData(src, owned=True)])
    with pytest.raises(InsufficientSpaceError, match=r"; consume=True would need \d+$"):
        filecord.save(fs / "model.bin", copy_cord, window=window)
    assert sorted(p.name for p in fs.iterdir()) == ["engine.bin", "lost+found"]
    assert fskit.mismatch(src, 0, size, seed=2) is None

    cord = Cord([header, FileBackedData(src, owned=True)])
    predicted = filecord.plan(fs / "model.bin", cord, consume=True, window=window)
    assert [p.fits for p in predicted.peaks] == [True]
    sampler = fskit.Sampler(lambda: fskit.allocated(fs))
    base = fskit.allocated(fs) - src.stat().st_blocks * 512  # lost+found and the like
    with _sys.use(sampler):
        report = filecord.save(fs / "model.bin", cord, consume=True, window=window)
    sampler.sample()

    assert [a.action for a in report.file_actions()] == ["moved"]
    assert not src.exists()
    assert sorted(p.name for p in fs.iterdir()) == ["lost+found", "model.bin"]
    out = fs / "model.bin"
    assert out.stat().st_size == len(header) + size
    assert out.read_bytes()[: len(header)] == header
    assert fskit.mismatch(out, len(header), size, seed=2) is None
    # The temp is presized once, then truncated once per window.
    assert sampler.calls["ftruncate"] == 1 + size // window
    assert sampler.peak - base <= len(header) + size + window + MiB


def test_a_sparse_source_that_does_not_fit_is_refused_before_anything_moves(mount):
    # 64 MiB logical, 1 MiB of data, on a 32 MiB tmpfs: moving it would write the holes into
    # the temp as data, so the preflight counts the logical size and refuses up front.
    small = mount("tmpfs", 32 * MiB)
    src = small / "sparse.bin"
    with open(src, "wb") as f:
        f.truncate(64 * MiB)
        f.seek(10 * MiB)
        f.write(os.urandom(MiB))
    original = src.read_bytes()
    before = _listing(small)
    cord = Cord([b"h" * 100, FileBackedData(src, owned=True)])
    assert [p.fits for p in filecord.plan(small / "out.bin", cord, consume=True).peaks] == [False]
    with pytest.raises(InsufficientSpaceError):
        filecord.save(small / "out.bin", cord, consume=True)
    assert _listing(small) == before
    assert src.read_bytes() == original
    assert os.stat(src).st_blocks * 512 < 2 * MiB  # still sparse: nothing was written into it
