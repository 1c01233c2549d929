"""The pure half of Hugging Face -> GGUF: config.json to llama.cpp's keys, names, row order and
output types (no files; the conversions themselves are in tests/gguf/test_gguf_hf*.py)."""

from __future__ import annotations

from typing import Any

import pytest

from filecord.gguf._hf_model import (
    OutType,
    Permute,
    hparam_kvs,
    map_names,
    model_spec,
    out_type,
    row_order,
)
from filecord.gguf._types import GGMLType, ValueType
from filecord.gguf.errors import UnsupportedModelError

CONFIG: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "vocab_size": 300,
    "tie_word_embeddings": True,
}


def test_keys_and_types_llama_cpp_reads() -> None:
    kv = {k.key: k for k in hparam_kvs(model_spec(CONFIG), name="m", file_type=32)}
    assert kv["general.architecture"].value == "llama"
    want = {"llama.block_count": 2, "llama.context_length": 256, "llama.embedding_length": 64,
            "llama.feed_forward_length": 128, "llama.attention.head_count": 4,
            "llama.attention.head_count_kv": 2, "llama.vocab_size": 300,
            "llama.rope.dimension_count": 16, "general.file_type": 32,
            "general.quantization_version": 2}
    for key, value in want.items():
        assert (kv[key].type, kv[key].value) == (ValueType.UINT32, value), key
    assert (kv["llama.rope.freq_base"].type, kv["llama.rope.freq_base"].value) == (
        ValueType.FLOAT32, 1e6)
    assert kv["llama.attention.layer_norm_rms_epsilon"].type is ValueType.FLOAT32
    # transformers' AutoConfig (which llama.cpp's converter reads config.json through) fills
    # head_dim for Llama/Mistral, so the key is written even when config.json leaves it out
    assert (kv["llama.attention.key_length"].value, kv["llama.attention.value_length"].value) == (
        16, 16)
    qwen2 = {**CONFIG, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    assert "qwen2.attention.key_length" not in {
        k.key for k in hparam_kvs(model_spec(qwen2), name="m", file_type=32)}
    given = {k.key: k.value for k in hparam_kvs(model_spec({**CONFIG, "head_dim": 32}),
                                                name="", file_type=0)}
    assert given["llama.attention.key_length"] == given["llama.rope.dimension_count"] == 32
    assert "general.name" not in given


@pytest.mark.parametrize(("change", "says"), [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "LlamaForCausalLM.*Qwen3"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ({"num_local_experts": 8}, "mixture-of-experts"),
    ({"quantization_config": {"quant_method": "gptq"}}, "F32, F16 and BF16"),
    ({"num_key_value_heads": 3}, "multiple of"),
    ({"hidden_size": "64"}, "hidden_size: must be a positive integer"),
    ({"rms_norm_eps": None}, "rms_norm_eps: must be a positive number a float32 holds"),
])
def test_refusals_say_what_is_supported(change: dict[str, Any], says: str) -> None:
    with pytest.raises(UnsupportedModelError, match=says):
        model_spec({**CONFIG, **change})


def test_linear_rope_scaling_is_written() -> None:
    spec = model_spec({**CONFIG, "rope_scaling": {"type": "linear", "factor": 2.0},
                       "rope_parameters": None, "rope_theta": 1e4})
    kv = {k.key: k.value for k in hparam_kvs(spec, name="m", file_type=1)}
    assert kv["llama.rope.scaling.type"] == "linear"
    assert kv["llama.rope.scaling.factor"] == 2.0
    assert kv["llama.rope.freq_base"] == 1e4


def _names(layers: int) -> list[str]:
    per = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
           "self_attn.v_proj.weight", "self_attn.o_proj.weight",
           "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
           "mlp.down_proj.weight", "self_attn.rotary_emb.inv_freq"]
    return (["model.embed_tokens.weight", "model.norm.weight"]
            + [f"model.layers.{i}.{p}" for i in range(layers) for p in per])


def test_names_map_and_q_k_are_permuted() -> None:
    spec = model_spec(CONFIG)
    mapped = {m.source: m for m in map_names(spec, _names(2))}
    assert mapped["model.layers.1.self_attn.q_proj.weight"].name == "blk.1.attn_q.weight"
    assert mapped["model.layers.1.self_attn.q_proj.weight"].permute is Permute.Q
    assert mapped["model.layers.0.self_attn.k_proj.weight"].permute is Permute.K
    assert mapped["model.layers.0.mlp.down_proj.weight"].name == "blk.0.ffn_down.weight"
    assert mapped["model.norm.weight"].name == "output_norm.weight"
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in mapped  # skipped
    assert "lm_head.weight" not in mapped  # tied: llama.cpp reuses token_embd


def test_unknown_and_missing_tensors_are_refused_by_name() -> None:
    spec = model_spec(CONFIG)
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.0\.mlp\.up_proj\.bias"):
        map_names(spec, [*_names(2), "model.layers.0.mlp.up_proj.bias"])
    with pytest.raises(UnsupportedModelError, match=r"blk\.1\.attn_q\.weight"):
        map_names(spec, [n for n in _names(2) if n != "model.layers.1.self_attn.q_proj.weight"])


def test_row_order_interleaves_each_heads_halves() -> None:
    # two heads of four rows: per head, halves (0, 1 | 2, 3) become pairs (0, 2, 1, 3)
    assert row_order(8, 2) == [0, 2, 1, 3, 4, 6, 5, 7]
    assert sorted(row_order(64, 4)) == list(range(64))
    assert row_order(12, 2) == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]  # heads of 6 rows
    with pytest.raises(UnsupportedModelError):
        row_order(12, 8)  # not whole heads
    with pytest.raises(UnsupportedModelError):
        row_order(6, 2)  # heads of 3 rows: no rotary pairs


def test_out_types_follow_llama_cpp() -> None:
    assert out_type("blk.0.attn_norm.weight", (64,), GGMLType.BF16, OutType.SOURCE
                    ) is GGMLType.F32
    assert out_type("blk.0.attn_q.bias", (64,), GGMLType.F16, OutType.F16) is GGMLType.F32
    assert out_type("blk.0.attn_q.weight", (64, 64), GGMLType.BF16, OutType.SOURCE
                    ) is GGMLType.BF16
    assert out_type("blk.0.attn_q.weight", (64, 64), GGMLType.BF16, OutType.F16
                    ) is GGMLType.F16
    assert out_type("token_embd.weight", (9, 64), GGMLType.F32, OutType.BF16) is GGMLType.BF16
    assert out_type("token_embd.weight", (9, 64), GGMLType.F32, OutType.Q8_0
                    ) is GGMLType.Q8_0
    # rows that are not whole 32-value blocks fall back to F16, as the reference does
    assert out_type("token_embd.weight", (9, 48), GGMLType.F32, OutType.Q8_0
                    ) is GGMLType.F16
    assert out_type("blk.0.attn_q_norm.weight", (16,), GGMLType.BF16, OutType.Q8_0
                    ) is GGMLType.F32


def test_auto_is_llama_cpps_guess() -> None:
    from filecord.gguf._hf_model import resolve

    assert resolve(OutType.AUTO, GGMLType.BF16) is OutType.BF16
    assert resolve(OutType.AUTO, GGMLType.F16) is OutType.F16
    assert resolve(OutType.AUTO, GGMLType.F32) is OutType.F16  # not F32: llama.cpp's default
    assert resolve(OutType.Q8_0, GGMLType.F32) is OutType.Q8_0


def test_llama3_rope_scaling_is_a_generated_tensor() -> None:
    import numpy as np

    from filecord.gguf._hf_model import rope_freqs

    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    spec = model_spec({**CONFIG, "rope_parameters": rope})
    kv = {k.key for k in hparam_kvs(spec, name="m", file_type=0)}
    assert not any(k.startswith("llama.rope.scaling") for k in kv)  # the tensor carries it
    factors = np.frombuffer(rope_freqs(spec) or b"", np.float32)
    # wavelengths 2*pi*10000**(i/8): under 16 positions keep 1, over 64 get the factor 8
    assert factors.tolist()[:1] == [1.0]
    assert factors.tolist()[3:] == [8.0] * 5
    assert 1.0 < factors[1] < factors[2] < 8.0
    assert rope_freqs(model_spec(CONFIG)) is None


@pytest.mark.parametrize(("change", "match"), [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'.*supported: 'silu'"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "lacks a positive low_freq_factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}},
     "rope_theta: must be a positive number a float32 holds .*, got 0.0"),
    ({"rope_theta": 5e5}, r"rope_theta is given as \[1000000.0, 500000.0\]"),
    ({"attention_bias": "yes", "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
     "attention_bias: must be true or false"),
    ({"mlp_bias": True}, "mlp_bias is not supported"),
])
def test_configs_llama_cpp_would_compute_wrong_are_refused(change: dict[str, Any], match: str
                                                           ) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        model_spec({**CONFIG, **change})


def test_a_window_as_long_as_the_context_and_agreeing_rope_keys_are_accepted() -> None:
    spec = model_spec({**CONFIG, "sliding_window": 256, "rope_theta": 1e6,
                       "rope_scaling": {"rope_type": "default"}})
    assert spec.rope_theta == 1e6
    assert spec.n_ctx == 256


def test_mistral_context_is_capped_at_its_sliding_window() -> None:
    """llama.cpp's llama attends to every position: within the window that is what Mistral
    computes, so the window is the context the file claims (README: convert)."""
    spec = model_spec({**CONFIG, "sliding_window": 128})
    kv = {k.key: k.value for k in hparam_kvs(spec, name="m", file_type=1)}
    assert kv["llama.context_length"] == 128
    llama = {**CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "sliding_window": 128}  # LlamaConfig has no window: transformers ignores it
    assert model_spec(llama).n_ctx == 256


@pytest.mark.parametrize(("arch", "model_type"), [("Qwen3ForCausalLM", "qwen3"),
                                                   ("Gemma2ForCausalLM", "gemma2")])
def test_attention_bias_is_refused_where_llama_cpp_has_no_output_bias(arch: str,
                                                                      model_type: str) -> None:
    """transformers gives these classes q/k/v/o biases with attention_bias true; llama.cpp's
    architecture takes no attn_output.bias and refuses a file holding one."""
    config = {**CONFIG, "architectures": [arch], "model_type": model_type, "head_dim": 16,
              "sliding_window": 64, "attn_logit_softcapping": 50.0,
              "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16}
    assert not model_spec(config).attention_bias
    with pytest.raises(UnsupportedModelError, match=r"config.json: attention_bias true is not "
                       r"supported for a " + arch):
        model_spec({**config, "attention_bias": True})


def test_mistral_has_no_attention_biases_whatever_attention_bias_says() -> None:
    """transformers' Mistral builds its projections without biases and ignores the key, so a
    bias in the file is one transformers drops: refused, not written for llama.cpp to add."""
    spec = model_spec({**CONFIG, "attention_bias": True})
    assert not spec.attention_bias
    assert {m.name for m in map_names(spec, _names(2))} >= {"blk.0.attn_q.weight"}
    with pytest.raises(UnsupportedModelError, match=r"no GGUF name.*q_proj\.bias"):
        map_names(spec, [*_names(2), "model.layers.0.self_attn.q_proj.bias"])


def test_gemma2_activation_is_read_from_hidden_activation() -> None:
    """Gemma 2's MLP reads hidden_activation (hidden_act is not what it runs)."""
    gemma = {**CONFIG, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
             "head_dim": 16, "sliding_window": 64, "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16,
             "hidden_act": "gelu_pytorch_tanh"}
    assert model_spec({**gemma, "hidden_activation": "gelu_pytorch_tanh"})
    with pytest.raises(UnsupportedModelError, match="hidden_activation 'silu' is not supported"):
        model_spec({**gemma, "hidden_activation": "silu"})


def test_biases_must_match_attention_bias_and_untied_needs_lm_head() -> None:
    bias = "model.layers.0.self_attn.q_proj.bias"
    llama = {**CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    with pytest.raises(UnsupportedModelError, match=r"attention_bias false.*q_proj\.bias"):
        map_names(model_spec(llama), [*_names(2), bias])
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q\.bias"):
        map_names(model_spec({**llama, "attention_bias": True}), _names(2))
    with pytest.raises(UnsupportedModelError, match=r"output\.weight"):
        map_names(model_spec({**CONFIG, "tie_word_embeddings": False}), _names(2))
    untied = map_names(model_spec({**CONFIG, "tie_word_embeddings": False}),
                       [*_names(2), "lm_head.weight"])
    assert "output.weight" in {m.name for m in untied}


def test_q8_0_blocks_are_gguf_pys() -> None:
    """Byte for byte what gguf-py's quantizer (the reference converter's) makes, ties to .5
    and all-zero blocks included, for each source type."""
    np = pytest.importorskip("numpy")
    quants = pytest.importorskip("gguf.quants")
    gguf = pytest.importorskip("gguf")
    from filecord.gguf._cast import convert

    rng = np.random.default_rng(3)
    values = rng.standard_normal(32 * 64).astype(np.float32) * 3
    values[:32] = 0  # a zero block: scale 0, no division
    values[32:64] = np.arange(32) - 15.5  # max 16.5: x / d lands on .5 ties
    values[64:96] = np.float32(127) * (np.arange(32) % 3 - 1) / 2
    want = quants.quantize(values.reshape(8, -1), gguf.GGMLQuantizationType.Q8_0).tobytes()
    assert bytes(convert(values.tobytes(), GGMLType.F32, GGMLType.Q8_0)) == want
    half = values.astype(np.float16)
    want16 = quants.quantize(half.astype(np.float32).reshape(8, -1),
                             gguf.GGMLQuantizationType.Q8_0).tobytes()
    assert bytes(convert(half.tobytes(), GGMLType.F16, GGMLType.Q8_0)) == want16


def test_gemma_norm_offset_is_added_in_the_sources_precision() -> None:
    np = pytest.importorskip("numpy")
    from filecord.gguf._cast import convert

    w = np.array([0.5, -1.0, 1e-4, 2048.5], dtype=np.float16)
    got = np.frombuffer(bytes(convert(w.tobytes(), GGMLType.F16, GGMLType.F32, shift=1.0)),
                        np.float32)
    assert got.tolist() == (w + np.float16(1)).astype(np.float32).tolist()  # F16 sum
    f = np.array([0.5, 1e-4], dtype=np.float32)
    got32 = np.frombuffer(bytes(convert(f.tobytes(), GGMLType.F32, GGMLType.F32, shift=1.0)),
                          np.float32)
    assert got32.tolist() == (f + np.float32(1)).tolist()


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma2"])
def test_defaults_are_what_autoconfig_fills(model_type: str) -> None:
    """llama.cpp's converter reads config.json through transformers' AutoConfig, so a key the
    file leaves out is written with AutoConfig's default; filecord writes the same."""
    transformers = pytest.importorskip("transformers")
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma2": "Gemma2ForCausalLM"}[model_type]
    given: dict[str, Any] = {
        "architectures": [arch], "model_type": model_type, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 32,
        "vocab_size": 300, "head_dim": 16, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16}
    if model_type == "gemma2":
        given["sliding_window"] = 4096
    filled = transformers.AutoConfig.for_model(
        model_type, **{k: v for k, v in given.items() if k != "model_type"}).to_dict()
    spec = model_spec(given)
    params = filled.get("rope_parameters") or {}
    window = filled.get("sliding_window") if model_type == "mistral" else None
    assert spec.n_ctx == min(filled["max_position_embeddings"], window or 1 << 40)
    assert spec.rms_eps == filled["rms_norm_eps"]
    assert spec.rope_theta == params.get("rope_theta", filled.get("rope_theta"))
    assert spec.tied == filled["tie_word_embeddings"]
    assert spec.n_head_kv == filled["num_key_value_heads"]
