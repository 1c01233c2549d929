"""A save's and recover's acts reach the directory their checks saw, whatever is renamed above.

Whoever can write the directory above a save directory can, between the identity check of a
recorded removal (``lstat``) and its ``unlink``, rename the save directory away and put a
symlink to another directory in its place.  Made by path, the unlink would then remove an
unrelated file of the same name in that other directory.  The seam's pinned directories make
every act of a save (once its lock is held) and of recover relative to the directory descriptor
the checks used: the other directory's file stays byte-exact, and the save's own removal is
done in its real (renamed) directory.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover
from filecord._io import syscalls as _sys
from filecord._kit.removal import identity
from filecord._txn.save import Removal, save_many_finishing
from filecord.errors import SaveError
from filecord_testing import pattern

W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")
INDEX = b'{"weight_map": {"a": "a.bin", "b": "b.bin"}}'
VICTIM = b"an unrelated index.json in another directory"


class SwapAtUnlink(_sys.Backend):
    """At the first ``unlink`` of ``path``, rename its directory away (to ``.real``) and put a
    symlink to ``elsewhere`` in its place; then let the unlink proceed."""

    def __init__(self, path: Path, elsewhere: Path) -> None:
        self.path, self.elsewhere, self.swapped = str(path), elsewhere, False

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "unlink" and str(args[0]) == self.path and not self.swapped:
            self.swapped = True
            d = os.path.dirname(self.path)
            os.rename(d, d + ".real")
            os.symlink(self.elsewhere, d)


class FailUnlink(_sys.Backend):
    """The save stops at the removal's unlink, after its commit point (the journal stays)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "unlink" and str(args[0]) == self.path:
            raise OSError(errno.EIO, "injected at the removal's unlink")


def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``parent/save`` holding a.bin, b.bin and index.json; ``victim`` holding another
    index.json.  Returns (save, victim)."""
    root = tmp_path.resolve()
    d, victim = root / "parent" / "save", root / "victim"
    d.mkdir(parents=True)
    victim.mkdir()
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    (d / "index.json").write_bytes(INDEX)
    (victim / "index.json").write_bytes(VICTIM)
    return d, victim


def consume_merge(d: Path) -> None:
    """A consuming save of a.bin + b.bin into out.bin that removes index.json at the commit."""
    sources = (str(d / "a.bin"), str(d / "b.bin"))
    cord = Cord([FileBackedData(p, owned=True) for p in sources])
    ident = identity(str(d / "index.json"))
    assert ident is not None
    save_many_finishing({str(d / "out.bin"): cord}, consume=True, window=W, progress=None,
                        remove=[Removal(str(d / "index.json"), ident, with_sources=sources)])


def test_a_consuming_save_removes_its_index_in_its_own_directory_when_it_is_swapped(
        tmp_path: Path) -> None:
    d, victim = layout(tmp_path)
    swap = SwapAtUnlink(d / "index.json", victim)
    with _sys.use(swap):
        consume_merge(d)
    assert swap.swapped
    assert (victim / "index.json").read_bytes() == VICTIM
    assert sorted(os.listdir(victim)) == ["index.json"]  # nothing of the save went there
    real = d.parent / "save.real"
    assert sorted(os.listdir(real)) == ["out.bin"]  # its removal done, no journal, no lock
    assert (real / "out.bin").read_bytes() == A + B


def test_recover_finishes_a_removal_in_its_own_directory_when_it_is_swapped(
        tmp_path: Path) -> None:
    d, victim = layout(tmp_path)
    with _sys.use(FailUnlink(d / "index.json")), pytest.raises(SaveError, match="commit"):
        consume_merge(d)
    assert (d / "out.bin").read_bytes() == A + B  # past the commit point
    assert (d / "index.json").read_bytes() == INDEX
    swap = SwapAtUnlink(d / "index.json", victim)
    with _sys.use(swap):
        done = recover(d)
    assert swap.swapped
    assert [r.action for r in done] == ["finished"]
    assert (victim / "index.json").read_bytes() == VICTIM
    assert sorted(os.listdir(victim)) == ["index.json"]
    real = d.parent / "save.real"
    assert sorted(os.listdir(real)) == ["out.bin"]
    assert (real / "out.bin").read_bytes() == A + B


class DieAtFtruncate(_sys.Backend):
    """The process ends (as by SIGKILL: nothing cleans up) at its ``n``-th ftruncate."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "ftruncate":
            self.seen += 1
            if self.seen == self.n:
                os._exit(9)


class SwapAtLink(SwapAtUnlink):
    """As :class:`SwapAtUnlink`, at the first link (``link_fd`` included) onto ``path``."""

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "link" and str(args[1]) == self.path and not self.swapped:
            self.swapped = True
            d = os.path.dirname(self.path)
            os.rename(d, d + ".real")
            os.symlink(self.elsewhere, d)


def test_recover_gives_a_source_its_name_back_in_its_own_directory_when_it_is_swapped(
        tmp_path: Path) -> None:
    """A consuming save killed mid-move (b.bin parked and cut by one window) is rolled back;
    the swap at the link that gives b.bin its name back leaves the other directory as it was
    and b.bin, byte-exact, in the save's real directory."""
    from support.killjob import fork_run

    root = tmp_path.resolve()
    d, victim = root / "parent" / "save", root / "victim"
    d.mkdir(parents=True)
    victim.mkdir()
    (victim / "index.json").write_bytes(VICTIM)
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    cord = Cord([FileBackedData(str(d / "a.bin"), owned=True),
                 FileBackedData(str(d / "b.bin"), owned=True)])

    def killed() -> None:
        with _sys.use(DieAtFtruncate(4)):
            save_many_finishing({str(d / "out.bin"): cord}, consume=True, window=W,
                                progress=None)

    assert fork_run(killed) == 9
    (parked,) = (p for p in d.iterdir() if p.name.startswith(".b.bin."))
    assert parked.stat().st_size == W  # cut by one window: mid-move
    swap = SwapAtLink(d / "b.bin", victim)
    with _sys.use(swap):
        done = recover(d)
    assert swap.swapped
    assert [r.action for r in done] == ["restored"]
    assert sorted(os.listdir(victim)) == ["index.json"]
    assert (victim / "index.json").read_bytes() == VICTIM
    real = d.parent / "save.real"
    assert sorted(os.listdir(real)) == ["a.bin", "b.bin"]
    assert (real / "a.bin").read_bytes() == A
    assert (real / "b.bin").read_bytes() == B
