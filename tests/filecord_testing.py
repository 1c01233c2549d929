"""Helpers shared by the test modules (imported by name; conftest modules are per folder)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from filecord import Cord, save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData

if TYPE_CHECKING:
    import pytest


def pattern(n: int, seed: str = "x") -> bytes:
    """``n`` deterministic bytes that differ at every offset class (no two blocks equal)."""
    out = bytearray()
    block = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{block}".encode()).digest()
        block += 1
    return bytes(out[:n])


def leftovers(directory: str | Path) -> list[str]:
    """Every file a save names with its token (temps, journals, locks, parked sources): there
    must be none after a clean failure or a recover."""
    return sorted(n for n in os.listdir(directory) if _names.parse(n) is not None)


def close_leaked(directory: str | Path) -> int:
    """Close this process's descriptors on files under ``directory``: what the kernel does
    when a crashed process dies (and with them its ``flock`` locks).  Returns how many."""
    prefix = os.path.realpath(directory) + os.sep
    closed = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(prefix):
            os.close(int(name))
            closed += 1
    return closed


def owned_file(path: Path, data: bytes) -> FileBackedData:
    """Write ``data`` at ``path`` and own it (a consuming save may move and delete it)."""
    path.write_bytes(data)
    return FileBackedData(path, owned=True)


def files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative name -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def one(directory: Path, suffix: str) -> Path:
    """The one file in ``directory`` whose name ends with ``suffix``."""
    found = [p for p in directory.iterdir() if p.name.endswith(suffix)]
    assert len(found) == 1, (suffix, sorted(p.name for p in directory.iterdir()))
    return found[0]


class AtCall(_sys.Backend):
    """Run ``action`` right before the ``at``-th call of ``op`` (a second party's instant)."""

    def __init__(self, op: str, at: int, action: object) -> None:
        self.op, self.at, self.action, self.n = op, at, action, 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == self.op:
            self.n += 1
            if self.n == self.at:
                self.action()  # type: ignore[operator]


def consume_killed_at_truncate(d: Path, at: int, window: int) -> None:
    """Consume ``d/a.bin`` and ``d/b.bin`` (owned) into ``d/out.bin`` in a forked child that a
    SIGKILL stops right before its ``at``-th ``ftruncate``: a save killed mid-move (adoption in
    place off: a.bin, whole at offset 0, is moved too where ranges insert)."""
    from support.killjob import fork_run

    def job() -> None:
        with _sys.use(AtCall("ftruncate", at, lambda: os.kill(os.getpid(), 9))):
            save(d / "out.bin", Cord([FileBackedData(d / "a.bin", owned=True),
                                      FileBackedData(d / "b.bin", owned=True)]),
                 consume=True, window=window, in_place=False)

    assert fork_run(job) == -9


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``build`` filled, built once per test session however many pytest-xdist
    workers ask: the first one builds it under a file lock while the others wait, then all
    read the same files.  A slow module fixture whose result is files (exported programs)
    otherwise runs again in every worker that draws one of its tests.  A build that raised
    leaves nothing behind, so the next worker tries again (and fails the same way).
    """
    base = factory.getbasetemp()
    # Under xdist each worker's base is one folder of the session's; alone, the base is the
    # session's own (its parent holds earlier sessions, whose builds must not be reused).
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / f"built-{name}"
    with open(shared / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_dir():
            work = shared / f"building-{name}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            build(work)
            work.rename(done)
    return done
