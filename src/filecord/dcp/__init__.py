"""``torch.distributed.checkpoint`` into safetensors: one file (or hub shards) from N ranks.

``SafetensorsWriter`` makes ``dcp.save`` write the file ``filecord.safetensors.save_file`` (or
``save_sharded``) would write for the full state dict, every rank writing its own bytes at their
final offsets on a shared file system, committed by one filecord transaction.
``SafetensorsReader`` loads one file or an index into any placement.  ``save`` wraps
``dcp.save`` and removes the temps of a failed save; ``consolidate`` turns the per-rank shards
of torch's ``HuggingFaceStorageWriter`` into one file by byte ranges (moved with
``consume=True``).  Needs torch.
"""

from __future__ import annotations

from filecord.dcp._consolidate import consolidate
from filecord.dcp._reader import SafetensorsReader
from filecord.dcp._save import save
from filecord.dcp._writer import SafetensorsWriter
from filecord.dcp.errors import DcpError, ShardSetError, TilingError, UnsupportedStateError

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
