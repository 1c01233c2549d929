"""The house check: no import cycle inside ``src/filecord``, and no system call around ``_sys``.

Run by ``tools/test`` next to ruff and mypy; ``python tools/check_house.py [SRC]`` exits 1 and
prints one line per problem.  It reads the sources with :mod:`ast` and imports nothing.

Import cycles
    Every ``import`` and ``from ... import`` inside the package counts, at module level and
    inside functions alike: a lazy import only postpones a cycle, the two modules still cannot
    be understood (or tested) apart.  Imports under ``if TYPE_CHECKING:`` are excluded, because
    they never run and exist precisely to name a type without depending on its module.
    ``from pkg import name`` is an edge to the submodule ``pkg.name`` when that module exists,
    else to ``pkg`` itself (its ``__init__``); ``importlib.import_module("pkg.mod")`` with a
    literal name is an edge too.  Importing ``a.b.c`` is not counted as an edge
    to the packages ``a`` and ``a.b``: Python initialises them first, but a package's
    ``__init__`` re-exporting its submodules is not a cycle between those submodules.

System calls
    ``_sys`` is the fault-injection seam, so anything that touches the file system or the
    process's descriptors must go through it.  Outside ``_sys.py`` the checker rejects every
    use of ``shutil`` and ``tempfile``, ``io.open``/``io.FileIO``, the builtin ``open`` and
    every attribute of ``os``/``os.path`` that is not in :data:`OS_PURE`/:data:`OS_PATH_PURE`
    (names that compute without asking the kernel: constants, types, string functions).  A
    name imported with ``from os import x``, or fetched with ``getattr(os, "x")``, is judged
    the same way.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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
    """The modules of the package that ``mod`` imports (anywhere but under TYPE_CHECKING)."""
    out: set[str] = set()
    for node in _nodes(tree):
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
          known_cycles: frozenset[frozenset[str]] = frozenset(),
          known_bypasses: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """Every problem in ``src/package``, one line each; empty when the house is in order."""
    mods = modules(src, package)
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    seen: set[tuple[str, str]] = set()
    for mod in mods.values():
        tree = ast.parse(mod.path.read_bytes(), filename=str(mod.path))
        graph[mod.name] = imports(mod, tree, mods)
        if mod.name == f"{package}.{seam}":
            continue
        for line, what in bypasses(tree):
            seen.add((mod.name, what))
            if (mod.name, what) not in known_bypasses:
                problems.append(f"{mod.path}:{line}: {what} bypasses {package}.{seam}")
    found = cycles(graph)
    problems.extend(
        f"import cycle among {', '.join(comp)}: " + " -> ".join(_path_in(comp, graph))
        for comp in found if frozenset(comp) not in known_cycles
    )
    problems.extend(f"known cycle no longer there (remove it from the list): {sorted(c)}"
                    for c in known_cycles - {frozenset(c) for c in found})
    problems.extend(f"known bypass no longer there (remove it from the list): {m} {what}"
                    for m, what in sorted(known_bypasses - seen))
    return problems


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "src"
    problems = check(src)
    sys.stdout.writelines(p + "\n" for p in problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
