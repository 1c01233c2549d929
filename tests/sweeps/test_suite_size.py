"""The sweeps assert their own size: a broken enumerator, a renamed file or a lost module
cannot pass by testing nothing.  Floors are the test functions each file defines today (the
parametrized cases and the points each sweep covers have floors of their own, in the files)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent

FLOORS = {
    "test_kill_points.py": 2,
    "test_power_cuts.py": 4,
    "test_recover_races.py": 1,
    "test_hostile_journals.py": 4,
    "test_shrunk_window_power_cuts.py": 1,
    "test_fault_points.py": 3,
    "test_second_party.py": 1,
    "test_gguf_fault_points.py": 1,
    "test_shrunk_window_faults.py": 1,
    "test_recover_acts_on_proof.py": 14,
    "test_second_party_at_each_instant.py": 6,
    "test_recover_after_tampering.py": 11,
    "test_clones_and_windows.py": 14,
    "test_looks_order_and_records.py": 13,
    "test_damaged_records.py": 1,
    "test_fsync_order.py": 12,
    "test_recover_guards.py": 5,
}


def _tests(path: Path) -> int:
    tree = ast.parse(path.read_text())
    return sum(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body)


def test_every_sweep_is_there_at_its_size() -> None:
    found = {p.name: _tests(p) for p in HERE.glob("test_*.py") if p.name != Path(__file__).name}
    missing = sorted(set(FLOORS) - set(found))
    assert not missing, f"sweeps gone: {missing}"
    short = {n: (found[n], f) for n, f in FLOORS.items() if found[n] < f}
    assert not short, f"sweeps below their floor (found, floor): {short}"
    assert sum(found.values()) >= sum(FLOORS.values())
