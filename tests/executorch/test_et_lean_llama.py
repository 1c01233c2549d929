"""A Hugging Face Llama exported lean: sharded safetensors, loaded memory-mapped, lowered to
XNNPACK with its weights as named data in a ``.ptd``, saved by filecord under ``lean_export()``.

The model is ``transformers``' ``LlamaForCausalLM`` from a small config with random weights,
written by ``save_pretrained`` as several safetensors shards and an index.  Its parameters are
then replaced by views of the shard files' pages (``filecord.safetensors.load_mapped``: one
copy-on-write mapping per shard), so the export reads the weights from the files.  The
same module is exported twice, through the same ExecuTorch calls: once as ExecuTorch does it
(its own ``save`` and ``write_tensor_data_to_file``) and once under ``lean_export()`` saved with
``filecord.executorch.save``.  The two ``.pte`` and ``.ptd`` must be the same bytes, and the
ExecuTorch runtime, given the lean files, must give eager PyTorch's logits.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from et_helpers import run_program

import filecord.executorch as fe
import filecord.safetensors

torch = pytest.importorskip("torch", reason="interop tests need torch")
pytest.importorskip("executorch", reason="interop tests need executorch")
if importlib.util.find_spec("transformers") is None:
    pytest.skip("the Llama test needs transformers", allow_module_level=True)

pytestmark = pytest.mark.interop

TAG = "model"
DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def _write_checkpoint(directory: Path) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory, max_shard_size="100KB")
    return config


def _export(module: Any, ids: Any, out: Path, *, lean: bool) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )
    from torch.export import export

    out.mkdir()
    with fe.lean_export() if lean else contextlib.nullcontext():
        ep = export(module, (ids,))
        graph = ep.module()
        delegate_external_constants_pass_unlifted(graph, gen_tag_fn=lambda _node: TAG)
        ep = export(graph, (ids,))
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        manager = edge.to_executorch(ExecutorchBackendConfig(external_constants=lambda _n: TAG))
        if lean:
            fe.save(out / "llama.pte", manager)
        else:
            manager.save(str(out / "llama.pte"))
            manager.write_tensor_data_to_file(str(out))


def test_a_sharded_safetensors_llama_exported_lean_to_xnnpack_is_executorchs_bytes_and_runs(
    tmp_path: Path,
) -> None:
    from transformers import LlamaForCausalLM

    ckpt = tmp_path / "ckpt"
    config = _write_checkpoint(ckpt)
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    assert len(shards) >= 3, shards  # really sharded

    torch.manual_seed(1)
    model = LlamaForCausalLM(config).eval()
    state = filecord.safetensors.load_mapped(ckpt)  # copy-on-write views of the shards
    assert set(state) == set(model.state_dict())
    model.load_state_dict(state, assign=True)
    # The parameters are the files' pages now, not the random init above.
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.data_ptr() == state["model.layers.0.self_attn.q_proj.weight"].data_ptr()

    class Logits(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: Any) -> Any:
            return self.m(input_ids=ids, use_cache=False).logits

    module = Logits().eval().requires_grad_(False)
    ids = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager = module(ids)

    _export(module, ids, tmp_path / "executorch", lean=False)
    _export(module, ids, tmp_path / "lean", lean=True)

    theirs = sorted(p.name for p in (tmp_path / "executorch").iterdir())
    ours = sorted(p.name for p in (tmp_path / "lean").iterdir())
    assert theirs == ours == ["llama.pte", f"{TAG}.ptd"]
    for name in ours:
        a = (tmp_path / "executorch" / name).read_bytes()
        b = (tmp_path / "lean" / name).read_bytes()
        assert a == b, f"{name}: {len(a)} bytes from ExecuTorch, {len(b)} from lean_export"
    # The weights are in the .ptd (named data of the delegate), not in the program.
    ptd = fe.read_ptd(tmp_path / "lean" / f"{TAG}.ptd")
    weights = sum(t.numel() * 4 for t in state.values())
    assert sum(len(e.data) for e in ptd.entries.values()) >= weights * 0.99

    got = run_program(tmp_path / "lean" / "llama.pte", ids, tmp_path / "lean" / f"{TAG}.ptd")
    assert got.shape == eager.shape == (1, 12, config.vocab_size)
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
