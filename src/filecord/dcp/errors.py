"""Errors of ``filecord.dcp``: every one is refused before a byte of the output is written."""

from __future__ import annotations

from filecord.errors import FilecordError, FormatError


class DcpError(FilecordError, ValueError):
    """A distributed save or consolidation that cannot make one safetensors checkpoint."""


class TilingError(DcpError):
    """The chunks of a tensor do not tile it exactly (outside its bounds, overlapping, partial)
    or the ranks disagree on its dtype or shape."""


class UnsupportedStateError(DcpError):
    """A value, dtype or save mode the writer cannot put in a safetensors file (a non-tensor
    value, a dtype safetensors lacks, ``use_collectives=False``, cached plans)."""


class ShardSetError(FormatError, DcpError):
    """Shards given to ``consolidate`` are not one complete save: a rank is missing, a shard is
    left from another save, or a shard's sharding information is malformed."""


__all__ = ["DcpError", "TilingError", "UnsupportedStateError", "ShardSetError"]
