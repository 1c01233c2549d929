"""A power cut before every destructive call of a consuming save whose default window shrank.

The sweep of ``test_power_cuts`` (a power cut before every destructive call, then ``recover``:
all or nothing) on ``support.shrunk``'s save: ``statvfs`` reports only what the 4 MiB floor
window needs, so the default window shrinks to 4 MiB and the 9 MiB source moves in three
windows, each a copy, an fsync and a truncate recorded with the 4 MiB window in the journal.
The number of crash points grows with the windows (a few per window), not with the bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.shrunk import SHRUNK, tighten
from sweeps.test_power_cuts import MODES, sweep


@pytest.mark.parametrize("mode", list(MODES))
def test_power_cut_at_every_destructive_call_with_a_shrunk_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    tighten(tmp_path, monkeypatch)
    n, outcomes, failures = sweep(tmp_path, SHRUNK.name, mode=mode)
    print(f"\n{SHRUNK.name}: power cut ({mode}) at {n - len(failures)}/{n} points recovered "
          f"all-or-nothing ({dict(outcomes)})")
    assert not failures, "\n".join(failures)
    assert n >= 25  # 29 when written: three windows, not 64 MiB of points
    assert outcomes["pristine"] >= 2
    assert outcomes["done"] >= 2
