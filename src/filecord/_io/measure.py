"""Measurement helpers for the demo and the benchmarks: peak RSS and peak allocated disk.

They read ``/proc`` and ``st_blocks`` through a plain :class:`_sys.Backend` of their own, never
through the active one, on purpose: these are observations of the save, not the save's own I/O,
so they must not pass through its hooks (or count in them, or recurse into a sampler's hook).
"""

from __future__ import annotations

import os
import resource
from typing import Any

from filecord._io import syscalls as _sys

_REAL = _sys.Backend()  # the real calls, without the active backend's hook

SAMPLE_OPS = frozenset({"fsync", "ftruncate", "rename", "unlink", "copy_file_range", "pwrite"})


class DiskSampler(_sys.Backend):
    """Use as a ``_sys`` backend: samples allocated blocks under some directories at every
    step that can change them (before each fsync, truncate, rename, unlink, copy, write)."""

    def __init__(self, *directories: str) -> None:
        self.directories = directories
        self.peak = 0
        self.samples = 0

    def allocated(self) -> int:
        total = 0
        for directory in self.directories:
            total += sum(_blocks(os.path.join(directory, n)) for n in _REAL.listdir(directory))
        return total

    def sample(self) -> int:
        now = self.allocated()
        self.peak = max(self.peak, now)
        self.samples += 1
        return now

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op in SAMPLE_OPS:
            self.sample()


def _blocks(path: str) -> int:
    try:
        return _REAL.lstat(path).st_blocks * 512
    except FileNotFoundError:  # removed between the listing and the stat
        return 0


def _read_proc(path: str) -> str:
    fd = _REAL.open(path, os.O_RDONLY, 0)
    try:
        parts: list[bytes] = []
        while chunk := _REAL.pread(fd, 65536, sum(map(len, parts))):
            parts.append(chunk)
        return b"".join(parts).decode("utf-8", "replace")
    finally:
        _REAL.close(fd)


def _status(field: str) -> int | None:
    try:
        text = _read_proc("/proc/self/status")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return None


def rss_reset() -> None:
    """Reset the kernel's peak-RSS mark (Linux), so ``rss_peak`` measures from now."""
    try:
        fd = _REAL.open("/proc/self/clear_refs", os.O_WRONLY, 0)
    except OSError:
        return
    try:
        _REAL.write(fd, b"5")
    except OSError:
        return
    finally:
        _REAL.close(fd)


def rss_now() -> int:
    return _status("VmRSS:") or 0


def rss_peak() -> int:
    peak = _status("VmHWM:")
    if peak is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak
