"""Inside ``syscalls.pinned``, a path call acts on the directory inode pinned, not on what the
path names after a rename above it; outside, calls are plain path calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from filecord._io import syscalls as _sys


def swapped(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``d`` (holding f = b"mine") and ``other`` (holding f = b"theirs"); returns d, the
    directory d is then renamed to, and other.  The caller swaps with :func:`swap`."""
    d, real, other = tmp_path / "d", tmp_path / "d.real", tmp_path / "other"
    d.mkdir()
    other.mkdir()
    (d / "f").write_bytes(b"mine")
    (other / "f").write_bytes(b"theirs")
    return d, real, other


def swap(d: Path, real: Path, other: Path) -> None:
    os.rename(d, real)
    os.symlink(other, d)


def test_checks_and_acts_reach_the_pinned_directory_after_a_swap(tmp_path: Path) -> None:
    d, real, other = swapped(tmp_path)
    ino = os.stat(d / "f").st_ino
    with _sys.pinned([str(d)]):
        swap(d, real, other)
        assert _sys.lstat(str(d / "f")).st_ino == ino
        _sys.link(str(d / "f"), str(d / "g"))
        _sys.rename(str(d / "g"), str(d / "h"))
        fd = _sys.open(str(d / "new"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        _sys.close(fd)
        assert sorted(_sys.listdir(str(d))) == ["f", "h", "new"]
        _sys.fsync_dir(str(d))
        _sys.unlink(str(d / "f"))
    assert (other / "f").read_bytes() == b"theirs"
    assert sorted(os.listdir(other)) == ["f"]
    assert sorted(os.listdir(real)) == ["h", "new"]
    assert (real / "h").read_bytes() == b"mine"


def test_without_a_pin_the_path_is_followed(tmp_path: Path) -> None:
    """The control: the same swap without a pin reaches the other directory."""
    d, real, other = swapped(tmp_path)
    swap(d, real, other)
    _sys.unlink(str(d / "f"))
    assert not (other / "f").exists()
    assert (real / "f").read_bytes() == b"mine"


def test_nested_pins_keep_the_first_descriptor_and_close_only_their_own(tmp_path: Path) -> None:
    d, real, other = swapped(tmp_path)
    with _sys.pinned([str(d)]):
        swap(d, real, other)
        with _sys.pinned([str(d), str(other)]):  # d already pinned: its first inode stays
            _sys.unlink(str(d / "f"))
            _sys.unlink(str(other / "f"))
        assert sorted(os.listdir(real)) == []
        (real / "f").write_bytes(b"again")
        _sys.unlink(str(d / "f"))  # still the outer pin
    assert sorted(os.listdir(real)) == []
    (other / "f").write_bytes(b"theirs")
    _sys.unlink(str(d / "f"))  # no pin left: the symlink is followed
    assert not (other / "f").exists()


def test_a_missing_directory_is_not_pinned_and_pin_needs_a_block(tmp_path: Path) -> None:
    with _sys.pinned([str(tmp_path / "absent")]), pytest.raises(FileNotFoundError):
        _sys.lstat(str(tmp_path / "absent" / "f"))
    with pytest.raises(RuntimeError, match="outside"):
        _sys.pin([str(tmp_path)])
