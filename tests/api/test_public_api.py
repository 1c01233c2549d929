"""The README's "Public API" tables are the packages' ``__all__``s, name for name, and every
listed name resolves (torch-backed names included: they load on first use)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SURFACES = ("filecord", "filecord.executorch", "filecord.safetensors", "filecord.gguf",
            "filecord.dcp", "filecord.torch")


def readme_tables() -> dict[str, tuple[int, list[str]]]:
    """Module -> (the count its heading states, the names in its table rows, in order)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Public API\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, tuple[int, list[str]]] = {}
    for block in re.split(r"\n(?=\*\*`filecord)", section)[1:]:
        head = re.match(r"\*\*`([\w.]+)`\*\* \((\d+) names\)", block)
        assert head is not None, block[:80]
        rows = [line.split("|")[2] for line in block.splitlines() if line.startswith("| ")]
        names = [n for row in rows for n in re.findall(r"`(\w+)`", row)]
        tables[head[1]] = (int(head[2]), names)
    return tables


def test_the_readme_lists_every_public_surface() -> None:
    assert tuple(readme_tables()) == SURFACES


@pytest.mark.parametrize("module", SURFACES)
def test_readme_table_is_the_modules_all(module: str) -> None:
    mod = importlib.import_module(module)
    count, names = readme_tables()[module]
    assert names == list(mod.__all__)  # same names, same order (grouped as in __all__)
    assert len(set(names)) == len(names) == count
    for name in names:
        assert getattr(mod, name) is not None, name
