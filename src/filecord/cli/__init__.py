"""The ``filecord`` command: builds the parser from the command table
(:data:`filecord.cli.table.COMMANDS`: each command's parser builder and handler) and runs the
handler; the command modules render, the work is in the library.

Every file name or key on the command line may be any bytes the OS allows (Python hands names
that are not UTF-8 over as surrogate escapes).  Nothing the user typed can end in a traceback:
text output escapes what it cannot encode (``\\udcff``), a usage mistake exits 2, a failure
exits 1 with one line and its notes, and an unexpected error exits 1 with one line (the
traceback is shown only with ``-vv``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from filecord import __version__
from filecord.cli.common import EXIT_FAIL as EXIT_FAIL
from filecord.cli.common import EXIT_OK as EXIT_OK
from filecord.cli.common import EXIT_PIPE, Terminated, UsageError, drop_stdout, sigterm_raises
from filecord.cli.common import EXIT_USAGE as EXIT_USAGE
from filecord.cli.common import human as human  # part of this module's API
from filecord.cli.common import parse_size as parse_size  # part of this module's API
from filecord.cli.table import COMMANDS
from filecord.errors import DataChangedError, FilecordError, SaveError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="filecord",
        description="Assemble large model artifacts from bytes and file-backed pieces: "
        "streaming, atomic, durable, and able to move data instead of copying it. Inputs are "
        "positional; every command that writes takes its destination with -o/--output.",
    )
    parser.add_argument("--version", action="version", version=f"filecord {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.summary,
                           description=command.full_description())
        command.build(p)
        p.set_defaults(func=command.run)
    return parser


def _safe_streams() -> None:
    """Text output never fails on a name that is not UTF-8: escape what cannot be encoded."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")



def _failed(exc: BaseException) -> int:
    """Exit 1: the message and its notes (where every byte is)."""
    print(f"filecord: error: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", []):
        print(f"  {note}", file=sys.stderr)
    return EXIT_FAIL


def main(argv: Sequence[str] | None = None) -> int:
    _safe_streams()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as typed: an old form is refused with its new spelling
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    verbose: int = getattr(args, "verbose", 0)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "quiet", False):
        # gguf-py (run by convert) warns about post-processor templates it parses crudely;
        # convert judges those itself and refuses what matters, so -q leaves its chatter out
        logging.getLogger("gguf").setLevel(logging.ERROR)
    try:
        with sigterm_raises():  # a save stopped by SIGTERM rolls back like one stopped by Ctrl-C
            result: int = args.func(args)
    except KeyboardInterrupt as exc:
        print("terminated" if isinstance(exc, Terminated) else "interrupted", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):  # what a stopped save undid, or left
            print(f"  {note}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:
        # Whoever read our output went away (`filecord plan ... | head`): stop quietly, with
        # the status of a filter killed by SIGPIPE.  A save that committed has already
        # returned 0 (its report is all that was lost); a save into a closed pipe is a
        # SaveError, reported below.
        drop_stdout()
        return EXIT_PIPE
    except UsageError as exc:
        print(f"filecord {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DataChangedError, SaveError) as exc:
        if not exc.committed:
            return _failed(exc)
        # Committed: the outputs are complete under their final names; only a consumed source
        # another process changed after the commit point was kept, or the clean-up after the
        # renames failed.  The save succeeded (exit 0, as README promises: what happens after
        # the commit never changes it); say what is left, as a warning.
        print(f"filecord: warning: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):
            print(f"  {note}", file=sys.stderr)
        return EXIT_OK
    except (FilecordError, OSError) as exc:
        return _failed(exc)
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
