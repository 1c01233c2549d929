"""Shared fixtures: deterministic file contents and a helper to make files."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def pattern(n: int, seed: str = "x") -> bytes:
    """``n`` deterministic bytes that differ at every offset class (no two blocks equal)."""
    out = bytearray()
    block = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{block}".encode()).digest()
        block += 1
    return bytes(out[:n])


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., str]:
    def make(name: str, data: bytes, directory: Path | None = None) -> str:
        path = (directory or tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return os.fspath(path)

    return make


def leftovers(directory: str | Path) -> list[str]:
    """Temps and journals a save may leave: there must be none after a clean failure."""
    return sorted(n for n in os.listdir(directory) if n.endswith((".partial", ".filecord-journal")))
