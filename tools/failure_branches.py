"""Count the branch points of the save's failure path (issue 22), so the number is reproducible.

    python tools/failure_branches.py [--by-function]

The failure path is every function in ``src/filecord/_txn/failure.py`` (``fail`` and the helpers
it calls to close, hold, keep, roll back and clean up).  A branch point is one of: ``if``
(statement or conditional expression), ``for``, ``while``, ``try``, each ``except`` handler,
each extra operand of a boolean operator (``a and b or c`` counts 2), and each ``if`` of a
comprehension.  ``match`` cases count one each.  Nested functions count with their parent.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILURE = ROOT / "src" / "filecord" / "_txn" / "failure.py"


def branch_points(node: ast.AST) -> int:
    n = 0
    for sub in ast.walk(node):
        if isinstance(sub, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try,
                            ast.ExceptHandler, ast.match_case)):
            n += 1
        elif isinstance(sub, ast.BoolOp):
            n += len(sub.values) - 1
        elif isinstance(sub, ast.comprehension):
            n += len(sub.ifs)
    return n


def per_function(path: Path = FAILURE) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    return {f.name: branch_points(f) for f in tree.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def main() -> int:
    counts = per_function()
    if "--by-function" in sys.argv[1:]:
        for name, n in counts.items():
            sys.stdout.write(f"{n:4} {name}\n")
    sys.stdout.write(f"{sum(counts.values())} branch points in the failure path "
                     f"({len(counts)} functions of {FAILURE.relative_to(ROOT)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
