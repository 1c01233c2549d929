"""Tiny Hugging Face Llama/Mistral checkpoints made here: random weights, saved sharded, with a
tokenizer trained here (SentencePiece ``tokenizer.model``, or a byte-level BPE
``tokenizer.json`` built with ``tokenizers`` using Llama 3's pre-tokenizer).  Nothing is
downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = ["the", "a", "file", "cord", "llama", "gguf", "tensor", "shard", "byte", "move", "copy",
         "clone", "disk", "memory", "model", "token", "vocab", "merge", "split", "rope", "head",
         "query", "key", "value", "norm", "weight", "bias", "layer"]
LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def corpus(lines: int = 400, seed: int = 7) -> list[str]:
    rng = random.Random(seed)  # noqa: S311 - test text, not secrets
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."
            for _ in range(lines)]


def spm_tokenizer(directory: Path, vocab_size: int = 320, *, dummy_prefix: bool = True,
                  tokenizer_class: str = "LlamaTokenizer", byte_fallback: bool = True,
                  user_symbols: tuple[str, ...] = (), normalization: str = "identity") -> int:
    """A SentencePiece BPE model (with byte fallback unless told; ``user_symbols`` its
    user-defined pieces, after the unknown, BOS and EOS; the identity normalizer keeping
    whitespace, as Llama 2's, Mistral's and Gemma's, unless told, e.g. the trainer's default
    ``nmt_nfkc``); returns its vocabulary size."""
    import sentencepiece as spm

    text = directory / "corpus.txt"
    text.write_text("\n".join(corpus()) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(directory / "tokenizer"), vocab_size=vocab_size,
        model_type="bpe", byte_fallback=byte_fallback, character_coverage=1.0, bos_id=1, eos_id=2,
        unk_id=0, pad_id=-1, minloglevel=2, add_dummy_prefix=dummy_prefix,
        user_defined_symbols=list(user_symbols), normalization_rule_name=normalization,
        remove_extra_whitespaces=normalization != "identity")
    text.unlink()
    (directory / "tokenizer.vocab").unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "tokenizer_class": tokenizer_class}))
    return vocab_size


def gemma_tokenizer(directory: Path) -> int:
    """SentencePiece as Gemma ships it: no dummy prefix (llama.cpp's converter writes
    add_space_prefix false for every Gemma)."""
    return spm_tokenizer(directory, dummy_prefix=False, tokenizer_class="GemmaTokenizer")


QWEN2_REGEX = LLAMA3_REGEX.replace("\\p{N}{1,3}", "\\p{N}")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}")


def qwen2_tokenizer(directory: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE ``tokenizer.json`` as Qwen2 ships it (its split regex, NFC, no BOS,
    ChatML specials and template); returns its size."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(specials)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "add_bos_token": False, "add_prefix_space": False, "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "Qwen2Tokenizer", "errors": "replace"}))
    return tok.get_vocab_size()


META = "\u2581"
# transformers 4's steps around a SentencePiece BPE (what it writes for legacy Llama/Mistral
# tokenizers): the dummy prefix and spaces as meta symbols, as sentencepiece and llama.cpp do
PREPEND_REPLACE = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": META},
    {"type": "Replace", "pattern": {"String": " "}, "content": META}]}


def saved_spm_json(directory: Path, cls: str = "AutoTokenizer",
                   user_symbols: tuple[str, ...] = (), **kwargs: Any) -> int:
    """A SentencePiece tokenizer as transformers 5 saves it (``cls``, e.g. ``LlamaTokenizer``
    with ``legacy``, or ``GemmaTokenizer``): ``tokenizer.json`` (a byte-fallback BPE) and its
    ``tokenizer_config.json``, no ``tokenizer.model``; returns its size with added tokens."""
    import transformers

    spm_tokenizer(directory, tokenizer_class="GemmaTokenizer" if "Gemma" in cls
                  else "LlamaTokenizer", user_symbols=user_symbols)
    tok = getattr(transformers, cls).from_pretrained(directory, **kwargs)
    (directory / "tokenizer.model").unlink()
    (directory / "tokenizer_config.json").unlink()
    tok.save_pretrained(directory)
    assert not (directory / "tokenizer.model").exists()
    return len(tok)


def as_transformers_4(directory: Path) -> None:
    """Give a saved SentencePiece ``tokenizer.json`` transformers 4's steps (Prepend + Replace
    normalizers) and a class that runs them (transformers 5's LlamaTokenizer builds its own)."""
    for name, change in (("tokenizer.json", {"normalizer": PREPEND_REPLACE,
                                             "pre_tokenizer": None}),
                         ("tokenizer_config.json",
                          {"tokenizer_class": "PreTrainedTokenizerFast"})):
        path = directory / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def spm_json_tokenizer(directory: Path) -> int:
    """A SentencePiece ``tokenizer.json`` only, in transformers 4's form (the one llama.cpp's
    SentencePiece tokenizer runs as transformers does)."""
    vocab = saved_spm_json(directory)
    as_transformers_4(directory)
    return vocab


def gemma_json_tokenizer(directory: Path) -> int:
    """Gemma's SentencePiece tokenizer as transformers 5 saves it (``GemmaTokenizer``, no
    dummy prefix), with no ``tokenizer.model``."""
    return saved_spm_json(directory, "GemmaTokenizer")


def bpe_tokenizer(directory: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE ``tokenizer.json`` with Llama 3's pre-tokenizer; returns its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(specials)
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{specials[0]} $A", pair=f"{specials[0]} $A "
                                      f"{specials[0]} $B", special_tokens=[(specials[0], bos)])])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": specials[0], "eos_token": specials[1], "add_bos_token": True,
        "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": True}))
    return tok.get_vocab_size()


TOKENIZERS = {"spm": spm_tokenizer, "bpe": bpe_tokenizer, "qwen2": qwen2_tokenizer,
              "spm-json": spm_json_tokenizer, "gemma": gemma_tokenizer,
              "gemma-json": gemma_json_tokenizer}
# what each family's published configs give beside the common hyperparameters
FAMILY_CONFIG: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 32},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
}


def tiny_model(directory: Path, *, arch: str = "llama", tokenizer: str = "spm",
               dtype: str = "float32", shard: str = "40KB", seed: int = 0,
               tied: bool = False, pad_vocab: int = 0, **config: Any) -> Path:
    """A random tiny checkpoint saved by ``save_pretrained`` (sharded) with its tokenizer;
    ``arch`` is a transformers ``model_type`` (llama, mistral, qwen2, qwen3, gemma2)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab = TOKENIZERS[tokenizer](directory)
    if tokenizer in ("spm", "spm-json", "gemma", "gemma-json"):
        ids: dict[str, Any] = {"bos_token_id": 1, "eos_token_id": 2}
    elif tokenizer == "qwen2":
        ids = {"bos_token_id": None, "eos_token_id": vocab - 1, "pad_token_id": vocab - 3}
    else:
        ids = {"bos_token_id": vocab - 2, "eos_token_id": vocab - 1}
    params: dict[str, Any] = dict(vocab_size=vocab + pad_vocab, hidden_size=64,
                                  intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=256, rms_norm_eps=1e-5,
                                  tie_word_embeddings=tied, **ids)
    params.update(FAMILY_CONFIG.get(arch, {}))
    params.update(config)
    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **params))
    with torch.no_grad():
        for p in model.parameters():  # norms too: a norm of ones would hide a wrong order
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.3) + (1.0 if p.dim() == 1
                                                                           else 0.0))
    model.to(getattr(torch, dtype)).save_pretrained(directory, max_shard_size=shard)
    return directory


REFERENCE_VERSION = "0.3.36"
# Run llama.cpp's converter in a subprocess; with --pre NAME its BPE pre-tokenizer table (a hash
# of known vocabularies' token ids, which a vocabulary trained here can never be in) is
# bypassed and NAME used: the one thing the test decides for it.
RUNNER = """
import runpy, sys
ref, argv = sys.argv[1], sys.argv[2:]
pre = None
if argv[:1] == ["--pre"]:
    pre, argv = argv[1], argv[2:]
sys.path[:0] = [ref, ref + "/gguf-py"]
if pre:
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [ref + "/convert_hf_to_gguf.py", *argv]
runpy.run_path(ref + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def reference_converter() -> Path | None:
    """llama.cpp's ``convert_hf_to_gguf.py`` directory, from the llama-cpp-python source
    package (the one tools/test builds): ``$FILECORD_LLAMA_CPP_SRC``, else a cached download
    (``pip download``); None when neither is possible.

    Under pytest-xdist several workers ask at once: one downloads and unpacks under a lock,
    into a fresh directory renamed into place, so no worker sees half a tree."""
    import fcntl
    import os
    import shutil
    import subprocess
    import sys
    import tarfile
    import tempfile

    env = os.environ.get("FILECORD_LLAMA_CPP_SRC")
    if env:
        return Path(env) if (Path(env) / "convert_hf_to_gguf.py").is_file() else None
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "filecord-tests"
    unpacked = cache / f"llama_cpp_python-{REFERENCE_VERSION}"
    root = unpacked / "vendor" / "llama.cpp"
    if (root / "convert_hf_to_gguf.py").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "convert_hf_to_gguf.py").is_file():  # another worker made it meanwhile
            return root
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--no-binary", ":all:", f"llama-cpp-python=={REFERENCE_VERSION}",
                            "-d", str(cache)], capture_output=True, text=True, check=False)
        tar = cache / f"llama_cpp_python-{REFERENCE_VERSION}.tar.gz"
        if r.returncode != 0 or not tar.is_file():
            return None
        scratch = Path(tempfile.mkdtemp(dir=cache))
        with tarfile.open(tar) as t:
            members = [m for m in t.getmembers()
                       if "/vendor/llama.cpp/" in m.name and ("convert_hf_to_gguf.py" in m.name
                                                              or "/conversion/" in m.name
                                                              or "/gguf-py/" in m.name)]
            t.extractall(scratch, members=members, filter="data")
        shutil.rmtree(unpacked, ignore_errors=True)  # a tree a killed run left half-made
        (scratch / unpacked.name).rename(unpacked)
        shutil.rmtree(scratch)
    return root if (root / "convert_hf_to_gguf.py").is_file() else None


def reference_or_skip() -> Path:
    """The reference converter's directory, or the calling test module skipped saying how to
    provide it."""
    import pytest

    ref = reference_converter()
    if ref is None:  # pragma: no cover - depends on the environment
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not available (set "
                    "FILECORD_LLAMA_CPP_SRC to its directory)", allow_module_level=True)
    return ref


def run_reference(ref: Path, model: Path, out: Path, *args: str, pre: str | None = None
                  ) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-c", RUNNER, str(ref)] + (["--pre", pre] if pre else [])
    r = subprocess.run([*cmd, str(model), "--outfile", str(out), *args], capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise AssertionError(f"the reference converter failed: {r.stderr[-2000:]}")


def gguf_contents(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...],
                                                                       bytes]]]:
    """(key -> (types, value), tensor -> (type, dims, bytes)) as gguf-py reads a file."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    kvs = {f.name: (tuple(int(t) for t in f.types), f.contents())
           for f in r.fields.values() if not f.name.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), t.data.tobytes())
               for t in r.tensors}
    return kvs, tensors
