"""Every frozen dataclass in ``src/filecord`` (a value type) is also slotted; read from the
sources with :mod:`ast`, so a new one cannot slip in without ``slots=True``."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "filecord"


def _keywords(decorator: ast.expr) -> dict[str, object]:
    if not isinstance(decorator, ast.Call):
        return {}
    return {k.arg: ast.literal_eval(k.value) for k in decorator.keywords if k.arg}


def test_frozen_dataclasses_are_slotted() -> None:
    unslotted, frozen = [], 0
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if ast.unparse(target) not in ("dataclass", "dataclasses.dataclass"):
                    continue
                kw = _keywords(d)
                if kw.get("frozen"):
                    frozen += 1
                    if not kw.get("slots"):
                        unslotted.append(f"{path.relative_to(SRC)}: {node.name}")
    assert frozen > 40  # the walk found the value types
    assert unslotted == []
