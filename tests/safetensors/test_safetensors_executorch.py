"""A model's checkpoint sharded, merged and converted to ``.ptd`` with consume, then run by the
ExecuTorch runtime with a program exported with external constants: outputs equal PyTorch's.

Two models: a small decoder block built from ``torch.nn`` (no other package needed), and a
small Llama built by ``transformers`` from a config with random weights, sharded by its own
``save_pretrained``.
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
    merge(merged, [ckpt / "model.safetensors.index.json"], consume=True)
    assert list(ckpt.iterdir()) == []  # shards and index consumed
    ptd = tmp_path / "block.ptd"
    report = convert(ptd, merged, consume=True)
    assert not merged.exists()
    assert report.bytes_by_action().get("moved", 0) == sum(
        t.numel() * t.element_size() for t in state.values())
    assert set(read_ptd(ptd).entries) == set(state)

    program = Runtime.get().load_program(pte, data_path=os.fspath(ptd))
    got = program.load_method("forward").execute([ids])[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_transformers_checkpoint_merged_converted_and_run(tmp_path: Path) -> None:
    """A small Llama built from a config (random weights): ``save_pretrained`` shards it, filecord
    merges the shards and converts them to ``.ptd`` (both consuming), ``filecord merge`` adds
    the non-persistent buffers the program also reads, and ExecuTorch runs it."""
    transformers = pytest.importorskip("transformers")
    import subprocess
    import sys

    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime
    from torch.export import export

    from filecord.executorch import save_state_dict

    class Logits(transformers.LlamaForCausalLM):  # type: ignore[misc]
        def forward(self, ids: Any) -> Any:  # parameter names stay the checkpoint's keys
            return super().forward(input_ids=ids, use_cache=False).logits

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False)
    model = Logits(cfg).eval()
    ids = torch.randint(0, 128, (1, 8))
    expected = model(ids)
    et = to_edge_transform_and_lower(export(model, (ids,))).to_executorch(
        ExecutorchBackendConfig(external_constants=True))
    et.save(os.fspath(tmp_path / "llama.pte"))

    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt, max_shard_size="20KB")
    shards = [p for p in ckpt.iterdir() if p.suffix == ".safetensors"]
    assert len(shards) >= 3
    report = merge(tmp_path / "model.safetensors", [ckpt / "model.safetensors.index.json"],
                   consume=True)
    assert {a.action for a in report.file_actions()} == {"moved"}
    assert not any(p.exists() for p in shards)
    convert(tmp_path / "weights.ptd", tmp_path / "model.safetensors", consume=True)

    weights = model.state_dict()
    buffers = {k: v for k, v in model.named_buffers() if k not in weights}
    assert buffers  # rotary frequencies: not in a checkpoint, but constants of the program
    save_state_dict(tmp_path / "buffers.ptd", buffers, consume=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "merge", "-o", tmp_path / "model.ptd",
                        tmp_path / "weights.ptd", tmp_path / "buffers.ptd", "--consume", "-q"],
                       env=env, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "weights.ptd").exists()
    assert set(read_ptd(tmp_path / "model.ptd").entries) == set(weights) | set(buffers)

    program = Runtime.get().load_program(tmp_path / "llama.pte",
                                         data_path=os.fspath(tmp_path / "model.ptd"))
    got = program.load_method("forward").execute([ids])[0]
    assert torch.allclose(got, expected, atol=1e-5)
