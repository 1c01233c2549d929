"""``python -m filecord.cli ARGS`` for many inputs, one process each, the import paid once.

A fresh interpreter spends about half a second importing the command line; a corpus of a
hundred inputs spends a minute on it.  :func:`run_many` starts one lean interpreter (the fork
server: ``python`` with ``filecord.cli`` imported and nothing run) that forks a child per
input, so each input still runs in its own process: its own working directory, its argv as
the bytes a shell passes, its stdout and stderr on their own files (the streams the
interpreter made for pipes, as for ``subprocess.run(capture_output=True)``), and its exit
status as ``python -m`` gives it (an exception that escapes prints its traceback and exits 1;
the atexit functions run, finalizers still alive among them; only the interpreter's teardown
of its modules is skipped).  Nothing a child does reaches the next one.  Each child is killed
by SIGALRM after ``timeout`` seconds (exit status -14).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_SERVER = r"""
import atexit, json, os, runpy, signal, sys

import filecord.cli  # the import every child shares

def exit_status(exc):
    # The exit status the interpreter makes of SystemExit (and prints, for a message).
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1

def child(args, cwd, out, err, timeout):
    signal.alarm(timeout)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(cwd)
    sys.argv = ["filecord", *[os.fsdecode(bytes.fromhex(a)) for a in args]]
    try:
        runpy.run_module("filecord.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the traceback, as the interpreter prints it
        code = 1
    # The interpreter's exit without its module teardown (a tenth of a second a child): the
    # atexit functions (finalizers still alive, logging's flush), then the streams.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)

jobs, parallel, timeout = json.load(sys.stdin)
codes = [None] * len(jobs)
running = {}
pending = list(enumerate(jobs))
sys.stdout.flush()
sys.stderr.flush()
while pending or running:
    while pending and len(running) < parallel:
        i, (args, cwd, out, err) = pending.pop(0)
        pid = os.fork()
        if pid == 0:
            child(args, cwd, out, err, timeout)
        running[pid] = i
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""


def run_many(
    cases: Sequence[tuple[Sequence[bytes], Path]], work: Path, env: Mapping[str, str], *,
    parallel: int = 2, timeout: int = 120,
) -> list[subprocess.CompletedProcess[bytes]]:
    """Each ``(args, cwd)`` as ``python -m filecord.cli *args`` run in ``cwd`` (see the module
    docstring); ``work`` holds the captured streams.  The results in the order of ``cases``."""
    jobs = []
    for i, (args, cwd) in enumerate(cases):
        out, err = work / f"{i}.out", work / f"{i}.err"
        jobs.append([[a.hex() for a in args], os.fspath(cwd), os.fspath(out), os.fspath(err)])
    server = subprocess.run(
        [sys.executable, "-c", _SERVER], input=json.dumps([jobs, parallel, timeout]).encode(),
        capture_output=True, env=dict(env), check=False,
        timeout=timeout * (len(jobs) // parallel + 1) + 60,
    )
    assert server.returncode == 0, server.stderr.decode(errors="replace")
    codes = json.loads(server.stdout)
    return [
        subprocess.CompletedProcess(
            [sys.executable, "-m", "filecord.cli", *args], code,
            (work / f"{i}.out").read_bytes(), (work / f"{i}.err").read_bytes())
        for i, ((args, _cwd), code) in enumerate(zip(cases, codes, strict=True))
    ]
