"""The conformance suite's collection guard: every format's class must collect at least its
floor of cases, so the suite cannot silently shrink (a scenario dropped, a parametrization
emptied).  Counted before ``-k``/``--deselect`` take anything away; checked by each class's
``test_the_suite_keeps_its_size``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conformance import COLLECTED


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    COLLECTED.clear()
    for item in items:
        cls = getattr(item, "cls", None)
        fmt = getattr(cls, "fmt", None)
        if fmt is not None:
            COLLECTED[fmt] += 1
