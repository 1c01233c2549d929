"""Real-file-system kit: mounts, disk measures, checkable data, and a sampling backend.

Shared by ``tests/fsmatrix`` and ``bench/`` (which puts this directory on ``sys.path``).

* :func:`mounted`: a loop-mounted ext4/XFS/btrfs image or a size-limited tmpfs, always
  unmounted and removed afterwards.  Needs root; :func:`unavailable` says in words why a kind
  cannot be mounted here, so callers can skip with that reason.
* Disk measures: :func:`allocated` (``st_blocks`` of every file under a directory: right on
  ext4) and :func:`fs_used` (``statvfs`` of the file system: right on XFS, whose speculative
  preallocation inflates ``st_blocks`` mid-write, and on CoW file systems, where shared extents
  count in every file that shares them).
* Data: :func:`write_pattern` / :func:`check_pattern`: position-dependent bytes (a per-seed
  random MiB stamped with the seed and the MiB's index), so a misplaced, missing or repeated
  range is caught exactly, without keeping a copy of gigabytes to compare against.
* :class:`Sampler`: a ``filecord._io.syscalls`` backend whose hook measures the disk right before
  chosen system calls (every ``ftruncate`` of a move is the moment a window is held twice).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filecord._io import syscalls as _sys

MiB = 1 << 20

# mkfs command per kind; the image path is appended.  ext4 gets 4 KiB blocks on every size
# (mke2fs would pick 1 KiB below 512 MiB) and no lazy init, so no kernel thread writes
# behind a benchmark's back.
MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}


def _kernel_has(kind: str) -> bool:
    try:
        text = Path("/proc/filesystems").read_text()
    except OSError:
        return False
    return any(line.split()[-1] == kind for line in text.splitlines() if line.split())


def unavailable(kind: str) -> str | None:
    """Why a ``kind`` mount cannot be made here, or None when it can be tried."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (loop and tmpfs mounts)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not installed"
    if not _kernel_has(kind):
        return f"the kernel has no {kind} (not in /proc/filesystems)"
    if kind == "tmpfs":
        return None
    tool = MKFS[kind][0]
    if shutil.which(tool) is None:
        pkg = {"ext4": "e2fsprogs", "xfs": "xfsprogs", "btrfs": "btrfs-progs"}[kind]
        return f"{tool} not installed (apt-get install {pkg})"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control missing)"
    return None


class MountError(RuntimeError):
    """mkfs or mount failed; the message has the command's output."""


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise MountError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()}")


def _umount(point: str) -> None:
    proc = subprocess.run(["umount", point], capture_output=True, text=True, check=False)
    if proc.returncode != 0:  # something still holds it: detach now, free when released
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def mounted(kind: str, size: int, *, base: str | os.PathLike[str] | None = None,
            preallocate: bool = False) -> Iterator[Path]:
    """Mount a fresh ``kind`` file system of ``size`` bytes; yield its (empty) mount point.

    ext4/xfs/btrfs live in an image file under ``base`` (a new temp directory by default),
    sparse unless ``preallocate`` (fallocate: steadier timings, the image's blocks exist).
    tmpfs is limited to ``size``.  On exit the file system is unmounted (lazily if busy; the
    loop device is released by autoclear) and the image and directories are removed.
    """
    reason = unavailable(kind)
    if reason is not None:
        raise MountError(reason)
    work = Path(tempfile.mkdtemp(prefix=f"filecord-{kind}-", dir=base))
    point = work / "mnt"
    point.mkdir()
    image = work / f"{kind}.img"
    mounted_ok = False
    try:
        if kind == "tmpfs":
            _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)])
        else:
            with open(image, "wb") as f:
                if preallocate:
                    os.posix_fallocate(f.fileno(), 0, size)
                else:
                    f.truncate(size)
            _run([*MKFS[kind], str(image)])
            _run(["mount", "-o", "loop", str(image), str(point)])
        mounted_ok = True
        yield point
    finally:
        if mounted_ok:
            _umount(str(point))
        with contextlib.suppress(FileNotFoundError):
            image.unlink()
        with contextlib.suppress(OSError):
            point.rmdir()
        with contextlib.suppress(OSError):
            work.rmdir()


def allocated(directory: str | os.PathLike[str]) -> int:
    """Bytes allocated (``st_blocks * 512``) to every regular file under ``directory``.

    Files that vanish while we look (a temp renamed, a source unlinked) count as 0.
    """
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def free_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes an unprivileged writer may still allocate there (what the planner reads)."""
    v = os.statvfs(path)
    return v.f_bavail * v.f_frsize


def leave_free(fs: Path, free: int) -> None:
    """Take the file system's free space down to ``free`` bytes with a preallocated ``filler``.

    The filler's own metadata takes blocks too, so it is trimmed until the free space is
    ``free`` to within 64 KiB (never below it)."""
    os.sync()
    have = free_bytes(fs)
    assert have > free, f"the file system is too small for the case: {have} < {free}"
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, have - free)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.sync()
    for _ in range(64):
        have = free_bytes(fs)
        if have >= free:
            break
        os.truncate(fs / "filler", os.stat(fs / "filler").st_size - (free - have))
        os.sync()
    assert free <= have < free + 64 * 1024, (have, free)


def fs_used(path: str | os.PathLike[str]) -> int:
    """Bytes in use on the file system holding ``path`` (``statvfs``: blocks - free blocks)."""
    v = os.statvfs(path)
    return (v.f_blocks - v.f_bfree) * v.f_frsize


def fs_type(path: str | os.PathLike[str]) -> str:
    """The type of the mount holding ``path`` (``findmnt``-free: longest mountinfo prefix)."""
    real = os.path.realpath(path) + "/"
    best, best_len = "unknown", -1
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _sep, right = line.partition(" - ")
        point = left.split()[4].replace("\\040", " ").rstrip("/") + "/"
        if real.startswith(point) and len(point) > best_len:
            best, best_len = right.split()[0], len(point)
    return best


# --- checkable data ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _base(seed: int) -> bytes:
    return hashlib.shake_256(b"filecord-fskit-%d" % seed).digest(MiB)


def pattern_block(seed: int, index: int) -> bytes:
    """MiB number ``index`` of the pattern ``seed``: its random base stamped with (seed, index)."""
    stamp = seed.to_bytes(8, "little") + index.to_bytes(8, "little")
    return stamp + _base(seed)[len(stamp):]


def pattern(seed: int, start: int, n: int) -> bytes:
    """Bytes ``[start, start + n)`` of the pattern (for small ranges: headers, spot checks)."""
    out = bytearray()
    pos = start
    while pos < start + n:
        i, off = divmod(pos, MiB)
        take = min(MiB - off, start + n - pos)
        out += pattern_block(seed, i)[off:off + take]
        pos += take
    return bytes(out)


def write_pattern(path: str | os.PathLike[str], size: int, seed: int) -> None:
    """Create ``path`` holding pattern bytes ``[0, size)``, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for pos in range(0, size, MiB):
            data = pattern_block(seed, pos // MiB)[: min(MiB, size - pos)]
            os.pwrite(fd, data, pos)
        os.fsync(fd)
    finally:
        os.close(fd)


def mismatch(path: str | os.PathLike[str], offset: int, size: int, seed: int) -> str | None:
    """Where ``path[offset:offset+size]`` first differs from pattern ``[0, size)``, or None."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for pos in range(0, size, MiB):
            want = pattern_block(seed, pos // MiB)[: min(MiB, size - pos)]
            got = os.pread(fd, len(want), offset + pos)
            if got != want:
                pairs = zip(got, want, strict=False)
                at = next((k for k, (a, b) in enumerate(pairs) if a != b), len(got))
                return f"{path}: byte {offset + pos + at} differs (pattern {seed} at {pos + at})"
    finally:
        os.close(fd)
    return None


# --- sampling the disk from inside a save -----------------------------------------------------

SAMPLE_OPS = frozenset({"ftruncate", "fsync", "rename", "unlink"})


class Sampler(_sys.Backend):
    """Real system calls; right before each call named in ``ops``, record ``measure()``.

    Sampling before ``ftruncate`` catches a move at its fullest (the window is in the temp and
    fsynced, and still in the source); before ``fsync`` a copy at its fullest; before
    ``rename``/``unlink`` the moment just before the commit frees anything.  Take one more
    sample after the save returns.
    """

    def __init__(self, measure: Callable[[], int], ops: frozenset[str] = SAMPLE_OPS) -> None:
        self.measure = measure
        self.ops = ops
        self.samples: list[tuple[str, int]] = []
        self.calls: dict[str, int] = {}  # op -> how many times it was called
        self.clones: list[int] = []  # the length of every clone_range call

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if op == "clone_range":
            self.clones.append(args[2])
        if op in self.ops:
            self.samples.append((op, self.measure()))

    def sample(self, label: str = "after") -> None:
        self.samples.append((label, self.measure()))

    @property
    def peak(self) -> int:
        return max(v for _op, v in self.samples)


def physical_extents(path: Path) -> list[tuple[int, int, int]]:
    """``(logical start, physical start, length)`` in blocks per extent, from ``filefrag -v``
    (e2fsprogs; raises ``FileNotFoundError`` where it is not installed)."""
    if shutil.which("filefrag") is None:
        raise FileNotFoundError("filefrag (e2fsprogs) is not installed")
    text = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True,
                          check=True).stdout
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+):", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return rows
