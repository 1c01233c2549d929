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

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
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
    def change(data: Any) -> Any:
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return data
    return change


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
}


@pytest.mark.parametrize("form", list(CONFIG_FORMS))
def test_malformed_config_is_refused_naming_the_field(spm: Path, tmp_path: Path, form: str
                                                      ) -> None:
    change, says = CONFIG_FORMS[form]
    model = tmp_path / "m"
    shutil.copytree(spm, model)
    edit_json(model / "config.json", change)
    refused_naming(tmp_path, model, says)


TOKENIZER_FORMS = {
    # name: (file, change, what the message names); file "json" is tokenizer.json (BPE model)
    "json-not-json": ("tokenizer.json", None, "tokenizer.json: not valid JSON"),
    "json-a-list": ("tokenizer.json", lambda t: [t], "tokenizer.json: must be a JSON object"),
    "vocab-id-text": ("tokenizer.json", put("model.vocab.the", "7"),
                      "tokenizer.json: model.vocab.the: ids must be"),
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


@pytest.mark.parametrize(("content", "says"), [
    ({"<x>": "400"}, "added_tokens.json: <x>: must be a token id"),
    ([1, 2], "added_tokens.json: must be a JSON object"),
])
def test_malformed_added_tokens_is_refused_naming_the_field(spm: Path, tmp_path: Path,
                                                            content: Any, says: str) -> None:
    model = tmp_path / "m"
    shutil.copytree(spm, model)
    (model / "added_tokens.json").write_text(json.dumps(content))
    refused_naming(tmp_path, model, says)
