"""Derived pieces: bytes a function makes of file ranges, a bounded chunk at a time."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, plan, save
from filecord._pieces.derived import Derived
from filecord.errors import DataChangedError


def _swap(raw: memoryview) -> bytes:
    """2-byte elements byte-swapped, 4 bytes out per element (each twice)."""
    b = bytes(raw)
    return b"".join(b[i + 1:i + 2] + b[i:i + 1] + b[i + 1:i + 2] + b[i:i + 1]
                    for i in range(0, len(b), 2))


def _want(data: bytes) -> bytes:
    return _swap(memoryview(data))


def test_chunks_are_bounded_whole_elements_and_exact(tmp_path: Path) -> None:
    f = tmp_path / "s.bin"
    data = bytes(range(256)) * 10
    f.write_bytes(data)
    whole = FileBackedData(f)
    parts = [whole.slice(1000, 560), whole.slice(0, 1000)]
    d = Derived(parts, in_item=2, out_item=4, transform=_swap, label="t")
    reads: list[int] = []

    def read(r: FileBackedData, start: int, n: int) -> bytes:
        reads.append(n)
        return r.read_range(start, n)

    got = b"".join(bytes(c) for c in d.chunks(read, chunk=63))
    assert got == _want(data[1000:1560] + data[:1000])
    assert len(d) == len(got) == 3120
    assert max(reads) == 62  # 63 rounded down to whole 2-byte elements
    assert sum(reads) == 1560
    assert bytes(Cord([b"<", d, b">"])) == b"<" + got + b">"
    sink = io.BytesIO()
    assert Cord([d]).write_to_file(sink, chunk=64) == len(got)
    assert sink.getvalue() == got


def test_a_source_of_partial_elements_and_a_wrong_transform_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "s.bin"
    f.write_bytes(b"abcde")
    with pytest.raises(ValueError, match="whole 2-byte elements"):
        Derived([FileBackedData(f)], in_item=2, out_item=2, transform=bytes)
    d = Derived([FileBackedData(f, length=4)], in_item=2, out_item=4, transform=bytes,
                label="short")
    with pytest.raises(ValueError, match="short: the transform made 4 bytes of 4"):
        d.to_bytes()


def test_the_save_computes_it_in_the_fill_and_reports_it(tmp_path: Path) -> None:
    f = tmp_path / "s.bin"
    data = bytes(range(200)) * 3
    f.write_bytes(data)
    d = Derived([FileBackedData(f)], in_item=2, out_item=4, transform=_swap)
    out = tmp_path / "o.bin"
    dry = plan(out, Cord([b"H", d]))
    assert [a.action for a in dry.actions] == ["written", "computed"]
    assert not out.exists()
    report = save(out, Cord([b"H", d]))
    assert out.read_bytes() == b"H" + _want(data)
    assert [a.action for a in report.actions] == ["written", "computed"]
    assert report.bytes_written == 1 + len(d)
    assert report.bytes_copied == 0
    assert f.read_bytes() == data  # read, never moved: a derived piece is copy-only


def test_a_source_changed_before_the_save_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "s.bin"
    f.write_bytes(b"\0" * 64)
    d = Derived([FileBackedData(f)], in_item=2, out_item=2, transform=bytes)
    f.write_bytes(b"\1" * 66)
    with pytest.raises(DataChangedError):
        save(tmp_path / "o.bin", Cord([d]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin"]
