"""``filecord verify FILE [--load] [--json]``: check a file of any format filecord reads.

A program, ``verify PROGRAM.pte [--data FILE.ptd]... [--no-runtime]``: every segment in
bounds, every external tensor's key present with a matching layout, then a load in the
ExecuTorch runtime when that is installed (``--load`` asks for what is the default here).
A ``.safetensors`` file, a safetensors index, a ``.gguf`` file (a split set from its first
shard) or a ``.ptd``: read with filecord's reader, every byte of every file accounted for as
header, tensor or zero padding, the dtypes counted; ``--load`` also loads it with the client
its users load it with (the ``safetensors`` package; gguf-py and llama.cpp), which must find
the same tensors at the same bytes.  Exit 0 when everything checks, 1 otherwise (a client
that is not installed is a note, not a failure), 2 for a usage error.

Without ``--data`` the data files ExecuTorch writes beside a program (``<stem>.ptd``,
``_default_external_constant.ptd``) are used when they are there, and the output says so.
Rendering only; the facts come from :func:`filecord.executorch.verify`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from filecord._io import syscalls as _sys
from filecord.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    about,
    data_beside,
    not_regular,
    odd_member,
)
from filecord.errors import FormatError


def build(v: argparse.ArgumentParser) -> None:
    v.add_argument("pte", metavar="FILE",
                   help="a program (.pte), a .ptd, a .safetensors file, a safetensors index "
                   "(.json), or a .gguf file (a split set's first shard stands for the set); "
                   "the format is found from its first bytes, else from its suffix")
    v.add_argument(
        "--data", action="append", default=[], metavar="FILE.ptd",
        help="a data file of the program (repeat for several) [the .ptd files ExecuTorch "
        "writes beside it: <stem>.ptd, _default_external_constant.ptd]",
    )
    v.add_argument("--no-runtime", action="store_true",
                   help=".pte: structural checks only (no load in the ExecuTorch runtime)")
    v.add_argument("--load", action="store_true",
                   help="also load the file with its real client where installed: the "
                   "safetensors package, gguf-py and llama.cpp (a .pte is loaded in the "
                   "ExecuTorch runtime unless --no-runtime)")
    v.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    v.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")


def run(args: argparse.Namespace) -> int:
    from filecord._formats import by_suffix, sniff

    if _sys.isdir(args.pte):
        args.pte = _checkpoint_in(args.pte)
    regular = not_regular(args.pte) is None
    fmt = sniff(args.pte) if regular else None
    suffix_chose = False
    if fmt is None and regular and not args.data:  # --data: a program, whatever its bytes
        # damaged first bytes: the suffix says what it should be
        fmt = by_suffix(args.pte)
        suffix_chose = fmt is not None
        if fmt is None:
            print(f"filecord verify: {args.pte}: its first bytes match no format filecord "
                  "reads (.pte, .ptd, .safetensors, a safetensors index .json, .gguf) and "
                  "its name ends in none of those suffixes", file=sys.stderr)
            return EXIT_FAIL
    if fmt is not None and fmt.name != "executorch-pte":
        # --no-runtime asks for less than these formats do anyway (their runtime is --load),
        # so scripts that pass it to every file keep working; --data would be silently ignored
        if args.data:
            raise UsageError("--data applies to a program (.pte) only")
        return _run_file(args, fmt.name, suffix_chose=suffix_chose)
    return _run_pte(args)


def _checkpoint_in(directory: str) -> str:
    """A folder stands for the checkpoint in it (a Hugging Face folder, a consolidated one)."""
    from filecord.safetensors._read import checkpoint_in

    found = checkpoint_in(directory)
    single = os.path.join(directory, "model.safetensors")
    if found is not None and found != single and _sys.lexists(single):
        raise UsageError(
            f"{directory}: holds both model.safetensors.index.json and model.safetensors "
            "(transformers' from_pretrained loads model.safetensors); give the file to verify")
    if found is not None:
        return found
    raise UsageError(f"{directory}: a directory without model.safetensors.index.json or "
                     "model.safetensors; give the file to verify")


def _run_file(args: argparse.Namespace, format_name: str, *, suffix_chose: bool) -> int:
    from filecord._verify import Kind, LoadStatus, check

    odd = odd_member(args.pte)
    if odd is not None:
        print(f"filecord verify: {odd}", file=sys.stderr)
        return EXIT_FAIL
    try:
        got = check(args.pte, load=args.load, format_name=format_name)
    except (FormatError, OSError) as exc:
        why = (f" (read as {format_name} because of its suffix: its first bytes match no "
               "format)" if suffix_chose else "")
        print(f"filecord verify: {about(args.pte, exc)}{why}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps({
            "ok": got.ok, "format": got.format, "path": got.path,
            "files": [{
                "path": f.path, "size": f.size,
                "bytes": {k.value: f.bytes_of(k) for k in Kind},
                "regions": [{"start": r.start, "end": r.end, "kind": r.kind.value,
                             "name": r.name} for r in f.regions],
                "problems": list(f.problems),
            } for f in got.files],
            "dtypes": got.dtypes,
            "loads": [{"client": x.client, "status": x.status.value, "note": x.note}
                      for x in got.loads],
        }, indent=2, ensure_ascii=False))
        return EXIT_OK if got.ok else EXIT_FAIL
    for p in got.problems:
        print(f"filecord verify: {p}", file=sys.stderr)
    for x in got.loads:
        if x.status is LoadStatus.FAILED:
            print(f"filecord verify: {got.path}: {x.client} failed to load it: {x.note}",
                  file=sys.stderr)
    if got.problems:
        return EXIT_FAIL
    dtypes = ", ".join(f"{n} {k}" for k, n in sorted(got.dtypes.items()))
    print(f"ok: {got.path}: {got.format}, {len(got.files)} file(s), {got.tensors} tensors "
          f"({dtypes or 'none'}); every byte accounted for:")
    for f in got.files:
        print(f"  {f.path}: {f.size} bytes = {f.bytes_of(Kind.HEADER)} header + "
              f"{f.bytes_of(Kind.TENSOR)} tensor + {f.bytes_of(Kind.PADDING)} zero padding")
    for x in got.loads:
        if x.status is LoadStatus.LOADED:
            print(f"ok: {x.note}")
        elif x.status is LoadStatus.SKIPPED:
            print(f"note: not loaded in {x.client}: {x.note}")
    if not args.load:
        print("NOT loaded by a client: give --load to load it as its users do")
    return EXIT_OK if got.ok else EXIT_FAIL


def _run_pte(args: argparse.Namespace) -> int:
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
        print(f"filecord verify: {about(args.pte, exc)}", file=sys.stderr)
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
