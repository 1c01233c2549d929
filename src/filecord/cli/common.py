"""What the CLI modules share: exit codes, the usage error, the common options, argument types,
human units, the one grammar of outputs (``-o/--output``, old forms refused with the new one
shown, output directories created), progress bars and the rendering of a save's report.

A leaf: it imports no other CLI module.  The command table (:mod:`filecord.cli.table`) is the
only module that imports the others; every command and format module imports this one alone,
so ``python -m filecord.cli`` and the command modules see one and the same
:class:`UsageError`.  Progress rendering: the library only calls ``progress(done, total)``;
:class:`Bar` turns those calls into a tqdm bar on a terminal and is silent elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import json
import math
import os
import re
import shlex
import signal
import stat as stat_mod
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from filecord._io import syscalls as _sys
from filecord._io.paths import (
    make_directories,
    missing_directories,
    planned_directories,
    remove_empty,
)
from filecord._plan.types import BLOCK
from filecord._plan.window import CAP, DEFAULT_WINDOW
from filecord.errors import FormatError, add_note

if TYPE_CHECKING:
    from filecord._plan.report import SaveReport

    Operation = Callable[[argparse.Namespace], SaveReport]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 128 + signal.SIGPIPE  # stdout's reader went away: as a filter SIGPIPE killed


class UsageError(Exception):
    """Bad command-line input found after parsing: exit status 2, like argparse's own errors."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` (and a save's rollback) runs."""


def raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(f"stopped by signal {signum}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """For the duration, SIGTERM raises :class:`Terminated` (on the main thread; elsewhere
    signals cannot be handled and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before: Any = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def add_common(p: argparse.ArgumentParser) -> None:
    """The options every saving command takes: ``-q``, ``--json``, ``-v``."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or chatter")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")


def human(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``: binary units, whole bytes below one KiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover - loop always returns


_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
    "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
    "tb": 1000**4, "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"1GiB"``, ``"512M"``, ``"4096"`` -> bytes (decimal for k/M/G, binary for KiB/MiB/GiB)."""
    s = text.strip().lower().replace("_", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):].strip()
    if unit not in _UNITS or not num:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1GiB, 512MiB or 4096)")
    try:
        value = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (too large)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * _UNITS[unit])


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def power_of_two(text: str) -> int:
    """An argparse type: an alignment, a power of two from 1 to 2**30 (it is padding written
    into the file, so an absurd one is a usage error, not a huge write)."""
    value = positive_int(text)
    if value & (value - 1) or value > 1 << 30:
        raise argparse.ArgumentTypeError(f"must be a power of two from 1 to {1 << 30}, "
                                         f"got {value}")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number of at least 0 (0: no limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"cannot be negative, got {value}")
    return value


def parse_window(text: str) -> int:
    """An argparse type: a consume sync window (a size of at least one 4 KiB block)."""
    value = parse_size(text)
    if value < BLOCK:
        raise argparse.ArgumentTypeError(f"the window must be at least {BLOCK} bytes, got {text!r}")
    return value


# --- progress bars: tqdm on a terminal (the cli extra), silence elsewhere ------------------------
# tqdm's own TQDM_* settings apply; FILECORD_NO_PROGRESS=1, TQDM_DISABLE=1 and
# HF_HUB_DISABLE_PROGRESS_BARS=1 switch bars off (checked here: tqdm's environment defaults do
# not override the disable=None we pass).

_OFF_VARS = ("FILECORD_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def _enabled(*, quiet: bool) -> bool:
    if quiet or any(os.environ.get(v, "") not in ("", "0") for v in _OFF_VARS):
        return False
    return sys.stderr.isatty()


class Bar:
    """A context manager whose ``update(done, total)`` fits the library's progress callback."""

    def __init__(self, desc: str, *, quiet: bool) -> None:
        self._desc = desc
        self._bar: Any = None
        self._on = _enabled(quiet=quiet)
        self._last = 0

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, done: int, total: int) -> None:
        if not self._on:
            return
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self._on = False
                return
            self._bar = tqdm(
                total=total, desc=self._desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=None, leave=False,
            )
        self._bar.update(done - self._last)
        self._last = done

    @property
    def callback(self) -> Callable[[int, int], None] | None:
        return self.update if self._on else None


# --- the grammar: inputs positional, the destination after -o/--output ---------------------------

def add_output(p: argparse.ArgumentParser, metavar: str, help_: str) -> None:
    """``-o/--output``, the one way every writing command is told where to write."""
    p.add_argument("-o", "--output", metavar=metavar, default=None, help=help_)


def add_operation_options(p: argparse.ArgumentParser, align_help: str) -> None:
    """The options of every command that writes from inputs (merge, reshard, convert)."""
    p.add_argument("--consume", action="store_true",
                   help="move the inputs' bytes into the output(s); inputs the save could "
                   "consume are deleted, the others (read-only, symlinked, ...) are kept")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="print what would be moved, cloned or copied (and why); write nothing")
    p.add_argument("--align", type=power_of_two, default=None, help=align_help)
    add_window_option(p)
    add_common(p)


def add_window_option(p: argparse.ArgumentParser) -> None:
    """``--window``: the consume sync window, left at the library's default unless given (one
    option for every command, so each refuses the same sizes)."""
    p.add_argument("--window", type=parse_window, default=DEFAULT_WINDOW,
                   help="consume sync window [about 1/36 of the bytes moved, from 16MiB "
                   f"to {CAP >> 20}MiB; shrunk to fit the free space]")


def _shell_word(token: str) -> str:
    """``token`` quoted for a POSIX shell; a name that is not UTF-8 (surrogate escapes) as
    bash's ``$'...'`` with its raw bytes as ``\\xNN``, so that pasting it gives the same bytes."""
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(token)
        return "$'" + "".join(
            chr(b) if 32 <= b < 127 and b not in b"'\\" else f"\\x{b:02x}" for b in raw) + "'"
    return shlex.quote(token)


def command_line(argv: list[str]) -> str:
    """How a user would type ``argv`` (quoted for a POSIX shell)."""
    return " ".join(_shell_word(t) for t in ["filecord", *argv])


def require_output(args: argparse.Namespace, positionals: list[str], *, old_first: bool,
                   placeholder: str) -> str:
    """The destination given with ``-o``.  Without one, the command line is most likely in an
    old form (``merge OUT IN...`` put the output first, ``convert IN OUT`` and ``reshard IN...
    OUTDIR`` last): refused with exit 2 and the same command line in the new form spelled out,
    so the user can copy it.  Nothing was read or written."""
    output: str | None = args.output
    if output is not None:
        return output
    argv: list[str] = list(getattr(args, "argv", None) or [args.command, *positionals])
    if len(positionals) < 2:
        raise UsageError("the output is given with -o/--output, as in: "
                         f"{command_line(argv)} -o {placeholder}")
    dest = positionals[0] if old_first else positionals[-1]
    spots = [i for i, token in enumerate(argv) if i > 0 and token == dest]
    if spots:
        del argv[spots[0] if old_first else spots[-1]]
    where = "first" if old_first else "last"
    raise UsageError(f"the output is no longer the {where} argument but follows -o/--output; "
                     f"this command line is now written:\n  {command_line([*argv, '-o', dest])}")


@contextlib.contextmanager
def output_directory(directory: str, *, dry_run: bool) -> Iterator[None]:
    """Create ``directory`` and its missing parents, durably (:func:`make_directories`).  If
    the command fails, the directories it created are removed again when they are still
    empty, so a refused command leaves no trace.

    A dry run plans exactly what the real run does but touches nothing: it is refused where
    the real run's ``mkdir`` would be (with the error that ``mkdir`` gives), and otherwise
    plans the missing directories as created (:func:`planned_directories`: empty, with their
    nearest existing ancestor's file system, free space and permissions)."""
    if dry_run:
        missing = missing_directories(directory) if directory else []
        if missing:
            _refuse_as_mkdir(os.path.dirname(missing[-1]), missing[-1])
        with planned_directories(missing):
            yield
        return
    made = make_directories(directory) if directory else []
    try:
        yield
    except BaseException:
        remove_empty(made)
        raise


def _refuse_as_mkdir(parent: str, first: str) -> None:
    """Raise what ``mkdir(first)`` would in ``parent`` (which exists as a name), if anything:
    a dry run asks instead of trying."""
    def refused(code: int) -> OSError:
        return OSError(code, os.strerror(code), first)

    try:
        st = _sys.stat(parent)
    except OSError as exc:  # a dangling symlink, a loop
        raise refused(exc.errno or errno.ENOENT) from None
    if not stat_mod.S_ISDIR(st.st_mode):
        raise refused(errno.ENOTDIR)
    if _sys.statvfs(parent).f_flag & os.ST_RDONLY:  # before access(), which fails there too
        raise refused(errno.EROFS)
    if not _sys.access(parent, os.W_OK | os.X_OK):
        raise refused(errno.EACCES)


# --- a save's report -----------------------------------------------------------------------------

def render_report(report: SaveReport, args: argparse.Namespace, out: TextIO) -> None:
    """A save's or a plan's report as every saving command prints it (``--json``: the report's
    dictionary; ``-q``: nothing after a real save)."""
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
        return
    if args.quiet and not report.dry_run:
        return
    print(report.summary(), file=out)
    for a in report.file_actions():
        why = f" ({a.reason})" if a.reason else ""
        if a.tail:
            why += f" (last {a.tail} bytes copied: {a.tail_reason})"
        if a.action == "adopted":
            why += " (in place: no byte copied)"
        print(f"  {a.action:7} {human(a.length):>12}  {a.source}{why}", file=out)
    for peak in report.peaks:
        verdict = "fits" if peak.fits else "DOES NOT FIT"
        print(f"  {peak.fs_type}: needs {human(peak.needed)} at its peak, {human(peak.free)} "
              f"free: {verdict}", file=out)


def finish(report: SaveReport, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Render the report; the exit status: 0 for a save (it committed, or it would have
    raised) and for a dry run that fits, 1 for a dry run that does not fit."""
    with reported(report):
        render_report(report, args, sys.stdout if out is None else out)
    return EXIT_OK if not report.dry_run or all(p.fits for p in report.peaks) else EXIT_FAIL


@contextlib.contextmanager
def reported(report: SaveReport) -> Iterator[None]:
    """Around the printing of a save's report: a reader of stdout that went away (EPIPE)
    after the commit changes nothing (the exit status of a committed save is 0, whatever
    happens after the commit); stdout is dropped so that no later write fails.  A dry run's
    plan is its whole output: its loss ends the command as a filter's would."""
    try:
        yield
    except BrokenPipeError:
        drop_stdout()
        if report.dry_run:
            raise


def drop_stdout() -> None:
    """Point stdout at /dev/null so that no later write, nor the interpreter's last flush,
    fails again."""
    try:
        devnull = _sys.open(os.devnull, os.O_WRONLY)
        _sys.dup2(devnull, sys.stdout.fileno())
        _sys.close(devnull)
    except (OSError, ValueError):  # no real stdout to replace: nothing will be flushed to it
        pass


def about(path: str, exc: BaseException) -> str:
    """``exc`` as one line about ``path``: a format error that names its own file (a shard an
    index names, say) is shown as it is, anything else after ``path``."""
    if isinstance(exc, FormatError) and exc.path is not None:
        return str(exc)
    return f"{path}: {exc}"


# --- inputs --------------------------------------------------------------------------------------

def not_regular(path: str) -> str | None:
    """Why ``path`` cannot be read as a file (a FIFO would block, a device never ends)."""
    try:
        st = _sys.stat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat_mod.S_ISDIR(st.st_mode):
        return "a directory, not a file"
    if not stat_mod.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, socket or device is not read)"
    return None


_GGUF_SHARD = re.compile(r"(.*)-(\d{5})-of-(\d{5})\.gguf")


def set_members(path: str) -> list[str]:
    """The other files an input stands for: the shards a safetensors index names, or the
    shards of a GGUF split set given by its first.  Checked before any reader opens them (a
    FIFO among them would block the reader forever); a name the index cannot hold, or a
    member that is missing, is left to the reader, which says so in its own words."""
    if path.endswith(".json"):
        try:
            index = json.loads(_sys.read_text(path, limit=64 << 20))
        except (OSError, ValueError):
            return []
        names = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(names, dict):
            return []
        directory = os.path.dirname(path)
        return [os.path.join(directory, n) for n in dict.fromkeys(names.values())
                if isinstance(n, str) and n and "/" not in n and "\0" not in n]
    m = _GGUF_SHARD.fullmatch(os.path.basename(path))
    if m is None or int(m.group(2)) != 1:
        return []
    directory = os.path.dirname(path)
    count = int(m.group(3))
    return [os.path.join(directory, f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf")
            for i in range(2, count + 1)]


def odd_member(path: str) -> str | None:
    """Why a file of the set ``path`` stands for cannot be read (a FIFO, a device, a
    directory), or None."""
    for member in set_members(path):
        if _sys.lexists(member):
            why = not_regular(member)
            if why is not None:
                return f"{member}, named by {path}: {why}"
    return None


# --- ExecuTorch: the data files beside a program (inspect and verify) ----------------------------

DEFAULT_DATA = "_default_external_constant.ptd"  # where external_constants=True data goes


def data_beside(pte: str) -> list[str]:
    """The data files ExecuTorch writes beside a program that are there: ``<stem>.ptd`` and
    ``_default_external_constant.ptd`` (regular files only: a FIFO is never opened)."""
    directory = os.path.dirname(pte)
    stem = os.path.splitext(os.path.basename(pte))[0]
    found: list[str] = []
    for name in dict.fromkeys((f"{stem}.ptd", DEFAULT_DATA)):
        path = os.path.join(directory, name)
        try:
            if stat_mod.S_ISREG(_sys.stat(path).st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def note_consume(exc: BaseException, op: Operation, args: argparse.Namespace) -> None:
    """On a save refused for lack of space without ``--consume``: say whether ``--consume``
    would fit, from ``op`` run again with it as a dry run (nothing is written or moved)."""
    alt = copy.copy(args)
    alt.consume, alt.dry_run, alt.quiet = True, True, True
    try:
        report = op(alt)
    except (OSError, ValueError):  # the note is a hint: without it the refusal still stands
        return
    if report.peaks and all(p.fits for p in report.peaks):
        needs = ", ".join(f"{human(p.needed)} on {p.fs_type} ({human(p.free)} free)"
                          for p in report.peaks)
        add_note(exc, f"--consume would fit: it needs {needs} at its peak, moving the inputs' "
                      "bytes into the output instead of copying them (the inputs are deleted)")
