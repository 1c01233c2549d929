"""``torch.distributed.checkpoint`` into safetensors: one file (or hub shards) from N ranks.

``SafetensorsWriter`` makes ``dcp.save`` write the file ``filecord.safetensors.save_file`` (or
``save_sharded``) would write for the full state dict, every rank writing its own bytes at their
final offsets on a shared file system, committed by one filecord transaction.
``SafetensorsReader`` loads one file or an index into any placement.  ``save`` wraps
``dcp.save`` and removes the temps of a failed save; ``consolidate`` turns the per-rank shards
of torch's ``HuggingFaceStorageWriter`` into one file by byte ranges (moved with
``consume=True``).  The writer, the reader and ``save`` import torch when first used;
``consolidate`` needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from filecord.dcp._consolidate import consolidate
from filecord.dcp.errors import DcpError, ShardSetError, TilingError, UnsupportedStateError

if TYPE_CHECKING:
    from filecord.dcp._reader import SafetensorsReader
    from filecord.dcp._save import save
    from filecord.dcp._writer import SafetensorsWriter

_LAZY = {"SafetensorsWriter": "_writer", "SafetensorsReader": "_reader", "save": "_save"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'filecord.dcp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"filecord.dcp.{module}"), name)


__all__ = [
    "SafetensorsWriter",
    "SafetensorsReader",
    "save",
    "consolidate",
    "DcpError",
    "TilingError",
    "UnsupportedStateError",
    "ShardSetError",
]
