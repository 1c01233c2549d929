"""The fail-every-call loop of ``test_fault_points`` on a consuming save whose window shrank.

``statvfs`` reports just the free space the 4 MiB floor window needs, so the default 64 MiB
window shrinks to 4 MiB (checked on a first save), and a 9 MiB source moves in three windows
(``support.shrunk``).  Then ENOSPC (once and persistent) and short writes at every call must
end as in the other scenarios: rolled back byte-exact (by the save, or by ``recover`` once the
fault is cleared) before the commit point, finished after it.  The free space is measured once,
in the preflight: a file system that fills up later is this ENOSPC.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scenarios import trace_where
from support.shrunk import SHRUNK, tighten
from sweeps.test_fault_points import run_all, summarize


@pytest.fixture
def tight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    return tighten(tmp_path, monkeypatch)


@pytest.mark.parametrize(("kind", "persistent"), [
    ("enospc", False), ("enospc", True), ("short-write", False),
], ids=["enospc-once", "enospc-persist", "short-write-once"])
def test_fault_at_every_call_with_a_shrunk_window(
    tmp_path: Path, ram_ext4_path: Path, tight: int, kind: str, persistent: bool
) -> None:
    """On ext4 in RAM (``ram_ext4_path``), its calls asserted the same as under ``tmp_path``."""
    trace_where(SHRUNK.name, ram_ext4_path, tmp_path)
    tally = run_all(ram_ext4_path / "runs", SHRUNK.name, kind, persistent=persistent, cfr=True)
    assert not tally.failures, summarize(tally.failures)
    assert tally.points >= (60 if kind == "enospc" else 3)
    if kind == "enospc":
        assert sum(n for o, n in tally.outcomes.items() if o.startswith("rolled back")) >= 5
        assert sum(n for o, n in tally.outcomes.items() if o.startswith("finished")) >= 1
