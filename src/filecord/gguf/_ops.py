"""Merge, reshard (split) and convert GGUF models without loading them: file-backed ranges in,
one ``save``/``save_many`` transaction out.

Theory of operation
-------------------
Inputs are read with :func:`read_gguf` (headers only; tensors are ranges).  With
``consume=True`` they are read as *owned*, so the save moves their bytes into the outputs (a
GGUF tensor takes its padding along, so one input's ranges run without gaps to its end) and
deletes them at the commit: a model that fills the disk can still be merged, split or
converted.  Every operation runs on the kit's skeleton
(:func:`filecord._kit.operation.operate`): the inputs' deletion right is given up on the way
out (only a committed consuming save removes a user's file, never a dry run, a failure or the
garbage collector), and after the commit nothing raises: a shard the save kept (a symlink,
read-only, immutable, another hard link, another file system) is listed in the report's
``kept``, and so is the index of a converted checkpoint whose shards were kept.

Outputs are laid out as gguf-py's writer lays out the same key-values and tensors, so a merge
equals gguf-py writing the model as one file, and a reshard equals gguf-py writing it with
``split_max_tensors``/``split_max_size`` (here ``max_tensors``/``max_shard_size``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from filecord._io import syscalls as _sys
from filecord._kit.argorder import (
    input_paths,
    not_an_input,
    output_path,
    require_suffix,
    source_path,
)
from filecord._kit.operation import (
    Inputs,
    Job,
    OperationReport,
    Paths,
    ProgressCallback,
    operate,
)
from filecord._kit.renamed import renamed
from filecord._plan.window import DEFAULT_WINDOW
from filecord.gguf._build import build_gguf, build_split
from filecord.gguf._read import GGUFModel, read_gguf
from filecord.gguf._types import GGUFTensor
from filecord.gguf.errors import DuplicateTensorError

MERGE = "filecord.gguf.merge(output, inputs)"
RESHARD = "filecord.gguf.reshard(output, inputs)"
CONVERT = "filecord.gguf.convert(output, source)"


def _reader(paths: Paths, *, consume: bool) -> Callable[[], Inputs[list[GGUFModel]]]:
    def read() -> Inputs[list[GGUFModel]]:
        models: list[GGUFModel] = []
        try:
            for p in paths:
                models.append(read_gguf(p, owned=consume))  # noqa: PERF401 - one at a time
        except BaseException:
            for m in models:
                m.detach_cleanup()  # a failed read must never delete the user's file
            raise
        sets = tuple(tuple(f.path for f in m.shards) for m in models if len(m.shards) > 1)
        return Inputs(models, tuple(f.whole for m in models for f in m.shards), sets=sets)
    return read


def _dropped_kvs(models: list[GGUFModel]) -> tuple[str, ...]:
    """The shards of every model after the first whose key-values the output (which holds the
    first model's) does not: consuming them would lose their name, tokenizer, custom keys."""
    first = dict(models[0].kvs)
    return tuple(f.path for m in models[1:] if dict(m.kvs) != first for f in m.shards)


def _union(models: list[GGUFModel]) -> list[GGUFTensor]:
    tensors: dict[str, GGUFTensor] = {}
    where: dict[str, str] = {}
    for m in models:
        for name, t in m.tensors.items():
            if name in tensors:
                raise DuplicateTensorError(f"tensor {name!r} is in both {where[name]} and "
                                           f"{m.path}")
            tensors[name] = t
            where[name] = m.path
    return list(tensors.values())


def merge(
    output: str | os.PathLike[str],
    inputs: Paths,
    *,
    consume: bool = False,
    alignment: int | None = None,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> OperationReport:
    """One ``.gguf`` from a split set (given by its first shard) or several models.

    Key-values are the first input's (without ``split.*``, byte for byte); tensors are every
    input's in order (a name in two inputs raises :class:`DuplicateTensorError`).
    ``alignment`` sets ``general.alignment`` (4096: every tensor on a page, so later saves
    clone); ``dry_run`` returns the plan and writes nothing.  The output comes first and must
    end in ``.gguf``; a call in the old order (inputs first) is refused before anything is read.
    """
    out = output_path("merge", MERGE, output)
    paths = input_paths("merge", MERGE, inputs)
    require_suffix("merge", MERGE, out, (".gguf",))
    not_an_input("merge", out, paths, consume=consume)

    def build(models: list[GGUFModel]) -> Job:
        sources = [f for m in models for f in m.shards]
        return Job({out: build_gguf(models[0].kvs, _union(models), alignment=alignment,
                                    sources=sources)}, uncarried=_dropped_kvs(models))

    return operate(_reader(paths, consume=consume), build, consume=consume, dry_run=dry_run,
                   window=window, progress=progress)


@renamed(max_size="max_shard_size")
def reshard(
    output: str | os.PathLike[str],
    inputs: Paths,
    *,
    max_tensors: int = 0,
    max_shard_size: int = 0,
    small_first_shard: bool = False,
    consume: bool = False,
    alignment: int | None = None,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> OperationReport:
    """Split (or re-split, or merge back when one shard suffices) as gguf-py splits: shards
    ``<output stem>-00001-of-0000N.gguf`` of at most ``max_tensors`` tensors and
    ``max_shard_size`` tensor bytes (0: no limit; soft, a tensor larger than the limit gets its
    own shard), all in one transaction.  Files of the same stem that the new set does not use
    (``<stem>.gguf``, shards of another count) are removed after the commit; inputs never are
    by this rule (the save deletes those it consumed).  The output (``*.gguf``) comes first;
    the old order is refused before anything is read."""
    from filecord.safetensors._write import stale_files

    out = output_path("reshard", RESHARD, output)
    paths = input_paths("reshard", RESHARD, inputs)
    require_suffix("reshard", RESHARD, out, (".gguf",))
    if max_tensors < 0 or max_shard_size < 0:
        raise ValueError("max_tensors and max_shard_size must not be negative")

    def build(models: list[GGUFModel]) -> Job:
        sources = [f for m in models for f in m.shards]
        outs = build_split(models[0].kvs, _union(models), out, max_tensors=max_tensors,
                           max_size=max_shard_size, small_first_shard=small_first_shard,
                           alignment=alignment, sources=sources)
        stem = os.path.basename(out).removesuffix(".gguf")
        # Inputs are never obsolete files (the skeleton drops them): the save decides on them.
        stale = stale_files(os.path.dirname(_sys.abspath(out)), stem + "{suffix}.gguf",
                            list(outs))
        return Job(dict(outs.items()), tuple(stale))

    return operate(_reader(paths, consume=consume), build, consume=consume, dry_run=dry_run,
                   window=window, progress=progress)


@renamed(max_size="max_shard_size")
def convert(
    output: str | os.PathLike[str],
    source: str | os.PathLike[str],
    *,
    outtype: str = "source",
    consume: bool = False,
    alignment: int | None = None,
    max_tensors: int = 0,
    max_shard_size: int = 0,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    cast_progress: ProgressCallback | None = None,
    name: str | None = None,
) -> OperationReport:
    """A Hugging Face checkpoint of a family in the converter's table (Llama 1/2/3,
    Mistral, Qwen2/2.5, Qwen3, Gemma 2; GQA included) to a GGUF that llama.cpp loads:
    ``source`` is the model directory, its ``model.safetensors.index.json`` or a
    ``.safetensors`` file, with ``config.json`` and the tokenizer (``tokenizer.model``, a
    SentencePiece-converted ``tokenizer.json``, or a byte-level BPE ``tokenizer.json``) beside
    it.

    Hyperparameters come from ``config.json``, tensor names are mapped to llama.cpp's
    (``blk.N.attn_q.weight``, ...), Llama's Q/K rows are reordered as file ranges, never
    loaded.  ``outtype``: ``"source"`` keeps each weight's dtype (its bytes moved, cloned or
    copied), ``"auto"`` is llama.cpp's default (the first weight's F16/BF16, else F16),
    ``"f32"``/``"f16"``/``"bf16"``/``"q8_0"`` convert 2-D weights in bounded chunks; 1-D
    tensors and norms are F32 either way, as llama.cpp's converter writes them.
    ``max_tensors`` / ``max_shard_size`` split the output as gguf-py splits
    (``<stem>-00001-of-0000N.gguf``).  With ``consume=True`` the checkpoint's bytes are moved
    and its safetensors files and index removed after the commit (``config.json`` and the
    tokenizer stay).  ``dry_run`` plans and writes nothing.  A malformed ``config.json`` or
    tokenizer file raises :class:`~filecord.gguf.errors.CheckpointFileError` naming the file
    and field; anything unsupported raises
    :class:`~filecord.gguf.errors.UnsupportedModelError`; both before anything is written.  The
    output (``*.gguf``) comes first; the old order is refused before anything is read.
    """
    from filecord.gguf._hf import convert_hf
    from filecord.gguf._hf_model import OutType

    out = output_path("convert", CONVERT, output)
    src = source_path("convert", CONVERT, source)
    require_suffix("convert", CONVERT, out, (".gguf",))
    try:
        kind = OutType(outtype)
    except ValueError:
        raise ValueError(f"outtype must be one of {', '.join(o.value for o in OutType)}, "
                         f"not {outtype!r}") from None
    if max_tensors < 0 or max_shard_size < 0:
        raise ValueError("max_tensors and max_shard_size must not be negative")
    if src.endswith((".gguf", ".ptd")):
        raise ValueError(f"convert to .gguf takes a model directory, its index .json or a "
                         f".safetensors file, not {src!r}: arguments go output first: {CONVERT}")
    not_an_input("convert", out, [src], consume=consume)
    # the folder's other files (config, tokenizer, index) are read too and never consumed: an
    # output naming one of them, a symlink included, would be written over an input
    folder = src if _sys.isdir(src) else os.path.dirname(_sys.abspath(src))
    if _sys.isdir(folder):
        read = [os.path.join(folder, n) for n in _sys.listdir(folder)
                if not n.endswith((".safetensors", ".gguf"))
                and _sys.isfile(os.path.join(folder, n))]
        not_an_input("convert", out, read, consumable=False)
    return convert_hf(out, src, outtype=kind, consume=consume, alignment=alignment,
                      max_tensors=max_tensors, max_size=max_shard_size, dry_run=dry_run,
                      window=window, progress=progress, cast_progress=cast_progress,
                      name=name)
