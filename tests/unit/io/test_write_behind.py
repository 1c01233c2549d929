"""A move copies each window in parts and starts the writeback of every ``WRITE_BEHIND`` bytes
it has copied while more of the window is left (never right before the window's fsync); the
hint makes nothing durable, so every window is still fsynced before its source is cut, a
refused hint changes nothing, and a failure injected at one rolls the move back."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import filecord
from filecord._io import syscalls as _sys
from filecord._txn import transfer
from support.faultfs import FaultFS, Recorder, Tracer

PART = 4096
WINDOW = 3 * PART
HEAD = b"H" * 10  # unaligned: the source is moved window by window, never adopted


class _Refuse(Recorder):
    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EINVAL, "no writeback hints here")


def _move(tmp_path: Path, backend: Recorder, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(transfer, "WRITE_BEHIND", PART)
    data = os.urandom(2 * WINDOW + PART + 100)  # two whole windows and a short one
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    cord = filecord.Cord([HEAD, filecord.FileBackedData(src, owned=True)])
    with _sys.use(backend):
        report = filecord.save(tmp_path / "out.bin", cord, consume=True, window=WINDOW,
                               in_place=False)
    assert report.bytes_moved == len(data)
    assert not src.exists()
    assert (tmp_path / "out.bin").read_bytes() == HEAD + data
    return data


def test_every_part_but_a_windows_last_starts_its_writeback_before_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder()
    data = _move(tmp_path, rec, monkeypatch)
    # the windows, cut from the end: [size-W, size), [size-2W, size-W), [0, size-2W)
    size = len(data)
    windows = [(size - WINDOW, size), (size - 2 * WINDOW, size - WINDOW), (0, size - 2 * WINDOW)]
    starts = [a for op, a in rec.ops if op == "start_writeback"]
    assert len({fd for fd, _o, _n in starts}) == 1  # the output's temp
    want = []
    for lo, hi in windows:
        parts = [(x, min(PART, hi - x)) for x in range(lo, hi, PART)]
        want += [(len(HEAD) + x, n) for x, n in parts[:-1]]
    assert [(o, n) for _fd, o, n in starts] == want
    # each window: its copies with the hints between them, then the fsync, the cut step's
    # fsync (the journal's), then the cut
    seq = [op for op, _a in rec.ops if op in ("copy_file_range", "start_writeback",
                                             "fsync", "ftruncate")]
    i = seq.index("copy_file_range")  # the journal's fsyncs come before the move
    for lo, hi in windows:
        k = len(range(lo, hi, PART))
        block = seq[i:i + 2 * k + 2]
        assert block == ["copy_file_range", "start_writeback"] * (k - 1) + [
            "copy_file_range", "fsync", "fsync", "ftruncate"]
        i += 2 * k + 2


def test_a_refused_writeback_hint_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = _Refuse()
    _move(tmp_path, rec, monkeypatch)  # bytes exact, source consumed: asserted inside
    assert any(op == "start_writeback" for op, _ in rec.ops)


def test_the_hint_is_a_real_call_that_leaves_bytes_and_size_alone(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(3 * PART)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        _sys.start_writeback(fd, 0, len(data))
        assert os.fstat(fd).st_size == len(data)
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_a_failure_injected_at_each_hint_rolls_the_move_back_byte_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "WRITE_BEHIND", PART)
    data = os.urandom(2 * WINDOW + PART + 100)

    def save(backend: _sys.Backend, run: Path) -> None:
        run.mkdir()
        (run / "src.bin").write_bytes(data)
        cord = filecord.Cord([HEAD, filecord.FileBackedData(run / "src.bin", owned=True)])
        with _sys.use(backend):
            filecord.save(run / "out.bin", cord, consume=True, window=WINDOW, in_place=False)

    tracer = Tracer()
    save(tracer, tmp_path / "trace")
    points = [c.index for c in tracer.calls if c.op == "start_writeback"]
    assert len(points) == 5  # the parts before the last of each window: 2, 2 and 1
    for at in points:
        run = tmp_path / f"at{at}"
        fault = FaultFS(at, "eio", persistent=False)
        with pytest.raises(OSError, match="injected at call"):
            save(fault, run)
        assert [c.op for c in fault.fired] == ["start_writeback"]
        assert (run / "src.bin").read_bytes() == data  # every moved window put back
        assert sorted(p.name for p in run.iterdir()) == ["src.bin"]  # no output, no temp


def _pieces_move(tmp_path: Path, backend: Recorder, monkeypatch: pytest.MonkeyPatch,
                 part: int) -> bytes:
    """Eight 1000-byte slices of one owned source, moved into one output in 4 KiB windows."""
    monkeypatch.setattr(transfer, "WRITE_BEHIND", part)
    data = os.urandom(8000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    whole = filecord.FileBackedData(src, owned=True)
    cord = filecord.Cord([HEAD, *(whole.slice(i * 1000, 1000) for i in range(8))])
    with _sys.use(backend):
        report = filecord.save(tmp_path / "out.bin", cord, consume=True, window=PART)
    assert report.bytes_moved == len(data)
    assert not src.exists()
    assert (tmp_path / "out.bin").read_bytes() == HEAD + data
    return data


def test_a_window_no_larger_than_a_part_makes_no_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder()
    _pieces_move(tmp_path, rec, monkeypatch, PART)
    assert [op for op, _a in rec.ops if op == "copy_file_range"]  # moved piece by piece
    assert not any(op == "start_writeback" for op, _a in rec.ops)


def test_hints_over_many_pieces_name_only_bytes_already_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder()
    _pieces_move(tmp_path, rec, monkeypatch, 1500)
    hints = 0
    copied: list[tuple[int, int]] = []  # output ranges copied in the current window
    for op, a in rec.ops:
        if op == "copy_file_range":
            copied.append((a[4], a[4] + a[2]))
        elif op == "start_writeback":
            hints += 1
            lo, hi = a[1], a[1] + a[2]
            assert lo == min(p for p, _q in copied)
            assert hi <= max(q for _p, q in copied)
            assert hi - lo >= 1500
            copied = []
        elif op == "fsync":
            copied = []
    assert hints > 0
    # a hint is never the last thing before a window's fsync: a copy always follows it
    seq = [op for op, _a in rec.ops if op in ("copy_file_range", "start_writeback", "fsync")]
    assert all(seq[i + 1] == "copy_file_range" for i, op in enumerate(seq)
               if op == "start_writeback")
