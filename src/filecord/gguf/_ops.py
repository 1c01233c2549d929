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
from collections.abc import Callable, Sequence

from filecord._io import syscalls as _sys
from filecord._kit.argorder import (
    input_paths,
    not_an_input,
    output_path,
    require_suffix,
    source_path,
)
from filecord._kit.operation import (
    Index,
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
from filecord.gguf._types import ARCH_KEY, DENSE, GGUFTensor, KeyValue, ValueType
from filecord.gguf.errors import DuplicateTensorError, UnrepresentableError
from filecord.tensors import DType

PASSTHROUGH = (DType.F32, DType.F16, DType.BF16)
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
        return Inputs(models, tuple(f.whole for m in models for f in m.shards))
    return read


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
    not_an_input("merge", out, paths)

    def build(models: list[GGUFModel]) -> Job:
        sources = [f for m in models for f in m.shards]
        return Job({out: build_gguf(models[0].kvs, _union(models), alignment=alignment,
                                    sources=sources)})

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


def _refusals(tensors: Sequence[object]) -> list[str]:
    from filecord.tensors import NamedTensor

    out = []
    for t in tensors:
        if not isinstance(t, NamedTensor):  # pragma: no cover - read_safetensors gives these
            continue
        if t.dtype not in PASSTHROUGH:
            why = ("GGUF has no such type" if t.dtype not in DENSE.values()
                   else "llama.cpp's converter casts it")
            out.append(f"{t.name} ({t.dtype.value}: needs a cast, {why})")
        elif len(t.name.encode("utf-8")) >= 64:
            out.append(f"{t.name} (a name of 64 bytes or more: needs a rename)")
        elif len(t.shape) > 4:
            out.append(f"{t.name} ({len(t.shape)} dims: needs a reshape)")
    return out


@renamed(max_size="max_shard_size")
def convert(
    output: str | os.PathLike[str],
    source: str | os.PathLike[str],
    *,
    arch: str | None = None,
    consume: bool = False,
    alignment: int | None = None,
    max_tensors: int = 0,
    max_shard_size: int = 0,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> OperationReport:
    """``.safetensors`` (or a sharded checkpoint's ``*.index.json``) to GGUF, bytes unchanged.

    Only tensors that pass through are written: F32, F16 and BF16 keep their bytes and get
    their dims reversed (ggml order); names are kept.  Anything that needs a transformation
    (a cast, a rename, quantization, permutation) is refused with every such tensor named:
    that belongs to a conversion script, which :class:`~filecord.gguf.GGUFWriter` serves.
    Order: shard files sorted, names sorted within each, as ``convert_hf_to_gguf.py`` reads
    them.  Key-values: ``general.architecture`` when ``arch`` is given, then each safetensors
    ``__metadata__`` entry as a string under ``safetensors.<key>``.  With ``consume=True`` the
    tensors' bytes are moved and the inputs (and the index) removed at the commit.  The
    output (``*.gguf``) comes first; the old order is refused before anything is read, and so
    is an output that is the source (an index JSON is no tensor source of the save).
    """
    from filecord.safetensors._read import SafetensorsFile, SafetensorsIndex, read_safetensors

    out = output_path("convert", CONVERT, output)
    src = source_path("convert", CONVERT, source)
    require_suffix("convert", CONVERT, out, (".gguf",))
    if not src.endswith((".safetensors", ".json")):
        raise ValueError(f"convert to .gguf takes a .safetensors file or an index .json, not "
                         f"{src!r}: arguments go output first: {CONVERT}")
    not_an_input("convert", out, [src])

    def read() -> Inputs[list[SafetensorsFile]]:
        got = read_safetensors(src, owned=consume)
        files = list(got.shards) if isinstance(got, SafetensorsIndex) else [got]
        index = ((Index(got.path, tuple(f.path for f in files)),)
                 if isinstance(got, SafetensorsIndex) else ())
        return Inputs(files, tuple(f.whole for f in files), index)

    def build(files: list[SafetensorsFile]) -> Job:
        ordered = [t for f in sorted(files, key=lambda f: f.path)
                   for _, t in sorted(f.tensors.items())]
        bad = _refusals(ordered)
        if bad:
            raise UnrepresentableError(
                f"{len(bad)} tensor(s) of {src} cannot pass through to GGUF unchanged: "
                + "; ".join(bad))
        tensors = [GGUFTensor.from_named(t) for t in ordered]
        kvs = [KeyValue(ARCH_KEY, ValueType.STRING, arch)] if arch else []
        for f in files:
            for k, v in (f.metadata or {}).items():
                kvs.append(KeyValue(f"safetensors.{k}", ValueType.STRING, v))
        outs = build_split(kvs, tensors, out, max_tensors=max_tensors, max_size=max_shard_size,
                           alignment=alignment)
        return Job(dict(outs.items()))

    return operate(read, build, consume=consume, dry_run=dry_run, window=window,
                   progress=progress)
