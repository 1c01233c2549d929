"""llama.cpp (llama-cpp-python 0.3.36) tokenizes every tokenizer form ``filecord convert``
converts as transformers does, on text with special tokens, leading and repeated spaces,
newlines and characters outside the vocabulary (spelled in byte pieces), except on the text the
README's known gap for transformers 5's LlamaTokenizer names, which is pinned here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

from tests.support.hf_models import (  # noqa: E402
    as_transformers_4,
    reference_or_skip,
    run_reference,
    saved_spm_json,
    spm_tokenizer,
    tiny_model,
)

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
STRINGS = ["the llama moves a file cord.", "  model  token ", " head", "tensor</s>shard",
           "</s>merge", "</s> merge", "<s> byte", "the rope<s>split", "\n\nnorm\n", "a  b   c",
           "x", "Zürich 日本 ~", "query\tkey", "", " ", "file cord</s>  layer"]


def convert(model: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(model), "-o",
                           str(out), "-q"], capture_output=True, text=True, env=ENV,
                          check=False, timeout=300)


def differences(model: Path, gguf: Path, **overrides: bool) -> list[tuple[str, Any, Any]]:
    """Where llama.cpp on ``gguf`` and transformers on ``model`` give other ids, with and
    without the special tokens each adds (``overrides``: GGUF keys llama.cpp is told)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False,
                         kv_overrides={f"tokenizer.ggml.{k}": v for k, v in overrides.items()}
                         or None)
    found = []
    for text in STRINGS:
        for add in (False, True):
            want = tok.encode(text, add_special_tokens=add)
            got = ll.tokenize(text.encode(), add_bos=add, special=True)
            if got != want:
                found.append((text, want, got))
    return found


def edit_json(directory: Path, name: str, **change: Any) -> None:
    path = directory / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def no_bos_template(directory: Path) -> None:
    as_transformers_4(directory)
    seq = {"Sequence": {"id": "A", "type_id": 0}}
    edit_json(directory, "tokenizer.json", post_processor={
        "type": "TemplateProcessing", "single": [seq],
        "pair": [seq, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}})


def gemma_transformers_4(directory: Path) -> None:
    edit_json(directory, "tokenizer.json", pre_tokenizer=None)
    edit_json(directory, "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")


FORMS: dict[str, tuple[str, str, dict[str, Any], Any]] = {
    # name: (arch, transformers class, its arguments, edit of the saved tokenizer folder)
    "llama-transformers-4": ("llama", "LlamaTokenizer", {}, as_transformers_4),
    # a template that adds no BOS: llama.cpp's SentencePiece default adds one unless told
    "llama-transformers-4-no-bos": ("llama", "LlamaTokenizer", {}, no_bos_template),
    # no prefix anywhere: Metaspace "never"
    "llama-add-prefix-space-false": ("llama", "LlamaTokenizer", {"add_prefix_space": False},
                                     None),
    # Gemma: no dummy prefix (add_space_prefix false), as transformers 5 and 4 write it
    "gemma-transformers-5": ("gemma2", "GemmaTokenizer", {}, None),
    "gemma-transformers-4": ("gemma2", "GemmaTokenizer", {}, gemma_transformers_4),
    "gemma-on-a-llama": ("llama", "GemmaTokenizer", {}, None),
}


def checkpoint(root: Path, arch: str, cls: str, kwargs: dict[str, Any], edit: Any,
               user_symbols: tuple[str, ...] = ()) -> Path:
    tok = root / "tok"
    tok.mkdir(parents=True)
    vocab = saved_spm_json(tok, cls, user_symbols, **kwargs)
    if edit is not None:
        edit(tok)
    model = tiny_model(root / "m", arch=arch, tokenizer="spm", dtype="float32",
                       pad_vocab=vocab - 320, tied=arch == "gemma2")
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (model / name).unlink()
    for p in tok.iterdir():
        shutil.copy(p, model / p.name)
    return model


@pytest.mark.parametrize("form", list(FORMS))
def test_sentencepiece_tokenizer_json_tokenizes_as_transformers(tmp_path: Path, form: str
                                                                ) -> None:
    model = checkpoint(tmp_path, *FORMS[form])
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert differences(model, out) == []


SPECIALS = ("<s>", "</s>")


def in_the_gap(text: str, scheme: str) -> bool:
    """The README's known gap: under transformers 5 a LlamaTokenizer's Metaspace adds the
    meta symbol only where a section does not begin with a space ("first": and only at the
    text's start), llama.cpp before every section (the text's start and each text right after
    a special token)."""
    sections = [text]
    for special in SPECIALS:
        sections = [part for s in sections for part in s.split(special)]
    return text.startswith(" ") or any(
        part and (scheme == "first" or part.startswith(" ")) for part in sections[1:])


@pytest.mark.parametrize(("legacy", "scheme"), [(False, "first"), (True, "always")])
def test_llama_tokenizer_json_converts_with_the_documented_gap(
        tmp_path: Path, legacy: bool, scheme: str) -> None:
    """A tokenizer.json whose tokenizer_config.json names LlamaTokenizer (what transformers 5
    saves for Llama and Mistral): transformers 5 runs a Metaspace, "first" (legacy false, its
    default) or "always" (legacy true), whatever the file's steps. It converts to the keys
    llama.cpp's converter writes from the tokenizer.model (test_gguf_hf_families.py), and
    llama.cpp then tokenizes as transformers except on exactly the text the known gap names:
    " hello" is "▁hello" in transformers and "▁▁hello" in llama.cpp. No add_space_prefix and
    add_bos_token llama.cpp could be told closes the gap."""
    model = checkpoint(tmp_path / "a", "llama", "LlamaTokenizer", {"legacy": legacy},
                       lambda d: edit_json(d, "tokenizer_config.json", legacy=legacy))
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert {text for text, _, _ in differences(model, out)} == {
        text for text in STRINGS if in_the_gap(text, scheme)}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    pieces = {text: "".join(tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False)))
              for text in (" hello", "  hello")}
    assert pieces == {" hello": "\u2581hello", "  hello": "\u2581\u2581hello"}
    # llama.cpp's " hello" is transformers' "  hello"
    assert ll.tokenize(b" hello", add_bos=False) == tok.encode("  hello",
                                                                add_special_tokens=False)
    assert ll.tokenize(b"hello", add_bos=False) == tok.encode("hello", add_special_tokens=False)
    for prefix in (True, False):
        for bos in (True, False):
            assert differences(model, out, add_space_prefix=prefix, add_bos_token=bos)


@pytest.mark.parametrize("beside_model", [False, True], ids=["json", "json+model"])
@pytest.mark.parametrize(("scheme", "add_prefix_space"),
                         [("never", None), ("never", True), ("first", False)])
def test_mistral_runs_the_tokenizer_json_prefix_whatever_tokenizer_config_says(
        tmp_path: Path, scheme: str, add_prefix_space: bool | None, beside_model: bool) -> None:
    """transformers 5's AutoTokenizer runs a Mistral's tokenizer.json as written (the class it
    registers for model_type mistral, TokenizersBackend, wins over tokenizer_config.json's
    LlamaTokenizer), so the file's Metaspace prepend_scheme decides the prefix, not
    tokenizer_config.json's add_prefix_space, with a tokenizer.model beside it or not: the
    GGUF's add_space_prefix follows the file, and llama.cpp tokenizes as transformers
    ("first": but for the known gap)."""
    from transformers import AutoTokenizer

    def edit(d: Path) -> None:
        spec = json.loads((d / "tokenizer.json").read_text())
        edit_json(d, "tokenizer.json", pre_tokenizer={**spec["pre_tokenizer"],
                                                      "prepend_scheme": scheme})
        edit_json(d, "tokenizer_config.json", add_prefix_space=add_prefix_space)

    model = (model_beside_json(tmp_path, "mistral", edit) if beside_model
             else checkpoint(tmp_path, "mistral", "LlamaTokenizer", {}, edit))
    tok = AutoTokenizer.from_pretrained(model)
    assert type(tok).__name__ == "TokenizersBackend"
    assert tok.backend_tokenizer.pre_tokenizer.prepend_scheme == scheme
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert {text for text, _, _ in differences(model, out)} == {
        text for text in STRINGS if scheme == "first" and in_the_gap(text, scheme)}


def assert_refused(model: Path, out: Path, says: str) -> None:
    """The convert exits 1 saying ``says`` and writes no output."""
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr
    assert not out.exists()


USER = "<|user|>"


@pytest.mark.parametrize("source", ["tokenizer.json", "tokenizer.model"])
def test_sentencepiece_user_defined_piece_is_matched_whole_as_transformers_does(
        tmp_path: Path, source: str) -> None:
    """A SentencePiece user-defined piece (transformers 5 saves it as an added token with
    "special": false, or reads it from the tokenizer.model) is matched whole in text by
    transformers; it is written USER_DEFINED (4), which llama.cpp matches whole too (a NORMAL
    piece it would spell in smaller pieces)."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    model = checkpoint(tmp_path, "llama", "LlamaTokenizer", {},
                       lambda d: (d / "tokenizer_config.json").write_text(json.dumps(
                           {**json.loads((d / "tokenizer_config.json").read_text()),
                            "add_prefix_space": False})),
                       user_symbols=(USER,))
    if source == "tokenizer.model":
        spm_dir = tmp_path / "spm"
        spm_dir.mkdir()
        spm_tokenizer(spm_dir, user_symbols=(USER,))
        (model / "tokenizer.json").unlink()
        shutil.copy(spm_dir / "tokenizer.model", model / "tokenizer.model")
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    field = GGUFReader(out).fields["tokenizer.ggml.token_type"]
    assert int(field.parts[field.data[3]][0]) == 4
    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    for text in (USER + "the llama", "the llama " + USER + " moves", "a" + USER):
        want = tok.encode(text, add_special_tokens=False)
        assert 3 in want
        assert ll.tokenize(text.encode(), add_bos=False, special=True) == want, text


@pytest.mark.parametrize("add_bos", [None, True, False])
def test_tokenizer_model_alone_adds_a_bos_only_where_tokenizer_config_says(
        tmp_path: Path, add_bos: bool | None) -> None:
    """A tokenizer.model with no tokenizer.json: transformers 5 adds a BOS only where
    tokenizer_config.json's add_bos_token says so (not when the key is absent), and the GGUF
    says the same to llama.cpp, whose SentencePiece default adds one."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm")
    config = {"tokenizer_class": "LlamaTokenizer"}
    if add_bos is not None:
        config["add_bos_token"] = add_bos  # type: ignore[assignment]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    want = tok.encode("the llama", add_special_tokens=True)
    assert (want[0] == 1) is bool(add_bos)
    assert ll.tokenize(b"the llama", add_bos=True, special=True) == want


def test_tokenizer_model_without_byte_pieces_is_refused_as_llama_cpp_aborts(tmp_path: Path
                                                                            ) -> None:
    """A SentencePiece model trained without byte fallback: the reference converts it, and
    llama.cpp then aborts the process on a character outside the vocabulary."""
    import sentencepiece as spm

    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32")
    spm_dir = tmp_path / "spm"
    spm_dir.mkdir()
    from tests.support.hf_models import spm_tokenizer

    spm_tokenizer(spm_dir, 100, byte_fallback=False)
    shutil.copy(spm_dir / "tokenizer.model", model / "tokenizer.model")
    proc = spm.SentencePieceProcessor(model_file=str(model / "tokenizer.model"))
    assert proc.encode("Z\u65e5") != []  # sentencepiece takes it (as the unknown piece)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1
    assert "tokenizer.model: lacks 256 of the 256 byte pieces (<0x00>, <0x01>," in r.stderr
    assert not out.exists()
    ref = reference_or_skip()
    run_reference(ref, model, tmp_path / "ref.gguf")
    crash = subprocess.run([sys.executable, "-c", (
        "import llama_cpp, sys; m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, "
        "verbose=False); m.tokenize('the Z\u65e5'.encode())"), str(tmp_path / "ref.gguf")],
        capture_output=True, text=True, check=False, timeout=120)
    assert crash.returncode == -6, crash.stderr[-500:]  # SIGABRT: std::out_of_range


# ---------------------------------------------------------------------- byte-level BPE


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama 3 shaped byte-level BPE (pre-tokenizer llama-bpe, ignore_merges true)."""
    return tiny_model(tmp_path_factory.mktemp("hf") / "bpe", tokenizer="bpe",
                      dtype="float32")


def unbuilt_piece(directory: Path) -> str:
    """Drop the merge that builds the last merged piece: the piece stays in the vocabulary
    but no merge builds it any more (real vocabularies hold such pieces); returns the text
    that is that piece."""
    from tokenizers import decoders

    path = directory / "tokenizer.json"
    spec = json.loads(path.read_text())
    a, b = spec["model"]["merges"].pop()
    path.write_text(json.dumps(spec))
    return str(decoders.ByteLevel().decode([a + b]))


def bpe_copy(bpe: Path, tmp_path: Path, **model: Any) -> Path:
    out = tmp_path / "m"
    shutil.copytree(bpe, out)
    path = out / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["model"].update(model)
    path.write_text(json.dumps(spec))
    return out


@pytest.mark.parametrize("unbuilt", [False, True])
@pytest.mark.parametrize("ignore_merges", [False, True])
def test_ignore_merges_converts_where_it_cannot_change_a_token(
        bpe: Path, tmp_path: Path, ignore_merges: bool, unbuilt: bool) -> None:
    """llama.cpp's llama-bpe pre-tokenizer takes a word that is a piece whole, as
    ignore_merges true does; with false the two differ only on a piece no merge builds, which
    the converter looks for: none, it converts; one, it refuses naming it."""
    model = bpe_copy(bpe, tmp_path, ignore_merges=ignore_merges)
    word = unbuilt_piece(model) if unbuilt else " memory"
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    if unbuilt and not ignore_merges:
        assert r.returncode == 1
        assert ("tokenizer.json: model.ignore_merges: false, but llama.cpp's 'llama-bpe' "
                "pre-tokenizer skips the merges for a word that is a piece") in r.stderr
        assert not out.exists()
        from transformers import AutoTokenizer

        # what the refusal spares: transformers spells the word in several pieces
        assert len(AutoTokenizer.from_pretrained(model).encode(
            word, add_special_tokens=False)) > 1
        return
    assert r.returncode == 0, r.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    for text in (word, f"the{word}.", *STRINGS):
        assert ll.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(
            text, add_special_tokens=False), text


def test_ignore_merges_does_not_count_added_tokens_the_merges_do_not_build(
        bpe: Path, tmp_path: Path) -> None:
    """A special token in the vocabulary (as tokenizers' BpeTrainer puts it) is matched whole
    before the pre-tokenizer by transformers and llama.cpp, so a merge that does not build it
    cannot make ignore_merges matter: it converts, and both tokenize alike."""
    model = bpe_copy(bpe, tmp_path, ignore_merges=False)
    path = model / "tokenizer.json"
    spec = json.loads(path.read_text())
    special = spec["added_tokens"][0]
    spec["model"]["vocab"][special["content"]] = special["id"]
    path.write_text(json.dumps(spec))
    assert [m for m in spec["model"]["merges"] if "".join(m) == special["content"]] == []
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    for text in (special["content"], f"the {special['content']} file", *STRINGS):
        assert ll.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(
            text, add_special_tokens=False), text


@pytest.mark.parametrize(("change", "says"), [
    ({"end_of_word_suffix": "</w>"}, "tokenizer.json: model.end_of_word_suffix: '</w>': "
                                     "llama.cpp's BPE tokenizer has none"),
    ({"dropout": 0.5}, "tokenizer.json: model.dropout: 0.5: transformers would drop merges "
                       "at random"),
    ({"decoder": None}, "tokenizer.json: decoder: null: llama.cpp decodes a byte-level BPE "
                        "as the ByteLevel decoder does"),
    ({"decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                  "split": True}}, "tokenizer.json: decoder: {\"type\": \"Metaspace\""),
])
def test_byte_level_field_llama_cpp_runs_otherwise_is_refused(
        bpe: Path, tmp_path: Path, change: dict[str, Any], says: str) -> None:
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    path = model / "tokenizer.json"
    spec = json.loads(path.read_text())
    if "decoder" in change:
        spec.update(change)
    else:
        spec["model"].update(change)
    path.write_text(json.dumps(spec))
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr
    assert not out.exists()


def test_tokenizer_model_beside_a_template_adding_no_bos_adds_none(tmp_path: Path) -> None:
    """With a tokenizer.json beside the tokenizer.model, transformers runs the former's
    post-processor: a template with no leading special token adds no BOS, whatever
    tokenizer_config.json's add_bos_token says, and llama.cpp is told so."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32")
    tok = tmp_path / "tok"
    tok.mkdir()
    saved_spm_json(tok, "LlamaTokenizer")
    no_bos_template(tok)
    shutil.copy(tok / "tokenizer.json", model / "tokenizer.json")
    assert json.loads((model / "tokenizer_config.json").read_text())["add_bos_token"] is True
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    hf = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    for text in ("the llama moves a file cord.", "x"):
        assert hf.encode(text)[0] != 1
        assert ll.tokenize(text.encode(), add_bos=True, special=True) == hf.encode(text)


def test_qwen2_nfc_differs_only_on_text_not_in_nfc(tmp_path: Path) -> None:
    """The known gap README names, exactly: Qwen2's NFC normalizer converts (refusing it would
    refuse every Qwen2); llama.cpp applies no normalizer, so NFC text tokenizes the same and
    text not in NFC does not."""
    import unicodedata

    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="qwen2", tokenizer="qwen2", dtype="float32")
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    tok = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    for text in (*STRINGS, "caf\u00e9 na\u00efve"):
        assert unicodedata.is_normalized("NFC", text)
        assert ll.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(
            text, add_special_tokens=False), text
    decomposed = "cafe\u0301"
    assert ll.tokenize(decomposed.encode(), add_bos=False, special=True) != tok.encode(
        decomposed, add_special_tokens=False)


def with_added_tokens(directory: Path, special: tuple[str, ...], normal: tuple[str, ...]
                      ) -> int:
    """Add tokens with transformers (past the SentencePiece pieces) and save the folder as it
    writes it (tokenizer.json's added_tokens, no added_tokens_decoder); returns the size."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    tok.add_tokens(list(special), special_tokens=True)
    tok.add_tokens(list(normal))
    tok.save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert "added_tokens_decoder" not in config
    assert not (directory / "added_tokens.json").exists()
    return len(tok)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_tokenizer_model_beside_tokenizer_json_keeps_its_added_tokens(tmp_path: Path, arch: str
                                                                      ) -> None:
    """A tokenizer.model beside a tokenizer.json whose added tokens lie past the .model's
    pieces (ChatML markers added with transformers; Gemma's <bos>/<eos>/<pad> that
    GemmaTokenizer adds to a .model without them): transformers matches them whole, and so
    does llama.cpp, which is given them from tokenizer.json with their kinds (special:
    control, else user-defined), never as unused [PADn] pieces. Gemma's BOS is such a token."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    tok = tmp_path / "tok"
    tok.mkdir()
    # a Llama without the prefix: outside the README's LlamaTokenizer gap, which would also
    # touch the text right after an added token
    # (Gemma's BOS and EOS are not pieces of this .model: GemmaTokenizer adds them)
    saved_spm_json(tok, *(("GemmaTokenizer",) if arch == "gemma2" else ("LlamaTokenizer",)),
                   **({"bos_token": "<bos>", "eos_token": "<eos>"} if arch == "gemma2"
                      else {"add_prefix_space": False}))
    size = with_added_tokens(tok, ("<|im_start|>", "<|im_end|>"), ("<|note|>",))
    named = AutoTokenizer.from_pretrained(tok)
    # config.json names the tokenizer's BOS/EOS, as a Gemma's does (generate stops on its EOS)
    model = tiny_model(tmp_path / "m", arch=arch, tokenizer="spm", dtype="float32",
                       pad_vocab=size - 320, tied=arch == "gemma2",
                       bos_token_id=named.bos_token_id, eos_token_id=named.eos_token_id)
    (model / "tokenizer_config.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / name, model / name)
    assert (model / "tokenizer.model").exists()
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    hf = AutoTokenizer.from_pretrained(model)
    added = {a.content: i for i, a in hf.added_tokens_decoder.items() if i >= 320}
    assert {"<|im_start|>", "<|im_end|>", "<|note|>"} <= set(added)
    fields = GGUFReader(out).fields
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    for text, i in added.items():
        assert bytes(tokens.parts[tokens.data[i]]).decode() == text
        assert int(types.parts[types.data[i]][0]) == (4 if text == "<|note|>" else 3), text
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    if arch == "gemma2":
        assert hf.bos_token_id == ll.token_bos() == added["<bos>"]
        assert hf.eos_token_id == ll.token_eos() == added["<eos>"]
    for text in ["<|im_start|>user\nthe llama<|im_end|>", "the<|note|>llama moves",
                 "file <|im_start|> cord", *[f"{t}the llama" for t in added]]:
        for add in (False, True):
            assert ll.tokenize(text.encode(), add_bos=add, special=True) == hf.encode(
                text, add_special_tokens=add), (text, add)


def bpe_with_eot(root: Path) -> tuple[Path, dict[str, int]]:
    """A Llama 3 shaped byte-level BPE with a third special token, ``<|eot_id|>``, past the
    trained pieces (as Llama 3 Instruct's), and a template that ends with ``<|end_of_text|>``."""
    model = tiny_model(root / "m", tokenizer="bpe", dtype="float32", pad_vocab=1)
    spec = json.loads((model / "tokenizer.json").read_text())
    ids = {e["content"]: e["id"] for e in spec["added_tokens"]}
    ids["<|eot_id|>"] = max(ids.values()) + 1
    spec["added_tokens"].append({"id": ids["<|eot_id|>"], "content": "<|eot_id|>",
                                 "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True})
    bos, eos = ({"SpecialToken": {"id": t, "type_id": 0}}
                for t in ("<|begin_of_text|>", "<|end_of_text|>"))
    seq = {"Sequence": {"id": "A", "type_id": 0}}
    template = spec["post_processor"]["processors"][1]
    template["single"] = [bos, seq, eos]
    template["pair"] = [bos, seq, {"Sequence": {"id": "B", "type_id": 1}}, eos]
    template["special_tokens"]["<|end_of_text|>"] = {
        "id": "<|end_of_text|>", "ids": [ids["<|end_of_text|>"]], "tokens": ["<|end_of_text|>"]}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    return model, ids


@pytest.mark.parametrize("names", ["tokenizer_config.json", "config.json"])
def test_template_adding_an_eos_other_than_the_named_one_is_refused(tmp_path: Path, names: str
                                                                    ) -> None:
    """transformers ends the text with the template's token, llama.cpp with the EOS it is told
    of, and generation stops on the one tokenizer_config.json (or config.json) names: a
    template that adds another is refused, naming both (gguf-py would make the template's
    token the EOS and the named one EOT)."""
    model, ids = bpe_with_eot(tmp_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    if names == "tokenizer_config.json":
        config["eos_token"] = "<|eot_id|>"  # noqa: S105 - a token, not a secret
        says = ("tokenizer.json: post_processor and tokenizer_config.json: eos_token: the "
                f"template adds '<|end_of_text|>' (ids [{ids['<|end_of_text|>']}]) but "
                f"tokenizer_config.json names '<|eot_id|>' (id {ids['<|eot_id|>']})")
    else:
        del config["eos_token"]
        edit_json(model, "config.json", eos_token_id=ids["<|eot_id|>"])
        says = ("tokenizer.json: post_processor and config.json: eos_token_id: the template "
                f"adds '<|end_of_text|>' (ids [{ids['<|end_of_text|>']}]) but config.json "
                f"names id {ids['<|eot_id|>']}")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr, r.stderr
    assert not out.exists()


def test_template_adding_the_named_eos_converts_and_adds_it(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model, ids = bpe_with_eot(tmp_path)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    hf = AutoTokenizer.from_pretrained(model)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    assert ll.token_eos() == hf.eos_token_id == ids["<|end_of_text|>"]
    want = hf.encode("the llama")
    assert want[-1] == ids["<|end_of_text|>"]
    assert ll.tokenize(b"the llama", add_bos=True, special=True) == want


@pytest.mark.parametrize("generation", ["[eot, end]", "eot", None])
def test_eos_id_list_gives_the_eos_generation_stops_on_first(tmp_path: Path,
                                                             generation: str | None) -> None:
    """config.json's eos_token_id as a list (Llama 3.1 Instruct's form) where
    tokenizer_config.json names no eos_token: transformers' generate stops on
    generation_config.json's eos_token_id (else the config's list); the GGUF's EOS is the
    first of those. gguf-py skips a list, so llama.cpp's converter writes no EOS and llama.cpp
    falls back to id 11, an ordinary piece."""
    from transformers import AutoModelForCausalLM

    model, ids = bpe_with_eot(tmp_path)
    eot, end = ids["<|eot_id|>"], ids["<|end_of_text|>"]
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    edit_json(model, "config.json", eos_token_id=[end, eot])
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["post_processor"]["processors"][1]["single"].pop()  # the template adds no EOS
    spec["post_processor"]["processors"][1]["pair"].pop()
    (model / "tokenizer.json").write_text(json.dumps(spec))
    if generation is None:
        (model / "generation_config.json").unlink()
    else:
        edit_json(model, "generation_config.json",
                  eos_token_id=[eot, end] if generation.startswith("[") else eot)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    stops = AutoModelForCausalLM.from_pretrained(model).generation_config.eos_token_id
    first = stops[0] if isinstance(stops, list) else stops
    assert first == (end if generation is None else eot)
    ll = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    assert ll.token_eos() == first
    if generation is None:
        ref = reference_or_skip()
        run_reference(ref, model, tmp_path / "ref.gguf", pre="llama-bpe")
        from gguf import GGUFReader

        assert "tokenizer.ggml.eos_token_id" not in GGUFReader(tmp_path / "ref.gguf").fields


def test_a_bos_id_list_nothing_else_names_is_refused(tmp_path: Path) -> None:
    """A list for another special id, with no tokenizer_config.json token to take instead:
    llama.cpp takes one id, transformers none; refused, not skipped."""
    model, _ = bpe_with_eot(tmp_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["bos_token"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    edit_json(model, "config.json", bos_token_id=[1, 2])
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert "config.json: bos_token_id: a list ([1, 2])" in r.stderr, r.stderr
    assert not out.exists()


def test_quiet_convert_of_a_llama_3_shaped_folder_is_silent(bpe: Path, tmp_path: Path) -> None:
    """gguf-py warns about the pair template of a Llama 3 shaped tokenizer.json (a separator
    its crude parse does not know); convert judges the template itself, and -q silences the
    chatter (without -q it is shown)."""
    r = convert(bpe, tmp_path / "o.gguf")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    loud = subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(bpe), "-o",
                           str(tmp_path / "p.gguf")], capture_output=True, text=True, env=ENV,
                          check=False, timeout=300)
    assert loud.returncode == 0, loud.stderr
    assert "WARNING gguf.vocab: Unknown separator token" in loud.stderr


@pytest.mark.parametrize("beside", [False, True])
def test_normalized_added_token_under_the_prepend_normalizer_is_refused(
        tmp_path: Path, beside: bool) -> None:
    """transformers 4's Llama steps (Prepend + Replace normalizers): an added token with
    "normalized": true (what add_tokens makes of a normal token) is normalized too, so
    transformers matches it only after a space, spending the space; llama.cpp matches it
    anywhere. Refused, in tokenizer.json alone or beside tokenizer.model."""
    from transformers import AutoTokenizer

    tok = tmp_path / "tok"
    tok.mkdir()
    saved_spm_json(tok, "LlamaTokenizer")
    as_transformers_4(tok)
    size = with_added_tokens(tok, (), ("<|note|>",))
    hf = AutoTokenizer.from_pretrained(tok)
    note = hf.convert_tokens_to_ids("<|note|>")
    assert note not in hf.encode("the<|note|>llama", add_special_tokens=False)
    assert note in hf.encode("the <|note|>llama", add_special_tokens=False)
    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32",
                       pad_vocab=size - 320)
    (model / "tokenizer_config.json").unlink()
    if not beside:
        (model / "tokenizer.model").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / name, model / name)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert ("tokenizer.json: added_tokens[3].normalized: true for '<|note|>' under the Prepend "
            "normalizer") in r.stderr, r.stderr
    assert not out.exists()


# ------------------------------------------- what transformers 5 runs, whatever the files


def model_beside_json(root: Path, arch: str, edit: Any, **kwargs: Any) -> Path:
    """A tokenizer.model beside the tokenizer.json transformers 5 saves from it (a Llama 2 /
    Mistral repository's form), with ``edit`` applied to the saved folder."""
    model = checkpoint(root, arch, "LlamaTokenizer", kwargs, edit)
    spm_dir = root / "spm"
    spm_dir.mkdir()
    spm_tokenizer(spm_dir)
    shutil.copy(spm_dir / "tokenizer.model", model / "tokenizer.model")
    return model


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_tokenizer_model_beside_tokenizer_json_adds_no_eos_add_eos_token_names(
        tmp_path: Path, arch: str) -> None:
    """tokenizer_config.json's add_eos_token true beside a tokenizer.json (a common fine-tune
    setting): transformers 5 runs the tokenizer.json's post-processor, which adds no EOS, and
    ignores the flag; the GGUF says add_eos false, so llama.cpp appends no </s> either."""
    from transformers import AutoTokenizer

    def edit(d: Path) -> None:
        edit_json(d, "tokenizer_config.json", add_eos_token=True, add_prefix_space=False)
        spec = json.loads((d / "tokenizer.json").read_text())
        edit_json(d, "tokenizer.json", pre_tokenizer={**spec["pre_tokenizer"],
                                                      "prepend_scheme": "never"})

    model = model_beside_json(tmp_path, arch, edit, add_prefix_space=False)
    hf = AutoTokenizer.from_pretrained(model)
    assert hf.encode("the llama")[-1] != 2  # no EOS in transformers 5
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert differences(model, out) == []


def mistral_model_only(root: Path, **train: Any) -> Path:
    model = tiny_model(root / "m", arch="mistral", tokenizer="spm", dtype="float32")
    spm_dir = root / "spm"
    spm_dir.mkdir()
    spm_tokenizer(spm_dir, **train)
    shutil.copy(spm_dir / "tokenizer.model", model / "tokenizer.model")
    return model


def test_tokenizer_model_whose_normalizer_transformers_runs_is_refused(tmp_path: Path) -> None:
    """A Mistral (transformers 5 converts the .model with its own normalizer) whose .model has
    SentencePiece's default nmt_nfkc normalizer with whitespace collapsing: transformers folds
    "a  b" into "a b", llama.cpp applies no normalizer; refused naming normalizer_spec (beside
    a tokenizer.json transformers runs the file's steps, judged by the same spm_form)."""
    from transformers import AutoTokenizer

    model = mistral_model_only(tmp_path, normalization="nmt_nfkc")
    hf = AutoTokenizer.from_pretrained(model)
    assert hf.encode("a  b", add_special_tokens=False) == hf.encode("a b",
                                                                      add_special_tokens=False)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1
    assert "tokenizer.model: normalizer_spec" in r.stderr
    assert "nmt_nfkc" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("dummy_prefix", [True, False])
def test_mistral_tokenizer_model_alone_tokenizes_as_transformers(tmp_path: Path,
                                                                 dummy_prefix: bool) -> None:
    """A Mistral's identity-normalizer .model alone, with and without the dummy prefix:
    transformers 5 converts it (prefix "always" or "never"), and the GGUF's add_space_prefix
    follows it."""
    model = mistral_model_only(tmp_path, dummy_prefix=dummy_prefix)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert differences(model, out) == []


def post_processed(bpe: Path, tmp_path: Path, pp: Any) -> Path:
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    edit_json(model, "tokenizer.json", post_processor=pp)
    return model


@pytest.mark.parametrize("pp", [None, {"type": "Sequence", "processors": []}])
def test_no_post_processor_adds_no_bos_in_llama_cpp_either(bpe: Path, tmp_path: Path,
                                                           pp: Any) -> None:
    """No post-processor (or an empty Sequence) on a Llama 3 shaped tokenizer: transformers
    adds nothing, whatever add_bos_token says; llama.cpp's llama-bpe default would add
    <|begin_of_text|>, so the GGUF says add_bos false."""
    from transformers import AutoTokenizer

    model = post_processed(bpe, tmp_path, pp)
    assert AutoTokenizer.from_pretrained(model).encode("x") == AutoTokenizer.from_pretrained(
        model).encode("x", add_special_tokens=False)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 0, r.stderr
    assert differences(model, out) == []


BOS, SEQ_A = ({"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
              {"Sequence": {"id": "A", "type_id": 0}})
SEQ_B = {"Sequence": {"id": "B", "type_id": 0}}


def template(single: list[Any]) -> dict[str, Any]:
    return {"type": "TemplateProcessing", "single": single, "pair": [*single, SEQ_B],
            "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [298],
                                                     "tokens": ["<|begin_of_text|>"]}}}


@pytest.mark.parametrize(("pp", "says"), [
    ({"type": "BertProcessing", "sep": ["<|end_of_text|>", 299], "cls": ["<|begin_of_text|>",
                                                                         298]},
     "tokenizer.json: post_processor: a BertProcessing step"),
    ({"type": "Sequence", "processors": [template([BOS, SEQ_A]), template([BOS, SEQ_A])]},
     "tokenizer.json: post_processor: 2 TemplateProcessing steps"),
    (template([BOS, BOS, SEQ_A]), "tokenizer.json: post_processor.single: 2 special token(s) "
     "before $A"),
    (template([BOS, SEQ_B]), "tokenizer.json: post_processor.single: must hold the sequence $A"),
])
def test_post_processor_llama_cpp_cannot_be_told_is_refused(bpe: Path, tmp_path: Path, pp: Any,
                                                           says: str) -> None:
    """A post-processor whose adds the GGUF's add_bos/add_eos cannot say (transformers adds
    a CLS and SEP, or two BOS), or a single template naming $B (tokenizers panics on it), is
    refused naming the field, nothing written."""
    model = post_processed(bpe, tmp_path, pp)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


@pytest.mark.parametrize(("key", "value", "field"), [
    ("extra_special_tokens", ["<|im_start|>", "<|im_end|>"], "extra_special_tokens[0]"),
    ("additional_special_tokens", ["<|im_start|>"], "additional_special_tokens[0]"),
    ("extra_special_tokens", {"im_start": "<|im_start|>"}, "extra_special_tokens.im_start"),
    ("pad_token", "<|im_start|>", "pad_token"),
])
def test_tokenizer_model_alone_naming_a_token_it_lacks_is_refused(
        tmp_path: Path, key: str, value: Any, field: str) -> None:
    """tokenizer_config.json naming a token the tokenizer.model lacks (ChatML markers, Gemma's
    <bos>): transformers 5 adds it past the pieces and matches it whole; llama.cpp would hold
    an unused piece there and spell the text in bytes. Refused naming the field."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32",
                       pad_vocab=2)
    edit_json(model, "tokenizer_config.json", **{key: value})
    hf = AutoTokenizer.from_pretrained(model)
    assert hf.encode("<|im_start|>x", add_special_tokens=False)[0] == 320
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    assert r.returncode == 1, r.stderr
    assert f"tokenizer_config.json: {field}: '<|im_start|>' is not a token of the tokenizer" \
        in r.stderr
    assert not out.exists()


def test_eos_token_the_vocabulary_lacks_is_refused(bpe: Path, tmp_path: Path) -> None:
    """An eos_token no piece or added token spells: transformers adds it at vocab_size (past
    the embedding) and stops on it; the GGUF would stop on config.json's. Refused naming it."""
    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    edit_json(model, "tokenizer_config.json", eos_token="<|nope|>")  # noqa: S106 - a name
    assert_refused(model, tmp_path / "o.gguf",
                   "tokenizer_config.json: eos_token: '<|nope|>' is not a token")


def test_too_many_named_special_tokens_are_refused_before_any_is_read(tmp_path: Path) -> None:
    """More names than the embedding has rows cannot all be tokens: refused by count."""
    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32")
    edit_json(model, "tokenizer_config.json",
              extra_special_tokens=[f"<|x{i}|>" for i in range(100_000)])
    r = convert(model, tmp_path / "o.gguf")
    assert r.returncode == 1, r.stderr
    assert ("tokenizer_config.json: extra_special_tokens: 100000 tokens, more than config.json "
            "vocab_size 320") in r.stderr


def test_split_special_tokens_is_refused(bpe: Path, tmp_path: Path) -> None:
    """split_special_tokens true: transformers tokenizes "<|end_of_text|>" in text as ordinary
    text, llama.cpp (parsing specials, as its chat path does) as the special id; no GGUF key
    says otherwise, so it is refused naming the field."""
    from transformers import AutoTokenizer

    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    edit_json(model, "tokenizer_config.json", split_special_tokens=True)
    assert 299 not in AutoTokenizer.from_pretrained(model).encode("<|end_of_text|>")
    assert_refused(model, tmp_path / "o.gguf", "tokenizer_config.json: split_special_tokens: true")


@pytest.mark.parametrize(("stops", "converts"), [(298, False), ([298, 299], True)])
def test_eos_generation_does_not_stop_on_is_refused(bpe: Path, tmp_path: Path, stops: Any,
                                                    converts: bool) -> None:
    """tokenizer_config.json's EOS (id 299) against generation_config.json's eos_token_id,
    what transformers' generate stops on: another id is refused naming both; a list holding it
    (Llama 3 Instruct's shape) converts with it as the EOS."""
    from gguf import GGUFReader

    model = tmp_path / "m"
    shutil.copytree(bpe, model)
    edit_json(model, "generation_config.json", eos_token_id=stops)
    out = tmp_path / "o.gguf"
    r = convert(model, out)
    if not converts:
        assert r.returncode == 1, r.stderr
        assert ("tokenizer_config.json: eos_token and generation_config.json: eos_token_id: "
                "the tokenizer's EOS is id 299 but transformers' generate stops on 298"
                ) in r.stderr
        assert not out.exists()
        return
    assert r.returncode == 0, r.stderr
    field = GGUFReader(out).fields["tokenizer.ggml.eos_token_id"]
    assert int(field.parts[field.data[0]][0]) == 299


def test_qwen2_tokenizer_add_prefix_space_is_refused(tmp_path: Path) -> None:
    """transformers 5's Qwen2Tokenizer (what model_type qwen2 runs) builds its ByteLevel from
    tokenizer_config.json's add_prefix_space, whatever the file says: true puts a space before
    the text, which llama.cpp's qwen2 pre-tokenizer never does; refused naming the key."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "m", arch="qwen2", tokenizer="qwen2", dtype="float32")
    plain = AutoTokenizer.from_pretrained(model).encode("hello", add_special_tokens=False)
    edit_json(model, "tokenizer_config.json", add_prefix_space=True)
    assert AutoTokenizer.from_pretrained(model).encode("hello",
                                                       add_special_tokens=False) != plain
    assert_refused(model, tmp_path / "o.gguf",
                   "tokenizer_config.json: add_prefix_space: true: transformers 5's Qwen2Tokenizer")


def test_llama_tokenizer_added_ids_with_a_gap_are_refused(tmp_path: Path) -> None:
    """A LlamaTokenizer tokenizer.json whose added token past the pieces leaves a gap
    (<|im_end|> at 321, nothing at 320): transformers 5 rebuilds the class and re-adds it at
    320, the GGUF would keep 321; refused naming added_tokens."""
    from transformers import AutoTokenizer

    tok = tmp_path / "tok"
    tok.mkdir()
    saved_spm_json(tok, "LlamaTokenizer", add_prefix_space=False)
    with_added_tokens(tok, ("<|im_start|>", "<|im_end|>"), ())
    spec = json.loads((tok / "tokenizer.json").read_text())
    spec["added_tokens"] = [e for e in spec["added_tokens"] if e["content"] != "<|im_start|>"]
    (tok / "tokenizer.json").write_text(json.dumps(spec))
    model = tiny_model(tmp_path / "m", arch="llama", tokenizer="spm", dtype="float32",
                       pad_vocab=2)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (model / name).unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / name, model / name)
    assert AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|im_end|>") == 320
    assert_refused(model, tmp_path / "o.gguf",
                   "tokenizer.json: added_tokens: an added token at id 321 where 320 is the next")


def test_tokenizer_json_without_byte_fallback_beside_a_byte_fallback_model_is_refused(
        tmp_path: Path) -> None:
    """Beside a tokenizer.model with byte pieces, a tokenizer.json with byte_fallback false
    (what transformers runs for a Mistral) never spells a character outside the vocabulary in
    bytes; llama.cpp, given the .model, does. Refused naming the field."""
    from transformers import AutoTokenizer

    model = model_beside_json(tmp_path, "mistral", lambda d: None)
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["model"]["byte_fallback"] = False
    (model / "tokenizer.json").write_text(json.dumps(spec))
    # no byte pieces (ids 3..258, after <unk>, <s>, </s>) in transformers' ids
    hf = AutoTokenizer.from_pretrained(model).encode("\u0416", add_special_tokens=False)
    assert not [i for i in hf if 3 <= i < 259], hf
    assert_refused(model, tmp_path / "o.gguf",
                   "tokenizer.json: model.byte_fallback: false beside a tokenizer.model")
