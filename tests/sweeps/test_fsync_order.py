"""The order of the durable steps, read from the system calls a save makes (the ``_sys`` seam).

The power-cut model makes truncates durable at once and keeps no timestamps, so it cannot see
a missing fsync on these three paths; the call order can.  Each test fails when the fsync it
names is removed (the mutation audit of issue 22):

* a moved source's last cut is fsynced before the journal's ``moving`` step is appended, and
  that step is fsynced before the next source is cut;
* the journal is fsynced after its ``committed`` step is appended (the commit point: the last
  append, at the end of the record before it) and before any temp is renamed onto its final
  name;
* a put-back fsyncs the source after restoring its times, before its name is given back;
* a lock file's name is re-checked after ``flock``: a lock removed by a recover in between
  stops the save before any temp exists;
* every temp is fsynced after its last write, before the commit point (the ``committed``
  step, or without a journal the rename);
* the directories of the renamed outputs are fsynced before the first consumed source or the
  journal is unlinked (the renames durable before what only they replace is gone);
* the space inserted in front of a file adopted in place is fsynced before its ``inserted``
  step and before the first byte is written into the file;
* every temp's directory is fsynced before the journal gets its name (two directories).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, save, save_many
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import journal
from filecord._txn.stages import Stage
from filecord.errors import SaveError
from filecord_testing import pattern
from support.faultfs import Tracer

W = 4096


def _consume(d: Path, backend: _sys.Backend) -> tuple[bytes, bytes]:
    a, b = pattern(3 * W, "a"), pattern(2 * W, "b")
    (d / "a.bin").write_bytes(a)
    (d / "b.bin").write_bytes(b)
    # Two moves, whatever the file system: where ranges insert, a (whole, at offset 0) would
    # be adopted in place instead of moved; this file checks the moves' fsync order.
    with _sys.use(backend):
        save(d / "out.bin", Cord([FileBackedData(d / "a.bin", owned=True),
                                  FileBackedData(d / "b.bin", owned=True)]),
             consume=True, window=W, in_place=False)
    return a, b


def test_a_source_is_fsynced_after_its_last_cut_before_its_moved_record(tmp_path: Path) -> None:
    """Every cut comes after its ``cut`` step's fsync; a ``moving`` or ``committed`` step only
    once every cut before it is fsynced (a ``cut`` step may precede that: it names a size the
    source is at, or an earlier one its steps name, whichever cut reaches the disk)."""
    tracer = _Writes()
    a, b = _consume(tmp_path, tracer)
    assert (tmp_path / "out.bin").read_bytes() == a + b
    calls = tracer.calls
    journal_fd = {c.args[0] for c in calls if c.op == "pwrite"
                  and c.path.endswith(_names.PENDING)}
    assert len(journal_fd) == 1
    cut_since: dict[str, bool] = {}  # parked source -> cut and not yet fsynced
    appends = cuts = 0
    pending_record = False
    for c in calls:
        if c.op == "ftruncate" and c.path.endswith(_names.SOURCE):
            assert not pending_record, f"call {c.index}: a cut before the last record's fsync"
            cut_since[c.path] = True
        elif c.op == "fsync" and c.path.endswith(_names.SOURCE):
            cut_since[c.path] = False
        elif c.op == "pwrite" and c.args[0] in journal_fd and c.args[2] > 0:
            pending_record = True
            if b'"cut"' in tracer.data[c.index]:
                cuts += 1
                continue
            appends += 1
            unsynced = [p for p, dirty in cut_since.items() if dirty]
            assert not unsynced, f"call {c.index}: a journal record before {unsynced}'s fsync"
        elif c.op == "fsync" and c.args[0] in journal_fd:
            pending_record = False
    assert appends == 3  # moving 1, moving 2, committed
    assert cuts == 5  # one per window: a's three, b's two


class _Writes(Tracer):
    """A tracer that also keeps the bytes written to the journal (by call index)."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[int, bytes] = {}

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if self.paths.get(fd, "").endswith(_names.PENDING):
            self.data[self.calls[-1].index] = bytes(data)
        return super().pwrite(fd, data, offset)


def test_the_committed_step_is_made_durable_before_any_final_name_changes(
    tmp_path: Path,
) -> None:
    tracer = _Writes()
    _consume(tmp_path, tracer)
    calls = tracer.calls
    final = next(c for c in calls if c.op == "rename"
                 and str(c.args[1]) == str(tmp_path / "out.bin"))
    writes = [c for c in calls if c.index in tracer.data and c.index < final.index]
    commit = writes[-1]
    record = journal.unframe(tracer.data[commit.index].rstrip(b"\n"))
    assert journal.stage_of(record) is Stage.COMMITTED
    # Appended at the end of the record before it (the logical end), never over it.
    before = writes[-2]
    assert commit.args[2] == before.args[2] + before.args[1]
    between = [c for c in calls if commit.index < c.index < final.index]
    assert any(c.op == "fsync" and c.args[0] == commit.args[0] for c in between), (
        "the commit point is not durable before the renames")
    # No rename of the journal any more: its one name from the pending rename to its unlink.
    assert not [c for c in calls if c.op == "rename" and _names.JOURNAL in str(c.args[0])]


class _FailSecondMove(Tracer):
    """Fail the first cut of b.bin (EIO): the save rolls a.bin back (a put-back)."""

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        super().hook(op, args)
        c = self.calls[-1]
        if op == "ftruncate" and ".b.bin." in c.path:
            raise OSError(errno.EIO, "injected")


def test_a_put_back_fsyncs_the_restored_times_before_the_name_comes_back(
    tmp_path: Path,
) -> None:
    tracer = _FailSecondMove()
    with pytest.raises(SaveError):
        _consume(tmp_path, tracer)
    assert (tmp_path / "a.bin").read_bytes() == pattern(3 * W, "a")
    calls = tracer.calls
    times = [c for c in calls if c.op == "futimens"]
    assert times, "no put-back restored times"
    for t in times:
        link = next(c for c in calls if c.index > t.index and c.op in ("link", "rename")
                    and str(c.args[0]) == t.path)
        assert any(c.op == "fsync" and c.args[0] == t.args[0]
                   for c in calls if t.index < c.index < link.index), (
            f"{t.path}: its times are not fsynced before its name is given back")


def test_a_put_back_window_is_fsynced_in_the_source_before_the_temp_lets_go(
    tmp_path: Path,
) -> None:
    """A rollback copies a window back into the source and fsyncs the source before it
    punches that window out of the temp: the bytes are durable in one of the two always."""
    tracer = _FailSecondMove()
    with pytest.raises(SaveError):
        _consume(tmp_path, tracer)
    assert (tmp_path / "a.bin").read_bytes() == pattern(3 * W, "a")
    calls = tracer.calls
    punches = [c for c in calls if c.op == "punch_hole" and c.path.endswith(_names.TEMP)]
    assert punches, "no window was put back"
    for p in punches:
        back = [c for c in calls if c.index < p.index and c.op in _WRITES
                and c.op != "ftruncate" and (c.args[1] if c.op == "copy_file_range"
                                             else c.args[0]) in _source_fds(tracer)]
        assert back, f"call {p.index}: a punch before any byte went back"
        last = back[-1]
        src_fd = last.args[1] if last.op == "copy_file_range" else last.args[0]
        assert any(c.op == "fsync" and c.args[0] == src_fd
                   for c in calls if last.index < c.index < p.index), (
            f"call {p.index}: the temp punched before the source (written at call "
            f"{last.index}) was fsynced")


def _source_fds(tracer: Tracer) -> set[int]:
    return {fd for fd, path in tracer.paths.items() if path.endswith(_names.SOURCE)}


class _RemoveLockAtFlock(_sys.Backend):
    """A recover that found the new lock file unlocked and removed it, between the save's
    ``open`` and its ``flock``: only where the lock is made under its name, so unnamed files
    (``O_TMPFILE``) are refused here as a file system without them refuses them."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.done = False

    def open(self, path: str, flags: int, mode: int) -> int:
        tmpfile = getattr(os, "O_TMPFILE", 0)
        if tmpfile and flags & tmpfile == tmpfile:
            raise OSError(errno.EOPNOTSUPP, "no unnamed files here")
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "flock" and not self.done and self.paths.get(args[0], "").endswith(
            _names.LOCK
        ):
            self.done = True
            os.unlink(self.paths[args[0]])


def test_a_lock_removed_between_open_and_flock_stops_the_save(tmp_path: Path) -> None:
    with pytest.raises(SaveError, match="removed by a recover"):
        _consume(tmp_path, _RemoveLockAtFlock())
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]  # no temp, sources whole
    assert (tmp_path / "a.bin").read_bytes() == pattern(3 * W, "a")


class _LookAtTheLock(_sys.Backend):
    """At each ``link`` and right after it, what a recover would find under the lock's name."""

    def __init__(self) -> None:
        self.found: list[tuple[bool, bool, int]] = []  # (exists, locked, size)

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "link" and str(args[1]).endswith(_names.LOCK):
            self.found.append(self._look(str(args[1])))

    def link_fd(self, fd: int, dst: str) -> None:
        super().link_fd(fd, dst)
        self.found.append(self._look(dst))

    @staticmethod
    def _look(path: str) -> tuple[bool, bool, int]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return (False, False, 0)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return (True, True, os.fstat(fd).st_size)
            return (True, False, os.fstat(fd).st_size)
        finally:
            os.close(fd)


def test_a_lock_file_has_its_name_only_once_locked_and_written(tmp_path: Path) -> None:
    # The fresh-clone CI run: a recover took a just-made lock file in the instant before its
    # save locked it, and removed it. Made unnamed, locked, written, fsynced, then linked, the
    # name never shows an unlocked or empty lock file.
    look = _LookAtTheLock()
    _consume(tmp_path, look)
    assert look.found
    assert look.found[0] == (False, False, 0)  # no name before the link
    assert all(locked and size > 0 for exists, locked, size in look.found[1:] if exists)
    assert (True, True) in {(e, locked) for e, locked, _size in look.found}



_WRITES = ("pwrite", "write", "copy_file_range", "sendfile", "ftruncate", "fallocate",
           "clone_range")


@pytest.mark.parametrize("journaled", [False, True])
def test_every_temp_is_fsynced_after_its_last_write_before_the_commit_point(
        tmp_path: Path, journaled: bool) -> None:
    """Copies and writes (nothing moved): the temps' only fsync is the one before the commit
    point.  Two outputs need a journal (its ``committed`` step is the commit point), one does
    not (its rename is)."""
    a = pattern(3 * W + 5, "a")
    (tmp_path / "a.bin").write_bytes(a)
    outs = {tmp_path / "one.bin": Cord([b"hdr", FileBackedData(tmp_path / "a.bin")])}
    if journaled:
        outs[tmp_path / "two.bin"] = Cord([b"x" * 10, FileBackedData(tmp_path / "a.bin")])
    tracer = _Writes()
    with _sys.use(tracer):
        save_many(outs, window=W)
    assert (tmp_path / "one.bin").read_bytes() == b"hdr" + a
    calls = tracer.calls
    commit = min(c.index for c in calls if c.op == "rename" and str(c.args[1]) in map(str, outs))
    if journaled:
        commit = max(c.index for c in calls if c.index in tracer.data and c.index < commit)
        assert b'"committed"' in tracer.data[commit]
    temps = {c.path for c in calls if c.path.endswith(_names.TEMP)}
    assert len(temps) == len(outs)
    for t in temps:
        last = max(c.index for c in calls if c.path == t and c.op in _WRITES)
        assert any(c.op == "fsync" and c.path == t for c in calls if last < c.index < commit), (
            f"{t}: written at call {last}, not fsynced before the commit point (call {commit})")


def test_the_renames_are_durable_before_a_consumed_source_or_the_journal_is_unlinked(
        tmp_path: Path) -> None:
    tracer = _Writes()
    a, b = _consume(tmp_path, tracer)
    assert (tmp_path / "out.bin").read_bytes() == a + b
    calls = tracer.calls
    rename = next(c for c in calls if c.op == "rename"
                  and str(c.args[1]) == str(tmp_path / "out.bin"))
    first_unlink = min(c.index for c in calls if c.op == "unlink" and (
        str(c.args[0]).endswith((_names.SOURCE, _names.JOURNAL))))
    assert any(c.op == "fsync_dir" and os.path.realpath(str(c.args[0])) == os.path.realpath(
        tmp_path) for c in calls if rename.index < c.index < first_unlink), (
        "the rename onto out.bin is not durable before the consumed sources go")


def test_the_inserted_space_is_fsynced_before_its_step_and_before_a_byte_lands_in_it(
        tmp_path: Path) -> None:
    """Adoption in place: the space inserted in front of the adopted file is fsynced after the
    insert, before the journal's ``inserted`` step is appended and before the save writes the
    first byte into the adopted file (its size alone cannot tell the insert from an append)."""
    data = pattern(3 * W + 3, "s")
    (tmp_path / "src.bin").write_bytes(data)
    tracer = _Writes()
    with _sys.use(tracer):
        report = save(tmp_path / "out.bin", Cord([b"H" * W, FileBackedData(
            tmp_path / "src.bin", owned=True), b"T" * 10]), consume=True)
    assert (tmp_path / "out.bin").read_bytes() == b"H" * W + data + b"T" * 10
    calls = tracer.calls
    # (the preflight probes insertion on a scratch file of its own first)
    inserts = [c for c in calls if c.op == "insert_range" and c.path.endswith(_names.TEMP)]
    if not inserts:
        pytest.skip(f"no range inserted here ({report.adopt_note})")
    (ins,) = inserts
    fd = ins.args[0]
    step = next(c for c in calls if c.index > ins.index and c.index in tracer.data
                and b'"inserted"' in tracer.data[c.index])
    first_write = min(c.index for c in calls if c.index > ins.index and c.op in _WRITES
                      and (c.args[0] == fd or (c.op == "copy_file_range" and c.args[1] == fd)))
    synced = [c.index for c in calls if c.op == "fsync" and c.args[0] == fd
              and ins.index < c.index]
    assert synced, f"insert at call {ins.index}: the file never fsynced after it"
    assert synced[0] < min(step.index, first_write), (
        f"insert at call {ins.index}, its step at {step.index}, the first write into the "
        f"file at {first_write}, its fsyncs at {synced}")


def test_every_temps_name_is_durable_before_the_journals_name(tmp_path: Path) -> None:
    """Two outputs in two directories: each temp's directory is fsynced after the temp is
    made and before the pending journal is renamed to its journal name, so no crash leaves a
    journal whose temps (where moved bytes go) have no names."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    a, b = pattern(3 * W, "a"), pattern(2 * W, "b")
    (tmp_path / "a.bin").write_bytes(a)
    (tmp_path / "b.bin").write_bytes(b)
    tracer = _Writes()
    with _sys.use(tracer):
        save_many({one / "x.bin": Cord([b"hdr", FileBackedData(tmp_path / "a.bin")]),
                   two / "y.bin": Cord([b"hdr", FileBackedData(tmp_path / "b.bin")])}, window=W)
    assert (one / "x.bin").read_bytes() == b"hdr" + a
    assert (two / "y.bin").read_bytes() == b"hdr" + b
    calls = tracer.calls
    named_journal = next(c.index for c in calls if c.op == "rename"
                         and str(c.args[1]).endswith(_names.JOURNAL))
    for d in (one, two):
        made = next(c.index for c in calls if c.op == "open" and c.path.endswith(_names.TEMP)
                    and os.path.dirname(c.path) == str(d))
        assert any(c.op == "fsync_dir" and os.path.realpath(str(c.args[0])) == str(d)
                   for c in calls if made < c.index < named_journal), (
            f"{d}: its temp made at call {made}, its name not durable before the journal's "
            f"(call {named_journal})")


def test_the_parked_names_are_durable_before_the_first_cut(tmp_path: Path) -> None:
    """Every source is renamed to its parked name and that directory fsynced before any
    source is cut: a crash leaves each source at one of its two names, never at its own
    name cut short."""
    tracer = _Writes()
    a, b = _consume(tmp_path, tracer)
    assert (tmp_path / "out.bin").read_bytes() == a + b
    calls = tracer.calls
    parks = [c for c in calls if c.op == "rename" and str(c.args[1]).endswith(_names.SOURCE)]
    assert len(parks) == 2
    first_cut = min(c.index for c in calls if c.op == "ftruncate"
                    and c.path.endswith(_names.SOURCE))
    for p in parks:
        d = os.path.realpath(os.path.dirname(str(p.args[1])))
        assert any(c.op == "fsync_dir" and os.path.realpath(str(c.args[0])) == d
                   for c in calls if p.index < c.index < first_cut), (
            f"{p.args[1]}: parked at call {p.index}, not durable before the first cut "
            f"(call {first_cut})")


def test_every_cut_follows_its_durable_cut_step(tmp_path: Path) -> None:
    """Each truncate of a parked source comes after the journal's ``cut`` step naming that
    very size is appended and fsynced: recover reads how far a move got from the log, so no
    source may be at a size the log does not name."""
    tracer = _Writes()
    a, b = _consume(tmp_path, tracer)
    assert (tmp_path / "out.bin").read_bytes() == a + b
    calls = tracer.calls
    cuts = [c for c in calls if c.op == "ftruncate" and c.path.endswith(_names.SOURCE)]
    assert len(cuts) == 5
    for cut in cuts:
        steps = [c for c in calls if c.index < cut.index and c.index in tracer.data]
        last = steps[-1]
        # (the journal's first write is its magic line and head: its last line is a record)
        record = journal.unframe(tracer.data[last.index].rstrip(b"\n").split(b"\n")[-1])
        assert record.get("cut", [None])[-1] == cut.args[1], (  # type: ignore[index]
            f"call {cut.index}: cut to {cut.args[1]} after the record {record}")
        assert any(c.op == "fsync" and c.args[0] == last.args[0]
                   for c in calls if last.index < c.index < cut.index), (
            f"call {cut.index}: its cut step (call {last.index}) not fsynced before it")
