"""A consuming save whose default window shrinks: a 9 MiB source behind ``statvfs`` that reports
only what the 4 MiB floor window needs (shared by the fault and crash sweeps)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import filecord
from filecord._io import syscalls as _sys
from support.scenarios import SPECS, Layout, Ref, Spec, Src, detach_all

MiB = 1 << 20

SHRUNK = Spec(
    name="shrunk1",
    consume=True,
    window=filecord.DEFAULT_WINDOW,  # left at the default: it may shrink
    single=False,
    sources={"A": Src("src dir/A.bin", 9 * MiB + 123, 41, owned=True)},
    outputs=(
        ("out/model.ptd", (Ref(data=b"HEAD"), Ref("A"), Ref(data=b"end"))),
        ("out/small.bin", (Ref(data=b"x" * 100),)),
    ),
)


def _floor_needs(root: Path) -> int:
    lay = Layout(SHRUNK, root)
    lay.create()
    cords, datas = lay.cords()
    try:
        plan = filecord.plan(dict(cords), consume=True, window=4 * MiB)
    finally:
        detach_all(datas)
    (peak,) = plan.peaks
    return peak.needed


def tighten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make every backend's statvfs report the floor's need free, register the spec, and
    check that a save of it really shrinks its window; returns the bytes reported free."""
    need = _floor_needs(tmp_path / "probe")
    real = _sys.Backend.statvfs

    def statvfs(self: _sys.Backend, path: str) -> Any:
        v = real(self, path)
        fields = list(v)
        fields[4] = need // v.f_frsize + 1  # f_bavail: a block of slack, no more
        return os.statvfs_result(fields)

    monkeypatch.setattr(_sys.Backend, "statvfs", statvfs)
    monkeypatch.setitem(SPECS, SHRUNK.name, SHRUNK)
    lay = Layout(SHRUNK, tmp_path / "check")
    lay.create()
    cords, datas = lay.cords()
    report = lay.run(cords)
    detach_all(datas)
    assert report.window == 4 * MiB, report.window
    assert report.window_note is not None
    assert report.window_note.startswith("shrunk from 64 MiB to 4 MiB")
    return need
