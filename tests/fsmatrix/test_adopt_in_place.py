"""Issue 26 item 1: zero-copy adoption, end to end on real file systems.

* ext4 (and XFS where its probe says yes): a consumed blob behind a header becomes the
  output's file where it lies: ``bytes_copied == 0`` for it, its physical extents unchanged
  (``filefrag -v``: shifted logically by the header, same physical blocks), the output byte
  for byte the header, the blob and the suffix at their offsets, ``st_blocks`` of the output
  showing no second copy, the source gone.
* A failure at each step of the adoption rolls back in process: the source comes back under
  its name byte for byte with its mtime, its extents the ones it had, no temp left.
* tmpfs and btrfs fall back to today's move/clone and the report says why (no "adopted").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fskit
import pytest

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from filecord.errors import SaveError

pytestmark = pytest.mark.root

MiB = fskit.MiB
HEADER = 8192
BLOB = 32 * MiB


def physical(path: Path) -> list[tuple[int, int, int]]:
    try:
        return fskit.physical_extents(path)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def _blob(point: Path) -> tuple[Path, list[tuple[int, int, int]]]:
    blob = point / "weights.bin"
    fskit.write_pattern(blob, BLOB, seed=26)
    fd = os.open(blob, os.O_RDONLY)
    try:
        os.fsync(fd)  # allocate the extents before reading them
    finally:
        os.close(fd)
    return blob, physical(blob)


def _cord(blob: Path) -> Cord:
    return Cord([b"H" * HEADER, FileBackedData(str(blob), owned=True), b"tail" * 1000])


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_a_blob_behind_a_header_is_adopted_in_place(mount, kind: str) -> None:
    point = mount(kind, 320 * MiB)  # mkfs.xfs refuses under 300 MB
    blob, extents = _blob(point)
    out = point / "model.ptd"
    plan = filecord.plan(str(out), _cord(blob), consume=True)
    if kind == "xfs":
        # XFS made with reflink clones the blob instead (also no byte copied): a clone keeps
        # the source's blocks shared and needs no insert, so the plan prefers it.
        assert [a.action for a in plan.actions] == ["written", "cloned", "written"]
        want = blob.read_bytes()
        report = filecord.save(str(out), _cord(blob), consume=True)
        assert report.bytes_copied == 0
        assert report.bytes_cloned == BLOB
        assert out.read_bytes() == b"H" * HEADER + want + b"tail" * 1000
        assert not blob.exists()
        return
    assert [a.action for a in plan.actions] == ["written", "adopted", "written"]
    report = filecord.save(str(out), _cord(blob), consume=True)
    assert [a.action for a in report.actions] == ["written", "adopted", "written"]
    assert report.bytes_copied == 0
    assert report.bytes_moved == report.bytes_cloned == 0
    assert report.bytes_written == HEADER + 4000
    assert report.adopt_note is None
    assert f"adopted in place {BLOB} bytes" in report.summary()
    assert not blob.exists()
    data = out.read_bytes()
    assert len(data) == HEADER + BLOB + 4000
    assert data[:HEADER] == b"H" * HEADER
    assert fskit.mismatch(out, HEADER, BLOB, seed=26) is None
    assert data[HEADER + BLOB:] == b"tail" * 1000
    shift = HEADER // 4096
    after = physical(out)
    blob_rows = [(lo - shift, phys, n) for lo, phys, n in after if lo >= shift]
    assert blob_rows[: len(extents)] == extents  # the blob's blocks, where they were
    # One copy of the blob on disk: the output's blocks are the blob's plus header and tail.
    assert os.stat(out).st_blocks * 512 < BLOB + HEADER + 3 * 4096 + 64 * 1024
    assert sorted(os.listdir(point)) == sorted({"model.ptd", *(["lost+found"] if kind ==
                                                                "ext4" else [])})


@pytest.mark.parametrize("step", ["insert_range", "pwrite", "ftruncate", "fsync"])
def test_a_failure_at_each_step_of_an_adoption_puts_the_source_back(mount, step: str) -> None:
    point = mount("ext4", 256 * MiB)
    blob, extents = _blob(point)
    before = os.stat(blob)
    out = point / "model.ptd"
    out.write_bytes(b"old")

    class Fail(_sys.Backend):
        armed = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "insert_range":
                self.armed = True
            if self.armed and op == step:
                self.armed = False  # once: the rollback's own calls succeed
                raise OSError(5, f"injected at {step}")

    cord = Cord([b"H" * HEADER, FileBackedData(str(blob), owned=True),
                 FileBackedData(str(_tail(point)), owned=True)])
    with _sys.use(Fail()), pytest.raises(SaveError):
        filecord.save(str(out), cord, consume=True)
    assert out.read_bytes() == b"old"
    assert fskit.mismatch(blob, 0, BLOB, seed=26) is None
    st = os.stat(blob)
    assert (st.st_ino, st.st_size, st.st_mtime_ns) == (before.st_ino, BLOB, before.st_mtime_ns)
    assert physical(blob) == extents
    assert sorted(os.listdir(point)) == ["lost+found", "model.ptd", "tail.bin", "weights.bin"]


def _tail(point: Path) -> Path:
    tail = point / "tail.bin"
    fskit.write_pattern(tail, 3 * MiB + 100, seed=27)
    return tail


@pytest.mark.parametrize("kind", ["tmpfs", "btrfs"])
def test_file_systems_without_insert_range_fall_back(mount, kind: str) -> None:
    point = mount(kind, 256 * MiB)
    blob = point / "weights.bin"
    fskit.write_pattern(blob, BLOB, seed=26)
    out = point / "model.ptd"
    report = filecord.save(str(out), _cord(blob), consume=True)
    assert "adopted" not in [a.action for a in report.actions]
    if kind == "btrfs":  # a clone shares the blocks: zero-copy already, nothing to explain
        assert report.actions[1].action == "cloned"
        assert report.adopt_note is None
    else:
        assert report.actions[1].action == "moved"
        assert report.adopt_note == (
            "not adopted in place (1 source(s) lie whole at a block-aligned offset): tmpfs "
            "does not insert ranges, so they were moved")
        assert report.adopt_note in report.summary()
    assert report.bytes_copied <= 4096 if kind == "btrfs" else report.bytes_moved == BLOB
    assert not blob.exists()
    assert fskit.mismatch(out, HEADER, BLOB, seed=26) is None


@pytest.mark.parametrize("when", ["pwrite", "fsync"])
def test_a_name_linked_to_the_adopted_file_stops_the_save_and_gets_the_source_back(
        mount, when: str) -> None:
    # The session 31 attack: `ln` to the file while it was adopted in place left the other
    # name holding the output (header, blob, tail) and the save reported success.  Now the
    # save stops (LINKED) and its rollback, which never writes an inode another name reaches,
    # builds the source in a new file under its name: the other name keeps what it held, the
    # whole output (the link came before the header and the tail were written).
    from filecord.errors import ChangeKind, DataChangedError

    point = mount("ext4", 320 * MiB)
    blob, _extents = _blob(point)
    backup = point / "backup.bin"

    class Link(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == when and not backup.exists():
                temps = [p for p in point.iterdir() if p.name.endswith(".partial")]
                if temps and temps[0].stat().st_size > BLOB:  # the blob was adopted
                    os.link(temps[0], backup)

    with pytest.raises(DataChangedError) as info, _sys.use(Link()):
        filecord.save(str(point / "model.ptd"), _cord(blob), consume=True)
    assert info.value.kind is ChangeKind.LINKED
    assert blob.stat().st_size == BLOB
    assert fskit.mismatch(blob, 0, BLOB, seed=26) is None
    tail = b"tail" * 1000
    assert backup.stat().st_size == HEADER + BLOB + len(tail)
    assert fskit.mismatch(backup, HEADER, BLOB, seed=26) is None
    with backup.open("rb") as f:
        assert f.read(HEADER) == b"H" * HEADER
        f.seek(HEADER + BLOB)
        assert f.read() == tail
    assert blob.stat().st_ino != backup.stat().st_ino
    assert sorted(p.name for p in point.iterdir()) == ["backup.bin", "lost+found", "weights.bin"]


@pytest.mark.parametrize("fault", [None, "fsync"])
def test_bytes_appended_to_the_adopted_file_are_never_cut(mount, fault: str | None) -> None:
    # The session 32 attack: a writer that kept an O_APPEND descriptor to the blob appended
    # after the space was inserted; the rollback truncated its bytes away and said "byte-exact".
    # Now the commit refuses the longer file, the rollback keeps it, and recover refuses too.
    from filecord.errors import DataChangedError

    point = mount("ext4", 320 * MiB)
    blob, _extents = _blob(point)
    extra = b"appended by the writer" * 4
    writer = os.open(blob, os.O_WRONLY | os.O_APPEND)

    class Append(_sys.Backend):
        appended = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            # at the first fsync after the output was written around the blob
            if op == "fsync" and not self.appended and (
                    os.fstat(writer).st_size == HEADER + BLOB + 4000):
                os.write(writer, extra)
                self.appended = True
                if fault:
                    raise OSError(5, "injected EIO")

    cord = Cord([b"H" * HEADER, FileBackedData(str(blob), owned=True), b"tail" * 1000])
    try:
        with pytest.raises((SaveError, DataChangedError)) as info, _sys.use(Append()):
            filecord.save(str(point / "model.ptd"), cord, consume=True)
    finally:
        os.close(writer)
    # without a fault the commit sees the change; with one, the rollback sees it (a note)
    assert isinstance(info.value, DataChangedError) is (fault is None)
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "appended 88 bytes past the output's end" in text
    (temp,) = [p for p in point.iterdir() if p.name.endswith(".partial")]
    length = HEADER + BLOB + 4000
    with open(temp, "rb") as f:
        assert f.read(HEADER) == b"H" * HEADER
        assert fskit.mismatch(temp, HEADER, BLOB, seed=26) is None
        f.seek(length)
        assert f.read() == extra
    assert temp.stat().st_size == length + len(extra)
    r = subprocess.run([sys.executable, "-m", "filecord", "recover", str(point)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1, r.stderr
    assert temp.stat().st_size == length + len(extra)  # recover cut nothing either
    assert not (point / "model.ptd").exists()


@pytest.mark.parametrize("appended", [10_000, HEADER])
@pytest.mark.parametrize("how", ["fault", "crash"])
def test_bytes_appended_before_the_insert_are_never_taken_for_it(mount, how: str,
                                                                 appended: int) -> None:
    # The session 33 attack: a writer appended as many bytes as the insert adds (header 8 KiB,
    # tail 16 KiB; 10,000 appended) after the blob became the temp and before its insert; the
    # size looked like an insert, so the undo (in process, or recover after a crash) collapsed
    # the blob's own first 8 KiB and said byte-exact. The insert is recorded in the journal
    # now: without its step, bytes past the source are another writer's and nothing is cut.
    # An append of exactly the inserted length leaves the size an insert leaves: only the
    # hole an insert makes in front (none here: the blob's own bytes) tells them apart.
    from filecord.errors import DataChangedError

    point = mount("ext4", 320 * MiB)
    blob, _extents = _blob(point)
    extra = b"W" * appended
    writer = os.open(blob, os.O_WRONLY | os.O_APPEND)
    ino = os.stat(blob).st_ino

    class Append(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "insert_range" and isinstance(args[0], int) and (
                    os.fstat(args[0]).st_ino == ino):
                os.write(writer, extra)
                if how == "crash":
                    os._exit(9)
                raise OSError(5, "injected EIO")

    cord = Cord([b"H" * HEADER, FileBackedData(str(blob), owned=True), b"T" * 16384])
    try:
        if how == "crash":
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child dies at the insert
                with _sys.use(Append()):
                    filecord.save(str(point / "model.ptd"), cord, consume=True)
                os._exit(0)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 9
            r = subprocess.run([sys.executable, "-m", "filecord", "recover", str(point)],
                               capture_output=True, text=True, check=False)
            assert r.returncode == 1, r.stderr
            said = r.stderr
        else:
            with pytest.raises((SaveError, DataChangedError)) as info, _sys.use(Append()):
                filecord.save(str(point / "model.ptd"), cord, consume=True)
            said = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    finally:
        os.close(writer)
    assert "the journal does not record the space inserted" in said
    (temp,) = [p for p in point.iterdir() if p.name.endswith(".partial")]
    assert temp.stat().st_size == BLOB + len(extra)  # nothing cut, nothing inserted
    assert fskit.mismatch(temp, 0, BLOB, seed=26) is None
    with open(temp, "rb") as f:
        f.seek(BLOB)
        assert f.read() == extra
    assert not (point / "model.ptd").exists()


def test_a_file_mapped_by_blocks_is_moved_not_adopted(tmp_path) -> None:
    # The session 33 attack: a file written before ext4's extent feature was turned on keeps
    # its block lists; the probe's new file has extents and said yes, the plan promised an
    # adoption, and every save failed EOPNOTSUPP at the file's own insert. It is moved now.
    image, point = tmp_path / "e.img", tmp_path / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(200 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^extent,^64bit", str(image)],
                   check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    try:
        blob = point / "weights.bin"
        fskit.write_pattern(blob, 8 * MiB, seed=5)
        subprocess.run(["umount", str(point)], check=True)
        subprocess.run(["tune2fs", "-O", "extent", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
        cord = Cord([b"H" * HEADER, FileBackedData(str(blob), owned=True), b"T" * 100])
        plan = filecord.plan(str(point / "m.ptd"), cord, consume=True)
        assert [a.action for a in plan.file_actions()] == ["moved"]
        report = filecord.save(str(point / "m.ptd"), cord, consume=True)
        assert [a.action for a in report.file_actions()] == ["moved"]
        assert fskit.mismatch(point / "m.ptd", HEADER, 8 * MiB, seed=5) is None
        assert sorted(p.name for p in point.iterdir()) == ["lost+found", "m.ptd"]
    finally:
        subprocess.run(["umount", str(point)], check=False, capture_output=True)


@pytest.mark.parametrize("header", [HEADER, 0])
def test_a_source_cut_while_written_around_is_never_committed(mount, header: int) -> None:
    # The session 34 attack: a writer holding the blob open cut it while the save wrote the
    # output around it; the tail written after the blob grew the file back to its length, so
    # size and times matched and the save committed zeros as the blob.  The commit now finds
    # the blob's range off the blocks adopted, holds the journal, and recover refuses.
    from filecord.errors import DataChangedError

    point = mount("ext4", 320 * MiB)  # (XFS here has reflink: the blob is cloned there)
    blob, _extents = _blob(point)
    writer = os.open(blob, os.O_WRONLY)
    tail = b"tail" * 1000
    cord = Cord([b"H" * header, FileBackedData(str(blob), owned=True), tail])

    class Cut(_sys.Backend):
        def __init__(self) -> None:
            self.done = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            # right before the tail is written (at its offset, past the blob)
            if op == "pwrite" and not self.done and args[2] == header + BLOB:
                os.ftruncate(writer, 1000)
                self.done = True

    cut = Cut()
    try:
        with pytest.raises(DataChangedError) as info, _sys.use(cut):
            filecord.save(str(point / "model.ptd"), cord, consume=True)
    finally:
        os.close(writer)
    assert cut.done
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "not on the blocks adopted" in text
    assert "held" in text
    assert "can be retried" not in text
    assert "the whole file" not in text  # zeros there now: never claimed as the source
    assert f"was adopted as {point}" in text
    assert not (point / "model.ptd").exists()
    (temp,) = [p for p in point.iterdir() if p.name.endswith(".partial")]
    assert temp.stat().st_size == header + BLOB + len(tail)  # as the cut and the tail left it
    with open(temp, "rb") as f:
        f.seek(header + BLOB)
        assert f.read() == tail
    r = subprocess.run([sys.executable, "-m", "filecord", "recover", str(point)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1, r.stderr  # held: nothing is put back over the cut
    assert temp.stat().st_size == header + BLOB + len(tail)


@pytest.mark.parametrize("header", [HEADER, 0])
def test_the_blocks_adopted_are_the_blocks_committed(mount, header: int) -> None:
    # The check above must never fire on a save nobody touched: the blob's range is looked
    # at after its fsync and again after the commit's, with the header and tail written.
    point = mount("ext4", 320 * MiB)
    blob, extents = _blob(point)
    cord = Cord([b"H" * header, FileBackedData(str(blob), owned=True), b"tail" * 1000])
    report = filecord.save(str(point / "model.ptd"), cord, consume=True)
    assert report.actions[1].action == "adopted"
    assert report.bytes_copied == 0  # the header and tail are written, not copied
    assert fskit.mismatch(point / "model.ptd", header, BLOB, seed=26) is None
    assert {e[1] for e in physical(point / "model.ptd")} >= {e[1] for e in extents}  # in place
