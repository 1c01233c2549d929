"""Guards that no other suite exercised (the mutation audit of issue 22): each test fails when
the check it names is removed or weakened.

* recover checks that every source *after* the one being moved is still at its full size: a
  later source cut to a window boundary after a crash is refused, never "restored" from the
  temps' holes (sparse sources: the density check cannot see it);
* recover checks the in-progress source is at a window boundary: a cut between boundaries is
  refused, not zero-filled;
* recover's finish compares a parked source's size *and* mtime with the save's last look: a
  same-size rewrite after the commit point is kept, never deleted;
* the save compares size and mtime of a source as it opens it: an append with the mtime put
  back (a coarse-timestamp file system sees no mtime change) stops the save, and the appended
  bytes are not deleted with the consumed source.
"""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, recover
from filecord import save as filecord_save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError, RecoverError, SaveError
from filecord_testing import consume_killed_at_truncate, pattern

# These cases act on *moves*: their whole files at offset 0 would be adopted in place where
# ranges insert (tests/fsmatrix/test_adopt_in_place.py and the ``inplace`` sweeps cover that),
# so adoption in place is off here.
save = functools.partial(filecord_save, in_place=False)


W = 4096


def _sparse(path: Path, size: int, tag: str) -> bytes:
    """A file whose first window is a hole and the rest data; returns its bytes."""
    data = pattern(size - W, tag)
    with path.open("wb") as f:
        f.seek(W)
        f.write(data)
    assert os.stat(path).st_blocks * 512 < size  # sparse: journaled as not dense
    return bytes(W) + data


def _killed_mid_move(d: Path, at_truncate: int) -> tuple[bytes, bytes]:
    a = _sparse(d / "a.bin", 3 * W, "a")
    b = _sparse(d / "b.bin", 2 * W, "b")

    consume_killed_at_truncate(d, at_truncate, W)
    return a, b


def _parked(d: Path, name: str) -> Path:
    return next(d / n for n in os.listdir(d)
                if n.startswith(f".{name}.") and n.endswith(_names.SOURCE))


def _refused_untouched(d: Path) -> None:
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    with pytest.raises(RecoverError) as info:
        recover(d)
    assert [r.action for r in info.value.results] == ["refused"]  # type: ignore[attr-defined]
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before


def test_a_later_source_cut_after_a_crash_is_refused(tmp_path: Path) -> None:
    _killed_mid_move(tmp_path, 3)  # a.bin cut once, b.bin's move not begun
    b = _parked(tmp_path, "b.bin")
    assert b.stat().st_size == 2 * W
    os.truncate(b, W)  # a window boundary: a size a move of b could leave
    _refused_untouched(tmp_path)


def test_the_source_in_progress_cut_between_boundaries_is_refused(tmp_path: Path) -> None:
    _killed_mid_move(tmp_path, 3)
    a = _parked(tmp_path, "a.bin")
    assert a.stat().st_size == 2 * W
    os.truncate(a, 2 * W - 100)  # its bytes [2W-100, 2W) were never moved: not in the temp
    _refused_untouched(tmp_path)


def test_the_control_rolls_back_byte_exact(tmp_path: Path) -> None:
    a, b = _killed_mid_move(tmp_path, 3)
    assert [r.action for r in recover(tmp_path)] == ["restored"]
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b


class _FailRenameOnto(_sys.Backend):
    def __init__(self, final: Path) -> None:
        self.final = str(final)

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "rename" and str(args[1]) == self.final:
            raise OSError(errno.EIO, "injected after the commit point")


def test_a_same_size_rewrite_after_the_commit_is_kept(tmp_path: Path) -> None:
    """c.bin's second window is moved; its kept first window stays parked until the commit
    deletes it.  Rewritten after the commit point at the same size, it must be kept."""
    c = pattern(2 * W, "c")
    (tmp_path / "c.bin").write_bytes(c)
    out = tmp_path / "out.bin"
    piece = FileBackedData(tmp_path / "c.bin", offset=W, length=W, owned=True)
    with _sys.use(_FailRenameOnto(out)), pytest.raises(SaveError, match="after its commit"):
        save(out, Cord([b"head", piece]), consume=True, window=W)
    parked = _parked(tmp_path, "c.bin")
    st = parked.stat()
    rewrite = pattern(st.st_size, "Z")
    assert st.st_size == W  # its kept first window
    parked.write_bytes(rewrite)  # same size
    os.utime(parked, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(RecoverError, match="kept"):
        recover(tmp_path)
    assert out.read_bytes() == b"head" + c[W:]
    assert (tmp_path / "c.bin").read_bytes() == rewrite  # kept under its own name


class _AppendAtSecondLook(_sys.Backend):
    """Append to the source right before the save's own look at its opened descriptor, and put
    its mtime back: what a coarse-timestamp file system shows for a quick append."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.fds: dict[int, int] = {}
        self.armed = self.appended = False

    def open(self, path: str, flags: int, mode: int) -> int:
        fd = super().open(path, flags, mode)
        self.armed = self.armed or path.endswith(_names.TEMP)  # the fill has begun
        if path == self.path and self.armed:
            self.fds[fd] = 0
        return fd

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "fstat" and args[0] in self.fds and not self.appended:
            self.fds[args[0]] += 1
            if self.fds[args[0]] == 2:  # open_checked's look was the first
                self.appended = True
                st = os.stat(self.path)
                with open(self.path, "ab") as f:
                    f.write(b"APPENDED")
                os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_append_with_the_mtime_put_back_stops_the_save(tmp_path: Path) -> None:
    c = pattern(2 * W, "c")
    (tmp_path / "c.bin").write_bytes(c)
    # Its first window only: not a run to the file's end, so copied; owned, so consumed.
    piece = FileBackedData(tmp_path / "c.bin", offset=0, length=W, owned=True)
    hook = _AppendAtSecondLook(tmp_path / "c.bin")
    with _sys.use(hook), pytest.raises(DataChangedError, match="as it was opened"):
        save(tmp_path / "out.bin", Cord([piece]), consume=True, window=W)
    assert hook.appended
    assert (tmp_path / "c.bin").read_bytes() == c + b"APPENDED"
    assert not (tmp_path / "out.bin").exists()
