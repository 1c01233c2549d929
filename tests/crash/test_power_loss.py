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
from support.faultfs import RECOVER_OPS, Call, commit_bounds, commit_write, destructive_points
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


def recover_and_judge(
    lay: Layout, want: frozenset[str], shadow: Path, *, keep: bool, recover_at: int | None = None
) -> tuple[str | None, str, bool]:
    """Recover (crashing it before its ``recover_at``-th destructive call, then recovering
    again), and classify.  Returns (state or None for a violation, story, recovery crashed).
    """
    crashed = False
    try:
        if recover_at is not None:
            fs = PowerFS(lay.dirs(), str(shadow), crash_at=recover_at, ops=RECOVER_OPS)
            try:
                with _sys.use(fs):
                    filecord.recover(lay.journal_dir)
            except Crash:
                crashed = True
                fs.apply_crash(keep_data=keep)
        filecord.recover(lay.journal_dir)
    except filecord.RecoverError as exc:  # e.g. the bytes it must put back are gone
        return None, f"recover failed: {exc}\n{lay.describe()}", crashed
    state = lay.classify(allow_garbage=True)
    if state not in want:
        return None, f"ended {state}, want {sorted(want)}\n{lay.describe()}", crashed
    return state, "", crashed


def crash_at(
    tmp_path: Path, spec_name: str, calls: list[Call], p: int, *, keep: bool,
    recover_at: int | None = None,
) -> tuple[str | None, str, bool]:
    """Crash before destructive call ``p`` (past the end: after the save), recover, classify.

    Returns (state, story, recovery crashed) where state is None for a violation.
    """
    points = destructive_points(calls)
    lay = Layout(SPECS[spec_name], tmp_path / f"p{p}")
    lay.create()
    cords, datas = lay.cords()
    shadow = tmp_path / f"shadow{p}"
    fs = PowerFS(lay.dirs(), str(shadow), crash_at=p)
    crashed = False
    try:
        with _sys.use(fs):
            lay.run(cords)
    except Crash:
        crashed = True
    finally:
        detach_all(datas)  # a dead process runs no finalizer: never let one delete a source
    if crashed != (p <= len(points)):
        return None, f"crash point {p} of {len(points)}: crashed={crashed}", False
    fs.apply_crash(keep_data=keep)
    point = points[p - 1] if p <= len(points) else None
    where = f"point {p} (before {point.op} {point.path})" if point else "after the save returned"
    if recover_at is not None:
        where += f", recovery crashed before its call {recover_at}"
    want = wanted(spec_name, calls, point, keep=keep)
    state, story, rcrashed = recover_and_judge(lay, want, shadow, keep=keep, recover_at=recover_at)
    if state is not None:
        shutil.rmtree(lay.root)
    return state, f"{where}: {story}", rcrashed


def sweep(tmp_path: Path, spec_name: str, *, keep: bool) -> tuple[int, Counter[str], list[str]]:
    calls = trace_save(spec_name, tmp_path / "trace")
    n = len(destructive_points(calls)) + 1  # every destructive call, and after the save
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for p in range(1, n + 1):
        state, story, _ = crash_at(tmp_path, spec_name, calls, p, keep=keep)
        if state is None:
            failures.append(story)
        else:
            outcomes[state] += 1
    return n, outcomes, failures


@pytest.mark.parametrize("keep", [False, True], ids=["drop-unsynced", "keep-unsynced"])
@pytest.mark.parametrize("spec_name", ["consume3", "copy3", "single", "adopt2"])
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


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True], ids=["drop-unsynced", "keep-unsynced"])
def test_power_cut_during_recover(tmp_path: Path, keep: bool) -> None:
    """After each save crash point, cut the power again at each destructive call of recover."""
    calls = trace_save("consume3", tmp_path / "trace")
    n = len(destructive_points(calls)) + 1
    failures: list[str] = []
    points = 0
    for p in range(1, n + 1):
        j = 1
        while True:
            state, story, crashed = crash_at(tmp_path, "consume3", calls, p, keep=keep,
                                             recover_at=j)
            if state is None:
                failures.append(story)
            if not crashed:
                break  # recovery needed fewer than j destructive calls: all of them were hit
            points += 1
            j += 1
    print(f"\nconsume3: power cut during recover: {points - len(failures)}/{points} recovery "
          f"crash points (over {n} save crash points) recovered again all-or-nothing")
    assert not failures, "\n".join(failures[:20])
    assert points >= n


@pytest.mark.slow
def test_power_cut_during_rollback(tmp_path: Path) -> None:
    """Fail a call of the consuming save with EIO, then cut the power at each destructive call
    of the rollback it starts (and once after the failed save returned): recover must restore.
    """
    spec_name = "consume3"
    calls = trace_save(spec_name, tmp_path / "trace")
    last_pre, _first_post = commit_bounds(calls)
    # Faults from the journal's creation on: before it the rollback only removes temps.
    first_journal = next(c.index for c in calls if c.path.endswith(".filecord-journal"))
    failures: list[str] = []
    points = 0
    for k in range(first_journal, last_pre + 1):
        j = 1
        while True:
            lay = Layout(SPECS[spec_name], tmp_path / f"k{k}-j{j}")
            lay.create()
            cords, datas = lay.cords()
            shadow = tmp_path / f"shadow-k{k}-j{j}"
            fs = PowerFS(lay.dirs(), str(shadow), crash_at=j, ops=RECOVER_OPS, fault_at=k)
            crashed = False
            try:
                with _sys.use(fs):
                    lay.run(cords)
            except Crash:
                crashed = True
            except OSError:
                pass  # the rollback finished before the j-th call: the power fails afterwards
            finally:
                detach_all(datas)
            fs.apply_crash()
            state, story, _ = recover_and_judge(lay, PRISTINE, shadow, keep=False)
            points += 1
            if state is None:
                failures.append(f"EIO at call {k} ({calls[k - 1].op}), power cut before "
                                f"rollback call {j}: {story}")
            else:
                shutil.rmtree(lay.root)
            if not crashed:
                break
            j += 1
    print(f"\nconsume3: power cut during the rollback of a failed save: "
          f"{points - len(failures)}/{points} points (over {last_pre - first_journal + 1} "
          f"failed calls) recovered to the original sources")
    assert not failures, "\n".join(failures[:20])
    assert points >= 100
