"""The command table: every ``filecord`` command with the formats it reads and writes, the
function that adds its arguments and the one that runs it, in the order ``filecord --help``
lists them.

The one grammar: inputs are positional and the destination of every command that writes
follows ``-o/--output`` (``pack``, ``plan``, ``merge``, ``reshard``, ``convert``); its directory
is created (removed again if the command fails and it is still empty).  The old forms
(``merge OUT IN...``, ``convert IN OUT``, ``reshard IN... OUTDIR``, ``pack OUT FILE...``) are
refused with exit 2 and the same command line in the new form.

This is the only module of :mod:`filecord.cli` that imports the others: the command modules
(``pack``, ``verify``, ``recover``, ``demo``) and the format modules (``executorch``,
``safetensors``, ``gguf``) import :mod:`filecord.cli.common` alone.  The commands that span
formats (``inspect``, ``merge``, ``reshard``, ``convert``) are dispatched here, by content
for ``inspect`` and by suffix for the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from filecord._formats import sniff
from filecord._io import syscalls as _sys
from filecord._plan.report import SaveReport
from filecord.cli import demo, executorch, gguf, pack, recover, safetensors, verify
from filecord.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    about,
    add_operation_options,
    add_output,
    count,
    not_regular,
    note_consume,
    odd_member,
    output_directory,
    parse_size,
    render_report,
    reported,
    require_output,
)
from filecord.errors import FormatError, InsufficientSpaceError, add_note
from filecord.gguf.errors import CheckpointFileError

Operation = Callable[[argparse.Namespace], SaveReport]


@dataclass(frozen=True, slots=True)
class Command:
    """One command: its name, one line for ``filecord --help``, the formats it reads and
    writes (shown in its own ``--help``), what it does, and its parser and handler."""

    name: str
    summary: str
    reads: str
    writes: str
    description: str
    build: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def full_description(self) -> str:
        return f"{self.description} Reads: {self.reads}. Writes: {self.writes}."


# --- the commands that span formats --------------------------------------------------------------

def _check_inputs(paths: list[str]) -> None:
    """Every input, and every file of a set an input stands for (an index's shards, a split
    GGUF's), is a regular file: a FIFO would block a reader, a device never ends."""
    for p in paths:
        why = not_regular(p)
        if why is not None:
            raise UsageError(f"{p}: {'no such file' if not _sys.lexists(p) else why}")
        member = odd_member(p)
        if member is not None:
            raise UsageError(member)


def _save(op: Operation, args: argparse.Namespace, directory: str,
          render: Callable[[SaveReport, argparse.Namespace, TextIO], None] | None = None,
          carry: list[tuple[str, str]] | None = None) -> int:
    """Run one format's operation with its output directory created; render its report.
    ``carry`` (a Hugging Face folder's non-weight files, (source, destination)) is saved by
    the operation's own transaction, with the weights: one plan, one space check, one commit.
    A save refused for lack of space says when ``--consume`` would fit (the plan worked out
    with consume, as a dry run: nothing is written or moved)."""
    args.carry = {dst: src for src, dst in carry or []}
    with output_directory(directory, dry_run=args.dry_run):
        try:
            report = op(args)
        except InsufficientSpaceError as exc:
            if not args.consume:
                note_consume(exc, op, args)
            raise
        fits = all(p.fits for p in report.peaks)
        with reported(report):
            if render is None:
                render_report(report, args, sys.stdout)
            else:
                render(report, args, sys.stdout)
            if not report.dry_run or fits:
                safetensors.say_carried(carry or [], args)
    return EXIT_OK if not report.dry_run or fits else EXIT_FAIL


def _by_suffix(table: dict[str, Operation], path: str, what: str) -> Operation:
    for suffix, op in table.items():
        if path.endswith(suffix):
            return op
    raise UsageError(f"{path}: the output of {what} must end in {', '.join(table)}")


_MERGE: dict[str, Operation] = {
    ".safetensors": safetensors.merge, ".ptd": executorch.merge, ".gguf": gguf.merge,
}
# What an output's suffix makes a command read its inputs as: (the format's registered name,
# how a person calls it).
_READS_AS: dict[str, tuple[str, str]] = {
    ".safetensors": ("safetensors", "safetensors"), ".ptd": ("executorch-ptd", "ExecuTorch .ptd"),
    ".gguf": ("gguf", "GGUF"),
}
_TITLES = {"safetensors": "a safetensors file or index", "executorch-ptd": "an ExecuTorch .ptd",
           "executorch-pte": "an ExecuTorch program (.pte)", "gguf": "a GGUF file"}


def _suffix_of(out: str, table: dict[str, Operation]) -> str:
    return next(s for s in table if out.endswith(s))


def _read_as(command: str, suffix: str, reads: str, inputs: list[str], *,
             chooser: str = "output's suffix") -> None:
    """Every input is in the format the output's suffix chose, or the command is refused
    before anything is read: an input that is plainly another format would otherwise fail
    deep in the reader, with a message about a magic number."""
    name, title = _READS_AS[reads]
    for p in inputs:
        got = sniff(p)
        if got is not None and got.name != name:
            if chooser != "output's suffix":
                raise UsageError(
                    f"{p} is {_TITLES.get(got.name, got.name)}, but the {chooser} chose "
                    f"{title}: {command} reads its inputs as GGUF only when every one ends in "
                    ".gguf, else as safetensors")
            hint = ("merge keeps the format; convert changes it" if command == "merge"
                    else "convert --help names the pairs it converts")
            raise UsageError(
                f"{p} is {_TITLES.get(got.name, got.name)}, but the output's suffix {suffix} "
                f"chose {title}: {command} -o OUT{suffix} reads its inputs as {title} ({hint})")


@contextlib.contextmanager
def _suffix_chose(suffix: str, reads: str, *, why: str | None = None) -> Iterator[None]:
    """A format error in an input says which suffix chose the format it was read as (not
    one in a checkpoint's config or tokenizer files, which no suffix chose)."""
    try:
        yield
    except FormatError as exc:
        if isinstance(exc, CheckpointFileError):
            raise
        because = why or f"the output's suffix is {suffix}"
        add_note(exc, f"read as {_READS_AS[reads][1]} because {because}")
        raise


def run_merge(args: argparse.Namespace) -> int:
    out = require_output(args, args.inputs, old_first=True, placeholder="OUT.safetensors")
    op = _by_suffix(_MERGE, out, "merge")
    _check_inputs(args.inputs)
    suffix = _suffix_of(out, _MERGE)
    _read_as("merge", suffix, suffix, args.inputs)
    pairs = [] if args.weights_only or suffix != ".safetensors" else safetensors.companions(
        args.inputs, os.path.dirname(out))
    safetensors.check_companions(pairs)
    with _suffix_chose(suffix, suffix):
        return _save(op, args, os.path.dirname(out), carry=pairs)


def run_reshard(args: argparse.Namespace) -> int:
    outdir = require_output(args, args.inputs, old_first=False, placeholder="OUTDIR")
    _check_inputs(args.inputs)
    if _sys.lexists(outdir) and not _sys.isdir(outdir):
        raise UsageError(f"{outdir}: not a directory (-o names the directory of the shards)")
    if args.pattern is not None and "{suffix}" not in args.pattern:
        raise UsageError(f"--pattern must contain {{suffix}}: {args.pattern!r}")
    if all(p.endswith(".gguf") for p in args.inputs):
        op: Operation = gguf.reshard
    elif args.max_tensors is not None:
        raise UsageError("--max-tensors applies to GGUF inputs only")
    else:
        op = safetensors.reshard
        if args.pattern is not None:
            safetensors.check_reshard_pattern(args.pattern)
    pairs = [] if args.weights_only or op is gguf.reshard else safetensors.companions(
        args.inputs, outdir)
    safetensors.check_companions(pairs)
    # The inputs' suffix chooses here: GGUF when every input ends in .gguf, else safetensors.
    reads = ".gguf" if op is gguf.reshard else ".safetensors"
    _read_as("reshard", reads, reads, args.inputs, chooser="inputs' suffix")
    why = ("every input's suffix is .gguf" if reads == ".gguf"
           else "not every input's suffix is .gguf")
    with _suffix_chose(reads, reads, why=why):
        return _save(op, args, outdir, carry=pairs)


def run_convert(args: argparse.Namespace) -> int:
    out = require_output(args, args.inputs, old_first=False, placeholder="OUT.ptd")
    if len(args.inputs) != 1:
        raise UsageError(f"convert takes one input, got {len(args.inputs)}: "
                         f"{' '.join(args.inputs)}")
    source = args.inputs[0]
    if out.endswith(".gguf"):
        if source.endswith((".ptd", ".gguf")):
            raise UsageError("convert to .gguf takes a Hugging Face model directory, its "
                             "model.safetensors.index.json or a .safetensors file")
        if not _sys.isdir(source):  # a model directory: the library reads what it needs
            _check_inputs([source])
            _read_as("convert", ".gguf", ".safetensors", [source])
        with _suffix_chose(".gguf", ".safetensors"):
            return _save(gguf.convert, args, os.path.dirname(out), gguf.render_grouped)
    _check_inputs([source])
    if args.outtype is not None or args.max_tensors or args.max_shard_size:
        raise UsageError("--outtype, --split-max-tensors and --split-max-size apply to "
                         "conversions to .gguf only")
    if not (out.endswith(".ptd") or (source.endswith(".ptd") and out.endswith(".safetensors"))):
        got = sniff(source)
        what = f"{source} is {_TITLES.get(got.name, got.name)}" if got is not None else source
        raise UsageError(f"{what}: convert .safetensors (or an index .json) to .ptd or .gguf, "
                         "or .ptd to .safetensors")
    suffix = ".ptd" if out.endswith(".ptd") else ".safetensors"
    reads = ".safetensors" if suffix == ".ptd" else ".ptd"
    _read_as("convert", suffix, reads, [source])
    with _suffix_chose(suffix, reads):
        return _save(safetensors.convert, args, os.path.dirname(out))


def _head(path: str) -> bytes:
    fd = _sys.open(path, os.O_RDONLY)
    try:
        return _sys.pread(fd, 9, 0)
    finally:
        _sys.close(fd)


def _describe(path: str, verbose: int) -> tuple[dict[str, Any], list[str]] | None:
    head = _head(path)
    if gguf.sniff(head):
        g = gguf.describe(path)
        return g, gguf.render(g)
    if executorch.sniff(head):
        e = executorch.describe(path, head)
        return e, executorch.render(e, verbose=verbose)
    if safetensors.sniff(path, head):
        s = safetensors.describe(path)
        return s, safetensors.render(s)
    return None


def run_inspect(args: argparse.Namespace) -> int:
    path = os.fspath(args.path)
    why = not_regular(path)
    if why is None:
        member = odd_member(path)
        why = None if member is None else f"a file of its set: {member}"
    if why is not None:
        print(f"filecord inspect: {path}: {why}", file=sys.stderr)
        return EXIT_FAIL
    try:
        got = _describe(path, args.verbose)
    except (FormatError, OSError) as exc:
        print(f"filecord inspect: {about(path, exc)}", file=sys.stderr)
        return EXIT_FAIL
    if got is None:
        print(f"filecord inspect: {path}: not a .pte, .ptd, .safetensors, safetensors index or "
              f".gguf file (first bytes {_head(path)[:8]!r})", file=sys.stderr)
        return EXIT_FAIL
    info, lines = got
    print(json.dumps(info, indent=2, ensure_ascii=False) if args.json else "\n".join(lines))
    return EXIT_OK


# --- the parsers of the commands that span formats -----------------------------------------------

def build_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="FILE",
                   help="a .pte, .ptd, .safetensors, *.index.json or .gguf file (the format is "
                   "found from its first bytes)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="also the full layout (every segment, key and delegate); again: more "
                   "log detail")


def build_merge(m: argparse.ArgumentParser) -> None:
    m.add_argument("inputs", nargs="+", metavar="IN",
                   help="files to merge (a safetensors index .json, or a GGUF split set's first "
                   "shard, stands for its set)")
    add_output(m, "OUT", "OUT.safetensors, OUT.ptd or OUT.gguf (its directory is created)")
    add_operation_options(m, "safetensors: data-start alignment [8; 4096 lets later saves "
                          "clone]; .ptd: segment alignment [128]; .gguf: general.alignment "
                          "[the input's]")
    _add_weights_only(m)


def _add_weights_only(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights-only", action="store_true",
                   help="safetensors from a Hugging Face folder (one holding config.json): do "
                   "not carry its other files (config.json, generation_config.json, the "
                   "tokenizer files, ...) to the output folder [they are carried, so that "
                   "from_pretrained(OUTDIR) works]")


def build_reshard(r: argparse.ArgumentParser) -> None:
    r.add_argument("inputs", nargs="+", metavar="IN", help="files or index .json")
    add_output(r, "OUTDIR", "the directory of the shards and the index (created if missing)")
    r.add_argument("--max-shard-size", type=parse_size, default=None,
                   help="largest shard [5GB; GGUF: tensor bytes, no limit unless given]")
    r.add_argument("--max-tensors", type=count, default=None,
                   help="GGUF: most tensors per shard [128 when no size is given, as gguf-split]")
    r.add_argument("--pattern", default=None,
                   help="shard file name pattern [model{suffix}.safetensors; GGUF: the input's "
                   "stem, shards <stem>-00001-of-0000N.gguf]")
    add_operation_options(r, "data-start alignment of each shard [8]")
    _add_weights_only(r)


def build_convert(c: argparse.ArgumentParser) -> None:
    c.add_argument("inputs", nargs="+", metavar="IN",
                   help="MODEL_DIR, INDEX.json, IN.safetensors or IN.ptd")
    add_output(c, "OUT", "OUT.gguf, OUT.ptd or OUT.safetensors (its directory is created)")
    c.add_argument("--outtype", choices=["source", "auto", "f32", "f16", "bf16", "q8_0"],
                   default=None,
                   help="GGUF: type of 2-D weights [source: each keeps its own dtype; auto: "
                   "llama.cpp's, the first weight's F16/BF16, else F16; q8_0: ggml's 8-bit "
                   "blocks]")
    c.add_argument("--split-max-tensors", "--max-tensors", dest="max_tensors", type=count,
                   default=0, help="GGUF: split the output, at most this many tensors per shard")
    c.add_argument("--split-max-size", "--max-shard-size", dest="max_shard_size",
                   type=parse_size, default=0,
                   help="GGUF: split the output, at most this many tensor bytes per shard "
                   "(e.g. 50G)")
    add_operation_options(c, ".ptd entry alignment [16], safetensors data-start alignment [8], "
                          "or GGUF general.alignment [32; 4096 lets later saves clone]")


# --- the table -----------------------------------------------------------------------------------

def _pack(p: argparse.ArgumentParser) -> None:
    pack.build(p, dry_run=False)


def _plan(p: argparse.ArgumentParser) -> None:
    pack.build(p, dry_run=True)


COMMANDS: tuple[Command, ...] = (
    Command(
        "demo", "save synthetic engine files by copy and by move, verify, compare",
        "nothing (it generates its own files)", "a .ptd in a temporary directory, removed",
        "Generate synthetic engine files (1 GiB by default), pack them as named data into an "
        "ExecuTorch .ptd by copy and then with consume=True, verify every byte, print time, "
        "peak allocated disk and peak RSS side by side; then (with executorch installed) export "
        "a small model, save its weights with consume=True and run it.",
        demo.build, demo.run),
    Command(
        "pack", "pack files as named entries into an ExecuTorch .ptd, atomically",
        "any files", "-o OUT.ptd",
        "Pack files as named entries into an ExecuTorch data file, in one atomic save. Keys "
        "default to the files' names; with --consume the files are moved in and deleted.",
        _pack, pack.run),
    Command(
        "plan", "show what `pack` would do (move, clone or copy, and why) without writing",
        "any files", "nothing (-o OUT.ptd names the file pack would write)",
        "Show what `pack` would do with the same arguments: per file moved, cloned or copied "
        "and why, and whether it fits; nothing is written.",
        _plan, pack.run),
    Command(
        "merge", "merge checkpoints into one file: safetensors, ExecuTorch .ptd or GGUF",
        ".safetensors files and *.index.json; .ptd files; .gguf files or a GGUF split set",
        "-o OUT.safetensors, -o OUT.ptd or -o OUT.gguf (one file)",
        "Merge checkpoints without loading them. -o OUT.safetensors: inputs are .safetensors "
        "files or *.index.json (the output is what safetensors' save_file would write for the "
        "same tensors). -o OUT.ptd: inputs are .ptd files. -o OUT.gguf: IN is the first shard "
        "of a split set (or several .gguf files); the output is what gguf-py's GGUFWriter "
        "would write for the same key-values and tensors.",
        build_merge, run_merge),
    Command(
        "reshard", "split or reshard safetensors (shards and an index) or GGUF (split shards)",
        ".safetensors files and *.index.json, or .gguf files",
        "-o OUTDIR: safetensors shards and model.safetensors.index.json, or GGUF shards "
        "<stem>-00001-of-0000N.gguf",
        "Write IN... as shards of at most --max-shard-size plus model.safetensors.index.json, "
        "as huggingface_hub would, in one transaction; one input file and a small size split "
        "it. GGUF inputs: shards split as gguf-split splits (--max-tensors, --max-shard-size), "
        "the split.* keys added, all in one transaction. OUTDIR is created if missing.",
        build_reshard, run_reshard),
    Command(
        "convert", "convert a Hugging Face Llama/Mistral checkpoint to GGUF, safetensors to "
        "ExecuTorch .ptd, and .ptd back to safetensors",
        "a Hugging Face model directory, *.index.json or .safetensors (to .gguf); "
        ".safetensors or *.index.json (to .ptd); .ptd (to .safetensors)",
        "-o OUT.gguf (or split shards), -o OUT.ptd or -o OUT.safetensors",
        "To .gguf: IN is a Hugging Face model directory (Llama 1/2/3, Mistral, Qwen2/2.5, "
        "Qwen3, Gemma 2; GQA included), its model.safetensors.index.json or a .safetensors "
        "file, with config.json and tokenizer.model (SentencePiece), a SentencePiece-converted "
        "tokenizer.json or a byte-level BPE tokenizer.json beside it. The output is what "
        "llama.cpp loads: hyperparameters from config.json, llama.cpp's tensor names, Q/K rows "
        "reordered as file ranges (never loaded), Gemma's norms offset in the fill, the "
        "tokenizer's llama.cpp keys. Weights keep their dtype (bytes moved with "
        "--consume, else cloned or copied) unless --outtype converts them (in bounded chunks); "
        "norms are F32. Anything else (architecture, tokenizer, dtype, RoPE scaling) is refused "
        "before anything is written. To/from .ptd: every tensor's bytes are kept; tensors the "
        "target cannot represent are refused with their name and reason.",
        build_convert, run_convert),
    Command(
        "recover", "finish or undo an interrupted save from its journal",
        "a journal (*.filecord-journal) or a directory holding them",
        "the interrupted saves' outputs and sources",
        "Finish (if it had committed) or roll back (if not) every interrupted save whose "
        "journal is at PATH or whose files are in the directory PATH. A save still running "
        "(its lock held) is skipped; a journal that cannot be proven is refused and nothing is "
        "touched (exit 1); a PATH that is not a journal is refused (exit 2). Safe to run again.",
        recover.build, recover.run),
    Command(
        "inspect", "what a .pte/.ptd holds and needs, or where every byte of a .safetensors, "
        "index or .gguf is",
        ".pte, .ptd, .safetensors, *.index.json, .gguf", "nothing",
        "A summary of an ExecuTorch program (.pte): methods with their inputs and outputs, "
        "operators, delegates, constant bytes inline and external, the named-data keys it needs "
        "and whether the data files beside it (<stem>.ptd, _default_external_constant.ptd) "
        "hold them, where the big bytes are; or of a data file (.ptd). -v adds the full layout: "
        "header, every segment, every key. A safetensors file or index, or a GGUF file or split "
        "set, is shown as its layout: key-values, every tensor and its byte range.",
        build_inspect, run_inspect),
    Command(
        "verify", "check a file of any format filecord reads: structure, offsets, dtypes, "
        "every byte; --load also loads it with its real client",
        ".pte (with its .ptd files), .ptd, .safetensors, *.index.json, .gguf (a split set "
        "from its first shard)", "nothing",
        "A program (.pte): structural checks of it and its .ptd files (every segment in "
        "bounds, every external tensor's key present with a matching layout), then, when the "
        "executorch package is installed, a load of every method in its runtime "
        "(--no-runtime: structure only). Any other file: read with filecord's reader (every "
        "rule of the format), every byte of every file accounted for as header, tensor or "
        "zero padding, the dtypes counted; with --load the safetensors package, or gguf-py "
        "and llama.cpp (for a model with a tokenizer), load it and must find the same "
        "tensors at the same bytes. Exit 0 when everything checks, 1 otherwise (a client that "
        "is not installed is a note), 2 for a usage error.",
        verify.build, verify.run),
)
