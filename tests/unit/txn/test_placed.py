"""``looks.placed``: where a range of a file lies on the device, as the adoption check sees it."""

from __future__ import annotations

from filecord._io.syscalls import FIEMAP_EXTENT_DELALLOC, FIEMAP_EXTENT_UNKNOWN, Extent
from filecord._txn.looks import placed

K = 4096


def test_extents_are_clipped_to_the_range_and_given_offsets_in_it() -> None:
    # a header block before the range and a tail past it share extents with the range
    ext = [Extent(0, 3 * K, 0, 100 * K), Extent(3 * K, 2 * K, 1, 500 * K)]
    assert placed(ext, K, 3 * K) == ((0, 101 * K, 2 * K), (2 * K, 500 * K, K))


def test_one_stretch_reported_split_or_joined_is_the_same() -> None:
    joined = [Extent(0, 8 * K, 0, 40 * K)]
    split = [Extent(0, 3 * K, 0, 40 * K), Extent(3 * K, 5 * K, 0x1, 43 * K)]
    assert placed(joined, 0, 8 * K) == placed(split, 0, 8 * K) == ((0, 40 * K, 8 * K),)


def test_a_cut_and_a_regrowth_are_not_the_same_blocks() -> None:
    before = placed([Extent(0, 8 * K, 0, 40 * K)], 0, 8 * K)
    # cut to 1 block, grown back by a write past it: a hole, then new blocks
    after = placed([Extent(0, K, 0, 40 * K), Extent(7 * K, K, 0, 90 * K)], 0, 8 * K)
    assert before != after
    assert placed([], 0, 8 * K) == ()  # all a hole


def test_blocks_not_yet_placed_give_no_record() -> None:
    for flag in (FIEMAP_EXTENT_DELALLOC, FIEMAP_EXTENT_UNKNOWN):
        assert placed([Extent(0, K, flag, 0)], 0, K) is None
    # outside the range they do not matter
    assert placed([Extent(0, K, 0, 9 * K), Extent(K, K, FIEMAP_EXTENT_DELALLOC, 0)], 0, K) == (
        (0, 9 * K, K),)
