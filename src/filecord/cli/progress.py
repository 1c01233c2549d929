"""Progress rendering for the CLI: tqdm byte bars on a terminal, silence elsewhere.

The library only calls ``progress(done, total)``; this turns those calls into a bar.  tqdm is an
optional dependency (the ``cli`` extra): without it, or with ``--quiet``, or when stderr is not
a terminal, nothing is drawn.  tqdm's own ``TQDM_*`` environment settings apply, and
``FILECORD_NO_PROGRESS=1``, ``TQDM_DISABLE=1`` and ``HF_HUB_DISABLE_PROGRESS_BARS=1`` switch
bars off as in the rest of the ecosystem (checked here because tqdm's environment defaults do
not override the ``disable=None`` we pass).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

_OFF_VARS = ("FILECORD_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def _enabled(*, quiet: bool) -> bool:
    if quiet or any(os.environ.get(v, "") not in ("", "0") for v in _OFF_VARS):
        return False
    return sys.stderr.isatty()


class Bar:
    """A context manager whose ``update(done, total)`` fits the library's progress callback."""

    def __init__(self, desc: str, *, quiet: bool) -> None:
        self._desc = desc
        self._bar: Any = None
        self._on = _enabled(quiet=quiet)
        self._last = 0

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, done: int, total: int) -> None:
        if not self._on:
            return
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self._on = False
                return
            self._bar = tqdm(
                total=total, desc=self._desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=None, leave=False,
            )
        self._bar.update(done - self._last)
        self._last = done

    @property
    def callback(self) -> Callable[[int, int], None] | None:
        return self.update if self._on else None
