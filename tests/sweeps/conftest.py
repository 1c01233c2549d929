"""Fixtures for the sweeps."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fsmatrix"))
import fskit

SHM = Path("/dev/shm")


def _shm_has(room: int) -> bool:
    try:
        st = os.statvfs(SHM)
        return os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= room
    except OSError:
        return False


def _on_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if not _shm_has(256 << 20):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="filecord-sweep-", dir=SHM))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ram_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on tmpfs (``/dev/shm``; ``tmp_path`` where there is none with room)
    for a sweep that judges what ``recover`` decides, not what a disk keeps: on ext4 the
    fsyncs of the thousands of saves and recoveries it runs are most of its time, and the
    machine's other work makes them slower still.  Only for a scenario that makes the same
    destructive calls there (nothing adopted in place, which tmpfs cannot do): each such
    sweep asserts the kinds of call it covers, or the outcomes that prove its cases ran."""
    yield from _on_tmpfs(tmp_path)


@pytest.fixture
def model_disk_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on tmpfs (``/dev/shm``) for a power-cut sweep; ``tmp_path`` where
    there is none with room.

    The power-cut sweeps model the disk themselves (support/powerfs.py: what a cut keeps is
    worked out from the calls and written back), so the real file system only holds the
    files, and on ext4 its fsyncs, fallocates and directory removals are most of each point's
    time.  Only for a scenario whose calls are the same there (consume3: the same 69
    destructive calls of the same kinds on ext4 and tmpfs; nothing of it is adopted in place,
    which tmpfs cannot do): the test asserts the kinds it covers.
    """
    yield from _on_tmpfs(tmp_path)


@pytest.fixture
def ram_ext4_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on an ext4 file system whose image lives in RAM (``/dev/shm``), for a
    sweep of a scenario whose calls differ on tmpfs (a consuming save probes for inserts,
    which ext4 makes and tmpfs refuses): the disk's file system, call for call, without the
    disk's waits (each of its fsyncs reaches tmpfs).  ``tmp_path`` where no ext4 can be
    mounted (not root) or ``/dev/shm`` has no room.  A sweep that uses it asserts its save
    makes the same calls there as under ``tmp_path``."""
    with contextlib.ExitStack() as stack:
        fs = None
        if fskit.unavailable("ext4") is None and _shm_has(1 << 30):
            with contextlib.suppress(fskit.MountError):
                fs = stack.enter_context(fskit.mounted("ext4", 512 << 20, base=SHM))
        yield tmp_path if fs is None else fs
