"""Issue 26 item 1, end to end at a small size: an exported program's weights file adopted as
its ``.ptd`` and run by the ExecuTorch runtime.

An ``nn.Embedding`` whose weight is a file (``torch.from_file(..., shared=True)``) is exported
with executorch (the weight an external constant, segments on 4 KiB as
``ExecutorchBackendConfig(segment_alignment=4096)`` lays them); the emitted weight bytes are
checked equal to the file and replaced in the manager's cord by ExecuTorch's own
``FileBackedData.move_from`` of that file.  ``filecord.executorch.save(..., consume=True)``
then adopts the file in place: the ``.ptd`` is the same inode, the weights at a 4 KiB offset
with their exact bytes, nothing copied or moved, and the runtime's lookups equal PyTorch's.
The larger sizes, with physical extents and memory, are ``bench/adopt_bench.py --runtime``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from et_helpers import run_program

import filecord.executorch as fe
from filecord._plan.facts import probe_insert
from filecord.executorch import read_ptd

pytestmark = pytest.mark.interop

ROWS, DIM = 16384, 256  # 16 MiB of float32
TAG = "weights"


def _weights(torch: Any) -> bytes:
    return bytes(torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(26))
                 .numpy().tobytes())


def test_exported_weights_file_is_adopted_as_the_ptd_and_runs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    if not probe_insert(str(tmp_path)):
        pytest.skip("the file system under tmp_path does not insert ranges (no adoption)")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData
    from torch.export import export

    data = _weights(torch)
    blob = tmp_path / "weights.bin"
    blob.write_bytes(data)
    inode = os.stat(blob).st_ino
    weight = torch.from_file(str(blob), shared=True, size=ROWS * DIM,
                             dtype=torch.float32).view(ROWS, DIM)

    class Lookup(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(ROWS, DIM, _weight=weight, _freeze=True)

        def forward(self, x: Any) -> Any:
            return self.emb(x)

    module = Lookup().eval()
    x = torch.tensor([0, 1, ROWS // 2, ROWS - 1])
    expected = module(x)
    manager = to_edge(export(module, (x,))).to_executorch(
        ExecutorchBackendConfig(external_constants=lambda node: TAG, segment_alignment=4096))
    cord = manager._tensor_data[TAG]
    (at,) = [i for i, b in enumerate(cord._buffers) if len(b) == len(data)]
    assert cord._buffers[at] == data  # the emitter's copy is the file's bytes
    cord._buffers[at] = EtFileBackedData.move_from(str(blob))
    owned = cord._buffers[at]._path

    out = tmp_path / "out"
    out.mkdir()
    report = fe.save(out / "model.pte", manager, consume=True)

    (act,) = [a for a in report.actions if a.source == owned]
    assert act.action == "adopted"
    assert report.bytes_copied == 0
    assert report.bytes_moved == 0
    assert not os.path.exists(owned)
    assert not blob.exists()
    ptd = out / f"{TAG}.ptd"
    assert os.stat(ptd).st_ino == inode  # the weights file itself became the .ptd
    parsed = read_ptd(ptd)
    (entry,) = parsed.entries.values()
    offset = parsed.segments[entry.segment_index].file_offset
    assert offset == act.out_offset
    assert offset % 4096 == 0
    with open(ptd, "rb") as f:
        f.seek(offset)
        assert f.read(len(data)) == data
    got = run_program(out / "model.pte", x, ptd)
    assert got.numpy().tobytes() == expected.numpy().tobytes()
