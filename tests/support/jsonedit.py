"""Change one value deep inside parsed JSON, addressed as ``"a.0.b"`` (list indices as digits)."""

from __future__ import annotations

from typing import Any


def set_at(data: Any, key: str, value: Any) -> Any:
    """Set ``value`` at the dotted ``key`` of ``data`` (in place) and return ``data``."""
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data
