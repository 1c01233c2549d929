"""Clean-room safetensors: read to file-backed ranges, write, shard, merge, split and convert.

Reading (``read_safetensors``) validates the header strictly and never loads a tensor.
Writing goes through the save transaction (atomic, durable, ``consume`` moves owned bytes):
``save_file`` and ``save_sharded`` are byte-identical to ``safetensors.torch.save_file`` and
``huggingface_hub.save_torch_state_dict`` (they need torch; imported lazily), ``build_file``
makes a Cord from named tensors, ``load_mapped`` maps a checkpoint's tensors for torch without
reading them (needs torch), and ``merge``/``reshard``/``convert`` rewrite checkpoints from
their files without loading them.  Header tools (``parse_header``, ``encode_header``, ...)
are implementation (``_format``); every error class is in :mod:`filecord.safetensors.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from filecord.safetensors._ops import convert, merge, reshard
from filecord.safetensors._read import SafetensorsFile, SafetensorsIndex, read_safetensors
from filecord.safetensors._write import build_file
from filecord.tensors import DType, NamedTensor

if TYPE_CHECKING:
    from filecord.safetensors._torch import load_mapped, save_file, save_sharded


def __getattr__(name: str) -> Any:
    if name in ("save_file", "save_sharded", "load_mapped"):  # they import torch when used
        from filecord.safetensors import _torch

        return getattr(_torch, name)
    raise AttributeError(f"module 'filecord.safetensors' has no attribute {name!r}")


__all__ = [
    # reading
    "read_safetensors",
    "SafetensorsFile",
    "SafetensorsIndex",
    "load_mapped",
    # writing
    "save_file",
    "save_sharded",
    "build_file",
    # rewriting checkpoints
    "merge",
    "reshard",
    "convert",
    # values
    "DType",
    "NamedTensor",
]
