"""A client nobody here wrote reads what filecord writes: transformers' GGUF loader.

A tiny random Llama (transformers) is converted by a conversion script written against
``filecord.gguf.GGUFWriter`` the way llama.cpp's converter does it: GGUF tensor names, Q/K rows
permuted per head (the script's job: produced by callables when their turn comes), every other
tensor passed through as a file range of the model's own ``model.safetensors`` and moved out of
it (``consume=True``).  transformers' ``load_gguf_checkpoint`` (which reads with gguf-py, maps
the names back and undoes the permutation) must give a model whose logits equal the original's
exactly.  (llama.cpp itself loads a file from the writer in ``test_gguf_llamacpp.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

import filecord.gguf as fg  # noqa: E402
from filecord.safetensors import read_safetensors  # noqa: E402

HEADS, KV_HEADS, LAYERS = 4, 2, 2
PARTS = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
         ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
         ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
         ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"),
         ("post_attention_layernorm", "ffn_norm")]


def _names() -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for i in range(LAYERS):
        for hf, gg in PARTS:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    return names


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's row order for Q/K: per head, the two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def test_transformers_loads_a_llama_converted_with_the_writer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    ckpt = read_safetensors(hf / "model.safetensors", owned=True)

    out = tmp_path / "tiny.gguf"
    w = fg.GGUFWriter(out, "llama", consume=True)
    for key, value in [("llama.context_length", 128), ("llama.embedding_length", 32),
                       ("llama.feed_forward_length", 64), ("llama.block_count", LAYERS),
                       ("llama.attention.head_count", HEADS),
                       ("llama.attention.head_count_kv", KV_HEADS), ("llama.vocab_size", 64)]:
        w.add_uint32(key, value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens",
                ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(61)])
    w.add_array("tokenizer.ggml.scores", [0.0] * 64)
    w.add_array("tokenizer.ggml.token_type", [2, 3, 3] + [6] * 61)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    produced: list[str] = []
    for name, gg in _names().items():
        t = ckpt.tensors[name]
        heads = HEADS if "q_proj" in name else KV_HEADS if "k_proj" in name else 0
        if heads:
            def make(t: Any = t, heads: int = heads, gg: str = gg) -> Any:
                produced.append(gg)
                raw = bytearray(t.data.to_bytes())
                return _permute(torch.frombuffer(raw, dtype=torch.float32)
                                .reshape(t.shape), heads)
            w.add_tensor(gg, make)
        else:
            w.add_tensor(gg, t.data, raw_shape=t.shape, raw_dtype=fg.GGMLType.F32)
    report = w.close()
    ckpt.whole.detach_cleanup()
    assert len(produced) == 2 * LAYERS
    moved = sum(a.length for a in report.actions if a.action == "moved")
    print(f"{moved} bytes moved out of model.safetensors and the scratch file; actions: "
          f"{sorted({a.action for a in report.actions})}")
    # the scratch file moves whole; model.safetensors moves down to the first Q/K range it no
    # longer needs (pieces below such a gap are copied, as the plan says)
    assert moved > 0
    assert not any(a.reason for a in report.actions if a.action == "copied"
                   and a.reason != "a gap below the moved range")

    got = load_gguf_checkpoint(str(out), return_tensors=False)
    assert got["config"]["num_key_value_heads"] == KV_HEADS
    loaded = transformers.LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(str(out), return_tensors=True,
                                   model_to_load=loaded)["tensors"]
    result = loaded.load_state_dict(tensors, strict=True)
    assert not result.missing_keys
    ids = torch.tensor([[1, 5, 9, 13, 2, 40]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
