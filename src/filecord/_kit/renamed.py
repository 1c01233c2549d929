"""Keywords renamed for one vocabulary: an old name is a ``TypeError`` that names the new one.

Python's own message for an unknown keyword ("unexpected keyword argument 'max_size'") does not
say what to write instead; this decorator does, before the function runs, so nothing is read or
written by a call that used an old name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def renamed(**old_to_new: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``@renamed(max_size="max_shard_size")``: a call passing ``max_size=`` raises
    ``TypeError`` naming ``max_shard_size=``."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            used = [k for k in kwargs if k in old_to_new]
            if used:
                k = used[0]
                raise TypeError(f"{fn.__qualname__}() takes {old_to_new[k]}=, not {k}= "
                                f"(renamed: one spelling in every format)")
            return fn(*args, **kwargs)

        call.__renamed__ = dict(old_to_new)  # type: ignore[attr-defined]
        return call

    return wrap

