"""Discard outputs and removals at the commit: the journal's head, the assessment, the finish.

A discard output is built in a temp like the others and unlinked at the commit instead of
published; a removal is a file the commit unlinks while it is still the recorded file.  The
assessment and the table are pure (constructed values); the head's round trip and confinement
and :func:`undo.discard_and_remove` use a few small real files.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from filecord._plan.types import PieceRef
from filecord._txn import journal, undo
from filecord._txn.assess import Facts, Observed, OutputFacts, Records, SourceFacts, assess
from filecord._txn.decide import Action, Actor, Found, decide
from filecord._txn.journal import Journal, JournalOutput, JournalRemoval, JournalSource
from filecord._txn.stages import Stage

TOKEN = "0123456789abcdef"  # noqa: S105 - a save token, not a password
W = 4096
P = (1, 10)


def record(d: str = "/d", removals: tuple[JournalRemoval, ...] = ()) -> Journal:
    """p.bin (2 windows) moved whole: its upper window into out.bin, its lower one into the
    discard output .drop."""
    p = JournalSource(f"{d}/p.bin", *P, size=2 * W, run_start=0, atime_ns=1, mtime_ns=100,
                      mode=0o100644, dests=(PieceRef(0, 0, 0, W, P, W),
                                            PieceRef(1, 0, 0, W, P, 0)), dense=True)
    outs = (JournalOutput(f"{d}/out.bin", 1, 20, W),
            JournalOutput(f"{d}/.drop", 1, 21, W, mode=-1, discard=True))
    return Journal(TOKEN, W, outs, (p,), removals=removals)


J = record(removals=(JournalRemoval("/d/index.json", 1, 30, 50, 7),))
COMMITTED = Records(Actor.RECOVER, Stage.COMMITTED)
MOVING = Records(Actor.RECOVER, Stage.MOVING, cuts={P: (W, 0)})


def seen(p: Facts | None, out: OutputFacts, drop: OutputFacts) -> Observed:
    return Observed((SourceFacts(parked=p),), (out, drop))


def test_finish_after_the_discard_temp_went_is_a_finish() -> None:
    # Killed after the renames and the discard temp's unlink: nothing of it is asked for.
    o = seen(Facts(0, 7), OutputFacts(None, Facts(W, 1)), OutputFacts(None, None))
    got = assess(J, COMMITTED, o)
    assert got.found is Found.AS_LEFT
    assert decide(Actor.RECOVER, Stage.COMMITTED, got.found) is Action.FINISH


def test_a_discard_temp_of_another_length_does_not_stop_a_finish() -> None:
    # It is unlinked, never published: its length says nothing about the outputs.
    o = seen(Facts(0, 7), OutputFacts(Facts(W, 1)), OutputFacts(Facts(W + 1, 1)))
    assert assess(J, COMMITTED, o).found is Found.AS_LEFT
    # The same on a published output's temp is someone else's change: refused.
    o = seen(Facts(0, 7), OutputFacts(Facts(W + 1, 1)), OutputFacts(Facts(W, 1)))
    got = assess(J, COMMITTED, o)
    assert got.found is Found.CHANGED
    assert decide(Actor.RECOVER, Stage.COMMITTED, got.found) is Action.REFUSE


def test_a_rollback_needs_the_discard_temp_that_holds_moved_bytes() -> None:
    # p cut to 0: its lower window is only in the discard temp.
    whole = seen(Facts(0, 7), OutputFacts(Facts(W, 1)), OutputFacts(Facts(W, 1)))
    assert assess(J, MOVING, whole).found is Found.AS_LEFT
    assert decide(Actor.RECOVER, Stage.MOVING, Found.AS_LEFT) is Action.ROLL_BACK
    gone = seen(Facts(0, 7), OutputFacts(Facts(W, 1)), OutputFacts(None, None))
    got = assess(J, MOVING, gone)
    assert got.found is Found.UNREADABLE
    assert isinstance(got.error, OSError)
    assert got.error.errno == errno.ENOENT
    assert decide(Actor.RECOVER, Stage.MOVING, got.found) is Action.REFUSE
    # Its upper window only moved so far: the discard temp is not needed yet.
    half = seen(Facts(W, 7), OutputFacts(Facts(W, 1)), OutputFacts(None, None))
    assert assess(J, MOVING, half).found is Found.AS_LEFT


def test_the_head_round_trips_both_notions() -> None:
    data = journal.encode(J)
    back = journal.read_log(data).journal
    assert back == J
    assert back.outputs[1].discard
    assert not back.outputs[0].discard
    assert back.removals == (JournalRemoval("/d/index.json", 1, 30, 50, 7),)
    head = json.loads(data.split(b"\n")[1][42:])["save"]
    assert head["removals"] == [["/d/index.json", 1, 30, 50, 7]]
    assert [o[10] for o in head["outputs"]] == [False, True]


def test_a_head_without_the_notions_round_trips_in_the_same_shape() -> None:
    plain = Journal(TOKEN, W, (JournalOutput("/d/out.bin", 1, 20, W),), ())
    data = journal.encode(plain)
    assert json.loads(data.split(b"\n")[1][42:])["save"]["removals"] == []
    assert journal.read_log(data).journal == plain


@pytest.mark.parametrize("bad", [
    [["/d/out.bin", 1, 20, W, -1, -1, -1, False, 0, 0]],  # ten fields (version 5's plain one)
    [["/d/out.bin", 1, 20, W, -1, -1, -1, False, 0, 0, 1]],  # a mark that is not a boolean
    [["/d/out.bin", 1, 20, W, -1, -1, -1, False, 0, 0, True, 1]],  # twelve fields
])
def test_an_output_entry_of_another_shape_is_refused(bad: list[object]) -> None:
    body = json.loads(journal.encode(J).split(b"\n")[1][42:])["save"]
    body["outputs"] = bad
    with pytest.raises(journal.JournalDamagedError):
        journal.read_log(journal.MAGIC + journal.step(Stage.JOURNALED, save=body))


def _confined(tmp_path: Path, removal: str) -> None:
    d = os.path.realpath(tmp_path)
    j = record(d, (JournalRemoval(removal, 1, 2, 3, 4),))
    journal.confine(j, os.path.join(d, f".out.bin.{TOKEN}.filecord-journal"))


def test_a_removal_must_sit_where_the_save_worked(tmp_path: Path) -> None:
    d = os.path.realpath(tmp_path)
    _confined(tmp_path, f"{d}/index.json")  # beside the outputs and the source: accepted
    for bad in ("/etc/passwd", f"{d}/../index.json", f"{d}/sub/index.json",
                f"{d}/out.bin", f"{d}/p.bin", "index.json"):
        with pytest.raises(journal.JournalDamagedError):
            _confined(tmp_path, bad)


def test_discard_and_remove_acts_only_on_the_recorded_files(tmp_path: Path) -> None:
    d = str(tmp_path)
    for name, data in (("index.json", b"{}"), ("other.json", b"[]"), ("out.bin", b"o")):
        (tmp_path / name).write_bytes(data)
    st = os.stat(tmp_path / "index.json")
    other = os.stat(tmp_path / "other.json")
    removals = (JournalRemoval(f"{d}/index.json", st.st_dev, st.st_ino, st.st_size,
                               st.st_mtime_ns),
                # recorded before another writer grew it: kept
                JournalRemoval(f"{d}/other.json", other.st_dev, other.st_ino, 1,
                               other.st_mtime_ns),
                JournalRemoval(f"{d}/gone.json", 1, 2, 3, 4))  # gone already: nothing
    base = record(d, removals)
    temp = base.temp(1)
    Path(temp).write_bytes(b"x" * W)
    t = os.stat(temp)
    drop = JournalOutput(f"{d}/.drop", t.st_dev, t.st_ino, W, discard=True)
    j = Journal(TOKEN, W, (base.outputs[0], drop), base.sources,
                removals=removals)
    (tmp_path / ".drop").write_bytes(b"not the save's")  # the discard's name: never touched
    assert undo.discard_and_remove(j) == ((f"{d}/index.json",), (f"{d}/other.json",))
    assert sorted(os.listdir(tmp_path)) == [".drop", "other.json", "out.bin"]
    assert (tmp_path / ".drop").read_bytes() == b"not the save's"
    # Judged from the files: a second run finds nothing left to do.
    assert undo.discard_and_remove(j) == ((), (f"{d}/other.json",))
