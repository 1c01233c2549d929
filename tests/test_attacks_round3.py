"""The third outside attack: ranged clones, clone-ready layouts, the adaptive window, and the
older promises again.  One test per attack; a test that shows a real bug is a strict xfail
whose reason names it in one line.

Judged only by docs/guarantees.md (and the README's "What is promised").
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, _sys, save
from filecord.errors import DataChangedError
from filecord_testing import leftovers, pattern

sys.path.insert(0, str(Path(__file__).parent / "fsmatrix"))
import fskit  # noqa: E402

W = 4096
SECOND = b"SECOND-PARTY-BYTES"


class AtCall(_sys.Backend):
    """Run ``action`` right before the ``at``-th call of ``op``."""

    def __init__(self, op: str, at: int, action: object) -> None:
        self.op, self.at, self.action, self.n = op, at, action, 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == self.op:
            self.n += 1
            if self.n == self.at:
                self.action()  # type: ignore[operator]


@contextlib.contextmanager
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh XFS (reflink=1) mount, or a clean skip."""
    reason = fskit.unavailable("xfs")
    if reason is not None:
        pytest.skip(f"xfs: {reason}")
    try:
        with fskit.mounted("xfs", 320 << 20, base=tmp_path) as fs:
            yield fs
    except fskit.MountError as exc:
        pytest.skip(f"cannot mount xfs: {exc}")


def _second_party_kept(writer: int, want_size: int) -> tuple[int, int]:
    """(links, size) of the file the second party holds open."""
    st = os.fstat(writer)
    return st.st_nlink, st.st_size


# --- R3-1: a consumed source written to after its copy/clone/move is deleted at commit ------
#
# guarantees.md, "A source that changes under a save": a change is "reported, never papered
# over"; "FileBackedData": "A file that was replaced or rewritten meanwhile is not deleted".
# The commit (_save._commit) unlinks every parked source that is still the same inode, with no
# look at its size or times, so bytes another process wrote after the save's last look at that
# source (while the journal is written, while *other* sources are moved) are deleted with it,
# and the save reports success.

BUG_1 = ("commit unlinks a consumed source another process wrote to after its last check "
         "(size/mtime never re-checked): the writer's bytes are deleted, save succeeds")


@pytest.mark.xfail(strict=True, reason=BUG_1)
def test_r3_1a_append_to_a_copied_consumed_source_before_commit_is_not_deleted(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(5 * W, "b"))
    fa = FileBackedData(a, owned=True).slice(0, W)  # copied: bytes after the range
    fb = FileBackedData(b, owned=True)
    writer = os.open(a, os.O_RDWR)  # an exporter still writing, opened before the save
    try:
        def append() -> None:
            os.pwrite(writer, SECOND, 2 * W)

        raised = None
        with _sys.use(AtCall("ftruncate", 2, append)):  # while b is being moved
            try:
                save(tmp_path / "out", Cord([fa, fb]), consume=True, window=W)
            except DataChangedError as exc:
                raised = exc
        links, size = _second_party_kept(writer, 2 * W + len(SECOND))
        # Either the change is reported, or the changed file is kept (not deleted).
        assert raised is not None or links == 1, (links, size, sorted(os.listdir(tmp_path)))
        assert size == 2 * W + len(SECOND)
    finally:
        os.close(writer)


@pytest.mark.xfail(strict=True, reason=BUG_1)
def test_r3_1b_append_to_a_moved_source_while_another_moves_is_not_deleted(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(4 * W, "b"))
    fa = FileBackedData(a, owned=True)
    fb = FileBackedData(b, owned=True)
    writer = os.open(a, os.O_RDWR)
    try:
        def append() -> None:  # a is fully moved (size 0); b's first truncate is next
            assert os.fstat(writer).st_size == 0
            os.pwrite(writer, SECOND, 0)

        raised = None
        # ftruncate 1: presize; 2, 3: a's two windows; 4: b's first window
        with _sys.use(AtCall("ftruncate", 4, append)):
            try:
                save(tmp_path / "out", Cord([fa, fb]), consume=True, window=W)
            except DataChangedError as exc:
                raised = exc
        links, size = _second_party_kept(writer, len(SECOND))
        assert raised is not None or links == 1, (links, size, sorted(os.listdir(tmp_path)))
    finally:
        os.close(writer)


@pytest.mark.root
@pytest.mark.xfail(strict=True, reason=BUG_1)
def test_r3_1c_rewrite_of_a_cloned_source_after_its_clone_is_not_deleted(
    tmp_path: Path,
) -> None:
    with xfs(tmp_path) as fs:
        a = fs / "a.bin"
        a_bytes = pattern(2 * W + 100, "a")
        a.write_bytes(a_bytes)
        b = fs / "b.bin"
        b.write_bytes(pattern(4 * W, "b"))
        fa = FileBackedData(a, owned=True)
        fb = FileBackedData(b, owned=True)
        writer = os.open(a, os.O_RDWR)
        try:
            def rewrite() -> None:  # after both clones, as the journal is renamed into place
                os.pwrite(writer, SECOND, 0)
                st = os.fstat(writer)
                os.utime(writer, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))

            raised = None
            with _sys.use(AtCall("rename", 1, rewrite)):
                try:
                    report = save(fs / "out", Cord([fb, fa]), consume=True)
                    assert [x.action for x in report.file_actions()] == ["cloned", "cloned"]
                except DataChangedError as exc:
                    raised = exc
            links, _size = _second_party_kept(writer, len(a_bytes))
            assert raised is not None or links == 1, (links, sorted(os.listdir(fs)))
        finally:
            os.close(writer)


def test_r3_1_control_a_change_before_the_copy_is_reported(tmp_path: Path) -> None:
    """Held: a change made before the save's look at the source is a DataChangedError."""
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    fa = FileBackedData(a, owned=True).slice(0, W)
    writer = os.open(a, os.O_RDWR)
    try:
        with _sys.use(AtCall("open", 3, lambda: os.pwrite(writer, SECOND, 2 * W))), \
                pytest.raises(DataChangedError):
            save(tmp_path / "out", Cord([fa]), consume=True, window=W)
        assert a.read_bytes() == pattern(2 * W, "a") + SECOND
        assert leftovers(tmp_path) == []
    finally:
        os.close(writer)
