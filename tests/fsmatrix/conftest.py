"""Fixtures for the real-file-system suite: mounts that clean up, and skip or fail with a reason.

Outside CI a kind of mount this machine cannot make skips the test, with the reason.  Under CI
(the environment variable ``CI`` is set, as ``.ci/run`` does: root, with e2fsprogs, xfsprogs and
btrfs-progs installed) the same condition FAILS the test: the matrix is part of what CI proves,
so it must never go green by running nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import fskit
import pytest


def under_ci() -> bool:
    """Whether this run is CI's (``CI`` set to anything but empty, ``0`` or ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cannot(message: str) -> None:
    """Skip with ``message``; under CI, fail with it instead."""
    if under_ci():
        pytest.fail(f"{message} (CI is set: a mount the matrix needs is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """``mount(kind, size)``: a fresh mounted file system, unmounted and removed at teardown.

    Skips the test (with the reason) where this machine cannot make that kind of mount; fails
    it instead under CI.
    """
    with contextlib.ExitStack() as stack:

        def make(kind: str, size: int) -> Path:
            reason = fskit.unavailable(kind)
            if reason is not None:
                cannot(f"{kind}: {reason}")
            try:
                return stack.enter_context(fskit.mounted(kind, size, base=tmp_path))
            except fskit.MountError as exc:
                cannot(f"cannot mount {kind} here: {exc}")
                raise  # unreachable: cannot() always raises

        yield make
