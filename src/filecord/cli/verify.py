"""``filecord verify PROGRAM.pte [--data FILE.ptd]... [--no-runtime] [--json]``: check a program
and its data files (every segment in bounds, every external tensor's key present with a
matching layout), then load it in the ExecuTorch runtime when that is installed.

Without ``--data`` the data files ExecuTorch writes beside a program (``<stem>.ptd``,
``_default_external_constant.ptd``) are used when they are there, and the output says so.
Rendering only; the facts come from :func:`filecord.executorch.verify`.
"""

from __future__ import annotations

import argparse
import json
import sys

from filecord._io import syscalls as _sys
from filecord.cli.common import data_beside, not_regular
from filecord.errors import FormatError


def build(v: argparse.ArgumentParser) -> None:
    v.add_argument("pte", metavar="PROGRAM.pte", help="the program (.pte)")
    v.add_argument(
        "--data", action="append", default=[], metavar="FILE.ptd",
        help="a data file of the program (repeat for several) [the .ptd files ExecuTorch "
        "writes beside it: <stem>.ptd, _default_external_constant.ptd]",
    )
    v.add_argument("--no-runtime", action="store_true", help="structural checks only")
    v.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    v.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")


def run(args: argparse.Namespace) -> int:
    from filecord.executorch import verify

    found_beside = not args.data and not_regular(args.pte) is None
    data: list[str] = list(args.data) or (data_beside(args.pte) if found_beside else [])
    odd = [(p, why) for p in (args.pte, *data)
           if _sys.lexists(p) and (why := not_regular(p)) is not None]
    for p, why in odd:
        print(f"filecord verify: {p}: {why}", file=sys.stderr)
    if odd:
        return 1
    try:
        result = verify(args.pte, data, runtime=not args.no_runtime)
    except (FormatError, OSError) as exc:  # verify reports problems; this is a last guard
        print(f"filecord verify: {args.pte}: {exc}", file=sys.stderr)
        return 1
    rt = result.runtime
    if args.json:
        print(json.dumps({
            "ok": result.ok,
            "pte": result.pte,
            "data": list(result.data),
            "data_found_beside": data if not args.data else [],
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
    if data and not args.data:
        print(f"note: using {', '.join(data)}, found beside the program (give --data to choose)")
    for p in result.problems:
        print(f"filecord verify: {p.where}: {p.message}", file=sys.stderr)
    if rt.status == "failed":
        print(f"filecord verify: {result.pte}: runtime load failed: {rt.note}", file=sys.stderr)
    elif rt.status == "skipped":
        print(f"note: {rt.note}")
    if not result.ok:
        return 1
    with_data = f" with {', '.join(result.data)}" if result.data else ""
    print(f"ok: {result.pte}{with_data}: structure checks passed ({result.constant_tensors} "
          f"constant and {result.external_tensors} external tensors, {len(result.needs)} "
          "named-data keys needed and found)")
    if result.unparsed_delegates:
        print("note: the payloads of " + ", ".join(result.unparsed_delegates) + " were not "
              "read: keys they need are not checked")
    if rt.status == "loaded":
        print(f"ok: loaded in the ExecuTorch runtime: methods {', '.join(rt.methods)}")
    else:
        print("NOT loaded in the runtime: a structure pass does not show that the program runs")
    return 0
