"""Merge, reshard (split) and convert checkpoints without loading them: file-backed ranges in,
one ``save``/``save_many`` transaction out.

Theory of operation
-------------------
Inputs are read with :func:`read_safetensors` (headers only; tensors are ranges).  With
``consume=True`` they are read as *owned*, so the save moves (or clones) the tensors' bytes out
of them back to front, in sync windows, and deletes them at the commit: a checkpoint that fills
the disk can still be rewritten.  Every operation runs on the kit's skeleton
(:func:`filecord._kit.operation.operate`): deletion rights are given up on the way out, and
after the commit an input ``*.index.json`` is removed only when all of its shards were consumed
(a symlinked, read-only, immutable, hard-linked or other-file-system shard keeps its index), and
nothing that could not be removed turns the committed operation into an error: the report's
``kept`` says what stayed and why.  A crash between the commit and the index's removal leaves
only that index behind.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from filecord._io import syscalls as _sys
from filecord._kit.argorder import (
    input_paths,
    not_an_input,
    output_path,
    require_directory,
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
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.window import DEFAULT_WINDOW
from filecord.safetensors._format import check_pattern
from filecord.safetensors._ptdtypes import safetensors_dtype_of, scalar_type_of
from filecord.safetensors._read import SafetensorsFile, SafetensorsIndex, read_safetensors
from filecord.safetensors._write import build_file, plan_shards, stale_files
from filecord.safetensors.errors import DuplicateTensorError, UnrepresentableError
from filecord.tensors import NamedTensor

if TYPE_CHECKING:
    from filecord.executorch.ptd import PtdFile


@dataclass(frozen=True, slots=True)
class Loaded:
    """Inputs of one operation: tensors in input order, file metadata, files and indexes."""

    tensors: tuple[NamedTensor, ...]
    metadata: Mapping[str, str] | None
    files: tuple[SafetensorsFile, ...]
    indexes: tuple[Index, ...]

    @property
    def wholes(self) -> list[FileBackedData]:
        return [f.whole for f in self.files]

    def dropped(self, carried: Mapping[str, str], *, ignore: tuple[str, ...] = ()
                ) -> tuple[str, ...]:
        """The files with a ``__metadata__`` entry the output's ``carried`` metadata does not
        hold (overridden by a later input, replaced by the caller's, or a format without
        metadata): a consuming operation must copy and keep them, never delete them."""
        return tuple(f.path for f in self.files if any(
            k not in ignore and carried.get(k) != v for k, v in (f.metadata or {}).items()))


def load(paths: Paths, *, owned: bool) -> Loaded:
    """Read every input (files or indexes); names must be unique across them."""
    tensors: dict[str, NamedTensor] = {}
    where: dict[str, str] = {}
    metadata: dict[str, str] | None = None
    files: list[SafetensorsFile] = []
    indexes: list[Index] = []
    try:
        for path in paths:
            got = read_safetensors(path, owned=owned)
            if isinstance(got, SafetensorsIndex):
                indexes.append(Index(got.path, tuple(f.path for f in got.shards)))
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


def _reader(paths: Paths, *, consume: bool) -> Callable[[], Inputs[Loaded]]:
    def read() -> Inputs[Loaded]:
        loaded = load(paths, owned=consume)
        return Inputs(loaded, tuple(loaded.wholes), loaded.indexes)
    return read


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
    carry: Mapping[str, str] | None = None,
) -> OperationReport:
    """One ``.safetensors`` holding every tensor of ``inputs`` (files and/or ``*.index.json``).

    The output is laid out as ``safetensors.torch.save_file`` would write the same tensors, so
    merging is byte-identical to loading and saving with the packages.  ``metadata`` defaults
    to the union of the inputs' ``__metadata__`` (a later input's value wins).  A name in two
    inputs raises :class:`DuplicateTensorError`.  ``dry_run=True`` returns the plan (per
    piece: moved, cloned or copied, and why) and writes nothing.  The output comes first and
    must end in ``.safetensors``; a call in the old order (inputs first) is refused before
    anything is read.  ``carry`` (destination -> source): other files copied whole by the same
    transaction (a Hugging Face folder's config and tokenizer): in the plan, the space check
    and the commit with the weights, never consumed.
    """
    out = output_path("merge", MERGE, output)
    paths = input_paths("merge", MERGE, inputs)
    require_suffix("merge", MERGE, out, (".safetensors",))
    not_an_input("merge", out, paths, consume=consume)

    def build(loaded: Loaded) -> Job:
        meta = loaded.metadata if metadata is None else dict(metadata)
        cord = build_file(loaded.tensors, meta, alignment=alignment, wholes=loaded.wholes)
        return Job(_carried({out: cord}, carry), uncarried=loaded.dropped(meta or {}))

    return operate(_reader(paths, consume=consume), build, consume=consume, dry_run=dry_run,
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
    carry: Mapping[str, str] | None = None,
) -> OperationReport:
    """Rewrite ``inputs`` as shards of at most ``max_shard_size`` bytes (split one file, or
    reshard a checkpoint), identical to ``huggingface_hub.save_torch_state_dict`` of the same
    tensors in the same order (an index's ``weight_map`` order, else each file's data order)
    with the inputs' metadata.  Shards and index are one transaction; pattern files the new
    checkpoint does not use are removed after it (inputs only when consumed).  The directory
    comes first; one that names a file (or ends in a checkpoint suffix) is refused as the
    old order before anything is read.  ``filename_pattern`` must end in ``.safetensors``: a
    shard's name is then never a non-weight file's (``config.json``), nor such a file an
    obsolete shard.  ``carry``: as for :func:`merge`.
    """
    d = output_path("reshard", RESHARD, directory)
    paths = input_paths("reshard", RESHARD, inputs)
    require_directory("reshard", RESHARD, d)
    check_pattern(filename_pattern)  # before anything is read or written
    if not filename_pattern.endswith(".safetensors"):
        raise ValueError(f"filename_pattern must end in .safetensors: {filename_pattern!r} (a "
                         "shard named like config.json would replace it, or be replaced)")

    def build(loaded: Loaded) -> Job:
        user = {k: v for k, v in (loaded.metadata or {}).items() if k != "format"}
        outputs = (plan_shards(
            loaded.tensors, d, max_shard_size=max_shard_size, filename_pattern=filename_pattern,
            shard_metadata={"format": "pt"}, single_metadata={"format": "pt", **user},
            index_metadata=user, alignment=alignment, wholes=loaded.wholes,
        ))
        # Inputs are never obsolete files (the skeleton drops them): the save decides on them.
        outputs = _carried(outputs, carry)
        return Job(outputs, tuple(stale_files(d, filename_pattern, outputs)),
                   uncarried=loaded.dropped({"format": "pt", **user}))

    return operate(_reader(paths, consume=consume), build, consume=consume, dry_run=dry_run,
                   window=window, progress=progress)


def _carried(outputs: Mapping[Target, CordLike],
             carry: Mapping[str, str] | None) -> dict[Target, CordLike]:
    """``outputs`` and the files ``carry`` copies (destination -> source), one save."""
    both: dict[Target, CordLike] = dict(outputs)
    taken = {_sys.abspath(os.fspath(t)) for t in outputs}
    for dst, src in (carry or {}).items():
        if _sys.abspath(dst) in taken:
            raise ValueError(f"{dst} is both an output and a file carried from {src}")
        both[dst] = Cord([FileBackedData(src)])
    return both


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
) -> OperationReport:
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
    not_an_input("convert", out, [src], consume=consume)
    if not _sys.exists(src):
        raise FileNotFoundError(errno.ENOENT, f"convert: no source {src!r} (arguments go "
                                f"output first: {CONVERT})", src)
    if out.endswith(".ptd"):
        from filecord.executorch.ptd import build_ptd

        def build(loaded: Loaded) -> Job:
            entries = to_ptd_entries(loaded.tensors, alignment)
            cord = build_ptd(entries, segment_alignment=segment_alignment)  # type: ignore[arg-type]
            # A .ptd holds no metadata; "format" is safetensors' own marker, nothing to keep.
            return Job({out: cord}, uncarried=loaded.dropped({}, ignore=("format",)))

        return operate(_reader([src], consume=consume), build, consume=consume,
                       dry_run=dry_run, window=window, progress=progress)
    return _ptd_to_safetensors(src, out, consume=consume,
                               alignment=8 if alignment == 16 else alignment,
                               dry_run=dry_run, window=window, progress=progress)


def _ptd_to_safetensors(src: str, out: str, *, consume: bool, alignment: int, dry_run: bool,
                        window: int, progress: ProgressCallback | None) -> OperationReport:
    from filecord.executorch.ptd import read_ptd

    def read() -> Inputs[tuple[PtdFile, FileBackedData]]:
        ptd = read_ptd(src)
        whole = FileBackedData(src, owned=consume)
        return Inputs((ptd, whole), (whole,))

    def build(value: tuple[PtdFile, FileBackedData]) -> Job:
        ptd, whole = value
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
        return Job({out: build_file(tensors, None, alignment=alignment, wholes=[whole])})

    return operate(read, build, consume=consume, dry_run=dry_run, window=window,
                   progress=progress)
