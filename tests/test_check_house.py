"""tools/check_house.py: finds import cycles and system calls around the seam, in a small
package written for each test, and finds none in filecord itself."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).parents[1] / "tools" / "check_house.py"


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


def problems(src: Path) -> list[str]:
    result: list[str] = house.check(src, "pkg", "_sys")
    return result


CLEAN = {
    "a.py": """\
        import os
        import os.path
        from typing import TYPE_CHECKING

        from pkg import _sys, b
        from pkg.sub import c

        if TYPE_CHECKING:
            from pkg import d  # d imports a: excluded, it never runs

        def name(p: os.PathLike[str]) -> str:
            fd = _sys.open(os.fspath(p), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return os.path.join(os.path.dirname(str(fd)), os.path.basename(os.fsdecode(b"x")))
        """,
    "b.py": "import io\nBUF = io.BytesIO()\n",
    "sub/__init__.py": "",
    "sub/c.py": "from .. import b\nfrom . import e\n",
    "sub/e.py": "import errno, stat\nE = errno.ENOENT\nR = stat.S_ISREG\n",
    "d.py": "from pkg import a\n",
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
    assert house.check(src, "pkg", "_sys", known_cycles=frozenset({cycle}),
                       known_bypasses=frozenset({("pkg.a", "os.unlink")})) == []
    stale = house.check(src, "pkg", "_sys", known_cycles=frozenset({cycle, frozenset({"pkg.b", "x"})}),
                        known_bypasses=frozenset({("pkg.a", "os.unlink"), ("pkg.b", "os.stat")}))
    assert stale == [
        "known cycle no longer there (remove it from the list): ['pkg.b', 'x']",
        "known bypass no longer there (remove it from the list): pkg.b os.stat",
    ]


def test_filecord_itself_is_in_order() -> None:
    assert house.main([str(Path(__file__).parents[1] / "src")]) == 0
