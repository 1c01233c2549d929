"""Hostile ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and
``added_tokens.json`` values given to ``filecord convert``: each is refused with exit 1 and a
message naming the file and the field (a ``CheckpointFileError``, never ``internal error``),
before anything is written; a count the tensors contradict fails at once and small (the
command runs under a 1 GiB address-space limit, so a list sized by the claimed count would be
a MemoryError, i.e. an ``internal error``)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

from tests.support.hf_models import tiny_model
from tests.support.jsonedit import set_at

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
MEMORY = 1 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("hf") / "spm", dtype="bfloat16")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("hf") / "bpe", tokenizer="bpe", dtype="bfloat16")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def refused_naming(tmp_path: Path, model: Path, says: str) -> None:
    before = snapshot(tmp_path)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(model), "-o",
                        str(tmp_path / "o.gguf"), "-q"], capture_output=True, text=True,
                       env=ENV, check=False, preexec_fn=_limit, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr, r.stderr
    assert snapshot(tmp_path) == before


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def put(key: str, value: Any) -> Callable[[Any], Any]:
    return lambda data: set_at(data, key, value)


CONFIG_FORMS = {
    # name: (change, what the message names)
    "not-an-object": (lambda c: [c], "config.json: must be a JSON object"),
    "billion-layers": (put("num_hidden_layers", 10**9),
                       "config.json: num_hidden_layers: says 1000000000 layers"),
    "billion-vocab": (put("vocab_size", 10**9),
                      "config.json: 2 tensor(s) do not match it: model.embed_tokens.weight is "
                      "[320, 64], llama.cpp expects [1000000000, 64]"),
    "huge-context": (put("max_position_embeddings", 2**40),
                     "config.json: max_position_embeddings: must be a positive integer"),
    "heads-as-text": (put("num_attention_heads", "4"),
                      "config.json: num_attention_heads: must be a positive integer"),
    "eps-nan": (put("rms_norm_eps", float("nan")), "config.json: rms_norm_eps: must be"),
    "eps-negative": (put("rms_norm_eps", -1e-5), "config.json: rms_norm_eps: must be"),
    "rope-a-list": (put("rope_parameters", [1, 2]), "config.json: rope_parameters: must be"),
    "tied-as-text": (put("tie_word_embeddings", "yes"),
                     "config.json: tie_word_embeddings: must be true or false"),
    "architectures-a-string": (put("architectures", "LlamaForCausalLM"),
                               "config.json: architectures: must be a list"),
    "eos-negative": (put("eos_token_id", -1), "config.json: eos_token_id: must be a token id"),
    "window-text": (put("sliding_window", "64"), "config.json: sliding_window: must be"),
    # every value the GGUF holds as FLOAT32 is one llama.cpp can compute with: finite,
    # positive and a normal float32 (one check for all of them)
    "theta-beyond-float32": (put("rope_theta", 1e300),
                             "config.json: rope_theta: must be a positive number a float32 "
                             "holds"),
    "theta-below-float32": (put("rope_theta", 1e-300), "config.json: rope_theta: must be"),
    "eps-subnormal": (put("rms_norm_eps", 1e-320), "config.json: rms_norm_eps: must be"),
    "linear-factor-below-float32": (put("rope_parameters", {"rope_type": "linear",
                                                            "factor": 1e-300}),
                                    "config.json: rope_parameters.factor: must be a positive"),
    "linear-factor-negative": (put("rope_parameters", {"rope_type": "linear", "factor": -2}),
                               "config.json: rope_parameters.factor: must be a positive"),
    "llama3-factor-beyond-float32": (put("rope_parameters", {
        "rope_type": "llama3", "factor": 1e300, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "config.json: rope_parameters.factor: must be a positive"),
}


@pytest.mark.parametrize("form", list(CONFIG_FORMS))
def test_malformed_config_is_refused_naming_the_field(spm: Path, tmp_path: Path, form: str
                                                      ) -> None:
    change, says = CONFIG_FORMS[form]
    model = tmp_path / "m"
    shutil.copytree(spm, model)
    edit_json(model / "config.json", change)
    refused_naming(tmp_path, model, says)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("hf") / "gemma2", arch="gemma2",
                      tokenizer="gemma", tied=True, dtype="bfloat16")


GEMMA2_FORMS = {
    "softcap-beyond-float32": (put("attn_logit_softcapping", 1e300),
                               "config.json: attn_logit_softcapping: must be a positive"),
    "final-softcap-below-float32": (put("final_logit_softcapping", 1e-300),
                                    "config.json: final_logit_softcapping: must be a positive"),
    # transformers refuses a layer_types that is not one entry per layer
    "layer-types-short": (put("layer_types", ["sliding_attention"]),
                          "config.json: layer_types: has 1 entries for num_hidden_layers 2"),
    # llama.cpp's gemma2 computes the logits with token_embd whatever the file holds
    "untied": (put("tie_word_embeddings", False),
               "config.json: tie_word_embeddings false is not supported"),
}


@pytest.mark.parametrize("form", list(GEMMA2_FORMS))
def test_gemma2_config_llama_cpp_cannot_compute_is_refused(gemma2: Path, tmp_path: Path,
                                                           form: str) -> None:
    change, says = GEMMA2_FORMS[form]
    model = tmp_path / "m"
    shutil.copytree(gemma2, model)
    edit_json(model / "config.json", change)
    refused_naming(tmp_path, model, says)


def _with_lm_head(model: Path, head: Callable[[Any], Any]) -> None:
    """The checkpoint rewritten as one model.safetensors that also holds lm_head.weight."""
    from safetensors.torch import load_file, save_file

    tensors: dict[str, Any] = {}
    for f in sorted(model.glob("*.safetensors")):
        tensors.update(load_file(f))
        f.unlink()
    (model / "model.safetensors.index.json").unlink()
    tensors["lm_head.weight"] = head(tensors["model.embed_tokens.weight"]).clone()
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})


def test_a_tied_lm_head_llama_cpp_has_no_place_for_must_equal_the_embedding(
        gemma2: Path, tmp_path: Path) -> None:
    """transformers computes with a file's lm_head.weight when it differs from the embedding
    (tied or not); llama.cpp's gemma2 always with the embedding: refused unless equal."""
    import torch

    model = tmp_path / "m"
    shutil.copytree(gemma2, model)
    _with_lm_head(model, torch.ones_like)
    refused_naming(tmp_path, model, "lm_head.weight differs from "
                   "model.embed_tokens.weight: transformers computes the logits with the former")
    same = tmp_path / "same"
    shutil.copytree(gemma2, same)
    _with_lm_head(same, lambda e: e)
    out = tmp_path / "same.gguf"
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(same), "-o",
                        str(out), "-q"], capture_output=True, text=True, env=ENV, check=False,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    from gguf import GGUFReader

    assert "output.weight" not in {t.name for t in GGUFReader(str(out)).tensors}


def piece_id(piece: str) -> Callable[[Any], int]:
    return lambda t: t["model"]["vocab"][piece]


def both(*changes: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def change(data: Any) -> Any:
        for c in changes:
            data = c(data)
        return data
    return change


def put_from(key: str, value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda data: put(key, value(data))(data)


TOKENIZER_FORMS = {
    # name: (file, change, what the message names); file "json" is tokenizer.json (BPE model)
    "json-not-json": ("tokenizer.json", None, "tokenizer.json: not valid JSON"),
    "json-a-list": ("tokenizer.json", lambda t: [t], "tokenizer.json: must be a JSON object"),
    "vocab-id-text": ("tokenizer.json", put("model.vocab.the", "7"),
                      "tokenizer.json: model.vocab.the: must be an integer"),
    "model-a-string": ("tokenizer.json", put("model", "BPE"), "tokenizer.json: model: must be"),
    "merge-of-ints": ("tokenizer.json", put("model.merges.0", [1, 2]),
                      "tokenizer.json: model.merges[0]"),
    "added-token-without-id": ("tokenizer.json", put("added_tokens.0", {"content": "<x>"}),
                               "tokenizer.json: added_tokens[0]"),
    "template-item-a-number": ("tokenizer.json", put("post_processor.processors.1.single.0", 3),
                               "tokenizer.json: post_processor.processors[1].single[0]"),
    "pretokenizers-an-object": ("tokenizer.json", put("pre_tokenizer.pretokenizers", {}),
                                "tokenizer.json: pre_tokenizer.pretokenizers: must be a list"),
    "bos-a-number": ("tokenizer_config.json", put("bos_token", 5),
                     "tokenizer_config.json: bos_token: must be a string"),
    "add-bos-text": ("tokenizer_config.json", put("add_bos_token", "yes"),
                     "tokenizer_config.json: add_bos_token: must be true, false or null"),
    "template-a-number": ("tokenizer_config.json", put("chat_template", 7),
                          "tokenizer_config.json: chat_template: must be a string"),
    "decoder-key-text": ("tokenizer_config.json",
                         put("added_tokens_decoder", {"x": {"content": "<x>"}}),
                         "tokenizer_config.json: added_tokens_decoder.x: keys must be"),
    "decoder-without-content": ("tokenizer_config.json",
                                put("added_tokens_decoder", {"3": {"special": True}}),
                                "tokenizer_config.json: added_tokens_decoder.3.content"),
    "config-not-json": ("tokenizer_config.json", None, "tokenizer_config.json: not valid JSON"),
    # what the tokenizers library would refuse, named before it reads the file
    "merge-without-space": ("tokenizer.json", put("model.merges.0", "ab"),
                            "tokenizer.json: model.merges[0]: must be 'a b'"),
    "merge-of-unknown-pieces": ("tokenizer.json", put("model.merges.0", ["zzz", "qqq"]),
                                "tokenizer.json: model.merges[0]: 'zzz' is not a piece"),
    "merges-null": ("tokenizer.json", put("model.merges", None),
                    "tokenizer.json: model.merges: must be a list"),
    "vocab-id-beyond-u32": ("tokenizer.json", put("model.vocab.h", 2**40),
                            "tokenizer.json: model.vocab.h: must be an integer from 0"),
    "added-tokens-null": ("tokenizer.json", put("added_tokens", None),
                          "tokenizer.json: added_tokens: must be a list"),
    "template-special-tokens-a-list": (
        "tokenizer.json", put("post_processor.processors.1.special_tokens", [1]),
        "tokenizer.json: post_processor.processors[1].special_tokens: must be an object"),
    "template-ids-text": (
        "tokenizer.json",
        put("post_processor.processors.1.special_tokens.<|begin_of_text|>.ids", ["x"]),
        "special_tokens.<|begin_of_text|>.ids[0]: must be an integer"),
    "decoder-type-a-number": ("tokenizer.json", put("decoder", {"type": 5}),
                              "tokenizer.json: decoder.type: must be a string"),
    "split-pattern-a-string": ("tokenizer.json", put("pre_tokenizer.pretokenizers.0.pattern",
                                                     "x"),
                               "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern: must be"),
    # what would convert to a tokenizer llama.cpp runs differently from transformers
    "two-pieces-one-id": ("tokenizer.json", put_from("model.vocab.e", piece_id("h")),
                          "tokenizer.json: model.vocab: 'e' and 'h' both have id"),
    "added-id-outside-vocab": ("tokenizer.json", put("added_tokens.0.id", 299999),
                               "tokenizer.json: added_tokens[0].id: 299999 is outside "
                               "config.json vocab_size"),
    "added-id-of-another-piece": ("tokenizer.json",
                                  put("added_tokens.0", {"id": 0, "content": "<new>"}),
                                  "tokenizer.json: added_tokens[0].id: 0 is already "
                                  "model.vocab's"),
    # transformers begins the text with the template's token, llama.cpp with bos_token's
    "bos-other-than-the-template-adds": (
        "tokenizer_config.json", put("bos_token", "<|end_of_text|>"),
        "tokenizer.json: post_processor and tokenizer_config.json: bos_token: the template "
        "adds '<|begin_of_text|>'"),
    # llama.cpp reads a template as a C string: it would stop at the NUL
    "chat-template-with-nul": ("tokenizer_config.json", put("chat_template", "SYS\0{{ x }}"),
                               "tokenizer_config.json: chat_template: holds U+0000 at "
                               "character 3"),
    # transformers adds a token tokenizer.json lacks; llama.cpp's converter never sees it
    "decoder-token-not-in-tokenizer-json": (
        "tokenizer_config.json",
        put("added_tokens_decoder", {"3": {"content": "<|foo|>", "special": True}}),
        "tokenizer_config.json: added_tokens_decoder.3.content: '<|foo|>' at id 3 is not in "
        "tokenizer.json"),
    # transformers strips the spaces around the token, llama.cpp keeps them
    "added-token-lstrip": ("tokenizer.json", put("added_tokens.0.lstrip", True),
                           "tokenizer.json: added_tokens[0].lstrip: true for"),
    "chat-template-nameless": ("tokenizer_config.json",
                               put("chat_template", [{"name": "", "template": "a"}]),
                               "tokenizer_config.json: chat_template[0].name: empty"),
    "chat-template-names-one-key": (
        "tokenizer_config.json",
        put("chat_template", [{"name": "tool_use", "template": "a"},
                              {"name": "tool-use", "template": "b"}]),
        "tokenizer_config.json: chat_template[1].name: 'tool-use' is written as the key of "
        "'tool_use'"),
}


@pytest.mark.parametrize("form", list(TOKENIZER_FORMS))
def test_malformed_tokenizer_is_refused_naming_the_field(bpe: Path, tmp_path: Path, form: str
                                                         ) -> None:
    name, change, says = TOKENIZER_FORMS[form]
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    if change is None:
        (model / name).write_text('{"model": ')
    else:
        edit_json(model / name, change)
    refused_naming(tmp_path, model, says)


@pytest.mark.parametrize(("files", "template", "says"), [
    # gguf-py writes tokenizer_config.json's, transformers runs chat_template.jinja
    ({"chat_template.jinja": "{{ messages }}"}, "CFG {{ messages }}",
     "tokenizer_config.json: chat_template and chat_template.jinja: tokenizer_config.json's "
     "chat_template differs from chat_template.jinja"),
    ({"chat_template.json": json.dumps({"chat_template": "{{ messages }}"})},
     "CFG {{ messages }}", "tokenizer_config.json: chat_template and chat_template.json"),
    ({"chat_template.jinja": "SYS\0{{ messages }}"}, None,
     "chat_template.jinja: holds U+0000 at character 3"),
])
def test_a_chat_template_llama_cpp_would_read_otherwise_is_refused(
        bpe: Path, tmp_path: Path, files: dict[str, str], template: str | None, says: str
) -> None:
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    for name, text in files.items():
        (model / name).write_text(text)
    if template is not None:
        edit_json(model / "tokenizer_config.json", put("chat_template", template))
    refused_naming(tmp_path, model, says)


def test_a_chat_template_file_equal_to_tokenizer_config_s_converts(bpe: Path, tmp_path: Path
                                                                   ) -> None:
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    (model / "chat_template.jinja").write_text("{{ messages }}")
    edit_json(model / "tokenizer_config.json", put("chat_template", "{{ messages }}"))
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(model), "-o",
                        str(tmp_path / "o.gguf"), "-q"], capture_output=True, text=True,
                       env=ENV, check=False, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def spm_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("hf") / "spmjson", tokenizer="spm-json",
                      dtype="bfloat16")


META_FIRST = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
              "split": False}
SPM_JSON_FORMS = {
    # steps llama.cpp's SentencePiece tokenizer does not take: transformers would tokenize
    # "hh" as "ee", llama.cpp as "hh"
    "normalizer-replacing-letters": (
        put("normalizer", {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "h"}, "content": "e"}]}),
        "tokenizer.json: normalizer {\"type\": \"Sequence\""),
    # a Metaspace on top of the Prepend normalizer: two prefixes, where llama.cpp adds one
    "metaspace-after-prepend": (put("pre_tokenizer", META_FIRST),
                                "tokenizer.json: pre_tokenizer {\"type\": \"Metaspace\""),
    "decoder-of-another-tokenizer": (put("decoder", {"type": "ByteLevel"}),
                                     "tokenizer.json: decoder {"),
    "normalizers-a-string": (put("normalizer", {"type": "Sequence", "normalizers": "x"}),
                             "tokenizer.json: normalizer.normalizers: must be a list"),
    "split-text": (put("pre_tokenizer", {**META_FIRST, "split": "x"}),
                   "tokenizer.json: pre_tokenizer.split: must be true or false"),
    "replacement-a-number": (put("pre_tokenizer", {**META_FIRST, "replacement": 5}),
                             "tokenizer.json: pre_tokenizer.replacement: must be one character"),
    "prepend-scheme-a-number": (put("pre_tokenizer", {**META_FIRST, "prepend_scheme": 5}),
                                "tokenizer.json: pre_tokenizer.prepend_scheme: must be"),
    "fuse-unk-text": (put("model.fuse_unk", "x"),
                      "tokenizer.json: model.fuse_unk: must be true or false"),
    "dropout-text": (put("model.dropout", "x"), "tokenizer.json: model.dropout: must be"),
    "unknown-token-absent": (put("model.unk_token", "<nope>"),
                             "tokenizer.json: model.unk_token: '<nope>' is not a piece"),
    "two-pieces-one-id": (put_from("model.vocab.<s>", piece_id("<unk>")),
                          "tokenizer.json: model.vocab: '<unk>' and '<s>' both have id"),
    "merge-without-space": (put("model.merges", ["ab"]),
                            "tokenizer.json: model.merges[0]: must be 'a b'"),
    "merge-of-unknown-pieces": (put("model.merges", [["zz", "qq"]]),
                                "tokenizer.json: model.merges[0]: 'zz' is not a piece"),
    # llama.cpp aborts on a character it must spell as a byte piece the vocabulary lacks
    "byte-fallback-without-a-byte-piece": (
        lambda t: {**t, "model": {**t["model"], "vocab": {
            ("<byte-A>" if p == "<0x41>" else p): i for p, i in t["model"]["vocab"].items()}}},
        "tokenizer.json: model.vocab (byte_fallback true): lacks 1 of the 256 byte pieces "
        "(<0x41>)"),
}


@pytest.mark.parametrize("form", list(SPM_JSON_FORMS))
def test_sentencepiece_tokenizer_json_is_refused_unless_llama_cpp_runs_it_as_transformers(
        spm_json: Path, tmp_path: Path, form: str) -> None:
    change, says = SPM_JSON_FORMS[form]
    model = tmp_path / "m"
    shutil.copytree(spm_json, model)
    edit_json(model / "tokenizer.json", change)
    refused_naming(tmp_path, model, says)


@pytest.mark.parametrize(("tokenizer", "content", "says"), [
    # beside tokenizer.json it may only repeat it: transformers reads both files, llama.cpp's
    # converter tokenizer.json alone
    ("bpe", {"<|new|>": 319}, "added_tokens.json: <|new|>: '<|new|>' at id 319 is not in "
                              "tokenizer.json (which lacks the token)"),
    ("bpe", {"<|begin_of_text|>": 3}, "added_tokens.json: <|begin_of_text|>: "
                                      "'<|begin_of_text|>' at id 3 is not in tokenizer.json"),
    ("spm", {"<x>": "400"}, "added_tokens.json: <x>: must be a token id"),
    ("spm", [1, 2], "added_tokens.json: must be a JSON object"),
    # llama.cpp's converter drops these silently, or writes them over a piece
    ("spm", {"<x>": -1}, "added_tokens.json: <x>: id -1 is outside 0.."),
    ("spm", {"<x>": 2**40}, "added_tokens.json: <x>: id 1099511627776 is outside 0.."),
    ("spm", {"<x>": 0}, "added_tokens.json: <x>: id 0 is already the tokenizer's '<unk>'"),
])
def test_added_tokens_json_llama_cpp_would_read_otherwise_is_refused(
        request: pytest.FixtureRequest, tmp_path: Path, tokenizer: str, content: Any,
        says: str) -> None:
    model = tmp_path / "m"
    shutil.copytree(request.getfixturevalue(tokenizer), model)
    (model / "added_tokens.json").write_text(json.dumps(content))
    refused_naming(tmp_path, model, says)


def _deep(path: Path) -> None:
    path.write_text("[" * 100000)


def _not_utf8(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b'"', b'"\xff', 2))


def _surrogate(path: Path) -> None:
    data = json.loads(path.read_text())
    data["added_tokens"][0]["content"] = "\ud800"
    path.write_text(json.dumps(data))  # ensure_ascii: the escape itself is in the file


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


UNREADABLE = {
    # name: (model, file, how it is spoiled, what the message says)
    "config-nested-deep": ("spm", "config.json", _deep, "config.json: nested more than 64"),
    "tokenizer-config-nested-deep": ("spm", "tokenizer_config.json", _deep,
                                     "tokenizer_config.json: nested more than 64"),
    "index-nested-deep": ("spm", "model.safetensors.index.json", _deep,
                          "model.safetensors.index.json: nested more than 64"),
    "tokenizer-json-nested-deep": ("bpe", "tokenizer.json", _deep,
                                   "tokenizer.json: nested more than 64"),
    "tokenizer-json-not-utf8": ("bpe", "tokenizer.json", _not_utf8,
                                "tokenizer.json: not UTF-8 text"),
    "tokenizer-config-not-utf8": ("bpe", "tokenizer_config.json", _not_utf8,
                                  "tokenizer_config.json: not UTF-8 text"),
    "tokenizer-json-lone-surrogate": ("bpe", "tokenizer.json", _surrogate,
                                      "tokenizer.json: added_tokens[0].content: holds a lone "
                                      "UTF-16 surrogate"),
    "chat-template-jinja-not-utf8": ("bpe", "chat_template.jinja",
                                     lambda p: p.write_bytes(b"\xff{{ x }}"),
                                     "chat_template.jinja: not UTF-8 text"),
    "config-a-directory": ("spm", "config.json", _directory,
                           "config.json: is a directory"),
    "config-a-fifo": ("spm", "config.json", _fifo, "config.json: is a FIFO"),
    "config-a-link-loop": ("spm", "config.json", _loop, "config.json: a symbolic link loop"),
}


@pytest.mark.parametrize("form", list(UNREADABLE))
def test_a_file_no_library_can_read_is_refused_naming_it(
        spm: Path, bpe: Path, tmp_path: Path, form: str) -> None:
    """Depth, encoding and file type are judged by one reader before any library (json,
    tokenizers, gguf-py) sees the file; the message names the file, never the suffix that
    chose safetensors for the shards."""
    base, name, spoil, says = UNREADABLE[form]
    model = tmp_path / "m"
    shutil.copytree(spm if base == "spm" else bpe, model)
    path = model / name
    if not path.exists() and not path.is_symlink():
        path.write_text("")
    spoil(path)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(model), "-o",
                        str(tmp_path / "o.gguf"), "-q"], capture_output=True, text=True,
                       env=ENV, check=False, preexec_fn=_limit, timeout=120)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr, r.stderr
    assert "internal error" not in r.stderr, r.stderr
    assert "read as safetensors" not in r.stderr, r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_an_index_beside_a_single_file_is_refused_naming_both(spm: Path, tmp_path: Path
                                                              ) -> None:
    """transformers loads model.safetensors, llama.cpp's converter the index's shards: which
    one the model is is not guessed."""
    model = tmp_path / "m"
    shutil.copytree(spm, model)
    shard = sorted(model.glob("model-*.safetensors"))[0]
    shutil.copy(shard, model / "model.safetensors")
    refused_naming(tmp_path, model, "holds both model.safetensors.index.json and "
                   "model.safetensors")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_q8_0_of_a_weight_holding_inf_or_nan_is_refused(tmp_path: Path, value: float) -> None:
    """A Q8_0 block of an inf or NaN has a NaN scale and bytes the platform's cast decides;
    the cast refuses it, naming the tensor, and no numpy warning reaches the user."""
    from safetensors.torch import load_file, save_file

    model = tiny_model(tmp_path / "m", dtype="float32")
    name = "model.layers.0.mlp.up_proj.weight"
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shard = model / index["weight_map"][name]
    tensors = load_file(shard)
    tensors[name][0, 3] = value
    save_file(tensors, shard, metadata={"format": "pt"})
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(model), "-o",
                        str(out / "o.gguf"), "--outtype", "q8_0", "-q"], capture_output=True,
                       text=True, env=ENV, check=False, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "blk.0.ffn_up.weight: the checkpoint holds inf or NaN" in r.stderr, r.stderr
    assert "Warning" not in r.stderr, r.stderr
    assert list(out.iterdir()) == []


def test_a_special_token_id_outside_the_embedding_is_refused(bpe: Path, tmp_path: Path) -> None:
    """gguf-py checks special ids against the vocabulary only when told its size, which a
    byte-level BPE is not: an id past the embedding is refused, not written."""
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    edit_json(model / "tokenizer_config.json", lambda c: {k: v for k, v in c.items()
                                                          if k != "eos_token"})
    edit_json(model / "config.json", put("eos_token_id", 400))
    refused_naming(tmp_path, model, "tokenizer.ggml.eos_token_id (from tokenizer_config.json "
                   "or config.json): 400 is outside config.json vocab_size")
