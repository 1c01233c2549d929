"""The ``filecord`` command: argument parsing and rendering only; the work is in the library.

Every file name or key on the command line may be any bytes the OS allows (Python hands names
that are not UTF-8 over as surrogate escapes).  Nothing the user typed can end in a traceback:
text output escapes what it cannot encode (``\\udcff``), a usage mistake exits 2, a failure
exits 1 with one line and its notes, and an unexpected error exits 1 with one line (the
traceback is shown only with ``-vv``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from filecord import __version__
from filecord._cli_common import Terminated, UsageError, sigterm_raises
from filecord._cli_common import parse_size as parse_size  # part of this module's API
from filecord.errors import FilecordError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover - loop always returns


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or chatter")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")


_RECOVER_WORDS = {
    "finished": "completed the save: outputs in place, consumed sources removed",
    "restored": "rolled back: sources restored byte-exact, temps removed",
    "discarded": "removed the temps of a save that died before its journal",
    "skipped": "skipped",
    "refused": "refused",
}


def _cmd_recover(args: argparse.Namespace) -> int:
    from filecord._journal import NotAJournalError
    from filecord._recover import Recovered, recover
    from filecord.errors import RecoverError

    error: RecoverError | None = None
    try:
        done: list[Recovered] = recover(args.path)
    except NotAJournalError as exc:
        # A typo (`recover model.pte`): the file was not touched; say so as a usage error.
        raise UsageError(f"{exc}; give a journal or the directory of the save") from exc
    except RecoverError as exc:
        error, done = exc, list(getattr(exc, "results", []))
    if args.json:
        print(json.dumps([
            {"journal": r.journal, "action": r.action, "outputs": list(r.outputs),
             "sources": list(r.sources), "detail": r.detail, "notes": list(r.notes)}
            for r in done
        ], indent=2))
    elif not done and error is None:
        print(f"nothing to recover in {args.path}")
    else:
        for r in done:
            detail = f" ({r.detail})" if r.detail and r.action != "refused" else ""
            if r.action != "refused":
                print(f"{r.journal}: {_RECOVER_WORDS[r.action]}{detail}")
    if error is not None:
        raise error
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="filecord",
        description="Assemble large model artifacts from bytes and file-backed pieces: "
        "streaming, atomic, durable, and able to move data instead of copying it.",
    )
    parser.add_argument("--version", action="version", version=f"filecord {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from filecord import _cli_demo, _cli_pack, _cli_safetensors

    _cli_demo.register(sub, _add_common)
    _cli_pack.register(sub, _add_common)
    _cli_safetensors.register(sub, _add_common)

    rec = sub.add_parser(
        "recover",
        help="finish or undo an interrupted save from its journal",
        description="Finish (if it had committed) or roll back (if not) every interrupted save "
        "whose journal is at PATH or whose files are in the directory PATH. A save still "
        "running (its lock held) is skipped; a file that is not a journal, or a journal that "
        "cannot be proven, is refused and nothing is touched (exit 1). Safe to run again.",
    )
    rec.add_argument("path", nargs="?", default=".", help="a journal file or a directory [.]")
    _add_common(rec)
    rec.set_defaults(func=_cmd_recover)

    try:
        formats_cli = importlib.import_module("filecord._cli_executorch")
    except ModuleNotFoundError:  # pragma: no cover - present once the formats package is
        pass
    else:
        formats_cli.register(sub)
    return parser


def _safe_streams() -> None:
    """Text output never fails on a name that is not UTF-8: escape what cannot be encoded."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _drop_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout to replace: nothing will be flushed to it
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _safe_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    verbose: int = getattr(args, "verbose", 0)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with sigterm_raises():  # a save stopped by SIGTERM rolls back like one stopped by Ctrl-C
            result: int = args.func(args)
    except KeyboardInterrupt as exc:
        print("terminated" if isinstance(exc, Terminated) else "interrupted", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):  # what a stopped save undid, or left
            print(f"  {note}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:
        # Whoever read our output went away (`filecord plan ... | head`): stop quietly, like
        # any filter.  (A save into a closed pipe is a SaveError, reported below.)
        _drop_stdout()
        return EXIT_FAIL
    except UsageError as exc:
        print(f"filecord {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (FilecordError, OSError) as exc:
        print(f"filecord: error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):
            print(f"  {note}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        print(f"filecord {args.command}: internal error: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        if verbose >= 2:
            traceback.print_exc()
        else:
            print("  run again with -vv for the traceback, and please report it",
                  file=sys.stderr)
        return EXIT_FAIL
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
