"""``_io.names``: the token names a save gives its files, without a disk (pure string work)."""

from __future__ import annotations

import os

import pytest

from filecord._io import names

DRAWN = "0123456789abcdef"  # a save token, as names.new_token draws them


def test_a_short_stem_is_kept_whole() -> None:
    assert names.token_name("model.bin", DRAWN, names.JOURNAL) == (
        f".model.bin.{DRAWN}.filecord-journal")


@pytest.mark.parametrize("suffix", [*names.SUFFIXES])
def test_every_suffix_parses_back_to_its_token(suffix: str) -> None:
    name = names.token_name("out.pte", DRAWN, suffix)
    assert names.parse(name) == (DRAWN, suffix)


@pytest.mark.parametrize("name", [
    "model.bin",  # not hidden
    f"model.{DRAWN}.filecord-journal",  # no leading dot
    f".model.{DRAWN}.filecord-other",  # no known suffix
    f".model.{DRAWN[:-1]}.filecord-journal",  # token one digit short
    f".model.{DRAWN.upper()}.filecord-journal",  # tokens are lowercase
    f".model{DRAWN}.filecord-journal",  # no dot before the token
    f".{DRAWN}.filecord-journal",  # no stem at all
])
def test_names_filecord_did_not_make_do_not_parse(name: str) -> None:
    assert names.parse(name) is None


def test_new_tokens_are_tokens_and_differ() -> None:
    drawn = {names.new_token() for _ in range(64)}
    assert len(drawn) == 64
    assert all(names.is_token(t) for t in drawn)
    assert not names.is_token("xyz")
    assert not names.is_token(DRAWN + "0")


@pytest.mark.parametrize("stem", ["a" * 300, "é" * 200, "日本" * 100])
def test_a_long_stem_is_cut_to_name_max_bytes_and_hashed(stem: str) -> None:
    made = {s: names.token_name(stem, DRAWN, s) for s in (*names.SUFFIXES, names.OWNED)}
    for suffix, name in made.items():
        raw = os.fsencode(name)
        assert len(raw) <= names.NAME_MAX, (suffix, len(raw))
        raw.decode("utf-8")  # never cut inside a character
        assert name.endswith(f".{DRAWN}{suffix}")
    # The cut does not depend on the suffix: one save's names differ only in their suffixes.
    heads = {name[: -len(suffix)] for suffix, name in made.items()}
    assert len(heads) == 1
    # Two stems that share their first 255 bytes still get different names (the hash).
    other = names.token_name(stem + "x", DRAWN, names.TEMP)
    assert other != made[names.TEMP]


def test_the_longest_stem_that_needs_no_cut_is_kept() -> None:
    longest = max((*names.SUFFIXES, names.OWNED), key=len)
    room = names.NAME_MAX - len(f"..{DRAWN}{longest}")
    assert names.token_name("s" * room, DRAWN, names.TEMP) == f".{'s' * room}.{DRAWN}.partial"
    cut = names.token_name("s" * (room + 1), DRAWN, names.TEMP)
    assert "~" in cut
    assert names.parse(cut) == (DRAWN, names.TEMP)


def test_restage_swaps_the_suffix_and_refuses_foreign_names() -> None:
    journal = os.path.join("/d", names.token_name("out", DRAWN, names.JOURNAL))
    assert names.restage(journal, names.ROLLBACK) == os.path.join(
        "/d", f".out.{DRAWN}.filecord-rollback")
    with pytest.raises(ValueError, match="is not a name filecord made"):
        names.restage("/d/out", names.ROLLBACK)


def test_sibling_is_the_token_name_in_the_same_directory() -> None:
    assert names.sibling("/a/b/out.bin", DRAWN, names.LOCK) == (
        f"/a/b/.out.bin.{DRAWN}.filecord-lock")
    assert names.sibling("out.bin", DRAWN, names.TEMP) == f".out.bin.{DRAWN}.partial"
