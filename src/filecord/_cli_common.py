"""What the CLI modules share: argument types and the usage error.

Kept apart from ``cli.py`` so that ``python -m filecord.cli`` (where ``cli`` runs as
``__main__``) and the command modules see one and the same :class:`UsageError`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from filecord._plan import BLOCK


class UsageError(Exception):
    """Bad command-line input found after parsing: exit status 2, like argparse's own errors."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` (and a save's rollback) runs."""


def raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(f"stopped by signal {signum}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """For the duration, SIGTERM raises :class:`Terminated` (on the main thread; elsewhere
    signals cannot be handled and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before: Any = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
    "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
    "tb": 1000**4, "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"1GiB"``, ``"512M"``, ``"4096"`` -> bytes (decimal for k/M/G, binary for KiB/MiB/GiB)."""
    s = text.strip().lower().replace("_", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):].strip()
    if unit not in _UNITS or not num:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1GiB, 512MiB or 4096)")
    try:
        value = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (too large)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * _UNITS[unit])


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_window(text: str) -> int:
    """An argparse type: a consume sync window (a size of at least one 4 KiB block)."""
    value = parse_size(text)
    if value < BLOCK:
        raise argparse.ArgumentTypeError(f"the window must be at least {BLOCK} bytes, got {text!r}")
    return value
