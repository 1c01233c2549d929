"""Measurement helpers for the demo and the benchmarks: peak RSS and peak allocated disk.

They read ``/proc`` and ``st_blocks`` with ``os`` directly on purpose: these are observations
of the save, not the save's own I/O, so they must not pass through (or count in) ``_sys``.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from filecord import _sys

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
            with os.scandir(directory) as entries:
                total += sum(_blocks(e) for e in entries)
        return total

    def sample(self) -> int:
        now = self.allocated()
        self.peak = max(self.peak, now)
        self.samples += 1
        return now

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op in SAMPLE_OPS:
            self.sample()


def _blocks(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_blocks * 512
    except FileNotFoundError:  # removed between the listing and the stat
        return 0


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_reset() -> None:
    """Reset the kernel's peak-RSS mark (Linux), so ``rss_peak`` measures from now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return


def rss_now() -> int:
    return _status("VmRSS:") or 0


def rss_peak() -> int:
    peak = _status("VmHWM:")
    if peak is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak
