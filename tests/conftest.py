"""Shared fixtures for the top-level tests."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., str]:
    def make(name: str, data: bytes, directory: Path | None = None) -> str:
        path = (directory or tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return os.fspath(path)

    return make


@pytest.fixture
def young_heap() -> Iterator[None]:
    """``gc.collect()`` looks only at what the test made: the heap before it is frozen.

    In a full run the heap holds torch's and executorch's objects (about 400,000): a full
    collection takes 0.2-0.6 s, which a sweep that collects after each of hundreds of points
    pays hundreds of times over.  Everything the test creates stays collectable as before.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` run first (in collection order otherwise): under pytest-xdist
    each starts while the quick ones fill the other workers, instead of one sweep of minutes
    starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
