"""The child side of the SIGKILL suite: run a save or a recovery, die before the Nth call.

``python -m support.killjob ROOT SPEC PHASE AT`` (with ``src`` and ``tests`` on PYTHONPATH):
``PHASE`` is ``save`` (build the spec's cords from the files under ROOT and save them) or
``recover`` (recover every directory the save used, the journal's first).  The process
SIGKILLs itself right before its ``AT``-th destructive call (an open that creates a name
counts); it exits 0 if it finished first, and 3 on any exception.  The
parent rebuilds the same files from the spec before starting it, so nothing but the file
system is shared.

``run_job`` runs a job in a child of a fork server: a lean interpreter started once, with only
this module imported, that forks one child per job.  Forking the test process itself
(``fork_run``) copies its page tables, which in a full run (torch and executorch imported, a
few hundred MB mapped) costs about 0.1 s a fork: more than the job, when a sweep has a
thousand points.  ``fork_run`` stays for jobs that are closures.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import filecord
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


class _Server:
    """A lean interpreter (this module and filecord imported, nothing else) that forks a child
    per call: one request line in (a module, a function of it, its arguments, and a file for
    its traceback), the child's exit code out.  It imports a module once, before its first
    fork, so later children start with it loaded.  It exits when the test process closes its
    stdin."""

    proc: subprocess.Popen[str] | None = None

    @classmethod
    def run(cls, request: list[str]) -> int:
        if cls.proc is None or cls.proc.poll() is not None:
            tests = str(Path(__file__).resolve().parents[1])
            src = os.path.dirname(os.path.dirname(os.path.abspath(filecord.__file__)))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, tests])}
            cls.proc = subprocess.Popen(
                [sys.executable, "-m", "support.killjob", "--serve"], env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert cls.proc.stdin is not None
        assert cls.proc.stdout is not None
        cls.proc.stdin.write(json.dumps(request) + "\n")
        cls.proc.stdin.flush()
        return int(cls.proc.stdout.readline())


def _serve() -> None:
    for line in sys.stdin:
        module, function, args, err = json.loads(line)
        fn = getattr(importlib.import_module(module), function)
        pid = os.fork()
        if pid == 0:
            os.dup2(2, 1)  # stdout is the answer pipe: nothing the child prints may land there
            code = 0
            try:
                fn(*args)
            except BaseException:
                Path(err).write_text(traceback.format_exc())
                code = 3
            os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


def run_call(module: str, function: str, *args: str | int) -> tuple[int, str]:
    """``module.function(*args)`` in a fork server's child: its exit code (-9 when it was
    SIGKILLed, 3 when it raised) and the traceback it raised with ('' if none).  The function
    must be importable by name (module level), its arguments JSON."""
    fd, err = tempfile.mkstemp(prefix="killjob-", suffix=".err")
    os.close(fd)
    try:
        code = _Server.run([module, function, list(args), err])
        return code, Path(err).read_text()
    finally:
        os.unlink(err)


def run_job(root: str, spec_name: str, phase: str, at: int) -> tuple[int, str]:
    """:func:`job` in a fork server's child (:func:`run_call`)."""
    return run_call("support.killjob", "job", root, spec_name, phase, at)


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        _serve()
        return 0
    root, spec_name, phase, at = argv
    try:
        job(root, spec_name, phase, int(at))
    except Exception:
        traceback.print_exc()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
