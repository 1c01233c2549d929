"""Issue 26 item 1, groundwork: inserting and collapsing block ranges on real file systems.

* ext4: 8 KiB inserted in front of a 64 MiB file leaves its data where it was (the same
  physical extents, shifted by 8 KiB logically: FIEMAP through the I/O seam and
  ``filefrag -v``), its sha256 unchanged at the new offset and the inserted range a hole
  reading zeros; the collapse gives back the file byte for byte, extents included.
* tmpfs and btrfs refuse with EOPNOTSUPP, raised as OSError by the seam, and the preflight's
  probe says no; on ext4 and XFS it says yes.  The probe leaves nothing behind.
* The preflight fills ``FsFacts.can_insert`` only when asked; the plan then lists the source
  that can be adopted in place (and, asked to, marks it "adopted").
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import fskit
import pytest

from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from filecord._plan import facts
from filecord._plan.plan import make_plan
from filecord._plan.preflight import gather

pytestmark = pytest.mark.root

MiB = fskit.MiB
SIZE = 64 * MiB
GAP = 8192


def physical_extents(path: Path) -> list[tuple[int, int, int]]:
    try:
        return fskit.physical_extents(path)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def digest(path: Path, offset: int, n: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        h.update(f.read(n))
    return h.hexdigest()


def test_insert_before_a_64mib_file_moves_no_data_and_collapse_restores_it(mount) -> None:
    point = mount("ext4", 256 * MiB)
    path = point / "blob"
    fskit.write_pattern(path, SIZE, seed=26)
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)  # allocate the extents before reading them
        before_sum = digest(path, 0, SIZE)
        before = physical_extents(path)
        before_seam = _sys.extents(fd, 0, SIZE)
        _sys.insert_range(fd, 0, GAP)
        os.fsync(fd)
        assert os.fstat(fd).st_size == SIZE + GAP
        assert digest(path, GAP, SIZE) == before_sum  # every byte, shifted by 8 KiB
        assert os.pread(fd, GAP, 0) == bytes(GAP)  # the inserted range reads as zeros
        after = physical_extents(path)
        # Same physical blocks, each 2 blocks further on logically: no data moved.
        assert [(lo + GAP // 4096, phys, n) for lo, phys, n in before] == after
        assert _sys.extents(fd, GAP, SIZE)[0][0] == GAP  # the hole holds no extent
        assert os.fstat(fd).st_blocks * 512 < SIZE + GAP + 64 * 1024  # nothing allocated
        _sys.collapse_range(fd, 0, GAP)
        os.fsync(fd)
        assert os.fstat(fd).st_size == SIZE
        assert physical_extents(path) == before
        assert _sys.extents(fd, 0, SIZE) == before_seam
    finally:
        os.close(fd)
    assert fskit.mismatch(path, 0, SIZE, seed=26) is None
    assert digest(path, 0, SIZE) == before_sum


def test_insert_needs_block_alignment_and_an_offset_inside_the_file(mount) -> None:
    point = mount("ext4", 64 * MiB)
    path = point / "f"
    path.write_bytes(bytes(3 * 4096))
    fd = os.open(path, os.O_RDWR)
    try:
        for offset, length in [(0, 100), (100, 4096), (3 * 4096, 4096)]:
            with pytest.raises(OSError, match="Invalid argument") as info:
                _sys.insert_range(fd, offset, length)
            assert info.value.errno == errno.EINVAL
        assert os.fstat(fd).st_size == 3 * 4096
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["tmpfs", "btrfs"])
def test_file_systems_that_cannot_refuse_and_the_probe_says_no(mount, kind: str) -> None:
    point = mount(kind, 128 * MiB)
    path = point / "f"
    path.write_bytes(bytes(2 * 4096))
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(OSError, match="not supported") as info:
            _sys.insert_range(fd, 0, 4096)
        assert info.value.errno == errno.EOPNOTSUPP
        with pytest.raises(OSError, match="not supported") as info:
            _sys.collapse_range(fd, 0, 4096)
        assert info.value.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(2 * 4096)
    assert facts.probe_insert(str(point)) is False
    assert sorted(os.listdir(point)) == ["f"]  # the probe's file is gone


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_the_probe_says_yes_where_ranges_shift(mount, kind: str) -> None:
    point = mount(kind, 320 * MiB)
    there = sorted(os.listdir(point))  # lost+found on ext4
    assert facts.probe_insert(str(point)) is True
    assert sorted(os.listdir(point)) == there  # the probe's file is gone


def test_the_plan_lists_the_source_to_adopt_in_place_only_where_probed(mount) -> None:
    point = mount("ext4", 256 * MiB)
    big, small = point / "weights", point / "extra"
    fskit.write_pattern(big, 8 * MiB, seed=1)
    fskit.write_pattern(small, MiB, seed=2)
    cord = Cord([b"H" * 4096, FileBackedData(str(big), owned=True),
                 FileBackedData(str(small), owned=True)])
    items = [(str(point / "out.ptd"), cord)]
    unasked = gather(items)
    assert not any(f.can_insert for f in unasked.filesystems.values())
    f = gather(items, probe_insert=True)
    assert all(fs.can_insert for fs in f.filesystems.values())
    today = make_plan(f.outputs, f.refs, f.sources, f.filesystems, consume=True,
                      window=64 * MiB)
    # The 1 MiB file follows 8 MiB + 4 KiB: aligned too, but only the largest is the base.
    assert [(ip.path, ip.out_offset, ip.length, ip.pieces) for ip in today.in_place] == [
        (str(big), 4096, 8 * MiB, (1,))]
    assert [a.action for a in today.actions] == ["written", "moved", "moved"]  # unchanged
    asked = make_plan(f.outputs, f.refs, f.sources, f.filesystems, consume=True,
                      window=64 * MiB, adopt=True)
    assert [a.action for a in asked.actions] == ["written", "adopted", "moved"]
    assert big.exists()
    assert small.exists()


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_the_clone_probe_works_on_files_without_names(mount, kind: str) -> None:
    # Killed at the clone (the process is gone before its finally runs), the probe left two
    # named files that nothing removes (the session 31 attack); its files have no names now.

    point = mount(kind, 320 * MiB)
    there = sorted(os.listdir(point))
    code = (
        "import os, signal, sys\n"
        "from filecord._io import syscalls as _sys\n"
        "from filecord._plan import facts\n"
        "class Kill(_sys.Backend):\n"
        "    def hook(self, op, args):\n"
        "        if op == 'clone_range':\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "with _sys.use(Kill()):\n"
        "    facts.probe_clone(sys.argv[1])\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(point)], check=False)
    assert r.returncode == -9
    assert sorted(os.listdir(point)) == there
    assert facts.probe_clone(str(point)) is True
    assert sorted(os.listdir(point)) == there


class _FailOn(_sys.Backend):
    def __init__(self, op: str, err: int) -> None:
        self.op, self.err = op, err

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == self.op:
            raise OSError(self.err, os.strerror(self.err))


def test_a_full_disk_makes_the_probes_say_no_for_that_save_only(mount) -> None:
    point = mount("ext4", 64 * MiB)
    with _sys.use(_FailOn("pwrite", errno.ENOSPC)):
        assert facts.probe_insert(str(point)) is False
        assert facts.probe_clone(str(point)) is False
    assert facts.probe_insert(str(point)) is True  # asked again once there is room


def test_a_device_number_reused_by_another_file_system_is_probed_afresh(mount,
                                                                        tmp_path) -> None:
    # The session 32 attack: ext4 then ext2 made on one loop device (one st_dev): the answer
    # cached for ext4 made the plan adopt in place on ext2, and the save failed EOPNOTSUPP.
    image = tmp_path / "one.img"
    point = tmp_path / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 * MiB)
    for mkfs, says in ((["mkfs.ext4", "-q", "-F"], True), (["mkfs.ext2", "-q", "-F"], False)):
        subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
        loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                              capture_output=True, text=True).stdout.strip()
        try:
            subprocess.run(["mount", loop, str(point)], check=True, capture_output=True)
            try:
                assert facts.probe_insert(str(point)) is says
            finally:
                subprocess.run(["umount", str(point)], check=True, capture_output=True)
        finally:
            subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)


def test_a_collapse_refused_after_an_insert_means_no(mount) -> None:
    # An adoption's undo is a collapse: a file system that inserts but cannot collapse is not
    # one to adopt on, and the save moves instead of failing.
    point = mount("ext4", 64 * MiB)
    with _sys.use(_FailOn("collapse_range", errno.EOPNOTSUPP)):
        assert facts.probe_insert(str(point)) is False


def test_a_consuming_save_on_a_full_disk_is_refused_for_space(mount) -> None:
    # The preflight's insert probe hit ENOSPC and the save failed with a plain SaveError; the
    # space check now says what is missing.
    from filecord import Cord, FileBackedData, save
    from filecord.errors import InsufficientSpaceError

    point = mount("ext4", 64 * MiB)
    src = point / "w.bin"
    fskit.write_pattern(src, 8 * MiB, seed=5)
    filler = point / "filler"
    with open(filler, "wb") as f:
        while True:
            try:
                f.write(bytes(1 << 20))
                f.flush()
            except OSError:
                break
    os.sync()
    for n in (1 << 16, 1 << 12, 1 << 9, 1):
        try:
            with open(filler, "ab") as f:
                while True:
                    f.write(bytes(n))
                    f.flush()
        except OSError:
            pass
    with pytest.raises(InsufficientSpaceError, match="not enough free space"):
        save(point / "out.ptd", Cord([bytes(4096), FileBackedData(src, owned=True)]),
             consume=True)
    assert fskit.mismatch(src, 0, 8 * MiB, seed=5) is None
    assert sorted(p.name for p in point.iterdir()) == ["filler", "lost+found", "w.bin"]
