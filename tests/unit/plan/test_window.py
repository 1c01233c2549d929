"""``_plan.window``: the sync window chosen from candidate peaks, with fake peaks (pure)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from filecord._plan import window
from filecord._plan.types import MiB, WindowChoice, size_text


@dataclass(frozen=True, slots=True)
class Peak:
    needed: int
    free: int
    fs_type: str = "ext4"

    @property
    def fits(self) -> bool:
        return self.needed <= self.free


def peaks(free: int, base: int = 100 * MiB) -> object:
    """Peaks of one file system: ``base`` plus the window held twice."""
    calls: list[int] = []

    def at(w: int) -> list[Peak]:
        calls.append(w)
        return [Peak(base + 2 * w, free)]
    at.calls = calls  # type: ignore[attr-defined]
    return at


def test_the_ladder_halves_the_default_down_to_the_floor() -> None:
    assert window.ladder(window.DEFAULT_WINDOW) == (64 * MiB, 32 * MiB, 16 * MiB, 8 * MiB, 4 * MiB)
    assert window.ladder(64 * MiB) == (64 * MiB,)  # asked, even if equal to the default
    assert window.ladder(3) == (3,)
    assert window.is_default(window.DEFAULT_WINDOW)
    assert not window.is_default(int(window.DEFAULT_WINDOW))


def test_a_window_that_fits_is_kept_and_asks_once() -> None:
    at = peaks(free=1 << 40)
    choice, got = window.choose(at, window.DEFAULT_WINDOW, moves=True)  # type: ignore[arg-type]
    assert choice == WindowChoice(64 * MiB, 64 * MiB, "default")
    assert got == [Peak(100 * MiB + 128 * MiB, 1 << 40)]
    assert at.calls == [64 * MiB]  # type: ignore[attr-defined]
    assert choice.note() is None


def test_without_moves_the_window_is_never_shrunk() -> None:
    choice, _ = window.choose(peaks(free=0), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                              moves=False)
    assert (choice.used, choice.why) == (64 * MiB, "default")


@pytest.mark.parametrize("want", [32, 16, 8, 4])
def test_the_default_shrinks_to_the_largest_rung_that_fits(want: int) -> None:
    free = 100 * MiB + 2 * want * MiB  # exactly enough for ``want``
    choice, got = window.choose(peaks(free), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                                moves=True)
    assert choice == WindowChoice(want * MiB, 64 * MiB, "shrunk", free, "ext4")
    assert got == [Peak(free, free)]
    assert choice.note() == (f"shrunk from 64 MiB to {want} MiB: {size_text(free)} free on ext4")


def test_when_even_the_floor_does_not_fit_the_floor_is_used_and_refused_later() -> None:
    free = 100 * MiB + 8 * MiB - 1
    choice, got = window.choose(peaks(free), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                                moves=True)
    assert (choice.used, choice.why) == (4 * MiB, "shrunk")
    assert not got[0].fits


def test_an_asked_window_is_kept_and_hints_at_the_default_that_would_fit() -> None:
    free = 100 * MiB + 2 * 16 * MiB
    choice, got = window.choose(peaks(free), 128 * MiB, moves=True)  # type: ignore[arg-type]
    assert choice == WindowChoice(128 * MiB, 128 * MiB, "asked", default_fits=16 * MiB)
    assert not got[0].fits
    choice, _ = window.choose(peaks(0), 128 * MiB, moves=True)  # type: ignore[arg-type]
    assert choice.default_fits is None  # nothing would fit: no hint


def test_a_run_below_the_floor_needs_the_same_at_every_rung_and_says_nothing() -> None:
    def flat(w: int) -> list[Peak]:
        return [Peak(10 * MiB, MiB)]  # the window does not change what is needed
    choice, _ = window.choose(flat, window.DEFAULT_WINDOW, moves=True)
    assert (choice.used, choice.why) == (64 * MiB, "default")


def test_the_tightest_file_system_is_the_one_named() -> None:
    def two(w: int) -> list[Peak]:
        return [Peak(2 * w, 40 * MiB, "xfs"), Peak(2 * w + MiB, 20 * MiB, "btrfs")]
    choice, _ = window.choose(two, window.DEFAULT_WINDOW, moves=True)
    assert (choice.used, choice.fs_type) == (8 * MiB, "btrfs")


def test_size_text() -> None:
    assert size_text(64 * MiB) == "64 MiB"
    assert size_text(MiB + MiB // 2) == "1.5 MiB"
    assert size_text(10_000) == "10000 bytes"


def test_the_ladder_grows_with_the_bytes_moved_up_to_the_cap() -> None:
    d = window.DEFAULT_WINDOW
    below = (64 * MiB, 32 * MiB, 16 * MiB, 8 * MiB, 4 * MiB)
    assert window.ladder(d, 0) == below
    assert window.ladder(d, 4608 * MiB - 1) == below  # 128 MiB would be over 1/36 of it
    assert window.ladder(d, 4608 * MiB) == (128 * MiB, *below)
    assert window.ladder(d, 10 * 1024 * MiB) == (256 * MiB, 128 * MiB, *below)
    assert window.ladder(d, 1 << 50) == (256 * MiB, 128 * MiB, *below)
    assert 256 * MiB == window.CAP
    assert window.ladder(128 * MiB, 1 << 50) == (128 * MiB,)  # asked: never grown


def test_the_default_grows_to_the_largest_rung_that_fits_with_a_window_to_spare() -> None:
    moved = 16 * 1024 * MiB  # rungs 256, 128 above the default
    # Room for 128 MiB twice over (the slack rule) but not for 256 MiB twice over.
    free = 100 * MiB + 2 * 256 * MiB
    at = peaks(free)
    choice, got = window.choose(at, window.DEFAULT_WINDOW, moves=True,  # type: ignore[arg-type]
                                moved=moved)
    assert choice == WindowChoice(128 * MiB, 64 * MiB, "grown", free, "ext4")
    assert got == [Peak(100 * MiB + 256 * MiB, free)]
    assert choice.note() == f"grown from 64 MiB to 128 MiB: {size_text(free)} free on ext4"
    roomy, _ = window.choose(peaks(1 << 40), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                             moves=True, moved=moved)
    assert (roomy.used, roomy.why) == (256 * MiB, "grown")


def test_without_room_to_grow_the_default_stays_and_says_nothing() -> None:
    free = 100 * MiB + 2 * 128 * MiB  # 128 MiB fits, but not with 128 MiB to spare
    choice, _ = window.choose(peaks(free), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                              moves=True, moved=1 << 40)
    assert (choice.used, choice.why, choice.note()) == (64 * MiB, "default", None)


def test_a_small_move_never_grows_the_window() -> None:
    choice, _ = window.choose(peaks(1 << 50), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                              moves=True, moved=4 * 1024 * MiB)
    assert (choice.used, choice.why) == (64 * MiB, "default")


@pytest.mark.parametrize(("moved", "rungs"), [
    (1, (16, 8, 4)), (576 * MiB, (16, 8, 4)), (1024 * MiB, (28, 16, 8, 4)),
    (2047 * MiB, (56, 32, 16, 8, 4)), (2304 * MiB - 1, (60, 32, 16, 8, 4)),
    (2304 * MiB, (64, 32, 16, 8, 4)),
])
def test_below_the_default_the_base_is_a_36th_of_the_move_in_whole_4_mib(
        moved: int, rungs: tuple[int, ...]) -> None:
    assert window.ladder(window.DEFAULT_WINDOW, moved) == tuple(r * MiB for r in rungs)
    assert window.base(window.DEFAULT_WINDOW, moved) == rungs[0] * MiB
    assert window.base(64 * MiB, moved) == 64 * MiB  # asked: as is


def test_a_fitted_base_shrinks_like_the_default_when_the_disk_is_short() -> None:
    moved = 1024 * MiB  # fitted to 28 MiB
    fitted, _ = window.choose(peaks(1 << 40), window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                              moves=True, moved=moved)
    assert fitted == WindowChoice(28 * MiB, 64 * MiB, "fitted", moved=moved)
    free = 100 * MiB + 2 * 16 * MiB  # 16 MiB fits, 28 MiB does not
    at = peaks(free)
    choice, _ = window.choose(at, window.DEFAULT_WINDOW,  # type: ignore[arg-type]
                              moves=True, moved=moved)
    assert choice == WindowChoice(16 * MiB, 64 * MiB, "shrunk", free, "ext4")
    assert at.calls == [28 * MiB, 16 * MiB]  # type: ignore[attr-defined]


def test_an_asked_window_is_never_grown() -> None:
    choice, _ = window.choose(peaks(1 << 50), 64 * MiB, moves=True,  # type: ignore[arg-type]
                              moved=1 << 40)
    assert (choice.used, choice.why) == (64 * MiB, "asked")
