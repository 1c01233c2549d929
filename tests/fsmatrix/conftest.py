"""Fixtures for the real-file-system suite: mounts that skip with a reason, and clean up."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import fskit
import pytest


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """``mount(kind, size)``: a fresh mounted file system, unmounted and removed at teardown.

    Skips the test (with the reason) where this machine cannot make that kind of mount.
    """
    with contextlib.ExitStack() as stack:

        def make(kind: str, size: int) -> Path:
            reason = fskit.unavailable(kind)
            if reason is not None:
                pytest.skip(f"{kind}: {reason}")
            try:
                return stack.enter_context(fskit.mounted(kind, size, base=tmp_path))
            except fskit.MountError as exc:
                pytest.skip(f"cannot mount {kind} here: {exc}")

        yield make
