"""A client nobody here wrote loads what filecord writes: llama.cpp itself.

A tiny Llama-architecture GGUF with random weights and a small SentencePiece-style vocabulary is
written with ``filecord.gguf.GGUFWriter``: the FFN weights are ranges of one owned blob file moved
into the output (``consume=True``), Q/K come from callables produced when their turn comes, the
rest are numpy arrays.  llama.cpp (through ``llama-cpp-python``, which bundles it and is built
from source in ``tools/test``) must load the file, tokenize, and evaluate a few tokens to finite
logits over the whole vocabulary.  The same inputs given to gguf-py 0.19's ``GGUFWriter`` give a
byte-identical file.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"llama_cpp is not importable ({exc}); tools/test builds llama-cpp-python "
                "0.3.36 from source", allow_module_level=True)
gguf = pytest.importorskip("gguf")

import filecord.gguf as fg  # noqa: E402
from filecord._pieces.data import FileBackedData  # noqa: E402

EMBD, HEADS, KV_HEADS, FF, LAYERS, CTX = 64, 4, 2, 128, 2, 512
HEAD_DIM = EMBD // HEADS
SPECIALS = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]  # UNKNOWN, CONTROL (gguf TokenType)
WORDS = ["▁", "▁the", "▁a", "▁hello", "▁world", "▁llama", "▁file", "▁cord", "he", "ll", "lo",
         "or", "ld", "th", "in", "er", "an", "▁t", "▁w", "▁h", "▁f", "▁c", "▁l"]
WORDS += [chr(c) for c in range(ord("a"), ord("z") + 1)]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style: specials, the 256 byte-fallback tokens, then scored pieces."""
    tokens = [t for t, _ in SPECIALS] + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    types = [k for _, k in SPECIALS] + [6] * 256 + [1] * len(WORDS)  # BYTE, NORMAL
    scores = [0.0] * (len(SPECIALS) + 256) + [-float(i) for i in range(len(WORDS))]
    return tokens, scores, types


def _tensors(n_vocab: int) -> dict[str, np.ndarray]:
    """llama.cpp's names and numpy shapes (ggml's dims reversed); norms F32, weights F16."""
    rng = np.random.default_rng(16)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float16)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(EMBD)).astype(np.float32)

    out = {"token_embd.weight": w(n_vocab, EMBD)}
    for i in range(LAYERS):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": norm(), b + "attn_q.weight": w(EMBD, EMBD),
                b + "attn_k.weight": w(KV_HEADS * HEAD_DIM, EMBD),
                b + "attn_v.weight": w(KV_HEADS * HEAD_DIM, EMBD),
                b + "attn_output.weight": w(EMBD, EMBD), b + "ffn_norm.weight": norm(),
                b + "ffn_gate.weight": w(FF, EMBD), b + "ffn_down.weight": w(EMBD, FF),
                b + "ffn_up.weight": w(FF, EMBD)}
    out["output_norm.weight"] = norm()
    out["output.weight"] = w(n_vocab, EMBD)
    return out


def _key_values(w: Any, n_vocab: int) -> None:
    """The calls a conversion script makes (the same method names on both writers)."""
    w.add_string("general.name", "filecord tiny llama")
    for key, value in [("llama.context_length", CTX), ("llama.embedding_length", EMBD),
                       ("llama.feed_forward_length", FF), ("llama.block_count", LAYERS),
                       ("llama.attention.head_count", HEADS),
                       ("llama.attention.head_count_kv", KV_HEADS),
                       ("llama.rope.dimension_count", HEAD_DIM), ("llama.vocab_size", n_vocab)]:
        w.add_uint32(key, value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("general.file_type", 1)  # MOSTLY_F16
    tokens, scores, types = _vocab()
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", False)


def _write_filecord(out: Path, arrays: dict[str, np.ndarray], n_vocab: int) -> list[str]:
    """FFN weights: ranges of one owned blob, moved; Q/K: callables; the rest: arrays."""
    ffn = [n for n in arrays if ".ffn_" in n and not n.endswith("ffn_norm.weight")]
    blob = out.parent / "ffn.blob"
    offsets, pos = {}, 0
    with open(blob, "wb") as f:
        for n in ffn:
            offsets[n] = pos
            pos += f.write(arrays[n].tobytes())
    whole = FileBackedData(blob, owned=True)
    produced: list[str] = []
    w = fg.GGUFWriter(out, "llama", consume=True)
    _key_values(w, n_vocab)
    for name, a in arrays.items():
        if name in offsets:
            w.add_tensor(name, whole.slice(offsets[name], a.nbytes), raw_shape=a.shape,
                         raw_dtype=fg.GGMLType.F16)
        elif ".attn_q." in name or ".attn_k." in name:
            def make(a: np.ndarray = a, name: str = name) -> np.ndarray:
                produced.append(name)
                fresh: np.ndarray = a.copy()  # produced now, as a conversion script would
                return fresh
            w.add_tensor(name, make)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    report = w.close()
    assert sorted(produced) == sorted(n for n in arrays if ".attn_q." in n or ".attn_k." in n)
    moved = {a.action for a in report.actions}
    assert "moved" in moved, moved
    assert not blob.exists()  # the blob's bytes were moved into the output, not copied
    return ffn


def _write_gguf_py(out: Path, arrays: dict[str, np.ndarray], n_vocab: int) -> None:
    w = gguf.GGUFWriter(str(out), "llama")
    _key_values(w, n_vocab)
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama_cpp_loads_and_evaluates_a_gguf_written_by_filecord(tmp_path: Path) -> None:
    n_vocab = len(_vocab()[0])
    arrays = _tensors(n_vocab)
    ours, ref = tmp_path / "ours" / "tiny.gguf", tmp_path / "ref" / "tiny.gguf"
    ours.parent.mkdir()
    ref.parent.mkdir()
    _write_gguf_py(ref, arrays, n_vocab)
    _write_filecord(ours, arrays, n_vocab)
    assert ours.read_bytes() == ref.read_bytes()
    assert sorted(os.listdir(ours.parent)) == ["tiny.gguf"]  # no scratch, no blob left

    llm = llama_cpp.Llama(model_path=str(ours), n_ctx=64, n_threads=1, n_batch=64,
                          verbose=False, logits_all=True)
    try:
        assert llm.n_vocab() == n_vocab
        assert llm.n_embd() == EMBD
        assert llm.n_ctx() >= 64  # llama.cpp rounds the context up (to 256 here)
        tokens = llm.tokenize(b"hello the world", add_bos=True)
        assert tokens[0] == 1
        assert len(tokens) >= 4
        assert all(0 <= t < n_vocab for t in tokens)
        assert llm.detokenize(tokens) == b"hello the world"  # the vocabulary as written
        # byte fallback: a character outside the pieces becomes its UTF-8 bytes' tokens
        assert llm.tokenize("é".encode(), add_bos=False, special=False)[-2:] == \
            [3 + 0xC3, 3 + 0xA9]
        llm.eval(tokens)
        logits = np.asarray(llm.scores[:llm.n_tokens], dtype=np.float64)
        assert logits.shape == (len(tokens), n_vocab)
        assert np.isfinite(logits).all()
        assert float(logits.std()) > 0  # real numbers from the random weights, not zeros
        # the last position's logits as llama.cpp's own C API gives them
        last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        assert all(math.isclose(last[i], logits[-1, i], rel_tol=1e-5, abs_tol=1e-6)
                   for i in range(n_vocab))
        # it generates from them (greedy): every token id within the vocabulary
        nxt = llm.sample(temp=0.0)
        assert 0 <= nxt < n_vocab
    finally:
        llm.close()
