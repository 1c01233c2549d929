"""``filecord inspect PATH [-v] [--json]``: what a ``.pte`` or ``.ptd`` holds and needs, then
(``-v``) where every byte lies; a safetensors file or index is shown as its layout.
``filecord verify PROGRAM.pte [--data FILE.ptd] [--json]``: check a program and its data.

Rendering only; the facts come from :func:`read_pte` / :func:`read_ptd` and
:func:`filecord.executorch.verify`.  The format is chosen
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
from filecord._cli_common import Subparsers
from filecord.errors import FormatError
from filecord.executorch import PtdFile, PteFile, TensorLayout, read_ptd, read_pte, verify
from filecord.executorch._contents import contents


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
        "named_data": [
            {"key": k, "segment_index": i, "size": f.segments[i].size}
            for k, i in f.named_data.items()
        ],
        "summary": summarize_pte(f),
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


_SHOWN = 8  # items of a long list shown in the summary


def _size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def summarize_pte(f: PteFile) -> dict[str, Any]:
    """The facts a person needs first: what runs, what it needs, where the bytes are."""
    found = contents(f)
    constant_bytes = 0
    if f.constant_segment is not None and f.constant_segment[0] < len(f.segments):
        constant_bytes = f.segments[f.constant_segment[0]].size
    in_program = f.named_data
    external = [n for n in found.needs if n.needed_by == "tensor" or n.key not in in_program]
    roles: dict[int, str] = {}
    if f.constant_segment is not None:
        roles[f.constant_segment[0]] = "constant tensors"
    for index, _offsets in f.mutable_data_segments:
        roles[index] = "mutable tensors' initial values"
    for d in f.delegates:
        if d.location == "SEGMENT":
            roles[d.index] = f"{d.id} delegate payload"
    for key, index in in_program.items():
        roles.setdefault(index, f"named data {key!r}")
    biggest = sorted(f.segments, key=lambda s: (-s.size, s.index))[:3]
    return {
        "methods": [
            {
                "name": m.name,
                "inputs": list(m.inputs),
                "outputs": list(m.outputs),
                "instructions": m.instructions,
                "operators": len(m.operators),
                "delegate_calls": m.delegate_calls,
            }
            for m in found.methods
        ],
        "operators": sorted({op for m in found.methods for op in m.operators}),
        "delegates": dict(found.delegates_by_backend),
        "delegate_payload_bytes": sum(d.size for d in f.delegates),
        "constant_tensors": sum(
            1 for t in found.tensors
            if t.external_key is None and t.constant_index > 0 and not t.planned
        ),
        "constant_bytes_inline": constant_bytes,
        "named_data_in_program": {
            "keys": len(in_program),
            "bytes": sum(f.segments[i].size for i in set(in_program.values())),
        },
        "external_tensors": sum(1 for t in found.tensors if t.external_key is not None),
        "needs_from_data_files": [
            {"key": n.key, "size": n.size, "needed_by": n.needed_by,
             "layout": None if n.layout is None else _layout_text(n.layout)}
            for n in external
        ],
        "needs_bytes": sum(n.size or 0 for n in external),
        "unparsed_delegates": list(found.unparsed_delegates),
        "program_bytes": f.header.program_size if f.header else f.file_size,
        "biggest_segments": [
            {"index": s.index, "size": s.size, "file_offset": s.file_offset,
             "holds": roles.get(s.index, "unreferenced")}
            for s in biggest if s.size
        ],
    }


def _layout_text(layout: TensorLayout) -> str:
    order = list(layout.dim_order)
    plain = order == sorted(order)
    shape = f"{layout.scalar_type.name}{list(layout.sizes)}"
    return shape if plain else f"{shape} dim_order {order}"


def _collapsed(lines: list[str], indent: str, noun: str) -> list[str]:
    if len(lines) <= _SHOWN:
        return lines
    more = f"{indent}... and {len(lines) - _SHOWN} more {noun} (-v or --json)"
    return [*lines[:_SHOWN], more]


def _render_pte_summary(info: dict[str, Any]) -> list[str]:
    s = info["summary"]
    lines = [f"program {info['path']} ({_size(info['file_size'])}, {info['file_size']} bytes)"]
    lines.append(f"  methods: {len(s['methods'])}")
    method_lines = [
        f"    {m['name']}({', '.join(m['inputs'])}) -> {', '.join(m['outputs']) or 'nothing'}: "
        f"{m['instructions']} instructions, {m['operators']} operators"
        + (f", {m['delegate_calls']} delegate calls" if m["delegate_calls"] else "")
        for m in s["methods"]
    ]
    lines += _collapsed(method_lines, "    ", "methods")
    ops = s["operators"]
    if ops:
        shown = ", ".join(ops[:_SHOWN]) + (f" and {len(ops) - _SHOWN} more" if len(ops) > _SHOWN
                                           else "")
        lines.append(f"  operators: {len(ops)} distinct: {shown}")
    if s["delegates"]:
        lines.append(
            "  delegates: "
            + ", ".join(f"{backend} x{n}" for backend, n in s["delegates"].items())
            + f" ({_size(s['delegate_payload_bytes'])} of payload)"
        )
    lines.append(
        f"  constants: {s['constant_tensors']} tensors in the program "
        f"({_size(s['constant_bytes_inline'])} constant segment), {s['external_tensors']} "
        f"external tensors"
    )
    nd = s["named_data_in_program"]
    if nd["keys"]:
        lines.append(f"  named data in the program: {nd['keys']} keys, {_size(nd['bytes'])}")
    needs = s["needs_from_data_files"]
    if needs:
        lines.append(
            f"  needs a data file (.ptd) holding {len(needs)} keys, {_size(s['needs_bytes'])}:"
        )
        lines += _collapsed(
            [
                f"    {n['key']}  {'?' if n['size'] is None else n['size']} bytes"
                + (f"  {n['layout']}" if n["layout"] else f"  ({n['needed_by']})")
                for n in needs
            ],
            "    ",
            "keys",
        )
        lines.append(
            "    (ExecuTorch writes tag T's data to T.ptd, _default_external_constant.ptd for "
            "external_constants=True; give it with --data to verify)"
        )
    else:
        lines.append("  needs no data file")
    if s["unparsed_delegates"]:
        lines.append(
            "  not read: the payloads of " + ", ".join(s["unparsed_delegates"])
            + " (keys they need from named data are not listed)"
        )
    lines.append(f"  program flatbuffer: {_size(s['program_bytes'])}")
    for b in s["biggest_segments"]:
        lines.append(
            f"  big: segment {b['index']}, {_size(b['size'])} at {b['file_offset']}: {b['holds']}"
        )
    return lines


def _render_ptd_summary(info: dict[str, Any]) -> list[str]:
    entries = info["entries"]
    total = sum(s["size"] for s in info["segments"])
    lines = [
        f"data file {info['path']} ({_size(info['file_size'])}, {info['file_size']} bytes)",
        f"  {len(entries)} keys in {len(info['segments'])} segments, {_size(total)} of data",
    ]
    biggest = sorted(entries, key=lambda e: -e["size"])
    lines += _collapsed(
        [
            f"    {e['key']}  {e['size']} bytes"
            + ("" if e["layout"] is None else
               f"  {e['layout']['scalar_type']}{e['layout']['sizes']}")
            for e in biggest
        ],
        "    ",
        "keys",
    )
    return lines


def _few(items: list[int]) -> str:
    """A list of offsets, collapsed past 8 (``--json`` has them all)."""
    if len(items) <= _SHOWN:
        return str(items)
    return f"{str(items[:_SHOWN])[:-1]}, ... {len(items)} in all]"


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
            else f"  constant segment: segment {c['segment_index']}, offsets {_few(c['offsets'])}"
        )
        lines.extend(
            f"  mutable data: segment {m['segment_index']}, offsets {_few(m['offsets'])}"
            for m in info["mutable_data_segments"]
        )
        lines.append(f"  named data: {len(info['named_data'])}")
        lines.extend(
            f"    {n['key']} -> segment {n['segment_index']} ({n['size']} bytes)"
            for n in info["named_data"]
        )
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
        return 0
    lines = _render_pte_summary(info) if info["format"] == "pte" else _render_ptd_summary(info)
    if args.verbose:
        lines += ["", "layout:", *_render(info)]
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
