"""Power cuts that lose unsynced data, at every destructive call of a save (support/powerfs.py).

The enumeration is the SIGKILL suite's: before each ``ftruncate``, ``rename``, ``unlink``,
``fsync`` and ``fsync_dir``, plus once after the save returned.  At each point the save is
stopped in-process, the real directories are rewritten into what the disk held (unsynced data
dropped, unsynced name operations undone), ``recover`` runs on the result, and the files must be
exactly pristine or exactly done, on the side of the commit point the crash fell (or done, for
a crash after the save returned).  This is the checker contract of ALICE: a crashed directory in,
a yes or no out.

Killing the process alone keeps the page cache, so it cannot see a missing fsync; this model
can, and ``test_model_catches_a_missing_fsync_before_truncate`` proves it on the fsync that
matters most (before ``move_source`` shortens a source).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import filecord
from filecord import _sys, transfer
from support.faultfs import Call, commit_bounds, commit_write, destructive_points
from support.powerfs import Crash, PowerFS
from support.scenarios import SPECS, Layout, detach_all, trace_save

PRISTINE = frozenset({"pristine", "pristine+garbage"})


def wanted(spec_name: str, calls: list[Call], point: Call | None, *, keep: bool) -> frozenset[str]:
    """The acceptable states for a crash right before ``point`` (None: after the save)."""
    if point is None:
        return frozenset({"done"})
    cw = commit_write(calls)
    if cw is None:
        # No journal: nothing is promised before the save returns (the rename may be undone
        # by the crash), only that the final name holds the old or the new file.
        return PRISTINE | {"done"}
    if keep:  # unsynced data reached the disk: the commit line counts once written
        return PRISTINE if point.index < cw else frozenset({"done"})
    last_pre, _first_post = commit_bounds(calls)  # the fsync that makes the commit line durable
    return PRISTINE if point.index <= last_pre else frozenset({"done"})


def crash_at(
    tmp_path: Path, spec_name: str, calls: list[Call], p: int, *, keep: bool
) -> tuple[str | None, str]:
    """Crash before destructive call ``p`` (past the end: after the save), recover, classify.

    Returns (state, description) where state is None for a violation.
    """
    points = destructive_points(calls)
    lay = Layout(SPECS[spec_name], tmp_path / f"p{p}")
    lay.create()
    cords, datas = lay.cords()
    fs = PowerFS(lay.dirs(), str(tmp_path / f"shadow{p}"), crash_at=p)
    crashed = False
    try:
        with _sys.use(fs):
            lay.run(cords)
    except Crash:
        crashed = True
    finally:
        detach_all(datas)  # a dead process runs no finalizer: never let one delete a source
    if crashed != (p <= len(points)):
        return None, f"crash point {p} of {len(points)}: crashed={crashed}"
    fs.apply_crash(keep_data=keep)
    point = points[p - 1] if p <= len(points) else None
    where = f"before {point.op} {point.path}" if point else "after the save returned"
    try:
        filecord.recover(lay.journal_dir)
    except filecord.RecoverError as exc:  # e.g. the bytes it must put back are gone
        return None, f"point {p} ({where}): recover failed: {exc}\n{lay.describe()}"
    state = lay.classify(allow_garbage=True)
    want = wanted(spec_name, calls, point, keep=keep)
    if state not in want:
        return None, f"point {p} ({where}): ended {state}, want {sorted(want)}\n{lay.describe()}"
    shutil.rmtree(lay.root)
    return state, where


def sweep(tmp_path: Path, spec_name: str, *, keep: bool) -> tuple[int, Counter[str], list[str]]:
    calls = trace_save(spec_name, tmp_path / "trace")
    n = len(destructive_points(calls)) + 1  # every destructive call, and after the save
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for p in range(1, n + 1):
        state, story = crash_at(tmp_path, spec_name, calls, p, keep=keep)
        if state is None:
            failures.append(story)
        else:
            outcomes[state] += 1
    return n, outcomes, failures


@pytest.mark.parametrize("keep", [False, True], ids=["drop-unsynced", "keep-unsynced"])
@pytest.mark.parametrize("spec_name", ["consume3", "copy3", "single"])
def test_power_cut_at_every_destructive_call(tmp_path: Path, spec_name: str, keep: bool) -> None:
    n, outcomes, failures = sweep(tmp_path, spec_name, keep=keep)
    flavor = "kept" if keep else "dropped"
    print(f"\n{spec_name}: power cut (unsynced data {flavor}, unsynced names undone) at "
          f"{n - len(failures)}/{n} points recovered all-or-nothing ({dict(outcomes)})")
    assert not failures, "\n".join(failures)
    assert n >= 4


@contextmanager
def fsync_skipped_inside_move_source(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The mutation: ``Counters.fsync`` does nothing while ``move_source`` runs (the seed PR's
    original bug F3: truncate the source before the copy is durable)."""
    real_move = transfer.move_source
    real_fsync = transfer.Counters.fsync

    def no_fsync(self: transfer.Counters, fd: int) -> None:
        return None

    def move_without_fsync(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(transfer.Counters, "fsync", no_fsync)
        try:
            real_move(*args, **kwargs)
        finally:
            monkeypatch.setattr(transfer.Counters, "fsync", real_fsync)

    monkeypatch.setattr(transfer, "move_source", move_without_fsync)
    yield


def test_model_catches_a_missing_fsync_before_truncate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the fsync before each truncate, the lost-data model must find lost bytes."""
    with fsync_skipped_inside_move_source(monkeypatch):
        n, outcomes, failures = sweep(tmp_path, "consume3", keep=False)
    print(f"\nconsume3 with move_source's fsync removed: {len(failures)}/{n} crash points "
          f"lose data or leave a mix ({dict(outcomes)} still fine)")
    assert len(failures) >= 3
