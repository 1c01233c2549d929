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


def margin(files: int, data: int, *, journal: bool = False) -> int:
    return space.space_margin(files, data, B, journal=journal)


def test_new_bytes_round_up_to_whole_blocks_per_output() -> None:
    outs = [out(1, "/d/a"), out(B + 1, "/d/b")]
    (peak,) = space.peaks_at(outs, [], [], {}, fs(), 64 * MiB)
    assert peak.needed == B + 2 * B + margin(2, B + 2)
    assert (peak.block, peak.margin, peak.fs_type) == (B, margin(2, B + 2), "ext4")


def test_the_block_is_the_file_systems() -> None:
    (peak,) = space.peaks_at([out(100)], [], [], {}, fs(block=64 * 1024), 64 * MiB)
    assert peak.needed == 64 * 1024 + space.space_margin(1, 100, 64 * 1024, journal=False)


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
    # a window off the block grid straddles one block more
    (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n), fs(), 8 * B + 1)
    assert peak.needed == 10 * B + margin(1, n, journal=True)
    # a run shorter than the window holds only the run
    (peak,) = space.peaks_at([out(n)], [], [move(n, run_start=n - 2 * B)], source(n), fs(),
                             8 * B)
    assert peak.needed == (n - 2 * B) + 2 * B + margin(1, n, journal=True)


def test_a_sparse_source_frees_only_what_it_had_allocated() -> None:
    n = 100 * B
    (peak,) = space.peaks_at([out(n)], [], [move(n)], source(n, allocated=10 * B), fs(), 8 * B)
    assert peak.needed == (n - 10 * B) + 8 * B + margin(1, n, journal=True)


def test_an_adopted_file_allocates_nothing() -> None:
    n = 100 * B + 1
    (peak,) = space.peaks_at([out(n)], [], [move(n, adopt=True)], source(n), fs(), 8 * B)
    assert peak.needed == margin(1, n, journal=True)


def test_the_margin_per_file_and_per_started_128_mib() -> None:
    assert margin(1, 0) == 2 * B
    assert margin(1, 1) == 3 * B
    assert margin(3, 128 * MiB + 1) == (6 + 2) * B
    assert margin(1, 1, journal=True) == 5 * B


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
