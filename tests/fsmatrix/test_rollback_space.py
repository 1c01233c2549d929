"""A rollback that finds the disk full: the space the move freed was taken by someone else.

A consuming save fails mid-move (an injected EIO at a truncate); before its rollback puts the
moved bytes back, another process fills the file system.  The put-back runs out of space: the
save must say so (ENOSPC, not "another process changed it"), keep the journal and temps, and
say where every byte is; ``recover`` refuses while the disk is full (exit 1, nothing touched)
and, once the space is back, restores the source byte-exact.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import fskit
import pytest

from filecord import Cord, FileBackedData, save
from filecord._io import syscalls as _sys
from filecord.errors import SaveError

pytestmark = [pytest.mark.root]

MiB = fskit.MiB
SIZE = 40 * MiB


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for step in (MiB, 4096):
            try:
                while True:
                    os.write(fd, bytes(step))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        os.fsync(fd)
    finally:
        os.close(fd)


class _TakeSpaceThenFail(_sys.Backend):
    def __init__(self, hog: Path) -> None:
        self.hog, self.truncates = hog, 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "ftruncate":
            self.truncates += 1
            if self.truncates == 4:  # the presize, then two windows cut: fail the third
                _fill(self.hog)
                raise OSError(errno.EIO, "injected")


def _recover(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(d)],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("kind", ["ext4", "tmpfs"])
def test_a_rollback_out_of_space_says_so_and_recover_finishes_it_later(mount, kind):
    d = mount(kind, 96 * MiB)
    src = d / "w.bin"
    fskit.write_pattern(src, SIZE, seed=21)
    with pytest.raises(SaveError) as info, _sys.use(_TakeSpaceThenFail(d / "hog")):
        save(d / "o.ptd", Cord([bytes(100), FileBackedData(src, owned=True)]), consume=True,
             window=4 * MiB)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "rolling back also failed" in notes
    assert "No space left on device" in notes
    assert "another process" not in str(info.value) + notes
    assert "are in" in notes  # where every byte is
    assert "filecord recover" in notes
    names = sorted(p.name for p in d.iterdir())
    assert any(n.endswith(".filecord-journal") for n in names)
    assert "o.ptd" not in names

    before = {p.name: p.stat().st_size for p in d.iterdir()}
    r = _recover(d)
    assert r.returncode == 1, r.stderr
    assert "No space left on device" in r.stderr
    assert "another process" not in r.stderr
    assert {p.name: p.stat().st_size for p in d.iterdir()} == before

    (d / "hog").unlink()
    r = _recover(d)
    assert r.returncode == 0, r.stderr
    assert "rolled back" in r.stdout
    assert sorted(p.name for p in d.iterdir() if p.name != "lost+found") == ["w.bin"]
    assert src.stat().st_size == SIZE
    assert fskit.mismatch(src, 0, SIZE, seed=21) is None
