"""The child side of the SIGKILL suite: run a save or a recovery, die before the Nth call.

``python -m support.killjob ROOT SPEC PHASE AT`` (with ``src`` and ``tests`` on PYTHONPATH):
``PHASE`` is ``save`` (build the spec's cords from the files under ROOT and save them) or
``recover`` (recover every directory the save used, the journal's first).  The process
SIGKILLs itself right before its ``AT``-th destructive call (an open that creates a name
counts); it exits 0 if it finished first, and 3 on any exception.  The
parent rebuilds the same files from the spec before starting it, so nothing but the file
system is shared.  ``fork_run`` runs the same jobs in a forked child, which is much cheaper
than starting an interpreter when there are hundreds of points.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from filecord._io import syscalls as _sys
from support.faultfs import RECOVER_OPS, KillFS
from support.scenarios import SPECS, Layout


def job(root: str, spec_name: str, phase: str, at: int) -> None:
    lay = Layout(SPECS[spec_name], Path(root))
    if phase == "save":
        cords, _datas = lay.cords()
        with _sys.use(KillFS(at)):
            lay.run(cords)
    elif phase == "recover":
        with _sys.use(KillFS(at, RECOVER_OPS)):
            lay.recover_all()
    else:
        raise ValueError(phase)


def fork_run(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child; its exit code, or -9 when it was SIGKILLed."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller (pytest)
        code = 3
        try:
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    root, spec_name, phase, at = argv
    try:
        job(root, spec_name, phase, int(at))
    except Exception:
        traceback.print_exc()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
