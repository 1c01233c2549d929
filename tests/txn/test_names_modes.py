"""Any name open() accepts can be saved to and adopted; modes and owners of replaced files are
kept in every path, and no temp is ever readable beyond the replaced file's mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord_testing import leftovers, pattern
from support.faultfs import FailCommitStep

W = 8192


@pytest.mark.parametrize("n", [200, 230, 240, 250, 255])
@pytest.mark.parametrize("mode", ["copy", "move", "adopt"])
def test_longest_names_save_in_every_mode(tmp_path: Path, n: int, mode: str) -> None:
    name = "m" * (n - 4) + ".pte"
    assert len(name.encode()) == n
    data = pattern(5 * W + 7, "d")
    src = tmp_path / ("s" * (n - 4) + ".bin")
    src.write_bytes(data)
    piece = FileBackedData.move_from(src) if mode != "copy" else FileBackedData(src)
    cord = Cord([piece]) if mode == "adopt" else Cord([b"hdr", piece])
    report = save(tmp_path / name, cord, consume=mode != "copy", window=W)
    want = data if mode == "adopt" else b"hdr" + data
    assert (tmp_path / name).read_bytes() == want
    assert [a.action for a in report.file_actions()] == ["copied" if mode == "copy" else "moved"]
    assert leftovers(tmp_path) == []


def test_multibyte_names_are_cut_on_a_character_boundary() -> None:
    stem = "ü" * 127  # 254 bytes
    name = _names.token_name(stem, "0123456789abcdef", _names.COMMITTED)
    assert len(os.fsencode(name)) <= _names.NAME_MAX
    assert name.encode("utf-8")  # still valid UTF-8: no half character
    assert _names.parse(name) == ("0123456789abcdef", _names.COMMITTED)
    # Two long stems that share their first 200 bytes still get different names.
    a = _names.token_name("x" * 240 + "a", "0123456789abcdef", _names.TEMP)
    b = _names.token_name("x" * 240 + "b", "0123456789abcdef", _names.TEMP)
    assert a != b


MODES = [0o600, 0o640, 0o755, 0o4755, 0o444]


def _old_output(tmp: Path, mode: int) -> Path:
    out = tmp / "out.bin"
    out.write_bytes(b"old")
    os.chmod(out, mode)
    return out


class WatchTemps(_sys.Backend):
    """Record the permission bits every temp has the instant it is created."""

    def __init__(self) -> None:
        self.created: list[int] = []

    def open(self, path: str, flags: int, mode: int) -> int:
        fd = super().open(path, flags, mode)
        if path.endswith(_names.TEMP) and flags & os.O_CREAT:
            self.created.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd


@pytest.mark.parametrize("mode", MODES, ids=oct)
@pytest.mark.parametrize("how", ["copy", "move", "adopt"])
def test_the_replaced_files_mode_is_kept_and_temps_are_never_wider(
    tmp_path: Path, mode: int, how: str
) -> None:
    out = _old_output(tmp_path, mode)
    src = tmp_path / "src.bin"
    data = pattern(3 * W, "s")
    src.write_bytes(data)
    os.chmod(src, 0o644)
    piece = FileBackedData(src, owned=how != "copy")
    cord = Cord([piece]) if how == "adopt" else Cord([b"h", piece])
    watch = WatchTemps()
    with _sys.use(watch):
        save(out, cord, consume=how != "copy", window=W)
    assert os.stat(out).st_mode & 0o7777 == mode
    assert watch.created, "no temp was created"
    for created in watch.created:
        assert created & ~(mode & 0o777) == 0, f"temp created {oct(created)} for {oct(mode)}"
        assert created & 0o7000 == 0  # set-id bits only once the content is complete
    assert out.read_bytes() == (data if how == "adopt" else b"h" + data)


def test_adopting_into_a_new_name_gives_the_mode_open_would(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 10_000)
    os.chmod(src, 0o600)
    old = os.umask(0o027)
    try:
        save(tmp_path / "new.bin", Cord([FileBackedData(src, owned=True)]), consume=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.bin").st_mode) == 0o640


def test_a_failed_adoption_gives_the_source_its_own_mode_back(tmp_path: Path) -> None:
    out = _old_output(tmp_path, 0o600)
    src = tmp_path / "src.bin"
    src.write_bytes(b"y" * 10_000)
    os.chmod(src, 0o644)
    ino = os.stat(src).st_ino

    def FailCommit() -> FailCommitStep:  # the committed step's write fails
        return FailCommitStep(5, "injected")

    with _sys.use(FailCommit()), pytest.raises(OSError, match="injected"):
        save(out, Cord([FileBackedData(src, owned=True)]), consume=True)
    assert os.stat(src).st_ino == ino
    assert stat.S_IMODE(os.stat(src).st_mode) == 0o644
    assert out.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")
@pytest.mark.parametrize("how", ["copy", "adopt"])
def test_owner_and_group_of_the_replaced_file_are_kept(tmp_path: Path, how: str) -> None:
    out = _old_output(tmp_path, 0o640)
    os.chown(out, 1234, 4321)
    src = tmp_path / "src.bin"
    src.write_bytes(b"z" * 10_000)
    piece = FileBackedData(src, owned=how == "adopt")
    save(out, Cord([piece]) if how == "adopt" else Cord([b"h", piece]), consume=how == "adopt")
    st = os.stat(out)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 4321, 0o640)


class _SignalAfterLink(_sys.Backend):
    """A signal whose handler raises as the lock file's link returns."""

    def link_fd(self, fd: int, dst: str) -> None:
        super().link_fd(fd, dst)
        if dst.endswith(_names.LOCK):
            raise KeyboardInterrupt


def test_a_signal_landing_on_the_lock_files_link_leaves_no_lock_file(tmp_path: Path) -> None:
    """The lock file was linked but never handed to the save's cleanup: create() removes the
    name it just made, so the save can be retried as its message says, with nothing to
    recover."""
    probe = _sys.open_unnamed(str(tmp_path))
    if probe is None:
        pytest.skip("no O_TMPFILE here: the lock is made under its name")
    _sys.close(probe)
    with _sys.use(_SignalAfterLink()), pytest.raises(KeyboardInterrupt):
        save(tmp_path / "m.pte", Cord([b"x" * 100]))
    assert sorted(os.listdir(tmp_path)) == []
