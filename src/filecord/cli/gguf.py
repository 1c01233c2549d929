"""GGUF in ``filecord merge``, ``reshard``, ``convert`` and ``inspect``: rendering only; the work
is in :mod:`filecord.gguf`.  The command table dispatches here by suffix (``-o OUT.gguf``,
``IN.gguf``) or, for ``inspect``, by the ``GGUF`` magic.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import re
from typing import Any, TextIO

from filecord._plan.report import SaveReport
from filecord.cli.common import Bar, human, render_report

GGUF_TENSORS_DEFAULT = 128  # gguf-split's default when no limit is given
_SHARD = re.compile(r"-\d{5}-of-\d{5}$")


def sniff(head: bytes) -> bool:
    return head[:4] == b"GGUF"


def merge(args: argparse.Namespace) -> SaveReport:
    from filecord.gguf import merge as gguf_merge

    with Bar(f"merge {os.path.basename(args.output)}", quiet=args.quiet or args.json) as bar:
        return gguf_merge(args.output, args.inputs, consume=args.consume, dry_run=args.dry_run,
                          alignment=args.align, window=args.window, progress=bar.callback)


def output_base(args: argparse.Namespace) -> str:
    """``-o OUTDIR`` gives ``OUTDIR/<stem>.gguf``: the stem from ``--pattern`` when given, else
    the first input's name without ``.gguf`` and without a shard suffix."""
    if args.pattern is not None:
        name = str(args.pattern).format(suffix="")
    else:
        stem = os.path.basename(str(args.inputs[0])).removesuffix(".gguf")
        name = _SHARD.sub("", stem) + ".gguf"
    # The shards are named <stem>-0000i-of-0000N.gguf whatever the pattern ends in; the library
    # takes the set's base name with its .gguf (a pattern "x{suffix}.bin" gives x.bin-...).
    if not name.endswith(".gguf"):
        name += ".gguf"
    return os.path.join(str(args.output), name)


def reshard(args: argparse.Namespace) -> SaveReport:
    from filecord.gguf import reshard as gguf_reshard

    size = args.max_shard_size or 0
    tensors = args.max_tensors or (0 if size else GGUF_TENSORS_DEFAULT)
    with Bar("reshard", quiet=args.quiet or args.json) as bar:
        return gguf_reshard(output_base(args), args.inputs, max_tensors=tensors,
                            max_shard_size=size,
                            consume=args.consume, dry_run=args.dry_run, alignment=args.align,
                            window=args.window, progress=bar.callback)


def convert(args: argparse.Namespace) -> SaveReport:
    """``convert MODEL_DIR|INDEX.json|IN.safetensors -o OUT.gguf``: a Hugging Face checkpoint
    as llama.cpp loads it (see :func:`filecord.gguf.convert`)."""
    from filecord.gguf import convert as gguf_convert

    quiet = args.quiet or args.json
    name = os.path.basename(args.output)
    with Bar(f"cast {name}", quiet=quiet) as cast, Bar(f"convert {name}", quiet=quiet) as bar:
        return gguf_convert(args.output, args.inputs[0], outtype=args.outtype or "source",
                            consume=args.consume, max_tensors=args.max_tensors,
                            max_shard_size=args.max_shard_size, dry_run=args.dry_run,
                            alignment=args.align, window=args.window, progress=bar.callback,
                            cast_progress=cast.callback)


def render_grouped(report: SaveReport, args: argparse.Namespace, out: TextIO) -> None:
    """A report whose pieces are many (Q/K rows are one range each) as one line per source
    file and fate: the action, the bytes, how many ranges, and why."""
    if args.json or (args.quiet and not report.dry_run):
        render_report(report, args, out)
        return
    groups: dict[tuple[str, str, str], list[int]] = {}
    for a in report.file_actions():
        why = f" ({a.reason})" if a.reason else ""
        if a.tail:
            why += f" (last bytes of a range copied: {a.tail_reason})"
        g = groups.setdefault((a.action, str(a.source), why), [0, 0])
        g[0] += a.length
        g[1] += 1
    print(report.summary(), file=out)
    for (action, source, why), (n, count) in groups.items():
        ranges = f" [{count} ranges]" if count > 1 else ""
        print(f"  {action:7} {human(n):>12}  {source}{ranges}{why}", file=out)
    for peak in report.peaks:
        verdict = "fits" if peak.fits else "DOES NOT FIT"
        print(f"  {peak.fs_type}: needs {human(peak.needed)} at its peak, {human(peak.free)} "
              f"free: {verdict}", file=out)


def _summary(value: object, limit: int = 60) -> object:
    if isinstance(value, (tuple, array.array)):
        head = [_summary(v, 20) for v in value[:4]]
        return head if len(value) <= 4 else {"count": len(value), "first": head}
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "..."
    if isinstance(value, float) and value != value:
        return "nan"
    return value


def describe(path: str) -> dict[str, Any]:
    """What ``filecord inspect`` shows for a GGUF file or split set (from its first shard; a
    later shard is shown alone, with its own key-values)."""
    from filecord._pieces.data import FileBackedData
    from filecord.gguf import read_gguf
    from filecord.gguf._read import read_gguf_file

    one = read_gguf_file(path)
    split = one.split()
    shards = [one] if split is not None and split[0] != 0 else list(read_gguf(path).shards)
    kvs = one.kvs if split is not None and split[0] != 0 else {
        k: v for k, v in one.kvs.items() if not k.startswith("split.")}
    return {
        "format": "gguf", "path": one.path,
        "kvs": {k: {"type": kv.type.name if kv.sub_type is None
                    else f"ARRAY[{kv.sub_type.name}]", "value": _summary(kv.value)}
                for k, kv in kvs.items()},
        "files": [{
            "path": f.path, "file_size": f.file_size, "version": f.header.version,
            "alignment": f.alignment, "data_start": f.data_start, "split": f.split(),
            "tensors": [{
                "name": t.name, "type": t.type.name, "dims": list(t.dims),
                "shape": list(t.shape),
                "offset": t.data.offset if isinstance(t.data, FileBackedData) else None,
                "size": t.nbytes,
            } for t in f.tensors.values()],
        } for f in shards],
    }


def render(info: dict[str, Any]) -> list[str]:
    lines = [f"gguf {info['path']}", f"  key-values: {len(info['kvs'])}"]
    lines.extend(f"    {k}: {v['type']} {json.dumps(v['value'], ensure_ascii=False)}"
                 for k, v in info["kvs"].items())
    for f in info["files"]:
        split = "" if f["split"] is None else f", shard {f['split'][0] + 1} of {f['split'][1]}"
        lines.append(f"  file {f['path']} ({f['file_size']} bytes): v{f['version']}, alignment "
                     f"{f['alignment']}, data from {f['data_start']}{split}")
        lines.append(f"    tensors: {len(f['tensors'])}")
        lines.extend(f"      {t['name']}: {t['type']} ne={t['dims']} bytes {t['offset']}.."
                     f"{t['offset'] + t['size']} ({t['size']} bytes)" for t in f["tensors"])
    return lines
