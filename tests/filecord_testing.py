"""Helpers shared by the test modules (imported by name; conftest modules are per folder)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def pattern(n: int, seed: str = "x") -> bytes:
    """``n`` deterministic bytes that differ at every offset class (no two blocks equal)."""
    out = bytearray()
    block = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{block}".encode()).digest()
        block += 1
    return bytes(out[:n])


def leftovers(directory: str | Path) -> list[str]:
    """Temps and journals a save may leave: there must be none after a clean failure."""
    return sorted(
        n for n in os.listdir(directory) if n.endswith((".partial", ".filecord-journal"))
    )
