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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` run first (in collection order otherwise): under pytest-xdist
    each starts while the quick ones fill the other workers, instead of one sweep of minutes
    starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    _group_for_xdist(config, items)


def _group_for_xdist(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test marked ``xdist_group`` its group in its id, as ``--dist loadgroup``
    expects (``test_x@group``: the scheduler sends one group to one worker).

    pytest-xdist 3.8 does it by assigning ``item._nodeid``, which pytest 9.2 no longer reads
    (a node's id is ``item._id``): every ``xdist_group`` marker was silently ignored, so a
    module fixture of minutes was built again in each worker that drew one of its tests, and
    the ``timed`` tests ran side by side.  On a pytest whose ids xdist can rename (no
    ``item._id``) nothing is done here, whichever of the two hooks runs first.
    """
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix):
            continue
        node_id = getattr(item, "_id", None)
        if node_id is None:
            continue
        item._id = type(node_id).parse(item.nodeid + suffix)  # type: ignore[attr-defined]
