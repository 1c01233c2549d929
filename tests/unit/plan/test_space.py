"""``_plan.space``: the bytes a save needs at its worst instant, from plain values (pure)."""

from __future__ import annotations

import errno
from dataclasses import replace

import pytest

from filecord._plan import space
from filecord._plan.types import (
    FsFacts,
    MiB,
    MoveSource,
    OutputFacts,
    PieceAction,
    PieceRef,
    SavePlan,
    SourceFacts,
    WindowChoice,
)
from filecord.errors import InsufficientSpaceError

DEV, B = 7, 4096


def fs(free: int = 1 << 40, block: int = B) -> dict[int, FsFacts]:
    return {DEV: FsFacts(DEV, "ext4", free, can_clone=True, keeps_holes=True, block=block)}


def out(length: int, path: str = "/d/o", *, direct: bool = False) -> OutputFacts:
    return OutputFacts(path, path, DEV, length, direct)


def source(size: int, allocated: int = -1) -> dict[tuple[int, int], SourceFacts]:
    return {(DEV, 1): SourceFacts((DEV, 1), "/d/s", size, owned=True, symlink=False, nlink=1,
                                  regular=True, writable=True, allocated=allocated)}


def move(size: int, run_start: int = 0, *, adopt: bool = False) -> MoveSource:
    ref = PieceRef(0, 0, 0, size - run_start, (DEV, 1), run_start)
    return MoveSource((DEV, 1), "/d/s", size, run_start, (ref,), adopt)


def margin(files: int, data: int, *, journal: bool = False, dirs: int = 1) -> int:
    """The margin of ``files`` outputs in ``dirs`` directories (one lock file each), with the
    journal of one output and one move when ``journal``."""
    m = space.space_margin(files + dirs, data, B, journal=journal)
    if journal:
        m += -(-space.journal_bytes([out(data)], [move(data)], ()) // B) * B
    return m


def test_new_bytes_round_up_to_whole_blocks_per_output() -> None:
    outs = [out(1, "/d/a"), out(B + 1, "/d/b")]
    (peak,) = space.peaks_at(outs, [], [], {}, fs(), 64 * MiB)
    assert peak.needed == B + 2 * B + margin(2, B + 2)
    assert (peak.block, peak.margin, peak.fs_type) == (B, margin(2, B + 2), "ext4")


def test_the_block_is_the_file_systems() -> None:
    (peak,) = space.peaks_at([out(100)], [], [], {}, fs(block=64 * 1024), 64 * MiB)
    assert peak.needed == 64 * 1024 + space.space_margin(2, 100, 64 * 1024, journal=False)


def test_a_direct_output_needs_nothing() -> None:
    (peak,) = space.peaks_at([out(10 * B), out(10 * B, "/dev/x", direct=True)], [], [], {}, fs(),
                             64 * MiB)
    assert peak.needed == 10 * B + margin(1, 10 * B)


def test_only_whole_cloned_blocks_are_shared() -> None:
    n = 10 * B + 100
    clone = PieceAction("/d/o", 0, 0, n, "cloned", "/d/s", 0)
    (peak,) = space.peaks_at([out(n)], [clone], [], source(n), fs(), 64 * MiB)
    assert peak.needed == (11 * B - 10 * B) + margin(1, n)


def test_a_move_frees_its_run_and_holds_one_window_twice() -> None:
    n = 100 * B
    (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n), fs(), 8 * B)
    assert peak.needed == 8 * B + margin(1, n, journal=True)
    # a window off the block grid spans one block more (and each later one shares a block
    # with the one before it)
    (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n), fs(), 8 * B + 1)
    assert peak.needed == 9 * B + margin(1, n, journal=True)
    # a run shorter than the window holds only the run
    (peak,) = space.peaks_at([out(n)], [], [move(n, run_start=n - 2 * B)], source(n), fs(),
                             8 * B)
    assert peak.needed == (n - 2 * B) + 2 * B + margin(1, n, journal=True)


def test_a_sparse_source_frees_only_what_it_had_allocated() -> None:
    n = 100 * B
    # Its holes may be anywhere: counted as the first bytes cut (the worst case: the first
    # 12 windows write 96 blocks and free nothing, the 12th cut frees 6 of the 10).
    (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n, allocated=10 * B), fs(), 8 * B)
    assert peak.needed == 96 * B + margin(1, n, journal=True)


def test_an_adopted_file_allocates_nothing() -> None:
    n = 100 * B + 1
    (peak,) = space.peaks_at([out(n)], [], [move(n, adopt=True)], source(n), fs(), 8 * B)
    assert peak.needed == margin(1, n, journal=True)


def test_the_margin_per_file_and_per_started_128_mib() -> None:
    assert space.space_margin(1, 0, B, journal=False) == 2 * B
    assert space.space_margin(1, 1, B, journal=False) == 3 * B
    assert space.space_margin(3, 128 * MiB + 1, B, journal=False) == (6 + 2) * B
    assert space.space_margin(1, 1, B, journal=True) == 5 * B


def plan_of(needed: int, free: int, choice: WindowChoice, consume_needed: int | None = None
            ) -> SavePlan:
    (peak,) = space.peaks_at([out(needed)], [], [], {}, fs(free), choice.used)
    if consume_needed is not None:
        peak = replace(peak, consume_needed=consume_needed)
    return SavePlan((out(needed),), (), (), (), (peak,), consume=False, window=choice.used,
                    window_choice=choice)


def test_check_space_passes_a_plan_that_fits_and_refuses_one_that_does_not() -> None:
    asked = WindowChoice(64 * MiB, 64 * MiB, "default")
    space.check_space(plan_of(10 * B, 1 << 30, asked))
    with pytest.raises(InsufficientSpaceError) as caught:
        space.check_space(plan_of(10 * B, B, asked, consume_needed=B))
    text = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert "not enough free space on the ext4 file system holding /d/o" in text
    assert f"needs {10 * B + margin(1, 10 * B)} bytes at its peak" in text
    assert f"and {B} are free; consume=True would need {B}" in text


def test_the_refusal_names_the_smallest_window_or_the_default_that_would_fit() -> None:
    shrunk = WindowChoice(4 * MiB, 64 * MiB, "shrunk", B, "ext4")
    with pytest.raises(InsufficientSpaceError, match="with the smallest sync window, 4 MiB,"):
        space.check_space(plan_of(10 * B, B, shrunk))
    asked = WindowChoice(128 * MiB, 128 * MiB, "asked", default_fits=8 * MiB)
    with pytest.raises(InsufficientSpaceError,
                       match="window=134217728 was given: the default window would shrink to "
                             "8 MiB and fit"):
        space.check_space(plan_of(10 * B, B, asked))


def _interleaved(rows: int, row: int
                 ) -> tuple[list[MoveSource], dict[tuple[int, int], SourceFacts]]:
    """Two sources of ``rows`` rows each, their rows alternating in one output."""
    moves, sources = [], {}
    for k in (1, 2):
        dests = tuple(PieceRef(0, 2 * i + k - 1, (2 * i + k - 1) * row, row, (DEV, k), i * row)
                      for i in range(rows))
        moves.append(MoveSource((DEV, k), f"/d/s{k}", rows * row, 0, dests))
        sources[(DEV, k)] = SourceFacts((DEV, k), f"/d/s{k}", rows * row, owned=True,
                                        symlink=False, nlink=1, regular=True, writable=True)
    return moves, sources


def _replayed(filled: list[tuple[int, int]], moves: list[MoveSource], window: int) -> int:
    """The most blocks the save holds above where it started, replayed block by block with
    every allocated block in a set: the fill's ranges, then each move window by window from
    its source's end, the window's parts written, then the source cut below the window (a
    plain count, independent of ``space``)."""
    allocated = {b for at, n in filled for b in range(at // B, (at + n - 1) // B + 1)}
    freed, high = 0, len(allocated)
    for m in moves:
        pos = m.size
        while pos > m.run_start:
            lo = max(m.run_start, pos - window)
            for d in m.dests:
                a, e = max(d.src_offset, lo), min(d.src_offset + d.length, pos)
                if a < e:
                    at = d.out_offset + a - d.src_offset
                    allocated |= set(range(at // B, (at + e - a - 1) // B + 1))
            high = max(high, len(allocated) - freed)
            freed += -(-pos // B) - -(-lo // B)
            pos = lo
    return high


def _data(peak: object) -> int:
    return (peak.needed - peak.margin) // B  # type: ignore[attr-defined]


def test_the_first_of_two_interleaved_sources_holds_every_boundary_block() -> None:
    # Rows of 3 blocks and 100 bytes: the first source's moves write every block its rows
    # touch, the boundaries shared with the second's rows included, and free 3 per row; the
    # second's find their boundary blocks written: the disk stands about a block per row
    # above the end state after the first source.
    rows, row = 50, 3 * B + 100
    moves, sources = _interleaved(rows, row)
    outs = [out(2 * rows * row)]
    end = -(-2 * rows * row // B) - 2 * (rows * row // B)
    for window in (8 * B, 8 * B + 1, 64 * B, 1 << 30):
        (peak,) = space.peaks_at(outs, [], moves, sources, fs(), window)
        truth = _replayed([], moves, window)
        assert truth >= end + rows - 2  # the replay sees the boundary blocks
        # never under the truth; over it by at most a block per source (counted whole)
        assert truth <= _data(peak) <= truth + len(moves), window


def test_bytes_the_fill_writes_between_moved_runs_are_counted_before_the_moves() -> None:
    # 100-byte headers between sources of 2 blocks + 8: the fill writes the headers, and with
    # them the blocks they share with the sources, before the first move; each source then
    # allocates fewer blocks than it frees, so the first window is the highest instant.
    n, count = 2 * B + 8, 3
    refs, moves, sources, filled, at = [], [], {}, [], 0
    for k in range(count):
        refs.append(PieceRef(0, 2 * k, at, 100))
        filled.append((at, 100))
        ref = PieceRef(0, 2 * k + 1, at + 100, n, (DEV, k + 1), 0)
        refs.append(ref)
        moves.append(MoveSource((DEV, k + 1), f"/d/s{k}", n, 0, (ref,)))
        sources[(DEV, k + 1)] = SourceFacts((DEV, k + 1), f"/d/s{k}", n, owned=True,
                                            symlink=False, nlink=1, regular=True, writable=True)
        at += 100 + n
    acts = ["written", "moved"] * count
    shape = space.shape_of([out(at)], moves, refs=refs, acts=acts)
    assert shape[DEV].dirty == count  # each header its own range, holes between
    for window in (B, 4 * B):
        (peak,) = space.peaks_at([out(at)], [], moves, sources, fs(), window, shape)
        truth = _replayed(filled, moves, window)
        assert truth <= _data(peak) <= truth + len(moves), window
        # without the fill's blocks the prediction would miss the headers' blocks
        (blind,) = space.peaks_at([out(at)], [], moves, sources, fs(), window)
        assert _data(blind) < truth


def test_one_aligned_source_holds_exactly_one_window() -> None:
    n = 100 * B
    # 8 blocks; 8 blocks and a byte span 9; 3 blocks less 5 bytes span 3, and a later window
    # 4 (its first block holds the end of the window before, its last the start of the next)
    for window, blocks in ((8 * B, 8), (8 * B + 1, 9), (3 * B - 5, 4)):
        (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n), fs(), window)
        assert _data(peak) == _replayed([], [move(n)], window) == blocks, window


def test_the_journal_is_counted_on_its_first_outputs_file_system_with_its_bytes() -> None:
    other = 8
    outs = [out(10 * B, "/d/a"), OutputFacts("/e/b", "/e/b", other, 10 * B, False)]
    shapes = space.shape_of(outs, [], journaled=True, consumed=["/d/s"])
    assert shapes[DEV].journal == space.journal_bytes(outs, [], ["/d/s"]) > 0
    assert (shapes[other].journal, shapes[DEV].files, shapes[other].files) == (0, 1, 1)


def test_xfs_reserves_for_every_range_left_dirty() -> None:
    xfs = {DEV: FsFacts(DEV, "xfs", 1 << 40, can_clone=True, keeps_holes=True)}
    ext4 = fs()
    n = 100 * B
    (on_xfs,) = space.peaks_at([out(n)], [], [move(n)], source(n), xfs, 8 * B)
    (on_ext4,) = space.peaks_at([out(n)], [], [move(n)], source(n), ext4, 8 * B)
    # One range dirty at a time: the window's.
    assert on_xfs.needed - on_ext4.needed == space.XFS_BLOCKS_PER_RANGE * B
