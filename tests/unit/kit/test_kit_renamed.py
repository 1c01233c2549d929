"""Renamed keywords are refused with the new name, before the function runs."""

from __future__ import annotations

import pytest

from filecord._kit.renamed import renamed


def test_old_keyword_names_the_new_one_and_runs_nothing() -> None:
    ran = []

    @renamed(max_size="max_shard_size")
    def split(*, max_shard_size: int = 0) -> int:
        ran.append(max_shard_size)
        return max_shard_size

    assert split(max_shard_size=3) == 3
    with pytest.raises(TypeError, match=r"split\(\) takes max_shard_size=, not max_size="):
        split(max_size=3)  # type: ignore[call-arg]
    assert ran == [3]
