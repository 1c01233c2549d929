"""The ExecuTorch TensorLayout of a torch tensor, and one tensor streamed into a named blob.

Kept apart from ``_tensors`` (the ``.ptd`` writers) so that ``NamedDataStore.add_tensor`` needs
only this and the streaming core: the store sits below the program and merge modules, which
the writers build on.
"""

from __future__ import annotations

import torch

from filecord._kit.torch_stream import TensorBlob, dense_dim_order, write_tensors
from filecord._pieces.data import FileBackedData
from filecord.executorch.values import ScalarType, TensorLayout

_SCALAR_TYPES = {
    "bool": "BOOL", "uint8": "BYTE", "int8": "CHAR", "int16": "SHORT", "int32": "INT",
    "int64": "LONG", "float16": "HALF", "float32": "FLOAT", "float64": "DOUBLE",
    "bfloat16": "BFLOAT16", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "float8_e5m2": "FLOAT8E5M2", "float8_e4m3fn": "FLOAT8E4M3FN",
    "float8_e5m2fnuz": "FLOAT8E5M2FNUZ", "float8_e4m3fnuz": "FLOAT8E4M3FNUZ",
}


def layout(
    key: str, dtype: torch.dtype, sizes: tuple[int, ...], dim_order: tuple[int, ...]
) -> TensorLayout:
    """The ExecuTorch TensorLayout of a tensor of this dtype, shape and dim order."""
    name = str(dtype).removeprefix("torch.")
    if name not in _SCALAR_TYPES:
        raise ValueError(f"{key!r}: dtype {dtype} has no ExecuTorch scalar type")
    return TensorLayout(ScalarType[_SCALAR_TYPES[name]], sizes, dim_order)


def tensor_layout(key: str, t: torch.Tensor) -> TensorLayout:
    """The layout ``t``'s bytes are written in: its memory order if dense, else row-major."""
    return layout(key, t.dtype, tuple(t.shape), dense_dim_order(t) or tuple(range(t.dim())))


def blob_layout(blob: TensorBlob) -> TensorLayout:
    """The layout of a tensor ``write_tensors`` wrote."""
    return layout(blob.key, blob.dtype, blob.sizes, blob.dim_order)


def tensor_blob(
    key: str, tensor: torch.Tensor, directory: str
) -> tuple[FileBackedData, TensorLayout]:
    """``tensor`` streamed into an owned scratch file in ``directory``, with its layout."""
    blob = write_tensors({key: tensor}, directory, stem="named-data")[key]
    return blob.data, blob_layout(blob)
