"""Decisions of the finish and the rollback that no other test checked (issue 36's mutation
audit), each on real files, each failing when its decision is broken:

* a temp lost after the commit point while the final name still holds the old file: the
  output is lost, so nothing is finished, the parked sources are not deleted and the journal
  is kept;
* a later (not the first) moved source changed after the commit point: kept, never deleted,
  while the first is deleted and the save still finishes;
* a rollback that gives a source its name back fsyncs that source's directory, even where the
  directory holds no temp of the save;
* a rollback never gives a source its name back over a file made there after the crash: the
  original bytes stay at the parked name and recover refuses;
* a rollback never puts a temp's hole into a source where moved bytes should be;
* a finish never renames over a final name replaced after the save stopped;
* a finish keeps a kept prefix rewritten (same size) after the commit look;
* a rollback never punches a temp another name links to (a rescue copy keeps its bytes);
* an append of exactly the inserted length before an unrecorded insert is never collapsed.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, recover, save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import ChangeKind, DataChangedError, RecoverError, SaveError
from filecord_testing import AtCall, consume_killed_at_truncate, pattern
from support.faultfs import Tracer
from support.killjob import fork_run

W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")


def _cord(src: Path) -> Cord:
    (src / "a.bin").write_bytes(A)
    (src / "b.bin").write_bytes(B)
    # The header puts both at offsets no block divides: both moved and parked, never adopted.
    return Cord([b"hdr", FileBackedData(src / "a.bin", owned=True),
                 FileBackedData(src / "b.bin", owned=True)])


def committed(d: Path, cord: Cord | None = None) -> None:
    """Stopped after the commit point: the rename onto out.bin fails."""
    cord = _cord(d) if cord is None else cord

    class FailRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(d / "out.bin"):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="after its commit"):
        save(d / "out.bin", cord, consume=True, window=W)


def named(d: Path, suffix: str) -> list[Path]:
    return sorted(d / n for n in os.listdir(d) if n.endswith(suffix))


def test_a_temp_lost_after_the_commit_keeps_the_sources(tmp_path: Path) -> None:
    (tmp_path / "out.bin").write_bytes(b"the old file")
    committed(tmp_path)
    (temp,) = named(tmp_path, _names.TEMP)
    os.unlink(temp)
    parked = named(tmp_path, _names.SOURCE)
    assert len(parked) == 2
    with pytest.raises(RecoverError):
        recover(tmp_path)
    assert (tmp_path / "out.bin").read_bytes() == b"the old file"
    assert named(tmp_path, _names.SOURCE) == parked  # the only copy of the bytes: kept
    assert len(named(tmp_path, _names.JOURNAL)) == 1
    assert sorted(p.stat().st_size for p in parked) == [0, 0]  # moved whole, into the temp


def test_a_later_moved_source_changed_after_the_commit_is_kept(tmp_path: Path) -> None:
    committed(tmp_path)
    (pa,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.bin.")]
    (pb,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".b.bin.")]
    with open(pb, "ab") as f:  # the second moved source, written after the commit point
        f.write(b"NEW")
    with pytest.raises(RecoverError, match="kept"):
        recover(tmp_path)
    assert (tmp_path / "out.bin").read_bytes() == b"hdr" + A + B
    assert (tmp_path / "b.bin").read_bytes() == b"NEW"  # its own name back, never deleted
    assert not pa.exists()
    assert not (tmp_path / "a.bin").exists()
    assert named(tmp_path, _names.JOURNAL) == []


def test_a_rollback_fsyncs_the_directory_a_source_is_named_back_in(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    cord = _cord(src)

    class FailMidMove(Tracer):
        cuts = 0

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            super().hook(op, args)
            if op == "ftruncate" and self.paths.get(args[0], "").endswith(_names.SOURCE):
                self.cuts += 1
                if self.cuts == 2:
                    raise OSError(errno.EIO, "injected mid-move")

    tracer = FailMidMove()
    with _sys.use(tracer), pytest.raises(SaveError):
        save(out / "out.bin", cord, consume=True, window=W)
    assert (src / "a.bin").read_bytes() == A
    assert (src / "b.bin").read_bytes() == B
    # The last time a parked name left src/ (its unlink after the link back), and after it a
    # fsync of src/, which holds no temp of the save.
    gone = [c.index for c in tracer.calls if c.op == "unlink" and str(c.args[0]).startswith(
        str(src)) and str(c.args[0]).endswith(_names.SOURCE)]
    assert gone
    synced = [c.index for c in tracer.calls if c.op == "fsync_dir"
              and os.path.realpath(str(c.args[0])) == os.path.realpath(src)]
    assert any(n > max(gone) for n in synced), (gone, synced)


def _snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    return {n: ((d / n).read_bytes(), (d / n).stat().st_mode) for n in sorted(os.listdir(d))}


@pytest.mark.parametrize("kind", ["rewrite", "chmod"])
def test_the_kind_of_a_change_mid_move_decides_what_recover_does(tmp_path: Path,
                                                                 kind: str) -> None:
    """A same-size rewrite of the source being moved is a content change: the journal is held
    and recover refuses, touching nothing.  A chmod changed no byte: the journal is kept (not
    held) and recover rolls back, byte-exact."""
    cord = _cord(tmp_path)

    class ChangeMidMove(_sys.Backend):
        copies = 0

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op != "copy_file_range":
                return
            self.copies += 1
            if self.copies != 2:  # the second window: after the first source's first cut
                return
            (path,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.")]
            if kind == "rewrite":  # same size, another mtime
                fd = os.open(path, os.O_WRONLY)
                os.pwrite(fd, b"X", 0)
                st = os.fstat(fd)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
                os.close(fd)
            else:
                os.chmod(path, 0o600)

    with _sys.use(ChangeMidMove()), pytest.raises(DataChangedError) as info:
        save(tmp_path / "out.bin", cord, consume=True, window=W)
    assert info.value.kind is (ChangeKind.CONTENT if kind == "rewrite" else ChangeKind.METADATA)
    assert len(named(tmp_path, _names.JOURNAL)) == 1
    before = _snapshot(tmp_path)
    if kind == "rewrite":
        with pytest.raises(RecoverError):
            recover(tmp_path)
        assert _snapshot(tmp_path) == before
        return
    got = recover(tmp_path)
    assert [r.action for r in got] == ["restored"]
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def killed(d: Path, op: str, at: int) -> None:
    """The save of ``_cord`` SIGKILLed right before its ``at``-th ``op``: a real crash."""
    cord = _cord(d)

    def job() -> None:
        with _sys.use(AtCall(op, at, lambda: os.kill(os.getpid(), signal.SIGKILL))):
            save(d / "out.bin", cord, consume=True, window=W)

    assert fork_run(job) == -signal.SIGKILL


def test_a_rollback_never_names_a_source_back_over_a_file_made_there(tmp_path: Path) -> None:
    killed(tmp_path, "ftruncate", 3)  # mid-move: a source cut by one window, the next logged
    (pa,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.bin.")]
    (tmp_path / "a.bin").write_bytes(b"a new file")  # made at the parked source's name
    with pytest.raises(RecoverError, match="now another file"):
        recover(tmp_path)
    assert (tmp_path / "a.bin").read_bytes() == b"a new file"
    assert pa.read_bytes() == A  # its bytes put back, and kept at the parked name
    assert len(named(tmp_path, _names.JOURNAL)) == 1
    # Once the name is free again, the same journal finishes the rollback.
    (tmp_path / "a.bin").unlink()
    assert [r.action for r in recover(tmp_path)] == ["restored"]
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_a_rollback_never_restores_a_hole_in_a_temp_as_a_sources_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    # Block-aligned (no header, no adoption in place): a.bin's last window [2W, 3W) is moved
    # and cut, [W, 2W) moved and logged, its cut not done.
    consume_killed_at_truncate(tmp_path, 3, W)
    (pa,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.bin.")]
    (temp,) = named(tmp_path, _names.TEMP)
    assert pa.read_bytes() == A[:2 * W]
    fd = os.open(temp, os.O_RDWR)
    try:  # another process punches the moved bytes out of the temp
        _sys.punch_hole(fd, 2 * W, W)
    finally:
        os.close(fd)
    held = temp.read_bytes()
    assert held[2 * W:3 * W] == bytes(W)
    with pytest.raises((RecoverError, DataChangedError), match="holds no data"):
        recover(tmp_path)
    assert pa.read_bytes() == A[:2 * W]  # no zero written into the source
    assert temp.read_bytes() == held
    assert len(named(tmp_path, _names.JOURNAL)) == 1
    assert not (tmp_path / "a.bin").exists()


@pytest.mark.parametrize("old", [b"", b"the old file"])
def test_a_finish_never_renames_over_a_final_name_replaced_after_the_stop(tmp_path: Path,
                                                                           old: bytes) -> None:
    if old:
        (tmp_path / "out.bin").write_bytes(old)
    committed(tmp_path)
    (temp,) = named(tmp_path, _names.TEMP)
    parked = named(tmp_path, _names.SOURCE)
    newer = tmp_path / "newer"
    newer.write_bytes(b"a newer file")
    os.replace(newer, tmp_path / "out.bin")  # another inode at the final name
    with pytest.raises(RecoverError, match="replaced after"):
        recover(tmp_path)
    assert (tmp_path / "out.bin").read_bytes() == b"a newer file"
    assert temp.read_bytes() == b"hdr" + A + B  # the output stays at its temp
    assert named(tmp_path, _names.SOURCE) == parked
    assert len(named(tmp_path, _names.JOURNAL)) == 1


def test_a_kept_prefix_rewritten_after_the_commit_look_is_kept(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(A)
    # a.bin's first W bytes are no output's: its kept prefix, left when its move is over.
    committed(tmp_path, Cord([b"hdr", FileBackedData(tmp_path / "a.bin", owned=True).slice(
        W, 2 * W)]))
    (pa,) = named(tmp_path, _names.SOURCE)
    assert pa.read_bytes() == A[:W]
    fd = os.open(pa, os.O_WRONLY)
    try:  # rewritten in place after the commit look: the same size, a later mtime
        os.pwrite(fd, b"X" * 16, 0)
        st = os.fstat(fd)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    finally:
        os.close(fd)
    with pytest.raises((RecoverError, DataChangedError), match="kept"):
        recover(tmp_path)
    assert (tmp_path / "out.bin").read_bytes() == b"hdr" + A[W:]
    assert (tmp_path / "a.bin").read_bytes() == b"X" * 16 + A[16:W]  # named back, not deleted
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "out.bin"]


def test_a_parked_source_replaced_after_the_commit_is_kept_and_said(tmp_path: Path) -> None:
    """Another process puts a new file (another inode, the same size and times) at a parked
    source's name after the commit point: the finish never deletes it, names it back (the
    source's name is free), says so and fails; nothing is left under the save's token, so a
    second recover has nothing to do."""
    committed(tmp_path)
    (pa,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.bin.")]
    st = pa.stat()
    theirs = b"T" * st.st_size
    pa.rename(tmp_path / "old-parked")
    pa.write_bytes(theirs)
    os.utime(pa, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises((RecoverError, DataChangedError), match="kept") as info:
        recover(tmp_path)
    assert "a.bin" in " ".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert (tmp_path / "a.bin").read_bytes() == theirs
    assert (tmp_path / "out.bin").read_bytes() == b"hdr" + A + B
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "old-parked", "out.bin"]
    assert recover(tmp_path) == []


def test_a_recover_killed_before_putting_a_sources_times_back_is_continued(
        tmp_path: Path) -> None:
    """recover logs ``rolling back`` before it grows a source back: killed once a.bin is whole
    again but before its times are put back (a new mtime, its full size: what another
    process's rewrite would look like mid-move), the next recover continues the rollback."""
    killed(tmp_path, "ftruncate", 3)  # a.bin cut by one window; b.bin parked, untouched

    def job() -> None:  # b.bin's times come back first (newest first), then a.bin's
        with _sys.use(AtCall("futimens", 2, lambda: os.kill(os.getpid(), signal.SIGKILL))):
            recover(tmp_path)

    assert fork_run(job) == -signal.SIGKILL
    (pa,) = [p for p in named(tmp_path, _names.SOURCE) if p.name.startswith(".a.bin.")]
    assert pa.read_bytes() == A  # whole again, its times not yet put back
    assert [r.action for r in recover(tmp_path)] == ["restored"]
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_a_rollback_never_punches_a_temp_another_name_links_to(tmp_path: Path) -> None:
    """A temp someone linked to another name (a rescue copy) is not the save's alone: the
    rollback copies the moved bytes back out of it but never punches them out of it."""
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    consume_killed_at_truncate(tmp_path, 3, W)  # a.bin's last window moved and cut
    (temp,) = named(tmp_path, _names.TEMP)
    rescue = tmp_path / "rescue.bin"
    os.link(temp, rescue)
    held = rescue.read_bytes()
    assert held[2 * W:3 * W] == A[2 * W:]  # the moved window, only there now
    assert [r.action for r in recover(tmp_path)] == ["restored"]
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert rescue.read_bytes() == held  # byte for byte: no range punched out of it
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin", "rescue.bin"]


def test_an_append_of_the_inserted_length_before_the_insert_is_never_collapsed(
        tmp_path: Path) -> None:
    """A source adopted in place, killed at its insert after another writer appended exactly
    as many bytes as the insert adds: the size is the one an insert leaves, but the insert is
    not recorded and no hole stands in front of the source (its own bytes do), so the bytes
    past it are the writer's.  recover refuses and cuts nothing: collapsing the front would
    throw away the source's own first block."""
    blob = tmp_path / "blob.bin"
    data = pattern(3 * W + 3, "s")
    blob.write_bytes(data)
    ino = blob.stat().st_ino
    extra = b"W" * W  # the inserted length: the header is one block
    writer = os.open(blob, os.O_WRONLY | os.O_APPEND)

    class AppendThenDie(_sys.Backend):
        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "insert_range" and isinstance(args[0], int) and (
                    os.fstat(args[0]).st_ino == ino):
                os.write(writer, extra)
                os.kill(os.getpid(), signal.SIGKILL)

    def job() -> None:
        with _sys.use(AppendThenDie()):
            save(tmp_path / "out.bin", Cord([b"H" * W, FileBackedData(blob, owned=True),
                                             b"T" * 10]), consume=True)

    try:
        status = fork_run(job)
    finally:
        os.close(writer)
    if status == 0:
        pytest.skip("no range inserted here: the source was not adopted in place")
    assert status == -signal.SIGKILL
    (temp,) = named(tmp_path, _names.TEMP)
    assert temp.read_bytes() == data + extra  # the source renamed onto the temp, appended to
    with pytest.raises(RecoverError, match="does not record the space inserted"):
        recover(tmp_path)
    assert temp.read_bytes() == data + extra  # nothing collapsed, nothing cut
    assert not blob.exists()
    assert len(named(tmp_path, _names.JOURNAL)) == 1


def test_a_parked_source_cut_below_its_kept_prefix_during_recover_is_refused(
        tmp_path: Path) -> None:
    """Another process cuts a parked source below its kept prefix (bytes no output holds)
    after recover judged the files and before it puts the source back: the put-back refuses
    (a RecoverError naming where the bytes are), writes nothing, and keeps the journal."""
    a = tmp_path / "a.bin"
    a.write_bytes(A)
    # a.bin's first W bytes are no output's: its kept prefix (run_start W); [W, 3W) moved.
    cord = Cord([b"hdr", FileBackedData(a, owned=True).slice(W, 2 * W)])

    def job() -> None:  # killed before the second cut: the move half done
        with _sys.use(AtCall("ftruncate", 3, lambda: os.kill(os.getpid(), signal.SIGKILL))):
            save(tmp_path / "out.bin", cord, consume=True, window=W)

    assert fork_run(job) == -signal.SIGKILL
    (pa,) = named(tmp_path, _names.SOURCE)
    assert pa.read_bytes() == A[:2 * W]

    class CutBelowThePrefix(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "open" and str(args[0]) == str(pa) and not self.done:
                self.done = True  # the put-back opens it to grow it back: cut first
                os.truncate(pa, W // 2)

    with _sys.use(CutBelowThePrefix()), pytest.raises(RecoverError):
        recover(tmp_path)
    assert pa.read_bytes() == A[:W // 2]  # nothing written into it, nothing renamed
    assert not a.exists()
    assert len(named(tmp_path, _names.JOURNAL)) == 1
    assert len(named(tmp_path, _names.TEMP)) == 1


def test_a_file_adopted_in_place_cut_and_rewritten_before_the_commit_is_held(
        tmp_path: Path) -> None:
    """Another process cuts a file adopted in place back to the inserted space and writes
    its own bytes to the output's full length before the commit: size and times cannot tell
    that from the save's writes, the blocks can.  The save stops with a DataChangedError, the
    journal kept (held), and nothing is published under the final name."""
    blob = tmp_path / "blob.bin"
    data = pattern(3 * W + 3, "s")
    blob.write_bytes(data)
    length = W + len(data) + 10

    class RewriteBeforeTheCommit(_sys.Backend):
        inserted = False
        fsyncs = 0

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "insert_range" and isinstance(args[0], int):
                self.inserted = os.readlink(f"/proc/self/fd/{args[0]}").endswith(_names.TEMP)
            elif op == "fsync" and self.inserted and os.readlink(
                    f"/proc/self/fd/{args[0]}").endswith(_names.TEMP):
                self.fsyncs += 1
                if self.fsyncs == 2:  # the temps' last fsync before the commit point
                    os.ftruncate(args[0], W)
                    os.pwrite(args[0], b"Z" * (length - W), W)

    backend = RewriteBeforeTheCommit()
    with _sys.use(backend), pytest.raises(DataChangedError) as info:
        save(tmp_path / "out.bin", Cord([b"H" * W, FileBackedData(blob, owned=True),
                                         b"T" * 10]), consume=True)
    if not backend.inserted:
        pytest.skip("no range inserted here: the source was not adopted in place")
    assert "blocks adopted" in str(info.value)
    assert not (tmp_path / "out.bin").exists()
    assert len(named(tmp_path, _names.JOURNAL)) == 1


def test_the_saves_own_finish_keeps_a_source_written_after_its_last_look(
        tmp_path: Path) -> None:
    """Past the commit point the save itself deletes only parked sources still as it last
    saw them: one another process appended to after the ``committed`` step is kept under its
    own name and the save raises a committed DataChangedError saying so (the outputs are
    complete), while the unchanged one is deleted."""
    cord = _cord(tmp_path)

    class AppendAfterTheCommit(_sys.Backend):
        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "rename" and str(args[1]) == str(tmp_path / "out.bin"):
                (pb,) = [p for p in named(tmp_path, _names.SOURCE)
                         if p.name.startswith(".b.bin.")]
                with open(pb, "ab") as f:
                    f.write(b"NEW")

    with _sys.use(AppendAfterTheCommit()), pytest.raises(DataChangedError) as info:
        save(tmp_path / "out.bin", cord, consume=True, window=W)
    assert info.value.committed
    assert (tmp_path / "out.bin").read_bytes() == b"hdr" + A + B
    assert (tmp_path / "b.bin").read_bytes() == b"NEW"  # kept, its name back
    assert not (tmp_path / "a.bin").exists()
    assert sorted(os.listdir(tmp_path)) == ["b.bin", "out.bin"]


def test_a_rollback_that_cannot_remove_its_temp_says_to_recover_before_a_retry(
        tmp_path: Path) -> None:
    """A failed consuming save puts every source back but cannot unlink its temp: the journal
    and lock files stay too, and the error says to run recover before a retry (a retry that
    consumes the sources first would leave a journal naming sources that are gone)."""
    class Fail(_sys.Backend):
        def __init__(self) -> None:
            self.truncates = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            self.truncates += op == "ftruncate"
            if op == "ftruncate" and self.truncates == 2:
                raise OSError(errno.EIO, "injected mid-move")
            if op == "unlink" and str(args[0]).endswith(_names.TEMP):
                raise OSError(errno.EIO, "injected at the temp's unlink")

    with _sys.use(Fail()), pytest.raises(SaveError, match="injected mid-move") as caught:
        save(tmp_path / "out.bin", _cord(tmp_path), consume=True, window=W)
    (j,) = named(tmp_path, _names.JOURNAL)
    said = " ".join(getattr(caught.value, "__notes__", []))
    assert f"retried once `filecord recover {j}` has removed" in said
    assert (tmp_path / "a.bin").read_bytes() == A
    assert (tmp_path / "b.bin").read_bytes() == B
    assert [r.action for r in recover(tmp_path)] == ["restored"]
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]
