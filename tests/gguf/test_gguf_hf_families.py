"""Every family and tokenizer form against llama.cpp's own ``convert_hf_to_gguf.py``.

For each entry of the converter's family table (Llama 2 and 3.1, Mistral with a sliding window,
Qwen2, Qwen3, Gemma 2) a tiny random checkpoint is saved by ``save_pretrained`` in bf16 (as
published; configs as transformers writes them, edited where the Hub's copies differ) and
converted by filecord and by the reference (llama-cpp-python 0.3.36's vendored llama.cpp).
The two files must hold the same tensors (names, order, types, dims, bytes) and the same
key-values, ``general.*`` metadata aside and the differences each case names with its reason.
``q8_0`` and ``auto`` are compared the same way, and a SentencePiece tokenizer saved as
``tokenizer.json`` only (transformers 5) must give the keys the reference writes from its
``tokenizer.model``.  The reference needs no llama.cpp build: these tests run wherever its
Python sources can be had (``tests/support/hf_models.reference_converter``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

from tests.support.hf_models import (
    as_transformers_4,
    gguf_contents,
    reference_or_skip,
    run_reference,
    tiny_model,
)

pytestmark = pytest.mark.slow
REF = reference_or_skip()
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
# written differently on purpose: the reference title-cases the directory name and derives a
# size label; filecord writes the directory name and no label
METADATA = {"general.name", "general.size_label"}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@dataclass(frozen=True)
class Case:
    model: dict[str, Any]  # tiny_model arguments
    ours: tuple[str, ...] = ()
    ref: tuple[str, ...] = ()
    pre: str | None = None  # the reference's BPE pre-tokenizer (its hash table cannot know ours)
    drop_config: tuple[str, ...] = ()  # keys the Hub's config.json does not have
    drop_tokenizer_config: tuple[str, ...] = ()
    differ: dict[str, Any] = field(default_factory=dict)  # key -> filecord's value, and why


CASES = {
    "llama2-spm": Case({"arch": "llama", "tokenizer": "spm"}),
    # the Hub's Llama 3.1 config has no head_dim (AutoConfig fills it) and its
    # tokenizer_config.json no add_eos_token (the post-processor says it)
    "llama3.1-bpe-rope-freqs": Case(
        {"arch": "llama", "tokenizer": "bpe", "rope_parameters": LLAMA3_ROPE},
        pre="llama-bpe", drop_config=("head_dim",), drop_tokenizer_config=("add_eos_token",)),
    "llama-bpe-q8_0": Case({"arch": "llama", "tokenizer": "bpe"}, ("--outtype", "q8_0"),
                           ("--outtype", "q8_0"), pre="llama-bpe"),
    "llama-spm-f32-auto": Case({"arch": "llama", "tokenizer": "spm", "dtype": "float32"},
                               ("--outtype", "auto"), ()),
    # llama.cpp's llama has no sliding window; filecord claims only the context in which
    # attending to everything is what Mistral computes (README: convert)
    "mistral-spm-window": Case({"arch": "mistral", "tokenizer": "spm", "sliding_window": 64},
                               differ={"llama.context_length": 64}),
    "qwen2-bpe": Case({"arch": "qwen2", "tokenizer": "qwen2", "pad_vocab": 4}, pre="qwen2",
                      drop_config=("head_dim",)),
    "qwen2-bpe-q8_0": Case({"arch": "qwen2", "tokenizer": "qwen2", "pad_vocab": 4},
                           ("--outtype", "q8_0"), ("--outtype", "q8_0"), pre="qwen2"),
    "qwen3-bpe-tied": Case({"arch": "qwen3", "tokenizer": "qwen2", "pad_vocab": 4,
                            "tied": True}, pre="qwen2"),
    "gemma2-spm": Case({"arch": "gemma2", "tokenizer": "gemma", "tied": True}),
    "gemma2-spm-f16-q8_0": Case({"arch": "gemma2", "tokenizer": "gemma", "tied": True,
                                 "dtype": "float16"}, ("--outtype", "q8_0"),
                                ("--outtype", "q8_0")),
}


def convert(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", *args, "-q"],
                       capture_output=True, text=True, env=ENV, check=False)
    assert r.returncode == 0, r.stderr


def edit(path: Path, drop: tuple[str, ...]) -> None:
    if drop:
        data = json.loads(path.read_text())
        for key in drop:
            data.pop(key, None)
        path.write_text(json.dumps(data))


def compare(ours: Path, ref: Path, differ: dict[str, Any]) -> None:
    kva, ta = gguf_contents(ours)
    kvb, tb = gguf_contents(ref)
    assert list(ta) == list(tb)  # names and order
    for name in ta:
        assert ta[name][:2] == tb[name][:2], (name, ta[name][:2], tb[name][:2])
        assert ta[name][2] == tb[name][2], f"{name}: bytes differ"
    keys = (kva.keys() | kvb.keys()) - METADATA
    got = {k for k in keys if kva.get(k) != kvb.get(k)}
    assert got == set(differ), {k: (kva.get(k), kvb.get(k)) for k in got}
    for key, value in differ.items():
        assert kva[key][1] == value


@pytest.mark.parametrize("case", list(CASES))
def test_same_gguf_as_llama_cpp_converter(tmp_path: Path, case: str) -> None:
    c = CASES[case]
    model = tiny_model(tmp_path / "m", **{"dtype": "bfloat16", **c.model})
    edit(model / "config.json", c.drop_config)
    edit(model / "tokenizer_config.json", c.drop_tokenizer_config)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    convert(str(model), "-o", str(ours), *c.ours)
    assert REF is not None
    run_reference(REF, model, ref, *c.ref, pre=c.pre)
    compare(ours, ref, c.differ)


TOKENIZER_KEYS = {f"tokenizer.{k}" for k in (
    "ggml.model", "ggml.tokens", "ggml.scores", "ggml.token_type", "ggml.bos_token_id",
    "ggml.eos_token_id", "ggml.add_bos_token", "ggml.add_eos_token",
    "chat_template")}


@pytest.mark.parametrize("form", ["transformers-5", "transformers-5-legacy", "transformers-4"])
def test_tokenizer_json_only_gives_the_keys_of_tokenizer_model(tmp_path: Path, form: str
                                                               ) -> None:
    """A Llama SentencePiece tokenizer saved by transformers 5 as tokenizer.json only (its
    LlamaTokenizer, legacy false as by default or true; or edited to transformers 4's steps):
    filecord writes from it every key llama.cpp's converter writes from the tokenizer.model of
    the same tokenizer (its known gap, README: tests/gguf/test_gguf_hf_tokenizers.py)."""
    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="bfloat16")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    json_only = tmp_path / "json"
    shutil.copytree(model, json_only)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, legacy=form == "transformers-5-legacy")
    assert type(tok).__name__ == "LlamaTokenizer"
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (json_only / name).unlink()
    tok.save_pretrained(json_only)
    assert not (json_only / "tokenizer.model").exists()
    saved = json.loads((json_only / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "LlamaTokenizer"
    if form == "transformers-4":
        as_transformers_4(json_only)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    convert(str(json_only), "-o", str(ours))
    assert REF is not None
    run_reference(REF, model, ref)
    compare(ours, ref, {})
    kv, _ = gguf_contents(ours)
    assert kv.keys() >= TOKENIZER_KEYS  # compared (every key is), equal; the unknown id is
    # written by neither (token_type marks it)
    assert kv["tokenizer.ggml.model"][1] == "llama"
    # and the tokenizer llama.cpp builds from them is transformers' (scores in merge order)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model / "tokenizer.model"))
    text = "the llama moves a file cord into one gguf shard."
    assert tok(text, add_special_tokens=False)["input_ids"] == sp.encode(text)
