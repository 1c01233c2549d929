"""Issue 13: a real XNNPACK program saved clone-ready with ``consume=True`` copies 0 data bytes.

The program is exported with ExecuTorch (``XnnpackPartitioner``, its two weight matrices tagged
as external data, so they go to ``model.ptd``; the delegate blob and the biases stay segments
of the ``.pte``).  filecord saves it once as ExecuTorch lays it out (128-byte segments); then
every segment of both files is put in a file of its own and adopted
(``FileBackedData.move_from``), so the program is a ``.pte`` and a ``.ptd`` whose data are all
owned files.  ``Program.save(consume=True, clone_ready=True)`` on XFS (reflink) and btrfs:

* every file-backed piece is cloned whole, and the transfer counters show 0 bytes copied and
  0 moved;
* ``statvfs`` of the test file system grows by far less than the data (the data's extents now
  belong to the outputs; the sources are deleted at commit);
* each segment of both outputs starts on a 4 KiB file offset;
* the ExecuTorch runtime loads the result and its outputs equal PyTorch's.

And the failure case: a fault (EIO through ``filecord._io.syscalls``) after the clones rolls back to
byte-exact sources and leaves no temp, journal or lock.
"""

from __future__ import annotations

import errno
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fskit
import pytest

from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from filecord.errors import SaveError

pytestmark = pytest.mark.root

MiB = fskit.MiB
B = 4096


@dataclass
class Export:
    manager: Any
    x: Any
    expected: Any  # PyTorch's output


@pytest.fixture(scope="module")
def exported() -> Export:
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch.runtime")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )
    from torch.export import export

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    ).eval()
    x = torch.randn(3, 512)
    with torch.no_grad():
        expected = model(x)
    tagged = export(model, (x,), strict=True).module()
    delegate_external_constants_pass_unlifted(
        tagged, gen_tag_fn=lambda n: "model" if "weight" in n.name else None
    )
    program = export(tagged, (x,), strict=True)
    manager = to_edge_transform_and_lower(
        program, partitioner=[XnnpackPartitioner()]
    ).to_executorch(ExecutorchBackendConfig())
    return Export(manager, x, expected)


def _owned_copy(path: Path, segments: list[tuple[int, int]], parts: Path, stem: str) -> Cord:
    """The file at ``path`` as a Cord whose every non-empty segment (``(file offset, size)``)
    is a file of its own, adopted (owned); the bytes between them stay in memory."""
    raw = path.read_bytes()
    cord = Cord()
    pos = 0
    for i, (off, n) in enumerate(segments):
        if n == 0:
            continue
        cord.append(raw[pos:off])
        part = parts / f"{stem}{i}.bin"
        part.write_bytes(raw[off:off + n])
        cord.append(FileBackedData.move_from(part))
        pos = off + n
    cord.append(raw[pos:])
    assert bytes(cord) == raw
    return cord


def _file_backed_program(fs: Path, ex: Export) -> tuple[Any, dict[str, bytes], int]:
    """(Program whose every segment is an owned file, {source path: bytes}, data bytes)."""
    from filecord.executorch import Program, from_manager, read_ptd, read_pte

    first = fs / "first"
    first.mkdir()
    from_manager(ex.manager).save(first / "m.pte")  # ExecuTorch's layout, written by filecord
    pte, ptd = read_pte(first / "m.pte"), read_ptd(first / "model.ptd")
    assert pte.header is not None
    assert pte.header.segment_base_offset % B  # 128-aligned: nothing would clone as it is
    parts = fs / "parts"
    parts.mkdir()
    program = Program(
        _owned_copy(first / "m.pte", [(s.file_offset, s.size) for s in pte.segments], parts,
                    "pte"),
        {"model": _owned_copy(first / "model.ptd",
                              [(s.file_offset, s.size) for s in ptd.segments], parts, "ptd")},
    )
    for p in first.iterdir():
        p.unlink()
    first.rmdir()
    sources = {d.path: Path(d.path).read_bytes()
               for c in (program.pte, *program.data.values()) for d in c.file_backed_buffers()}
    data = sum(len(v) for v in sources.values())
    assert len(sources) >= 5  # delegate blob and two biases in the .pte, two weights in the .ptd
    return program, sources, data


def _run(pte: Path, ptd: Path, x: Any) -> Any:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte), data_path=str(ptd))
    return program.load_method("forward").execute([x])[0]


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_xnnpack_program_saved_clone_ready_copies_nothing(mount, kind, exported):
    import torch

    from filecord.executorch import read_ptd, read_pte

    fs = mount(kind, 512 * MiB)
    program, sources, data = _file_backed_program(fs, exported)
    out = fs / "out"
    out.mkdir()
    # Contrast: as ExecuTorch lays it out (128-byte segments) nothing clones.
    plain = program.plan(out / "m.pte", consume=True)
    assert "cloned" not in {a.action for a in plain.file_actions()}
    os.sync()
    before = fskit.fs_used(fs)
    report = program.save(out / "m.pte", consume=True, clone_ready=True)
    os.sync()
    grew = fskit.fs_used(fs) - before

    acts = {(a.action, a.tail, a.reason) for a in report.file_actions()}
    assert acts == {("cloned", 0, None)}, report.to_dict()["pieces"]
    assert report.bytes_copied == 0, report.summary()
    assert report.bytes_moved == 0
    assert report.bytes_cloned == data
    assert not any(os.path.exists(p) for p in sources)  # consumed at commit
    # The file system holds the data once: the outputs own the extents the sources had.  What
    # is new is the programs' headers and flatbuffers, and per segment that ends mid-block
    # before more output follows, the block the kernel unshares to zero its end.
    assert grew < 256 * 1024, f"{kind}: grew by {grew} bytes for {data} bytes of data"
    print(f"{kind}: {data} data bytes saved clone-ready, consume: file system grew by {grew}")

    pte, ptd = read_pte(out / "m.pte"), read_ptd(out / "model.ptd")
    assert pte.header is not None
    assert all(s.file_offset % B == 0 for s in pte.segments)
    assert all(s.file_offset % B == 0 for s in ptd.segments)
    # The bytes of every segment are the very bytes its source held.
    got = sorted(s.data.to_bytes() for s in (*pte.segments, *ptd.segments) if s.size)
    assert got == sorted(sources.values())
    result = _run(out / "m.pte", out / "model.ptd", exported.x)
    assert torch.allclose(result, exported.expected, atol=1e-5, rtol=0)


class _FailAfterClones(_sys.Backend):
    """EIO at the first ``op`` call (``commit``: the write of the journal's committed step, the
    commit point) once ``clones`` clones ran."""

    def __init__(self, op: str, clones: int) -> None:
        self.op, self.want, self.seen = op, clones, 0
        self.fired_after: int | None = None

    def _fire(self, op: str) -> None:
        if self.seen >= self.want and self.fired_after is None:
            self.fired_after = self.seen
            raise OSError(errno.EIO, f"injected at {op} after {self.seen} clones")

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        # the save's clones, not the clone probe's (between two files without names)
        if op == "clone_range" and not os.readlink(f"/proc/self/fd/{args[3]}").endswith(
                "(deleted)"):
            self.seen += 1
        if self.op == op:
            self._fire(op)

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        if self.op == "commit" and b'"stage":"committed"' in bytes(data):
            self._fire("the committed step")
        return super().pwrite(fd, data, offset)


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
@pytest.mark.parametrize("op", ["fsync", "commit"])
def test_a_fault_after_the_clones_rolls_back_to_exact_sources(mount, kind, op, exported):
    fs = mount(kind, 512 * MiB)
    program, sources, _data = _file_backed_program(fs, exported)
    out = fs / "out"
    out.mkdir()
    # The clone probe's answer is cached per device: a plan first, so the save's every clone
    # is one of a segment.
    program.plan(out / "m.pte", consume=True, clone_ready=True)
    fault = _FailAfterClones(op, len(sources))
    with _sys.use(fault), pytest.raises(SaveError):
        program.save(out / "m.pte", consume=True, clone_ready=True)
    assert fault.fired_after == len(sources)  # every segment was cloned before the fault
    assert sorted(os.listdir(out)) == []  # no output, temp, journal or lock
    for path, raw in sources.items():
        assert Path(path).read_bytes() == raw, path
    leftovers = [n for n in os.listdir(fs) if "filecord" in n and n != "parts"]
    assert leftovers == []
    assert sorted(os.listdir(fs / "parts")) == sorted(os.path.basename(p) for p in sources)


def test_xnnpack_program_saved_clone_ready_on_ext4_is_adopted_in_place(mount, exported):
    """Issue 26: on ext4 (no clones, but ranges insert) the clone-ready layout puts each
    segment at a 4 KiB offset, so each output is built around its largest segment's file:
    that file is adopted in place (0 bytes of it copied or moved), the others moved; the
    runtime runs the result, the weights read from the adopted ``.ptd``."""
    import torch

    from filecord.executorch import read_ptd, read_pte

    fs = mount("ext4", 512 * MiB)
    program, sources, data = _file_backed_program(fs, exported)
    out = fs / "out"
    out.mkdir()
    plan = program.plan(out / "m.pte", consume=True, clone_ready=True)
    report = program.save(out / "m.pte", consume=True, clone_ready=True)
    adopted = [a for a in report.file_actions() if a.action == "adopted"]
    assert [a.action for a in plan.file_actions()] == [a.action for a in report.file_actions()]
    assert sorted(os.path.basename(a.output) for a in adopted) == ["m.pte", "model.ptd"]
    for a in adopted:  # each the largest segment of its output, at a 4 KiB offset
        assert a.out_offset % B == 0
        assert a.length == max(x.length for x in report.file_actions() if x.output == a.output)
    assert {a.action for a in report.file_actions()} <= {"adopted", "moved"}
    assert report.bytes_copied == 0
    assert report.bytes_moved == data - sum(a.length for a in adopted)
    assert not any(os.path.exists(p) for p in sources)
    pte, ptd = read_pte(out / "m.pte"), read_ptd(out / "model.ptd")
    got = sorted(s.data.to_bytes() for s in (*pte.segments, *ptd.segments) if s.size)
    assert got == sorted(sources.values())
    result = _run(out / "m.pte", out / "model.ptd", exported.x)
    assert torch.allclose(result, exported.expected, atol=1e-5, rtol=0)
