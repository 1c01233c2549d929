"""The assessment (``filecord._txn.assess.assess``): pure, on constructed values, no disk.

One journal of three sources (two moved into one output, one adopted as a second output) and
observed facts built by hand: every finding the running save and recover can reach, and the
row of the decision table each one selects.
"""

from __future__ import annotations

import errno
from dataclasses import replace

import pytest

from filecord._plan.types import PieceRef
from filecord._txn import journal
from filecord._txn.assess import (
    Facts,
    Look,
    Observed,
    OutputFacts,
    Records,
    SourceFacts,
    assess,
    damaged,
    whereabouts,
)
from filecord._txn.decide import Action, Actor, Found, decide
from filecord._txn.journal import Journal, JournalOutput, JournalSource
from filecord._txn.stages import Stage
from filecord.errors import ChangeKind, DataChangedError

TOKEN = "0123456789abcdef"  # noqa: S105 - a save token, not a password
W = 4096
A, B, C = (1, 10), (1, 11), (1, 12)
WHOLE = Facts(4 * W, 1)  # the output's temp, at its full length


def record() -> Journal:
    a = JournalSource("/d/a.bin", *A, size=2 * W, run_start=0, atime_ns=1, mtime_ns=100,
                      mode=0o100644, dests=(PieceRef(0, 0, 0, 2 * W, A, 0),), dense=True)
    b = JournalSource("/d/b.bin", *B, size=2 * W, run_start=0, atime_ns=1, mtime_ns=200,
                      mode=0o100644, dests=(PieceRef(0, 1, 2 * W, 2 * W, B, 0),))
    c = JournalSource("/d/c.bin", *C, size=W, run_start=0, atime_ns=1, mtime_ns=300,
                      mode=0o100644, dests=(PieceRef(1, 0, 0, W, C, 0),), adopt=True)
    outs = (JournalOutput("/d/out.bin", 1, 20, 4 * W), JournalOutput("/d/c.out", *C, W))
    return Journal(TOKEN, W, outs, (a, b, c))


J = record()


def seen(a: Facts | None = None, b: Facts | None = None, *, a_own: Facts | None = None,
         b_own: Facts | None = None, c_own: Facts | None = None,
         temp: Facts | None = WHOLE, final: Facts | None = None,
         unreadable: str | None = None) -> Observed:
    """The save mid-move by default: a at one window (its move in progress), b parked whole,
    c adopted (at its output's temp)."""
    return Observed(
        (SourceFacts(parked=a, own=a_own), SourceFacts(parked=b, own=b_own),
         SourceFacts(own=c_own, at_temp=None if c_own else Facts(W, 300))),
        (OutputFacts(temp, final), OutputFacts(None if c_own else Facts(W, 300))),
        unreadable)


MID = {"a": Facts(W, 7, 8), "b": Facts(2 * W, 200, 9)}
# a running save's looks, and recover's cut steps: a cut to one window
SAVE = Records(Actor.SAVE, Stage.MOVING, looks={A: Look(MID["a"]), B: Look(MID["b"])})
RECOVER = Records(Actor.RECOVER, Stage.MOVING, cuts={A: (W,)})


def found(r: Records, o: Observed, j: Journal = J) -> Found:
    return assess(j, r, o).found


# --- as the save left it ----------------------------------------------------------------------

def test_mid_move_is_as_left() -> None:
    got = assess(J, SAVE, seen(**MID))
    assert got.found is Found.AS_LEFT
    assert got.error is None
    assert got.changed is None
    assert decide(Actor.SAVE, Stage.MOVING, got.found) is Action.ROLL_BACK
    assert found(RECOVER, seen(**MID)) is Found.AS_LEFT


def test_rolling_back_asks_nothing_of_the_files() -> None:
    # The undo itself resumes from the files; sizes a move never leaves are its own restore.
    r = Records(Actor.RECOVER, Stage.ROLLING_BACK)
    assert found(r, seen(Facts(123, 1), Facts(5, 1), temp=None)) is Found.AS_LEFT
    assert decide(Actor.RECOVER, Stage.ROLLING_BACK, Found.AS_LEFT) is Action.ROLL_BACK


# --- a running save: the change it saw, its looks ---------------------------------------------

@pytest.mark.parametrize(("kind", "want", "action"), [
    (ChangeKind.CONTENT, Found.CHANGED, Action.HOLD),
    (ChangeKind.REPLACED, Found.CHANGED, Action.HOLD),
    (ChangeKind.LINKED, Found.LINKED, Action.KEEP),
    (ChangeKind.METADATA, Found.METADATA, Action.KEEP),
])
def test_the_change_seen_mid_move_by_its_kind(kind: ChangeKind, want: Found,
                                              action: Action) -> None:
    exc = DataChangedError("/d/a.bin", expected_size=W, found_size=W + 1, reason="x", kind=kind)
    r = Records(Actor.SAVE, Stage.MOVING, during=exc)
    got = assess(J, r, seen(unreadable="not even looked at"))  # the error decides first
    assert (got.found, got.error) == (want, exc)
    assert decide(Actor.SAVE, Stage.MOVING, got.found) is action


def test_a_ctime_alone_moved_since_the_look_is_metadata() -> None:
    r = Records(Actor.SAVE, Stage.MOVING, looks={A: Look(Facts(W, 7, 1))})
    got = assess(J, r, seen(**MID))
    assert got.found is Found.METADATA
    assert got.changed == A
    assert isinstance(got.error, DataChangedError)
    assert got.error.kind is ChangeKind.METADATA
    assert got.error.path == J.parked(J.sources[0])


def test_a_write_since_the_look_is_a_content_change() -> None:
    r = Records(Actor.SAVE, Stage.MOVING, looks={A: Look(Facts(W, 6, 8))})  # mtime moved
    got = assess(J, r, seen(**MID))
    assert got.found is Found.CHANGED
    assert got.changed == A
    assert isinstance(got.error, DataChangedError)
    assert got.error.kind is ChangeKind.CONTENT
    assert decide(Actor.SAVE, Stage.MOVING, got.found) is Action.HOLD


def test_the_size_of_the_saves_own_truncate_in_flight_is_no_change() -> None:
    r = Records(Actor.SAVE, Stage.MOVING, looks={A: Look(Facts(2 * W, 7, 8), pending=W)})
    assert found(r, seen(**MID)) is Found.AS_LEFT
    r = Records(Actor.SAVE, Stage.MOVING, looks={A: Look(Facts(2 * W, 7, 8), pending=0)})
    assert found(r, seen(**MID)) is Found.CHANGED


def test_files_that_cannot_be_looked_at_are_unreadable() -> None:
    for r in (SAVE, RECOVER, Records(Actor.RECOVER, Stage.COMMITTED)):
        got = assess(J, r, seen(unreadable="EIO"))
        assert got.found is Found.UNREADABLE
        assert decide(r.actor, r.stage, got.found) in (Action.KEEP, Action.REFUSE)


# --- the proof both ask for: sizes the save's cuts leave ------------------------------------

@pytest.mark.parametrize(("facts", "why"), [
    ({"a": Facts(W - 1, 7), "b": Facts(2 * W, 200)}, f"leave it at {W} or {2 * W} bytes"),
    ({"a": Facts(W, 7), "b": Facts(W, 9)}, f"leave it at {2 * W} bytes"),  # never cut
    ({"a": Facts(W, 7), "b": Facts(2 * W, 999)}, "another process rewrote it"),
    ({"a": None, "b": None, "b_own": Facts(W, 200)}, f"leave it at {2 * W} bytes"),
    ({"a": Facts(W, 7), "b": None, "b_own": Facts(2 * W, 201)}, "another process rewrote it"),
])
def test_a_source_at_a_size_no_cut_step_names_is_changed(facts: dict[str, Facts | None],
                                                         why: str) -> None:
    got = assess(J, RECOVER, seen(**facts))  # type: ignore[arg-type]
    assert got.found is Found.CHANGED
    assert isinstance(got.error, DataChangedError)
    assert why in got.why
    assert got.error.kind is ChangeKind.CONTENT
    assert decide(Actor.RECOVER, Stage.MOVING, got.found) is Action.REFUSE


def test_every_size_a_cut_step_names_is_as_left_and_none_below_the_last() -> None:
    # A truncate may not reach the disk: the source is at its own size or any cut logged.
    r = Records(Actor.RECOVER, Stage.MOVING, cuts={A: (W, 0)})
    for size in (2 * W, W, 0):
        assert found(r, seen(Facts(size, 100 if size == 2 * W else 7), MID["b"])) is \
            Found.AS_LEFT
    # a's size without its cut step: the bytes past it may be in no temp.
    assert found(Records(Actor.RECOVER, Stage.MOVING), seen(**MID)) is Found.CHANGED


def test_a_running_save_without_a_look_at_a_source_holds_it_to_its_own_size() -> None:
    got = assess(J, Records(Actor.SAVE, Stage.MOVING, looks={A: Look(MID["a"])}),
                 seen(MID["a"], Facts(W, 9)))
    assert got.found is Found.CHANGED
    assert f"leave it at {2 * W} bytes" in got.notes[0]


def test_the_moved_record_says_which_moves_finished() -> None:
    r = Records(Actor.RECOVER, Stage.MOVING, moved=1, cuts={A: (W, 0)})
    got = assess(J, r, seen(**MID))
    assert got.found is Found.CHANGED
    assert "leave it at 0 bytes" in got.why
    assert found(replace(r, cuts={A: (W, 0), B: (W,)}),
                 seen(a=Facts(0, 7), b=Facts(W, 1))) is Found.AS_LEFT


# --- recover before a rollback: the temps the cut bytes went to -------------------------------

def test_the_temps_must_be_there_and_reach_the_moved_bytes() -> None:
    got = assess(J, RECOVER, seen(**MID, temp=Facts(W + 10, 1)))  # the temp ends too soon
    assert got.found is Found.CHANGED
    assert "the temp ends before" in got.why
    got = assess(J, RECOVER, seen(**MID, temp=None))
    assert got.found is Found.UNREADABLE
    assert isinstance(got.error, OSError)
    assert got.error.errno == errno.ENOENT


# --- recover before a finish: every move finished ---------------------------------------------

COMMITTED = Records(Actor.RECOVER, Stage.COMMITTED)


def test_committed_with_every_move_finished_is_finished() -> None:
    got = assess(J, COMMITTED, seen(Facts(0, 7), Facts(0, 9), temp=None, final=Facts(4 * W, 1)))
    assert got.found is Found.AS_LEFT
    assert decide(Actor.RECOVER, Stage.COMMITTED, got.found) is Action.FINISH


def test_a_committed_step_that_checks_is_played_back_whatever_the_sources_sizes() -> None:
    # The trust rule: a committed step is what happened; a source not at its kept prefix (a
    # write after the commit, or a forged step) is the finish's to keep, never re-proved here.
    for o in (seen(Facts(W, 7), Facts(W, 9)), seen(Facts(10, 7), None),
              seen(Facts(0, 7), Facts(0, 9), c_own=Facts(W, 300))):
        assert found(COMMITTED, o) is Found.AS_LEFT


def test_committed_with_a_temp_not_at_its_length_is_changed_and_refused() -> None:
    got = assess(J, COMMITTED, seen(Facts(0, 7), Facts(0, 9), temp=Facts(4 * W - 1, 1)))
    assert got.found is Found.CHANGED
    assert isinstance(got.error, DataChangedError)
    assert (got.error.expected_size, got.error.found_size) == (4 * W, 4 * W - 1)
    assert "another process changed it" in got.why
    assert decide(Actor.RECOVER, Stage.COMMITTED, got.found) is Action.REFUSE


def test_held_is_changed_and_never_undone() -> None:
    got = assess(J, Records(Actor.RECOVER, Stage.HELD), seen(**MID))
    assert got.found is Found.CHANGED
    assert decide(Actor.RECOVER, Stage.HELD, got.found) is Action.REFUSE


def test_a_damaged_record_is_damaged_never_a_second_party() -> None:
    got = damaged(journal.JournalDamagedError("a checksum does not match"))
    assert got.found is Found.DAMAGED
    assert "nothing was touched" in got.why
    assert decide(Actor.RECOVER, Stage.MOVING, got.found) is Action.REFUSE


# --- where every byte is ------------------------------------------------------------------------

def test_whereabouts_names_every_byte() -> None:
    lines = whereabouts(J, seen(**MID))
    assert lines[0] == (f"/d/a.bin: bytes [0, {W}) of {2 * W} are in {J.parked(J.sources[0])}; "
                        f"[{W}, {2 * W}) at offset {W} of {J.temp(0)}")
    assert lines[1] == f"/d/b.bin: bytes [0, {2 * W}) of {2 * W} are in {J.parked(J.sources[1])}"
    assert lines[2] == f"/d/c.bin: the whole file ({W} bytes) is at {J.temp(1)}"
    lines = whereabouts(J, seen(Facts(W + 5, 7), Facts(2 * W, 200)), {A: W})
    assert "is 4101 bytes long, but the move had left it at 4096" in lines[0]
    gone = whereabouts(J, seen(None, Facts(2 * W, 200)))[0]
    assert gone == f"/d/a.bin: not found under its name or {J.parked(J.sources[0])}"


# --- adoption in place (issue 26): the temp's size is the whole progress record ------------------

def in_place() -> Journal:
    """d (2 windows and 5 bytes) adopted at offset 2 windows of a 6-window output: 2 windows
    inserted in front of it, the rest of the output appended after it."""
    d = JournalSource("/d/d.bin", *A, size=2 * W + 5, run_start=0, atime_ns=1, mtime_ns=100,
                      mode=0o100644, dests=(PieceRef(0, 1, 2 * W, 2 * W + 5, A, 0),),
                      adopt=True)
    return Journal(TOKEN, W, (JournalOutput("/d/out.ptd", *A, 6 * W),), (d,))


def adopted_at(size: int | None, *, own: int | None = None) -> Observed:
    at = None if size is None else Facts(size, 5)
    return Observed((SourceFacts(own=None if own is None else Facts(own, 100), at_temp=at),),
                    (OutputFacts(at),))


def marked(r: Records) -> Records:
    """The records with the adopted source's ``inserted`` step."""
    return replace(r, inserted=frozenset({A}))


@pytest.mark.parametrize(("size", "marks", "why"), [
    (2 * W + 5, (False, True), "renamed, nothing inserted yet (or the collapse of an undo done)"),
    (4 * W + 5, (True,), "the space inserted and recorded, nothing appended yet"),
    (4 * W + 5, (False,), "the space inserted, its step not yet (the undo checks the hole)"),
    (6 * W, (True,), "inserted and the rest of the output appended (the temp complete)"),
])
def test_an_adopted_source_at_any_size_an_adoption_leaves_is_rolled_back(
        size: int, marks: tuple[bool, ...], why: str) -> None:
    j = in_place()
    assert j.sources[0].inserted == 2 * W
    for r in (SAVE, RECOVER):
        for mark in marks:
            got = assess(j, marked(r) if mark else r, adopted_at(size))
            assert got.found is Found.AS_LEFT, why
            assert decide(r.actor, Stage.MOVING, got.found) is Action.ROLL_BACK
    # the offset is named only once the space is in front of it; before, the temp is the file
    for mark in marks:
        off = ""
        if size >= (2 * W + 5) + 2 * W:
            off = (f" (at offset {2 * W})" if mark else f" (at offset 0, or at {2 * W} if the "
                   "space in front of it was inserted before its record was written)")
        got = whereabouts(j, adopted_at(size), inserted=frozenset({A} if mark else ()))
        assert got == [f"/d/d.bin: the whole file ({2 * W + 5} bytes) is at {j.temp(0)}{off}"]


@pytest.mark.parametrize("size", [2 * W + 4, 2 * W + 6, 4 * W + 4, 3 * W])
def test_an_adopted_source_at_a_size_no_adoption_leaves_is_held(size: int) -> None:
    """Shorter than the source, or longer but short of the inserted space: a cut or a write
    by someone else; the undo (truncate, collapse) would cut the source's own bytes."""
    j = in_place()
    for mark in (False, True):
        for r, act in ((SAVE, Action.HOLD), (RECOVER, Action.REFUSE)):
            got = assess(j, marked(r) if mark else r, adopted_at(size))
            assert got.found is Found.CHANGED
            assert decide(r.actor, Stage.MOVING, got.found) is act
            said = "\n".join([str(got.error), *got.notes])
            if mark or size < 2 * W + 5:
                assert "a size this save does not leave" in said
            else:  # bytes past the source and no insert recorded: another writer's append
                assert (f"{size - (2 * W + 5)} bytes follow the source's {2 * W + 5}, and the "
                        "journal does not record the space inserted in front of it" in said)


@pytest.mark.parametrize("size", [3 * W, 4 * W + 6, 6 * W])
def test_bytes_after_an_adopted_source_without_its_insert_recorded_are_held(size: int) -> None:
    """The session 33 attack: a writer appended as many bytes as the insert adds (or more)
    before the insert; judged by the size alone the undo collapsed the source's own first
    bytes. Without the ``inserted`` step only the size plus the inserted space is taken for
    the insert (and the undo then checks the hole); any other size past the source is held."""
    j = in_place()
    for r in (SAVE, RECOVER):
        got = assess(j, r, adopted_at(size))
        assert got.found is Found.CHANGED
        assert "does not record the space inserted" in "\n".join([str(got.error), *got.notes])
        got = assess(j, marked(r), adopted_at(size))
        assert (got.found is Found.AS_LEFT) is (4 * W + 5 <= size <= 6 * W)


def test_an_adopted_source_longer_than_its_output_is_held_not_cut() -> None:
    """The save never writes past the output's length: more is another writer's append (the
    session 32 attack: the undo's truncate took it and said byte-exact)."""
    j = in_place()
    for r, held in ((SAVE, Action.HOLD), (RECOVER, Action.REFUSE)):
        got = assess(j, marked(r), adopted_at(6 * W + 1))
        assert got.found is Found.CHANGED
        assert decide(r.actor, Stage.MOVING, got.found) is held
        assert (f"appended 1 bytes past the output's end; nothing was cut: the source's bytes "
                f"are at offset {2 * W} of this file, the appended ones at {6 * W}"
                in "\n".join([str(got.error), *got.notes]))


def test_an_adopted_source_back_under_its_name_needs_nothing_and_committed_the_temps_length(
) -> None:
    j = in_place()
    assert assess(j, RECOVER, adopted_at(None, own=2 * W + 5)).found is Found.AS_LEFT
    committed = Records(Actor.RECOVER, Stage.COMMITTED)
    assert assess(j, committed, adopted_at(6 * W)).found is Found.AS_LEFT
    got = assess(j, committed, adopted_at(4 * W + 5))  # never appended: not complete
    assert got.found is Found.CHANGED
    assert decide(Actor.RECOVER, Stage.COMMITTED, got.found) is Action.REFUSE


def test_a_held_save_names_where_an_adopted_file_was_put_without_claiming_it_whole() -> None:
    # the session 34 attack: a writer cut the adopted file, the tail grew it back; the notes
    # said "the whole file is at" a range of zeros
    j = in_place()
    got = whereabouts(j, adopted_at(6 * W), inserted=frozenset({A}), held=True)
    assert got == [f"/d/d.bin: the file ({2 * W + 5} bytes) was adopted as {j.temp(0)} (at "
                   f"offset {2 * W}); another process changed a source during the save, so "
                   "that range holds what it left"]
