"""Hugging Face decoder checkpoints in GGUF terms: pure values, no I/O.

One table, :data:`FAMILIES`, says everything the converter knows about a model family: the
Hugging Face classes it covers, llama.cpp's architecture (the key prefix), the tensor name map,
the tensors llama.cpp needs, which tensors are reordered (Llama's rotary rows) or shifted
(Gemma's norms), which key-values are written and the defaults ``transformers``' ``AutoConfig``
fills (llama.cpp's converter reads ``config.json`` through it, so a default it fills is a key
the reference writes).  A family's entry is the whole of what it needs: the mechanisms below
(:func:`model_spec`, :func:`hparam_kvs`, :func:`map_names`, :func:`out_type`) read the entry
and know no family by name.

A ``config.json`` (already parsed) becomes a :class:`ModelSpec` or an error: a value of the
wrong type, or one no model can have, is a
:class:`~filecord.gguf.errors.CheckpointFileError` naming the key; a setting llama.cpp's
architecture cannot compute is an :class:`~filecord.gguf.errors.UnsupportedModelError` naming
what is supported.  Counts that drive work (layers, vocabulary) are checked against the
checkpoint's tensors before anything proportional to them is done (see :func:`map_names` and
``_hf.plan_tensors``).

The facts (key names, value types, name maps, which tensors llama.cpp wants in F32, Q/K row
order, Gemma's norm offset) were read from llama.cpp's converter and gguf-py and are checked
against the reference converter by ``tests/gguf/test_gguf_hf_reference.py``; no code was taken from
them.

Why Llama's Q and K are reordered: Hugging Face stores each attention head's rotary pairs as
two halves (dims ``0..d/2`` then ``d/2..d``); ggml's ``rope`` kernel for the ``llama``
architecture wants them interleaved.  Per head of ``d`` rows the output row ``2*i + j`` is the
input row ``j*d/2 + i``: a reordering of whole rows, so a permuted tensor is a list of row
ranges of the input file, never computed.  Qwen and Gemma run the NeoX rotary layout, which
is Hugging Face's own: no reordering.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from filecord.gguf._types import ARCH_KEY, GGMLType, KeyValue, ValueType
from filecord.gguf.errors import CheckpointFileError, UnsupportedModelError
from filecord.tensors import DType

SOURCE_DTYPES = (DType.F32, DType.F16, DType.BF16)
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: written by every converter, read by the loader
SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)  # recomputed by llama.cpp, never stored
COUNT_LIMIT = 1 << 31  # ggml reads these counts as int32
Q8_0_BLOCK = 32


class OutType(enum.Enum):
    """``--outtype``: what 2-D weights become (1-D tensors and norms are F32 whatever)."""

    SOURCE = "source"  # each tensor keeps its own dtype: bytes moved, cloned or copied
    AUTO = "auto"  # llama.cpp's default: the first 2-D weight's type if F16/BF16, else F16
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"


GGML_OF_DTYPE = {DType.F32: GGMLType.F32, DType.F16: GGMLType.F16, DType.BF16: GGMLType.BF16}
OUT_GGML = {OutType.F32: GGMLType.F32, OutType.F16: GGMLType.F16, OutType.BF16: GGMLType.BF16,
             OutType.Q8_0: GGMLType.Q8_0}
# general.file_type (llama_ftype): what most weights are
FILE_TYPES = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.Q8_0: 7, GGMLType.BF16: 32}


class Bias(enum.Enum):
    """Which attention biases a family's layers hold."""

    CONFIG = "config"  # q/k/v/o, when config.json's attention_bias is true (Llama)
    QKV = "qkv"  # q/k/v always (Qwen2 builds its projections with them)
    NONE = "none"  # llama.cpp's architecture has no attention_output bias: true is refused
    IGNORED = "ignored"  # transformers builds none whatever attention_bias says (Mistral)


class HeadDim(enum.Enum):
    """Where ``head_dim`` comes from, and whether llama.cpp's converter writes it."""

    FILLED = "filled"  # AutoConfig fills hidden_size / heads: key/value_length always written
    OPTIONAL = "optional"  # hidden_size / heads unless given; written only when given
    REQUIRED = "required"  # config.json must give it (AutoConfig's default is not hidden/heads)


class Window(enum.Enum):
    """What a family does with ``sliding_window``."""

    IGNORED = "ignored"  # transformers does not read it for this class (Llama)
    CAP = "cap"  # attended by transformers, not by llama.cpp's architecture: context capped
    REFUSED = "refused"  # only with use_sliding_window (Qwen2/3): refused when used
    KEY = "key"  # llama.cpp's architecture has sliding-window layers: written as a key


_ATTN = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_QKV_BIAS = {
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
_O_BIAS = {"self_attn.o_proj.bias": "attn_output.bias"}
_FFN_NORM = {"post_attention_layernorm.weight": "ffn_norm.weight"}
_QK_NORM = {"self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight"}
_SANDWICH = {  # Gemma 2/3: a norm before and after each block
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@dataclass(frozen=True, slots=True)
class Family:
    """Everything the converter knows about one model family (see the module notes)."""

    arch: str  # llama.cpp's architecture: general.architecture and the key prefix
    hf_archs: tuple[str, ...]
    model_type: str
    layers: Mapping[str, str]  # name inside model.layers.N -> name inside blk.N
    biases: Mapping[str, str]  # the same for biases, present as ``bias`` says
    bias: Bias
    rope_permute: bool  # Llama's rotary rows regrouped (Q by heads, K by KV heads)
    head_dim: HeadDim
    window: Window
    activations: tuple[str, ...]  # activations llama.cpp's architecture computes
    tied_default: bool  # tie_word_embeddings when config.json leaves it out
    llama_keys: bool = False  # vocab_size and rope.dimension_count after file_type
    norm_shift: bool = False  # HF stores norm weights minus 1 (Gemma): +1 in the fill
    softcap: bool = False  # attention and final logit softcapping keys (Gemma 2)
    # checkpoint tensors llama.cpp's architecture has no place for -> the tensor it computes
    # with instead: one present is left out only when it holds the same values (else refused)
    drop: Mapping[str, str] = field(default_factory=dict)
    rope_key: bool = True  # rope.freq_base written (Gemma 2's converter writes none)
    # what AutoConfig fills when config.json leaves a key out (the reference writes these)
    ctx_default: int = 2048  # max_position_embeddings
    eps_default: float = 1e-6  # rms_norm_eps
    theta_default: float = 10000.0  # rope_theta
    kv_heads_default: int | None = None  # num_key_value_heads (None: num_attention_heads)
    window_default: int | None = None  # sliding_window when the key is absent (not null)
    space_prefix: bool | None = None  # tokenizer.ggml.add_space_prefix for a SentencePiece
    prefix_from_config: bool = False  # ... or tokenizer_config.json's add_prefix_space
    # the tokenizer class transformers 5's AutoTokenizer registers for the model_type (None:
    # none, so tokenizer_config.json's tokenizer_class runs); "TokenizersBackend" runs
    # tokenizer.json as written whatever class tokenizer_config.json names
    tokenizer_class: str | None = None
    hub_class_ignored: bool = False  # transformers runs tokenizer_class over the file's class
    act_key: str = "hidden_act"  # the config key transformers' class reads its activation from
    swa_every: int = 0  # Window.KEY: llama.cpp makes layer i local when (i + 1) % swa_every
    # query_pre_attn_scalar llama.cpp assumes: head_dim, or hidden/heads at these layer counts
    wide_scale_layers: tuple[int, ...] | None = None


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("LlamaForCausalLM",), "llama", {**_ATTN, **_FFN_NORM},
           {**_QKV_BIAS, **_O_BIAS}, Bias.CONFIG, rope_permute=True, head_dim=HeadDim.FILLED,
           window=Window.IGNORED, activations=("silu",), tied_default=False, llama_keys=True,
           prefix_from_config=True),
    Family("llama", ("MistralForCausalLM",), "mistral", {**_ATTN, **_FFN_NORM},
           {}, Bias.IGNORED, rope_permute=True, head_dim=HeadDim.FILLED,
           window=Window.CAP, activations=("silu",), tied_default=False, llama_keys=True,
           prefix_from_config=True, ctx_default=4096 * 32, window_default=4096,
           kv_heads_default=8, tokenizer_class="TokenizersBackend"),
    Family("qwen2", ("Qwen2ForCausalLM",), "qwen2", {**_ATTN, **_FFN_NORM}, _QKV_BIAS,
           Bias.QKV, rope_permute=False, head_dim=HeadDim.OPTIONAL, window=Window.REFUSED,
           activations=("silu",), tied_default=False, ctx_default=32768,
           kv_heads_default=32, tokenizer_class="Qwen2Tokenizer", hub_class_ignored=True),
    Family("qwen3", ("Qwen3ForCausalLM",), "qwen3", {**_ATTN, **_FFN_NORM, **_QK_NORM},
           {}, Bias.NONE, rope_permute=False,
           head_dim=HeadDim.REQUIRED, window=Window.REFUSED, activations=("silu",),
           tied_default=False, ctx_default=32768, kv_heads_default=32,
           tokenizer_class="Qwen2Tokenizer"),
    Family("gemma2", ("Gemma2ForCausalLM",), "gemma2", {**_ATTN, **_SANDWICH}, {},
           Bias.NONE, rope_permute=False, head_dim=HeadDim.REQUIRED, window=Window.KEY,
           activations=("gelu_pytorch_tanh",), tied_default=True, norm_shift=True,
           softcap=True, drop={"lm_head.weight": "model.embed_tokens.weight"},
           rope_key=False, space_prefix=False, act_key="hidden_activation",
           swa_every=2, wide_scale_layers=(46,), ctx_default=8192, kv_heads_default=4,
           tokenizer_class="GemmaTokenizer"),
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A checkpoint's family and hyperparameters, as llama.cpp reads them."""

    family: Family
    hf_arch: str
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_written: bool
    rms_eps: float
    rope_theta: float | None
    rope_linear: float | None
    rope_llama3: tuple[float, float, float, float] | None  # factor, low, high, original ctx
    vocab_size: int
    tied: bool
    attention_bias: bool
    window: int | None  # Window.KEY: the sliding window written
    softcaps: tuple[float, float] | None  # attention, final (Gemma 2)

    @property
    def arch(self) -> str:
        return self.family.arch


def _bad(key: str, why: str) -> CheckpointFileError:
    return CheckpointFileError(why, field=f"config.json: {key}")


def _int(config: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    v = config.get(key)
    if v is None and not required:
        return None
    if v is None:
        raise _bad(key, "missing (a positive integer is required)")
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < COUNT_LIMIT:
        raise _bad(key, f"must be a positive integer below 2**31, got {v!r}")
    return v


def _need(config: Mapping[str, Any], key: str) -> int:
    v = _int(config, key)
    if v is None:  # pragma: no cover - required=True raises instead
        raise _bad(key, "missing")
    return v


def _bool(config: Mapping[str, Any], key: str, *, default: bool) -> bool:
    v = config.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, f"must be true or false, got {v!r}")
    return v


Llama3 = tuple[float, float, float, float]

_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")
_ROPE_SUPPORTED = "supported: none, 'default', 'linear', 'llama3' with all of " + ", ".join(
    _LLAMA3_KEYS)



F32_TINY = 1.1754943508222875e-38  # the smallest normal float32
F32_MAX = 3.4028234663852886e38


def _number(value: Any) -> TypeGuard[int | float]:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _f32(key: str, value: Any, *, below: float | None = None) -> float:
    """A value the GGUF holds as FLOAT32 (and llama.cpp computes with): finite, positive and
    a normal float32, else refused naming the key.  One check for every such key: a value
    past the range would be written as inf or 0 (or not packed at all), and a subnormal one
    as a number llama.cpp's kernels flush to 0."""
    if not (_number(value) and F32_TINY <= value <= F32_MAX
            and (below is None or value < below)):
        limit = f" and below {below:g}" if below is not None else ""
        raise _bad(key, f"must be a positive number a float32 holds ({F32_TINY:.4g} to "
                   f"{F32_MAX:.4g}){limit}, got {value!r}")
    return float(value)


def _scaling(params: Mapping[str, Any], key: str) -> tuple[float | None, Llama3 | None]:
    """One RoPE parameter object's (linear factor, Llama 3 scaling)."""
    kind = params.get("rope_type", params.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise _bad(f"{key}.rope_type", f"must be a string, got {kind!r}")
    factor = params.get("factor")
    if kind in (None, "default"):
        return None, None
    if kind == "linear":
        return _f32(f"{key}.factor", factor), None
    if isinstance(kind, str) and kind.lower() == "llama3":
        # Every field is required: transformers refuses to load a config without them, and a
        # default (llama.cpp's converter has some) would give rope_freqs it does not compute.
        missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
        if missing:
            raise UnsupportedModelError(
                f"config.json: {key} llama3 lacks a positive {', '.join(missing)} "
                f"({_ROPE_SUPPORTED})")
        f, lo, hi, old = (_f32(f"{key}.{k}", params[k]) for k in _LLAMA3_KEYS)
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
            raise _bad(key, f"must be an object, got {params!r}")
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
    for t in given:
        _f32("rope_theta", t)
    if len({float(t) for t in given}) > 1:
        raise UnsupportedModelError(f"config.json: rope_theta is given as {given}; give one")
    theta = given[0] if given else None
    return (None if theta is None else float(theta)), linear, llama3


def rope_freqs(spec: ModelSpec) -> bytes | None:
    """Llama 3's RoPE scaling as llama.cpp takes it: a ``rope_freqs.weight`` F32 tensor of one
    factor per rotary pair (1 for high frequencies, ``factor`` for low ones, a smooth blend
    between), computed in float32 step by step as llama.cpp's converter computes it, so the
    bytes are the same.  None without Llama 3 scaling."""
    if spec.rope_llama3 is None:
        return None
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
    table = np.array(out, dtype=np.float32)
    if not np.isfinite(table).all():  # pragma: no cover - every input is a normal float32
        raise UnsupportedModelError("config.json: the Llama 3 RoPE scaling gives a factor "
                                    "float32 cannot hold")
    return bytes(table.astype("<f4").tobytes())


def family_of(config: Mapping[str, Any]) -> Family:
    """The table's entry for a config, or :class:`UnsupportedModelError` naming the ones
    there are."""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise _bad("architectures", f"must be a list of class names, got {archs!r}")
    hf_arch = archs[0] if archs else None
    model_type = config.get("model_type")
    for family in FAMILIES:
        if hf_arch in family.hf_archs and model_type == family.model_type:
            return family
    supported = ", ".join(f"{a} ({f.model_type})" for f in FAMILIES for a in f.hf_archs)
    raise UnsupportedModelError(
        f"architecture {hf_arch!r} (model_type {model_type!r}) is not supported: filecord "
        f"converts {supported}")


def _eps(config: Mapping[str, Any], family: Family) -> float:
    # llama.cpp divides by sqrt(mean + eps): a NaN, zero or negative epsilon poisons it
    return _f32("rms_norm_eps", config.get("rms_norm_eps", family.eps_default), below=1.0)


def _layer_types(config: Mapping[str, Any], n_layer: int) -> list[str] | None:
    """``layer_types``: one string per layer (transformers refuses another length)."""
    kinds = config.get("layer_types")
    if kinds is None:
        return None
    if not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise _bad("layer_types", f"must be a list of strings, got {str(kinds)[:80]}")
    if len(kinds) != n_layer:
        raise _bad("layer_types", f"has {len(kinds)} entries for num_hidden_layers {n_layer} "
                   "(one per layer)")
    return kinds


def _window(config: Mapping[str, Any], family: Family, n_ctx: int, n_layer: int
            ) -> tuple[int, int | None]:
    """(context length, sliding window key) as the family's rule says."""
    window = config.get("sliding_window", family.window_default)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)
                               or not 0 < window < COUNT_LIMIT):
        raise _bad("sliding_window", f"must be a positive integer or null, got {window!r}")
    if family.window is Window.CAP:
        # llama.cpp's architecture attends to every position it is given; within the window
        # that is what the model computes, so the window is the context it may claim.
        return (n_ctx if window is None else min(n_ctx, window)), None
    if family.window is Window.REFUSED:
        used = _bool(config, "use_sliding_window", default=False)
        kinds = _layer_types(config, n_layer)
        if used or "sliding_attention" in (kinds or ()):
            raise UnsupportedModelError(
                f"config.json: sliding-window layers (use_sliding_window / layer_types) are "
                f"not supported: llama.cpp's {family.arch} attends to every position "
                f"(supported: use_sliding_window false)")
        return n_ctx, None
    if family.window is Window.KEY:
        if window is None:
            raise _bad("sliding_window", "missing (the family's local layers need it)")
        kinds = _layer_types(config, n_layer)
        if kinds is not None:
            want = ["sliding_attention" if (i + 1) % family.swa_every else "full_attention"
                    for i in range(len(kinds))]
            if kinds != want:
                raise UnsupportedModelError(
                    f"config.json: layer_types {str(kinds)[:80]} is not the pattern llama.cpp's "
                    f"{family.arch} runs (every {family.swa_every}th layer global)")
        return n_ctx, window
    return n_ctx, None


def _softcaps(config: Mapping[str, Any], family: Family) -> tuple[float, float] | None:
    if not family.softcap:
        return None
    return (_f32("attn_logit_softcapping", config.get("attn_logit_softcapping")),
            _f32("final_logit_softcapping", config.get("final_logit_softcapping")))


def model_spec(config: Mapping[str, Any]) -> ModelSpec:
    """The spec of a supported checkpoint, or an error saying what is wrong or unsupported."""
    if not isinstance(config, Mapping):
        raise CheckpointFileError(f"must be a JSON object, got {type(config).__name__}",
                                  field="config.json")
    family = family_of(config)
    for key in ("num_local_experts", "num_experts"):
        if config.get(key):
            raise UnsupportedModelError(f"config.json: {key}={config[key]!r}: mixture-of-"
                                        f"experts models are not supported")
    if config.get("quantization_config"):
        raise UnsupportedModelError("config.json: quantized checkpoints (quantization_config) "
                                    "are not supported: F32, F16 and BF16 weights only")
    n_embd = _need(config, "hidden_size")
    n_head = _need(config, "num_attention_heads")
    n_head_kv = (_int(config, "num_key_value_heads", required=False)
                 or family.kv_heads_default or n_head)
    given = _int(config, "head_dim", required=family.head_dim is HeadDim.REQUIRED)
    head_dim = given or n_embd // n_head
    if head_dim % 2 or n_head % n_head_kv:
        raise UnsupportedModelError(f"config.json: head_dim {head_dim} must be even and "
                                    f"num_attention_heads {n_head} a multiple of "
                                    f"num_key_value_heads {n_head_kv}")
    act = config.get(family.act_key, family.activations[0])
    if act not in family.activations:
        raise UnsupportedModelError(
            f"config.json: {family.act_key} {act!r} is not supported: llama.cpp's {family.arch} "
            f"runs {family.activations[0]} (supported: "
            f"{', '.join(repr(a) for a in family.activations)})")
    if _bool(config, "mlp_bias", default=False):
        raise UnsupportedModelError(f"config.json: mlp_bias is not supported (llama.cpp's "
                                    f"{family.arch} has no feed-forward biases)")
    n_layer = _need(config, "num_hidden_layers")
    n_ctx, window = _window(config, family, _int(config, "max_position_embeddings",
                                                 required=False) or family.ctx_default, n_layer)
    if family.wide_scale_layers is not None:
        scalar = config.get("query_pre_attn_scalar", head_dim)
        want = n_embd // n_head if n_layer in family.wide_scale_layers else head_dim
        if scalar != want:
            # llama.cpp picks the query scale from the layer count, not from this key
            raise UnsupportedModelError(
                f"config.json: query_pre_attn_scalar {scalar!r} is not the {want} llama.cpp's "
                f"{family.arch} uses for {n_layer} layers")
    bias = family.bias is Bias.QKV or (family.bias is not Bias.IGNORED
                                       and _bool(config, "attention_bias", default=False))
    if bias and family.bias is Bias.NONE:
        # transformers builds q/k/v/o biases; llama.cpp's architecture loads no o bias (and
        # refuses a file holding one), so no GGUF of these layers runs
        raise UnsupportedModelError(
            f"config.json: attention_bias true is not supported for a {family.hf_archs[0]}: "
            f"llama.cpp's {family.arch} has no attention output bias (supported: false)")
    tied = _bool(config, "tie_word_embeddings", default=family.tied_default)
    if not tied and "lm_head.weight" in family.drop:
        # llama.cpp's architecture computes the logits with token_embd whatever the file holds
        raise UnsupportedModelError(
            f"config.json: tie_word_embeddings false is not supported for a {family.hf_archs[0]}"
            f": llama.cpp's {family.arch} always computes the output with the token embedding "
            f"(supported: true)")
    theta, linear, llama3 = _rope(config)
    return ModelSpec(
        family=family, hf_arch=family.hf_archs[0], n_layer=n_layer,
        n_ctx=n_ctx, n_embd=n_embd, attention_bias=bias,
        n_ff=_need(config, "intermediate_size"), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_written=given is not None or family.head_dim is HeadDim.FILLED,
        rms_eps=_eps(config, family),
        rope_theta=theta if theta is not None else family.theta_default, rope_linear=linear,
        rope_llama3=llama3, vocab_size=_need(config, "vocab_size"),
        tied=tied, window=window,
        softcaps=_softcaps(config, family))


def hparam_kvs(spec: ModelSpec, *, name: str, file_type: int) -> list[KeyValue]:
    """The model's key-values before the tokenizer's, in the order llama.cpp's converter
    writes them (so a diff of two files lines up)."""
    u32, f32 = ValueType.UINT32, ValueType.FLOAT32
    family, a = spec.family, spec.family.arch
    kv = [KeyValue(ARCH_KEY, ValueType.STRING, a),
          KeyValue("general.type", ValueType.STRING, "model")]
    if name:
        kv.append(KeyValue("general.name", ValueType.STRING, name))
    kv += [KeyValue(f"{a}.block_count", u32, spec.n_layer),
           KeyValue(f"{a}.context_length", u32, spec.n_ctx),
           KeyValue(f"{a}.embedding_length", u32, spec.n_embd),
           KeyValue(f"{a}.feed_forward_length", u32, spec.n_ff),
           KeyValue(f"{a}.attention.head_count", u32, spec.n_head),
           KeyValue(f"{a}.attention.head_count_kv", u32, spec.n_head_kv)]
    if spec.rope_linear is not None:
        kv += [KeyValue(f"{a}.rope.scaling.type", ValueType.STRING, "linear"),
               KeyValue(f"{a}.rope.scaling.factor", f32, spec.rope_linear)]
    if spec.rope_theta is not None and family.rope_key:
        kv.append(KeyValue(f"{a}.rope.freq_base", f32, spec.rope_theta))
    kv.append(KeyValue(f"{a}.attention.layer_norm_rms_epsilon", f32, spec.rms_eps))
    if spec.head_dim_written:
        kv += [KeyValue(f"{a}.attention.key_length", u32, spec.head_dim),
               KeyValue(f"{a}.attention.value_length", u32, spec.head_dim)]
    kv.append(KeyValue("general.file_type", u32, file_type))
    if family.llama_keys:
        kv += [KeyValue(f"{a}.vocab_size", u32, spec.vocab_size),
               KeyValue(f"{a}.rope.dimension_count", u32, spec.head_dim)]
    if spec.softcaps is not None:
        kv += [KeyValue(f"{a}.attn_logit_softcapping", f32, spec.softcaps[0]),
               KeyValue(f"{a}.final_logit_softcapping", f32, spec.softcaps[1])]
    if spec.window is not None:
        kv.append(KeyValue(f"{a}.attention.sliding_window", u32, spec.window))
    kv.append(KeyValue("general.quantization_version", u32, QUANTIZATION_VERSION))
    return kv


class Permute(enum.Enum):
    """Which head count a tensor's rows are regrouped by."""

    NONE = "none"
    Q = "q"  # attention.head_count
    K = "k"  # attention.head_count_kv


@dataclass(frozen=True, slots=True)
class Mapped:
    """One checkpoint tensor's fate: its GGUF name, how its rows are reordered, and whether
    its values are shifted (Gemma's norms)."""

    source: str
    name: str
    permute: Permute
    shift: bool = False


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _check_layers(spec: ModelSpec, names: Sequence[str]) -> None:
    """``num_hidden_layers`` against the layers the checkpoint holds, before any list of that
    length is made (a config claiming 10**9 layers fails here, at once)."""
    found = {int(m.group(1)) for m in map(_LAYER.match, names) if m is not None}
    have = max(found) + 1 if found else 0
    if spec.n_layer != have or len(found) != have:
        raise CheckpointFileError(
            f"says {spec.n_layer} layers but the checkpoint's tensors are of "
            f"{len(found)} layer(s) numbered up to {have - 1}",
            field="config.json: num_hidden_layers")


def map_names(spec: ModelSpec, names: Sequence[str]) -> list[Mapped]:
    """Each checkpoint tensor's GGUF name, in the given order; skipped ones left out.  Names
    it does not know, and tensors llama.cpp needs but the checkpoint lacks, are refused (all
    of them named)."""
    _check_layers(spec, names)
    family = spec.family
    layer_map = {**family.layers, **family.biases}
    out: list[Mapped] = []
    unknown: list[str] = []
    for n in names:
        if n.endswith(SKIPPED_SUFFIXES) or n in family.drop:
            continue
        m = _LAYER.match(n)
        if m is not None and m.group(2) in layer_map:
            rest = m.group(2)
            perm = Permute.NONE
            if family.rope_permute:
                perm = (Permute.Q if rest.startswith("self_attn.q_proj.")
                        else Permute.K if rest.startswith("self_attn.k_proj.") else Permute.NONE)
            gguf = layer_map[rest]
            out.append(Mapped(n, f"blk.{m.group(1)}.{gguf}", perm,
                              family.norm_shift and gguf.endswith("norm.weight")))
        elif n in _GLOBAL:
            gguf = _GLOBAL[n]
            out.append(Mapped(n, gguf, Permute.NONE,
                              family.norm_shift and gguf.endswith("norm.weight")))
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
    if not spec.tied and "lm_head.weight" not in family.drop:
        need.append("output.weight")  # without it llama.cpp would tie it to token_embd
    per_layer = list(family.layers.values())
    if spec.attention_bias:
        per_layer += list(family.biases.values())
    need += [f"blk.{i}.{x}" for i in range(spec.n_layer) for x in per_layer]
    missing = [n for n in need if n not in have]
    if missing:
        raise UnsupportedModelError(f"the checkpoint lacks {len(missing)} tensor(s) llama.cpp "
                                    f"needs: {', '.join(missing[:8])}")
    return out


def expected_shape(spec: ModelSpec, name: str) -> tuple[int, ...] | None:
    """The shape llama.cpp's loader checks for a tensor (None for names it does not check)."""
    q, kv = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    part = name.split(".")
    base = ".".join(part[2:]) if part[0] == "blk" else name
    e, f = spec.n_embd, spec.n_ff
    table = {
        "token_embd.weight": (spec.vocab_size, e), "output.weight": (spec.vocab_size, e),
        "attn_q.weight": (q, e), "attn_k.weight": (kv, e), "attn_v.weight": (kv, e),
        "attn_output.weight": (e, q), "attn_q.bias": (q,), "attn_k.bias": (kv,),
        "attn_v.bias": (kv,), "attn_output.bias": (e,),
        "attn_q_norm.weight": (spec.head_dim,), "attn_k_norm.weight": (spec.head_dim,),
        "ffn_gate.weight": (f, e), "ffn_up.weight": (f, e), "ffn_down.weight": (e, f),
    }
    if base.endswith("norm.weight") and base not in table:
        return (e,)
    return table.get(base)


def resolve(outtype: OutType, first_2d: GGMLType | None) -> OutType:
    """``auto`` as llama.cpp means it: the first 2-D weight's type when it is F16 or BF16,
    else F16."""
    if outtype is not OutType.AUTO:
        return outtype
    return OutType.BF16 if first_2d is GGMLType.BF16 else OutType.F16


def out_type(gguf_name: str, shape: Sequence[int], src: GGMLType, outtype: OutType
             ) -> GGMLType:
    """What llama.cpp's converter writes: 1-D tensors and norms in F32 (its kernels for them
    are F32), other weights in ``outtype`` (``SOURCE``: their own type); Q8_0 where the rows
    are whole blocks, else F16 (as the reference falls back)."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(
            ".weight"):
        return GGMLType.F32
    if outtype is OutType.AUTO:  # pragma: no cover - callers resolve it first
        raise ValueError("resolve auto first")
    if outtype is OutType.Q8_0 and shape[-1] % Q8_0_BLOCK:
        return GGMLType.F16
    return src if outtype is OutType.SOURCE else OUT_GGML[outtype]


def row_order(rows: int, heads: int) -> list[int]:
    """For each output row, the input row it is (see the module notes)."""
    if heads <= 0 or rows % heads or (rows // heads) % 2:
        raise UnsupportedModelError(f"{rows} rows cannot be split into {heads} heads of "
                                    f"rotary pairs")
    d = rows // heads
    half = d // 2
    return [h * d + j * half + i for h in range(heads) for i in range(half) for j in range(2)]
