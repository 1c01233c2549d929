"""tools/check_house.py: finds imports that point up a layer, import cycles (type-only ones
too), system calls around the seam and branches on exception text, in a small package written
for each test, and finds none in filecord itself."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "check_house.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_house", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_house"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


house = _load()

SEAM = """\
import os, shutil, tempfile

def open(path, flags):
    return os.open(path, flags)

def gone(path):
    shutil.rmtree(path)
    return tempfile.gettempdir()
"""


def write(src: Path, files: dict[str, str]) -> Path:
    """``files``: path under ``src/pkg`` -> text; ``__init__.py`` and ``_sys.py`` by default."""
    for rel, text in {"__init__.py": "", "_sys.py": SEAM, **files}.items():
        path = src / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return src


def problems(src: Path, **kw: object) -> list[str]:
    """The checker on ``src/pkg`` with the seam ``pkg._sys``, no layers and no known entries
    unless ``kw`` gives them."""
    args: dict[str, object] = {"seam": "_sys", "layers": (), "pending_places": {},
                               "known_text_branches": frozenset()}
    result: list[str] = house.check(src, "pkg", **{**args, **kw})
    return result


CLEAN = {
    "a.py": """\
        import os
        import os.path
        from typing import TYPE_CHECKING

        from pkg import _sys, b
        from pkg.sub import c

        if TYPE_CHECKING:
            from pkg import d  # a type-only import: counts like any other (d imports nothing)

        def name(p: os.PathLike[str]) -> str:
            fd = _sys.open(os.fspath(p), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return os.path.join(os.path.dirname(str(fd)), os.path.basename(os.fsdecode(b"x")))
        """,
    "b.py": "import io\nBUF = io.BytesIO()\n",
    "sub/__init__.py": "",
    "sub/c.py": "from .. import b\nfrom . import e\n",
    "sub/e.py": "import errno, stat\nE = errno.ENOENT\nR = stat.S_ISREG\n",
    "d.py": "class D: ...\n",
}


def test_a_clean_package_passes(tmp_path: Path) -> None:
    assert problems(write(tmp_path, CLEAN)) == []


def test_a_two_module_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.a import g\n    return g\n",
    })
    assert problems(src) == ["import cycle among pkg.a, pkg.b: pkg.a -> pkg.b -> pkg.a"]


def test_a_three_module_cycle_through_relative_imports(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "a.py": "from . import b\n",
        "b.py": "from .sub.c import x\n",
        "sub/__init__.py": "",
        "sub/c.py": "import pkg.a\nx = 1\n",
    })
    assert problems(src) == [
        "import cycle among pkg.a, pkg.b, pkg.sub.c: pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"]


def test_an_import_by_name_counts(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "a.py": "import importlib\ndef f():\n    return importlib.import_module('pkg.b')\n",
        "b.py": "from pkg import a\n",
    })
    assert problems(src) == ["import cycle among pkg.a, pkg.b: pkg.a -> pkg.b -> pkg.a"]


def test_a_package_init_that_imports_back_is_a_cycle(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "__init__.py": "from pkg.a import f\n",
        "a.py": "from pkg import VERSION\ndef f(): pass\n",
    })
    assert problems(src) == ["import cycle among pkg, pkg.a: pkg -> pkg.a -> pkg"]


@pytest.mark.parametrize(("text", "what"), [
    ("import os\nos.stat('x')\n", "os.stat"),
    ("import os\nos.stat('x').st_size\n", "os.stat"),
    ("import os\nos.path.isdir('x')\n", "os.path.isdir"),
    ("import os\nos.path.realpath('x')\n", "os.path.realpath"),
    ("import os.path as p\np.exists('x')\n", "os.path.exists"),
    ("from os import path\npath.lexists('x')\n", "os.path.lexists"),
    ("from os import unlink\n", "os.unlink"),
    ("import shutil\nshutil.copyfile('a', 'b')\n", "shutil.copyfile"),
    ("import shutil as sh\nsh.rmtree('a')\n", "shutil.rmtree"),
    ("import tempfile\ntempfile.gettempdir()\n", "tempfile.gettempdir"),
    ("import io\nio.open('x')\n", "io.open"),
    ("def f():\n    with open('x') as fh:\n        return fh.read()\n", "open"),
    ("import os\nfn = os.listdir\n", "os.listdir"),
    ("import os\ngetattr(os, 'unlink')('x')\n", "os.unlink"),
])
def test_a_system_call_outside_the_seam_is_found(tmp_path: Path, text: str, what: str) -> None:
    src = write(tmp_path, {"a.py": text})
    got = problems(src)
    assert len(got) == 1, got
    assert f"{Path('pkg', 'a.py')}:" in got[0], got
    assert got[0].endswith(f": {what} bypasses pkg._sys"), got


def test_the_same_calls_inside_the_seam_pass(tmp_path: Path) -> None:
    assert problems(write(tmp_path, {"_sys.py": SEAM + "import os\nos.stat('x')\n"})) == []


def test_known_pending_entries_are_skipped_and_must_still_occur(tmp_path: Path) -> None:
    src = write(tmp_path, {"a.py": "import os\nimport pkg.b\nos.unlink('x')\n",
                           "b.py": "import pkg.a\n"})
    cycle = frozenset({"pkg.a", "pkg.b"})
    assert problems(src, known_cycles=frozenset({cycle}),
                    known_bypasses=frozenset({("pkg.a", "os.unlink")})) == []
    stale = problems(src, known_cycles=frozenset({cycle, frozenset({"pkg.b", "x"})}),
                     known_bypasses=frozenset({("pkg.a", "os.unlink"), ("pkg.b", "os.stat")}))
    assert stale == [
        "known cycle no longer there (remove it from the list): ['pkg.b', 'x']",
        "known bypass no longer there (remove it from the list): pkg.b os.stat",
    ]


def test_a_type_only_cycle_is_a_cycle(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "plan.py": "from pkg.space import peaks\nclass Plan: ...\n",
        "space.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from pkg.plan import Plan\ndef peaks(p: 'Plan') -> int:\n    return 0\n",
    })
    assert problems(src) == [
        "import cycle among pkg.plan, pkg.space: pkg.plan -> pkg.space -> pkg.plan"]


def test_value_types_in_a_leaf_end_the_cycle(tmp_path: Path) -> None:
    src = write(tmp_path, {
        "types.py": "class Plan: ...\n",
        "plan.py": "from pkg.space import peaks\nfrom pkg.types import Plan\n",
        "space.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from pkg.types import Plan\ndef peaks(p: 'Plan') -> int:\n    return 0\n",
    })
    assert problems(src) == []


# The layers of a small package: low < mid < top, the package's __init__ on top.
LAYERS = (("low", ("low", "errors", "_sys")), ("mid", ("mid", "mid_*")), ("top", ("top",)),
          ("face", ("",)))
LAYERED = {
    "errors.py": "class E(Exception): ...\n",
    "low/__init__.py": "",
    "low/seam.py": "from pkg.errors import E\n",
    "mid/__init__.py": "",
    "mid/plan.py": "from pkg.low import seam\nfrom pkg.low.seam import E\n",
    "mid_helper.py": "from pkg.mid import plan\n",
    "top.py": "from pkg.mid.plan import E\nfrom pkg import mid_helper\n",
    "__init__.py": "from pkg.top import E\n",
}
ORDER = "low < mid < top < face"


def test_imports_that_point_down_pass(tmp_path: Path) -> None:
    assert problems(write(tmp_path, LAYERED), layers=LAYERS) == []


@pytest.mark.parametrize("text", [
    "from pkg import top\n",
    "from pkg.top import E\n",
    "import pkg.top\n",
    "def f():\n    from pkg import top\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import E\n",
])
def test_an_import_that_points_up_a_layer_is_found(tmp_path: Path, text: str) -> None:
    src = write(tmp_path, {**LAYERED, "mid/other.py": text})
    assert problems(src, layers=LAYERS) == [
        f"pkg.mid.other (mid) imports pkg.top (top), a layer above: imports point down, {ORDER}"]


def test_nothing_may_import_the_package_face_from_below(tmp_path: Path) -> None:
    src = write(tmp_path, {**LAYERED, "low/ver.py": "from pkg import VERSION\n",
                           "__init__.py": "VERSION = 1\n"})
    assert problems(src, layers=LAYERS) == [
        f"pkg.low.ver (low) imports pkg (face), a layer above: imports point down, {ORDER}"]


def test_a_module_in_no_layer_is_found(tmp_path: Path) -> None:
    src = write(tmp_path, {**LAYERED, "stray.py": "X = 1\n"})
    assert problems(src, layers=LAYERS) == [
        f"pkg.stray is in no layer: place it in LAYERS ({ORDER})"]


def test_a_pending_place_counts_and_must_still_be_used(tmp_path: Path) -> None:
    src = write(tmp_path, {**LAYERED, "_old_plan.py": "from pkg.top import E\n"})
    assert problems(src, layers=LAYERS, pending_places={"_old_*": "top"}) == []
    assert problems(src, layers=LAYERS, pending_places={"_old_*": "mid"}) == [
        f"pkg._old_plan (mid) imports pkg.top (top), a layer above: imports point down, {ORDER}"]
    assert problems(src, layers=LAYERS,
                    pending_places={"_old_*": "top", "_gone": "mid"}) == [
        "pending place no longer used (remove it from the list): _gone"]


@pytest.mark.parametrize("text", [
    "'linked' in exc.reason",
    "exc.reason == METADATA_ONLY",
    "exc.reason != _transfer.METADATA_ONLY",
    "str(exc) == 'disk full'",
    "f'{x} gone' == str(exc)",
    "'denied' not in exc.args[0]",
    "exc.args[0] == 'no space'",
    "exc.reason.startswith('linked')",
    "0 < 1 and err.reason == 'x'",
])
def test_a_branch_on_exception_text_is_found(tmp_path: Path, text: str) -> None:
    src = write(tmp_path, {"a.py": f"def f(exc, err, x):\n    return {text}\n"})
    got = problems(src)
    assert len(got) == 1, got
    assert f"{Path('pkg', 'a.py')}:2: " in got[0], got
    assert got[0].endswith(": a branch on an exception's text "
                           "(give the error a typed kind to branch on)"), got


@pytest.mark.parametrize("text", [
    "exc.kind == Kind.LINKED",
    "exc.kind is ChangeKind.METADATA_ONLY",
    "exc.reason is None",
    "len(exc.args) == 2",
    "'x' in names",
    "exc.reason == other.reason",
    "str(exc)",
    "exc.errno == errno.ENOSPC",
])
def test_branches_on_typed_kinds_pass(tmp_path: Path, text: str) -> None:
    src = write(tmp_path, {"a.py": f"def f(exc, other, names):\n    return {text}\n"})
    assert problems(src) == []


def test_a_known_text_branch_is_skipped_and_must_still_occur(tmp_path: Path) -> None:
    src = write(tmp_path, {"a.py": "def f(exc):\n    return 'x' in exc.reason\n"})
    known = frozenset({("pkg.a", "'x' in exc.reason")})
    assert problems(src, known_text_branches=known) == []
    assert problems(src, known_text_branches=known | {("pkg.b", "'y' in e.reason")}) == [
        "known text branch no longer there (remove it from the list): pkg.b 'y' in e.reason"]


def test_filecord_itself_is_in_order() -> None:
    assert house.main([str(Path(__file__).parents[2] / "src")]) == 0
