"""Saving ExecutorchProgramManager output with filecord, against the real executorch 1.5.1.

Owned file-backed data is made the way ExecuTorch's own backends hand it over: the lowered
program's NamedDataStore gets ``FileBackedData.move_from`` objects (owning, with a finalizer)
in place of its in-memory blobs, then ``to_executorch()`` serializes them by reference.  The
model is lowered once per session; ``to_executorch()`` (milliseconds) runs per test, so every
test gets its own freshly owned source files.
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from et_helpers import PROGRAMS, Exported, run_program

import filecord.executorch as fe
from filecord.errors import DataChangedError
from filecord.executorch import from_manager, read_ptd, read_pte
from filecord.executorch._merge import merge_ptd
from filecord_testing import leftovers

pytestmark = pytest.mark.interop

TAG = "weights"


@dataclass
class Lowered:
    edge: Any  # EdgeProgramManager, lowered to XNNPACK
    blobs: list[bytes]  # the store's blobs as the backend produced them
    x: Any
    expected: Any


@pytest.fixture(scope="session")
def lowered() -> Lowered:
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )
    from torch.export import export

    class TwoLayers(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(64, 48)
            self.b = torch.nn.Linear(48, 8)

        def forward(self, x: Any) -> Any:
            return self.b(torch.relu(self.a(x)))

    module = TwoLayers().eval()
    torch.manual_seed(2)
    x = torch.randn(3, 64)
    unlifted = export(module, (x,), strict=True).module()
    # Layer a's weights go to the data file TAG, layer b's stay in the program.
    delegate_external_constants_pass_unlifted(
        unlifted, lambda node: TAG if node.target.startswith("a.") else None
    )
    edge = to_edge_transform_and_lower(
        export(unlifted, (x,), strict=True), partitioner=[XnnpackPartitioner()]
    )
    store = edge._named_data_store
    assert store.pte_data
    assert set(store.external_data) == {TAG}
    return Lowered(edge, [bytes(b) for b in store.buffers], x, module(x))


@pytest.fixture
def fresh(lowered: Lowered, tmp_path: Path) -> Callable[[], tuple[Any, list[Path]]]:
    """A new manager whose named data are owned file-backed files, and those files."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    def make() -> tuple[Any, list[Path]]:
        src = tmp_path / "sources"
        src.mkdir(exist_ok=True)
        store = lowered.edge._named_data_store
        paths = []
        for i, blob in enumerate(lowered.blobs):
            raw = src / f"blob{i}.bin"
            raw.write_bytes(blob)
            store.buffers[i] = EtFileBackedData.move_from(str(raw))
            paths.append(Path(store.buffers[i]._path))
        manager = lowered.edge.to_executorch()
        assert any(not isinstance(b, bytes) for b in manager._pte_data._buffers)
        assert any(not isinstance(b, bytes) for b in manager._tensor_data[TAG]._buffers)
        return manager, paths

    return make


def _close(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-5))


def _serialized(manager: Any) -> dict[str, bytes]:
    out = {"m.pte": bytes(manager._pte_data)}
    out.update({f"{tag}.ptd": bytes(c) for tag, c in manager._tensor_data.items()})
    return out


def test_consume_moves_owned_data_and_runs(
    fresh: Callable[[], tuple[Any, list[Path]]], lowered: Lowered, tmp_path: Path
) -> None:
    manager, sources = fresh()
    expected = _serialized(manager)
    out = tmp_path / "out"
    out.mkdir()
    report = fe.save(out / "m.pte", manager, consume=True)

    assert not any(p.exists() for p in sources)
    # every blob moved, or (on a file system that inserts ranges) the largest adopted in place
    by = report.bytes_by_action()
    assert by.get("moved", 0) + by.get("adopted", 0) == sum(len(b) for b in lowered.blobs)
    assert report.bytes_copied == 0
    assert report.copy_reasons() == {}
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == expected
    assert _close(run_program(out / "m.pte", lowered.x, out / f"{TAG}.ptd"), lowered.expected)

    # The manager's data is gone, and reading it says so instead of returning short bytes.
    with pytest.raises(DataChangedError, match="gone") as info:
        manager.write_to_file(io.BytesIO())
    assert any("from_manager" in n for n in info.value.__notes__)
    with pytest.raises(DataChangedError):
        manager.buffer  # noqa: B018 - the property reads the data
    # Saving again is refused before any output is opened; the first output is intact.
    stamps = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)}
    (tmp_path / "again").mkdir()
    for target in (out / "m.pte", tmp_path / "again" / "m.pte"):
        with pytest.raises(DataChangedError):
            fe.save(target, manager, consume=True)
    assert os.listdir(tmp_path / "again") == []
    assert {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)} == stamps
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == expected
    assert leftovers(out) == []
    # ExecuTorch's own writers open their output before reading a piece; filecord's guard
    # refuses first, so no truncated file appears (ExecuTorch's save would log and return).
    for write in (
        lambda: manager.write_tensor_data_to_file(str(tmp_path / "again")),
        lambda: manager.save(str(tmp_path / "again" / "m.pte")),
        lambda: manager.write_to_file(open(os.devnull, "wb")),  # noqa: SIM115
    ):
        with pytest.raises(DataChangedError, match="gone"):
            write()
    assert os.listdir(tmp_path / "again") == []


def test_copy_matches_managers_own_save_and_runs(
    fresh: Callable[[], tuple[Any, list[Path]]], lowered: Lowered, tmp_path: Path
) -> None:
    manager, sources = fresh()
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    report = fe.save(ours / "m.pte", manager)
    assert set(report.bytes_by_action()) == {"written", "copied"}
    assert all(p.exists() for p in sources)
    # The manager still works after the hand-over (now reading through filecord's checks).
    manager.save(str(theirs / "m.pte"))
    manager.write_tensor_data_to_file(str(theirs))
    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs)) == ["m.pte", f"{TAG}.ptd"]
    for name in os.listdir(ours):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes()
    assert _close(run_program(ours / "m.pte", lowered.x, ours / f"{TAG}.ptd"), lowered.expected)
    pte = read_pte(ours / "m.pte")
    assert pte.named_data  # layer b's weights really are in the program
    assert set(read_ptd(ours / f"{TAG}.ptd").entries) == set(
        lowered.edge._named_data_store.external_data[TAG]
    )


def test_ownership_is_taken_over_not_duplicated(
    fresh: Callable[[], tuple[Any, list[Path]]], lowered: Lowered
) -> None:
    manager, sources = fresh()
    originals = list(lowered.edge._named_data_store.buffers)
    assert all(o._finalizer.alive for o in originals)
    program = from_manager(manager)
    assert all(not o._finalizer.alive for o in originals)  # ExecuTorch will not delete them
    assert all(b.owned for b in program.pte.file_backed_buffers())
    assert {
        b.path for c in (program.pte, *program.data.values()) for b in c.file_backed_buffers()
    } == {str(p) for p in sources}
    # Dropping filecord's side leaves the files: ExecuTorch's objects still use them.
    del program, manager
    gc.collect()
    assert all(p.exists() for p in sources)
    # Dropping the last ExecuTorch reference too: filecord's owner deletes them, once.
    lowered.edge._named_data_store.buffers[:] = [b"" for _ in originals]
    del originals
    gc.collect()
    assert not any(p.exists() for p in sources)
    lowered.edge._named_data_store.buffers[:] = list(lowered.blobs)


def test_changed_source_is_refused(fresh: Callable[[], tuple[Any, list[Path]]]) -> None:
    manager, sources = fresh()
    with open(sources[0], "ab") as f:
        f.write(b"extra")
    with pytest.raises(DataChangedError, match="size ExecuTorch recorded"):
        from_manager(manager)


@pytest.mark.parametrize("name", PROGRAMS)
def test_copy_is_byte_identical_to_executorch(
    exported: dict[str, Exported], name: str, tmp_path: Path
) -> None:
    e = exported[name]
    program = from_manager(e.manager)
    report = program.save(tmp_path / e.pte.name)
    expected = {e.pte.name: e.pte.read_bytes()}
    expected.update({p.name: p.read_bytes() for p in e.ptds.values()})
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == expected
    assert len(report.outputs) == len(expected)
    assert program.buffer == e.pte.read_bytes()
    (tmp_path / "data").mkdir()
    program.write_tensor_data_to_file(tmp_path / "data")
    assert sorted(os.listdir(tmp_path / "data")) == sorted(p.name for p in e.ptds.values())


def test_two_tags_merged_into_one_data_file_runs(
    exported: dict[str, Exported], tmp_path: Path
) -> None:
    e = exported["two_tags"]
    fe.save(tmp_path / "two.pte", e.manager, merge_data=True)
    assert sorted(os.listdir(tmp_path)) == ["two.ptd", "two.pte"]
    assert (tmp_path / "two.pte").read_bytes() == e.pte.read_bytes()
    merged = tmp_path / "two.ptd"
    assert set(read_ptd(merged).entries) == {"lin.weight", "lin.bias"}
    assert merged.read_bytes() == bytes(merge_ptd([e.ptds["tag_a"], e.ptds["tag_b"]]))
    assert _close(run_program(tmp_path / "two.pte", e.x, merged), e.expected)
    # Either file alone is not enough for the runtime: the merge is what makes it load.
    with pytest.raises(RuntimeError):
        run_program(e.pte, e.x, e.ptds["tag_a"])


def test_merge_data_consume(
    fresh: Callable[[], tuple[Any, list[Path]]], lowered: Lowered, tmp_path: Path
) -> None:
    manager, sources = fresh()
    expected = _serialized(manager)
    fe.save(tmp_path / "m.pte", manager, consume=True, merge_data=True)
    assert not any(p.exists() for p in sources)
    # One tag: the merged file is that tag's data file, byte for byte, under the program's name.
    assert (tmp_path / "m.ptd").read_bytes() == expected[f"{TAG}.ptd"]
    assert _close(run_program(tmp_path / "m.pte", lowered.x, tmp_path / "m.ptd"), lowered.expected)


def test_save_takes_clone_ready_as_from_manager_save_does(
    exported: dict[str, Exported], tmp_path: Path
) -> None:
    """``fe.save(path, manager, clone_ready=True)`` writes what ``from_manager(manager)
    .save(path, clone_ready=True)`` writes (it used to be a TypeError)."""
    e = exported[PROGRAMS[0]]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fe.save(tmp_path / "a" / e.pte.name, e.manager, clone_ready=True)
    from_manager(e.manager).save(tmp_path / "b" / e.pte.name, clone_ready=True)
    a = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    assert a == {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    assert all(s.file_offset % 4096 == 0 for s in read_pte(tmp_path / "a" / e.pte.name).segments)


@pytest.mark.parametrize("name", PROGRAMS)
def test_clone_ready_puts_every_segment_on_4096_and_runs(
    exported: dict[str, Exported], name: str, tmp_path: Path
) -> None:
    """``save(clone_ready=True)``: each segment of the .pte and of the .ptd on a 4 KiB file
    offset, the segments' bytes unchanged, and the runtime loads and runs it."""
    e = exported[name]
    program = from_manager(e.manager)
    merge = len(e.ptds) > 1  # the Python runtime takes one data file per program
    program.save(tmp_path / e.pte.name, clone_ready=True, merge_data=merge)
    before, after = read_pte(e.pte), read_pte(tmp_path / e.pte.name)
    assert all(s.file_offset % 4096 == 0 for s in after.segments)
    constant = after.constant_segment
    k = None if constant is None else constant[0]
    # Every segment but the constant one keeps its bytes; in that one each tensor moves to a
    # 4 KiB offset of the file, its bytes (and its padding to 16) unchanged.
    assert [s.data.to_bytes() for s in after.segments if s.index != k] == [
        s.data.to_bytes() for s in before.segments if s.index != k]
    if constant is not None and before.constant_segment is not None:
        old_seg, new_seg = before.segments[constant[0]], after.segments[constant[0]]
        old_offs, new_offs = before.constant_segment[1], constant[1]
        for i, (a, b) in enumerate(zip(old_offs, new_offs, strict=True)):
            n = (old_offs[i + 1] if i + 1 < len(old_offs) else old_seg.size) - a
            if n:
                assert (new_seg.file_offset + b) % 4096 == 0
                assert new_seg.data.read_range(b, n) == old_seg.data.read_range(a, n)
    data = None
    ptds = sorted(p for p in tmp_path.iterdir() if p.suffix == ".ptd")
    for p in ptds:
        assert all(s.file_offset % 4096 == 0 for s in read_ptd(p).segments)
    if ptds:
        (data,) = ptds
    assert _close(run_program(tmp_path / e.pte.name, e.x, data), e.expected)
