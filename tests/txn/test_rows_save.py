"""Saves of pieces of rows (FileRows) and of runs of adjacent slices: exact bytes at exact
offsets, one action per piece in the report, the source's identity checked, batched copies."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, plan, save
from filecord._io import syscalls as _sys
from filecord._pieces.rows import FileRows
from filecord.errors import DataChangedError
from filecord_testing import pattern

ROW = 4096


class Count(_sys.Backend):
    """The real system; counts the calls, and may run ``on`` before the Nth of one kind."""

    def __init__(self, op: str = "", nth: int = 0, on: Any = None) -> None:
        self.calls: dict[str, int] = {}
        self.op, self.nth, self.on = op, nth, on

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if op == self.op and self.calls[op] == self.nth and self.on is not None:
            self.on()


def _src(tmp_path: Path, rows: int, name: str = "src.bin") -> tuple[Path, bytes]:
    data = pattern(rows * ROW + 100)
    p = tmp_path / name
    p.write_bytes(data)
    return p, data


def _perm(n: int) -> list[int]:
    # llama.cpp's rotary pair order over 2 heads: nothing adjacent
    d = n // 2
    return [h * d + j * (d // 2) + i for h in range(2) for i in range(d // 2) for j in range(2)]


def _want(data: bytes, base: int, order: list[int]) -> bytes:
    return b"".join(data[base + r * ROW: base + (r + 1) * ROW] for r in order)


@pytest.mark.parametrize("consume", [False, True])
def test_rows_saved_exactly_and_reported_as_one_piece(tmp_path: Path, consume: bool) -> None:
    src, data = _src(tmp_path, 16)
    whole = FileBackedData(src, owned=consume)
    order = _perm(16)
    rows = FileRows(whole.slice(100, 16 * ROW), ROW, order)
    head = whole.slice(0, 100)
    out = tmp_path / "out.bin"
    cord = Cord([b"hdr", head, rows, b"end"])
    planned = plan(out, cord, consume=consume)
    report = save(out, cord, consume=consume)
    assert out.read_bytes() == b"hdr" + data[:100] + _want(data, 100, order) + b"end"
    for r in (planned, report):
        assert len(r.actions) == 4  # one action for all 16 rows
        a = r.actions[2]
        assert (a.index, a.out_offset, a.length, a.src_offset) == (2, 103, 16 * ROW, 100)
        assert a.runs == 15
        assert r.actions[1].runs == 0
        assert a.action == ("moved" if consume else "copied")
        assert r.to_dict()["pieces"][2]["runs"] == 15  # type: ignore[index]
    assert src.exists() != consume
    if consume:
        assert report.bytes_moved == len(data)
        assert report.bytes_copied == 0
    else:
        assert report.bytes_copied == len(data)
        assert src.read_bytes() == data


def test_rows_below_a_gap_are_copied_with_the_reason(tmp_path: Path) -> None:
    src, data = _src(tmp_path, 8)
    whole = FileBackedData(src, owned=True)
    rows = FileRows(whole.slice(100, 4 * ROW), ROW, [3, 2, 1, 0])  # the file's end unused
    out = tmp_path / "out.bin"
    report = save(out, Cord([rows]), consume=True)
    assert out.read_bytes() == _want(data, 100, [3, 2, 1, 0])
    (a,) = report.actions
    assert a.action == "copied"
    assert a.reason is not None
    assert a.runs == 4
    assert report.bytes_copied == 4 * ROW


def test_a_source_changed_during_the_rows_copy_is_refused(tmp_path: Path) -> None:
    src, _data = _src(tmp_path, 8)
    rows = FileRows(FileBackedData(src).slice(100, 8 * ROW), ROW, _perm(8))
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def rewrite() -> None:
        with open(src, "r+b") as f:
            f.write(b"changed")

    with _sys.use(Count("copy_file_range", 3, rewrite)), pytest.raises(DataChangedError):
        save(out, Cord([rows]))
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _slices(whole: FileBackedData, n: int, size: int) -> Iterator[FileBackedData]:
    return (whole.slice(i * size, size) for i in range(n))


def test_adjacent_slices_are_one_copy_and_one_look(tmp_path: Path) -> None:
    data = pattern(1000 * 64)
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "b").write_bytes(data[::-1])
    a = FileBackedData(tmp_path / "a")
    b = FileBackedData(tmp_path / "b")
    # a run of 500 slices of a, one of b, the next 500 of a (no longer adjacent in the output)
    pieces = [*_slices(a, 500, 64), b.slice(0, 64), *(a.slice(i * 64, 64)
                                                     for i in range(500, 1000))]
    out = tmp_path / "out"
    with _sys.use(Count()) as c:
        report = save(out, Cord(pieces))
    assert out.read_bytes() == data[:500 * 64] + data[::-1][:64] + data[500 * 64:]
    assert len(report.actions) == 1001
    assert [x.out_offset for x in report.actions[499:502]] == [499 * 64, 500 * 64, 501 * 64]
    assert c.calls["copy_file_range"] == 3  # three runs, not 1001 pieces
    fstats = c.calls["fstat"]
    assert fstats < 20, fstats  # one look per run (and per open), not per piece


def test_a_change_mid_run_is_still_seen(tmp_path: Path) -> None:
    data = pattern(300 * 64)
    src = tmp_path / "a"
    src.write_bytes(data)
    a = FileBackedData(src)
    out = tmp_path / "out"
    cord = Cord([b"x", *_slices(a, 300, 64)])

    def touch() -> None:
        os.utime(src, ns=(5, 5))  # before the run's copy: the one look after it sees it

    with _sys.use(Count("copy_file_range", 1, touch)), pytest.raises(DataChangedError):
        save(out, cord)
    assert not out.exists()
