"""A model's checkpoint sharded, merged and converted to ``.ptd`` with consume, then run by the
ExecuTorch runtime with a program exported with external constants: outputs equal PyTorch's.

The model is a small decoder block built from ``torch.nn`` (embedding, layer norm, attention,
MLP, head) with random weights; ``transformers`` is not a test dependency.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="interop tests need torch")
pytest.importorskip("executorch", reason="interop tests need executorch")

from filecord.executorch import read_ptd  # noqa: E402
from filecord.safetensors import convert, merge, save_sharded  # noqa: E402

pytestmark = pytest.mark.interop


class Block(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids)
        h = self.norm(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / 8.0, dim=-1)
        x = x + self.o(att @ self.v(h))
        x = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return self.head(x)


def test_sharded_merged_converted_checkpoint_runs_in_executorch(tmp_path: Path) -> None:
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime
    from torch.export import export

    torch.manual_seed(0)
    model = Block().eval()
    ids = torch.randint(0, 64, (1, 8))
    expected = model(ids)

    et = to_edge_transform_and_lower(export(model, (ids,))).to_executorch(
        ExecutorchBackendConfig(external_constants=True))
    pte = tmp_path / "block.pte"
    et.save(os.fspath(pte))

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state = model.state_dict()
    save_sharded(state, ckpt, max_shard_size=20_000)
    shards = sorted(p.name for p in ckpt.iterdir())
    assert len(shards) >= 3

    merged = tmp_path / "model.safetensors"
    merge([ckpt / "model.safetensors.index.json"], merged, consume=True)
    assert list(ckpt.iterdir()) == []  # shards and index consumed
    ptd = tmp_path / "block.ptd"
    report = convert(merged, ptd, consume=True)
    assert not merged.exists()
    assert report.bytes_by_action().get("moved", 0) == sum(
        t.numel() * t.element_size() for t in state.values())
    assert set(read_ptd(ptd).entries) == set(state)

    program = Runtime.get().load_program(pte, data_path=os.fspath(ptd))
    got = program.load_method("forward").execute([ids])[0]
    assert torch.allclose(got, expected, atol=1e-5)
