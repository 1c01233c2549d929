"""``save_file`` and ``save_sharded`` for torch state dicts: drop-in, streamed, atomic, durable.

Theory of operation
-------------------
A CPU tensor's bytes enter the Cord as a view of its own memory (no copy); the save writes it
into a temp file beside the target, fsyncs, renames and fsyncs the directory, so host memory
beyond the tensors stays at one chunk.  A tensor on another device is first streamed through
one pinned chunk into an owned scratch file beside the target (``_torch_stream``), which the
save then moves into the output.  The temp gets the mode a new file would get from ``open()``
(or the replaced file's mode), not 0600.

Byte identity with ``safetensors.torch.save_file`` and ``huggingface_hub.save_torch_state_dict``
comes from the layout rules in ``_format`` and the sharing rules below, each found by
differential tests against the installed packages.  Deliberate differences: ``safetensors``
writes ``__metadata__`` from a hash map, so with two or more metadata keys its key order varies
from run to run (we keep the order given); it writes the memory of a lazily conjugated or
negated view, not its value (we write the value).

``load_mapped`` goes the other way: every tensor of a checkpoint as a storage of its own over
its bytes in a copy-on-write mapping of its file (one mapping per file, pages read when
touched), so a model can be loaded (``load_state_dict(..., assign=True)``) and exported under
``filecord.executorch.lean_export`` without its weights ever being read into memory: the
export's save finds each weight's storage in that mapping and copies the file's range by the
kernel.

Argument order: these two are drop-ins, so they keep the order of the functions they mirror
(``save_file(tensors, filename)``, ``save_sharded(state_dict, save_directory)``), unlike
filecord's own writers, which take the destination first (``filecord.save(path, cord)``).
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from filecord._io import syscalls as _sys
from filecord._io.paths import make_directories, remove_empty
from filecord._kit.operation import ProgressCallback
from filecord._kit.torch_stream import host_view, write_tensors
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import save, save_many
from filecord.safetensors._write import (
    build_file,
    index_name,
    plan_shards,
    remove_files,
    stale_files,
)
from filecord.safetensors.errors import SharedTensorsError
from filecord.tensors import DType, NamedTensor

_DTYPES: dict[str, DType] = {
    "bool": DType.BOOL, "uint8": DType.U8, "int8": DType.I8, "int16": DType.I16,
    "uint16": DType.U16, "int32": DType.I32, "uint32": DType.U32, "int64": DType.I64,
    "uint64": DType.U64, "float16": DType.F16, "bfloat16": DType.BF16, "float32": DType.F32,
    "float64": DType.F64, "complex64": DType.C64, "float8_e5m2": DType.F8_E5M2,
    "float8_e4m3fn": DType.F8_E4M3, "float8_e5m2fnuz": DType.F8_E5M2FNUZ,
    "float8_e4m3fnuz": DType.F8_E4M3FNUZ, "float8_e8m0fnu": DType.F8_E8M0,
    "float4_e2m1fn_x2": DType.F4,
}


def dtype_of(t: torch.Tensor, name: str) -> DType:
    code = _DTYPES.get(str(t.dtype).removeprefix("torch."))
    if code is None:
        raise ValueError(f"{name!r}: safetensors has no dtype for {t.dtype}")
    return code


def torch_dtype(code: DType) -> Any:
    """The torch dtype of a safetensors dtype (``None`` when this torch has none)."""
    for name, d in _DTYPES.items():
        if d is code:
            return getattr(torch, name, None)
    return None


def load_mapped(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint, memory-mapped (see the module docstring).

    ``path`` is a ``.safetensors`` file, a sharded checkpoint's ``*.index.json``, or a folder
    holding either (``model.safetensors.index.json``, else ``model.safetensors``).  Headers are
    validated as :func:`~filecord.safetensors.read_safetensors` validates them.  Writing to a
    returned tensor changes only this process's copy of the page, never the file.
    """
    from filecord.safetensors._read import SafetensorsFile, checkpoint_in, read_safetensors

    p = os.fspath(path)
    if _sys.isdir(p):
        found = checkpoint_in(p)
        if found is None:
            raise FileNotFoundError(
                f"{p}: no model.safetensors.index.json or model.safetensors in this folder")
        p = found
    checkpoint = read_safetensors(p)
    files = [checkpoint] if isinstance(checkpoint, SafetensorsFile) else list(checkpoint.shards)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        mapping = _mapping(f.path, f.file_size)
        for name, t in f.tensors.items():
            out[name] = _typed_view(mapping, t, f.path)
    return out


def _mapping(path: str, size: int) -> Any:
    if size == 0:
        return None
    fd = _sys.open(path, os.O_RDONLY)
    try:
        return _sys.map_private(fd, size)
    finally:
        _sys.close(fd)  # the mapping keeps the file open


def _typed_view(mapping: Any, t: NamedTensor, path: str) -> torch.Tensor:
    """``t`` as a tensor with a storage of its own: exactly its bytes of ``mapping`` (torch
    treats a storage as a weight's extent, so a view into one whole-file storage would not do)."""
    dtype = torch_dtype(t.dtype)
    if dtype is None:
        raise ValueError(f"{path}: {t.name!r} is {t.dtype.value}, which this torch cannot hold")
    shape = list(t.shape)
    if t.dtype is DType.F4:  # two values per torch element
        shape[-1] //= 2
    if t.nbytes == 0 or mapping is None:
        return torch.empty(shape, dtype=dtype)
    data = t.data
    start = data.offset if isinstance(data, FileBackedData) else 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    with warnings.catch_warnings():  # a copy-on-write map is writable: torch's warning is moot
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mapping, dtype=dtype, count=t.nbytes // itemsize, offset=start)
    return flat.view(shape)


def _shape(t: torch.Tensor, code: DType, name: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in t.shape)
    if code is DType.F4:  # torch packs two F4 values per element; the header counts values
        if not shape:
            raise ValueError(f"{name!r}: a 0-d float4_e2m1fn_x2 tensor holds half a byte pair")
        shape = (*shape[:-1], shape[-1] * 2)
    return shape


def _checked(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    items = list(tensors.items())
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.layout != torch.strided or t.is_quantized:
            raise ValueError(f"{name!r}: only dense strided tensors can be saved ({t.layout})")
        if not t.is_contiguous():
            raise ValueError(f"{name!r} is not contiguous: call .contiguous() before saving "
                             f"(views of one tensor are better saved whole)")
    _refuse_shared(items)
    return items


def _refuse_shared(items: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Tensors whose bytes overlap in one storage cannot be saved (as ``safetensors`` says)."""
    spans: dict[tuple[object, int], list[tuple[int, int, str]]] = {}
    for name, t in items:
        n = int(t.numel()) * t.element_size()
        if n == 0:
            continue
        start = int(t.storage_offset()) * t.element_size()
        key = (t.device, t.untyped_storage().data_ptr())
        spans.setdefault(key, []).append((start, start + n, name))
    for group in spans.values():
        group.sort()
        for (_a, end, first), (start, _b, second) in itertools.pairwise(group):
            if start < end:
                raise SharedTensorsError(
                    f"tensors {first!r} and {second!r} share memory; save one of them (or "
                    f"clone one) so that each byte is stored once")


def _on_host(t: torch.Tensor) -> bool:
    return bool(t.device.type == "cpu")


def _named(items: Sequence[tuple[str, torch.Tensor]], directory: str) -> list[NamedTensor]:
    out: list[NamedTensor] = []
    off_host = [(n, t) for n, t in items if not _on_host(t)]
    blobs = write_tensors(off_host, directory, per_file=False, stem="safetensors") if off_host \
        else {}
    for name, t in items:
        code = dtype_of(t, name)
        shape = _shape(t, code, name)
        if t.is_conj() or t.is_neg():  # lazy views: their memory is not their value
            t = t.resolve_conj().resolve_neg()
        blob = blobs.get(name)
        if blob is not None:
            out.append(NamedTensor(name, code, shape, blob.data))
            continue
        flat = t.detach().reshape(-1).view(torch.uint8)
        out.append(NamedTensor(name, code, shape, host_view(flat) if flat.numel() else b""))
    return out


def save_file(
    tensors: Mapping[str, torch.Tensor],
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    *,
    alignment: int = 8,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """``safetensors.torch.save_file`` with the same arguments and the same bytes, saved the
    filecord way: streamed from the tensors' memory, atomic, durable, with the mode ``open()``
    would give.

    Raises ``ValueError`` for a non-contiguous tensor or an unsupported dtype and
    :class:`SharedTensorsError` when two tensors overlap in memory, before anything is
    written.  ``alignment=4096`` pads the header so the data starts on a 4 KiB boundary
    (a valid file; no longer byte-identical to ``safetensors``).  A failure leaves the old
    file (if any) in place.
    """
    target = os.fspath(filename)
    directory = os.path.dirname(_sys.abspath(target))
    named = _named(_checked(tensors), directory)
    cord = build_file(named, metadata, alignment=alignment)
    return save(target, cord, consume=True, window=window, progress=progress)


def _storage_key(t: torch.Tensor) -> tuple[object, int] | None:
    if t.untyped_storage().nbytes() == 0:
        return None
    return (t.device, t.untyped_storage().data_ptr())


def _covers(t: torch.Tensor) -> bool:
    s = t.untyped_storage()
    return bool(t.data_ptr() == s.data_ptr() and t.numel() * t.element_size() == s.nbytes())


def drop_shared(
    state_dict: Mapping[str, torch.Tensor], discard: Sequence[str] = ()
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one name per storage, as ``huggingface_hub`` does: among the names whose tensor
    covers the whole storage (minus ``discard``), the first in sorted order; the others are
    recorded as ``{dropped: kept}``.  A storage no name covers is refused."""
    groups: dict[tuple[object, int], list[str]] = {}
    for name, t in state_dict.items():
        key = _storage_key(t)
        if key is not None:
            groups.setdefault(key, []).append(name)
    dropped: dict[str, str] = {}
    for names in groups.values():
        full = sorted(n for n in names if _covers(state_dict[n]) and n not in discard)
        if not full:
            raise SharedTensorsError(
                f"no tensor among {sorted(names)} covers its whole storage: saving would store "
                f"more bytes than the tensors hold; clone the tensors first")
        for n in sorted(names):
            if n != full[0]:
                dropped[n] = full[0]
    kept = {n: t for n, t in state_dict.items() if n not in dropped}
    return kept, dropped


def parse_shard_size(size: int | str) -> int:
    """``5GB`` (decimal), ``5GiB`` (binary) or bytes, as ``huggingface_hub`` reads them."""
    if isinstance(size, int):
        return size
    s = size.strip().upper()
    units = {"TIB": 1 << 40, "GIB": 1 << 30, "MIB": 1 << 20, "KIB": 1 << 10, "TB": 10**12,
             "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    for unit, factor in units.items():
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * factor)
    return int(s)


def save_sharded(
    state_dict: Mapping[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    *,
    filename_pattern: str | None = None,
    force_contiguous: bool = True,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    shared_tensors_to_discard: Sequence[str] | None = None,
    alignment: int = 8,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """``huggingface_hub.save_torch_state_dict`` (safetensors), byte for byte, in ONE transaction.

    Same shard names, shard contents and ``model.safetensors.index.json``; shared tensors
    are dropped the same way (recorded in the metadata).  All shards and the index are
    written by one ``save_many``: old shards and a stale index are replaced at its commit,
    never deleted first; files of the pattern the new checkpoint does not use are removed
    after the commit.  An empty state dict writes nothing.  A missing ``save_directory`` is
    created with its parents (as ``save_pretrained`` and torch's ``FileSystemWriter`` do;
    ``huggingface_hub`` fails on it), and removed again if the save fails.
    """
    directory = os.fspath(save_directory)
    pattern = filename_pattern or "model{suffix}.safetensors"
    limit = parse_shard_size(max_shard_size)
    kept, dropped = drop_shared(state_dict, shared_tensors_to_discard or ())
    if force_contiguous:
        kept = {n: t.contiguous() for n, t in kept.items()}
    if not kept:
        return SaveReport((), (), (), (), consume=False, window=window, dry_run=False)
    named = _named(_checked(kept), _sys.abspath(directory))
    user = dict(metadata or {})
    empties = {n: (t.device, t.untyped_storage().data_ptr()) for n, t in kept.items()
               if t.untyped_storage().nbytes() == 0}
    outputs = plan_shards(
        named, directory, storage=empties, max_shard_size=limit, filename_pattern=pattern,
        shard_metadata={"format": "pt"},
        single_metadata={"format": "pt", **user, **dropped},
        index_metadata={**user, **dropped}, alignment=alignment,
    )
    made = make_directories(directory)  # as save_pretrained and FileSystemWriter do
    try:
        stale = stale_files(directory, pattern, outputs)
        report = save_many(outputs, consume=True, window=window, progress=progress)
    except BaseException:
        remove_empty(made)
        raise
    remove_files(stale)
    return report


__all__ = ["save_file", "save_sharded", "index_name", "drop_shared", "parse_shard_size"]
