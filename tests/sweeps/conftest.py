"""Fixtures for the sweeps."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")


def _on_tmpfs(tmp_path: Path) -> Iterator[Path]:
    try:
        st = os.statvfs(SHM)
        room = os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= 256 << 20
    except OSError:
        room = False
    if not room:
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
