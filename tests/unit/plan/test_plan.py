"""The pure decision rules, one fact at a time, no disk."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filecord._plan import plan as P
from filecord._plan import space as S
from filecord._plan import types as T
from filecord._plan import window as _window
from filecord._plan.plan import make_plan
from filecord._plan.types import FsFacts, OutputFacts, PieceRef, SourceFacts

DEV = 7
KEY = (DEV, 100)


def src(**kw: object) -> SourceFacts:
    base: dict[str, object] = {
        "key": KEY,
        "path": "/d/src",
        "size": 10_000,
        "owned": True,
        "symlink": False,
        "nlink": 1,
        "regular": True,
        "writable": True,
    }
    base.update(kw)
    return SourceFacts(**base)  # type: ignore[arg-type]


def fs(dev: int = DEV, **kw: object) -> FsFacts:
    base: dict[str, object] = {
        "dev": dev,
        "fs_type": "ext4",
        "free": 1 << 40,
        "can_clone": False,
        "keeps_holes": True,
    }
    base.update(kw)
    return FsFacts(**base)  # type: ignore[arg-type]


def out(length: int = 10_100, dev: int = DEV, *, direct: bool = False) -> OutputFacts:
    return OutputFacts("/d/o", "/d/o", dev, length, direct)


def whole() -> list[PieceRef]:
    return [PieceRef(0, 0, 0, 100), PieceRef(0, 1, 100, 10_000, KEY, 0)]


def decide(
    s: SourceFacts,
    o: OutputFacts | None = None,
    f: FsFacts | None = None,
    refs: list[PieceRef] | None = None,
    consume: bool = True,
) -> T.SavePlan:
    return make_plan(
        [o or out()], refs or whole(), {s.key: s}, {DEV: f or fs()}, consume=consume, window=4096
    )


def test_owned_regular_file_is_moved() -> None:
    p = decide(src())
    assert [a.action for a in p.actions] == ["written", "moved"]
    assert p.moves[0].run_start == 0
    assert p.consumed == (KEY,)


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        ({"owned": False}, T.NOT_OWNED),
        ({"symlink": True}, T.SYMLINK),
        ({"nlink": 2}, T.HARDLINK),
        ({"writable": False}, T.READ_ONLY),
    ],
)
def test_refusals_copy_with_reason(facts: dict[str, object], reason: str) -> None:
    p = decide(src(**facts))
    assert p.actions[1].action == "copied"
    assert p.actions[1].reason == reason
    assert p.moves == ()


def test_other_file_system_and_no_holes_and_direct_output() -> None:
    other = decide(src(key=(8, 1)), refs=[PieceRef(0, 0, 0, 10_000, (8, 1), 0)])
    assert other.actions[0].reason == T.OTHER_FS
    assert decide(src(), f=fs(keeps_holes=False)).actions[1].reason == T.NO_HOLES
    assert decide(src(), o=out(direct=True)).actions[1].reason == T.NOT_OUR_FILE


def test_owned_source_written_to_a_direct_output_is_kept() -> None:
    p = decide(src(), o=out(direct=True))
    assert p.moves == ()
    assert p.consumed == ()  # a stream is not storage: the source is not deleted
    both = make_plan(
        [out(), out(10_000, direct=True)],
        [*whole(), PieceRef(1, 0, 0, 10_000, KEY, 0)],
        {KEY: src()}, {DEV: fs()}, consume=True, window=4096,
    )
    assert [a.action for a in both.actions] == ["written", "copied", "copied"]
    assert both.consumed == ()


def test_without_consume_nothing_has_a_reason() -> None:
    p = decide(src(owned=False), consume=False)
    assert p.actions[1].action == "copied"
    assert p.actions[1].reason is None
    assert p.consumed == ()


def test_gap_below_the_moved_run_is_copied() -> None:
    refs = [PieceRef(0, 0, 0, 1000, KEY, 0), PieceRef(0, 1, 1000, 5000, KEY, 5000)]
    p = decide(src(), o=out(6000), refs=refs)
    assert [(a.action, a.reason) for a in p.actions] == [("copied", T.GAP), ("moved", None)]
    assert p.moves[0].run_start == 5000


def test_range_that_misses_the_end_is_not_moved() -> None:
    refs = [PieceRef(0, 0, 0, 9000, KEY, 0)]
    p = decide(src(), o=out(9000), refs=refs)
    assert p.actions[0].reason == T.GAP_TO_END
    assert p.moves == ()


def test_shared_range_is_moved_to_every_destination() -> None:
    refs = [PieceRef(0, 0, 0, 10_000, KEY, 0), PieceRef(0, 1, 10_000, 10_000, KEY, 0)]
    p = decide(src(), o=out(20_000), refs=refs)
    assert [a.action for a in p.actions] == ["moved", "moved"]
    assert len(p.moves[0].dests) == 2
    # The second copy of the bytes is new data on disk; the first is moved (in whole blocks:
    # 20 000 bytes take 5 blocks, the moved 10 000 free 2), and one window is held twice, one
    # block more for the second copy, which lies off its source's block grid.  The margin:
    # the output and its directory's lock file, and the journal (its file and its bytes).
    margin = (S.space_margin(2, 20_000, 4096, journal=True)
              + -(-S.journal_bytes(p.outputs, p.moves, ()) // 4096) * 4096)
    assert p.peaks[0].margin == margin
    assert p.peaks[0].needed == (5 - 2) * 4096 + 4096 + 4096 + margin


def test_clone_needs_alignment_or_a_shared_end() -> None:
    cl = fs(can_clone=True, fs_type="xfs")
    aligned = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 10_000, KEY, 0)]
    p = decide(src(owned=False), o=out(14_096), f=cl, refs=aligned, consume=False)
    assert p.actions[1].action == "cloned"  # unaligned length, but ends both files
    unaligned = [PieceRef(0, 0, 0, 100), PieceRef(0, 1, 100, 10_000, KEY, 0)]
    p = decide(src(owned=False), f=cl, refs=unaligned, consume=False)
    assert p.actions[1].action == "copied"


def test_a_piece_reaching_its_source_end_clones_whole_anywhere_in_the_output() -> None:
    # The kernel takes a partial EOF block where the clone reaches the temp's end, and the fill
    # writes in output order: so the piece need not end the output (the 100 bytes after it).
    cl = fs(can_clone=True, fs_type="xfs")
    refs = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 10_000, KEY, 0),
            PieceRef(0, 2, 14_096, 100)]
    p = decide(src(owned=False), o=out(14_196), f=cl, refs=refs, consume=False)
    a = p.actions[1]
    assert (a.action, a.tail, a.tail_reason) == ("cloned", 0, None)


def test_unaligned_end_mid_source_clones_the_body_and_copies_the_tail() -> None:
    cl = fs(can_clone=True, fs_type="btrfs")
    # Two ranges of one 20 000-byte owned file, both starting on a block: the first ends
    # mid-source (its 10 000 - 8192 = 1808 last bytes are copied), the second ends the file.
    refs = [PieceRef(0, 0, 0, 10_000, KEY, 0), PieceRef(0, 1, 12_288, 7_712, KEY, 12_288),
            PieceRef(0, 2, 10_000, 2_288)]
    refs.sort(key=lambda r: r.out_offset)
    p = decide(src(size=20_000), o=out(20_000), f=cl, refs=refs)
    by_off = {a.out_offset: a for a in p.actions}
    assert (by_off[0].action, by_off[0].tail, by_off[0].tail_reason) == (
        "cloned", 1808, T.MID_TAIL)
    assert (by_off[12_288].action, by_off[12_288].tail) == ("cloned", 0)
    # Cloned and copied, never moved: the source is not shortened, only deleted at commit.
    assert p.moves == ()
    assert p.consumed == (KEY,)


def test_a_short_piece_mid_source_is_copied_and_keeps_its_file_off_the_move_path() -> None:
    cl = fs(can_clone=True, fs_type="xfs")
    refs = [PieceRef(0, 0, 0, 100, KEY, 0), PieceRef(0, 1, 4096, 5_904, KEY, 4096)]
    p = decide(src(), o=out(10_000), f=cl, refs=refs)
    assert [(a.action, a.reason) for a in p.actions] == [("copied", T.MID_TAIL),
                                                          ("cloned", None)]
    assert p.moves == ()
    # An unaligned start anywhere sends the whole file down the move path instead.
    refs = [PieceRef(0, 0, 0, 100, KEY, 50), PieceRef(0, 1, 4096, 5_904, KEY, 4096)]
    p = decide(src(), o=out(10_000), f=cl, refs=refs)
    assert "cloned" not in {a.action for a in p.actions}


def test_report_counts_a_copied_tail_as_copied() -> None:
    from filecord._plan.report import SaveReport
    cl = fs(can_clone=True, fs_type="btrfs")
    refs = [PieceRef(0, 0, 0, 10_000, KEY, 0), PieceRef(0, 1, 10_000, 100)]
    p = decide(src(size=20_000), o=out(10_100), f=cl, refs=refs)
    r = SaveReport(("/d/o",), (10_100,), p.actions, p.peaks, True, 4096, True)
    assert r.bytes_by_action() == {"cloned": 8192, "copied": 1808, "written": 100}
    assert r.copy_reasons() == {T.MID_TAIL: 1808}
    piece = r.to_dict()["pieces"][0]  # type: ignore[index]
    assert (piece["tail"], piece["tail_reason"]) == (1808, T.MID_TAIL)


def test_owned_file_that_fully_clones_is_cloned_not_moved() -> None:
    cl = fs(can_clone=True, fs_type="btrfs")
    refs = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 10_000, KEY, 0)]
    p = decide(src(), o=out(14_096), f=cl, refs=refs)
    assert p.actions[1].action == "cloned"
    assert p.moves == ()
    assert p.consumed == (KEY,)  # still deleted at commit
    # 14 096 bytes take 4 blocks; the clone shares 2 whole ones (its tail block is new).
    # The journal records the source deleted at commit; btrfs keeps blocks for its metadata.
    margin = (S.space_margin(2, 14_096, 4096, journal=True)
              + -(-S.journal_bytes(p.outputs, (), ["/d/src"]) // 4096) * 4096
              + S.BTRFS_BLOCKS * 4096)
    assert p.peaks[0].needed == 2 * 4096 + margin


def test_peak_copy_is_output_size_and_move_is_window() -> None:
    copy = decide(src(owned=False))
    move = decide(src())
    # 10 100 bytes are 3 blocks; the move frees the 2 whole blocks of its 10 000 bytes.
    # Two files, the output and its directory's lock file: each its directory entry and
    # metadata (2), and one block per started 128 MiB of data (1).
    assert copy.peaks[0].margin == 5 * 4096
    assert copy.peaks[0].needed == 3 * 4096 + 5 * 4096
    # and the journal's file and entry (2) and its bytes
    journal = -(-S.journal_bytes(move.outputs, move.moves, ()) // 4096)
    assert move.peaks[0].margin == (7 + journal) * 4096
    # The window's 4096 bytes held twice lie off the block grid in the output (at 100 + k *
    # 4096): two blocks.
    assert move.peaks[0].needed == 1 * 4096 + 2 * 4096 + (7 + journal) * 4096
    tight = decide(src(), f=fs(free=move.peaks[0].needed))
    assert tight.peaks[0].fits
    assert not decide(src(), f=fs(free=move.peaks[0].needed - 1)).peaks[0].fits
    # For 10 000 bytes a copy needs less than a move (the window and the journal cost more).
    assert copy.peaks[0].needed < move.peaks[0].needed


def big_refs() -> list[PieceRef]:
    return [PieceRef(0, 0, 0, 100), PieceRef(0, 1, 100, T.MiB, KEY, 0)]


def test_blocks_follow_the_file_system_and_the_margin_grows_with_the_data() -> None:
    big = decide(src(owned=False), f=fs(block=65536))
    assert big.peaks[0].needed == 65536 + 5 * 65536
    assert S.space_margin(1, 10 * T.MiB << 10, 4096, journal=False) == (2 + 80) * 4096


def test_consume_hint_only_when_consume_was_worked_out_and_needs_less() -> None:

    big, o = src(size=T.MiB), out(T.MiB + 100)
    copy = decide(big, o, fs(free=8 * 4096), big_refs(), consume=False)
    (peak,) = copy.peaks
    assert (peak.fits, peak.needed) == (False, 257 * 4096 + 5 * 4096)
    consumed = decide(big, o, fs(free=8 * 4096), big_refs())
    moved = consumed.peaks[0].needed
    journal = -(-S.journal_bytes(consumed.outputs, consumed.moves, ()) // 4096)
    assert peak.consume_needed == moved == 4096 + 2 * 4096 + (7 + journal) * 4096
    with pytest.raises(OSError, match=f"; consume=True would need {moved}$") as info:
        S.check_space(copy)
    assert f"needs {peak.needed} bytes at its peak (its data in 4096-byte blocks, plus a " \
        f"margin of {5 * 4096} bytes for file-system metadata and the journal) and " \
        f"{8 * 4096} are free" in str(info.value)
    # 10 000 bytes: consume would need more (window, journal), so it is not suggested.
    small = decide(src(), f=fs(free=4096), consume=False)
    assert small.peaks[0].consume_needed is not None
    assert small.peaks[0].consume_needed > small.peaks[0].needed
    with pytest.raises(OSError, match=r"are free$") as refused:
        S.check_space(small)
    assert "consume" not in str(refused.value)
    unowned = decide(src(owned=False), f=fs(free=4096), consume=False)
    assert unowned.peaks[0].consume_needed is None  # nothing to move: no promise
    roomy = decide(src(), consume=False)
    assert roomy.peaks[0].consume_needed is None  # it fits: nothing to say


def test_cover_picks_non_overlapping_holders() -> None:
    a = PieceRef(0, 0, 0, 50, KEY, 0)
    b = PieceRef(1, 0, 0, 80, KEY, 20)
    segs = P.cover([a, b], 0, 100)
    assert [(s, e) for s, e, _ in segs] == [(0, 50), (50, 100)]
    assert segs[1][2] is b
    with pytest.raises(ValueError, match="no destination"):
        P.cover([a], 0, 60)


def test_merged_runs() -> None:
    assert P.merged_runs([(5, 10), (0, 5), (20, 30), (25, 26), (40, 40)]) == [(0, 10), (20, 30)]


def test_window_too_small() -> None:
    with pytest.raises(ValueError, match="window"):
        make_plan([out()], whole(), {KEY: src()}, {DEV: fs()}, consume=True, window=10)


_REF = st.tuples(st.integers(0, 60), st.integers(0, 30))  # (src_offset, length)


@settings(max_examples=300, deadline=None)
@given(st.lists(_REF, max_size=12), st.integers(0, 90), st.integers(0, 30))
def test_cover_agrees_with_a_byte_by_byte_reference(
    spans: list[tuple[int, int]], lo: int, width: int
) -> None:
    dests = [PieceRef(i % 3, i, 1000 * i, n, KEY, s) for i, (s, n) in enumerate(spans)]
    hi = lo + width
    holders = {b: [d for d in dests if d.src_offset <= b < d.src_offset + d.length]
               for b in range(lo, hi)}
    gaps = [b for b, hs in holders.items() if not hs]
    if gaps:
        with pytest.raises(ValueError, match=f"no destination holds source byte {gaps[0]}"):
            P.cover(dests, lo, hi)
        return
    segs = P.cover(dests, lo, hi)
    bounds = [lo, *(b for _a, b, _d in segs)]
    assert [(a, b) for a, b, _d in segs] == list(itertools.pairwise(bounds))  # contiguous
    assert bounds[-1] == hi
    for a, b, d in segs:
        assert d.src_offset <= a < b <= d.src_offset + d.length  # held by its ref
        # the ref reaching furthest from ``a``, so there are as few segments as possible
        assert d.src_offset + d.length == max(h.src_offset + h.length for h in holders[a])


# --- the sync window: the default adapts to the free space, an explicit one is honoured -----

MiB = T.MiB
BIG = 40 * MiB  # one owned source, moved behind a 4096-byte header
LARGE = 3 << 30  # moved bytes from which the default window is no longer fitted down


def big_plan(free: int, window: int = _window.DEFAULT_WINDOW, size: int = BIG) -> T.SavePlan:
    s = src(size=size)
    refs = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, size, KEY, 0)]
    return make_plan([out(4096 + size)], refs, {KEY: s}, {DEV: fs(free=free)}, consume=True,
                     window=window)


def needed_at(window: int, size: int = BIG) -> int:
    return big_plan(1 << 40, window=window, size=size).peaks[0].needed


def test_the_default_window_is_a_marked_int_and_a_number_is_explicit() -> None:
    assert 64 * MiB == _window.DEFAULT_WINDOW
    assert _window.is_default(_window.DEFAULT_WINDOW)
    assert not _window.is_default(64 * MiB)  # the same number, passed: honoured as given
    assert _window.ladder(_window.DEFAULT_WINDOW) == (
        64 * MiB, 32 * MiB, 16 * MiB, 8 * MiB, 4 * MiB)
    assert _window.ladder(10_000) == (10_000,)
    assert 4 * MiB == _window.FLOOR


def test_default_window_fits_unchanged_when_there_is_room() -> None:
    p = big_plan(1 << 40, size=LARGE)
    assert p.window == 64 * MiB
    assert type(p.window) is int
    assert p.window_choice.why == "default"
    assert p.window_choice.note() is None


@pytest.mark.parametrize(("size", "want"), [(BIG, 16 * MiB), (1 << 30, 28 * MiB),
                                            (2 << 30, 56 * MiB)])
def test_below_2_25_gib_moved_the_default_is_fitted_to_a_36th(size: int, want: int) -> None:
    p = big_plan(1 << 40, size=size)
    assert (p.window, p.window_choice.why) == (want, "fitted")
    assert p.window_choice.note() == (
        f"fitted from 64 MiB to {want // MiB} MiB: {size // MiB} MiB moved")
    # the window is the only part of the peak held twice: at most 1/36 of the data above LOW
    assert p.peaks[0].needed - needed_at(4 * MiB, size=size) == want - 4 * MiB


def test_the_window_is_fitted_to_the_file_system_that_moves_least() -> None:
    # 4 GiB moved on ext4 and 1 GiB on xfs: one window is held on both, so it is fitted to
    # xfs's gigabyte (28 MiB), where 64 MiB would be 6% of the data moved there.
    other, key2 = DEV + 1, (DEV + 1, 99)
    big, small = src(size=4 << 30), src(key=key2, path="/x/w", size=1 << 30)
    refs = [PieceRef(0, 0, 0, 100), PieceRef(0, 1, 100, 4 << 30, KEY, 0),
            PieceRef(1, 0, 0, 1 << 30, key2, 0), PieceRef(1, 1, 1 << 30, 100)]
    outs = [out((4 << 30) + 100), T.OutputFacts("/x/o", "/x/o", other, (1 << 30) + 100, False)]
    filesystems = {DEV: fs(), other: fs(other, fs_type="xfs")}
    p = make_plan(outs, refs, {KEY: big, key2: small}, filesystems, consume=True,
                  window=_window.DEFAULT_WINDOW)
    assert (p.window, p.window_choice.why) == (28 * MiB, "fitted")
    assert p.window_choice.note() == (
        "fitted from 64 MiB to 28 MiB: 1024 MiB moved on xfs, the file system that moves least")


@pytest.mark.parametrize("want", [32 * MiB, 16 * MiB, 8 * MiB, 4 * MiB])
def test_default_window_shrinks_to_the_largest_that_fits(want: int) -> None:
    # Free space exactly what ``want`` needs: the next larger window needs more, so not it.
    free = needed_at(want, size=LARGE)
    assert needed_at(2 * want, size=LARGE) > free
    p = big_plan(free, size=LARGE)
    assert p.window == want
    assert p.peaks[0].fits
    assert p.peaks[0].needed == free
    assert p.window_choice.why == "shrunk"
    assert p.window_choice.note() == (
        f"shrunk from 64 MiB to {want // MiB} MiB: {T.size_text(free)} free on ext4")
    S.check_space(p)  # fits: no refusal


def test_peak_grows_by_exactly_the_window_held_twice() -> None:
    # The rest of the peak (the header's block, the margin) does not depend on the window.
    base = needed_at(4 * MiB) - 4 * MiB
    for w in (8 * MiB, 16 * MiB, 32 * MiB):
        assert needed_at(w) - w == base
    assert needed_at(64 * MiB) - BIG == base  # a window larger than the run holds the run


def test_even_the_floor_does_not_fit_refuses_and_says_what_the_floor_needs() -> None:
    floor_needs = needed_at(4 * MiB)
    p = big_plan(floor_needs - 1)
    assert p.window == 4 * MiB
    assert not p.peaks[0].fits
    with pytest.raises(OSError, match=(
        rf"the save needs {floor_needs} bytes at its peak with the smallest sync window, "
        rf"4 MiB, \(its data in 4096-byte blocks.* and {floor_needs - 1} are free$")):
        S.check_space(p)


def test_explicit_window_is_honoured_and_the_refusal_hints_at_the_default() -> None:
    free = needed_at(8 * MiB)
    p = big_plan(free, window=64 * MiB)  # a plain int: the caller chose it
    assert p.window == 64 * MiB
    assert not p.peaks[0].fits
    assert p.window_choice.why == "asked"
    assert p.window_choice.default_fits == 8 * MiB
    with pytest.raises(OSError, match=(
        r"are free; window=67108864 was given: the default window would shrink to 8 MiB "
        r"and fit$")):
        S.check_space(p)
    # Nothing would fit even shrunk: no hint.
    hopeless = big_plan(needed_at(4 * MiB) - 1, window=8 * MiB)
    assert hopeless.window_choice.default_fits is None
    with pytest.raises(OSError, match=r"are free$"):
        S.check_space(hopeless)
    # An explicit small window that fits is used as is, never grown.
    assert big_plan(1 << 40, window=5 * MiB).window == 5 * MiB


def test_a_run_smaller_than_the_floor_never_says_it_shrank() -> None:
    # 10 000 bytes: every window holds the whole run, so shrinking changes nothing.
    p = big_plan(4096, size=10_000)
    assert not p.peaks[0].fits
    assert (p.window, p.window_choice.why) == (16 * MiB, "fitted")
    assert p.window_choice.note() == "fitted from 64 MiB to 16 MiB: 10000 bytes moved"
    with pytest.raises(OSError, match=r"needs \d+ bytes at its peak \(its data"):
        S.check_space(p)


def test_copy_saves_keep_the_window_and_the_consume_hint_uses_the_adapted_one() -> None:
    s = src(size=BIG)
    refs = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, BIG, KEY, 0)]
    free = needed_at(16 * MiB)
    copy = make_plan([out(4096 + BIG)], refs, {KEY: s}, {DEV: fs(free=free)}, consume=False,
                     window=_window.DEFAULT_WINDOW)
    assert copy.window == 64 * MiB
    assert copy.window_choice.why == "default"
    assert copy.peaks[0].consume_needed == free  # what consume=True would need, shrunk to fit


def test_unaligned_explicit_window_counts_the_block_it_straddles() -> None:
    # 5000 bytes: two blocks of it, and one more where it crosses the block grid.
    assert needed_at(5000) - needed_at(4096) == 2 * 4096


def test_coalesce_merges_only_what_is_adjacent_in_output_and_source() -> None:
    other = (DEV, 200)
    refs = [
        PieceRef(0, 0, 0, 10, KEY, 100), PieceRef(0, 1, 10, 20, KEY, 110),  # adjacent: one
        PieceRef(0, 2, 30, 5, KEY, 200),  # a gap in the source
        PieceRef(0, 3, 35, 5, other, 205),  # another file
        PieceRef(1, 0, 0, 5, other, 210),  # another output
        PieceRef(1, 1, 5, 5, other, 215), PieceRef(1, 2, 10, 0, other, 220),
    ]
    assert P.coalesce(refs) == (
        PieceRef(0, 0, 0, 30, KEY, 100), PieceRef(0, 2, 30, 5, KEY, 200),
        PieceRef(0, 3, 35, 5, other, 205), PieceRef(1, 0, 0, 10, other, 210),
    )
    assert P.coalesce([]) == ()


def test_many_adjacent_slices_move_as_one_range_and_are_reported_one_by_one() -> None:
    refs = [PieceRef(0, i, 100 * i, 100, KEY, 100 * i) for i in range(100)]
    p = decide(src(), o=out(10_000), refs=refs)
    assert [(a.index, a.out_offset, a.action) for a in p.actions] == [
        (i, 100 * i, "moved") for i in range(100)
    ]
    assert p.moves[0].dests == (PieceRef(0, 0, 0, 10_000, KEY, 0),)
    assert p.moves[0].run_start == 0


def test_slices_below_a_gap_are_copied_and_the_moved_run_coalesces() -> None:
    refs = [PieceRef(0, 0, 0, 1000, KEY, 0),
            *(PieceRef(0, 1 + i, 1000 + 1000 * i, 1000, KEY, 5000 + 1000 * i) for i in range(5))]
    p = decide(src(), o=out(6000), refs=refs)
    assert [a.action for a in p.actions] == ["copied"] + ["moved"] * 5
    assert p.actions[0].reason == T.GAP
    assert p.moves[0].dests == (PieceRef(0, 1, 1000, 5000, KEY, 5000),)


def test_a_large_move_grows_the_default_window_where_the_disk_holds_it_twice() -> None:
    size = 16 << 30  # 16 GiB moved: rungs up to the cap, 256 MiB
    roomy = big_plan(1 << 40, size=size)
    assert (roomy.window, roomy.window_choice.why) == (256 * MiB, "grown")
    assert roomy.peaks[0].needed == needed_at(256 * MiB, size=size)
    assert roomy.window_choice.note() == "grown from 64 MiB to 256 MiB: 1048576 MiB free on ext4"
    # Room for 128 MiB with 128 MiB to spare, not for 256 MiB with 256 MiB to spare.
    free = needed_at(256 * MiB, size=size)
    tight = big_plan(free, size=size)
    assert (tight.window, tight.window_choice.why) == (128 * MiB, "grown")
    # 5 GiB moved: 128 MiB is 1/40 of it; 4 GiB: the default stays.
    assert big_plan(1 << 40, size=5 << 30).window == 128 * MiB
    assert big_plan(1 << 40, size=4 << 30).window == 64 * MiB
    # A window passed explicitly is never grown.
    assert big_plan(1 << 40, window=64 * MiB, size=size).window == 64 * MiB


def _two_sources(offset: int = 4096, **fs_kw: object) -> tuple[T.SavePlan, T.SavePlan]:
    """A header, an owned 40,000-byte file at ``offset``, then an owned 8,192-byte file."""
    a, b = (DEV, 1), (DEV, 2)
    srcs = {a: src(key=a, path="/d/a", size=40_000), b: src(key=b, path="/d/b", size=8192)}
    refs = [PieceRef(0, 0, 0, offset), PieceRef(0, 1, offset, 40_000, a, 0),
            PieceRef(0, 2, offset + 40_000, 8192, b, 0)]
    o = [out(offset + 48_192)]
    f = {DEV: fs(**{"can_insert": True, **fs_kw})}
    return (make_plan(o, refs, srcs, f, consume=True, window=4096),
            make_plan(o, refs, srcs, f, consume=True, window=4096, adopt=True))


def test_in_place_picks_the_largest_whole_source_at_a_block_offset() -> None:
    today, asked = _two_sources()
    assert [(ip.output, ip.key, ip.out_offset, ip.length, ip.pieces)
            for ip in today.in_place] == [(0, (DEV, 1), 4096, 40_000, (1,))]
    assert today.in_place[0].why == T.IN_PLACE_WHY
    assert [a.action for a in today.actions] == ["written", "moved", "moved"]  # not asked
    assert [a.action for a in asked.actions] == ["written", "adopted", "moved"]
    # Asked, the adopted source's move is an adoption, run first; it holds no window twice
    # (nothing is copied), so the peak is one 4 KiB window lower.
    assert asked.moves == (replace(today.moves[0], adopt=True), today.moves[1])
    assert asked.peaks[0].needed == today.peaks[0].needed - 4096


def test_in_place_needs_a_block_offset_and_a_file_system_that_inserts() -> None:
    unaligned, _ = _two_sources(offset=4000)  # a at 4000: no; b at 44,000: no either
    assert unaligned.in_place == ()
    no_insert, asked = _two_sources(can_insert=False)
    assert no_insert.in_place == ()
    assert "adopted" not in {a.action for a in asked.actions}
    at_zero, _ = _two_sources(offset=0)  # no header: nothing to insert, still the base
    assert [ip.out_offset for ip in at_zero.in_place] == [0]


def test_in_place_wants_the_whole_file_once_and_on_the_output_mount() -> None:
    f = {DEV: fs(can_insert=True)}
    twice = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 10_000, KEY, 0),
             PieceRef(0, 2, 14_096, 10_000, KEY, 0)]
    p = make_plan([out(24_096)], twice, {KEY: src()}, f, consume=True, window=4096)
    assert [a.action for a in p.actions] == ["written", "moved", "moved"]
    assert p.in_place == ()  # two destinations: the file cannot be both
    part = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 5000, KEY, 5000)]
    assert make_plan([out(9096)], part, {KEY: src()}, f, consume=True,
                     window=4096).in_place == ()  # only the file's tail is moved
    other_mount = make_plan([out()], whole_at_block(), {KEY: src(mount=3)}, f, consume=True,
                            window=4096)
    assert other_mount.in_place == ()
    # Adjacent slices that make up the whole file count as the whole file.
    halves = [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 6000, KEY, 0),
              PieceRef(0, 2, 10_096, 4000, KEY, 6000)]
    p = make_plan([out(14_096)], halves, {KEY: src()}, f, consume=True, window=4096)
    assert [(ip.length, ip.pieces) for ip in p.in_place] == [(10_000, (1, 2))]


def test_a_whole_output_is_renamed_not_adopted_in_place() -> None:
    p = make_plan([out(10_000)], [PieceRef(0, 0, 0, 10_000, KEY, 0)], {KEY: src()},
                  {DEV: fs(can_insert=True)}, consume=True, window=4096)
    assert p.moves[0].adopt
    assert p.in_place == ()


def whole_at_block() -> list[PieceRef]:
    return [PieceRef(0, 0, 0, 4096), PieceRef(0, 1, 4096, 10_000, KEY, 0)]


def _rows_ref(tmp_path: object, order: list[int], row: int = 1000) -> PieceRef:
    """A piece of ``len(order)`` rows of a 10,000-byte file (rows of ``row`` bytes)."""
    from pathlib import Path

    from filecord import FileBackedData
    from filecord._pieces.rows import FileRows

    path = Path(str(tmp_path)) / "rows.bin"
    path.write_bytes(bytes(10_000))
    rows = FileRows(FileBackedData(path), row, order)
    return PieceRef(0, 1, 100, len(rows), KEY, 0, rows)


def test_a_piece_of_rows_is_one_action_and_its_runs_are_moved(tmp_path: object) -> None:
    order = [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]
    p = decide(src(), refs=[PieceRef(0, 0, 0, 100), _rows_ref(tmp_path, order)])
    assert [(a.action, a.runs, a.length) for a in p.actions] == [
        ("written", 0, 100), ("moved", 10, 10_000)]
    (m,) = p.moves
    # the move copies, journals and puts back byte ranges: one per run, at its output offset
    assert [(d.out_offset, d.src_offset, d.length) for d in m.dests] == [
        (100 + k * 1000, r * 1000, 1000) for k, r in enumerate(order)]
    assert m.run_start == 0
    assert not m.adopt


def test_rows_in_file_order_are_one_range_to_move(tmp_path: object) -> None:
    p = decide(src(), refs=[PieceRef(0, 0, 0, 100), _rows_ref(tmp_path, list(range(10)))])
    (m,) = p.moves
    assert [(d.out_offset, d.src_offset, d.length) for d in m.dests] == [(100, 0, 10_000)]
    assert p.actions[1].runs == 1


def test_rows_are_copied_not_cloned(tmp_path: object) -> None:
    ref = _rows_ref(tmp_path, [1, 0, 3, 2, 5, 4, 7, 6, 9, 8], row=1000)
    p = decide(src(owned=False), f=fs(can_clone=True), refs=[PieceRef(0, 0, 0, 100), ref],
               consume=False)
    assert (p.actions[1].action, p.actions[1].reason, p.actions[1].tail) == ("copied", None, 0)
    assert not p.moves


def test_rows_below_the_moved_range_are_copied_with_the_reason(tmp_path: object) -> None:
    ref = _rows_ref(tmp_path, [1, 0], row=1000)  # bytes [0, 2000) of a 10,000-byte source
    tail = PieceRef(0, 2, 2100, 5000, KEY, 5000)  # [5000, 10000): reaches the end
    p = decide(src(), o=out(7100), refs=[PieceRef(0, 0, 0, 100), ref, tail])
    assert [(a.action, a.reason) for a in p.actions] == [
        ("written", None), ("copied", T.GAP), ("moved", None)]
    assert [(d.src_offset, d.length) for d in p.moves[0].dests] == [(5000, 5000)]


def _run_and_pieces(lengths: tuple[int, ...], at: int = 100, src_at: int = 0
                    ) -> tuple[list[PieceRef], list[PieceRef]]:
    """The same pieces as one run placement (what the preflight hands over) and one by one."""
    head = PieceRef(0, 0, 0, at)
    run = PieceRef(0, 1, at, sum(lengths), KEY, src_at, lengths=lengths)
    one_by_one = [head]
    for k, n in enumerate(lengths):
        one_by_one.append(PieceRef(0, 1 + k, at, n, KEY, src_at))
        at, src_at = at + n, src_at + n
    return [head, run], one_by_one


def test_a_run_placement_is_decided_once_and_reported_piece_by_piece() -> None:
    run, pieces = _run_and_pieces((4000, 6000))
    p, q = decide(src(), refs=run), decide(src(), refs=pieces)
    assert len(p.actions) == 3
    assert [(a.index, a.out_offset, a.length, a.action, a.src_offset) for a in p.actions] == [
        (0, 0, 100, "written", 0), (1, 100, 4000, "moved", 0), (2, 4100, 6000, "moved", 4000)]
    # Exactly what the same pieces given one by one get, read every way a tuple reads.
    assert p.actions == q.actions == tuple(q.actions)
    assert tuple(q.actions) == p.actions
    assert hash(p.actions) == hash(tuple(q.actions))
    assert p.actions[1:] == tuple(q.actions)[1:]
    assert p.actions[-1] == q.actions[2]
    # The move is one byte range, with no trace of the pieces it was made of.
    assert p.moves[0].dests == q.moves[0].dests == (PieceRef(0, 1, 100, 10_000, KEY, 0),)
    assert p.moves == q.moves
    assert p.peaks == q.peaks
    assert p.consumed == q.consumed


def test_a_copied_run_gives_every_piece_the_reason_and_counts_them() -> None:
    run, pieces = _run_and_pieces((2500, 2500, 5000))
    p, q = decide(src(owned=False), refs=run), decide(src(owned=False), refs=pieces)
    assert p.actions == q.actions
    assert [(a.action, a.reason) for a in p.actions[1:]] == [("copied", T.NOT_OWNED)] * 3
    assert p.actions.reasons() == q.actions.reasons() == {T.NOT_OWNED: 3}


def test_a_run_from_a_file_that_can_clone_is_decided_piece_by_piece() -> None:
    # A short piece mid-source and an unaligned one are copied, an aligned one ending the file
    # cloned, as if given one by one (clones are decided per piece: their offsets and tails
    # are the piece's); owned, the unaligned piece sends the whole file down the move path.
    cl = fs(can_clone=True, fs_type="xfs")
    run, pieces = _run_and_pieces((100, 3996, 5904), at=4096)
    for owned, want in ((False, ["copied", "copied", "cloned"]), (True, ["moved"] * 3)):
        p = decide(src(owned=owned), o=out(14_096), f=cl, refs=run, consume=owned)
        q = decide(src(owned=owned), o=out(14_096), f=cl, refs=pieces, consume=owned)
        assert p.actions == q.actions
        assert p.moves == q.moves
        assert p.peaks == q.peaks
        assert [a.action for a in p.actions] == ["written", *want]


def test_adopting_a_run_in_place_names_every_piece_of_it() -> None:
    run = [PieceRef(0, 0, 0, 4096),
           PieceRef(0, 1, 4096, 10_000, KEY, 0, lengths=(1000, 2000, 7000))]
    f = fs(can_insert=True)
    p = make_plan([out(14_096)], run, {KEY: src()}, {DEV: f}, consume=True, window=4096,
                  adopt=True)
    assert [ip.pieces for ip in p.in_place] == [(1, 2, 3)]
    assert [a.action for a in p.actions] == ["written", "adopted", "adopted", "adopted"]
