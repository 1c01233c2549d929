"""Issue 3, matrix: which path a consuming save takes on each real file system, and its cost.

* XFS (reflink) and btrfs, clone-friendly layout (4096-aligned pieces): every file-backed piece
  is ``cloned``; no byte is copied (no copy call is made, and ``statvfs`` shows no new data).
* ext4: the owned source is ``moved``; an unowned one is copied "not owned" and left untouched.
* A source on tmpfs with the output on ext4: ``copied``, "another file system".

Each case checks the output byte for byte, and the sources afterwards: consumed owned sources
are gone, unowned ones hold exactly what they held (size, bytes and mtime).
"""

from __future__ import annotations

import os
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys

pytestmark = pytest.mark.root

MiB = fskit.MiB
OWNED, UNOWNED = 64 * MiB, 8 * MiB + 12345  # the unowned piece ends the output, unaligned
WINDOW = 16 * MiB


def _sync_used(path: Path) -> int:
    os.sync()
    return fskit.fs_used(path)


def _check_output(out: Path, header: bytes, parts: list[tuple[int, int]]) -> None:
    """``out`` is ``header`` then each (seed, size) pattern part, and nothing else."""
    assert out.stat().st_size == len(header) + sum(n for _s, n in parts)
    with open(out, "rb") as f:
        assert f.read(len(header)) == header
    offset = len(header)
    for seed, n in parts:
        assert fskit.mismatch(out, offset, n, seed) is None
        offset += n


def _sources(d: Path, owned_dir: Path | None = None) -> tuple[Path, Path, os.stat_result]:
    owned = (owned_dir or d) / "engine.bin"
    unowned = d / "shared.bin"
    fskit.write_pattern(owned, OWNED, seed=11)
    fskit.write_pattern(unowned, UNOWNED, seed=12)
    return owned, unowned, unowned.stat()


def _assert_untouched(path: Path, before: os.stat_result, seed: int, size: int) -> None:
    now = path.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    assert fskit.mismatch(path, 0, size, seed) is None


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_cow_file_systems_clone_and_copy_nothing(mount, kind):
    fs = mount(kind, 512 * MiB)
    owned, unowned, unowned_st = _sources(fs)
    header = fskit.pattern(10, 0, 4096)  # clone-friendly: every file-backed piece 4096-aligned
    cord = Cord([header, FileBackedData(owned, owned=True), FileBackedData(unowned)])

    sampler = fskit.Sampler(lambda: fskit.fs_used(fs))
    before = _sync_used(fs)
    with _sys.use(sampler):
        report = filecord.save(fs / "model.pte", cord, consume=True, window=WINDOW)
    after = _sync_used(fs)

    assert [(a.action, a.reason) for a in report.file_actions()] == [("cloned", None)] * 2
    assert sorted(n for n in sampler.clones if n != 4096) == [UNOWNED, OWNED]  # 4096: a probe
    assert "copy_file_range" not in sampler.calls
    assert "sendfile" not in sampler.calls
    # No data was written: at no sample (the last ones are right before the renames and the
    # source's unlink, with every source still in place) did the file system hold more than
    # the header, the journal and metadata beyond what it held before.
    assert sampler.peak - before < 4 * MiB, f"{kind}: {sampler.peak - before} bytes new"
    assert after - before < 4 * MiB  # the deleted source's extents live on in the output
    _check_output(fs / "model.pte", header, [(11, OWNED), (12, UNOWNED)])
    assert not owned.exists()
    _assert_untouched(unowned, unowned_st, 12, UNOWNED)

    # Contrast: an unaligned header makes the same pieces uncloneable; statvfs sees the copy.
    before = _sync_used(fs)
    report = filecord.save(fs / "copy.pte", Cord([b"x" * 100, FileBackedData(unowned)]))
    assert [a.action for a in report.file_actions()] == ["copied"]
    assert _sync_used(fs) - before >= UNOWNED


def test_ext4_moves_owned_and_copies_unowned(mount):
    fs = mount("ext4", 400 * MiB)
    owned, unowned, unowned_st = _sources(fs)
    header = fskit.pattern(10, 0, 1000)
    cord = Cord([header, FileBackedData(owned, owned=True), FileBackedData(unowned)])

    base = fskit.allocated(fs)
    sampler = fskit.Sampler(lambda: fskit.allocated(fs))
    with _sys.use(sampler):
        report = filecord.save(fs / "model.pte", cord, consume=True, window=WINDOW)

    assert [(a.action, a.reason) for a in report.file_actions()] == [
        ("moved", None), ("copied", "not owned")]
    # The temp is given its length once, before the fill, then one truncate per window.
    assert sampler.calls["ftruncate"] == 1 + OWNED // WINDOW
    # New disk at the peak: the header and the copied piece, plus one window held twice.
    assert sampler.peak - base <= len(header) + UNOWNED + WINDOW + 1 * MiB
    _check_output(fs / "model.pte", header, [(11, OWNED), (12, UNOWNED)])
    assert not owned.exists()
    _assert_untouched(unowned, unowned_st, 12, UNOWNED)


def test_source_on_tmpfs_is_copied_to_ext4_for_another_file_system(mount):
    fs = mount("ext4", 400 * MiB)
    ram = mount("tmpfs", 128 * MiB)
    owned, unowned, unowned_st = _sources(fs, owned_dir=ram)
    header = fskit.pattern(10, 0, 4096)
    cord = Cord([header, FileBackedData(owned, owned=True), FileBackedData(unowned)])

    report = filecord.save(fs / "model.pte", cord, consume=True, window=WINDOW)

    assert [(a.action, a.reason) for a in report.file_actions()] == [
        ("copied", "another file system"), ("copied", "not owned")]
    _check_output(fs / "model.pte", header, [(11, OWNED), (12, UNOWNED)])
    assert not owned.exists()  # owned and consumed: deleted at commit although copied
    assert list(ram.iterdir()) == []
    _assert_untouched(unowned, unowned_st, 12, UNOWNED)




@pytest.mark.parametrize(
    "kind",
    ["ext4", "xfs",
     "btrfs"],
)
def test_move_peak_is_data_plus_one_window_by_statvfs(mount, kind):
    fs = mount(kind, 1024 * MiB)
    size = 256 * MiB
    src = fs / "engine.bin"
    fskit.write_pattern(src, size, seed=13)
    header = fskit.pattern(10, 0, 1000)  # unaligned: nothing clones, the CoW systems move too
    before = _sync_used(fs)
    fd = os.open(src, os.O_RDONLY)
    try:
        largest = max(e.length for e in _sys.extents(fd, 0, size))
    finally:
        os.close(fd)
    sampler = fskit.Sampler(lambda: fskit.fs_used(fs))
    with _sys.use(sampler):
        report = filecord.save(fs / "model.pte", Cord([header, FileBackedData(src, owned=True)]),
                               consume=True, window=WINDOW)

    assert [a.action for a in report.file_actions()] == ["moved"]
    # The temp is presized once, then truncated once per window.
    assert sampler.calls["ftruncate"] == 1 + size // WINDOW
    _check_output(fs / "model.pte", header, [(13, size)])
    assert not src.exists()
    extra = sampler.peak - before
    # btrfs frees an extent only once no byte of it is referred to: the extent the cut is in
    # is held too (how large writeback made them varies with the machine's load)
    held = largest if kind == "btrfs" else 0
    assert extra <= WINDOW + MiB + held, f"{kind}: peak {1 + extra / size:.4f}x the data"
    assert extra <= report.peaks[0].needed  # and the plan said as much
