"""gguf._hf_schema: tokenizer.json's structure as data, and the one checker that names the
first field that does not fit."""

from __future__ import annotations

from typing import Any

import pytest

from filecord.gguf._hf_schema import TOKENIZER_JSON, problem
from support.jsonedit import set_at

BPE: dict[str, Any] = {
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"],
              "dropout": None, "byte_fallback": False},
    "added_tokens": [{"id": 3, "content": "<s>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel"},
}


def with_(path: str, value: Any) -> dict[str, Any]:
    import copy

    return set_at(copy.deepcopy(BPE), path, value)  # type: ignore[no-any-return]


def test_a_tokenizer_json_that_fits_has_no_problem() -> None:
    assert problem(TOKENIZER_JSON, BPE) is None
    assert problem(TOKENIZER_JSON, with_("model.merges.0", ["a", "b"])) is None


@pytest.mark.parametrize(("path", "value", "where", "why"), [
    ("model.merges.0", "ab", "model.merges[0]", "must be 'a b' (two pieces, one space)"),
    ("model.merges.0", ["a"], "model.merges[0]", "must be a list of 2"),
    ("model.vocab.ab", 2**32, "model.vocab.ab", "must be an integer from 0 to 2**32-1"),
    ("model.dropout", "x", "model.dropout", "must be null or a number from 0 to 1"),
    ("added_tokens", None, "added_tokens", "must be a list"),
    ("added_tokens.0.id", True, "added_tokens[0].id", "must be an integer from 0 to 2**32-1"),
    ("pre_tokenizer.pretokenizers.0.pattern", "x", "pre_tokenizer.pretokenizers[0].pattern",
     'must be an object {"String": ...} or {"Regex": ...}'),
    ("pre_tokenizer.pretokenizers.0.pattern", {"Regex": ["x"]},
     "pre_tokenizer.pretokenizers[0].pattern.Regex", "must be a string"),
    ("decoder", {"type": 5}, "decoder.type", "must be a string (a decoder)"),
    ("post_processor.special_tokens.<s>.ids", ["x"], "post_processor.special_tokens.<s>.ids[0]",
     "must be an integer from 0 to 2**32-1"),
])
def test_the_first_field_that_does_not_fit_is_named(path: str, value: Any, where: str,
                                                     why: str) -> None:
    assert problem(TOKENIZER_JSON, with_(path, value)) == (where, why)


def test_a_type_the_schema_does_not_know_is_refused_naming_the_known_ones() -> None:
    where, why = problem(TOKENIZER_JSON, with_("normalizer", {"type": "Magic"})) or ("", "")
    assert where == "normalizer.type"
    assert why.startswith("'Magic' is not a normalizer filecord knows (known: BertNormalizer")
