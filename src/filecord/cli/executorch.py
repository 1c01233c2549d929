"""ExecuTorch in the command line: what ``filecord inspect`` shows for a ``.pte`` or ``.ptd``
(the facts as one JSON-ready dict, ``describe_pte``/``describe_ptd`` with ``summarize_pte``'s
summary, and the text drawn from it, ``render_pte_summary``/``render_ptd_summary`` and
``render_layout`` for ``-v``), the data files found beside a program, and ``merge`` of ``.ptd``
files.  The command table dispatches here; the work is in :mod:`filecord.executorch`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from filecord._plan.report import SaveReport
from filecord.cli.common import Bar, data_beside
from filecord.executorch import PtdFile, PteFile, TensorLayout, read_ptd, read_pte
from filecord.executorch._contents import contents

IDENTIFIERS = (b"ET12", b"FT01")  # a program's and a data file's flatbuffer identifier


def sniff(head: bytes) -> bool:
    """A .pte or .ptd, by its flatbuffer identifier at bytes 4..8 (not by its name)."""
    return head[4:8] in IDENTIFIERS


def describe(path: str, head: bytes) -> dict[str, Any]:
    """What ``inspect`` shows for a program (with the data files beside it and which of the
    keys it needs they hold) or a data file."""
    if head[4:8] == b"FT01":
        return describe_ptd(read_ptd(path))
    info = describe_pte(read_pte(path))
    needs = {n["key"] for n in info["summary"]["needs_from_data_files"]}
    beside = []
    for data in data_beside(path) if needs else []:
        try:
            keys = set(read_ptd(data).entries)
        except (ValueError, OSError) as exc:  # a damaged neighbour is shown, not fatal
            beside.append({"path": data, "error": str(exc), "holds": 0})
            continue
        beside.append({"path": data, "holds": len(needs & keys)})
        needs -= keys
    info["data_beside"] = beside
    info["missing_beside"] = sorted(needs) if beside else None
    return info


def render(info: dict[str, Any], *, verbose: int) -> list[str]:
    lines = render_pte_summary(info) if info["format"] == "pte" else render_ptd_summary(info)
    if verbose:
        lines += ["", "layout:", *render_layout(info)]
    else:
        lines.append("  (the full layout: -v)")
    return lines


def merge(args: argparse.Namespace) -> SaveReport:
    """``merge IN.ptd... -o OUT.ptd``: one data file holding every input's entries."""
    from filecord.executorch import merge as ptd_merge

    out: str = args.output
    with Bar(f"merge {os.path.basename(out)}", quiet=args.quiet or args.json) as bar:
        return ptd_merge(out, args.inputs, consume=args.consume, dry_run=args.dry_run,
                         segment_alignment=args.align or 128, window=args.window,
                         progress=bar.callback)


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


def render_pte_summary(info: dict[str, Any]) -> list[str]:
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
        for d in info.get("data_beside", []):
            what = f"unreadable: {d['error']}" if "error" in d else f"holds {d['holds']} of them"
            lines.append(f"    beside it: {d['path']}: {what}")
        missing = info.get("missing_beside")
        if missing is not None:
            lines.append("    the data files beside it hold every key it needs" if not missing
                         else f"    {len(missing)} keys are in none of the files beside it")
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


def render_ptd_summary(info: dict[str, Any]) -> list[str]:
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


def render_layout(info: dict[str, Any]) -> list[str]:
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
