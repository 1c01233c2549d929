"""Merge, reshard (split) and convert checkpoints without loading them: file-backed ranges in,
one ``save``/``save_many`` transaction out.

Theory of operation
-------------------
Inputs are read with :func:`read_safetensors` (headers only; tensors are ranges).  With
``consume=True`` they are read as *owned*, so the save moves (or clones) the tensors' bytes out
of them back to front, in sync windows, and deletes them at the commit: a checkpoint that fills
the disk can still be rewritten.  Without it the inputs are only read.  Whatever happens, the
inputs' deletion right is given up on the way out (``detach_cleanup``): only a committed
consuming save removes a user's file, never a dry run, a failure or the garbage collector.
An input ``*.index.json`` of a consumed checkpoint is removed after the commit (its shards are
gone); a crash just before leaves only that index behind.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from filecord._io import syscalls as _sys
from filecord._kit.argorder import (
    input_paths,
    not_an_input,
    output_path,
    require_directory,
    require_suffix,
    source_path,
)
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._plan.window import DEFAULT_WINDOW
from filecord._save import plan, save, save_many
from filecord.safetensors._ptdtypes import safetensors_dtype_of, scalar_type_of
from filecord.safetensors._read import SafetensorsFile, SafetensorsIndex, read_safetensors
from filecord.safetensors._write import (
    build_file,
    file_ids,
    plan_shards,
    remove_files,
    stale_files,
)
from filecord.safetensors.errors import DuplicateTensorError, UnrepresentableError
from filecord.tensors import NamedTensor

ProgressCallback = Callable[[int, int], None]
Paths = Sequence[str | os.PathLike[str]]


@dataclass(frozen=True, slots=True)
class Loaded:
    """Inputs of one operation: tensors in input order, file metadata, files and indexes."""

    tensors: tuple[NamedTensor, ...]
    metadata: Mapping[str, str] | None
    files: tuple[SafetensorsFile, ...]
    indexes: tuple[str, ...]

    @property
    def wholes(self) -> list[FileBackedData]:
        return [f.whole for f in self.files]


def load(paths: Paths, *, owned: bool) -> Loaded:
    """Read every input (files or indexes); names must be unique across them."""
    tensors: dict[str, NamedTensor] = {}
    where: dict[str, str] = {}
    metadata: dict[str, str] | None = None
    files: list[SafetensorsFile] = []
    indexes: list[str] = []
    try:
        for path in paths:
            got = read_safetensors(path, owned=owned)
            if isinstance(got, SafetensorsIndex):
                indexes.append(got.path)
                files.extend(got.shards)
            else:
                files.append(got)
            for f in got.shards if isinstance(got, SafetensorsIndex) else (got,):
                if f.metadata is not None:
                    metadata = {**(metadata or {}), **f.metadata}
            for name, t in got.tensors.items():
                if name in tensors:
                    raise DuplicateTensorError(
                        f"tensor {name!r} is in both {where[name]} and {got.path}")
                tensors[name] = t
                where[name] = got.path
    except BaseException:
        for f in files:
            f.whole.detach_cleanup()
        raise
    return Loaded(tuple(tensors.values()), metadata, tuple(files), tuple(indexes))


@contextmanager
def _inputs(paths: Paths, *, consume: bool) -> Iterator[Loaded]:
    loaded = load(paths, owned=consume)
    try:
        yield loaded
    finally:
        for f in loaded.files:
            f.whole.detach_cleanup()


def _run(outputs: Mapping[Target, CordLike], loaded: Loaded, *, consume: bool, dry_run: bool,
         window: int, progress: ProgressCallback | None) -> SaveReport:
    if dry_run:
        return plan(outputs, consume=consume, window=window)
    report = save_many(outputs, consume=consume, window=window, progress=progress)
    if consume:
        written = file_ids(outputs)
        remove_files([p for p in loaded.indexes if not file_ids([p]) & written])
    return report


MERGE = "filecord.safetensors.merge(output, inputs)"
RESHARD = "filecord.safetensors.reshard(directory, inputs)"
CONVERT = "filecord.safetensors.convert(output, source)"


def merge(
    output: str | os.PathLike[str],
    inputs: Paths,
    *,
    consume: bool = False,
    metadata: Mapping[str, str] | None = None,
    alignment: int = 8,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """One ``.safetensors`` holding every tensor of ``inputs`` (files and/or ``*.index.json``).

    The output is laid out as ``safetensors.torch.save_file`` would write the same tensors, so
    merging is byte-identical to loading and saving with the packages.  ``metadata`` defaults
    to the union of the inputs' ``__metadata__`` (a later input's value wins).  A name in two
    inputs raises :class:`DuplicateTensorError`.  ``dry_run=True`` returns the plan (per
    piece: moved, cloned or copied, and why) and writes nothing.  The output comes first and
    must end in ``.safetensors``; a call in the old order (inputs first) is refused before
    anything is read.
    """
    out = output_path("merge", MERGE, output)
    paths = input_paths("merge", MERGE, inputs)
    require_suffix("merge", MERGE, out, (".safetensors",))
    not_an_input("merge", out, paths)
    with _inputs(paths, consume=consume) as loaded:
        meta = loaded.metadata if metadata is None else dict(metadata)
        cord = build_file(loaded.tensors, meta, alignment=alignment, wholes=loaded.wholes)
        outs: dict[Target, CordLike] = {out: cord}
        return _run(outs, loaded, consume=consume, dry_run=dry_run,
                    window=window, progress=progress)


def reshard(
    directory: str | os.PathLike[str],
    inputs: Paths,
    *,
    max_shard_size: int = 5 * 10**9,
    filename_pattern: str = "model{suffix}.safetensors",
    consume: bool = False,
    alignment: int = 8,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """Rewrite ``inputs`` as shards of at most ``max_shard_size`` bytes (split one file, or
    reshard a checkpoint), identical to ``huggingface_hub.save_torch_state_dict`` of the same
    tensors in the same order (an index's ``weight_map`` order, else each file's data order)
    with the inputs' metadata.  Shards and index are one transaction; pattern files the new
    checkpoint does not use are removed after it (inputs only when consumed).  The directory
    comes first; one that names a file (or ends in a checkpoint suffix) is refused as the
    old order before anything is read.
    """
    d = output_path("reshard", RESHARD, directory)
    paths = input_paths("reshard", RESHARD, inputs)
    require_directory("reshard", RESHARD, d)
    with _inputs(paths, consume=consume) as loaded:
        user = {k: v for k, v in (loaded.metadata or {}).items() if k != "format"}
        outputs = (plan_shards(
            loaded.tensors, d, max_shard_size=max_shard_size, filename_pattern=filename_pattern,
            shard_metadata={"format": "pt"}, single_metadata={"format": "pt", **user},
            index_metadata=user, alignment=alignment, wholes=loaded.wholes,
        ))
        if dry_run:
            return plan(outputs, consume=consume, window=window)
        protect = [] if consume else [f.path for f in loaded.files] + list(loaded.indexes)
        stale = stale_files(d, filename_pattern, outputs, protect)
        report = _run(outputs, loaded, consume=consume, dry_run=False, window=window,
                      progress=progress)
        remove_files(stale)
        return report


def to_ptd_entries(tensors: Sequence[NamedTensor], alignment: int) -> list[object]:
    """``.ptd`` entries (contiguous layouts); refuses what a ``.ptd`` cannot describe."""
    from filecord.executorch.values import PtdEntry, TensorLayout

    out: list[object] = []
    for t in tensors:
        st = scalar_type_of(t)
        try:
            layout = TensorLayout.contiguous(st, t.shape)
        except ValueError as exc:
            raise UnrepresentableError(f"{t.name!r}: {exc}") from None
        data = bytes(t.data) if isinstance(t.data, memoryview) else t.data
        out.append(PtdEntry(t.name, data, layout, alignment))
    return out


def convert(
    output: str | os.PathLike[str],
    source: str | os.PathLike[str],
    *,
    consume: bool = False,
    alignment: int = 16,
    segment_alignment: int = 128,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """``.safetensors`` (or an index) to ``.ptd``, or ``.ptd`` to ``.safetensors``, by suffix.

    Each tensor keeps its bytes (moved with ``consume=True``).  To ``.ptd``: every entry gets a
    contiguous ``TensorLayout``; dtypes ExecuTorch lacks (C64, F8_E8M0, F4, F6) and sizes past
    32 bits are refused with the tensor's name.  To ``.safetensors``: every entry needs a
    layout with a contiguous dim order and a scalar type safetensors has.  ``alignment`` is the
    ``.ptd`` entry alignment, or the safetensors data-start alignment (8 unless given).

    The output comes first.  A call in the old order is refused before anything is written
    when the suffixes tell (``convert(x.ptd, y.ptd)``, an output that is the source) or the
    source does not exist; ``convert(a.safetensors, b.ptd)`` with both files present is a
    valid ``.ptd`` -> ``.safetensors`` conversion either way, so code that may meet both
    should name the arguments (``convert(output=..., source=...)``).
    """
    out = output_path("convert", CONVERT, output)
    src = source_path("convert", CONVERT, source)
    require_suffix("convert", CONVERT, out, (".ptd", ".safetensors"))
    if out.endswith(".ptd") and not src.endswith((".safetensors", ".json")):
        raise ValueError(f"convert to .ptd takes a .safetensors file or an index .json, not "
                         f"{src!r}: arguments go output first: {CONVERT}")
    if out.endswith(".safetensors") and not src.endswith(".ptd"):
        raise ValueError(f"convert to .safetensors takes a .ptd, not {src!r}: arguments go "
                         f"output first: {CONVERT}")
    not_an_input("convert", out, [src])
    if not _sys.exists(src):
        raise FileNotFoundError(errno.ENOENT, f"convert: no source {src!r} (arguments go "
                                f"output first: {CONVERT})", src)
    if out.endswith(".ptd"):
        from filecord.executorch.ptd import build_ptd

        with _inputs([src], consume=consume) as loaded:
            entries = to_ptd_entries(loaded.tensors, alignment)
            cord = build_ptd(entries, segment_alignment=segment_alignment)  # type: ignore[arg-type]
            outs: dict[Target, CordLike] = {out: cord}
            return _run(outs, loaded, consume=consume, dry_run=dry_run, window=window,
                        progress=progress)
    return _ptd_to_safetensors(src, out, consume=consume,
                               alignment=8 if alignment == 16 else alignment,
                               dry_run=dry_run, window=window, progress=progress)


def _ptd_to_safetensors(src: str, out: str, *, consume: bool, alignment: int, dry_run: bool,
                        window: int, progress: ProgressCallback | None) -> SaveReport:
    from filecord.executorch.ptd import read_ptd

    ptd = read_ptd(src)
    whole = FileBackedData(src, owned=consume)
    try:
        tensors = []
        for e in ptd.entries.values():
            if e.layout is None:
                raise UnrepresentableError(f"{e.key!r}: the entry has no tensor layout")
            if e.layout.dim_order != tuple(range(len(e.layout.sizes))):
                raise UnrepresentableError(
                    f"{e.key!r}: dim order {e.layout.dim_order} is not contiguous")
            code = safetensors_dtype_of(e.key, e.layout.scalar_type)
            data = e.data
            if not isinstance(data, FileBackedData):  # pragma: no cover - read_ptd makes ranges
                raise TypeError(f"{e.key!r}: expected file-backed data")
            piece = whole.slice(data.offset, len(data))
            try:
                tensors.append(NamedTensor(e.key, code, e.layout.sizes, piece))
            except ValueError as exc:
                raise UnrepresentableError(str(exc)) from None
        cord = build_file(tensors, None, alignment=alignment, wholes=[whole])
        if dry_run:
            return plan(out, cord, consume=consume, window=window)
        return save(out, cord, consume=consume, window=window, progress=progress)
    finally:
        whole.detach_cleanup()
