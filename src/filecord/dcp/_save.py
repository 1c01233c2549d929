"""``filecord.dcp.save``: ``dcp.save`` with a :class:`SafetensorsWriter`, and its cleanup.

DCP has no abort hook, and the failure it raises on every rank, ``CheckpointException``, is a
``BaseException``: code that catches ``Exception`` misses it.  This wrapper catches everything
on every rank and, on the coordinator (the only rank that creates files), removes the save's
temps and its lock before re-raising, so a failed save leaves the old file and nothing else.
A coordinator that dies cannot clean up: ``filecord recover DIR`` removes its temps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from filecord._plan.report import SaveReport
from filecord.dcp._writer import SafetensorsWriter
from filecord.dcp.errors import UnsupportedStateError
from filecord.errors import add_note


def save(
    state_dict: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    max_shard_size: int | str | None = None,
    metadata: Mapping[str, str] | None = None,
    process_group: Any = None,
    planner: Any = None,
) -> SaveReport | None:
    """Save a (distributed) state dict as one safetensors file, or shards with ``max_shard_size``.

    The state dict comes first, as in ``torch.distributed.checkpoint.save`` (a drop-in keeps
    its library's order; filecord's own writers take the destination first).  Call it on every
    rank with the same arguments.  Returns the commit's report on the
    coordinator, None elsewhere.  Any failure on any rank raises on every rank (torch's
    ``CheckpointException``, a ``BaseException``) after the coordinator removed the temps.
    """
    if isinstance(state_dict, (str, os.PathLike)) or not isinstance(state_dict, Mapping):
        raise TypeError("filecord.dcp.save(state_dict, path) takes the state dict first, as "
                        "torch.distributed.checkpoint.save does; nothing was written")
    if getattr(planner, "_enable_plan_caching", False):  # DefaultSavePlanner's flag
        raise UnsupportedStateError(
            "a planner with enable_plan_caching=True reuses an earlier save's plans and temp "
            "files; pass one without plan caching; nothing was written")
    writer = SafetensorsWriter(path, max_shard_size=max_shard_size, metadata=metadata)
    try:
        dcp_save(dict(state_dict), storage_writer=writer, process_group=process_group,
                 planner=planner)
    except BaseException as exc:
        try:
            writer.abort()  # lets go of the lock even when a temp cannot be removed
        except Exception as cleanup:  # noqa: BLE001 - the save's own error is the one to raise
            add_note(exc, f"cleanup after the failed save failed too ({type(cleanup).__name__}: "
                          f"{cleanup}); the lock is released: `filecord recover "
                          f"{writer.directory}` removes what is left")
        raise
    return writer.report
