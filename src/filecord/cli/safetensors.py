"""``filecord merge``, ``reshard`` and ``convert`` (and ``inspect`` for safetensors): rendering
only; the work is in :mod:`filecord.safetensors`, :mod:`filecord.executorch` and
:mod:`filecord.gguf`.

``merge OUT IN...`` dispatches on OUT's suffix: ``.safetensors`` merges safetensors files and
indexes, ``.ptd`` merges ExecuTorch data files, ``.gguf`` merges a GGUF split set (or files);
``reshard`` on ``.gguf`` inputs and ``convert`` to ``.gguf`` go to :mod:`filecord._cli_gguf`.
Every command takes ``--consume`` (move the inputs' bytes into the outputs; the inputs are
deleted), ``--dry-run`` (print the plan: per piece moved, cloned or copied, and why; write
nothing), ``--json`` and ``--quiet``; progress bars only on a terminal.  Exit 0 on success,
1 on failure (or a dry run that does not fit), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from filecord.cli.common import EXIT_USAGE, Subparsers, add_common, parse_size
from filecord.cli.pack import render_report
from filecord.cli.progress import Bar
from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._plan.window import DEFAULT_WINDOW


def _finish(report: SaveReport, args: argparse.Namespace) -> int:
    render_report(report, args, sys.stdout)
    return 0 if not report.dry_run or all(p.fits for p in report.peaks) else 1


def _usage(args: argparse.Namespace, message: str) -> int:
    print(f"filecord {args.command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _check_inputs(paths: list[str]) -> str | None:
    for p in paths:
        if not _sys.isfile(p):
            return f"{p}: no such file"
    return None


def cmd_merge(args: argparse.Namespace) -> int:
    bad = _check_inputs(args.inputs)
    if bad:
        return _usage(args, bad)
    out: str = args.out
    if out.endswith(".gguf"):
        from filecord.cli import gguf as _cli_gguf

        return _finish(_cli_gguf.merge(args), args)
    with Bar(f"merge {os.path.basename(out)}", quiet=args.quiet or args.json) as bar:
        if out.endswith(".safetensors"):
            from filecord.safetensors import merge

            report = merge(out, args.inputs, consume=args.consume, dry_run=args.dry_run,
                           alignment=args.align or 8, window=args.window,
                           progress=bar.callback)
        elif out.endswith(".ptd"):
            from filecord.executorch import merge as merge_ptd

            report = merge_ptd(out, args.inputs, consume=args.consume, dry_run=args.dry_run,
                               segment_alignment=args.align or 128, window=args.window,
                               progress=bar.callback)
        else:
            return _usage(args, f"{out}: the output must end in .safetensors, .ptd or .gguf")
    return _finish(report, args)


def cmd_reshard(args: argparse.Namespace) -> int:
    from filecord.safetensors import reshard

    bad = _check_inputs(args.inputs)
    if bad:
        return _usage(args, bad)
    if not _sys.isdir(args.outdir):
        return _usage(args, f"{args.outdir}: not a directory")
    if args.pattern is not None and "{suffix}" not in args.pattern:
        return _usage(args, f"--pattern must contain {{suffix}}: {args.pattern!r}")
    if all(p.endswith(".gguf") for p in args.inputs):
        from filecord.cli import gguf as _cli_gguf

        return _finish(_cli_gguf.reshard(args), args)
    if args.max_tensors is not None:
        return _usage(args, "--max-tensors applies to GGUF inputs only")
    with Bar("reshard", quiet=args.quiet or args.json) as bar:
        report = reshard(args.outdir, args.inputs,
                         max_shard_size=args.max_shard_size or 5 * 10**9,
                         filename_pattern=args.pattern or "model{suffix}.safetensors",
                         consume=args.consume,
                         dry_run=args.dry_run, alignment=args.align or 8, window=args.window,
                         progress=bar.callback)
    return _finish(report, args)


def cmd_convert(args: argparse.Namespace) -> int:
    from filecord.safetensors import convert

    if args.output is None or (args.output_opt is not None and args.output != args.output_opt):
        if args.output is not None:
            return _usage(args, "give the output once: OUT or -o OUT")
        args.output = args.output_opt
    if args.output is None:
        return _usage(args, "no output: filecord convert IN -o OUT")
    if args.output.endswith(".gguf"):
        if args.input.endswith((".ptd", ".gguf")):
            return _usage(args, "convert to .gguf takes a Hugging Face model directory, its "
                          "model.safetensors.index.json or a .safetensors file")
        if not (_sys.isdir(args.input) or _sys.isfile(args.input)):
            return _usage(args, f"{args.input}: no such file or directory")
        from filecord.cli import gguf as _cli_gguf

        report = _cli_gguf.convert(args)
        _cli_gguf.render_grouped(report, args, sys.stdout)
        return 0 if not report.dry_run or all(p.fits for p in report.peaks) else 1
    bad = _check_inputs([args.input])
    if bad:
        return _usage(args, bad)
    if args.outtype is not None or args.max_tensors or args.max_shard_size:
        return _usage(args, "--outtype, --split-max-tensors and --split-max-size apply to "
                      "conversions to .gguf only")
    to_ptd = args.output.endswith(".ptd")
    if not (to_ptd or (args.input.endswith(".ptd") and args.output.endswith(".safetensors"))):
        return _usage(args, "convert .safetensors (or an index .json) to .ptd, or .ptd to "
                      ".safetensors")
    align = args.align or (16 if to_ptd else 8)
    with Bar(f"convert {os.path.basename(args.output)}", quiet=args.quiet or args.json) as bar:
        report = convert(args.output, args.input, consume=args.consume, dry_run=args.dry_run,
                         alignment=align, window=args.window, progress=bar.callback)
    return _finish(report, args)


# --- inspect -------------------------------------------------------------------------------

def describe(path: str) -> dict[str, Any]:
    """What ``filecord inspect`` shows for a safetensors file or index."""
    from filecord.safetensors import SafetensorsFile, read_safetensors

    got = read_safetensors(path)
    files = [got] if isinstance(got, SafetensorsFile) else list(got.shards)
    info: dict[str, Any] = {"format": "safetensors", "path": got.path}
    if not isinstance(got, SafetensorsFile):
        info.update(format="safetensors-index", metadata=dict(got.metadata))
    info["files"] = [{
        "path": f.path, "file_size": f.file_size, "header_size": f.header.size,
        "data_start": f.data_start,
        "metadata": None if f.metadata is None else dict(f.metadata),
        "tensors": [{
            "name": t.name, "dtype": t.dtype.value, "shape": list(t.shape),
            "offset": t.data.offset if isinstance(t.data, FileBackedData) else None,
            "size": t.nbytes,
        } for t in f.tensors.values()],
    } for f in files]
    return info


def render(info: dict[str, Any]) -> list[str]:
    lines = [f"{info['format']} {info['path']}"]
    if "metadata" in info:
        lines.append(f"  index metadata: {json.dumps(info['metadata'])}")
    for f in info["files"]:
        lines.append(f"  file {f['path']} ({f['file_size']} bytes): header {f['header_size']} "
                     f"bytes, data from {f['data_start']}")
        lines.append(f"    metadata: {json.dumps(f['metadata'])}")
        lines.append(f"    tensors: {len(f['tensors'])}")
        lines.extend(
            f"      {t['name']}: {t['dtype']} {t['shape']} bytes {t['offset']}.."
            f"{t['offset'] + t['size']} ({t['size']} bytes)" for t in f["tensors"])
    return lines


def is_safetensors(path: str, head: bytes) -> bool:
    """By name (``.safetensors``, ``.json``) or by content (a header length, then ``{``)."""
    if path.endswith((".safetensors", ".index.json")):
        return True
    return len(head) >= 9 and head[8:9] == b"{"


def register(subparsers: Subparsers) -> None:
    def common(p: argparse.ArgumentParser, align_help: str) -> None:
        p.add_argument("--consume", action="store_true",
                       help="move the inputs' bytes into the output(s); the inputs are deleted")
        p.add_argument("-n", "--dry-run", action="store_true",
                       help="print what would be moved, cloned or copied (and why); write "
                       "nothing")
        p.add_argument("--align", type=int, default=None, help=align_help)
        p.add_argument("--window", type=parse_size, default=DEFAULT_WINDOW,
                       help=f"consume sync window [{DEFAULT_WINDOW >> 20}MiB]")
        add_common(p)

    m = subparsers.add_parser(
        "merge", help="merge safetensors files/indexes into one .safetensors, or .ptd files "
        "into one .ptd, or a GGUF split set into one .gguf",
        description="Merge checkpoints without loading them. OUT.gguf: IN is the first shard "
        "of a split set (or several .gguf files); the output is what gguf-py's GGUFWriter "
        "would write for the same key-values and tensors. OUT.safetensors: "
        "inputs are .safetensors files or *.index.json (the output is what safetensors' "
        "save_file would write for the same tensors). OUT.ptd: inputs are .ptd files.")
    m.add_argument("out", metavar="OUT", help="OUT.safetensors, OUT.ptd or OUT.gguf")
    m.add_argument("inputs", nargs="+", metavar="IN", help="files (or index .json) to merge")
    common(m, "safetensors: data-start alignment [8; 4096 lets later saves clone]; .ptd: "
           "segment alignment [128]; .gguf: general.alignment [the input's]")
    m.set_defaults(func=cmd_merge)

    r = subparsers.add_parser(
        "reshard", help="split or reshard safetensors (shards and an index) or GGUF (gguf-split "
        "shards)",
        description="Write IN... (files or *.index.json) as shards of at most "
        "--max-shard-size plus model.safetensors.index.json, as huggingface_hub would, in one "
        "transaction. One input file and a small size split it. GGUF inputs: shards "
        "OUTDIR/<stem>-00001-of-0000N.gguf split as gguf-py splits (--max-tensors, "
        "--max-shard-size), the split.* keys added, all in one transaction.")
    r.add_argument("inputs", nargs="+", metavar="IN", help="files or index .json")
    r.add_argument("outdir", metavar="OUTDIR", help="directory for the shards and index")
    r.add_argument("--max-shard-size", type=parse_size, default=None,
                   help="largest shard [5GB; GGUF: tensor bytes, no limit unless given]")
    r.add_argument("--max-tensors", type=int, default=None,
                   help="GGUF: most tensors per shard [128 when no size is given, as "
                   "gguf-split]")
    r.add_argument("--pattern", default=None,
                   help="shard file name pattern [model{suffix}.safetensors; GGUF: the "
                   "input's stem, shards <stem>-00001-of-0000N.gguf]")
    common(r, "data-start alignment of each shard [8]")
    r.set_defaults(func=cmd_reshard)

    c = subparsers.add_parser(
        "convert", help="convert a Hugging Face Llama/Mistral checkpoint to GGUF, safetensors "
        "to ExecuTorch .ptd, and .ptd back to safetensors",
        description="To .gguf: IN is a Hugging Face model directory (LlamaForCausalLM or "
        "MistralForCausalLM, GQA included), its model.safetensors.index.json or a "
        ".safetensors file, with config.json and tokenizer.model (SentencePiece) or a "
        "byte-level BPE tokenizer.json beside it. The output is what llama.cpp loads: "
        "hyperparameters from config.json, llama.cpp's tensor names, Q/K rows reordered as "
        "file ranges (never loaded), the tokenizer's llama.cpp keys. Weights keep their dtype "
        "(bytes moved with --consume, else cloned or copied) unless --outtype converts them "
        "(in bounded chunks); norms are F32. Anything else (architecture, tokenizer, dtype, "
        "RoPE scaling) is refused before anything is written. To/from .ptd: every tensor's "
        "bytes are kept; tensors the target cannot represent are refused with their name and "
        "reason.")
    c.add_argument("input", metavar="IN", help="MODEL_DIR, INDEX.json, IN.safetensors or IN.ptd")
    c.add_argument("output", metavar="OUT", nargs="?", default=None,
                   help="OUT.gguf, OUT.ptd or OUT.safetensors (or -o OUT)")
    c.add_argument("-o", "--output", dest="output_opt", metavar="OUT", default=None,
                   help="the output file")
    c.add_argument("--outtype", choices=["source", "f32", "f16", "bf16"], default=None,
                   help="GGUF: type of 2-D weights [source: each keeps its own dtype]")
    c.add_argument("--split-max-tensors", "--max-tensors", dest="max_tensors", type=int,
                   default=0, help="GGUF: split the output, at most this many tensors per shard")
    c.add_argument("--split-max-size", "--max-shard-size", dest="max_shard_size",
                   type=parse_size, default=0,
                   help="GGUF: split the output, at most this many tensor bytes per shard "
                   "(e.g. 50G)")
    common(c, ".ptd entry alignment [16], safetensors data-start alignment [8], or GGUF "
           "general.alignment [32; 4096 lets later saves clone]")
    c.set_defaults(func=cmd_convert)
