"""Stream torch tensors into owned files, host memory bounded by one chunk (no file format here:
the ExecuTorch and safetensors writers build on this module).

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
from typing import Any

import torch

from filecord._io import syscalls as _sys
from filecord._pieces.data import CHUNK, FileBackedData

DeviceCopy = Callable[[Any, Any], None]  # (device uint8 slice, pinned host uint8 slice)


@dataclass(frozen=True, slots=True)
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


def host_view(flat: torch.Tensor) -> memoryview:
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


def row_major_blocks(t: torch.Tensor, limit: int) -> Iterator[torch.Tensor]:
    """``t`` in logical row-major order as contiguous host tensors of about ``limit`` bytes
    (bounded staging for a view or an off-host tensor; a contiguous host tensor is itself)."""
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.device.type != "cpu" and t.is_contiguous():  # never the whole tensor on the host
        flat = t.reshape(-1)
        step = max(1, limit // t.element_size())
        for start in range(0, flat.numel(), step):
            yield flat[start : start + step].to("cpu")
        return
    for block in _blocks(t, limit):
        yield block if block.device.type == "cpu" else block.to("cpu")


def chunks(t: torch.Tensor, chunk: int, device_copy: DeviceCopy | None) -> Iterator[memoryview]:
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
            view = host_view(flat)
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
            yield host_view(pinned[:n])


def _cuda_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=False)  # synchronous: the buffer is reused right after


def tensor_items(
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


def new_file(directory: str, stem: str) -> tuple[str, int]:
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
    items = tensor_items(tensors)
    d = os.fspath(directory)
    raw: list[tuple[str, torch.Tensor, str, int, int, str, tuple[int, ...]]] = []
    path, fd = ("", -1) if per_file else new_file(d, stem)
    files: list[str] = [] if per_file else [path]
    offset = 0
    try:
        for key, t in items:
            if per_file:
                path, fd = new_file(d, stem)
                files.append(path)
                offset = 0
            offset = -(-offset // alignment) * alignment
            h = hashlib.sha256()
            start = offset
            for view in chunks(t, chunk, device_copy):
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
