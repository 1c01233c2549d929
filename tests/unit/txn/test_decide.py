"""The decision table and the stage machine (``filecord._txn.decide``, ``stages``): every row,
every legal and illegal move.  Pure."""

from __future__ import annotations

import itertools

import pytest

from filecord._txn import stages
from filecord._txn.assess import of_change
from filecord._txn.decide import OUTCOME, TABLE, Action, Actor, Found, NoRowError, decide
from filecord._txn.stages import Stage, StageError, advance
from filecord.errors import ChangeKind, DataChangedError

# Every row, written out: the table must say exactly this (a changed row fails here).
EXPECTED = {
    (Actor.SAVE, Stage.CREATED, Found.AS_LEFT): Action.DISCARD,
    (Actor.SAVE, Stage.FILLED, Found.AS_LEFT): Action.DISCARD,
    (Actor.SAVE, Stage.JOURNALED, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.SAVE, Stage.MOVING, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.SAVE, Stage.JOURNALED, Found.LINKED): Action.KEEP,
    (Actor.SAVE, Stage.MOVING, Found.LINKED): Action.KEEP,
    (Actor.SAVE, Stage.JOURNALED, Found.METADATA): Action.KEEP,
    (Actor.SAVE, Stage.MOVING, Found.METADATA): Action.KEEP,
    (Actor.SAVE, Stage.JOURNALED, Found.UNREADABLE): Action.KEEP,
    (Actor.SAVE, Stage.MOVING, Found.UNREADABLE): Action.KEEP,
    (Actor.SAVE, Stage.JOURNALED, Found.CHANGED): Action.HOLD,
    (Actor.SAVE, Stage.MOVING, Found.CHANGED): Action.HOLD,
    (Actor.SAVE, Stage.ROLLING_BACK, Found.UNREADABLE): Action.KEEP,
    (Actor.SAVE, Stage.COMMITTED, Found.AS_LEFT): Action.FINISH,
    (Actor.SAVE, Stage.RENAMED, Found.AS_LEFT): Action.FINISH,
    (Actor.SAVE, Stage.DONE, Found.AS_LEFT): Action.COMPLETE,
    (Actor.RECOVER, Stage.CREATED, Found.AS_LEFT): Action.DISCARD,  # no journal made
    (Actor.RECOVER, Stage.MOVING, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.RECOVER, Stage.ROLLING_BACK, Found.AS_LEFT): Action.ROLL_BACK,
    (Actor.RECOVER, Stage.COMMITTED, Found.AS_LEFT): Action.FINISH,
    **{(Actor.RECOVER, s, Found.BUSY): Action.SKIP
       for s in (Stage.CREATED, Stage.MOVING, Stage.ROLLING_BACK, Stage.COMMITTED, Stage.HELD)},
    **{(Actor.RECOVER, s, f): Action.REFUSE
       for s in (Stage.CREATED, Stage.MOVING, Stage.ROLLING_BACK, Stage.COMMITTED) for f in Found
       if f not in (Found.AS_LEFT, Found.BUSY)},
    **{(Actor.RECOVER, Stage.HELD, f): Action.REFUSE for f in Found if f is not Found.BUSY},
}


def test_recover_reports_each_of_its_actions_by_one_word() -> None:
    """Every action recover can take has the word ``Recovered.action`` and the CLI use."""
    recover_actions = {a for (actor, _s, _f), a in EXPECTED.items() if actor is Actor.RECOVER}
    assert recover_actions == set(OUTCOME)
    assert sorted(OUTCOME.values()) == ["discarded", "finished", "refused", "restored",
                                        "skipped"]


@pytest.mark.parametrize("row", sorted(EXPECTED, key=str), ids=str)
def test_every_row(row: tuple[Actor, Stage, Found]) -> None:
    assert decide(*row) is EXPECTED[row]


def test_no_other_row() -> None:
    assert set(TABLE) == set(EXPECTED)
    missing = [k for k in itertools.product(Actor, Stage, Found) if k not in EXPECTED]
    assert len(missing) == len(Actor) * len(Stage) * len(Found) - len(EXPECTED)
    for row in missing:
        with pytest.raises(NoRowError):
            decide(*row)


def test_damage_is_never_another_party_and_never_acted_on() -> None:
    """Invariant 5: a record that does not check is refused whatever the stage."""
    for stage in Stage:
        if (Actor.RECOVER, stage, Found.DAMAGED) in TABLE:
            assert decide(Actor.RECOVER, stage, Found.DAMAGED) is Action.REFUSE
    assert Found.DAMAGED is not Found.CHANGED


def test_nothing_is_deleted_before_the_commit_point() -> None:
    """Invariant 6: FINISH (which deletes consumed sources) only after the commit point."""
    for (_actor, stage, _found), action in TABLE.items():
        if action is Action.FINISH:
            assert stage in (Stage.COMMITTED, Stage.RENAMED)


def test_a_change_is_held_and_never_rolled_back_over() -> None:
    """Invariant 7: CHANGED never rolls back or finishes."""
    for (_actor, _stage, found), action in TABLE.items():
        if found in (Found.CHANGED, Found.DAMAGED):
            assert action in (Action.HOLD, Action.REFUSE)


@pytest.mark.parametrize(("kind", "found"), [
    (ChangeKind.CONTENT, Found.CHANGED), (ChangeKind.REPLACED, Found.CHANGED),
    (ChangeKind.LINKED, Found.LINKED), (ChangeKind.METADATA, Found.METADATA),
])
def test_a_change_is_judged_by_its_kind_not_its_text(kind: ChangeKind, found: Found) -> None:
    misleading = "linked metadata only its change time moved"  # text that once decided
    exc = DataChangedError("/x", expected_size=1, found_size=2, reason=misleading, kind=kind)
    assert of_change(exc) is found
    assert DataChangedError("/x", expected_size=1, found_size=2, reason="r").kind \
        is ChangeKind.CONTENT


# --- the stage machine ---------------------------------------------------------------------

LEGAL = {
    (Stage.CREATED, Stage.FILLED), (Stage.CREATED, Stage.FAILED),
    (Stage.FILLED, Stage.JOURNALED), (Stage.FILLED, Stage.COMMITTED),
    (Stage.FILLED, Stage.FAILED),
    (Stage.JOURNALED, Stage.MOVING), (Stage.JOURNALED, Stage.COMMITTED),
    (Stage.JOURNALED, Stage.ROLLING_BACK), (Stage.JOURNALED, Stage.HELD),
    (Stage.JOURNALED, Stage.FAILED),
    (Stage.MOVING, Stage.COMMITTED), (Stage.MOVING, Stage.ROLLING_BACK),
    (Stage.MOVING, Stage.HELD), (Stage.MOVING, Stage.FAILED),
    (Stage.ROLLING_BACK, Stage.FAILED), (Stage.HELD, Stage.FAILED),
    (Stage.COMMITTED, Stage.RENAMED), (Stage.COMMITTED, Stage.FAILED),
    (Stage.RENAMED, Stage.DONE), (Stage.RENAMED, Stage.FAILED),
    (Stage.DONE, Stage.FAILED),
}


@pytest.mark.parametrize(("a", "b"), list(itertools.product(Stage, Stage)), ids=str)
def test_every_move(a: Stage, b: Stage) -> None:
    if (a, b) in LEGAL:
        assert advance(a, b) is b
    else:
        with pytest.raises(StageError):
            advance(a, b)


def test_failed_is_poisoned_and_every_stage_can_fail() -> None:
    assert all((s, Stage.FAILED) in LEGAL for s in Stage if s is not Stage.FAILED)
    assert not [b for (a, b) in LEGAL if a is Stage.FAILED]


def test_no_dead_stage() -> None:
    """Every stage is reachable from CREATED, and every one but FAILED can be left."""
    seen, todo = {Stage.CREATED}, [Stage.CREATED]
    while todo:
        for a, b in LEGAL:
            if a is todo[0] and b not in seen:
                seen.add(b)
                todo.append(b)
        todo.pop(0)
    assert seen == set(Stage)
    assert not hasattr(stages, "undoes")  # the dead helper is gone


def test_the_succession_of_step_records_follows_the_table() -> None:
    """The stage is a step record now, not the journal's name (the suffixes went with journal
    version 3): which record may follow which is the table's, through FILLED (no record); a
    ``rolling back`` step may follow one (its ``rebuilt`` steps)."""
    ok = [(Stage.CREATED, Stage.JOURNALED), (Stage.JOURNALED, Stage.MOVING),
          (Stage.MOVING, Stage.MOVING), (Stage.MOVING, Stage.COMMITTED),
          (Stage.JOURNALED, Stage.COMMITTED), (Stage.MOVING, Stage.ROLLING_BACK),
          (Stage.MOVING, Stage.HELD), (Stage.ROLLING_BACK, Stage.ROLLING_BACK)]
    bad = [(Stage.COMMITTED, Stage.MOVING), (Stage.COMMITTED, Stage.ROLLING_BACK),
           (Stage.ROLLING_BACK, Stage.COMMITTED), (Stage.HELD, Stage.ROLLING_BACK),
           (Stage.HELD, Stage.HELD), (Stage.JOURNALED, Stage.JOURNALED),
           (Stage.CREATED, Stage.MOVING), (Stage.COMMITTED, Stage.COMMITTED)]
    assert all(stages.may_follow(a, b) for a, b in ok)
    assert not any(stages.may_follow(a, b) for a, b in bad)


def test_every_invariant_names_tests_that_exist() -> None:
    import re
    from pathlib import Path

    from filecord._txn import decide as module

    root = Path(__file__).resolve().parents[3]
    doc = module.__doc__ or ""
    for n in range(1, 9):
        assert f"\n{n}. " in doc, f"invariant {n} is missing"
    named = re.findall(r"tests/[\w/]+\.py", doc)
    assert len(set(named)) >= 10
    missing = [t for t in named if not (root / t).is_file()]
    assert not missing, missing
