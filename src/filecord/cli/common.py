"""What the CLI modules share: exit codes, the usage error, the common options, argument types
and human units.

A leaf: it imports no other CLI module, so every command module (and ``cli.py``, which only
assembles them) can import it without a cycle.  Kept apart from ``cli.py`` also so that
``python -m filecord.cli`` (where ``cli`` runs as ``__main__``) and the command modules see one
and the same :class:`UsageError`.

Every command module has the same entry point, ``register(subparsers)``, which adds its
sub-commands and sets each one's ``func``; a ``func`` returns the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, TypeAlias

from filecord._plan.types import BLOCK

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

# What ``ArgumentParser.add_subparsers()`` returns: the one argument of every ``register``.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


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


def add_common(p: argparse.ArgumentParser) -> None:
    """The options every saving command takes: ``-q``, ``--json``, ``-v``."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or chatter")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")


def human(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``: binary units, whole bytes below one KiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover - loop always returns


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
