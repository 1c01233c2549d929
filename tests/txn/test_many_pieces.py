"""Runs of adjacent slices: one placement in the preflight, one copy in the fill, every piece
still in the report; interleaved slices stay pieces, and each source is still looked at."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, plan, save
from filecord._io import syscalls as _sys
from filecord._plan.preflight import gather, normalize
from filecord.errors import DataChangedError
from filecord_testing import pattern


class Count(_sys.Backend):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1


def test_adjacent_slices_are_one_placement_and_every_other_piece_its_own(tmp_path: Path
                                                                        ) -> None:
    a = tmp_path / "a"
    a.write_bytes(pattern(10_000, "a"))
    whole = FileBackedData(str(a))
    again = FileBackedData(str(a))  # the same file, captured by another look
    cord = Cord([whole.slice(0, 1000), whole.slice(1000, 2000), whole.slice(3000, 500),
                 b"mem", whole.slice(3500, 500),  # after bytes of memory: a new run
                 whole.slice(5000, 100),  # a gap in the source: a new run
                 again.slice(5100, 100),  # adjacent, but another identity: a new run
                 whole.slice(5200, 0), whole.slice(5200, 100)])  # empty: never in a run
    refs = gather(normalize(str(tmp_path / "out"), cord)).refs
    assert [(r.index, r.out_offset, r.length, r.src_offset, r.lengths) for r in refs] == [
        (0, 0, 3500, 0, (1000, 2000, 500)), (3, 3500, 3, 0, None), (4, 3503, 500, 3500, None),
        (5, 4003, 100, 5000, None), (6, 4103, 100, 5100, None), (7, 4203, 0, 5200, None),
        (8, 4203, 100, 5200, None)]


def test_slices_of_two_owners_are_never_one_run_and_both_are_cleaned_up_alike(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a"
    body = pattern(8192, "owners")
    a.write_bytes(body)
    owned = FileBackedData(str(a), owned=True)
    borrowed = owned._borrowed()  # same file and look, no deletion right
    cord = Cord([owned.slice(0, 4096), borrowed.slice(4096, 4096)])
    facts = gather(normalize(str(tmp_path / "out"), cord), consume=True)
    assert [r.lengths for r in facts.refs] == [None, None]
    key = facts.refs[0].source
    assert key is not None
    # One piece per owner: the source is not owned by every piece, so it is kept.
    assert [d.owned for d in facts.datas[key]] == [True, False]
    report = save(tmp_path / "out", cord, consume=True)
    assert {a.action for a in report.actions} == {"copied"}
    assert a.read_bytes() == body
    assert (tmp_path / "out").read_bytes() == body


@pytest.mark.parametrize("consume", [False, True])
def test_a_run_is_one_copy_and_its_pieces_are_each_reported(tmp_path: Path, consume: bool
                                                            ) -> None:
    src = tmp_path / "src"
    body = pattern(64 * 1000, "run")
    src.write_bytes(body)
    whole = FileBackedData(str(src), owned=consume)
    cord = Cord([b"<", *(whole.slice(i * 64, 64) for i in range(1000)), b">"])
    planned = plan(tmp_path / "out", cord, consume=consume)
    counter = Count()
    with _sys.use(counter):
        report = save(tmp_path / "out", cord, consume=consume)
    assert (tmp_path / "out").read_bytes() == b"<" + body + b">"
    assert src.exists() is not consume
    want = report.actions[1].action  # consumed: moved, or adopted where ranges insert
    assert want in ({"moved", "adopted"} if consume else {"copied"})
    assert len(report.actions) == len(planned.actions) == 1002
    assert [(a.index, a.out_offset, a.length, a.src_offset, a.action)
            for a in report.actions] == [
        (0, 0, 1, 0, "written"),
        *((1 + i, 1 + 64 * i, 64, 64 * i, want) for i in range(1000)),
        (1001, 64_001, 1, 0, "written")]
    assert report.actions == planned.actions
    if not consume:  # one copy_file_range for the 1000 slices, one look at the source
        assert counter.calls.get("copy_file_range") == 1
        assert report.bytes_copied == 64_000


def test_interleaved_sources_are_each_looked_at_after_their_last_copy(tmp_path: Path
                                                                     ) -> None:
    """Rows taken in turn from two files are copied one by one; a file rewritten between two
    of its copies is still a DataChangedError (the look after the last copy sees it)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(pattern(64_000, "a"))
    b.write_bytes(pattern(64_000, "b"))
    wa, wb = FileBackedData(str(a)), FileBackedData(str(b))
    cord = Cord([w.slice(i * 64, 64) for i in range(1000) for w in (wa, wb)])

    class Rewrite(_sys.Backend):
        copies = 0

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "copy_file_range":
                self.copies += 1
                if self.copies == 3:  # after a's first and b's first row
                    with open(a, "r+b") as f:
                        f.write(b"X")
                    os.utime(a, ns=(1, 1))

    out = tmp_path / "out"
    with _sys.use(Rewrite()), pytest.raises(DataChangedError) as caught:
        save(out, cord)
    assert caught.value.path == str(a)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    # Unchanged, the same save copies every row and looks at each file once, not per row.
    a.write_bytes(pattern(64_000, "a"))
    wa = FileBackedData(str(a))
    cord = Cord([w.slice(i * 64, 64) for i in range(1000) for w in (wa, wb)])
    counter = Count()
    with _sys.use(counter):
        report = save(out, cord)
    assert counter.calls["copy_file_range"] == 2000
    assert counter.calls["fstat"] < 20, counter.calls
    assert out.read_bytes() == b"".join(
        body[i * 64:(i + 1) * 64] for i in range(1000)
        for body in (pattern(64_000, "a"), pattern(64_000, "b")))
    assert len(report.actions) == 2000


def test_runs_into_several_outputs_are_reported_in_output_order(tmp_path: Path) -> None:
    """Three outputs, one built around an adopted source (filled after the others where the
    file system inserts ranges, moved otherwise): every piece is reported once, in the order
    of the outputs and their pieces, with its own offsets, and every byte is where it goes."""
    from filecord import save_many

    x, y = tmp_path / "x", tmp_path / "y"
    bx, by = pattern(8192, "x"), pattern(64 * 300, "y")
    x.write_bytes(bx)
    y.write_bytes(by)
    wx, wy = FileBackedData(str(x), owned=True), FileBackedData(str(y), owned=True)
    head = pattern(4096, "head")
    outs = {
        tmp_path / "a": Cord([head, wx.slice(0, 4096), wx.slice(4096, 4096)]),
        tmp_path / "b": Cord([wy.slice(i * 64, 64) for i in range(150)]),
        tmp_path / "c": Cord([b"c", *(wy.slice((150 + i) * 64, 64) for i in range(150))]),
    }
    report = save_many(outs, consume=True)
    assert (tmp_path / "a").read_bytes() == head + bx
    assert (tmp_path / "b").read_bytes() == by[:150 * 64]
    assert (tmp_path / "c").read_bytes() == b"c" + by[150 * 64:]
    assert not x.exists()
    assert not y.exists()
    got = [(a.output, a.index, a.out_offset, a.length, a.src_offset) for a in report.actions]
    assert got == [
        (str(tmp_path / "a"), 0, 0, 4096, 0), (str(tmp_path / "a"), 1, 4096, 4096, 0),
        (str(tmp_path / "a"), 2, 8192, 4096, 4096),
        *((str(tmp_path / "b"), i, i * 64, 64, i * 64) for i in range(150)),
        (str(tmp_path / "c"), 0, 0, 1, 0),
        *((str(tmp_path / "c"), 1 + i, 1 + i * 64, 64, (150 + i) * 64) for i in range(150))]
    assert [a.action for a in report.actions][:3] in (
        ["written", "adopted", "adopted"], ["written", "moved", "moved"])
    assert {a.action for a in report.actions[3:]} - {"written"} == {"moved"}


@pytest.mark.parametrize("at", [1, 2, 3, 4, 5])
def test_a_source_closed_for_the_descriptor_bound_is_held_to_its_first_baseline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """With one source descriptor open at a time, each interleaved slice closes the other
    source and opens its own again; a same-size rewrite of A with its mtime put back (only
    the change time moves), after the at-th copy, is still a DataChangedError, and without
    it the output is exact."""
    from filecord._txn import fill
    monkeypatch.setattr(fill, "OPEN_SOURCES", 1)
    m = 64 * 1024
    a_data = bytes(range(256)) * (4 * m // 256)
    b_data = bytes(reversed(range(256))) * (2 * m // 256)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(a_data)
    b.write_bytes(b_data)
    st = a.stat()

    def interleaved() -> Cord:  # A, B, A, B, A: every slice switches source
        return Cord([FileBackedData(a, offset=0, length=m), FileBackedData(b, offset=0, length=m),
                     FileBackedData(a, offset=m, length=m), FileBackedData(b, offset=m, length=m),
                     FileBackedData(a, offset=2 * m, length=2 * m)])

    save(tmp_path / "plain.bin", interleaved())
    assert (tmp_path / "plain.bin").read_bytes() == (
        a_data[:m] + b_data[:m] + a_data[m:2 * m] + b_data[m:] + a_data[2 * m:])
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == at:
            with open(a, "r+b") as f:
                f.write(bytes(x ^ 0x5A for x in a_data[:4096]))
            os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))

    with pytest.raises(DataChangedError):
        save(tmp_path / "out.bin", interleaved(), progress=progress)
    assert len(calls) >= at
    assert not (tmp_path / "out.bin").exists()
    assert b.read_bytes() == b_data
