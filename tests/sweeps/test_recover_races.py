"""``recover`` racing a live save, at every call of the save (issue 14).

Right before the save's k-th ``_sys`` call, the hook runs ``recover`` on every directory the
save uses, in the same process through the real backend.  ``flock`` locks belong to the open
file description, so this ``recover`` contends with the save's lock exactly as another process
would.  What must hold at every k:

* ``recover`` reports the save, if it sees it at all, as ``skipped``, or refuses
  (``RecoverError``) without touching anything: a directory that holds only parked sources
  of the live save (no temp, so no lock file) is refused by design;
* it changes nothing: every name under the root keeps its inode and its bytes -- with one
  exception: in the instant between the save creating its lock file and locking it, the
  empty lock file may be removed, and the save must then fail cleanly (``SaveError``,
  nothing left behind, sources untouched);
* the save then completes with exactly the expected files, or (that one case) fails cleanly.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import filecord
from filecord._io import syscalls as _sys
from filecord.errors import RecoverError, SaveError
from support.faultfs import LOCK_SUFFIX, SimFS
from support.scenarios import SPECS, Layout, detach_all, trace_save

# Floors near the real counts (about 90% of the calls of each save against the v2 core).
FLOOR = {"consume3": 220, "copy3": 112, "single": 41, "adopt2": 107}


def state(lay: Layout) -> dict[str, tuple[int, bytes]]:
    """Every file under the root: relative name -> (inode, bytes)."""
    out: dict[str, tuple[int, bytes]] = {}
    for dirpath, _dirs, files in os.walk(lay.root):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, lay.root)] = (os.lstat(full).st_ino,
                                                    Path(full).read_bytes())
    return out


class RecoverRaces(SimFS):
    """The real system; right before call ``at``, ``recover`` runs on every directory."""

    def __init__(self, at: int, lay: Layout) -> None:
        super().__init__()
        self.at, self.lay = at, lay
        self.calls = 0
        self.results: list[filecord.Recovered] = []
        self.error: BaseException | None = None
        self.changed: dict[str, str] = {}

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls += 1
        if self.calls != self.at:
            return
        before = state(self.lay)
        with _sys.use(_sys.Backend()):
            try:
                self.results = self.lay.recover_all()
            except Exception as exc:
                self.error = exc
        after = state(self.lay)
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                self.changed[name] = ("removed" if name not in after else "created"
                                      if name not in before else "changed")
                if name in before and not before[name][1]:
                    self.changed[name] += " (empty)"


def run_point(lay: Layout, k: int) -> tuple[str, list[str]]:
    lay.create()
    cords, datas = lay.cords()
    race = RecoverRaces(k, lay)
    err: Exception | None = None
    try:
        with _sys.use(race):
            try:
                lay.run(cords)
            except Exception as exc:
                err = exc
    finally:
        detach_all(datas)
    problems: list[str] = []
    refused = isinstance(race.error, RecoverError)
    if race.error is not None and not refused:
        problems.append(f"recover raised {race.error!r}")
    empty_lock_removed = (
        len(race.changed) == 1
        and all(n.endswith(LOCK_SUFFIX) and what == "removed (empty)"
                for n, what in race.changed.items())
    )
    actions = Counter(r.action for r in race.results)
    if set(actions) - {"skipped"} - ({"discarded"} if empty_lock_removed else set()):
        problems.append(f"recover did {dict(actions)} to a live save")
    if race.changed and not empty_lock_removed:
        problems.append(f"recover touched the live save's files: {race.changed}")
    final = lay.classify()
    if err is None:
        if final != "done":
            problems.append(f"the save completed but left:\n{lay.describe()}")
        outcome = "completed" + (" (recover refused, touching nothing)" if refused else
                                  " (recover skipped it)" if actions else "")
    else:
        if not (empty_lock_removed and isinstance(err, SaveError)):
            problems.append(f"the save failed: {err!r}")
        if final != "pristine":
            problems.append(f"the save failed and left:\n{lay.describe()}")
        outcome = "failed cleanly (its new lock file was taken away)"
    return outcome, problems


@pytest.mark.slow
@pytest.mark.parametrize("spec_name", ["consume3", "copy3", "single", "adopt2"])
def test_recover_races_a_live_save_at_every_call(tmp_path: Path, spec_name: str) -> None:
    calls = trace_save(spec_name, tmp_path / "trace")
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for call in calls:
        lay = Layout(SPECS[spec_name], tmp_path / f"k{call.index}")
        outcome, problems = run_point(lay, call.index)
        outcomes[outcome] += 1
        if problems:
            failures.append(f"k={call.index} (before {call.op} {os.path.basename(call.path)}): "
                            + "; ".join(problems))
        else:
            shutil.rmtree(lay.root)
    n = len(calls)
    print(f"\n{spec_name}: recover raced the live save at {n - len(failures)}/{n} calls "
          f"without touching it ({dict(outcomes)})")
    assert not failures, "\n".join(failures[:15])
    assert n >= FLOOR[spec_name]
    assert outcomes["completed (recover skipped it)"] >= 5  # it did meet the save's lock
