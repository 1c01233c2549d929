"""``recover`` while a live save ends, at every call of the recover.

The mirror of ``test_recover_races`` (there the recover runs whole between two calls of the
save; here the save's end runs whole between two calls of the recover).  A save in a thread
is held at the end of its commit, at the unlink of its journal or at the unlink of a lock
file, with its locks held; ``recover`` runs on its directories in the main thread, and right
before its k-th ``_sys`` call the save is let go and runs to its end.  The save removes its
journal before its lock files, so a recover that read a journal and then finds a lock file
gone must look again: the journal gone too is a save that ended, not a refusal.

What must hold at every k: ``recover`` raises nothing and reports the save at most as
``skipped`` (a start-up recover beside healthy saves exits 0), and the save's outputs and
sources are exactly what a save with no recover beside it leaves.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, recover, save_many
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord_testing import files, leftovers, pattern
from filecord_testing import owned_file as owned

W = 4096
D1, D2 = pattern(3 * W + 11, "fin-1"), pattern(2 * W, "fin-2")


def _outputs(root: Path) -> dict[Path, Cord]:
    for d in ("A", "B"):
        (root / d).mkdir(exist_ok=True)
    return {root / "A" / "o1": Cord([b"H" * W, owned(root / "A" / "s1", D1)]),
            root / "B" / "o2": Cord([b"h", owned(root / "B" / "s2", D2)])}


DONE = {"A/o1": b"H" * W + D1, "B/o2": b"h" + D2}


class FinishAt(_sys.Backend):
    """Holds the save's thread at ``pause`` (an unlink of a name ending so); lets it go right
    before the main thread's ``at``-th call, and waits for the save to end."""

    def __init__(self, pause: str, at: int) -> None:
        self.pause, self.at, self.calls = pause, at, 0
        self.held, self.go = threading.Event(), threading.Event()
        self.saver: threading.Thread | None = None

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if threading.current_thread() is self.saver:
            if (op == "unlink" and str(args[0]).endswith(self.pause)
                    and not self.go.is_set()):
                self.held.set()
                self.go.wait(30)
            return
        self.calls += 1
        if self.calls == self.at:
            self.let_go()

    def let_go(self) -> None:
        self.go.set()
        if self.saver is not None:
            self.saver.join(30)


def _race(root: Path, pause: str, at: int) -> tuple[FinishAt, list[Any], BaseException | None]:
    outs = _outputs(root)
    fs = FinishAt(pause, at)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            save_many(outs, consume=True, window=W)
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    with _sys.use(fs):
        fs.saver = threading.Thread(target=run)
        fs.saver.start()
        assert fs.held.wait(30), "the save never reached its end"
        try:
            results = [r for d in ("A", "B") for r in recover(root / d)]
            error: BaseException | None = None
        except BaseException as exc:
            results, error = [], exc
        fs.let_go()
    assert not failed, failed
    return fs, results, error


@pytest.mark.parametrize("pause", [_names.JOURNAL, _names.LOCK])
def test_recover_beside_a_save_that_ends_says_nothing_false(tmp_path: Path, pause: str) -> None:
    k, seen = 1, 0
    while True:
        root = tmp_path / f"k{k}"
        root.mkdir()
        fs, results, error = _race(root, pause, k)
        assert error is None, f"recover raised when the save ended before its call {k}: {error}"
        assert {r.action for r in results} <= {"skipped"}, (k, results)
        assert files(root) == DONE, k
        assert leftovers(root / "A") == leftovers(root / "B") == [], k
        seen += bool(results)
        if fs.calls < k:  # the recover ended before call k: every instant was tried
            break
        k += 1
    assert k > 5
    assert seen >= 1  # the recover did meet the live save's lock
