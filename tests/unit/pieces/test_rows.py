"""FileRows: rows of one file range in a caller's order, as one piece (exact bytes, runs)."""
from __future__ import annotations

import io
import os
from collections.abc import Callable

import pytest

from filecord import Cord, FileBackedData
from filecord._pieces.rows import FileRows
from filecord.errors import DataChangedError
from filecord_testing import pattern

ROW = 48


def _rows(data: bytes, base_off: int, order: list[int]) -> bytes:
    return b"".join(data[base_off + r * ROW: base_off + (r + 1) * ROW] for r in order)


def test_bytes_are_the_rows_in_the_order_given(make_file: Callable[..., str]) -> None:
    data = pattern(4096)
    base = FileBackedData(make_file("d", data), offset=64, length=10 * ROW)
    order = [3, 1, 0, 2, 9, 4]
    rows = FileRows(base, ROW, order)
    assert len(rows) == 6 * ROW
    assert bytes(rows) == _rows(data, 64, order)
    want = _rows(data, 64, order)
    assert rows.read_range(40, 100) == want[40:140]  # crosses three rows
    assert rows.prefix(10) == want[:10]
    assert b"".join(rows.iter_chunks(7)) == want
    assert [(len(r), r.offset) for r in rows.ranges(40, 100)] == [
        (8, 64 + 3 * ROW + 40), (48, 64 + 1 * ROW), (44, 64)]
    assert b"".join(bytes(s) for s in rows.slices()) == want
    assert rows.lowest == 64
    assert rows.highest == 64 + 10 * ROW


def test_adjacent_rows_are_one_run(make_file: Callable[..., str]) -> None:
    data = pattern(2000)
    base = FileBackedData(make_file("d", data), offset=0, length=20 * ROW)
    assert FileRows(base, ROW).run_count == 1  # every row in file order: one range
    rows = FileRows(base, ROW, [0, 1, 2, 7, 8, 3, 3])
    assert rows.run_count == 4  # [0..2], [7..8], [3], [3]
    assert list(rows.runs()) == [(0, 3 * ROW), (7 * ROW, 2 * ROW), (3 * ROW, ROW),
                                 (3 * ROW, ROW)]
    assert bytes(rows) == _rows(data, 0, [0, 1, 2, 7, 8, 3, 3])


def test_refuses_rows_outside_the_range(make_file: Callable[..., str]) -> None:
    base = FileBackedData(make_file("d", pattern(500)), length=4 * ROW)
    with pytest.raises(ValueError, match="row 4"):
        FileRows(base, ROW, [0, 4])
    with pytest.raises(ValueError, match="not rows"):
        FileRows(FileBackedData(base.path, length=100), ROW)
    with pytest.raises(ValueError, match="at least one byte"):
        FileRows(base, 0, [])


def test_a_changed_file_is_a_change_not_bytes(make_file: Callable[..., str]) -> None:
    path = make_file("d", pattern(500))
    rows = FileRows(FileBackedData(path, length=4 * ROW), ROW, [1, 0])
    with open(path, "r+b") as f:
        f.write(b"x")
    os.utime(path, ns=(1, 1))
    with pytest.raises(DataChangedError):
        bytes(rows)
    with pytest.raises(DataChangedError):
        rows.check()


def test_in_a_cord(make_file: Callable[..., str]) -> None:
    data = pattern(1000)
    base = FileBackedData(make_file("d", data), offset=ROW, length=8 * ROW)
    rows = FileRows(base, ROW, [7, 0, 5])
    c = Cord([b"head", rows, b"tail"])
    want = b"head" + _rows(data, ROW, [7, 0, 5]) + b"tail"
    assert len(c) == len(want)
    assert bytes(c) == want
    assert c.file_backed_buffers() == [base]
    sink = io.BytesIO()
    assert c.write_to_file(sink) == len(want)
    assert sink.getvalue() == want
