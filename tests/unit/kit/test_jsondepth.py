"""filecord._kit.jsondepth: the nesting of a JSON text, counted without parsing it."""

from __future__ import annotations

import json

from filecord._kit.jsondepth import first_too_deep


def test_depth_at_the_limit_passes_and_one_more_is_found_where_it_opens() -> None:
    assert first_too_deep('{"a": {"b": [1, [2]]}}', 4) is None
    text = '{"a": {"b": [1, [2]]}}'
    assert first_too_deep(text, 3) == text.index("[2")  # the fourth level opens here
    assert first_too_deep("[" * 100_000 + "]" * 100_000, 8) == 8
    assert first_too_deep("", 0) is None
    assert first_too_deep("[]", 0) == 0


def test_brackets_inside_strings_and_escapes_do_not_count() -> None:
    inside = json.dumps({"k": "[[[[{{{{" + '\\"[[[[' + "]]"})
    assert first_too_deep(inside, 1) is None
    # an escaped backslash ends the escape: the quote after it closes the string
    text = '["a\\\\", [[1]]]'
    assert json.loads(text) == ["a\\", [[1]]]
    assert first_too_deep(text, 2) == text.index("[1")


def test_an_unclosed_string_hides_the_brackets_after_it() -> None:
    assert first_too_deep('["[[[[', 1) is None
    assert first_too_deep('["a\\', 1) is None  # a backslash at the very end
    assert first_too_deep('["a\\"[[', 1) is None  # the escaped quote does not close it
