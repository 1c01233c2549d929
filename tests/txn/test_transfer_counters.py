"""The transfer counters in SaveReport: what a save asked of the kernel, per kind."""

from __future__ import annotations

from pathlib import Path

import filecord
from filecord import Cord, FileBackedData
from filecord_testing import pattern


def test_copy_save_counts_copied_and_written_bytes(tmp_path: Path) -> None:
    data = pattern(300_000)
    (tmp_path / "a.bin").write_bytes(data)
    report = filecord.save(tmp_path / "out", Cord([b"head", FileBackedData(tmp_path / "a.bin")]))
    (a,) = report.file_actions()
    assert a.action == "copied"  # the 4-byte head leaves the piece unaligned: no clone anywhere
    assert (report.bytes_copied, report.bytes_cloned) == (len(data), 0)
    assert report.bytes_written == 4
    assert report.bytes_moved == 0
    assert report.to_dict()["transfer"] == {
        "copied": len(data), "cloned": 0, "written": 4, "moved": 0}
    assert "transfer: 300000 copied" in report.summary()


def test_consume_counts_moved_bytes_not_copies(tmp_path: Path) -> None:
    data = pattern(300_000)
    (tmp_path / "a.bin").write_bytes(data)
    cord = Cord([b"head", FileBackedData(tmp_path / "a.bin", owned=True)])
    report = filecord.save(tmp_path / "out", cord, consume=True)
    (a,) = report.file_actions()
    assert a.action == "moved"
    assert report.bytes_moved == len(data)
    assert report.bytes_copied == 0
    assert (tmp_path / "out").read_bytes() == b"head" + data


def test_a_dry_run_counts_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    report = filecord.plan(tmp_path / "out", Cord([FileBackedData(tmp_path / "a.bin")]))
    assert (report.bytes_copied, report.bytes_cloned, report.bytes_written) == (0, 0, 0)
