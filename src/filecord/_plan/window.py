"""The sync window of a consuming save: the one asked for, or the largest that fits (pure).

A move holds one window of bytes twice (in the temps, fsynced, and still in the source) before
it truncates the source, so the window is the one part of a consuming save's peak disk the save
may choose.  Bigger windows mean fewer fsyncs and extents; smaller ones need less free space.

* ``window=`` left at its default (:data:`DEFAULT_WINDOW`, an ``int`` marked as the default):
  the plan takes the largest window of the ladder (:func:`ladder`) with which every file
  system's predicted peak fits its free space: from :data:`CAP` down through the base
  (:func:`base`: 64 MiB, or 1/:data:`SHARE` of the bytes moved when that is less) and the
  powers of two below it to :data:`FLOOR`.  Only when even the floor does not fit is the
  save refused, and the message says what the floor needs.
* ``window=`` passed explicitly (any ``int`` that is not the marked default, even one equal
  to it): used as is; a save that does not fit is refused, and the message says whether the
  default would have fit.

Fitting the base to the data.  A move's peak is the data plus one window (the window is the
only part held twice), so a window of 1/:data:`SHARE` of the bytes moved keeps the peak at
1.03x the data or under (1/36 is 2.8%; the metadata margin is far under the rest).  From
2.25 GiB moved that is the 64 MiB default; below, the base is that share in whole 4 MiB
(block-aligned on any file system whose block is at most 4 MiB), and never less than
:data:`LOW`, 16 MiB: below 576 MiB moved the window adds at most 16 MiB rather than a share.
Measured (bench/consume_window.py, 1 GiB on root ext4, write-behind on, 5 rounds, copy +
unlink 1.30 s): 16 MiB 1.19x the copy's time, peak 1.016x; 24 MiB 1.04x, 1.023x; 28 MiB (the
base at 1 GiB) 0.93x, 1.027x; 32 MiB 0.89x, 1.031x; 64 MiB 0.76x, 1.063x.  The windows
shrink the time's lead over a copy, not below it, down to 28 MiB; 16 MiB is where the fsyncs
start to cost more than the copy's second write (so the fitted base stops there).  One
window serves every file system of a save, so "the bytes moved" are those moved on the file
system that moves least (a save moving 4 GiB on one and 100 MiB on another holds its window on
both: fitted to the first, the second's peak would grow by 64 MiB).

Growing (rungs above the base).  A rung above 64 MiB is on the ladder only while it is at most
1/:data:`SHARE` of the bytes the save moves, so a grown window adds at most 2.8% of the data
to the peak (the target is 1.03x, metadata margin included; 1/32 measured 1.0313x at 4 GiB),
and a large move holds fewer windows, fsyncs and extents (16 GiB in 64 MiB windows: 256
fsyncs; in 256 MiB windows: 64; at 4 GiB, one round on the busy machine: 128 MiB windows 40
fsyncs and 1.08x the copy, 64 MiB 72 fsyncs and 1.51x, 256 MiB 24 and 1.41x).  A grown
rung is taken only where the free space also holds one more window of the same size (the
peaks at twice the rung fit): it never takes the last of the disk, which something else
writing meanwhile may need; the base and the rungs below it keep the rule they always had.

Why a :data:`CAP` of 256 MiB: the measured point where a move costs a copy (research notes,
2 GiB on ext4: a move in 256 MiB windows back to front 1.99 s, the fastest plain copy 1.98 s;
64 MiB-per-fsync writes 1.51x a single final fsync, 256 MiB 1.46x), and no larger window
measured faster (bench/consume_window.py at 1 GiB on the shared 2-core machine, 3 rounds:
256 MiB and 1024 MiB both 1.25x the copy, 64 MiB 1.00x, within its noise; docs/benchmarks.md),
while each window is also dirty page cache held before its fsync.  It is one
``copy_file_range`` segment of the transfer, too.

Why halving, not the exact largest block multiple that fits: free space is measured once, in
the preflight; a window of at most the free space minus everything else would leave no slack
at all for anything else writing meanwhile, while a power of two leaves up to half a window of
it, costs at most twice the fsyncs of the exact fit, and keeps every window block-aligned on any
file system whose block is at most 4 MiB.

Why a 4 MiB floor (bench/consume_window.py, docs/benchmarks.md: 4 GiB on ext4, 8 MiB window
517 fsyncs and 4.80 s, 64 MiB window 69 fsyncs and 3.57 s, copy 5.59 s; and at 1 GiB on a
busy 2-core machine, 2 rounds: 4 MiB 263 fsyncs, 119 extents, 1.52x a copy's time, 8 MiB
1.46x, 64 MiB 1.20x, peak 1.004x the data): 4 MiB is 256 windows per GiB, so at most 256
fsyncs and 256 extents per GiB, at most about 1.5x the time of a copy that needs the data's
space twice; each halving below it doubles the fsyncs again for half a window of disk.
It also keeps the extent metadata inside the space check's margin, which
allows one block per started 128 MiB of data (8 blocks, 32 KiB, per GiB): 256 ext4 extents
(12 bytes each) fit one 4 KiB block, 256 XFS extent records (16 bytes) one or two, btrfs file
extent items (~70 bytes with their keys) about 18 KiB.  The journal does not grow with the
number of windows (it records the window size once); the crash and fault points grow with it
linearly, as they do for an explicit small window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from filecord._plan.types import MiB, WindowChoice, WindowWhy

FLOOR = 4 * MiB
CAP = 256 * MiB  # the largest window the default grows to (see the module's docstring)
SHARE = 36  # the default window is at most 1/SHARE of the bytes moved (above LOW)
LOW = 16 * MiB  # the smallest window the default is fitted down to by the data alone


class _DefaultWindow(int):
    """The default window's value, marked: a save left at it may shrink it to fit."""

    __slots__ = ()


# picked by bench/consume_window.py (docs/benchmarks.md); a save left at it adapts (above)
DEFAULT_WINDOW: int = _DefaultWindow(64 * MiB)


def is_default(window: int) -> bool:
    """Whether ``window`` is the default left in place (not a number the caller chose)."""
    return isinstance(window, _DefaultWindow)


def base(window: int, moved: int = 0) -> int:
    """The rung a save takes when its free space does not decide: ``window`` when asked
    for, or when the save moves nothing (``moved`` 0: no window is held); for the default,
    1/:data:`SHARE` of ``moved`` in whole 4 MiB (at least :data:`LOW`) while that is below
    the default, else the default."""
    if not is_default(window) or moved <= 0:
        return int(window)
    fit = max(LOW, moved // SHARE // FLOOR * FLOOR)
    return min(int(window), fit)


def ladder(window: int, moved: int = 0) -> tuple[int, ...]:
    """The windows a save may use, largest first: for the default, doublings of it up to
    :data:`CAP` while at most 1/:data:`SHARE` of ``moved`` bytes, then its :func:`base` and
    the powers of two below it down to the floor; only ``window`` itself when it was asked
    for."""
    if not is_default(window):
        return (int(window),)
    grown: list[int] = []
    w = int(window) * 2
    while w <= CAP and w * SHARE <= moved:
        grown.append(w)
        w *= 2
    steps = [*reversed(grown), base(window, moved)]
    below = FLOOR
    while below * 2 < steps[-1]:
        below *= 2
    while below >= FLOOR and below < steps[-1]:
        steps.append(below)
        below //= 2
    return tuple(steps)


class PeakLike(Protocol):
    @property
    def fits(self) -> bool: ...
    @property
    def free(self) -> int: ...
    @property
    def fs_type(self) -> str: ...
    @property
    def needed(self) -> int: ...


P = TypeVar("P", bound=PeakLike)


def choose(
    peaks_for: Callable[[int], Sequence[P]], window: int, *, moves: bool, moved: int = 0,
    moved_on: str | None = None,
) -> tuple[WindowChoice, Sequence[P]]:
    """The largest window of :func:`ladder` whose peaks all fit, and those peaks.

    ``moved``: the bytes the save moves on the file system that moves least (what the window
    is fitted to and a grown window is measured against: the one window is held on every file
    system); ``moved_on``: that file system's type, when the save moves on several.  Without
    moves the window allocates nothing: it is kept as asked.  A rung above the default is
    taken only where the peaks at twice it fit too (one window of slack).  When no window
    fits, the smallest is used (the plan is refused with its peaks), unless it needs no less
    than the first (a run shorter than the floor): then nothing shrank and nothing is said.
    """
    asked = int(window)
    why: WindowWhy = "default" if is_default(window) else "asked"
    if not moves:
        return WindowChoice(asked, asked, why), peaks_for(asked)
    steps = ladder(window, moved)
    for w in steps:
        if w <= asked:
            break
        peaks = peaks_for(w)
        if all(p.fits for p in peaks) and all(p.fits for p in peaks_for(2 * w)):
            tight = min(peaks, key=lambda p: p.free - p.needed)
            return WindowChoice(w, asked, "grown", tight.free, tight.fs_type), peaks
    start = base(window, moved if moves else 0)
    first = peaks_for(start)
    if all(p.fits for p in first):
        if start < asked:
            return WindowChoice(start, asked, "fitted", fs_type=moved_on, moved=moved), first
        return WindowChoice(asked, asked, why), first
    below = [w for w in steps if w < start]
    last, tight = first, _tightest(first)
    for w in below:
        peaks = peaks_for(w)
        if all(p.fits for p in peaks):
            return WindowChoice(w, asked, "shrunk", tight.free, tight.fs_type), peaks
        last, tight = peaks, _tightest(peaks)
    if why == "asked":
        hint = None
        for w in ladder(DEFAULT_WINDOW, moved):
            if all(p.fits for p in peaks_for(w)):
                hint = w
                break
        return WindowChoice(asked, asked, why, default_fits=hint), first
    if [p.needed for p in last] == [p.needed for p in first]:
        if start < asked:
            return WindowChoice(start, asked, "fitted", fs_type=moved_on, moved=moved), first
        return WindowChoice(asked, asked, why), first
    return WindowChoice(steps[-1], asked, "shrunk", tight.free, tight.fs_type), last


def _tightest(peaks: Sequence[P]) -> P:
    """The file system that does not fit, by the most bytes."""
    return max((p for p in peaks if not p.fits), key=lambda p: p.needed - p.free)
