"""``filecord convert`` against llama.cpp's own ``convert_hf_to_gguf.py`` on the same checkpoint.

Tiny random Llama and Mistral checkpoints (GQA, saved sharded by ``save_pretrained``) with a
SentencePiece or a byte-level BPE tokenizer trained here are converted by filecord and by the
reference (llama-cpp-python 0.3.36's vendored llama.cpp, run with torch and transformers).  The
two files must hold the same tensors (names, types, dims, bytes) and the same key-values except
the ones listed in ``EXPECTED_KV_DIFFERENCES``; llama.cpp must load both and compute identical
logits, tokenize a text as the tokenizer library does, and agree with transformers' logits
within float tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

from tests.support.hf_models import (  # noqa: E402
    gguf_contents,
    reference_or_skip,
    run_reference,
    tiny_model,
)

pytestmark = pytest.mark.slow
REF = reference_or_skip()

# Keys the two converters write differently, and why.
EXPECTED_KV_DIFFERENCES = {
    # the reference title-cases the directory name ("m" -> "M") through its model-card
    # heuristics (gguf.Metadata); filecord writes the directory name as it is
    "general.name",
    # the reference derives a size label ("115K") from the parameter count; filecord writes none
    "general.size_label",
}
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
TOKENS = [1, 5, 9, 30, 77, 2]
TEXT = "the llama moves a file cord into one gguf shard."


def filecord(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", *args, "-q"],
                       capture_output=True, text=True, env=ENV, check=False)
    assert r.returncode == 0, r.stderr
    return r


def llama_logits(path: Path, **kw: Any) -> Any:
    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False,
                        n_threads=1, **kw)
    m.eval(TOKENS)
    return np.array(m.scores[: len(TOKENS)], dtype=np.float32), m


def same_files(ours: list[Path], ref: list[Path]) -> None:
    a = [gguf_contents(p) for p in ours]
    b = [gguf_contents(p) for p in ref]
    assert [list(t) for _, t in a] == [list(t) for _, t in b]  # names, order, sharding
    for (_, ta), (_, tb) in zip(a, b, strict=True):
        for name in ta:
            assert ta[name][:2] == tb[name][:2], name
            assert ta[name][2] == tb[name][2], f"{name}: bytes differ"
    kva, kvb = a[0][0], b[0][0]
    differ = {k for k in kva.keys() | kvb.keys() if kva.get(k) != kvb.get(k)}
    assert differ <= EXPECTED_KV_DIFFERENCES, {k: (kva.get(k), kvb.get(k)) for k in differ}
    for (kv_x, _), (kv_y, _) in zip(a[1:], b[1:], strict=True):
        assert kv_x == kv_y  # later shards: the split keys only


# wavelengths of a 16-dim head span 6 to 20,000 positions: factors 1, 8 and blends between
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
CASES = {
    # name: (tiny_model kwargs, filecord args, reference args, BPE pre-tokenizer name)
    "llama-spm-f32": ({"arch": "llama", "tokenizer": "spm", "dtype": "float32"}, [],
                      ["--outtype", "f32"], None),
    "mistral-bpe-bf16": ({"arch": "mistral", "tokenizer": "bpe", "dtype": "bfloat16"}, [], [],
                         "llama-bpe"),
    "llama-spm-f16-tied-to-bf16": ({"arch": "llama", "tokenizer": "spm", "dtype": "float16",
                                    "tied": True}, ["--outtype", "bf16"],
                                   ["--outtype", "bf16"], None),
    "llama-bpe-f32-to-f16-mha": ({"arch": "llama", "tokenizer": "bpe", "dtype": "float32",
                                  "num_key_value_heads": 4}, ["--outtype", "f16"],
                                 ["--outtype", "f16"], "llama-bpe"),
    # Llama 3 RoPE scaling: a generated rope_freqs tensor
    "llama-bpe-f32-llama3-rope": ({"arch": "llama", "tokenizer": "bpe", "dtype": "float32",
                                   "rope_parameters": LLAMA3_ROPE}, [], ["--outtype", "f32"],
                                  "llama-bpe"),
    # Q/K/V/O biases (permuted like their weights) and a head_dim other than hidden/heads
    "llama-bpe-bf16-bias-headdim": ({"arch": "llama", "tokenizer": "bpe", "dtype": "bfloat16",
                                     "attention_bias": True, "head_dim": 32}, [], [],
                                    "llama-bpe"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_gguf_as_llama_cpp_converter(tmp_path: Path, case: str) -> None:
    kwargs, ours_args, ref_args, pre = CASES[case]
    model = tiny_model(tmp_path / "m", **kwargs)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    filecord(str(model), "-o", str(ours), *ours_args)
    assert REF is not None
    run_reference(REF, model, ref, *ref_args, pre=pre)
    same_files([ours], [ref])
    a, m = llama_logits(ours)
    b, _ = llama_logits(ref)
    assert np.isfinite(a).all()
    assert np.array_equal(a, b)
    # the tokenizer keys make llama.cpp tokenize as the tokenizer's own library does
    if kwargs["tokenizer"] == "spm":
        import sentencepiece as spm

        want = spm.SentencePieceProcessor(model_file=str(model / "tokenizer.model")).encode(TEXT)
    else:
        from tokenizers import Tokenizer

        want = Tokenizer.from_file(str(model / "tokenizer.json")).encode(
            TEXT, add_special_tokens=False).ids
    assert m.tokenize(TEXT.encode(), add_bos=False, special=False) == want


@pytest.mark.parametrize("rope", [None, LLAMA3_ROPE])
def test_llama_cpp_agrees_with_transformers(tmp_path: Path, rope: dict[str, Any] | None
                                            ) -> None:
    """In F32 throughout, llama.cpp on filecord's file computes transformers' logits (with
    Llama 3 RoPE scaling too: the rope_freqs tensor means what transformers computes)."""
    import torch
    from transformers import AutoModelForCausalLM

    extra = {} if rope is None else {"rope_parameters": rope}
    model = tiny_model(tmp_path / "m", arch="mistral" if rope is None else "llama",
                       tokenizer="spm", dtype="float32", **extra)
    out = tmp_path / "m.gguf"
    filecord(str(model), "-o", str(out))
    ours, _ = llama_logits(out, type_k=0, type_v=0)  # an F32 KV cache (F16 by default)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.allclose(ours, want, atol=1e-4, rtol=0), float(np.abs(ours - want).max())


@pytest.mark.parametrize(("arch", "tokenizer", "extra", "atol"), [
    ("qwen2", "qwen2", {"pad_vocab": 4}, 1e-4),  # byte-level BPE, q/k/v biases
    ("qwen3", "qwen2", {"pad_vocab": 4}, 1e-4),  # q/k norms
    # SentencePiece, norms +1, softcapping, window 4 < 6 tokens.  ggml's CPU GELU reads an F16
    # table (GGML_GELU_FP16 in ggml-cpu/vec.h), so Gemma's MLP is F16-exact at best: 3.6e-3
    # measured here (the file itself is byte-identical to the reference's: test_gguf_hf_families)
    ("gemma2", "gemma", {"tied": True}, 1e-2),
])
def test_llama_cpp_agrees_with_transformers_per_family(tmp_path: Path, arch: str,
                                                       tokenizer: str, extra: dict[str, Any],
                                                       atol: float) -> None:
    """Each family's file computes transformers' logits in llama.cpp (F32 weights and an F32
    KV cache), and llama.cpp tokenizes as the tokenizer's own library does."""
    import torch
    from transformers import AutoModelForCausalLM

    model = tiny_model(tmp_path / "m", arch=arch, tokenizer=tokenizer, dtype="float32",
                       **extra)
    out = tmp_path / "m.gguf"
    filecord(str(model), "-o", str(out))
    ours, m = llama_logits(out, type_k=0, type_v=0)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                              attn_implementation="eager")
    with torch.no_grad():
        want = hf(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.allclose(ours, want, atol=atol, rtol=0), float(np.abs(ours - want).max())
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(TEXT, add_special_tokens=False)["input_ids"]
    assert m.tokenize(TEXT.encode(), add_bos=False, special=False) == ids


def test_llama_cpp_tokenizes_a_tokenizer_json_only_llama_as_transformers(tmp_path: Path
                                                                         ) -> None:
    """transformers 5's tokenizer.json-only SentencePiece Llama: llama.cpp on filecord's file
    tokenizes as transformers does."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm-json", dtype="float32")
    out = tmp_path / "m.gguf"
    filecord(str(model), "-o", str(out))
    _, m = llama_logits(out)
    text = TEXT + " Llama GGUF 12345 !?"
    want = AutoTokenizer.from_pretrained(model)(text, add_special_tokens=False)["input_ids"]
    assert m.tokenize(text.encode(), add_bos=False, special=False) == want


@pytest.mark.parametrize("split", [("--split-max-tensors", "7"), ("--split-max-size", "60K")])
def test_split_set_matches_reference_and_loads(tmp_path: Path, split: tuple[str, str]) -> None:
    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="bfloat16")
    filecord(str(model), "-o", str(tmp_path / "ours.gguf"), *split)
    assert REF is not None
    run_reference(REF, model, tmp_path / "ref.gguf", *split)
    ours = sorted(tmp_path.glob("ours-*.gguf"))
    ref = sorted(tmp_path.glob("ref-*.gguf"))
    assert len(ours) > 1
    assert [p.name[4:] for p in ours] == [p.name[3:] for p in ref]
    same_files(ours, ref)
    a, _ = llama_logits(ours[0])
    b, _ = llama_logits(ref[0])
    assert np.array_equal(a, b)
