"""filecord.dcp._layout, pure: runs of a box at exact byte offsets, and the tiling proof."""

from __future__ import annotations

import itertools
import math

import pytest

from filecord.dcp._layout import (
    Box,
    Spec,
    check_tiling,
    merge_specs,
    run_count,
    runs,
    strided,
)
from filecord.dcp.errors import TilingError
from filecord.tensors import DType


def test_runs_of_common_shards() -> None:
    # a column shard of a (4, 6) bf16 tensor: one 6-byte run per row, at rows * 12 + 6
    assert list(runs((4, 6), (0, 3), (4, 3), 2)) == [(6, 6), (18, 6), (30, 6), (42, 6)]
    # a dim-0 shard, uneven: one run
    assert list(runs((5, 3), (3, 0), (2, 3), 4)) == [(36, 24)]
    # 3-D Shard(1): one run per leading index
    assert list(runs((4, 6, 5), (0, 3, 0), (4, 3, 5), 2)) == [
        (30, 30), (90, 30), (150, 30), (210, 30)]
    assert list(runs((), (), (), 4)) == [(0, 4)]  # 0-d: one element
    assert list(runs((0, 4), (0, 0), (0, 4), 4)) == []  # empty
    assert run_count((4, 6), (0, 3), (4, 3)) == 4
    assert run_count((8, 4), (4, 0), (4, 4)) == 1


def _grid_boxes(shape: tuple[int, ...], cuts: tuple[int, ...]) -> list[tuple[tuple[int, ...],
                                                                               tuple[int, ...]]]:
    """Split every dimension into ``cuts[d]`` nearly equal parts (uneven allowed)."""
    per_dim = []
    for n, c in zip(shape, cuts, strict=True):
        edges = [n * i // c for i in range(c + 1)]
        per_dim.append([(a, b - a) for a, b in itertools.pairwise(edges)])
    return [(tuple(o for o, _ in parts), tuple(s for _, s in parts))
            for parts in itertools.product(*per_dim)]


@pytest.mark.parametrize(("shape", "cuts"), [
    ((7, 5), (2, 1)), ((7, 5), (1, 2)), ((6, 8), (2, 2)), ((4, 6, 5), (1, 2, 1)),
    ((4, 6, 5), (2, 1, 3)), ((3, 4, 5, 2), (1, 2, 2, 1)), ((9,), (4,)),
])
def test_runs_place_every_element_where_row_major_puts_it(
    shape: tuple[int, ...], cuts: tuple[int, ...]
) -> None:
    item = 2
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    total = math.prod(shape) * item
    owner = [-1] * total  # which byte of the tensor each file byte holds
    for o, s in _grid_boxes(shape, cuts):
        # the chunk's elements in its own row-major order, as global element numbers
        elements = [sum(i * st for i, st in zip(index, strides, strict=True))
                    for index in itertools.product(*(range(a, a + b)
                                                     for a, b in zip(o, s, strict=True)))]
        chunk_bytes = [e * item + k for e in elements for k in range(item)]
        pos = 0
        for dst, n in runs(shape, o, s, item):
            assert owner[dst:dst + n] == [-1] * n  # no byte written twice
            owner[dst:dst + n] = chunk_bytes[pos:pos + n]
            pos += n
        assert pos == len(chunk_bytes)  # the runs are the chunk's bytes, back to back
    assert owner == list(range(total))  # every byte at its row-major offset


@pytest.mark.parametrize(("shape", "cuts"), [
    ((7, 5), (2, 1)), ((7, 5), (1, 2)), ((6, 8), (2, 2)), ((4, 6, 5), (1, 2, 1)),
    ((4, 6, 5), (2, 1, 3)), ((3, 4, 5, 2), (1, 2, 2, 1)), ((9,), (4,)), ((0, 4), (1, 2)),
])
def test_evenly_spaced_runs_are_the_column_shards_and_the_same_runs(
    shape: tuple[int, ...], cuts: tuple[int, ...]
) -> None:
    """``strided`` (the rank's fast path) describes exactly the runs ``runs`` lists, for the
    boxes that split the second dimension with every later one whole, and no other box."""
    for o, s in _grid_boxes(shape, cuts):
        even = strided(shape, o, s, 2)
        listed = list(runs(shape, o, s, 2))
        column = (len(shape) >= 2 and math.prod(s) > 0 and s[1] < shape[1]
                  and s[2:] == shape[2:])
        assert (even is not None) == column, (o, s)
        if even is not None:
            first, step, length, count = even
            assert [(first + i * step, length) for i in range(count)] == listed


SPECS = {"w": Spec("w", DType.F32, (6, 4))}


def test_tiling_accepts_an_exact_tiling() -> None:
    check_tiling(SPECS, [Box("w", 0, (0, 0), (3, 4)), Box("w", 1, (3, 0), (3, 4))])
    check_tiling({"s": Spec("s", DType.F32, ())}, [Box("s", 1, (), ())])
    check_tiling({"e": Spec("e", DType.F32, (0, 4))},
                 [Box("e", 0, (0, 0), (0, 4)), Box("e", 1, (0, 0), (0, 4))])


@pytest.mark.parametrize(("boxes", "match"), [
    ([Box("w", 0, (0, 0), (4, 4)), Box("w", 1, (3, 0), (3, 4))], "overlap"),
    ([Box("w", 0, (0, 0), (3, 4))], "cover 12 of its 24"),
    ([Box("w", 0, (0, 0), (3, 4)), Box("w", 1, (4, 0), (3, 4))], "outside the shape"),
    ([Box("w", 0, (0,), (6,))], "dimensions"),
    ([Box("x", 0, (0,), (6,))], "no rank declared"),
    ([Box("w", 0, (0, 0), (6, 4)), Box("w", 1, (0, 0), (6, 4))], "overlap"),  # not deduped
])
def test_tiling_refuses(boxes: list[Box], match: str) -> None:
    with pytest.raises(TilingError, match=match):
        check_tiling(SPECS, boxes)


def test_ranks_must_agree_on_dtype_and_shape() -> None:
    assert merge_specs([Spec("w", DType.F32, (2,)), Spec("w", DType.F32, (2,))]) == {
        "w": Spec("w", DType.F32, (2,))}
    with pytest.raises(TilingError, match="disagree"):
        merge_specs([Spec("w", DType.F32, (2,)), Spec("w", DType.BF16, (2,))])
    with pytest.raises(TilingError, match="disagree"):
        merge_specs([Spec("w", DType.F32, (2,)), Spec("w", DType.F32, (3,))])
