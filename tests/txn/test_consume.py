"""consume=True on real files: actions, reasons, sources gone, rollback and recover."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filecord import Cord, FileBackedData, recover, save, save_many
from filecord._io import syscalls as _sys
from filecord.errors import RecoverError, SaveError
from filecord_testing import close_leaked, leftovers, pattern
from support.faultfs import COMMITTED_STEP, FailCommitStep

W = 8192  # a small sync window: several windows per source


def owned(tmp_path: Path, name: str, data: bytes) -> FileBackedData:
    p = tmp_path / name
    p.write_bytes(data)
    return FileBackedData.move_from(p)


def test_moves_shared_and_repeated_sources(tmp_path: Path) -> None:
    a, b, c = pattern(50_000, "a"), pattern(30_001, "b"), pattern(9_999, "c")
    fa, fb, fc = owned(tmp_path, "a", a), owned(tmp_path, "b", b), owned(tmp_path, "c", c)
    unowned = tmp_path / "u"
    unowned.write_bytes(b"unowned!")
    fu = FileBackedData(unowned)
    outs = {
        tmp_path / "o1": Cord([b"H1", fa, fb, fu]),
        tmp_path / "o2": Cord([fa, b"", fc, fc]),  # a shared by two outputs, c used twice
    }
    report = save_many(outs, consume=True, window=W)
    assert (tmp_path / "o1").read_bytes() == b"H1" + a + b + b"unowned!"
    assert (tmp_path / "o2").read_bytes() == a + c + c
    acts = [(x.action, x.reason) for x in report.actions if x.source]
    assert acts == [("moved", None)] * 2 + [("copied", "not owned")] + [("moved", None)] * 3
    for d in (fa, fb, fc):
        assert not os.path.exists(d.path)
        with pytest.raises(OSError, match="changed"):
            d.to_bytes()
    assert unowned.read_bytes() == b"unowned!"
    assert leftovers(tmp_path) == []
    assert report.journal


def test_copy_under_consume_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    u1, u2 = tmp_path / "u1", tmp_path / "u2"
    u1.write_bytes(b"1")
    u2.write_bytes(b"2")
    with caplog.at_level(logging.WARNING, logger="filecord"):
        save(tmp_path / "o", Cord([FileBackedData(u1), FileBackedData(u2)]), consume=True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "not owned" in warnings[0].getMessage()


def test_hard_link_and_symlink_are_copied_and_kept(tmp_path: Path) -> None:
    data = pattern(20_000)
    p = tmp_path / "linked"
    p.write_bytes(data)
    os.link(p, tmp_path / "other-name")
    ino = os.stat(p).st_ino
    d = FileBackedData(p, owned=True)
    r = save(tmp_path / "o", Cord([d]), consume=True, window=W)
    assert r.actions[0].reason == "another hard link"
    assert (tmp_path / "o").read_bytes() == data
    # The owned name was consumed (deleted at commit); the file it linked to survives under
    # its other name: the same inode, byte-exact.
    assert (tmp_path / "other-name").read_bytes() == data
    assert os.stat(tmp_path / "other-name").st_ino == ino
    assert leftovers(tmp_path) == []

    t = tmp_path / "target"
    t.write_bytes(data)
    t_ino = t.stat().st_ino
    (tmp_path / "sym").symlink_to(t)
    s = FileBackedData(tmp_path / "sym", owned=True)
    r = save(tmp_path / "o2", Cord([s]), consume=True, window=W)
    assert r.actions[0].reason == "a symlink"
    assert (tmp_path / "o2").read_bytes() == data
    # The link still points at its target, and the target survives byte-exact.
    assert os.readlink(tmp_path / "sym") == str(t)
    assert t.read_bytes() == data
    assert t.stat().st_ino == t_ino
    assert (tmp_path / "sym").read_bytes() == data
    assert leftovers(tmp_path) == []


def test_gap_below_moved_run(tmp_path: Path) -> None:
    data = pattern(40_000)
    p = tmp_path / "src"
    p.write_bytes(data)
    low = FileBackedData(p, length=10_000, owned=True)
    high = FileBackedData(p, offset=20_000, owned=True)
    r = save(tmp_path / "o", Cord([high, low]), consume=True, window=W)
    assert [(a.action, a.reason) for a in r.actions] == [
        ("moved", None),
        ("copied", "a gap below the moved range"),
    ]
    assert (tmp_path / "o").read_bytes() == data[20_000:] + data[:10_000]
    assert not p.exists()  # consumed: deleted at commit


@pytest.mark.parametrize("split", [W - 1, W, W + 1, 2 * W - 1, 2 * W, 2 * W + 1])
def test_pieces_ending_next_to_a_window_edge_are_moved_whole(tmp_path: Path, split: int) -> None:
    # One owned file in two slices, swapped: the one ending at ``split`` ends one byte before,
    # at, or one byte past a window edge (windows are counted from the file's end), so its
    # last byte is in a window of its own or shared with the other slice.
    data = pattern(3 * W, "edge")
    p = tmp_path / "src"
    p.write_bytes(data)
    f = FileBackedData(p, owned=True)
    r = save(tmp_path / "o", Cord([b"hdr", f.slice(split, 3 * W - split), f.slice(0, split)]),
             consume=True, window=W)
    assert (tmp_path / "o").read_bytes() == b"hdr" + data[split:] + data[:split]
    assert r.bytes_moved == 3 * W  # every byte the plan moves, once
    assert [a.action for a in r.actions if a.source] == ["moved", "moved"]
    assert not p.exists()
    assert leftovers(tmp_path) == []


def test_a_move_that_took_other_bytes_than_the_plans_is_never_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A window arithmetic that copies one destination's part twice (a bug) is caught before
    # the commit point by the count of bytes moved, and the save is rolled back.
    from filecord._txn import transfer

    real = transfer._windows

    def twice(*args: Any) -> Any:
        windows = real(*args)
        windows[0][2].append(windows[0][2][0])
        return windows

    monkeypatch.setattr(transfer, "_windows", twice)
    data = pattern(3 * W, "twice")
    p = tmp_path / "src"
    p.write_bytes(data)
    with pytest.raises(RuntimeError, match="not the plan's"):
        save(tmp_path / "o", Cord([b"hdr", FileBackedData(p, owned=True)]), consume=True,
             window=W)
    assert p.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["src"]


class FailAfterTruncates(_sys.Backend):
    """Fail the first rename onto a final name: after the commit point, every move done."""

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "rename" and not os.path.basename(str(args[1])).startswith("."):
            raise OSError(28, "injected ENOSPC")


def test_failed_consuming_save_rolls_back_byte_exact(tmp_path: Path) -> None:
    # Fail at the commit point: the write of the journal's committed step.
    a, b = pattern(50_000, "a"), pattern(12_345, "b")
    fa, fb = owned(tmp_path, "a", a), owned(tmp_path, "b", b)
    st_before = {d.path: os.stat(d.path) for d in (fa, fb)}

    def FailLastFsync() -> FailCommitStep:  # the committed step's write fails
        return FailCommitStep(5, "injected EIO at the commit point")

    out = tmp_path / "o"
    out.write_bytes(b"old output")
    with _sys.use(FailLastFsync()), pytest.raises(SaveError, match="injected") as info:
        save(out, Cord([b"h", fa, fb]), consume=True, window=W)
    assert out.read_bytes() == b"old output"
    assert leftovers(tmp_path) == []
    assert any("put back" in n for n in info.value.__notes__)
    assert Path(fa.path).read_bytes() == a
    assert Path(fb.path).read_bytes() == b
    for d in (fa, fb):
        assert os.stat(d.path).st_mtime_ns == st_before[d.path].st_mtime_ns
        d.check()  # the objects read again after the rollback
    # ...and the retry gives the same output as a save that never failed.
    save(out, Cord([b"h", fa, fb]), consume=True, window=W)
    assert out.read_bytes() == b"h" + a + b


class _CommitFsyncFailsThenUndoFails(FailCommitStep):
    """The committed step is written but its fsync fails (EIO); once the failure path's
    ``rolling back`` step is fsynced, every write into a source fails too, so the rollback
    stops and keeps its journal for inspection."""

    def __init__(self) -> None:
        super().__init__()
        self.journal_fd: int | None = None
        self.rolling = False

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if COMMITTED_STEP in bytes(data):
            self.journal_fd = fd
        elif self.rolling and fd != self.journal_fd:
            raise OSError(5, "injected EIO in the undo")
        elif b'"stage":"rolling back"' in bytes(data):
            self.rolling = True
        return _sys.Backend.pwrite(self, fd, data, offset)

    def copy_file_range(self, src: int, dst: int, count: int, src_off: int, dst_off: int) -> int:
        if self.rolling:
            raise OSError(5, "injected EIO in the undo")
        return super().copy_file_range(src, dst, count, src_off, dst_off)

    def fsync(self, fd: int) -> None:
        if fd == self.journal_fd and not self.rolling:
            self.journal_fd = -1  # once
            raise OSError(5, "injected EIO at the committed step's fsync")
        super().fsync(fd)


def test_a_commit_whose_fsync_failed_is_cut_off_the_journal(tmp_path: Path) -> None:
    """The committed step's fsync fails: the save is not committed; the rolling-back step is
    written where the committed one began, the committed step's bytes cut off (no record
    that does not check after it); recover then rolls back byte-exact."""
    from filecord._txn import journal
    from filecord._txn.stages import Stage

    a, b = pattern(50_000, "a"), pattern(12_345, "b")
    fa, fb = owned(tmp_path, "a", a), owned(tmp_path, "b", b)
    out = tmp_path / "o"
    with _sys.use(_CommitFsyncFailsThenUndoFails()), pytest.raises(SaveError) as info:
        save(out, Cord([b"h", fa, fb]), consume=True, window=W)
    assert info.value.journal_path is not None
    data = Path(info.value.journal_path).read_bytes()
    assert COMMITTED_STEP not in data
    log = journal.read_log(data)
    assert log.stage is Stage.ROLLING_BACK
    assert not log.torn
    assert data.endswith(journal.step(Stage.ROLLING_BACK))
    close_leaked(tmp_path)
    recover(tmp_path)
    assert leftovers(tmp_path) == []
    assert Path(fa.path).read_bytes() == a
    assert Path(fb.path).read_bytes() == b
    assert not out.exists()


def test_recover_finishes_a_committed_save(tmp_path: Path) -> None:
    a = pattern(40_000)
    fa = owned(tmp_path, "a", a)
    path_a = fa.path
    with _sys.use(FailAfterTruncates()), pytest.raises(SaveError) as info:
        save_many({tmp_path / "o1": Cord([fa]), tmp_path / "o2": b"x"}, consume=True, window=W)
    journal = info.value.journal_path
    assert journal is not None
    assert os.path.exists(journal)
    assert not (tmp_path / "o1").exists()  # committed but not yet renamed
    done = recover(tmp_path)
    assert [r.action for r in done] == ["finished"]
    assert (tmp_path / "o1").read_bytes() == a
    assert (tmp_path / "o2").read_bytes() == b"x"
    assert not os.path.exists(path_a)
    assert leftovers(tmp_path) == []
    assert recover(tmp_path) == []  # idempotent: nothing left to do


def test_recover_restores_an_uncommitted_move(tmp_path: Path) -> None:
    a = pattern(40_000)
    fa = owned(tmp_path, "a", a)

    class Crash(BaseException):
        pass

    class CrashAtThirdTruncate(_sys.Backend):
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.n += 1
                if self.n == 3:
                    raise Crash

    # Simulate a crash: the exception skips rollback only if rollback also dies, so make the
    # rollback's own restore fail too by crashing on every later call.
    class Dead(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            raise OSError(5, "machine is down")

    backend = CrashAtThirdTruncate()
    orig_hook = backend.hook

    def hook(op: str, args: tuple[object, ...]) -> None:
        if backend.n >= 3:
            Dead().hook(op, args)
        orig_hook(op, args)

    backend.hook = hook  # type: ignore[method-assign]
    with _sys.use(backend), pytest.raises(Crash):
        # A header byte first: a real move window by window, not an adoption by rename.
        save(tmp_path / "o", Cord([b"h", fa]), consume=True, window=W)
    assert close_leaked(tmp_path) >= 1  # the "dead" save still held its lock: let it die
    # The source was parked under the save's token name, then shortened by the move.
    assert not os.path.exists(fa.path)
    parked = [n for n in os.listdir(tmp_path) if n.endswith(".filecord-src")]
    assert len(parked) == 1
    assert os.path.getsize(tmp_path / parked[0]) < len(a)
    journals = [n for n in os.listdir(tmp_path) if n.endswith(".filecord-journal")]
    assert len(journals) == 1
    done = recover(tmp_path / journals[0])
    assert [r.action for r in done] == ["restored"]
    assert Path(fa.path).read_bytes() == a
    fa.check()
    assert not (tmp_path / "o").exists()
    assert leftovers(tmp_path) == []


def test_recover_refuses_a_committed_save_whose_output_is_lost(tmp_path: Path) -> None:
    a = pattern(40_000)
    fa = owned(tmp_path, "a", a)
    with _sys.use(FailAfterTruncates()), pytest.raises(SaveError) as info:
        save_many({tmp_path / "o1": Cord([fa]), tmp_path / "o2": b"x"}, consume=True, window=W)
    journal = info.value.journal_path
    assert journal is not None
    temps = [n for n in os.listdir(tmp_path) if n.startswith(".o1.") and n.endswith(".partial")]
    assert len(temps) == 1
    os.unlink(tmp_path / temps[0])  # the complete output vanished (someone cleaned up)
    with pytest.raises(RecoverError, match="lost"):
        recover(journal)
    assert os.path.exists(journal)  # kept: nothing it names is deleted on a guess


def test_ctrl_c_during_the_move_rolls_back_and_propagates(tmp_path: Path) -> None:
    a = pattern(50_000, "a")
    fa = owned(tmp_path, "a", a)

    class CtrlC(_sys.Backend):
        truncates = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.truncates += 1
                if self.truncates == 3:  # mid-move (the 1st truncate presizes the temp)
                    raise KeyboardInterrupt

    with _sys.use(CtrlC()), pytest.raises(KeyboardInterrupt) as info:
        save(tmp_path / "o", Cord([b"h", fa]), consume=True, window=W)
    assert Path(fa.path).read_bytes() == a
    fa.check()
    assert not (tmp_path / "o").exists()
    assert leftovers(tmp_path) == []
    assert any("can be retried" in n for n in info.value.__notes__)


def test_a_whole_owned_file_is_adopted_by_rename(tmp_path: Path) -> None:
    a = pattern(3 << 20, "a")
    fa = owned(tmp_path, "a", a)
    ino = os.stat(fa.path).st_ino
    report = save(tmp_path / "o", Cord([b"", fa]), consume=True, window=W)
    assert [x.action for x in report.file_actions()] == ["moved"]
    assert os.stat(tmp_path / "o").st_ino == ino  # the very file: no byte was copied
    assert (tmp_path / "o").read_bytes() == a
    assert not os.path.exists(fa.path)
    assert leftovers(tmp_path) == []
    # Nothing is held twice: only the margin is needed (the output and its lock file, two
    # blocks each, a block per 128 MiB of data, and the journal: its file and entry, and its
    # head twice, a few KiB with this directory's paths).
    peak = report.peaks[0]
    assert peak.needed == peak.margin
    assert 7 * peak.block < peak.margin <= 10 * peak.block


def test_a_failed_adoption_renames_the_source_back(tmp_path: Path) -> None:
    a = pattern(100_000, "a")
    fa = owned(tmp_path, "a", a)
    path, ino = fa.path, os.stat(fa.path).st_ino

    def FailCommitLine() -> FailCommitStep:  # the committed step's write fails
        return FailCommitStep(5, "injected EIO at the commit point")

    with _sys.use(FailCommitLine()), pytest.raises(SaveError, match="injected"):
        save(tmp_path / "o", Cord([fa]), consume=True, window=W)
    assert os.stat(path).st_ino == ino
    assert Path(path).read_bytes() == a
    fa.check()
    assert not (tmp_path / "o").exists()
    assert leftovers(tmp_path) == []



def test_a_failed_whole_adoption_gives_the_source_its_own_mode_back(tmp_path: Path) -> None:
    """Once renamed onto the temp, the adopted file is the save's: a mode given it there (here
    by another process; past the commit point the save gives it the output's) is taken back by
    the rollback, so the source returns as it was, bytes and mode."""
    a = pattern(100_000, "a")
    fa = owned(tmp_path, "a", a)
    os.chmod(fa.path, 0o640)
    path, ino = fa.path, os.stat(fa.path).st_ino

    class ChmodTheTemp(FailCommitStep):
        def rename(self, src: str, dst: str) -> None:
            super().rename(src, dst)
            if src == path:
                os.chmod(dst, 0o600)

    with _sys.use(ChmodTheTemp()), pytest.raises(SaveError, match="injected"):
        save(tmp_path / "o", Cord([fa]), consume=True, window=W)
    st = os.stat(path)
    assert (st.st_ino, st.st_mode & 0o7777) == (ino, 0o640)
    assert Path(path).read_bytes() == a
    assert not (tmp_path / "o").exists()
    assert leftovers(tmp_path) == []


SCRIPT = r"""
import sys
from filecord import Cord, FileBackedData, save_many
from filecord._io import syscalls as _sys

a, b, out, where = sys.argv[1:5]
fa, fb = FileBackedData.move_from(a), FileBackedData(b, owned=True)
print(fa.path, flush=True)


class FailMidMove(_sys.Backend):
    truncates = 0

    def hook(self, op, args):
        if op == "ftruncate":
            self.truncates += 1
            if self.truncates == 3:
                raise OSError(5, "injected EIO mid-move")


if where == "mid-move":
    ctx = _sys.use(FailMidMove())
    ctx.__enter__()
save_many({out: Cord([b"h", fa, fb])}, consume=True, window=8192)  # raises: ends the script
"""


@pytest.mark.parametrize("where", ["preflight", "mid-move"])
def test_a_failed_save_that_ends_the_script_keeps_every_owned_file(
    tmp_path: Path, where: str
) -> None:
    """The README's pattern, failing: the exception ends the process (finalizers run at
    exit); every owned source must still be on disk, byte-exact."""
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    a, b = pattern(50_000, "a"), pattern(30_000, "b")
    (tmp_path / "a").write_bytes(a)
    (tmp_path / "b").write_bytes(b)
    out = tmp_path / "missing-dir" / "o.pte" if where == "preflight" else tmp_path / "o.pte"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "a"), str(tmp_path / "b"), str(out),
         where],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)},
        check=False, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr  # it really died of the exception
    moved_a = Path(proc.stdout.split("\n")[0])
    assert moved_a.read_bytes() == a  # under move_from's private name, byte-exact
    assert (tmp_path / "b").read_bytes() == b
    assert leftovers(tmp_path) == []
    assert not out.exists()


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 20_000),
    cuts=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 6_000), st.integers(0, 2)),
                  min_size=1, max_size=8),
    tail=st.tuples(st.integers(0, 20_000), st.integers(0, 2)),
    window=st.sampled_from([4096, 5000, 8192, 65536]),
    fail_at=st.integers(0, 6),
)
def test_moves_and_rollbacks_of_random_layouts_are_byte_exact(
    tmp_path_factory: pytest.TempPathFactory, size: int,
    cuts: list[tuple[int, int, int]], tail: tuple[int, int], window: int, fail_at: int,
) -> None:
    # Random overlapping ranges of one owned file into three outputs, moved window by window;
    # then the same save failed at its fail_at-th truncate and rolled back.
    d = tmp_path_factory.mktemp("layout")
    data = pattern(size, "r")
    ranges = [(min(a, size), min(n, size - min(a, size)), o) for a, n, o in cuts]
    start = min(tail[0], size - 1)
    ranges.append((start, size - start, tail[1]))  # a run to the end: something is moved

    def run(*, fail: int | None) -> None:
        src = d / "src"
        src.write_bytes(data)
        f = FileBackedData(src, owned=True)
        outs: dict[Path, list[object]] = {d / f"o{o}": [b"h"] for o in range(3)}
        for a, n, o in ranges:
            outs[d / f"o{o}"].append(f.slice(a, n))

        class FailTruncate(_sys.Backend):
            n = 0

            def hook(self, op: str, args: tuple[object, ...]) -> None:
                if op == "ftruncate" and fail is not None:
                    self.n += 1
                    if self.n == fail:
                        raise OSError(5, "injected")

        with _sys.use(FailTruncate()):
            save_many({p: Cord(c) for p, c in outs.items()}, consume=True, window=window)

    try:
        run(fail=fail_at + 1)
    except OSError:
        assert (d / "src").read_bytes() == data  # rolled back byte-exact
        assert leftovers(d) == []
    for p in d.iterdir():
        p.unlink()
    run(fail=None)
    for o in range(3):
        want = b"h" + b"".join(data[a : a + n] for a, n, oo in ranges if oo == o)
        assert (d / f"o{o}").read_bytes() == want
    assert leftovers(d) == []
    for p in d.iterdir():
        p.unlink()
