"""Measure the save transaction (issue 36) so the before/after table is reproducible.

    python tools/txn_measure.py [DIR]      # DIR: a copy of src/filecord/_txn (default: this tree)

Prints, for every ``*.py`` in the folder: lines (as ``wc -l`` counts them), branch points (the
rules of ``tools/failure_branches.py``: ``if``, conditional expressions, ``for``, ``while``,
``try``, each ``except``, each extra boolean operand, each comprehension ``if``), the functions
longer than 50 lines (``def`` line to last line, nested ones counted with their parent), and
the outcome sites of ``recover`` outside the decision table: each place in ``recover.py`` that
builds a result whose word is not the table's (a ``Recovered(...)`` call whose action is not
``OUTCOME[...]``, the word of an action ``decide`` returned, or a ``_refuse(...)`` call).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failure_branches import branch_points

ROOT = Path(__file__).resolve().parents[1]
TXN = ROOT / "src" / "filecord" / "_txn"


def long_functions(tree: ast.Module, limit: int = 50) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.ClassDef, ast.Module)):
            continue
        funcs = [f for f in node.body if isinstance(f, ast.FunctionDef)]
        for f in funcs:
            n = (f.end_lineno or f.lineno) - f.lineno + 1
            if n > limit:
                out.append((f.name, n))
    return out


def outcome_sites(tree: ast.Module) -> int:
    def from_table(call: ast.Call) -> bool:
        word = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "action"), None)
        return (isinstance(word, ast.Subscript) and isinstance(word.value, ast.Attribute)
                and word.value.attr == "OUTCOME")
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Name)
               and (n.func.id == "_refuse" or (n.func.id == "Recovered" and not from_table(n))))


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else TXN
    lines = branches = sites = 0
    longs: list[str] = []
    for path in sorted(folder.glob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        lines += text.count("\n")
        branches += branch_points(tree)
        longs += [f"{path.stem}.{name} {n}" for name, n in long_functions(tree)]
        if path.name == "recover.py":
            sites = outcome_sites(tree)
    sys.stdout.write(f"lines {lines}\nbranch points {branches}\n"
                     f"functions over 50 lines {len(longs)}: {', '.join(sorted(longs))}\n"
                     f"recover outcome sites outside the table {sites}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
