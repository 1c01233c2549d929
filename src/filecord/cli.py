"""The ``filecord`` command: argument parsing and rendering only; the work is in the library."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence

from filecord import __version__
from filecord.errors import FilecordError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

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
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * _UNITS[unit])


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
    from filecord.errors import RecoverError
    from filecord.recover import Recovered, recover

    error: RecoverError | None = None
    try:
        done: list[Recovered] = recover(args.path)
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

    from filecord import _cli_demo, _cli_pack

    _cli_demo.register(sub, _add_common)
    _cli_pack.register(sub, _add_common)

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    level = logging.WARNING - 10 * min(getattr(args, "verbose", 0), 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (FilecordError, OSError) as exc:
        print(f"filecord: error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):
            print(f"  {note}", file=sys.stderr)
        return EXIT_FAIL
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
