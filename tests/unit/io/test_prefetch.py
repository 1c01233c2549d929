"""A move asks the kernel for its next window before it waits on the current window's fsync
(the disk reads one while it writes the other), and a refused hint changes nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import filecord
from filecord._io import syscalls as _sys
from support.faultfs import Recorder


class _Refuse(Recorder):
    def prefetch(self, fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EINVAL, "no hints here")


def _move(tmp_path: Path, backend: Recorder) -> tuple[bytes, filecord.SaveReport]:
    data = os.urandom(3 * 4096 + 100)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    cord = filecord.Cord([b"H" * 10, filecord.FileBackedData(src, owned=True)])
    with _sys.use(backend):
        report = filecord.save(tmp_path / "out.bin", cord, consume=True, window=4096)
    assert not src.exists()
    assert (tmp_path / "out.bin").read_bytes() == b"H" * 10 + data
    return data, report


def test_each_window_but_the_last_prefetches_the_next_before_its_fsync(tmp_path: Path) -> None:
    rec = Recorder()
    data, report = _move(tmp_path, rec)
    fds = {a[0] for op, a in rec.ops if op == "prefetch"}
    if not fds:  # adopted or cloned whole: nothing moved window by window
        assert report.bytes_moved == 0
        return
    assert len(fds) == 1  # the source's descriptor
    cuts = [a[1] for op, a in rec.ops if op == "ftruncate" and a[0] in fds]
    fetched = [(a[1], a[2]) for op, a in rec.ops if op == "prefetch"]
    # windows cut from the end: each prefetch names exactly the window cut next
    assert cuts == sorted(cuts, reverse=True)
    assert cuts[-1] == 0
    wins = list(zip([len(data), *cuts[:-1]], cuts, strict=True))  # (end, start) per window
    assert fetched == [(lo, hi - lo) for hi, lo in wins[1:]]
    # and it comes before the fsync that precedes the cut it prepares
    for i, (op, _a) in enumerate(rec.ops):
        if op == "prefetch":
            later = [o for o, b in rec.ops[i + 1:]
                     if o == "fsync" or (o == "ftruncate" and b[0] in fds)]
            # the temps' fsync (and the journal's, for the cut step), then the cut
            upto = later[:later.index("ftruncate")]
            assert upto
            assert set(upto) == {"fsync"}


def test_a_refused_prefetch_changes_nothing(tmp_path: Path) -> None:
    rec = _Refuse()
    _move(tmp_path, rec)  # bytes exact, source consumed: asserted inside
    assert any(op == "prefetch" for op, _ in rec.ops) or not any(
        op == "ftruncate" for op, _ in rec.ops)
