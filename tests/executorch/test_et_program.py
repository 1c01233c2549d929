"""Program.save and friends on hand-built programs and data files (no executorch needed)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from filecord import FileBackedData
from filecord._pieces.cord import Cord
from filecord.errors import DataChangedError, SourceIsOutputError
from filecord.executorch import Program, PtdEntry, ScalarType, TensorLayout, build_ptd, read_ptd
from filecord.executorch._merge import merge_ptd
from filecord.executorch.errors import InvalidTagError, NamedDataConflictError
from filecord.executorch.program import merged_file_name, ptd_file_name
from filecord_testing import leftovers, pattern

PTE = b"ET12-not-parsed-by-save" + bytes(100)
LAYOUT = TensorLayout.contiguous(ScalarType.FLOAT, (2, 3))


def owned(tmp_path: Path, name: str, data: bytes) -> FileBackedData:
    path = tmp_path / name
    path.write_bytes(data)
    return FileBackedData(path, owned=True)


def ptd(entries: dict[str, bytes | FileBackedData], layout: TensorLayout | None = LAYOUT) -> Cord:
    return build_ptd({k: PtdEntry(k, v, layout) for k, v in entries.items()})


def test_file_names() -> None:
    assert ptd_file_name("weights") == "weights.ptd"
    assert ptd_file_name("aoti_cuda_blob.ptd") == "aoti_cuda_blob.ptd"
    assert merged_file_name("/x/model.pte") == "model.ptd"
    assert merged_file_name("model") == "model.ptd"
    with pytest.raises(InvalidTagError):
        ptd_file_name("../escape")
    with pytest.raises(ValueError, match=r"both be written as a\.ptd"):
        Program(Cord([PTE]), {"a": Cord([b"1"]), "a.ptd": Cord([b"2"])})


def test_save_writes_every_file_in_one_transaction(tmp_path: Path) -> None:
    a = ptd({"w": pattern(24, "w")})
    b = ptd({"b": pattern(24, "b")})
    prog = Program(Cord([PTE]), {"tag_a": a, "tag_b.ptd": b})
    report = prog.save(tmp_path / "m.pte")
    assert (tmp_path / "m.pte").read_bytes() == PTE
    assert (tmp_path / "tag_a.ptd").read_bytes() == bytes(a)
    assert (tmp_path / "tag_b.ptd").read_bytes() == bytes(b)
    assert report.outputs == tuple(str(tmp_path / n) for n in ("m.pte", "tag_a.ptd", "tag_b.ptd"))
    assert report.journal  # several outputs: one journaled transaction
    assert leftovers(tmp_path) == []


def test_data_dir(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    prog = Program(Cord([PTE]), {"w": ptd({"w": pattern(24)})})
    prog.save(tmp_path / "m.pte", data_dir=tmp_path / "data")
    assert sorted(os.listdir(tmp_path)) == ["data", "m.pte"]
    assert os.listdir(tmp_path / "data") == ["w.ptd"]


def test_merge_data_two_tags_equals_merge_ptd(tmp_path: Path) -> None:
    shared = pattern(40, "shared")
    a = ptd({"w": pattern(24, "w"), "s1": shared})
    b = ptd({"b": pattern(24, "b"), "s2": shared})
    prog = Program(Cord([PTE]), {"tag_a": a, "tag_b": b})
    prog.save(tmp_path / "m.pte", merge_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.ptd", "m.pte"]
    merged = read_ptd(tmp_path / "m.ptd")
    assert list(merged.entries) == ["w", "s1", "b", "s2"]
    assert len(merged.segments) == 3  # the blob both tags hold is stored once
    assert merged.entries["s1"].segment_index == merged.entries["s2"].segment_index
    assert merged.entries["b"].data.to_bytes() == pattern(24, "b")
    assert all(e.layout == LAYOUT for e in merged.entries.values())
    # The same as merging the two files once written separately.
    (tmp_path / "sep").mkdir()
    prog.save(tmp_path / "sep" / "m.pte")
    files = [tmp_path / "sep" / "tag_a.ptd", tmp_path / "sep" / "tag_b.ptd"]
    assert (tmp_path / "m.ptd").read_bytes() == bytes(merge_ptd(files))


def test_merge_data_one_tag_keeps_its_bytes(tmp_path: Path) -> None:
    a = ptd({"w": pattern(24, "w")})
    Program(Cord([PTE]), {"only": a}).save(tmp_path / "m.pte", merge_data=True)
    assert (tmp_path / "m.ptd").read_bytes() == bytes(a)


def test_merge_keeps_file_backed_data_by_reference(tmp_path: Path) -> None:
    w = owned(tmp_path, "w.bin", pattern(5000, "w"))
    b = owned(tmp_path, "b.bin", pattern(300, "b"))
    prog = Program(Cord([PTE]), {"a": ptd({"w": w}), "b": ptd({"b": b})})
    ((name, merged),) = prog.data_files(merge_data=True, name="m.pte").items()
    assert name == "m.ptd"
    assert merged.file_backed_buffers() == [w, b]


def test_merge_conflicts_name_both_tags() -> None:
    prog = Program(
        Cord([PTE]), {"a": ptd({"k": pattern(24, "1")}), "b": ptd({"k": pattern(24, "2")})}
    )
    with pytest.raises(
        NamedDataConflictError, match="'k' holds different bytes in tag 'a' and in tag 'b'"
    ):
        prog.data_files(merge_data=True)
    other = TensorLayout.contiguous(ScalarType.FLOAT, (3, 2))
    prog = Program(
        Cord([PTE]), {"a": ptd({"k": pattern(24)}), "b": ptd({"k": pattern(24)}, layout=other)}
    )
    with pytest.raises(NamedDataConflictError, match="layout"):
        prog.data_files(merge_data=True)
    # Equal bytes and layout under two tags: kept once.
    prog = Program(Cord([PTE]), {"a": ptd({"k": pattern(24)}), "b": ptd({"k": pattern(24)})})
    (merged,) = prog.data_files(merge_data=True).values()
    assert bytes(merged) == bytes(ptd({"k": pattern(24)}))


def test_consume_moves_then_second_save_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    blob = pattern(70_000, "blob")
    w = owned(tmp_path, "w.bin", blob)
    pte_blob = owned(tmp_path, "p.bin", pattern(9000, "p"))
    prog = Program(Cord([PTE, pte_blob]), {"weights": ptd({"w": w})})
    expected_pte, expected_ptd = bytes(prog.pte), bytes(prog.data["weights"])
    report = prog.save(out / "m.pte", consume=True)
    assert report.bytes_by_action()["moved"] == 70_000 + 9000
    assert not (tmp_path / "w.bin").exists()
    assert not (tmp_path / "p.bin").exists()
    assert (out / "m.pte").read_bytes() == expected_pte
    assert (out / "weights.ptd").read_bytes() == expected_ptd
    before = {n: os.stat(out / n) for n in os.listdir(out)}

    (tmp_path / "again").mkdir()
    for target in (out / "m.pte", tmp_path / "again" / "m.pte"):
        with pytest.raises(DataChangedError, match="gone"):
            prog.save(target, consume=True)
        with pytest.raises(DataChangedError):
            prog.write_tensor_data_to_file(out)
    assert os.listdir(tmp_path / "again") == []  # refused before any file was opened
    for n, st in before.items():  # the first outputs are intact, not even rewritten
        assert os.stat(out / n).st_mtime_ns == st.st_mtime_ns
    assert (out / "m.pte").read_bytes() == expected_pte
    assert (out / "weights.ptd").read_bytes() == expected_ptd


def test_preflight_covers_the_data_files(tmp_path: Path) -> None:
    w = owned(tmp_path, "w.bin", pattern(4096, "w"))
    prog = Program(Cord([PTE]), {"weights": ptd({"w": w})})
    with open(w.path, "r+b") as f:  # the data file's source changes, the .pte's does not
        f.write(b"changed")
    with pytest.raises(DataChangedError):
        prog.save(tmp_path / "m.pte", consume=True)
    assert sorted(os.listdir(tmp_path)) == ["w.bin"]  # not even the .pte was created


@pytest.mark.parametrize("which", ["pte", "ptd"])
def test_output_that_is_a_source_is_refused(tmp_path: Path, which: str) -> None:
    first = Program(Cord([PTE]), {"w": ptd({"w": pattern(100)})})
    first.save(tmp_path / "m.pte")
    pte_bytes, ptd_bytes = (tmp_path / "m.pte").read_bytes(), (tmp_path / "w.ptd").read_bytes()
    src = FileBackedData(tmp_path / ("m.pte" if which == "pte" else "w.ptd"))
    # A program whose pieces are read from the very files it would be saved over.
    prog = Program(
        Cord([PTE]) if which == "ptd" else Cord([src]),
        {"w": Cord([src]) if which == "ptd" else ptd({"w": pattern(100)})},
    )
    with pytest.raises(SourceIsOutputError):
        prog.save(tmp_path / "m.pte", consume=True)
    assert (tmp_path / "m.pte").read_bytes() == pte_bytes
    assert (tmp_path / "w.ptd").read_bytes() == ptd_bytes
    assert leftovers(tmp_path) == []


def test_write_tensor_data_to_file_and_copies(tmp_path: Path) -> None:
    w = owned(tmp_path, "w.bin", pattern(3000, "w"))
    p = owned(tmp_path, "p.bin", pattern(500, "p"))
    prog = Program(Cord([PTE, p]), {"weights": ptd({"w": w})})
    (tmp_path / "d").mkdir()
    report = prog.write_tensor_data_to_file(tmp_path / "d")
    assert report is not None
    assert os.listdir(tmp_path / "d") == ["weights.ptd"]
    assert (tmp_path / "d" / "weights.ptd").read_bytes() == bytes(prog.data["weights"])
    sink = io.BytesIO()
    assert prog.write_to_file(sink) == len(PTE) + 500
    assert sink.getvalue() == prog.buffer == PTE + pattern(500, "p")
    assert Path(p.path).exists()  # copies never consume
    assert Program(Cord([PTE])).write_tensor_data_to_file(tmp_path / "d") is None


def test_plan_is_a_dry_run(tmp_path: Path) -> None:
    w = owned(tmp_path, "w.bin", pattern(8192, "w"))
    prog = Program(Cord([PTE]), {"weights": ptd({"w": w})})
    report = prog.plan(tmp_path / "m.pte", consume=True)
    assert report.dry_run
    assert report.bytes_by_action()["moved"] == 8192
    assert sorted(os.listdir(tmp_path)) == ["w.bin"]


def test_from_manager_refuses_other_objects() -> None:
    from filecord.executorch import from_manager

    with pytest.raises(TypeError, match="ExecutorchProgramManager"):
        from_manager(object())


def test_clone_ready_lays_segments_and_constants_on_4096_by_reference(tmp_path: Path) -> None:
    """No executorch needed: a hand-built program with file-backed constants and a delegate;
    the runtime side is tested in test_et_program_interop and tests/fsmatrix."""
    from et_helpers import DELEGATE_BLOB, sample_program

    from filecord.executorch import NamedDataStore, build_program, read_pte

    weight = owned(tmp_path, "w.bin", pattern(5000, "w"))
    bias = owned(tmp_path, "b.bin", pattern(12, "b"))
    program = sample_program(constants=(b"", weight, bias))
    store = NamedDataStore()
    store.add_named_data("ext", owned(tmp_path, "e.bin", pattern(777, "e")),
                         external_tag="weights", tensor_layout=LAYOUT)
    out = build_program(program, store)
    prog = Program(out.pte, out.data_files).clone_ready()
    # Pieces by reference: the sources are still the objects the save will clone from.
    backed = {d.path for c in (prog.pte, *prog.data.values()) for d in c.file_backed_buffers()}
    assert backed == {weight.path, bias.path, str(tmp_path / "e.bin")}
    prog.save(tmp_path / "m.pte")
    pte = read_pte(tmp_path / "m.pte")
    assert all(s.file_offset % 4096 == 0 for s in pte.segments)
    assert pte.constant_segment is not None
    k, offsets = pte.constant_segment
    seg = pte.segments[k]
    for off, want in zip(offsets[1:], (pattern(5000, "w"), pattern(12, "b")), strict=True):
        assert (seg.file_offset + off) % 4096 == 0
        assert seg.data.read_range(off, len(want)) == want
    blobs = [d.data for d in pte.delegates]
    assert [b if isinstance(b, bytes) else b.to_bytes() for b in blobs] == [DELEGATE_BLOB]
    data = read_ptd(tmp_path / "weights.ptd")
    assert all(s.file_offset % 4096 == 0 for s in data.segments)
    assert data.segments[0].data.to_bytes() == pattern(777, "e")
