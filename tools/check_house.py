"""The house check: imports point down the layers, no import cycle inside ``src/filecord``, no
system call around the seam (``_io.syscalls``), no branch on an exception's message text.

Run by ``tools/test`` next to ruff and mypy; ``python tools/check_house.py [SRC]`` exits 1 and
prints one line per problem.  It reads the sources with :mod:`ast` and imports nothing.

Layers
    :data:`LAYERS` lists the layers bottom up, each with the modules in it (``fnmatch``
    patterns relative to the package; a module is placed by itself or its nearest package).
    An import may point to its own layer or one below, never up; every module must be in a
    layer, so a new one is placed on purpose.  ``errors`` is the bottom (every layer raises
    its errors); the package's ``__init__`` (it re-exports the public names) sits above the
    formats, which never import it, and below the CLI, a client of the public API.  The other
    public modules sit in their layer: ``tensors`` with the pieces, ``torch`` with the formats.

Import cycles
    Every ``import`` and ``from ... import`` inside the package counts, at module level and
    inside functions alike: a lazy import only postpones a cycle, the two modules still cannot
    be understood (or tested) apart.  Imports under ``if TYPE_CHECKING:`` count too: a type
    named from a module above, or from a module that imports us, is the same tangle for a
    reader (the fix is a leaf of value types both import, like ``_plan/types.py``).
    ``from pkg import name`` is an edge to the submodule ``pkg.name`` when that module exists,
    else to ``pkg`` itself (its ``__init__``); ``importlib.import_module("pkg.mod")`` with a
    literal name is an edge too.  Importing ``a.b.c`` is not counted as an edge
    to the packages ``a`` and ``a.b``: Python initialises them first, but a package's
    ``__init__`` re-exporting its submodules is not a cycle between those submodules.

System calls
    ``_io.syscalls`` is the fault-injection seam, so anything that touches the file system or
    the process's descriptors must go through it.  Outside it the checker rejects every
    use of ``shutil`` and ``tempfile``, ``io.open``/``io.FileIO``, the builtin ``open`` and
    every attribute of ``os``/``os.path`` that is not in :data:`OS_PURE`/:data:`OS_PATH_PURE`
    (names that compute without asking the kernel: constants, types, string functions).  A
    name imported with ``from os import x``, or fetched with ``getattr(os, "x")``, is judged
    the same way.

Text branches
    An exception's message is for people.  Code that decides on it (``"linked" in exc.reason``,
    ``exc.reason == METADATA_ONLY``, ``str(exc) == "..."``, ``"x" in exc.args[0]``) breaks
    silently when a message is reworded; errors carry a typed kind (an enum) to branch on.
    Rejected: ``==``, ``!=``, ``in``, ``not in`` between ``X.reason``, ``str(X)`` or ``X.args``
    (or an item of it) and text: a string literal, an f-string or an UPPER_CASE constant;
    and ``.startswith``/``.endswith`` on them.  Every ``.reason`` counts, whatever its owner:
    a reason that code must branch on should be an enum, not text.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

# --- what is allowed ------------------------------------------------------------------------

# Attributes of ``os`` that are not system calls.  (``environ`` is a dict read at start-up;
# ``strerror``/``major``/``minor`` are arithmetic or a table look-up in libc.)
OS_PURE = frozenset({
    "fspath", "fsencode", "fsdecode", "PathLike", "stat_result", "statvfs_result",
    "terminal_size", "DirEntry", "sep", "altsep", "extsep", "pathsep", "linesep", "curdir",
    "pardir", "devnull", "name", "environ", "strerror", "major", "minor", "makedev", "error",
    "F_OK", "R_OK", "W_OK", "X_OK", "path",
})
# Prefixes of ``os`` constants: open flags, statvfs flags, seek whences.
OS_PURE_PREFIXES = ("O_", "ST_", "SEEK_")
# Attributes of ``os.path`` that only manipulate strings.  (Not ``abspath``: it asks for the
# working directory; not ``realpath``, ``exists``, ``isdir``...: they stat.)
OS_PATH_PURE = frozenset({
    "join", "basename", "dirname", "split", "splitext", "splitdrive", "isabs", "normpath",
    "normcase", "commonpath", "commonprefix", "sep", "altsep", "extsep", "pathsep", "curdir",
    "pardir", "devnull",
})
# Modules of which nothing may be used outside the seam.
WHOLLY_SYSTEM = frozenset({"shutil", "tempfile"})
# ``io`` is mostly pure (BytesIO, StringIO); these open files.
IO_SYSTEM = frozenset({"open", "open_code", "FileIO"})

# The layers, bottom up: an import points to its own layer or one below.  Patterns are
# relative to the package ("" is its ``__init__``); a module is placed by the nearest of itself
# and its packages that a pattern names.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors", ("errors",)),                        # raised everywhere: a leaf
    ("io", ("_io",)),                               # the seam, token names, paths
    ("pieces", ("_pieces", "tensors")),             # FileBackedData, Cord; named tensors
    ("plan", ("_plan",)),                           # facts -> plan, value types in a leaf
    ("txn", ("_txn",)),                             # the save transaction
    ("kit", ("_kit",)),                             # what every format shares
    ("formats", ("executorch", "safetensors", "gguf", "dcp", "torch")),
    ("face", ("", "_formats", "_verify")),          # ``filecord/__init__``: re-exports;
                                                    # ``_formats``: the formats' registrations
    ("cli", ("cli", "__main__")),                   # on the public API: parsing, rendering;
                                                    # ``python -m filecord`` runs it
)
# Modules still waiting to move into their layer's folder (issue 22: the transaction is in
# ``_txn/``, the CLI helpers are in ``cli/``).  TEMPORARY:
# delete each entry when its module moves; an entry that matches nothing is reported.
PENDING_PLACES: dict[str, str] = {
}
# Branches on exception text still in the code, by module and the comparison as written
# (``ast.unparse``).  TEMPORARY (issue 22, items 2-3: DataChangedError gets a typed kind and
# the failure path a decision table): the txn engineer deletes these with the branches.
KNOWN_TEXT_BRANCHES: frozenset[tuple[str, str]] = frozenset({
})

# --- the checker ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Module:
    name: str  # dotted, e.g. "filecord.cli"
    path: Path
    is_package: bool


def modules(src: Path, package: str) -> dict[str, Module]:
    """Every module of ``package`` under ``src`` (``src/package/**.py``), by dotted name."""
    found: dict[str, Module] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` (their ``else`` still runs)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _base(mod: Module, level: int, target: str | None) -> str:
    """The absolute name of a relative import's target."""
    if level == 0:
        return target or ""
    parts = mod.name.split(".")
    if not mod.is_package:
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, target] if target else parts)


def imports(mod: Module, tree: ast.AST, known: dict[str, Module]) -> set[str]:
    """The modules of the package that ``mod`` imports (anywhere, under TYPE_CHECKING too)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _base(mod, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
        elif (name := _imported_by_name(node)) is not None and name in known:
            out.add(name)
    out.discard(mod.name)
    return out


def _imported_by_name(node: ast.AST) -> str | None:
    """``importlib.import_module("pkg.mod")`` (or ``import_module(...)``) with a literal name."""
    if not (isinstance(node, ast.Call) and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return None
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return node.args[0].value if called == "import_module" else None


def layer_of(name: str, package: str, layers: Sequence[tuple[str, tuple[str, ...]]],
             pending: Mapping[str, str]) -> tuple[int, str] | None:
    """(rank, layer) of module ``name``: the nearest of itself and its packages that a pattern
    of ``layers`` or ``pending`` names; None when none does."""
    rank = {layer: i for i, (layer, _) in enumerate(layers)}
    rel = name[len(package) + 1:].split(".") if name != package else []
    for n in range(len(rel), -1, -1):
        here = ".".join(rel[:n])
        if n == 0 and rel:
            return None  # the package itself places only its ``__init__``
        for layer, patterns in layers:
            if any(fnmatchcase(here, p) for p in patterns):
                return rank[layer], layer
        for p, layer in pending.items():
            if fnmatchcase(here, p):
                return rank[layer], layer
    return None


def upward(graph: Mapping[str, set[str]], package: str,
           layers: Sequence[tuple[str, tuple[str, ...]]],
           pending: Mapping[str, str]) -> list[str]:
    """One line per module in no layer and per import that points up a layer."""
    found: list[str] = []
    order = " < ".join(layer for layer, _ in layers)
    places = {m: layer_of(m, package, layers, pending) for m in graph}
    for m, place in sorted(places.items()):
        if place is None:
            found.append(f"{m} is in no layer: place it in LAYERS ({order})")
    for m in sorted(graph):
        mine = places[m]
        for target in sorted(graph[m]):
            theirs = places.get(target)
            if mine is not None and theirs is not None and theirs[0] > mine[0]:
                found.append(f"{m} ({mine[1]}) imports {target} ({theirs[1]}), a layer above: "
                             f"imports point down, {order}")
    used = {p for p in pending for m in graph
            if any(fnmatchcase(".".join(m[len(package) + 1:].split(".")[:n]), p)
                   for n in range(1, m.count(".") + 1))}
    found.extend(f"pending place no longer used (remove it from the list): {p}"
                 for p in sorted(set(pending) - used))
    return found


_TEXT_ONLY_CALLS = frozenset({"startswith", "endswith"})


def _is_message(node: ast.expr) -> bool:
    """``X.reason``, ``X.args``, ``X.args[i]`` or ``str(X)``: an exception's text."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr in ("reason", "args")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "str" and len(node.args) == 1)


def _is_text(node: ast.expr) -> bool:
    """A string literal, an f-string, or a named constant (UPPER_CASE name or attribute)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    name = node.attr if isinstance(node, ast.Attribute) else (
        node.id if isinstance(node, ast.Name) else "")
    return len(name) > 1 and name.isupper()


def text_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, source)`` of every comparison of an exception's text with text."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (
                        (_is_message(left) and _is_text(right))
                        or (_is_message(right) and _is_text(left))):
                    found.append((node.lineno, ast.unparse(node)))
                    break
                left = right
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _TEXT_ONLY_CALLS and _is_message(node.func.value)):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _path_in(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first module, for the message."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # pragma: no cover - a component always has a cycle through each member


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _judge(qualified: list[str]) -> bool:
    """Whether ``qualified`` (``["os", "path", "isdir"]``) names a system call."""
    head, rest = qualified[0], qualified[1:]
    if head in WHOLLY_SYSTEM:
        return True
    if head == "io":
        return bool(rest) and rest[0] in IO_SYSTEM
    if head == "os" and not rest:
        return False
    if head == "os":
        if rest[0] == "path":
            return len(rest) > 1 and rest[1] not in OS_PATH_PURE
        return not (rest[0] in OS_PURE or rest[0].startswith(OS_PURE_PREFIXES))
    return False


_WATCHED = frozenset({"os", "os.path", "shutil", "tempfile", "io"})


def bypasses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` for every system call that does not go through the seam."""
    aliases: dict[str, list[str]] = {}  # local name -> what it means, e.g. "p" -> [os, path]
    found: list[tuple[int, str]] = []
    nodes = list(_nodes(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in _WATCHED:
                    local = a.asname or a.name.split(".")[0]
                    aliases[local] = a.name.split(".") if a.asname else [local]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in _WATCHED:
            for a in node.names:
                meant = [*node.module.split("."), a.name]
                aliases[a.asname or a.name] = meant
                if _judge(meant):
                    found.append((node.lineno, ".".join(meant)))
    shadowed = {
        n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    } | {a.asname or a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names}
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "open" and "open" not in shadowed:
                found.append((node.lineno, "open"))
            args = node.args
            if (node.func.id == "getattr" and len(args) >= 2 and isinstance(args[0], ast.Name)
                    and args[0].id in aliases and isinstance(args[1], ast.Constant)
                    and isinstance(args[1].value, str)):  # getattr(os, "unlink")
                meant = [*aliases[args[0].id], args[1].value]
                if _judge(meant):
                    found.append((node.lineno, ".".join(meant)))
            continue
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None or dotted[0] not in aliases:
            continue
        meant = [*aliases[dotted[0]], *dotted[1:]]
        # ``os.stat(p).st_size`` is the call ``os.stat``: judge the name up to the function.
        called = meant[: 3 if meant[:2] == ["os", "path"] else 2]
        if _judge(called):
            found.append((node.lineno, ".".join(called)))
    return sorted(set(found))


def check(src: Path, package: str = "filecord", seam: str = "_io.syscalls", *,
          layers: Sequence[tuple[str, tuple[str, ...]]] = LAYERS,
          pending_places: Mapping[str, str] = PENDING_PLACES,
          known_cycles: frozenset[frozenset[str]] = frozenset(),
          known_bypasses: frozenset[tuple[str, str]] = frozenset(),
          known_text_branches: frozenset[tuple[str, str]] = KNOWN_TEXT_BRANCHES) -> list[str]:
    """Every problem in ``src/package``, one line each; empty when the house is in order.
    ``layers=()`` checks no layers (only cycles, the seam and text branches)."""
    mods = modules(src, package)
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    seen: set[tuple[str, str]] = set()
    seen_text: set[tuple[str, str]] = set()
    for mod in mods.values():
        tree = ast.parse(mod.path.read_bytes(), filename=str(mod.path))
        graph[mod.name] = imports(mod, tree, mods)
        for line, text in text_branches(tree):
            seen_text.add((mod.name, text))
            if (mod.name, text) not in known_text_branches:
                problems.append(f"{mod.path}:{line}: {text}: a branch on an exception's text "
                                "(give the error a typed kind to branch on)")
        if mod.name == f"{package}.{seam}":
            continue
        for line, what in bypasses(tree):
            seen.add((mod.name, what))
            if (mod.name, what) not in known_bypasses:
                problems.append(f"{mod.path}:{line}: {what} bypasses {package}.{seam}")
    if layers:
        problems.extend(upward(graph, package, layers, pending_places))
    found = cycles(graph)
    problems.extend(
        f"import cycle among {', '.join(comp)}: " + " -> ".join(_path_in(comp, graph))
        for comp in found if frozenset(comp) not in known_cycles
    )
    problems.extend(f"known cycle no longer there (remove it from the list): {sorted(c)}"
                    for c in known_cycles - {frozenset(c) for c in found})
    problems.extend(f"known bypass no longer there (remove it from the list): {m} {what}"
                    for m, what in sorted(known_bypasses - seen))
    problems.extend(f"known text branch no longer there (remove it from the list): {m} {t}"
                    for m, t in sorted(known_text_branches - seen_text))
    return problems


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "src"
    problems = check(src)
    sys.stdout.writelines(p + "\n" for p in problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
