"""Stream torch tensors into owned files, host memory bounded by one chunk.

Theory of operation
-------------------
Each tensor's bytes go straight from its own memory to the file: a CPU tensor is viewed as
bytes (``view(torch.uint8)`` then numpy's buffer, no copy, every dtype including bfloat16 and
float8), and a CUDA tensor is copied device-to-host one chunk at a time through one reusable
pinned buffer, never ``.cpu()`` as a whole.  The sha256 of each tensor is computed from the same
chunks as they are written, so deduplication never re-reads the file.

Files are created ``O_CREAT|O_EXCL`` in the chosen directory and owned by the returned
``FileBackedData`` (deleted when the last piece is dropped, or moved by a consuming save).  The
file is not fsynced here: it is a private scratch file, and the save that consumes it syncs
the output before it shortens the file.  A crash leaves a ``.NAME.TOKEN.tensors`` file, garbage.

Byte order of a tensor (the documented rule for non-contiguous tensors):

* a *dense* tensor (its strides are a permutation of a packed layout: contiguous,
  channels-last, a transpose) is written in its memory order, and that order is reported as
  ``dim_order`` (``(0, 1, ...)`` for contiguous, ``(0, 2, 3, 1)`` for channels-last);
* any other view (gaps or overlaps: slicing with steps, ``expand``) is written in logical
  row-major order, a bounded sub-block at a time, and reported with the identity dim order.
  The whole underlying storage is never written.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from filecord import _sys
from filecord._cord import Cord
from filecord._data import CHUNK, FileBackedData
from filecord._facts import kernel_path

if TYPE_CHECKING:
    from filecord._report import SaveReport
    from filecord.executorch.program import Program
    from filecord.executorch.pte import PteFile
    from filecord.executorch.values import TensorLayout

DeviceCopy = Callable[[Any, Any], None]  # (device uint8 slice, pinned host uint8 slice)


@dataclass(frozen=True)
class TensorBlob:
    """Where one tensor's bytes were written, and how to read them back."""

    key: str
    data: FileBackedData
    dtype: torch.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    sha256: str


def dense_dim_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dim order in which ``t`` is packed without gaps, or None if it is not dense."""
    if t.is_contiguous():
        return tuple(range(t.dim()))
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return (0, 2, 3, 1)
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return (0, 2, 3, 4, 1)
    strides = t.stride()
    dims = sorted(range(t.dim()), key=lambda d: (-strides[d], d))
    expected = 1
    for d in reversed(dims):
        if t.size(d) != 1 and strides[d] != expected:
            return None
        expected *= t.size(d)
    return tuple(dims)


def _host_view(flat: torch.Tensor) -> memoryview:
    """A contiguous 1-D uint8 CPU tensor as a flat byte view, no copy."""
    array: Any = flat.numpy()  # numpy's buffer protocol; typed loosely by numpy's stubs
    return memoryview(array).cast("B")


def _blocks(t: torch.Tensor, limit: int) -> Iterator[torch.Tensor]:
    """Contiguous copies of ``t``'s sub-blocks in row-major order, each about ``limit`` bytes."""
    item = t.element_size()
    if t.is_contiguous() or t.numel() * item <= limit:
        yield t.contiguous()
        return
    if t.dim() == 1:
        step = max(1, limit // item)
        for start in range(0, t.numel(), step):
            yield t[start : start + step].contiguous()
        return
    row_bytes = item * (t.numel() // t.size(0))
    if row_bytes > limit:
        for i in range(t.size(0)):
            yield from _blocks(t[i], limit)
        return
    rows = max(1, limit // row_bytes)
    for start in range(0, t.size(0), rows):
        yield t[start : start + rows].contiguous()


def _chunks(t: torch.Tensor, chunk: int, device_copy: DeviceCopy | None) -> Iterator[memoryview]:
    """The tensor's bytes in file order, one bounded chunk at a time."""
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()  # lazy-bit views: materialized once (documented)
    order = dense_dim_order(t)
    pieces: Iterable[torch.Tensor] = (
        [t.permute(order) if order else t] if order is not None else _blocks(t, chunk)
    )
    on_host = t.device.type == "cpu" and device_copy is None
    pinned: torch.Tensor | None = None
    for piece in pieces:
        if piece.numel() == 0:
            continue
        flat = piece.reshape(-1).view(torch.uint8)  # piece is contiguous: no copy
        if on_host:
            view = _host_view(flat)
            for start in range(0, len(view), chunk):
                yield view[start : start + chunk]
            continue
        if pinned is None:
            pinned = torch.empty(
                min(chunk, flat.numel()), dtype=torch.uint8, pin_memory=torch.cuda.is_available()
            )
        copy = device_copy or _cuda_copy
        for start in range(0, flat.numel(), pinned.numel()):
            n = min(pinned.numel(), flat.numel() - start)
            copy(flat[start : start + n], pinned[:n])
            yield _host_view(pinned[:n])


def _cuda_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=False)  # synchronous: the buffer is reused right after


def _tensor_items(
    tensors: Mapping[str, torch.Tensor] | Sequence[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    seen: set[str] = set()
    for key, t in items:
        if key in seen:
            raise ValueError(f"tensor key {key!r} appears twice")
        seen.add(key)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{key!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.is_quantized or t.layout != torch.strided:
            raise ValueError(f"{key!r}: only plain strided tensors can be written ({t.layout})")
    return items


def _new_file(directory: str, stem: str) -> tuple[str, int]:
    path = os.path.join(directory, f".{stem}.{secrets.token_hex(6)}.tensors")
    return path, _sys.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)


def write_tensors(
    tensors: Mapping[str, torch.Tensor] | Sequence[tuple[str, torch.Tensor]],
    directory: str | os.PathLike[str],
    *,
    alignment: int = 1,
    per_file: bool = False,
    chunk: int = CHUNK,
    device_copy: DeviceCopy | None = None,
    stem: str = "filecord",
) -> dict[str, TensorBlob]:
    """Write tensors into owned file(s) in ``directory``; one :class:`TensorBlob` per key.

    ``alignment`` pads between tensors inside one file.  A consuming save moves a file only if
    its ranges are gap-free, so keep the default 1 (or ``per_file=True``) when the blobs will
    be saved with ``consume=True``; the output format applies its own alignment anyway.
    ``device_copy`` replaces the device-to-host copy (tests drive the CUDA path on CPU with it).
    """
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    items = _tensor_items(tensors)
    d = os.fspath(directory)
    raw: list[tuple[str, torch.Tensor, str, int, int, str, tuple[int, ...]]] = []
    path, fd = ("", -1) if per_file else _new_file(d, stem)
    files: list[str] = [] if per_file else [path]
    offset = 0
    try:
        for key, t in items:
            if per_file:
                path, fd = _new_file(d, stem)
                files.append(path)
                offset = 0
            offset = -(-offset // alignment) * alignment
            h = hashlib.sha256()
            start = offset
            for view in _chunks(t, chunk, device_copy):
                h.update(view)
                _sys.write_all(fd, view, offset)
                offset += len(view)
            order = dense_dim_order(t)
            dims = order if order is not None else tuple(range(t.dim()))
            raw.append((key, t, path, start, offset - start, h.hexdigest(), dims))
            if per_file:
                _sys.close(fd)
                fd = -1
    except BaseException:
        if fd >= 0:
            _sys.close(fd)
        for f in files:
            _sys.unlink_missing_ok(f)
        raise
    if fd >= 0:
        _sys.close(fd)
    return _adopt(raw)


def _adopt(
    raw: list[tuple[str, torch.Tensor, str, int, int, str, tuple[int, ...]]],
) -> dict[str, TensorBlob]:
    owners: dict[str, FileBackedData] = {}
    out: dict[str, TensorBlob] = {}
    for key, t, path, start, length, digest, dims in raw:
        if path not in owners:
            owners[path] = FileBackedData._scratch(path)
        whole = owners[path]
        # An empty tensor after the last byte may sit past the end (alignment): clamp it.
        data = whole.slice(min(start, len(whole)), length, sha256=digest)
        out[key] = TensorBlob(key, data, t.dtype, tuple(t.shape), dims, digest)
    return out


# --- ExecuTorch data files -----------------------------------------------------------------

_SCALAR_TYPES = {
    "bool": "BOOL", "uint8": "BYTE", "int8": "CHAR", "int16": "SHORT", "int32": "INT",
    "int64": "LONG", "float16": "HALF", "float32": "FLOAT", "float64": "DOUBLE",
    "bfloat16": "BFLOAT16", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "float8_e5m2": "FLOAT8E5M2", "float8_e4m3fn": "FLOAT8E4M3FN",
    "float8_e5m2fnuz": "FLOAT8E5M2FNUZ", "float8_e4m3fnuz": "FLOAT8E4M3FNUZ",
}


def layout_of(blob: TensorBlob) -> TensorLayout:
    """The ExecuTorch TensorLayout of a written tensor (scalar type, sizes, dim order)."""
    return _layout(blob.key, blob.dtype, blob.sizes, blob.dim_order)


def _layout(
    key: str, dtype: torch.dtype, sizes: tuple[int, ...], dim_order: tuple[int, ...]
) -> TensorLayout:
    from filecord.executorch.values import ScalarType, TensorLayout

    name = str(dtype).removeprefix("torch.")
    if name not in _SCALAR_TYPES:
        raise ValueError(f"{key!r}: dtype {dtype} has no ExecuTorch scalar type")
    return TensorLayout(ScalarType[_SCALAR_TYPES[name]], sizes, dim_order)


def _view_identity(t: torch.Tensor) -> tuple[object, ...]:
    # Two keys naming the very same view (tied weights) are written once and stored once.
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype,
            tuple(t.shape), t.stride())


def save_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    *,
    consume: bool = False,
    alignment: int = 16,
    segment_alignment: int = 128,
    window: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SaveReport:
    """Write ``state_dict`` as an ExecuTorch ``.ptd``: one entry per key, with its layout.

    The whole file is first written into one owned scratch file beside ``path``: the header
    and padding from the layout (which depends only on the keys, sizes and layouts), each
    tensor's bytes streamed from its memory to its final offset (host memory: one chunk).  With
    ``consume=True`` the save then adopts that file by rename, so every byte is written once;
    without it (the default, as everywhere in filecord) the scratch is copied and deleted, so
    the data is written twice and held twice on disk at the peak.  Only filecord's own scratch
    file is ever consumed here: the tensors are never changed.  Keys are used as they are.
    For a program's data file use :func:`save_external_data`, which takes the keys from the
    program itself: ``model.state_dict()`` leaves out non-persistent buffers (a Hugging Face
    Llama's ``rotary_emb.inv_freq``) that such a program may need.  Tied weights (the same
    view under two keys) are stored once.
    """
    from filecord._plan import DEFAULT_WINDOW
    from filecord._save import save

    target = os.fspath(path)
    directory = os.path.dirname(kernel_path(target))  # beside the file ``open()`` would name
    firsts: dict[tuple[object, ...], str] = {}
    alias: dict[str, str] = {}
    unique: list[tuple[str, torch.Tensor]] = []
    for key, t in _tensor_items(state_dict):
        ident = _view_identity(t)
        if ident in firsts:
            alias[key] = firsts[ident]
        else:
            firsts[ident] = key
            unique.append((key, t))
    stem = os.path.basename(target)
    layouts = {
        key: _layout(key, t.dtype, tuple(t.shape), dense_dim_order(t) or tuple(range(t.dim())))
        for key, t in unique
    }
    cord, where = _ptd_skeleton(
        [(k, t.numel() * t.element_size()) for k, t in unique],
        [(k, alias.get(k, k), layouts[alias.get(k, k)]) for k in state_dict],
        directory, stem, alignment=alignment, segment_alignment=segment_alignment,
    )
    scratch = _write_ptd(cord, where, unique, directory, stem)
    try:
        report = save(target, Cord([scratch]), consume=consume, window=window or DEFAULT_WINDOW,
                      progress=progress)
    except BaseException as exc:
        # Rolled back in full (no journal left): the scratch is only a copy of the tensors.
        # close() deletes it only if it is still exactly the file written above.
        if getattr(exc, "journal_path", None) is None:
            scratch.close()
        raise
    scratch.close()  # copied (consume=False): ours alone, and nobody else's bytes
    return report


def module_tensors(
    module: torch.nn.Module, keys: Iterable[str]
) -> dict[str, torch.Tensor]:
    """``keys`` looked up in ``module``'s parameters and buffers, non-persistent buffers
    included (``state_dict()`` leaves those out), detached.  Raises ``KeyError`` naming every
    key the module does not have."""
    named: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    wanted = list(keys)
    absent = [k for k in wanted if k not in named]
    if absent:
        shown = ", ".join(repr(k) for k in absent[:8]) + (
            f" and {len(absent) - 8} more" if len(absent) > 8 else ""
        )
        raise KeyError(
            f"{len(absent)} key(s) the program needs are not parameters or buffers of the "
            f"module: {shown}"
        )
    return {k: named[k].detach() for k in wanted}


def save_external_data(
    module: torch.nn.Module,
    program: str | os.PathLike[str] | PteFile | Program,
    path: str | os.PathLike[str],
    *,
    consume: bool = False,
    alignment: int = 16,
    segment_alignment: int = 128,
    window: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SaveReport:
    """Write the data file of a program exported with ``external_constants=...``: every
    tensor the program loads from a data file (:func:`filecord.executorch.external_tensors`),
    taken from ``module``'s parameters and buffers, streamed as :func:`save_state_dict` does.

    The keys and the layouts come from the program, not from ``module.state_dict()``, which
    leaves out non-persistent buffers.  Each tensor's dtype, shape and dim order must equal the
    program's layout (``ValueError`` otherwise), so a module that differs from the exported one
    is refused before anything is written.  Weights a delegate transformed (XNNPACK packs and
    keys them by a hash) are not the module's tensors: they come only from the export itself
    (``filecord.executorch.save(manager, ...)``).
    """
    from filecord.executorch import external_tensors

    layouts = external_tensors(program)
    tensors = module_tensors(module, layouts)
    for key, want in layouts.items():
        t = tensors[key]
        got = _layout(key, t.dtype, tuple(t.shape), dense_dim_order(t) or tuple(range(t.dim())))
        if got != want:
            raise ValueError(
                f"{key!r}: the module's tensor is {got.scalar_type.name}{list(got.sizes)} "
                f"dim_order {list(got.dim_order)}, the program's is "
                f"{want.scalar_type.name}{list(want.sizes)} dim_order {list(want.dim_order)}"
            )
    return save_state_dict(
        tensors, path, consume=consume, alignment=alignment,
        segment_alignment=segment_alignment, window=window, progress=progress,
    )


def _ptd_skeleton(
    sizes: list[tuple[str, int]],
    keys: list[tuple[str, str, TensorLayout]],
    directory: str,
    stem: str,
    *,
    alignment: int,
    segment_alignment: int,
) -> tuple[Cord, dict[str, int]]:
    """The ``.ptd``'s layout before any tensor byte exists: its header and padding pieces, and
    the offset at which each tensor's bytes belong.

    ``build_ptd`` needs data of the right lengths, so it is given ranges of a sparse
    placeholder file (no blocks allocated; removed at once): the layout depends only on the
    lengths, the keys and the layouts, never on the bytes.
    """
    from filecord.executorch.ptd import build_ptd
    from filecord.executorch.values import PtdEntry

    path, fd = _new_file(directory, stem + ".layout")
    try:
        _sys.ftruncate(fd, sum(n for _k, n in sizes))
        _sys.close(fd)
        fd = -1
        whole = FileBackedData(path)
        slices: dict[str, FileBackedData] = {}
        start = 0
        for key, n in sizes:
            slices[key] = whole.slice(start, n)
            start += n
        entries = {k: PtdEntry(k, slices[src], layout, alignment) for k, src, layout in keys}
        cord = build_ptd(entries, segment_alignment=segment_alignment)
    finally:
        if fd >= 0:
            _sys.close(fd)
        _sys.unlink_missing_ok(path)
    owner = {id(d): k for k, d in slices.items()}
    where: dict[str, int] = {}
    pos = 0
    for piece in cord.pieces:
        if isinstance(piece, FileBackedData) and id(piece) in owner:
            where[owner[id(piece)]] = pos
        pos += len(piece)
    return cord, where


def _write_ptd(
    skeleton: Cord,
    where: dict[str, int],
    tensors: list[tuple[str, torch.Tensor]],
    directory: str,
    stem: str,
) -> FileBackedData:
    """Write the whole ``.ptd`` into one owned scratch file: header and padding from the
    skeleton, each tensor's bytes streamed to its final offset (a consuming save then adopts
    the file by rename, so every byte is written exactly once)."""
    path, fd = _new_file(directory, stem)
    try:
        pos = 0
        for piece in skeleton.pieces:
            if not isinstance(piece, FileBackedData):
                _sys.write_all(fd, piece, pos)
            pos += len(piece)
        for key, t in tensors:
            offset = where[key]
            for view in _chunks(t, CHUNK, None):
                _sys.write_all(fd, view, offset)
                offset += len(view)
        _sys.ftruncate(fd, pos)
    except BaseException:
        _sys.close(fd)
        _sys.unlink_missing_ok(path)
        raise
    _sys.close(fd)
    return FileBackedData._scratch(path)

