"""A Hugging Face tokenizer as llama.cpp's ``tokenizer.ggml.*`` key-values.

Two kinds are written, each by the library made for reading it:

* SentencePiece (``tokenizer.model``) -> ``tokenizer.ggml.model = "llama"``: pieces, scores and
  piece kinds come from ``sentencepiece`` itself (the ``.model`` file is a protobuf whose
  reading rules -- byte pieces, control and unused pieces -- belong to that library);
* a SentencePiece model converted to ``tokenizer.json`` (a byte-fallback BPE, what
  transformers 5 saves without ``tokenizer.model``) -> ``"llama"`` with the keys llama.cpp's
  converter writes from the ``.model``: pieces by id, kinds from the tokenizer's own marks
  (unknown, special, ``<0xNN>`` bytes), and the scores the SentencePiece BPE trainer gives
  (0 for the special and byte pieces, minus the rank for the others, which is the merge order
  the ``tokenizer.json`` applies), for the steps around it that llama.cpp's SentencePiece
  tokenizer takes (:data:`SPM_FORMS`, judged as transformers 5 runs them: it builds a
  LlamaTokenizer's own Metaspace, which takes the keys llama.cpp's converter writes from the
  ``.model`` of the same tokenizer, with the same known gap, see :data:`SPM_FORMS`);
* byte-level BPE (``tokenizer.json``, no ``tokenizer.model``) -> ``"gpt2"``: the vocabulary and
  the added tokens come from Hugging Face ``tokenizers``, which owns that JSON format; the
  pre-tokenizer name (``tokenizer.ggml.pre``) is recognised from the pre-tokenizer's structure
  (its split regex and byte-level step), since llama.cpp hard-codes one regex per name.

Every JSON file is checked field by field before any library reads it: a value of the wrong
type is a :class:`~filecord.gguf.errors.CheckpointFileError` naming the file and the field.

Special token ids, ``add_bos``/``add_eos``, merges and the chat template come from gguf-py's
``SpecialVocab`` (gguf 0.19), the helper llama.cpp's own converter uses, so they follow the same
rules for ``tokenizer_config.json``, ``config.json`` and post-processor templates; where the
post-processor says whether BOS/EOS are added, its word wins over ``tokenizer_config.json``
(what transformers does, and what llama.cpp's bundled gguf-py does); a template's first or
last token must be the BOS or EOS the checkpoint names, and a ``config.json`` id list gguf-py
skips gives the EOS transformers' generate stops on first.  Anything else is refused by name
before a byte is written.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, cast

from filecord._io import syscalls as _sys
from filecord.gguf._hf_files import exists, read_bytes, read_json, read_text
from filecord.gguf._hf_model import Family
from filecord.gguf._hf_schema import SPECIAL_TYPES, TOKENIZER_CONFIG, TOKENIZER_JSON, problem
from filecord.gguf._types import KeyValue, ValueType
from filecord.gguf.errors import CheckpointFileError, UnsupportedModelError

log = logging.getLogger(__name__)

# llama_token_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPM_LIMIT = 64 << 20  # a tokenizer.model of a 256k vocabulary is ~4 MB
SPM_UNSET_SCORE = -10000.0  # ids the .model does not fill
ADDED_SCORE = -1000.0  # user-defined and control tokens added on top of the .model

# The Llama 3 split regex (also Mistral Nemo-style byte-level BPE vocabularies use it).
_LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# Qwen2's: as Llama 3's, but digits one at a time
_QWEN2_REGEX = _LLAMA3_REGEX.replace("\\p{N}{1,3}", "\\p{N}")
_PRE_REGEX = {_LLAMA3_REGEX: "llama-bpe", _QWEN2_REGEX: "qwen2"}
SUPPORTED = ("SentencePiece tokenizer.model", "a SentencePiece BPE converted to tokenizer.json "
             "(byte_fallback)", "byte-level BPE tokenizer.json with the GPT-2, Llama 3 or "
             "Qwen2 pre-tokenizer")
# What llama.cpp's SentencePiece loader assumes unless told: the tokenizer.json spells them
# out, a tokenizer.model does not, so they are left out to write what the reference writes.
SPM_IMPLIED: dict[str, object] = {"tokenizer.ggml.unknown_token_id": 0,
                                  "tokenizer.ggml.add_sep_token": False}


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


def _bad(path: str, key: str, why: str) -> CheckpointFileError:
    name = os.path.basename(path)
    return CheckpointFileError(why, field=f"{name}: {key}" if key else name)


def _json(path: str) -> dict[str, Any]:
    """A JSON object file (every file a tokenizer comes in is one)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise _bad(path, "", f"must be a JSON object, got {type(value).__name__}")
    return value


def _of(path: str, key: str, value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if value is not None and (not isinstance(value, kinds)
                              or (isinstance(value, bool) and bool not in kinds)):
        raise _bad(path, key, f"must be {what}, got {json.dumps(value)[:80]}")
    return value


def _token_text(path: str, key: str, value: Any) -> str | None:
    """A ``*_token`` entry: a string, or an object whose ``content`` is one."""
    if isinstance(value, dict):
        return cast("str | None", _of(path, f"{key}.content", value.get("content"), (str,),
                                      "a string"))
    return cast("str | None", _of(path, key, value, (str,),
                                  "a string or an object with a content string"))


def check_tokenizer_config(path: str) -> dict[str, Any]:
    """``tokenizer_config.json`` against the fields the conversion and gguf-py read
    (:data:`._hf_schema.TOKENIZER_CONFIG`), its chat template, and its decoder's keys."""
    config = _json(path)
    found = problem(TOKENIZER_CONFIG, config)
    if found is not None:
        raise _bad(path, *found)
    check_chat_template(path, config.get("chat_template"))
    for key in config.get("added_tokens_decoder") or {}:
        if not key.isdecimal() or len(key) > 10:
            raise _bad(path, f"added_tokens_decoder.{key}", "keys must be token ids")
    return config


def _template_key(name: str) -> str:
    """The key suffix gguf-py's writer makes of a template's name."""
    return re.sub("[^A-Za-z0-9]", "_", name)


def check_chat_template(path: str, template: Any) -> None:
    """A ``chat_template`` value: a string, or a list of named templates whose names are
    non-empty and distinct as GGUF keys (gguf-py drops a nameless one and writes a repeated
    name's key twice, so either would lose a template)."""
    if not isinstance(template, list):
        _of(path, "chat_template", template, (str,), "a string or a list of templates")
        _no_nul(path, "chat_template", template)
        return
    names: dict[str, str] = {}
    for i, entry in enumerate(template):
        where = f"chat_template[{i}]"
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise _bad(path, where, "must be an object with name and template strings")
        name = entry["name"]
        if not name:
            raise _bad(path, f"{where}.name", "empty (a template's key is its name)")
        _no_nul(path, f"{where}.template", entry["template"])
        key = _template_key(name)
        if key in names:
            raise _bad(path, f"{where}.name", f"{name!r} is written as the key of "
                       f"{names[key]!r} (tokenizer.chat_template.{key})")
        names[key] = name


def _no_nul(path: str, key: str, template: Any) -> None:
    """llama.cpp reads a template as a C string: a NUL would cut it where transformers reads
    on."""
    if isinstance(template, str) and "\0" in template:
        raise _bad(path, key, f"holds U+0000 at character {template.index(chr(0))} (llama.cpp "
                   "would read the template only up to it)")


def check_chat_files(directory: str, config: Mapping[str, Any]) -> None:
    """The chat template files gguf-py reads beside ``tokenizer_config.json`` (``config``):
    text that is UTF-8 without NUL, a ``chat_template.json`` whose template is one, and no
    second template that differs: gguf-py writes ``tokenizer_config.json``'s, transformers
    runs the file's."""
    jinja = os.path.join(directory, "chat_template.jinja")
    found: tuple[str, Any] | None = None
    if exists(jinja):
        text = read_text(jinja)
        _no_nul(jinja, "", text)
        extra = os.path.join(directory, "additional_chat_templates")
        if _sys.isdir(extra):
            for name in sorted(_sys.listdir(extra)):
                if name.endswith(".jinja"):
                    more = os.path.join(extra, name)
                    _no_nul(more, "", read_text(more))
        found = (jinja, text)
    else:
        path = os.path.join(directory, "chat_template.json")
        if exists(path):
            template = _json(path).get("chat_template")
            check_chat_template(path, template)
            found = (path, template)
    if found is not None and "chat_template" in config and config["chat_template"] != found[1]:
        raise CheckpointFileError(
            f"tokenizer_config.json's chat_template differs from {os.path.basename(found[0])}"
            f": transformers would use the latter, llama.cpp's converter writes the former; "
            "remove the one that is not the model's",
            field=f"tokenizer_config.json: chat_template and {os.path.basename(found[0])}")


def check_tokenizer_json(path: str, vocab_size: int | None = None) -> dict[str, Any]:
    """``tokenizer.json`` against the structure ``tokenizers`` reads (:mod:`._hf_schema`),
    then what no schema says: a BPE's ids unique, its merges and unknown token pieces of its
    vocabulary, its added tokens' ids agreeing with the vocabulary (and, given
    ``vocab_size``, inside the embedding), a template's special tokens declared."""
    spec = _json(path)
    found = problem(TOKENIZER_JSON, spec)
    if found is not None:
        raise _bad(path, *found)
    model = spec["model"]
    if model["type"] == "BPE":
        _check_bpe(path, model)
    _check_added(path, spec, vocab_size)
    _check_templates(path, spec.get("post_processor"))
    return spec


def _check_bpe(path: str, model: Mapping[str, Any]) -> None:
    vocab: dict[str, int] = model["vocab"]
    by_id: dict[int, str] = {}
    for piece, i in vocab.items():
        if i in by_id:
            raise _bad(path, "model.vocab", f"{by_id[i]!r} and {piece!r} both have id {i} "
                       "(an id is one piece)")
        by_id[i] = piece
    prefix = model.get("continuing_subword_prefix") or ""
    for n, merge in enumerate(model["merges"]):
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        if prefix and not b.startswith(prefix):
            raise _bad(path, f"model.merges[{n}]", f"{b!r} does not start with "
                       f"continuing_subword_prefix {prefix!r}")
        for piece in (a, b, a + b[len(prefix):]):
            if piece not in vocab:
                raise _bad(path, f"model.merges[{n}]", f"{piece!r} is not a piece of "
                           "model.vocab")
    unk = model.get("unk_token")
    if unk and unk not in vocab:
        raise _bad(path, "model.unk_token", f"{unk!r} is not a piece of model.vocab")


def _check_added(path: str, spec: Mapping[str, Any], vocab_size: int | None) -> None:
    model = spec["model"]
    vocab = model["vocab"] if isinstance(model["vocab"], dict) else {
        e[0]: i for i, e in enumerate(model["vocab"])}
    pieces = {i: t for t, i in vocab.items()}
    seen: dict[int, str] = {}
    for n, entry in enumerate(spec.get("added_tokens") or ()):
        i, text, where = entry["id"], entry["content"], f"added_tokens[{n}]"
        if vocab_size is not None and i >= vocab_size:
            raise _bad(path, f"{where}.id", f"{i} is outside config.json vocab_size "
                       f"{vocab_size} (the embedding's rows)")
        if text in vocab and vocab[text] != i:
            raise _bad(path, f"{where}.id", f"{i}, but {text!r} is model.vocab's id "
                       f"{vocab[text]} (a piece has one id)")
        if text not in vocab and i in pieces:
            raise _bad(path, f"{where}.id", f"{i} is already model.vocab's {pieces[i]!r}")
        if seen.get(i, text) != text:
            raise _bad(path, f"{where}.id", f"{i} is also the id of {seen[i]!r}")
        for flag in ("lstrip", "rstrip", "single_word"):
            if entry.get(flag):
                # transformers strips the spaces around it (or matches whole words only);
                # the GGUF cannot say so and llama.cpp keeps them as tokens of their own
                raise _bad(path, f"{where}.{flag}", f"true for {text!r}: llama.cpp does not "
                           "take this flag (supported: false)")
        seen[i] = text


def _check_templates(path: str, pp: Any) -> None:
    procs = [] if pp is None else pp["processors"] if pp["type"] == "Sequence" else [pp]
    for n, proc in enumerate(procs):
        if proc["type"] != "TemplateProcessing":
            continue
        where = "post_processor" if len(procs) == 1 else f"post_processor.processors[{n}]"
        declared = proc.get("special_tokens") or {}
        for key, tok in declared.items():
            if len(tok["ids"]) != len(tok["tokens"]):
                raise _bad(path, f"{where}.special_tokens.{key}", "ids and tokens must be "
                           "lists of one length")
        for part in ("single", "pair"):
            for item in proc[part]:
                name = (item.get("SpecialToken") or {}).get("id")
                if name is not None and name not in declared:
                    raise _bad(path, f"{where}.{part}", f"special token {name!r} is not in "
                               "special_tokens")


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


def _check_config_ids(directory: str) -> None:
    """``config.json``'s ``*_token_id`` fields (gguf-py's SpecialVocab reads them)."""
    path = os.path.join(directory, "config.json")
    config = _json(path)
    for typ in SPECIAL_TYPES:
        v = config.get(f"{typ}_token_id")
        ids = v if isinstance(v, list) else [v]
        if not all(i is None or (isinstance(i, int) and not isinstance(i, bool) and i >= 0)
                   for i in ids):
            raise _bad(path, f"{typ}_token_id", f"must be a token id or a list of them, got "
                       f"{json.dumps(v)[:80]}")


def _special(item: Any) -> str | None:
    inner = item.get("SpecialToken") if isinstance(item, dict) else None
    return inner.get("id") if isinstance(inner, dict) else None


def post_processor_adds(spec: Mapping[str, Any] | None, config: Mapping[str, Any]
                        ) -> dict[str, bool]:
    """Which of BOS/EOS/SEP the tokenizer's post-processor adds, where it says (the rules of
    llama.cpp's bundled gguf-py: a byte-level step adds none unless a template does; a
    template's leading special token is BOS (or CLS), its trailing one EOS; a pair template
    with a special token between A and B adds SEP)."""
    pp = (spec or {}).get("post_processor")
    if not isinstance(pp, Mapping):
        return {}
    names = {typ: _token_text("tokenizer_config.json", typ, config.get(f"{typ}_token"))
             for typ in ("bos", "eos", "sep", "cls")}
    out: dict[str, bool] = {}
    procs = pp.get("processors") if pp.get("type") == "Sequence" else [pp]
    for proc in procs or ():
        kind = proc.get("type")
        if kind == "ByteLevel":
            out.setdefault("bos", False)
            out.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            out.update(bos=True, eos=True, sep=True)
        elif kind == "TemplateProcessing":
            single, pair = list(proc.get("single") or ()), list(proc.get("pair") or ())
            first = _special(single[0]) if len(single) > 1 else None
            last = _special(single[-1]) if len(single) > 1 else None
            if first:
                out["bos"] = (not config or first in (names["bos"], names["cls"])
                              or not names["bos"] or not names["cls"])
            if last:
                out["eos"] = True  # the trailing token is the EOS llama.cpp is told of
            start = 1 if first and pair and _special(pair[0]) == first else 0
            stop = -1 if last and pair and _special(pair[-1]) == last else None
            body = pair[start:stop]
            seqs = [(b.get("Sequence") or {}).get("id") if isinstance(b, dict) else None
                    for b in body[:1] + body[-1:]]
            if len(body) > 2 and seqs == ["A", "B"]:
                middle = body[1:-1]
                seps = (names["sep"], names["eos"])
                add = bool(_special(middle[0]) in seps and not last)
                if len(middle) == 2 and _special(middle[1]) in seps:
                    add = True
                out["sep"] = add
    return out


def _special_kvs(directory: str, spec: Mapping[str, Any] | None, vocab_size: int, *,
                 merges: bool, n_vocab: int | None,
                 unsaid: tuple[str, ...] = ()) -> list[KeyValue]:
    """gguf-py's SpecialVocab, run against a key collector (our writer, never saved), with
    the post-processor's word on BOS/EOS/SEP put over ``tokenizer_config.json``'s; the tokens
    of ``unsaid`` (``bos``, ``eos``) the post-processor does not add are not added
    (transformers 5 adds only what it says; llama.cpp's SentencePiece default adds a BOS)."""
    from filecord.gguf._writer import GGUFWriter

    # every file gguf-py reads is checked here first: it would fail on them without naming them
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = check_tokenizer_config(config_path) if exists(config_path) else {}
    if exists(os.path.join(directory, "config.json")):
        _check_config_ids(directory)
    check_chat_files(directory, config)
    gguf = _import("gguf")
    collector = GGUFWriter(os.path.join(directory, "unused.gguf"), "llama")
    special = gguf.SpecialVocab(directory, load_merges=merges, n_vocab=n_vocab)
    special.add_to_gguf(collector, quiet=True)
    kvs = {k: kv for k, kv in collector.kv_data.items() if k != "general.architecture"}
    _listed_ids(directory, kvs)
    for key, kv in kvs.items():
        if key.endswith("_token_id") and isinstance(kv.value, int) and kv.value >= vocab_size:
            # gguf-py checks the range only when told the size (not for byte-level BPE)
            raise CheckpointFileError(
                f"{kv.value} is outside config.json vocab_size {vocab_size} (the embedding's "
                f"rows)", field=f"{key} (from tokenizer_config.json or config.json)")
    adds = post_processor_adds(spec, config)
    _same_specials(directory, spec, adds, kvs)
    for typ in unsaid:
        # with no tokenizer.json, transformers 5 adds what tokenizer_config.json says, only
        adds.setdefault(typ, spec is None and config.get(f"add_{typ}_token") is True)
    for typ, flag in adds.items():
        key = f"tokenizer.ggml.add_{typ}_token"
        kvs[key] = KeyValue(key, ValueType.BOOL, flag)
    return list(kvs.values())


def _same_specials(directory: str, spec: Mapping[str, Any] | None, adds: Mapping[str, bool],
                   kvs: Mapping[str, KeyValue]) -> None:
    """The token a template adds first (BOS) or last (EOS) must be the one
    ``tokenizer_config.json`` (or, naming none, ``config.json``) names: transformers adds the
    template's, llama.cpp its ``*_token_id``, and generation stops on the named EOS (gguf-py
    would make a template's other last token the EOS, the named one EOT)."""
    pp = (spec or {}).get("post_processor")
    procs = (pp.get("processors") or () if pp.get("type") == "Sequence" else [pp]
             ) if isinstance(pp, Mapping) else ()
    for proc in procs:
        if proc.get("type") != "TemplateProcessing":
            continue
        single = list(proc.get("single") or ())
        if len(single) < 2:
            continue
        for typ, item in (("bos", single[0]), ("eos", single[-1])):
            name = _special(item)
            if name is None or not adds.get(typ):
                continue
            ids = list(((proc.get("special_tokens") or {}).get(name) or {}).get("ids") or ())
            where, named, want = _named(directory, spec, typ, kvs)
            if len(ids) != 1 or ids[0] not in want:
                raise CheckpointFileError(
                    f"the template adds {name!r} (ids {ids}) but {named}: transformers and "
                    "llama.cpp would begin or end the text with different tokens",
                    field=f"tokenizer.json: post_processor and {where}")


def _named(directory: str, spec: Mapping[str, Any] | None, typ: str,
           kvs: Mapping[str, KeyValue]) -> tuple[str, str, list[int]]:
    """(field, words, ids) of the ``typ`` token the checkpoint names: ``tokenizer_config.json``'s
    token (found as gguf-py finds it, among tokenizer.json's added tokens), else
    ``config.json``'s id or ids, else what llama.cpp is told."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = check_tokenizer_config(config_path) if exists(config_path) else {}
    text = _token_text(config_path, f"{typ}_token", config.get(f"{typ}_token"))
    added = {e["content"]: e["id"] for e in (spec or {}).get("added_tokens") or ()}
    if text is not None and text in added:
        return (f"tokenizer_config.json: {typ}_token",
                f"tokenizer_config.json names {text!r} (id {added[text]})", [added[text]])
    path = os.path.join(directory, "config.json")
    value = _json(path).get(f"{typ}_token_id") if exists(path) else None
    if value is not None:
        return (f"config.json: {typ}_token_id", f"config.json names id {json.dumps(value)}",
                value if isinstance(value, list) else [value])
    kv = kvs.get(f"tokenizer.ggml.{typ}_token_id")
    if kv is not None and isinstance(kv.value, int):
        return (f"tokenizer_config.json: {typ}_token",
                f"the {typ} token llama.cpp would add is id {kv.value}", [kv.value])
    return (f"tokenizer_config.json: {typ}_token",
            f"neither tokenizer_config.json {typ}_token nor config.json {typ}_token_id names "
            f"one, so llama.cpp would add no {typ} token", [])


def _listed_ids(directory: str, kvs: dict[str, KeyValue]) -> None:
    """``config.json`` may give a special id as a list (Llama 3.1 Instruct's ``eos_token_id``),
    which gguf-py skips. Where ``tokenizer_config.json`` named no such token, the EOS written
    is the first id transformers' generate stops on (``generation_config.json``'s
    ``eos_token_id``, else the list); another list is refused (llama.cpp takes one id,
    transformers' tokenizer none). Never skipped: llama.cpp would take a default piece."""
    path = os.path.join(directory, "config.json")
    if not exists(path):
        return
    config = _json(path)
    for typ in SPECIAL_TYPES:
        listed = config.get(f"{typ}_token_id")
        key = f"tokenizer.ggml.{typ}_token_id"
        if not isinstance(listed, list) or key in kvs:
            continue
        if typ != "eos" or not listed:
            raise _bad(path, f"{typ}_token_id", f"a list ({json.dumps(listed)[:80]}) where "
                       f"tokenizer_config.json names no {typ}_token: llama.cpp takes one id")
        stops: Any = listed
        gen = os.path.join(directory, "generation_config.json")
        if exists(gen):
            said = _json(gen).get("eos_token_id")
            items = said if isinstance(said, list) else [said]
            if said is not None and (not items or not all(
                    isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items)):
                raise _bad(gen, "eos_token_id", f"must be a token id or a non-empty list of "
                           f"them, got {json.dumps(said)[:80]}")
            stops = said if said is not None else listed
        first = stops[0] if isinstance(stops, list) else stops
        kvs[key] = KeyValue(key, ValueType.UINT32, first)


def _arr(key: str, values: list[Any], sub: ValueType) -> KeyValue:
    return KeyValue(key, ValueType.ARRAY, tuple(values), sub)


def _added(directory: str, vocab_size: int, tokens: list[str], scores: list[float],
           types: list[int]) -> None:
    """Tokens added on top of a SentencePiece vocabulary (``added_tokens.json``, then
    ``tokenizer_config.json``'s ``added_tokens_decoder``), written over the lists in place."""
    added = os.path.join(directory, "added_tokens.json")
    if exists(added):
        seen: dict[int, str] = {}
        for text, i in _json(added).items():
            if not isinstance(i, int) or isinstance(i, bool):
                raise _bad(added, text, f"must be a token id, got {json.dumps(i)[:40]}")
            if not 0 <= i < vocab_size:
                raise _bad(added, text, f"id {i} is outside 0..{vocab_size - 1} (config.json "
                           "vocab_size, the embedding's rows)")
            if i in seen:
                raise _bad(added, text, f"id {i} is also the id of {seen[i]!r}")
            if types[i] != UNUSED and tokens[i] != text:
                # llama.cpp's converter would write it over the piece; transformers keeps both
                raise _bad(added, text, f"id {i} is already the tokenizer's {tokens[i]!r}")
            seen[i] = text
            tokens[i], scores[i], types[i] = text, ADDED_SCORE, USER_DEFINED
    config = os.path.join(directory, "tokenizer_config.json")
    if exists(config):
        decoder = check_tokenizer_config(config).get("added_tokens_decoder") or {}
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


def _added_in_json(directory: str, spec: Mapping[str, Any] | None) -> None:
    """Beside a ``tokenizer.json``, ``added_tokens.json`` and ``tokenizer_config.json``'s
    ``added_tokens_decoder`` may only repeat it: transformers adds a token they hold and it
    lacks (past the vocabulary when the id is taken), llama.cpp's converter reads the
    ``tokenizer.json`` alone, so the two would split the text differently."""
    if spec is None:
        return
    vocab = spec["model"]["vocab"]
    ids: dict[str, int] = (dict(vocab) if isinstance(vocab, dict)
                           else {e[0]: i for i, e in enumerate(vocab)})
    ids.update({e["content"]: e["id"] for e in spec.get("added_tokens") or ()})
    path = os.path.join(directory, "added_tokens.json")
    found: list[tuple[str, str, Any, str]] = []  # (file, field, id, text)
    if exists(path):
        found += [(path, text, i, text) for text, i in _json(path).items()]
    config = os.path.join(directory, "tokenizer_config.json")
    if exists(config):
        decoder = check_tokenizer_config(config).get("added_tokens_decoder") or {}
        found += [(config, f"added_tokens_decoder.{key}.content", int(key), entry["content"])
                  for key, entry in decoder.items()]
    for where, key, i, text in found:
        if ids.get(text) != i or isinstance(i, bool):
            has = ("which lacks the token" if ids.get(text) is None
                   else f"which has it at id {ids[text]}")
            raise _bad(where, key, f"{text!r} at id {json.dumps(i)[:40]} is not in "
                       f"tokenizer.json ({has}): transformers would add it, llama.cpp's "
                       "converter reads tokenizer.json only")


_BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")


def is_spm_json(spec: Mapping[str, Any]) -> bool:
    """A ``tokenizer.json`` converted from a SentencePiece BPE model: a BPE with byte
    fallback (a byte-level BPE has none); :func:`_spm_json` judges the rest of its form."""
    model = spec.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


_META = "\u2581"
_SPACE_TO_META = {"type": "Replace", "pattern": {"String": " "}, "content": _META}


@dataclass(frozen=True, slots=True)
class SpmForm:
    """Steps transformers writes around a SentencePiece BPE that llama.cpp's SentencePiece
    tokenizer takes with ``tokenizer.ggml.add_space_prefix = space_prefix``: spaces become
    the meta symbol, and with ``space_prefix`` llama.cpp puts one before every section of text
    (the text's start and each text after an added token)."""

    normalizer: Any
    pre_tokenizer: Any
    space_prefix: bool


SPM_FORMS: tuple[SpmForm, ...] = (
    # transformers 4's Llama/Mistral: Prepend + Replace (legacy, sentencepiece's own behaviour)
    SpmForm({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": _META},
                                                 _SPACE_TO_META]}, None, space_prefix=True),
    # Gemma's (no dummy prefix), as transformers 5 writes it (the split on " " is a no-op once
    # the normalizer has replaced every space) and as transformers 4 does
    SpmForm(_SPACE_TO_META, {"type": "Split", "pattern": {"String": " "},
                             "behavior": "MergedWithPrevious", "invert": False},
            space_prefix=False),
    SpmForm(_SPACE_TO_META, None, space_prefix=False),
    # no prefix anywhere (add_prefix_space false)
    SpmForm(None, {"type": "Metaspace", "replacement": _META, "prepend_scheme": "never",
                   "split": False}, space_prefix=False),
    # transformers 5's Llama/Mistral (a LlamaTokenizer builds it from tokenizer.model too):
    # the keys are what llama.cpp's converter writes from the .model, with its known gap (the
    # README's): Metaspace adds the meta symbol only where a section does not begin with a
    # space ("first": only at the text's start), llama.cpp before every section, so text that
    # begins with a space and text right after a special token tokenize differently
    *(SpmForm(None, {"type": "Metaspace", "replacement": _META, "prepend_scheme": scheme,
                     "split": False}, space_prefix=True) for scheme in ("first", "always")),
)
_SPM_DECODE = [{"type": "Replace", "pattern": {"String": _META}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}]
SPM_DECODERS = ({"type": "Sequence", "decoders": _SPM_DECODE},
                {"type": "Sequence", "decoders": [
                    *_SPM_DECODE, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})


# transformers 5 builds LlamaTokenizer's and GemmaTokenizer's steps itself, whatever
# tokenizer.json says (its other classes run the file's): Llama's a Metaspace whose scheme its
# config's add_prefix_space and legacy choose, Gemma's the Replace + Split of its form
# registered classes that run tokenizer.json as written
_FILE_CLASSES = ("TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast")


def running_class(config: Mapping[str, Any], family: Family) -> str | None:
    """The tokenizer class transformers 5's AutoTokenizer runs for the folder (None: the
    file as written), as it decides: tokenizer_config.json's class unless the model_type
    registers another, which wins when it runs the file or the family's hub classes are
    known wrong."""
    said = config.get("tokenizer_class")
    hub = said.removesuffix("Fast") if isinstance(said, str) else None
    registered = family.tokenizer_class
    if registered is None or registered == hub:
        return hub
    if registered in _FILE_CLASSES:
        return None
    return registered if hub is None or family.hub_class_ignored else hub


def spm_steps(spec: Mapping[str, Any], config: Mapping[str, Any], family: Family
              ) -> tuple[Any, Any]:
    """The (normalizer, pre_tokenizer) transformers runs for a SentencePiece-style
    ``tokenizer.json`` given its ``tokenizer_config.json`` and the model's family."""
    cls = running_class(config, family)
    if cls == "LlamaTokenizer":
        scheme = ("never" if config.get("add_prefix_space") is False
                  else "always" if config.get("legacy") else "first")
        return None, {"type": "Metaspace", "replacement": _META, "prepend_scheme": scheme,
                      "split": False}
    if cls == "GemmaTokenizer":
        return SPM_FORMS[1].normalizer, SPM_FORMS[1].pre_tokenizer
    return spec.get("normalizer"), spec.get("pre_tokenizer")


def _spm_form(path: str, spec: Mapping[str, Any], config: Mapping[str, Any], family: Family
              ) -> SpmForm:
    """The form of a SentencePiece-style ``tokenizer.json`` as transformers runs it (see
    :data:`SPM_FORMS`), or a refusal naming the step llama.cpp's SentencePiece tokenizer
    would not reproduce."""
    normalizer, pre = spm_steps(spec, config, family)
    form = next((f for f in SPM_FORMS if (f.normalizer, f.pre_tokenizer) == (normalizer, pre)),
                None)
    if form is None:
        key = ("normalizer" if normalizer not in [f.normalizer for f in SPM_FORMS]
               else "pre_tokenizer")
        raise UnsupportedModelError(
            f"{path}: {key} {json.dumps(spec.get(key))[:160]} is not a step llama.cpp's "
            f"SentencePiece tokenizer takes (supported: the Prepend + Replace normalizers, as "
            f"transformers 4 writes a Llama's, a Metaspace with split false, or Gemma's "
            f"Replace normalizer with no prefix)")
    if spec.get("decoder") not in SPM_DECODERS:
        raise UnsupportedModelError(
            f"{path}: decoder {json.dumps(spec.get('decoder'))[:160]} is not the one "
            f"transformers writes for a SentencePiece BPE (Replace, ByteFallback, Fuse, Strip)")
    model = spec["model"]
    for key, want in (("dropout", None), ("continuing_subword_prefix", None),
                      ("end_of_word_suffix", None), ("ignore_merges", False)):
        if model.get(key, want) != want:
            raise UnsupportedModelError(
                f"{path}: model.{key} {json.dumps(model.get(key))} is not what a SentencePiece "
                f"BPE has ({json.dumps(want)})")
    return form


def _prepended_added(path: str, spec: Mapping[str, Any], normalizer: Any) -> None:
    """Under a Prepend normalizer (transformers 4's Llama steps) an added token with
    ``normalized`` true is normalized too, so transformers matches it only after a space (the
    prepended meta symbol is part of it) and spends that space on it; llama.cpp matches a
    user-defined or control token anywhere and keeps the space."""
    steps = (normalizer.get("normalizers") or () if normalizer.get("type") == "Sequence"
             else [normalizer]) if isinstance(normalizer, Mapping) else ()
    if not any(isinstance(s, Mapping) and s.get("type") == "Prepend" for s in steps):
        return
    for k, entry in enumerate(spec.get("added_tokens") or ()):
        if entry.get("normalized"):
            raise _bad(path, f"added_tokens[{k}].normalized", f"true for {entry['content']!r} "
                       "under the Prepend normalizer: transformers prepends the meta symbol to "
                       "the token too and matches it only after a space, llama.cpp anywhere "
                       "(supported: false, as transformers writes a special token)")


def _byte_pieces(path: str, field: str, pieces: Collection[str]) -> None:
    """A SentencePiece vocabulary must hold all 256 ``<0xNN>`` byte pieces: llama.cpp spells a
    character outside the vocabulary in them and aborts the process when one is not there
    (transformers and sentencepiece fall back to the unknown token)."""
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in pieces]
    if missing:
        raise _bad(path, field, f"lacks {len(missing)} of the 256 byte pieces "
                   f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}), which "
                   "llama.cpp needs for a character outside the vocabulary (it aborts "
                   "without them)")


def _spm_json(directory: str, vocab_size: int, spec: Mapping[str, Any], family: Family
              ) -> tuple[list[KeyValue], SpmForm]:
    """The keys llama.cpp's converter writes from a ``tokenizer.model``, made from the
    ``tokenizer.json`` transformers converted it to (see the module notes), and its form."""
    path = os.path.join(directory, "tokenizer.json")
    config_path = os.path.join(directory, "tokenizer_config.json")
    form = _spm_form(path, spec, check_tokenizer_config(config_path) if exists(config_path)
                     else {}, family)
    _prepended_added(path, spec, form.normalizer)
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    if not vocab:
        raise _bad(path, "model.vocab", "empty")
    n = max(vocab.values()) + 1
    if n > vocab_size:
        raise UnsupportedModelError(f"{path}: token id {n - 1} is outside config.json "
                                    f"vocab_size {vocab_size} (the embedding's rows)")
    if len(vocab) != n:  # ids are unique (checked): so there are gaps
        raise _bad(path, "model.vocab", f"{len(vocab)} pieces for ids 0..{n - 1}: ids must "
                   f"be without gaps")
    _byte_pieces(path, "model.vocab (byte_fallback true)", vocab)
    special = {e["id"] for e in spec.get("added_tokens") or () if e.get("special")}
    # a SentencePiece user-defined piece: transformers matches it whole in text, as an added
    # token, and so does llama.cpp for a USER_DEFINED token (a NORMAL one it spells in pieces)
    user = {e["id"] for e in spec.get("added_tokens") or () if not e.get("special")}
    config = os.path.join(directory, "tokenizer_config.json")
    # transformers 5 leaves the BPE model's unk_token empty and names it in the config
    unk = model.get("unk_token") or (_token_text(config, "unk_token", check_tokenizer_config(
        config).get("unk_token")) if exists(config) else None)
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [SPM_UNSET_SCORE] * vocab_size
    types = [UNUSED] * vocab_size
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    first = None
    for piece, i in by_id:
        kind = (UNKNOWN if piece == unk else CONTROL if i in special
                else BYTE if _BYTE_PIECE.match(piece) else USER_DEFINED if i in user
                else NORMAL)
        if kind == NORMAL and first is None:
            first = i
        # the SentencePiece BPE trainer scores a piece minus its rank among the normal ones
        # (the order of tokenizer.json's merges), and 0 for the others
        tokens[i], types[i] = piece, kind
        scores[i] = -float(i - first) if kind == NORMAL and first is not None else 0.0
    _json_added(spec, n, tokens, scores, types)
    return _spm_keys(directory, vocab_size, tokens, scores, types), form


def _json_added(spec: Mapping[str, Any] | None, n: int, tokens: list[str], scores: list[float],
                types: list[int]) -> None:
    """``tokenizer.json``'s added tokens past the ``n`` SentencePiece pieces, written over the
    lists in place: transformers matches each whole in text (a special one as a control
    token), and llama.cpp does the same for a CONTROL or USER_DEFINED token; beside a
    ``tokenizer.model`` too, which lacks them (ids inside vocab_size: checked)."""
    for entry in (spec or {}).get("added_tokens") or ():
        i = entry["id"]
        if i >= n:
            tokens[i], scores[i] = entry["content"], ADDED_SCORE
            types[i] = CONTROL if entry.get("special") else USER_DEFINED


def _spm_keys(directory: str, vocab_size: int, tokens: list[str], scores: list[float],
              types: list[int]) -> list[KeyValue]:
    """The SentencePiece keys, whether the pieces came from tokenizer.model or from the
    tokenizer.json transformers converts it to: one writer, so the two forms cannot drift."""
    _added(directory, vocab_size, tokens, scores, types)
    return [KeyValue("tokenizer.ggml.model", ValueType.STRING, "llama"),
            KeyValue("tokenizer.ggml.pre", ValueType.STRING, "default"),
            _arr("tokenizer.ggml.tokens", tokens, ValueType.STRING),
            _arr("tokenizer.ggml.scores", scores, ValueType.FLOAT32),
            _arr("tokenizer.ggml.token_type", types, ValueType.INT32)]


def _spm_processor(directory: str) -> Any:
    """``tokenizer.model`` read by the one reader (a FIFO would block sentencepiece's own
    open), then parsed by sentencepiece."""
    path = os.path.join(directory, "tokenizer.model")
    proc = _import("sentencepiece").SentencePieceProcessor()
    try:
        proc.LoadFromSerializedProto(read_bytes(path, SPM_LIMIT))
    except RuntimeError as exc:
        raise UnsupportedModelError(f"{path}: sentencepiece cannot read it: {exc}") from None
    return proc


def _spm(directory: str, vocab_size: int, spec: Mapping[str, Any] | None) -> list[KeyValue]:
    path = os.path.join(directory, "tokenizer.model")
    proc = _spm_processor(directory)
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [SPM_UNSET_SCORE] * vocab_size
    types = [UNUSED] * vocab_size
    n = proc.vocab_size()
    if n > vocab_size:
        # the dropped pieces would still be produced by the tokenizer, and an id past the
        # embedding reads out of bounds in llama.cpp
        raise UnsupportedModelError(f"{path} has {n} pieces but config.json vocab_size (the "
                                    f"embedding's rows) is {vocab_size}")
    # transformers matches a user-defined piece whole in text (an added token), as llama.cpp
    # does a USER_DEFINED token; sentencepiece's processor names that kind only in its proto
    user = {i for i, piece in enumerate(_import("sentencepiece.sentencepiece_model_pb2")
                                        .ModelProto.FromString(proc.serialized_model_proto())
                                        .pieces) if piece.type == USER_DEFINED}
    for i in range(min(n, vocab_size)):
        kind = (UNKNOWN if proc.IsUnknown(i) else CONTROL if proc.IsControl(i)
                else UNUSED if proc.IsUnused(i) else BYTE if proc.IsByte(i)
                else USER_DEFINED if i in user else NORMAL)
        tokens[i], scores[i], types[i] = proc.IdToPiece(i), float(proc.GetScore(i)), kind
    _byte_pieces(path, "", [t for t, k in zip(tokens, types, strict=True) if k == BYTE])
    _json_added(spec, n, tokens, scores, types)
    return _spm_keys(directory, vocab_size, tokens, scores, types)


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
            and not split.get("invert")):
        return _PRE_REGEX.get(pattern) if isinstance(pattern, str) else None
    return None


def _bpe(directory: str, vocab_size: int, spec: Mapping[str, Any]) -> list[KeyValue]:
    path = os.path.join(directory, "tokenizer.json")
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        fallback = (" with byte_fallback (converted from SentencePiece)"
                    if model.get("byte_fallback") else "")
        raise UnsupportedModelError(
            f"{path}: a {model.get('type')!r} tokenizer{fallback} is not supported without "
            f"tokenizer.model; supported: {'; '.join(SUPPORTED)}")
    pre = pre_tokenizer_name(spec.get("pre_tokenizer"))
    if spec.get("normalizer") is not None and not (
            pre == "qwen2" and spec.get("normalizer") == {"type": "NFC"}):
        # Qwen2's NFC is the one normalizer let through: it changes only text that is not
        # already NFC, and llama.cpp's qwen2 tokenizer is the one its authors ship with it
        # llama.cpp's BPE tokenizer applies no normalizer: it would tokenize differently
        raise UnsupportedModelError(
            f"{path}: a normalizer ({json.dumps(spec.get('normalizer'))[:80]}) is not "
            f"supported for a byte-level BPE tokenizer.json (llama.cpp applies none); "
            f"supported: {'; '.join(SUPPORTED)}")
    if pre is None:
        raise UnsupportedModelError(
            f"{path}: this pre-tokenizer is not one filecord recognises (supported: GPT-2's "
            f"ByteLevel, Llama 3's or Qwen2's Split + ByteLevel): "
            f"{json.dumps(spec.get('pre_tokenizer'))[:200]}")
    tokenizers = _import("tokenizers")
    try:
        tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception on refusal
        raise _bad(path, "", f"the tokenizers library cannot load it: {exc}") from None
    _bpe_steps(path, spec, pre, tok)
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


# Whether llama.cpp's BPE tokenizer takes a word that is a piece whole, skipping the merges
# (it decides by the pre-tokenizer's name; no key says otherwise)
IGNORES_MERGES = {"llama-bpe": True, "gpt-2": False, "qwen2": False}


def _bpe_steps(path: str, spec: Mapping[str, Any], pre: str, tok: Any) -> None:
    """Refuse a byte-level BPE field llama.cpp's ``gpt2`` tokenizer would run otherwise,
    naming it: llama.cpp has no end-of-word suffix, no BPE dropout (transformers then
    tokenizes at random), decodes as ByteLevel does, and skips merges by ``pre``'s rule."""
    model = spec["model"]
    if model.get("end_of_word_suffix"):
        raise _bad(path, "model.end_of_word_suffix", f"{model['end_of_word_suffix']!r}: "
                   "llama.cpp's BPE tokenizer has none (supported: null or empty)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise _bad(path, "model.dropout", f"{model['dropout']}: transformers would drop merges "
                   "at random, llama.cpp never does (supported: null or 0)")
    decoder = spec.get("decoder")
    if not (isinstance(decoder, Mapping) and decoder.get("type") == "ByteLevel"):
        raise _bad(path, "decoder", f"{json.dumps(decoder)[:120]}: llama.cpp decodes a "
                   "byte-level BPE as the ByteLevel decoder does (supported: ByteLevel)")
    ignores = bool(model.get("ignore_merges"))
    if ignores == IGNORES_MERGES[pre]:
        return
    # the flag changes a token only for a word that is a piece the merges do not build: with
    # none, both rules give the same tokens (proved piece by piece, merges applied)
    tok.model.ignore_merges = False
    # an added token is matched whole before the pre-tokenizer (in both), never built by merges
    added = {e["content"] for e in spec.get("added_tokens") or ()}
    for piece in model["vocab"]:
        if piece not in added and [t.value for t in tok.model.tokenize(piece)] != [piece]:
            raise _bad(path, "model.ignore_merges", f"{json.dumps(ignores)}, but llama.cpp's "
                       f"{pre!r} pre-tokenizer {'skips' if not ignores else 'applies'} the "
                       f"merges for a word that is a piece, and the merges do not build the "
                       f"piece {piece!r}: the two would tokenize it differently (supported: "
                       f"{json.dumps(IGNORES_MERGES[pre])} for {pre!r})")
    tok.model.ignore_merges = ignores


def _same_pieces(directory: str, spec: Mapping[str, Any] | None) -> None:
    """With both files, the ``tokenizer.json`` (what transformers' fast tokenizer loads) must
    hold the ``tokenizer.model``'s pieces at the same ids: llama.cpp is given the latter, so a
    disagreement means it would tokenize differently from transformers."""
    if spec is None:
        return
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] by id
        pieces = {str(e[0]): i for i, e in enumerate(vocab) if isinstance(e, list) and e}
    elif isinstance(vocab, dict):
        pieces = {str(k): v for k, v in vocab.items()}
    else:
        pieces = {}
    proc = _spm_processor(directory)
    spm_pieces = {proc.IdToPiece(i): i for i in range(proc.vocab_size())}
    differ = [t for t, i in pieces.items() if spm_pieces.get(t) != i]
    if model.get("type") not in ("BPE", "Unigram") or differ or len(pieces) != len(spm_pieces):
        raise UnsupportedModelError(
            f"{directory}: tokenizer.json (a {model.get('type')!r} model of {len(pieces)} "
            f"pieces) does not hold tokenizer.model's {len(spm_pieces)} pieces at the same ids"
            + (f" (e.g. {differ[0]!r})" if differ else "")
            + "; transformers would load the former, llama.cpp is given the latter: remove "
            "the one that is wrong")


def read_vocab(directory: str, vocab_size: int, family: Family) -> Vocab:
    """The tokenizer's key-values in llama.cpp's converter's order, or
    :class:`UnsupportedModelError` naming what is supported."""
    if vocab_size in (32016, 49152):
        # llama.cpp's converter special-cases these sizes (CodeLlama infill tokens, Granite's
        # add_bos): writing them like any other would give a different tokenizer.
        raise UnsupportedModelError(f"vocab_size {vocab_size} (CodeLlama/Granite) is "
                                    f"special-cased by llama.cpp and not supported")
    head: list[KeyValue] = []
    config = os.path.join(directory, "tokenizer_config.json")
    if exists(config):
        said = check_tokenizer_config(config).get("add_prefix_space")
        if isinstance(said, bool) and family.prefix_from_config:
            head.append(KeyValue("tokenizer.ggml.add_space_prefix", ValueType.BOOL, said))
    tok_json = os.path.join(directory, "tokenizer.json")
    spec = check_tokenizer_json(tok_json, vocab_size) if exists(tok_json) else None
    prefix: bool | None = None
    if exists(os.path.join(directory, "tokenizer.model")):
        body = _spm(directory, vocab_size, spec)
        _same_pieces(directory, spec)
        if spec is not None:  # transformers runs its steps, with its added tokens
            run = check_tokenizer_config(config) if exists(config) else {}
            _prepended_added(tok_json, spec, spm_steps(spec, run, family)[0])
        # beside it, transformers runs the tokenizer.json's post-processor; without one it
        # adds a BOS only where tokenizer_config.json says add_bos_token (llama.cpp's
        # SentencePiece default adds one unless told)
        said = ("bos",) if spec is None or spec.get("post_processor") else ()
        tail = _special_kvs(directory, spec, vocab_size, merges=False, n_vocab=vocab_size,
                            unsaid=said)
        kind = "sentencepiece"
    elif spec is not None and is_spm_json(spec):
        body, form = _spm_json(directory, vocab_size, spec, family)
        tail = [kv for kv in _special_kvs(directory, spec, vocab_size, merges=False,
                                          n_vocab=vocab_size, unsaid=("bos", "eos"))
                if SPM_IMPLIED.get(kv.key, ()) != kv.value]
        # the form decides the prefix (llama.cpp's default is one, which the reference leaves
        # unwritten unless the family writes it, or tokenizer_config.json said otherwise)
        said_off = any(kv.key == "tokenizer.ggml.add_space_prefix" and kv.value is False
                       for kv in head)
        prefix = (None if form.space_prefix and family.space_prefix is None and not said_off
                  else form.space_prefix)
        kind = "sentencepiece (tokenizer.json)"
    elif spec is not None:
        body = _bpe(directory, vocab_size, spec)
        tail = _special_kvs(directory, spec, vocab_size, merges=True, n_vocab=None)
        kind = "bpe"
    else:
        raise UnsupportedModelError(f"{directory}: no tokenizer.model or tokenizer.json "
                                    f"(supported: {'; '.join(SUPPORTED)})")
    _added_in_json(directory, spec)
    if kind == "sentencepiece":
        prefix = family.space_prefix
    if prefix is not None and kind.startswith("sentencepiece"):
        head = [kv for kv in head if kv.key != "tokenizer.ggml.add_space_prefix"]
        tail.append(KeyValue("tokenizer.ggml.add_space_prefix", ValueType.BOOL, prefix))
    return Vocab(kind, tuple(head + body + tail))
