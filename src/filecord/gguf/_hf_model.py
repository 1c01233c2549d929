"""Hugging Face Llama-family checkpoints in GGUF terms: pure values, no I/O.

A ``config.json`` (already parsed) becomes a :class:`LlamaSpec`: the hyperparameters llama.cpp's
``llama`` architecture reads (``llama.context_length``, ``llama.attention.head_count_kv``, ...),
or a :class:`~filecord.gguf.errors.UnsupportedModelError` naming what is supported.  Tensor
names map one to one (``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``).
The facts (key names, value types, the name map, which tensors llama.cpp wants in F32, the
Q/K row order) were read from llama.cpp's converter and gguf-py 0.19 and checked against both by
``tests/interop/test_hf_to_gguf.py``; no code was taken from them.

Why Q and K are reordered: Hugging Face stores each attention head's rotary pairs as two halves
(dims ``0..d/2`` then ``d/2..d``); ggml's ``rope`` kernel for the ``llama`` architecture wants
them interleaved.  Per head of ``d`` rows the output row ``2*i + j`` is the input row
``j*d/2 + i``: a reordering of whole rows, so a permuted tensor is a list of row ranges of the
input file, never computed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from filecord.gguf._types import ARCH_KEY, GGMLType, KeyValue, ValueType
from filecord.gguf.errors import UnsupportedModelError
from filecord.tensors import DType

# The Hugging Face classes whose checkpoints this converter writes as llama.cpp's ``llama``.
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
MODEL_TYPES = ("llama", "mistral")
SOURCE_DTYPES = (DType.F32, DType.F16, DType.BF16)
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: written by every converter, read by the loader
SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)  # recomputed by llama.cpp, never stored


class OutType(enum.Enum):
    """``--outtype``: what 2-D weights become (1-D tensors and norms are F32 whatever)."""

    SOURCE = "source"  # each tensor keeps its own dtype: bytes moved, cloned or copied
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"


GGML_OF_DTYPE = {DType.F32: GGMLType.F32, DType.F16: GGMLType.F16, DType.BF16: GGMLType.BF16}
_OUT_GGML = {OutType.F32: GGMLType.F32, OutType.F16: GGMLType.F16, OutType.BF16: GGMLType.BF16}
# general.file_type (llama_ftype): what most weights are
FILE_TYPES = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.BF16: 32}

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


class Permute(enum.Enum):
    """Which head count a tensor's rows are regrouped by."""

    NONE = "none"
    Q = "q"  # attention.head_count
    K = "k"  # attention.head_count_kv


@dataclass(frozen=True, slots=True)
class Mapped:
    """One checkpoint tensor's fate: its GGUF name, and how its rows are reordered."""

    source: str
    name: str
    permute: Permute


@dataclass(frozen=True, slots=True)
class LlamaSpec:
    """The hyperparameters of a Llama-family checkpoint, as llama.cpp reads them."""

    hf_arch: str
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_given: bool
    rms_eps: float
    rope_theta: float | None
    rope_linear: float | None
    rope_llama3: tuple[float, float, float, float] | None  # factor, low, high, original ctx
    vocab_size: int
    tied: bool
    attention_bias: bool


def _int(config: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    v = config.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise UnsupportedModelError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _need(config: Mapping[str, Any], key: str) -> int:
    v = _int(config, key)
    if v is None:  # pragma: no cover - required=True raises instead
        raise UnsupportedModelError(f"config.json: {key} is missing")
    return v


Llama3 = tuple[float, float, float, float]


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")
_ROPE_SUPPORTED = "supported: none, 'default', 'linear', 'llama3' with all of " + ", ".join(
    _LLAMA3_KEYS)


def _number(value: Any) -> TypeGuard[int | float]:
    import math

    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _scaling(params: Mapping[str, Any], key: str) -> tuple[float | None, Llama3 | None]:
    """One RoPE parameter object's (linear factor, Llama 3 scaling)."""
    kind = params.get("rope_type", params.get("type"))
    factor = params.get("factor")
    if kind in (None, "default"):
        return None, None
    if kind == "linear" and _number(factor):
        return float(factor), None
    if isinstance(kind, str) and kind.lower() == "llama3":
        # Every field is required: transformers refuses to load a config without them, and a
        # default (llama.cpp's converter has some) would give rope_freqs it does not compute.
        missing = [k for k in _LLAMA3_KEYS if not _number(params.get(k))]
        if missing:
            raise UnsupportedModelError(
                f"config.json: {key} llama3 lacks a positive {', '.join(missing)} "
                f"({_ROPE_SUPPORTED})")
        f, lo, hi, old = (float(params[k]) for k in _LLAMA3_KEYS)
        if hi <= lo:
            raise UnsupportedModelError(f"config.json: {key} llama3 high_freq_factor {hi} must "
                                        f"exceed low_freq_factor {lo}")
        return None, (f, lo, hi, old)
    raise UnsupportedModelError(f"config.json: {key} RoPE scaling {kind!r} is not supported "
                                f"({_ROPE_SUPPORTED})")


def _rope(config: Mapping[str, Any]) -> tuple[float | None, float | None, Llama3 | None]:
    """(rope theta, linear scaling factor, Llama 3 scaling); other scalings are refused.

    Both ``rope_parameters`` (transformers 5) and the legacy ``rope_scaling`` are read: a
    checkpoint may carry both, and which one transformers applies depends on its version, so
    two that ask for different scalings are refused rather than one silently dropped."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for key in ("rope_parameters", "rope_scaling"):
        params = config.get(key)
        if params is None or params == {}:
            continue
        if not isinstance(params, Mapping):
            raise UnsupportedModelError(f"config.json: {key} must be an object, got "
                                        f"{params!r}")
        found.append((key, params))
    scalings = {key: _scaling(params, key) for key, params in found}
    if len(set(scalings.values())) > 1:
        raise UnsupportedModelError(
            "config.json: rope_parameters and rope_scaling ask for different RoPE scalings "
            f"({found[0][1].get('rope_type', found[0][1].get('type'))!r} and "
            f"{found[1][1].get('rope_type', found[1][1].get('type'))!r}); give one")
    linear, llama3 = next(iter(scalings.values()), (None, None))
    given = [p["rope_theta"] for _k, p in found if "rope_theta" in p]
    if "rope_theta" in config:
        given.append(config["rope_theta"])
    bad = [t for t in given if not _number(t)]
    if bad:
        raise UnsupportedModelError(f"config.json: rope_theta must be a positive number, got "
                                    f"{bad[0]!r}")
    if len({float(t) for t in given}) > 1:
        raise UnsupportedModelError(f"config.json: rope_theta is given as {given}; give one")
    theta = given[0] if given else None
    return (None if theta is None else float(theta)), linear, llama3


def rope_freqs(spec: LlamaSpec) -> bytes | None:
    """Llama 3's RoPE scaling as llama.cpp takes it: a ``rope_freqs.weight`` F32 tensor of one
    factor per rotary pair (1 for high frequencies, ``factor`` for low ones, a smooth blend
    between), computed in float32 step by step as llama.cpp's converter computes it, so the
    bytes are the same.  None without Llama 3 scaling."""
    if spec.rope_llama3 is None:
        return None
    import math

    import numpy as np

    factor, low, high, old = spec.rope_llama3
    f32 = np.float32
    base = spec.rope_theta if spec.rope_theta is not None else 10000.0
    exps = np.arange(0, spec.head_dim, 2, dtype=np.float32) / f32(spec.head_dim)
    freqs = f32(1.0) / np.power(f32(base), exps)
    low_wavelen, high_wavelen = old / low, old / high
    out: list[Any] = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return bytes(np.array(out, dtype="<f4").tobytes())


def llama_spec(config: Mapping[str, Any]) -> LlamaSpec:
    """The spec of a supported checkpoint, or :class:`UnsupportedModelError` saying why not
    and what is supported."""
    archs = config.get("architectures") or []
    hf_arch = archs[0] if isinstance(archs, list) and archs else None
    model_type = config.get("model_type")
    if hf_arch not in ARCHITECTURES or model_type not in MODEL_TYPES:
        raise UnsupportedModelError(
            f"architecture {hf_arch!r} (model_type {model_type!r}) is not supported: filecord "
            f"converts {', '.join(ARCHITECTURES)} (model_type {'/'.join(MODEL_TYPES)}) to "
            f"llama.cpp's 'llama'")
    for key in ("num_local_experts", "num_experts"):
        if config.get(key):
            raise UnsupportedModelError(f"config.json: {key}={config[key]}: mixture-of-experts "
                                        f"models are not supported")
    if config.get("quantization_config"):
        raise UnsupportedModelError("config.json: quantized checkpoints (quantization_config) "
                                    "are not supported: F32, F16 and BF16 weights only")
    n_embd = _need(config, "hidden_size")
    n_head = _need(config, "num_attention_heads")
    n_head_kv = _int(config, "num_key_value_heads", required=False) or n_head
    given = _int(config, "head_dim", required=False)
    head_dim = given or n_embd // n_head
    if head_dim % 2 or n_head % n_head_kv:
        raise UnsupportedModelError(f"config.json: head_dim {head_dim} must be even and "
                                    f"num_attention_heads {n_head} a multiple of "
                                    f"num_key_value_heads {n_head_kv}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json: hidden_act {act!r} is not supported: "
                                    f"llama.cpp's llama runs SiLU (supported: 'silu')")
    if config.get("mlp_bias"):
        raise UnsupportedModelError("config.json: mlp_bias is not supported (llama.cpp's "
                                    "llama has no feed-forward biases)")
    n_ctx = _need(config, "max_position_embeddings")
    window = config.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < n_ctx):
        # llama.cpp's llama attends to every position; no key makes it honour a window
        raise UnsupportedModelError(
            f"config.json: sliding_window {window!r} is shorter than max_position_embeddings "
            f"{n_ctx}: llama.cpp's llama has no sliding-window attention (supported: null or "
            f">= the context)")
    bias = config.get("attention_bias", False)
    if not isinstance(bias, bool):
        raise UnsupportedModelError(f"config.json: attention_bias must be true or false, got "
                                    f"{bias!r}")
    eps = config.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        raise UnsupportedModelError(f"config.json: rms_norm_eps must be a number, got {eps!r}")
    theta, linear, llama3 = _rope(config)
    return LlamaSpec(
        hf_arch=str(hf_arch), n_layer=_need(config, "num_hidden_layers"),
        n_ctx=n_ctx, n_embd=n_embd, attention_bias=bias,
        n_ff=_need(config, "intermediate_size"), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, head_dim_given=given is not None, rms_eps=float(eps),
        rope_theta=theta, rope_linear=linear, rope_llama3=llama3,
        vocab_size=_need(config, "vocab_size"),
        tied=bool(config.get("tie_word_embeddings", False)))


def hparam_kvs(spec: LlamaSpec, *, name: str, file_type: int) -> list[KeyValue]:
    """The model's key-values before the tokenizer's, in the order llama.cpp's converter
    writes them (so a diff of two files lines up)."""
    u32, f32 = ValueType.UINT32, ValueType.FLOAT32
    kv = [KeyValue(ARCH_KEY, ValueType.STRING, "llama"),
          KeyValue("general.type", ValueType.STRING, "model")]
    if name:
        kv.append(KeyValue("general.name", ValueType.STRING, name))
    kv += [KeyValue("llama.block_count", u32, spec.n_layer),
           KeyValue("llama.context_length", u32, spec.n_ctx),
           KeyValue("llama.embedding_length", u32, spec.n_embd),
           KeyValue("llama.feed_forward_length", u32, spec.n_ff),
           KeyValue("llama.attention.head_count", u32, spec.n_head),
           KeyValue("llama.attention.head_count_kv", u32, spec.n_head_kv)]
    if spec.rope_linear is not None:
        kv += [KeyValue("llama.rope.scaling.type", ValueType.STRING, "linear"),
               KeyValue("llama.rope.scaling.factor", f32, spec.rope_linear)]
    if spec.rope_theta is not None:
        kv.append(KeyValue("llama.rope.freq_base", f32, spec.rope_theta))
    kv.append(KeyValue("llama.attention.layer_norm_rms_epsilon", f32, spec.rms_eps))
    if spec.head_dim_given:
        kv += [KeyValue("llama.attention.key_length", u32, spec.head_dim),
               KeyValue("llama.attention.value_length", u32, spec.head_dim)]
    kv += [KeyValue("general.file_type", u32, file_type),
           KeyValue("llama.vocab_size", u32, spec.vocab_size),
           KeyValue("llama.rope.dimension_count", u32, spec.head_dim),
           KeyValue("general.quantization_version", u32, QUANTIZATION_VERSION)]
    return kv


def map_names(spec: LlamaSpec, names: Sequence[str]) -> list[Mapped]:
    """Each checkpoint tensor's GGUF name, in the given order; skipped ones left out.  Names
    it does not know, and tensors llama.cpp needs but the checkpoint lacks, are refused (all
    of them named)."""
    out: list[Mapped] = []
    unknown: list[str] = []
    for n in names:
        if n.endswith(SKIPPED_SUFFIXES):
            continue
        m = _LAYER.match(n)
        if m is not None and int(m.group(1)) < spec.n_layer and m.group(2) in _LAYER_MAP:
            rest = m.group(2)
            perm = (Permute.Q if rest.startswith("self_attn.q_proj.")
                    else Permute.K if rest.startswith("self_attn.k_proj.") else Permute.NONE)
            out.append(Mapped(n, f"blk.{m.group(1)}.{_LAYER_MAP[rest]}", perm))
        elif n in _GLOBAL_MAP:
            out.append(Mapped(n, _GLOBAL_MAP[n], Permute.NONE))
        else:
            unknown.append(n)
    if unknown:
        raise UnsupportedModelError(
            f"{len(unknown)} tensor(s) have no GGUF name for a {spec.hf_arch}: "
            + ", ".join(unknown[:8]) + (" ..." if len(unknown) > 8 else ""))
    have = {m.name for m in out}
    biases = [m.source for m in out if m.name.endswith(".bias")]
    if biases and not spec.attention_bias:
        # transformers builds the layers without biases and ignores these; llama.cpp would add them
        raise UnsupportedModelError(
            f"config.json says attention_bias false but the checkpoint has {len(biases)} bias "
            f"tensor(s): {', '.join(biases[:4])}")
    need = ["token_embd.weight", "output_norm.weight"]
    if not spec.tied:  # without output llama.cpp would tie it to token_embd silently
        need.append("output.weight")
    need += [f"blk.{i}.{x}.weight" for i in range(spec.n_layer)
             for x in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                       "ffn_gate", "ffn_up", "ffn_down")]
    if spec.attention_bias:
        need += [f"blk.{i}.{x}.bias" for i in range(spec.n_layer)
                 for x in ("attn_q", "attn_k", "attn_v", "attn_output")]
    missing = [n for n in need if n not in have]
    if missing:
        raise UnsupportedModelError(f"the checkpoint lacks {len(missing)} tensor(s) llama.cpp "
                                    f"needs: {', '.join(missing[:8])}")
    return out


def out_type(gguf_name: str, ndim: int, src: GGMLType, outtype: OutType) -> GGMLType:
    """What llama.cpp's converter writes: 1-D tensors and norms in F32 (its kernels for them
    are F32), other weights in ``outtype`` (``SOURCE``: their own type)."""
    if ndim <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return GGMLType.F32
    return src if outtype is OutType.SOURCE else _OUT_GGML[outtype]


def row_order(rows: int, heads: int) -> list[int]:
    """For each output row, the input row it is (see the module notes)."""
    if heads <= 0 or rows % heads or (rows // heads) % 2:
        raise UnsupportedModelError(f"{rows} rows cannot be split into {heads} heads of "
                                    f"rotary pairs")
    d = rows // heads
    half = d // 2
    return [h * d + j * half + i for h in range(heads) for i in range(half) for j in range(2)]
