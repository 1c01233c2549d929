"""Tensors from what conversion scripts hold: numpy arrays, torch tensors, bytes, file ranges.

Each becomes ``(ggml type, dims, bytes)`` exactly as gguf-py's ``add_tensor`` reads a numpy
array (found by differential tests): the type from the dtype (F16, F32, F64, I8-I64; torch adds
BF16), or ``raw_dtype`` when given, in which case a uint8 array's last dim counts bytes and is
turned into elements; the shape from ``raw_shape`` or the array; dims reversed; bytes in C
order.  In-memory data is viewed, not copied, unless the array is not C-contiguous.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from filecord._pieces.data import FileBackedData
from filecord.gguf._types import BLOCKS, GGMLType, GGUFTensor
from filecord.gguf.errors import UnrepresentableError
from filecord.tensors import TensorBytes

_NUMPY = {"float16": GGMLType.F16, "float32": GGMLType.F32, "float64": GGMLType.F64,
          "int8": GGMLType.I8, "int16": GGMLType.I16, "int32": GGMLType.I32,
          "int64": GGMLType.I64}
_TORCH = {**_NUMPY, "bfloat16": GGMLType.BF16}


def ggml_type(raw: object) -> GGMLType:
    """Our :class:`GGMLType` from ours, gguf-py's ``GGMLQuantizationType`` or an int id."""
    try:
        return GGMLType(int(raw))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"{raw!r} is not a ggml type") from None


def _is_torch(x: object) -> bool:
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def _is_numpy(x: object) -> bool:
    mod = sys.modules.get("numpy")
    return mod is not None and isinstance(x, mod.ndarray)


def _byte_dims(name: str, shape: Sequence[int], t: GGMLType) -> tuple[int, ...]:
    blck, size = BLOCKS[t]
    if not shape or shape[-1] % size:
        raise ValueError(f"{name!r}: a byte shape {list(shape)} must end in whole {t.name} "
                         f"blocks of {size} bytes")
    return tuple(reversed([*shape[:-1], shape[-1] // size * blck]))


def _numpy_view(name: str, arr: Any) -> tuple[str, memoryview]:
    import numpy as np

    if not arr.dtype.isnative:
        raise UnrepresentableError(f"{name!r}: {arr.dtype} is not in native byte order")
    flat = np.ascontiguousarray(arr).reshape(-1)
    view: Any = flat.view(np.uint8)  # numpy's buffer protocol, typed loosely by its stubs
    return arr.dtype.name, memoryview(view)


def _torch_view(name: str, t: Any) -> tuple[str, memoryview]:
    import torch

    if t.layout != torch.strided or t.is_quantized:
        raise UnrepresentableError(f"{name!r}: only plain strided tensors can be written")
    flat = t.detach().cpu().contiguous().reshape(-1)
    return str(t.dtype).removeprefix("torch."), memoryview(flat.view(torch.uint8).numpy())


def to_tensor(name: str, data: object, raw_shape: Sequence[int] | None = None,
              raw_dtype: object = None) -> GGUFTensor:
    """A :class:`GGUFTensor` from an array, a torch tensor, bytes or a file range."""
    rt = None if raw_dtype is None else ggml_type(raw_dtype)
    np_mod = sys.modules.get("numpy")
    if np_mod is not None and isinstance(data, np_mod.generic):  # a 0-d result of numpy
        data = np_mod.asarray(data)
    if _is_numpy(data) or _is_torch(data):
        kind, view = (_torch_view if _is_torch(data) else _numpy_view)(name, data)
        table = _TORCH if _is_torch(data) else _NUMPY
        shape = tuple(int(s) for s in (raw_shape if raw_shape is not None
                                       else data.shape))  # type: ignore[attr-defined]
        if rt is None:
            if kind not in table:
                raise UnrepresentableError(
                    f"{name!r}: {kind} has no GGUF type (F16, F32, F64, I8-I64"
                    f"{', BF16' if table is _TORCH else ''}); give raw_dtype")
            return GGUFTensor(name, table[kind], tuple(reversed(shape)), view)
        dims = _byte_dims(name, shape, rt) if kind == "uint8" else tuple(reversed(shape))
        return GGUFTensor(name, rt, dims, view)
    if isinstance(data, (bytes, bytearray, memoryview, FileBackedData)):
        if rt is None or raw_shape is None:
            raise ValueError(f"{name!r}: raw bytes need raw_shape and raw_dtype")
        payload: TensorBytes = bytes(data) if isinstance(data, bytearray) else data
        return GGUFTensor(name, rt, tuple(reversed([int(s) for s in raw_shape])), payload)
    raise TypeError(f"{name!r}: a tensor must be a numpy array, a torch tensor, bytes or "
                    f"FileBackedData, not {type(data).__name__}")
