"""``filecord inspect PATH [-v] [--json]``: what a ``.pte`` or ``.ptd`` holds and needs, then
(``-v``) where every byte lies; a safetensors file or index is shown as its layout.
``filecord verify PROGRAM.pte [--data FILE.ptd] [--json]``: check a program and its data.

Rendering only; the facts come from :func:`read_pte` / :func:`read_ptd` and
:func:`filecord.executorch.verify`, and what ``inspect`` shows of them is drawn by
``_cli_et_render`` (this module: the arguments, the file checks and the dispatch).  The format
is chosen by the flatbuffer identifier at bytes 4..8 (``ET12`` or ``FT01``), not by the file name.
"""

from __future__ import annotations

import argparse
import json
import os
import stat as stat_mod
import sys

from filecord._io import syscalls as _sys
from filecord.cli import safetensors as _cli_safetensors
from filecord.cli.common import Subparsers
from filecord.cli.et_render import (
    describe_ptd,
    describe_pte,
    render_layout,
    render_ptd_summary,
    render_pte_summary,
)
from filecord.errors import FormatError
from filecord.executorch import read_ptd, read_pte, verify


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="what an ExecuTorch .pte/.ptd holds and needs, or the layout of a safetensors "
        "file or index",
        description="A summary of an ExecuTorch program (.pte): methods with their inputs and "
        "outputs, operators, delegates, constant bytes inline and external, the named-data "
        "keys it needs from a data file, where the big bytes are; or of a data file (.ptd). "
        "-v adds the full layout: header, every segment, every key. A safetensors file or "
        "index is shown as its layout.",
    )
    p.add_argument("path", help="a .pte, .ptd, .safetensors or *.index.json file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="also the full layout (every segment, key and delegate); again: more log detail",
    )
    p.set_defaults(func=run_inspect)

    v = subparsers.add_parser(
        "verify",
        help="check an ExecuTorch program and its data files (and load it, if executorch is "
        "installed)",
        description="Structural checks of a .pte and its .ptd files (every segment in bounds, "
        "every external tensor's key present with a matching layout), then, when the "
        "executorch package is installed, a load of every method in its runtime. Exit 0 when "
        "everything checks, 1 otherwise.",
    )
    v.add_argument("pte", help="the program (.pte)")
    v.add_argument(
        "--data", action="append", default=[], metavar="FILE.ptd",
        help="a data file of the program (repeat for several)",
    )
    v.add_argument("--no-runtime", action="store_true", help="structural checks only")
    v.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    v.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
    v.set_defaults(func=run_verify)


def _head(path: str) -> bytes:
    fd = _sys.open(path, os.O_RDONLY)
    try:
        return _sys.pread(fd, 9, 0)
    finally:
        _sys.close(fd)


def _not_regular(path: str) -> str | None:
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


def _identifier(path: str) -> bytes:
    fd = _sys.open(path, os.O_RDONLY)
    try:
        return _sys.pread(fd, 8, 0)[4:8]
    finally:
        _sys.close(fd)


def run_inspect(args: argparse.Namespace) -> int:
    path = os.fspath(args.path)
    why = _not_regular(path)
    if why is not None:
        print(f"filecord inspect: {path}: {why}", file=sys.stderr)
        return 1
    try:
        ident = _identifier(path)
        if _head(path)[:4] == b"GGUF":
            from filecord.cli import gguf as _cli_gguf

            g = _cli_gguf.describe(path)
            print(json.dumps(g, indent=2, ensure_ascii=False) if args.json
                  else "\n".join(_cli_gguf.render(g)))
            return 0
        if ident == b"ET12":
            info = describe_pte(read_pte(path))
        elif ident == b"FT01":
            info = describe_ptd(read_ptd(path))
        elif _cli_safetensors.is_safetensors(path, _head(path)):
            st = _cli_safetensors.describe(path)
            print(json.dumps(st, indent=2) if args.json else "\n".join(_cli_safetensors.render(st)))
            return 0
        else:
            print(
                f"filecord inspect: {path}: not an ExecuTorch .pte or .ptd (identifier {ident!r})",
                file=sys.stderr,
            )
            return 1
    except (FormatError, OSError) as exc:
        print(f"filecord inspect: {path}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    lines = render_pte_summary(info) if info["format"] == "pte" else render_ptd_summary(info)
    if args.verbose:
        lines += ["", "layout:", *render_layout(info)]
    else:
        lines.append("  (the full layout: -v)")
    print("\n".join(lines))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    odd = [(p, why) for p in (args.pte, *args.data)
           if _sys.lexists(p) and (why := _not_regular(p)) is not None]
    for p, why in odd:
        print(f"filecord verify: {p}: {why}", file=sys.stderr)
    if odd:
        return 1
    try:
        result = verify(args.pte, args.data, runtime=not args.no_runtime)
    except (FormatError, OSError) as exc:  # verify reports problems; this is a last guard
        print(f"filecord verify: {args.pte}: {exc}", file=sys.stderr)
        return 1
    rt = result.runtime
    if args.json:
        print(json.dumps({
            "ok": result.ok,
            "pte": result.pte,
            "data": list(result.data),
            "external_tensors": result.external_tensors,
            "constant_tensors": result.constant_tensors,
            "needs": [
                {"key": n.key, "size": n.size, "needed_by": n.needed_by} for n in result.needs
            ],
            "missing": [n.key for n in result.missing],
            "unparsed_delegates": list(result.unparsed_delegates),
            "problems": [{"where": p.where, "message": p.message} for p in result.problems],
            "runtime": {"status": rt.status, "methods": list(rt.methods), "note": rt.note},
        }, indent=2))
        return 0 if result.ok else 1
    for p in result.problems:
        print(f"filecord verify: {p.where}: {p.message}", file=sys.stderr)
    if rt.status == "failed":
        print(f"filecord verify: {result.pte}: runtime load failed: {rt.note}", file=sys.stderr)
    elif rt.status == "skipped":
        print(f"note: {rt.note}")
    if not result.ok:
        return 1
    data = f" with {', '.join(result.data)}" if result.data else ""
    print(f"ok: {result.pte}{data}: structure checks passed ({result.constant_tensors} constant "
          f"and {result.external_tensors} external tensors, {len(result.needs)} named-data keys "
          f"needed and found)")
    if result.unparsed_delegates:
        print("note: the payloads of " + ", ".join(result.unparsed_delegates) + " were not "
              "read: keys they need are not checked")
    if rt.status == "loaded":
        print(f"ok: loaded in the ExecuTorch runtime: methods {', '.join(rt.methods)}")
    else:
        print("NOT loaded in the runtime: a structure pass does not show that the program runs")
    return 0
