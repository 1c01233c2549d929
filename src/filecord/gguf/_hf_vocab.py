"""A Hugging Face tokenizer as llama.cpp's ``tokenizer.ggml.*`` key-values.

Two kinds are written, each by the library made for reading it:

* SentencePiece (``tokenizer.model``) -> ``tokenizer.ggml.model = "llama"``: pieces, scores and
  piece kinds come from ``sentencepiece`` itself (the ``.model`` file is a protobuf whose
  reading rules -- byte pieces, control and unused pieces -- belong to that library);
* byte-level BPE (``tokenizer.json``, no ``tokenizer.model``) -> ``"gpt2"``: the vocabulary and
  the added tokens come from Hugging Face ``tokenizers``, which owns that JSON format; the
  pre-tokenizer name (``tokenizer.ggml.pre``) is recognised from the pre-tokenizer's structure
  (its split regex and byte-level step), since llama.cpp hard-codes one regex per name.

Special token ids, ``add_bos``/``add_eos``, merges and the chat template come from gguf-py's
``SpecialVocab`` (gguf 0.19), the helper llama.cpp's own converter uses, so they follow the same
rules for ``tokenizer_config.json``, ``config.json`` and post-processor templates.  Anything
else is refused by name before a byte is written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord.gguf._types import KeyValue, ValueType
from filecord.gguf.errors import UnsupportedModelError

log = logging.getLogger(__name__)

# llama_token_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
JSON_LIMIT = 256 << 20  # a tokenizer.json of a 256k vocabulary is ~20 MB
SPM_UNSET_SCORE = -10000.0  # ids the .model does not fill
ADDED_SCORE = -1000.0  # user-defined and control tokens added on top of the .model

# The Llama 3 split regex (also Mistral Nemo-style byte-level BPE vocabularies use it).
_LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
SUPPORTED = ("SentencePiece tokenizer.model", "byte-level BPE tokenizer.json with the GPT-2 or "
             "the Llama 3 pre-tokenizer")


@dataclass(frozen=True, slots=True)
class Vocab:
    """What the tokenizer contributes: its key-values, and the kind, for reports."""

    kind: str
    kvs: tuple[KeyValue, ...]


def _looks_special(text: str) -> bool:
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _json(path: str) -> Any:
    try:
        return json.loads(_sys.read_text(path, limit=JSON_LIMIT))
    except ValueError as exc:
        raise UnsupportedModelError(f"{path}: not valid JSON: {exc}") from None


HF_EXTRA = ("gguf", "sentencepiece", "tokenizers", "numpy")  # pyproject.toml's hf extra


def _import(name: str) -> Any:
    import importlib
    import importlib.util

    try:
        return importlib.import_module(name)
    except ImportError:
        # Every package of the hf extra that is missing, named at once: one install, not one
        # per try; the advice works from a checkout and from PyPI alike.
        missing = [m for m in HF_EXTRA if importlib.util.find_spec(m) is None] or [name]
        raise UnsupportedModelError(
            f"reading this tokenizer needs the {name!r} package; of the hf extra, "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install {' '.join(missing)} (or the extra: pip install -e '.[hf]' in a "
            "checkout of filecord, pip install 'filecord[hf]' from PyPI)") from None


def _special_kvs(directory: str, *, merges: bool, n_vocab: int | None) -> list[KeyValue]:
    """gguf-py's SpecialVocab, run against a key collector (our writer, never saved)."""
    from filecord.gguf._writer import GGUFWriter

    gguf = _import("gguf")
    collector = GGUFWriter(os.path.join(directory, "unused.gguf"), "llama")
    special = gguf.SpecialVocab(directory, load_merges=merges, n_vocab=n_vocab)
    special.add_to_gguf(collector, quiet=True)
    return [kv for k, kv in collector.kv_data.items() if k != "general.architecture"]


def _arr(key: str, values: list[Any], sub: ValueType) -> KeyValue:
    return KeyValue(key, ValueType.ARRAY, tuple(values), sub)


def _spm(directory: str, vocab_size: int) -> list[KeyValue]:
    spm = _import("sentencepiece")
    proc = spm.SentencePieceProcessor()
    path = os.path.join(directory, "tokenizer.model")
    try:
        proc.LoadFromFile(path)
    except (OSError, RuntimeError) as exc:
        raise UnsupportedModelError(f"{path}: sentencepiece cannot read it: {exc}") from None
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [SPM_UNSET_SCORE] * vocab_size
    types = [UNUSED] * vocab_size
    n = proc.vocab_size()
    if n > vocab_size:
        # the dropped pieces would still be produced by the tokenizer, and an id past the
        # embedding reads out of bounds in llama.cpp
        raise UnsupportedModelError(f"{path} has {n} pieces but config.json vocab_size (the "
                                    f"embedding's rows) is {vocab_size}")
    for i in range(min(n, vocab_size)):
        kind = (UNKNOWN if proc.IsUnknown(i) else CONTROL if proc.IsControl(i)
                else UNUSED if proc.IsUnused(i) else BYTE if proc.IsByte(i) else NORMAL)
        tokens[i], scores[i], types[i] = proc.IdToPiece(i), float(proc.GetScore(i)), kind
    added = os.path.join(directory, "added_tokens.json")
    if _sys.isfile(added):
        for text, i in dict(_json(added)).items():
            if isinstance(i, int) and 0 <= i < vocab_size:
                tokens[i], scores[i], types[i] = text, ADDED_SCORE, USER_DEFINED
    config = os.path.join(directory, "tokenizer_config.json")
    if _sys.isfile(config):
        decoder = dict(_json(config)).get("added_tokens_decoder", {}) or {}
        for key, entry in decoder.items():
            i = int(key)
            if not 0 <= i < vocab_size:
                continue
            text = str(entry["content"])
            if entry.get("special") or _looks_special(text):
                types[i] = CONTROL
            else:
                text = text.replace("\u2581", " ")  # llama.cpp wants user tokens pre-normalized
                types[i] = USER_DEFINED
            tokens[i], scores[i] = text, ADDED_SCORE
    return [KeyValue("tokenizer.ggml.model", ValueType.STRING, "llama"),
            KeyValue("tokenizer.ggml.pre", ValueType.STRING, "default"),
            _arr("tokenizer.ggml.tokens", tokens, ValueType.STRING),
            _arr("tokenizer.ggml.scores", scores, ValueType.FLOAT32),
            _arr("tokenizer.ggml.token_type", types, ValueType.INT32)]


def pre_tokenizer_name(spec: Mapping[str, Any] | None) -> str | None:
    """llama.cpp's name for a byte-level BPE pre-tokenizer, from ``tokenizer.json``'s
    ``pre_tokenizer`` object; None when it is not one llama.cpp implements here."""
    if not isinstance(spec, Mapping):
        return None
    kind = spec.get("type")
    if kind == "ByteLevel" and spec.get("use_regex", True) and not spec.get("add_prefix_space"):
        return "gpt-2"
    if kind != "Sequence":
        return None
    steps = list(spec.get("pretokenizers") or [])
    if len(steps) != 2:
        return None
    split, byte = steps
    pattern = (split.get("pattern") or {}).get("Regex") if isinstance(split, Mapping) else None
    if (isinstance(byte, Mapping) and byte.get("type") == "ByteLevel"
            and not byte.get("use_regex", True) and not byte.get("add_prefix_space")
            and split.get("type") == "Split" and split.get("behavior") == "Isolated"
            and not split.get("invert") and pattern == _LLAMA3_REGEX):
        return "llama-bpe"
    return None


def _bpe(directory: str, vocab_size: int) -> list[KeyValue]:
    path = os.path.join(directory, "tokenizer.json")
    spec = dict(_json(path))
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        fallback = (" with byte_fallback (converted from SentencePiece)"
                    if model.get("byte_fallback") else "")
        raise UnsupportedModelError(
            f"{path}: a {model.get('type')!r} tokenizer{fallback} is not supported without "
            f"tokenizer.model; supported: {'; '.join(SUPPORTED)}")
    if spec.get("normalizer") is not None:
        # llama.cpp's BPE tokenizer applies no normalizer: it would tokenize differently
        raise UnsupportedModelError(
            f"{path}: a normalizer ({json.dumps(spec.get('normalizer'))[:80]}) is not "
            f"supported for a byte-level BPE tokenizer.json (llama.cpp applies none); "
            f"supported: {'; '.join(SUPPORTED)}")
    pre = pre_tokenizer_name(spec.get("pre_tokenizer"))
    if pre is None:
        raise UnsupportedModelError(
            f"{path}: this pre-tokenizer is not one filecord recognises (supported: GPT-2's "
            f"ByteLevel, Llama 3's Split + ByteLevel): "
            f"{json.dumps(spec.get('pre_tokenizer'))[:200]}")
    tok = _import("tokenizers").Tokenizer.from_file(path)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= vocab_size:
        raise UnsupportedModelError(f"{path}: token id {max(vocab.values())} is outside "
                                    f"config.json vocab_size {vocab_size}")
    by_id = {i: t for t, i in vocab.items()}
    added = tok.get_added_tokens_decoder()
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        a = added.get(i)
        if a is None:
            types.append(NORMAL)
        else:
            if not a.normalized:  # as the tokenizer would spell it back
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids,
                                  skip_special_tokens=False)
            if a.special or _looks_special(text):
                types.append(CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(USER_DEFINED)
        tokens.append(text)
    return [KeyValue("tokenizer.ggml.model", ValueType.STRING, "gpt2"),
            KeyValue("tokenizer.ggml.pre", ValueType.STRING, pre),
            _arr("tokenizer.ggml.tokens", tokens, ValueType.STRING),
            _arr("tokenizer.ggml.token_type", types, ValueType.INT32)]


def _same_pieces(directory: str) -> None:
    """With both files, the ``tokenizer.json`` (what transformers' fast tokenizer loads) must
    hold the ``tokenizer.model``'s pieces at the same ids: llama.cpp is given the latter, so a
    disagreement means it would tokenize differently from transformers."""
    path = os.path.join(directory, "tokenizer.json")
    if not _sys.isfile(path):
        return
    spec = dict(_json(path))
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] by id
        pieces = {str(e[0]): i for i, e in enumerate(vocab) if isinstance(e, list) and e}
    elif isinstance(vocab, dict):
        pieces = {str(k): v for k, v in vocab.items()}
    else:
        pieces = {}
    proc = _import("sentencepiece").SentencePieceProcessor()
    proc.LoadFromFile(os.path.join(directory, "tokenizer.model"))  # read by _spm already
    spm_pieces = {proc.IdToPiece(i): i for i in range(proc.vocab_size())}
    differ = [t for t, i in pieces.items() if spm_pieces.get(t) != i]
    if model.get("type") not in ("BPE", "Unigram") or differ or len(pieces) != len(spm_pieces):
        raise UnsupportedModelError(
            f"{directory}: tokenizer.json (a {model.get('type')!r} model of {len(pieces)} "
            f"pieces) does not hold tokenizer.model's {len(spm_pieces)} pieces at the same ids"
            + (f" (e.g. {differ[0]!r})" if differ else "")
            + "; transformers would load the former, llama.cpp is given the latter: remove "
            "the one that is wrong")


def read_vocab(directory: str, vocab_size: int) -> Vocab:
    """The tokenizer's key-values in llama.cpp's converter's order, or
    :class:`UnsupportedModelError` naming what is supported."""
    if vocab_size in (32016, 49152):
        # llama.cpp's converter special-cases these sizes (CodeLlama infill tokens, Granite's
        # add_bos): writing them like any other would give a different tokenizer.
        raise UnsupportedModelError(f"vocab_size {vocab_size} (CodeLlama/Granite) is "
                                    f"special-cased by llama.cpp and not supported")
    head: list[KeyValue] = []
    config = os.path.join(directory, "tokenizer_config.json")
    if _sys.isfile(config):
        prefix = dict(_json(config)).get("add_prefix_space")
        if isinstance(prefix, bool):
            head.append(KeyValue("tokenizer.ggml.add_space_prefix", ValueType.BOOL, prefix))
    if _sys.isfile(os.path.join(directory, "tokenizer.model")):
        body = _spm(directory, vocab_size)
        _same_pieces(directory)
        tail = _special_kvs(directory, merges=False, n_vocab=vocab_size)
        kind = "sentencepiece"
    elif _sys.isfile(os.path.join(directory, "tokenizer.json")):
        body = _bpe(directory, vocab_size)
        tail = _special_kvs(directory, merges=True, n_vocab=None)
        kind = "bpe"
    else:
        raise UnsupportedModelError(f"{directory}: no tokenizer.model or tokenizer.json "
                                    f"(supported: {'; '.join(SUPPORTED)})")
    return Vocab(kind, tuple(head + body + tail))
