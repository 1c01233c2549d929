"""A save that completed is finished by ``recover`` even when its last records are damaged.

Once the outputs hold their final names, the commit point was passed (a rename comes only
after the ``committed`` step's fsync): the files and the records that check decide, and a
damaged or lost ``committed`` step does not make recover refuse forever with the data on disk
twice.  What cannot be proven is refused as damage, naming the file, never blamed on another
process: an emptied or zeroed lock file is such damage.  So is a record before the last that
does not check: the records before it and the files decide, and a save whose outputs are under
their final names is finished (only files carrying its token removed).  An output under a
source's own name proves nothing: that inode was the source's before it was the output's.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover, save, save_many
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError, RecoverError, SaveError
from filecord_testing import AtCall, consume_killed_at_truncate, pattern
from support.killjob import fork_run

W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")


def renamed(d: Path, fail_at: int = 1, suffix: str = _names.SOURCE) -> None:
    """A consuming save of a.bin + b.bin past its commit and the rename onto out.bin: the
    ``fail_at``-th unlink of a file named ``*suffix`` fails (a parked source: the ones before
    it are done; the journal: every parked source is gone)."""
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    # The header puts both at offsets no block divides: both are moved (and parked), never
    # adopted in place.
    cord = Cord([b"hdr", FileBackedData(d / "a.bin", owned=True),
                 FileBackedData(d / "b.bin", owned=True)])

    class FailUnlink(_sys.Backend):
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]).endswith(suffix):
                self.n += 1
                if self.n == fail_at:
                    raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailUnlink()), pytest.raises(SaveError):  # committed: the outputs are done
        save(d / "out.bin", cord, consume=True, window=W)
    assert (d / "out.bin").read_bytes() == b"hdr" + A + B


def journal_of(d: Path) -> Path:
    return next(d / n for n in os.listdir(d) if n.endswith(_names.JOURNAL))


def lock_of(d: Path) -> Path:
    return next(d / n for n in os.listdir(d) if n.endswith(_names.LOCK))


def last_record(data: bytes) -> tuple[int, int]:
    """Where the last record's line starts and ends (its newline included)."""
    end = len(data)
    start = data.rindex(b"\n", 0, end - 1) + 1
    assert b'"stage":"committed"' in data[start:end]
    return start, end


def refused(d: Path) -> tuple[dict[str, bytes], str]:
    """The directory's files before a recover that must refuse, and what the refusal says
    (its message and notes)."""
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    with pytest.raises(RecoverError) as info:
        recover(d)
    return before, " ".join([str(info.value), *getattr(info.value, "__notes__", [])])


def finished(d: Path) -> bool:
    return sorted(os.listdir(d)) == ["out.bin"] and (d / "out.bin").read_bytes() == b"hdr" + A + B


@pytest.mark.parametrize("fail_at", [1, 2])
@pytest.mark.parametrize("damage", ["flip-payload", "flip-checksum", "cut-midway", "lost"])
def test_damaged_committed_step_after_the_rename_finishes(tmp_path: Path, damage: str,
                                                          fail_at: int) -> None:
    renamed(tmp_path, fail_at)
    j = journal_of(tmp_path)
    data = j.read_bytes()
    start, end = last_record(data)
    if damage == "flip-payload":
        at = end - 5
        data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
    elif damage == "flip-checksum":
        at = start + 12
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    elif damage == "cut-midway":
        data = data[:(start + end) // 2]
    else:
        data = data[:start]  # the whole step gone: the journal ends after the moving steps
    j.write_bytes(data)
    got = recover(tmp_path)
    assert finished(tmp_path), (got, os.listdir(tmp_path))
    assert [r.action for r in got] == ["finished"]
    assert "damaged" in got[0].detail
    assert recover(tmp_path) == []  # nothing left to do


def test_the_lost_step_never_loops_on_a_missing_temp(tmp_path: Path) -> None:
    renamed(tmp_path)
    j = journal_of(tmp_path)
    data = j.read_bytes()
    j.write_bytes(data[:last_record(data)[0]])
    got = recover(tmp_path)  # it refused saying "the temp file ... is missing", every time
    assert [r.action for r in got] == ["finished"]
    assert finished(tmp_path)
    assert recover(tmp_path) == []


@pytest.mark.parametrize("how", ["emptied", "zeroed"])
def test_a_damaged_lock_file_is_damage_not_another_journal(tmp_path: Path, how: str) -> None:
    renamed(tmp_path)
    lock = lock_of(tmp_path)
    size = lock.stat().st_size
    lock.write_bytes(b"" if how == "emptied" else b"\0" * size)
    before, story = refused(tmp_path)
    assert "damaged" in story, story
    assert "another journal" not in story, story
    assert lock.name in story, story
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_an_output_under_a_sources_own_name_is_no_proof_of_the_commit(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    # a.bin is the whole of the output a.bin: adopted by a rename onto its temp, so the
    # output's journaled inode is a.bin's own.  x.bin's temp is at its full length (a hole)
    # before b.bin's bytes are moved into it.
    outs = {tmp_path / "a.bin": Cord([FileBackedData(tmp_path / "a.bin", owned=True)]),
            tmp_path / "x.bin": Cord([b"hdr", FileBackedData(tmp_path / "b.bin", owned=True)])}

    def job() -> None:  # killed after the journal and b.bin's parking, before the adoption
        with _sys.use(AtCall("rename", 3, lambda: os.kill(os.getpid(), signal.SIGKILL))):
            save_many(outs, consume=True, window=W)

    assert fork_run(job) == -signal.SIGKILL
    assert (tmp_path / "a.bin").read_bytes() == A  # under its own name: the output's inode
    (temp,) = [tmp_path / n for n in os.listdir(tmp_path)
               if n.startswith(".x.bin.") and n.endswith(_names.TEMP)]
    assert temp.stat().st_size == 3 + len(B)
    got = recover(tmp_path)
    assert [r.action for r in got] == ["restored"]  # never "finished": no commit was made
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B


def flip_before_the_last(j: Path) -> None:
    """One bit of the payload of the record before the journal's last (a ``moving`` step
    before the ``committed`` one): a record that does not check before one that does."""
    data = bytearray(j.read_bytes())
    start, _end = last_record(bytes(data))
    prev = data.rindex(b"\n", 0, start - 1) + 1
    data[prev + 45] ^= 1
    j.write_bytes(bytes(data))


@pytest.mark.parametrize(("suffix", "fail_at"), [
    (_names.SOURCE, 1), (_names.SOURCE, 2), (_names.JOURNAL, 1)])
def test_an_earlier_damaged_record_of_a_renamed_save_is_finished_from_the_files(
        tmp_path: Path, suffix: str, fail_at: int) -> None:
    renamed(tmp_path, fail_at, suffix)
    flip_before_the_last(journal_of(tmp_path))
    got = recover(tmp_path)
    assert [r.action for r in got] == ["finished"]
    assert "damaged" in got[0].detail
    assert finished(tmp_path)
    assert recover(tmp_path) == []


def test_an_earlier_damaged_record_of_a_save_not_renamed_is_refused_naming_the_files(
        tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    cord = Cord([b"hdr", FileBackedData(tmp_path / "a.bin", owned=True),
                 FileBackedData(tmp_path / "b.bin", owned=True)])

    class FailRename(_sys.Backend):  # past the commit point, before the rename
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(tmp_path / "out.bin"):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="after its commit"):
        save(tmp_path / "out.bin", cord, consume=True, window=W)
    j = journal_of(tmp_path)
    flip_before_the_last(j)
    before, story = refused(tmp_path)
    assert "damaged" in story, story
    assert "another process" not in story, story
    for name in before:  # the journal, the temp, the parked sources (the lock holds no byte)
        assert name in story or name.endswith(_names.LOCK), (name, story)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_a_temp_renamed_by_hand_before_the_moves_finished_is_no_commit(tmp_path: Path) -> None:
    """Killed mid-move (whole records, no ``moved`` step yet), then the temp renamed onto
    out.bin by someone rescuing the output: the records prove the commit point was never
    reached, so recover does not finish (it would delete the parked sources and the journal,
    the one record of where a's moved bytes are); it refuses, naming out.bin as where they
    are.  Renamed back, the next recover rolls back byte-exact."""
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    (tmp_path / "out.bin").write_bytes(b"OLD")
    consume_killed_at_truncate(tmp_path, 3, W)
    temp = next(tmp_path / n for n in os.listdir(tmp_path) if n.endswith(_names.TEMP))
    parked = sorted(n for n in os.listdir(tmp_path) if n.endswith(_names.SOURCE))
    before = {n: (tmp_path / n).read_bytes() for n in parked}
    temp.rename(tmp_path / "out.bin")
    with pytest.raises(RecoverError) as caught:
        recover(tmp_path)
    said = " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])
    (got,) = caught.value.results  # type: ignore[attr-defined]
    assert got.action == "refused", said
    assert "never reached its commit point" in said, said
    # The byte map names out.bin, and a's moved bytes are there at the offset it gives.
    (line,) = (n for n in got.notes if n.startswith(f"{tmp_path / 'a.bin'}:"))
    found = re.search(rf"\[(\d+), (\d+)\) at offset (\d+) of "
                      rf"{re.escape(str(tmp_path / 'out.bin'))}$", line)
    assert found is not None, line
    lo, hi, at = map(int, found.groups())
    assert hi == len(A), line
    assert 0 < lo < hi, line
    assert (tmp_path / "out.bin").read_bytes()[at:at + hi - lo] == A[lo:hi]
    assert (tmp_path / parked[0]).read_bytes() == A[:lo]  # the kept prefix: every byte placed
    assert {n: (tmp_path / n).read_bytes() for n in parked} == before
    assert any(n.endswith(_names.JOURNAL) for n in os.listdir(tmp_path))
    (tmp_path / "out.bin").rename(temp)
    (again,) = recover(tmp_path)
    assert again.action == "restored"
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_a_source_kept_parked_by_a_finished_save_is_said_as_such_by_recover(
        tmp_path: Path) -> None:
    """After the commit another process grows parked a and puts a file at a.bin: the save
    finishes and keeps a's file under its parked name (its own name is taken).  Nothing of
    the save is left but that file, so recover (a start-up run on the directory) says both
    things it can be, never only "run recover on the output's directory" (this is that
    directory), and touches nothing."""
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)

    class ChangeAfterCommit(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(tmp_path / "out.bin"):
                parked = next(tmp_path / n for n in os.listdir(tmp_path)
                              if n.startswith(".a.bin.") and n.endswith(_names.SOURCE))
                with parked.open("ab") as f:
                    f.write(b"late")
                (tmp_path / "a.bin").write_bytes(b"other")

    cord = Cord([b"h", FileBackedData(tmp_path / "a.bin", owned=True),
                 FileBackedData(tmp_path / "b.bin", owned=True)])
    with _sys.use(ChangeAfterCommit()), pytest.raises(DataChangedError):
        save(tmp_path / "out.bin", cord, consume=True, window=W)
    assert (tmp_path / "out.bin").read_bytes() == b"h" + A + B
    (kept,) = (n for n in os.listdir(tmp_path) if n.endswith(_names.SOURCE))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RecoverError) as caught:
        recover(tmp_path)
    said = str(caught.value)
    assert f"{tmp_path / kept}: a source parked by save" in said, said
    assert "finished and kept this file" in said, said
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / kept).read_bytes().endswith(b"late")


def test_a_committed_step_that_cannot_be_cut_off_is_said_to_be_recovers_to_play(
        tmp_path: Path) -> None:
    """The ``committed`` step's fsync fails and so does every cut-off after it: the step stays
    whole in the journal, so the save's error must not promise a rollback; it says recover
    plays the step, and recover then completes the save."""
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)

    class CommitStuck(_sys.Backend):
        written = failed = False

        def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
            self.written = self.written or b'"stage":"committed"' in bytes(data)
            return super().pwrite(fd, data, offset)

        def fsync(self, fd: int) -> None:
            if self.written and not self.failed:
                self.failed = True
                raise OSError(errno.EIO, "injected EIO at the commit point")
            super().fsync(fd)

        def ftruncate(self, fd: int, size: int) -> None:
            if self.failed:
                raise OSError(errno.EIO, "injected EIO at the cut-off")
            super().ftruncate(fd, size)

    cord = Cord([b"h", FileBackedData(tmp_path / "a.bin", owned=True),
                 FileBackedData(tmp_path / "b.bin", owned=True)])
    with _sys.use(CommitStuck()), pytest.raises(SaveError) as caught:
        save(tmp_path / "out.bin", cord, consume=True, window=W)
    notes = " ".join(caught.value.__notes__)
    assert "could not be cut off the journal" in notes, notes
    assert "the save then completes" in notes, notes
    (got,) = recover(tmp_path)
    assert got.action == "finished"
    assert (tmp_path / "out.bin").read_bytes() == b"h" + A + B
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]
