"""Shared fixtures for the top-level tests."""

from __future__ import annotations

import os
from collections.abc import Callable
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
