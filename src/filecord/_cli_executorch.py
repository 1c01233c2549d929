"""``filecord inspect PATH [--json]``: show where every byte of a ``.pte`` or ``.ptd`` lies.
``filecord verify PROGRAM.pte [--data FILE.ptd] [--json]``: check a program and its data.

Rendering only; the facts come from :func:`read_pte` / :func:`read_ptd` and
:func:`filecord.executorch.verify.verify`.  The format is chosen
by the flatbuffer identifier at bytes 4..8 (``ET12`` or ``FT01``), not by the file name.
"""

from __future__ import annotations

import argparse
import json
import os
import stat as stat_mod
import sys
from typing import Any

from filecord import _cli_safetensors, _sys
from filecord.errors import FormatError
from filecord.executorch import PtdFile, PteFile, read_ptd, read_pte


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "inspect",
        help="show the layout of an ExecuTorch .pte/.ptd or a safetensors file or index",
        description="Show header, segments (absolute offsets and sizes), constant segment, "
        "named data and delegates of an ExecuTorch program (.pte) or data file (.ptd).",
    )
    p.add_argument("path", help="a .pte, .ptd, .safetensors or *.index.json file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail")
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


def describe_pte(f: PteFile) -> dict[str, Any]:
    h = f.header
    return {
        "format": "pte",
        "path": f.path,
        "file_size": f.file_size,
        "header": None
        if h is None
        else {
            "length": h.length,
            "padded_length": h.padded_length,
            "program_size": h.program_size,
            "segment_base_offset": h.segment_base_offset,
            "segment_data_size": h.segment_data_size,
        },
        "segments": [
            {"index": s.index, "offset": s.offset, "size": s.size, "file_offset": s.file_offset}
            for s in f.segments
        ],
        "constant_segment": None
        if f.constant_segment is None
        else {"segment_index": f.constant_segment[0], "offsets": list(f.constant_segment[1])},
        "mutable_data_segments": [
            {"segment_index": i, "offsets": list(offs)} for i, offs in f.mutable_data_segments
        ],
        "named_data": [{"key": k, "segment_index": i} for k, i in f.named_data.items()],
        "delegates": [
            {
                "plan": d.plan,
                "index": d.position,
                "id": d.id,
                "location": d.location,
                "data_index": d.index,
                "size": d.size,
                "file_offset": f.segments[d.index].file_offset if d.location == "SEGMENT" else None,
            }
            for d in f.delegates
        ],
    }


def describe_ptd(f: PtdFile) -> dict[str, Any]:
    h = f.header
    return {
        "format": "ptd",
        "path": f.path,
        "file_size": f.file_size,
        "version": f.version,
        "header": {
            "length": h.length,
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "segment_base_offset": h.segment_base_offset,
            "segment_data_size": h.segment_data_size,
        },
        "segments": [
            {"index": s.index, "offset": s.offset, "size": s.size, "file_offset": s.file_offset}
            for s in f.segments
        ],
        "entries": [
            {
                "key": e.key,
                "segment_index": e.segment_index,
                "size": e.size,
                "layout": None
                if e.layout is None
                else {
                    "scalar_type": e.layout.scalar_type.name,
                    "sizes": list(e.layout.sizes),
                    "dim_order": list(e.layout.dim_order),
                },
            }
            for e in f.entries.values()
        ],
    }


def _render(info: dict[str, Any]) -> list[str]:
    lines = [f"{info['format']} file {info['path']} ({info['file_size']} bytes)"]
    h = info["header"]
    if h is None:
        lines.append("  header: none (the file is the program flatbuffer)")
    else:
        lines.append("  header: " + ", ".join(f"{k} {v}" for k, v in h.items()))
    if "version" in info:
        lines.append(f"  version: {info['version']}")
    lines.append(f"  segments: {len(info['segments'])}")
    for s in info["segments"]:
        end = s["file_offset"] + s["size"]
        lines.append(
            f"    [{s['index']}] bytes {s['file_offset']}..{end} ({s['size']} bytes, "
            f"+{s['offset']} from the base)"
        )
    if info["format"] == "pte":
        c = info["constant_segment"]
        lines.append(
            "  constant segment: none"
            if c is None
            else f"  constant segment: segment {c['segment_index']}, offsets {c['offsets']}"
        )
        lines.extend(
            f"  mutable data: segment {m['segment_index']}, offsets {m['offsets']}"
            for m in info["mutable_data_segments"]
        )
        lines.append(f"  named data: {len(info['named_data'])}")
        lines.extend(f"    {n['key']} -> segment {n['segment_index']}" for n in info["named_data"])
        lines.append(f"  delegates: {len(info['delegates'])}")
        for d in info["delegates"]:
            where = "" if d["file_offset"] is None else f" at {d['file_offset']}"
            lines.append(
                f"    plan {d['plan']} delegate {d['index']} {d['id']}: {d['location']} "
                f"{d['data_index']} ({d['size']} bytes{where})"
            )
    else:
        lines.append(f"  entries: {len(info['entries'])}")
        for e in info["entries"]:
            lay = e["layout"]
            shape = (
                "" if lay is None else f", {lay['scalar_type']} {lay['sizes']} {lay['dim_order']}"
            )
            lines.append(
                f"    {e['key']} -> segment {e['segment_index']} ({e['size']} bytes{shape})"
            )
    return lines


def run_inspect(args: argparse.Namespace) -> int:
    path = os.fspath(args.path)
    why = _not_regular(path)
    if why is not None:
        print(f"filecord inspect: {path}: {why}", file=sys.stderr)
        return 1
    try:
        ident = _identifier(path)
        if _head(path)[:4] == b"GGUF":
            from filecord import _cli_gguf

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
    else:
        print("\n".join(_render(info)))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from filecord.executorch.verify import verify

    odd = [(p, why) for p in (args.pte, *args.data)
           if os.path.lexists(p) and (why := _not_regular(p)) is not None]
    for p, why in odd:
        print(f"filecord verify: {p}: {why}", file=sys.stderr)
    if odd:
        return 1
    result = verify(args.pte, args.data, runtime=not args.no_runtime)
    rt = result.runtime
    if args.json:
        print(json.dumps({
            "ok": result.ok,
            "pte": result.pte,
            "data": list(result.data),
            "external_tensors": result.external_tensors,
            "constant_tensors": result.constant_tensors,
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
          f"and {result.external_tensors} external tensors)")
    if rt.status == "loaded":
        print(f"ok: loaded in the ExecuTorch runtime: methods {', '.join(rt.methods)}")
    return 0
