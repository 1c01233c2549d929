"""The structure of the JSON files a Hugging Face tokenizer comes in, as data, and one checker.

A ``tokenizer.json`` is read by three programs: filecord (the keys it writes), Hugging Face
``tokenizers`` (what transformers runs) and gguf-py.  A value one of them cannot take ends in
an exception that names neither the file nor the field, or worse, is read differently by each.
So the whole structure the converter relies on is declared here once, as a schema (objects
with typed fields, lists, maps, unions tagged by ``type``), and :func:`problem` walks a parsed
file against it, returning the first field that does not fit and why.  Objects stay open (a
field the schema does not name is not judged: newer ``tokenizers`` versions add some), but a
tagged object of a ``type`` the schema does not know is refused, since nothing can say what
it would compute.  Pure: no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Prim(enum.Enum):
    """A JSON scalar."""

    STR = "a string"
    BOOL = "true or false"
    U32 = "an integer from 0 to 2**32-1"  # token ids: tokenizers reads them as u32
    NUM = "a finite number"
    NULL = "null"


@dataclass(frozen=True, slots=True)
class Pred:
    """A scalar that must also pass a test."""

    base: Prim
    test: Callable[[Any], bool]
    what: str


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Schema


@dataclass(frozen=True, slots=True)
class Tuple:
    items: tuple[Schema, ...]


@dataclass(frozen=True, slots=True)
class MapOf:
    value: Schema


@dataclass(frozen=True, slots=True)
class Obj:
    fields: Mapping[str, Schema] = field(default_factory=dict)
    required: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Tagged:
    """An object whose ``type`` names its kind; ``kinds`` may be filled after creation (a
    ``Sequence`` kind holds items of the same union)."""

    kinds: dict[str, Obj]
    what: str


@dataclass(frozen=True, slots=True)
class AnyOf:
    options: tuple[Schema, ...]
    what: str


Schema = Prim | Pred | ListOf | Tuple | MapOf | Obj | Tagged | AnyOf


def nullable(schema: Schema) -> AnyOf:
    return AnyOf((Prim.NULL, schema), f"null or {describe(schema)}")


def describe(schema: Schema) -> str:
    if isinstance(schema, Prim):
        return schema.value
    if isinstance(schema, (Pred, Tagged, AnyOf)):
        return schema.what
    if isinstance(schema, ListOf):
        return "a list"
    if isinstance(schema, Tuple):
        return f"a list of {len(schema.items)}"
    return "an object"


def _prim(kind: Prim, value: Any) -> bool:
    if kind is Prim.STR:
        return isinstance(value, str)
    if kind is Prim.BOOL:
        return isinstance(value, bool)
    if kind is Prim.NULL:
        return value is None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind is Prim.U32:
        return isinstance(value, int) and 0 <= value < 4294967296
    return math.isfinite(value)


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


_FITS: dict[int, Callable[[Any], bool]] = {}


def fits(schema: Schema) -> Callable[[Any], bool]:
    """A plain predicate for ``schema``, built once per schema: the fast pass over a file
    that fits (the common case); :func:`problem` walks again only to explain a failure."""
    got = _FITS.get(id(schema))
    if got is None:
        got = _FITS[id(schema)] = _build(schema)
    return got


def _build(schema: Schema) -> Callable[[Any], bool]:
    if isinstance(schema, Prim):
        kind = schema
        return lambda v: _prim(kind, v)
    if isinstance(schema, Pred):
        base, test = schema.base, schema.test
        return lambda v: _prim(base, v) and test(v)
    if isinstance(schema, AnyOf):
        options = [fits(o) for o in schema.options]
        return lambda v: any(f(v) for f in options)
    if isinstance(schema, ListOf):
        item = schema.item
        return lambda v: isinstance(v, list) and all(map(fits(item), v))
    if isinstance(schema, Tuple):
        items = schema.items
        return lambda v: (isinstance(v, list) and len(v) == len(items)
                          and all(fits(s)(x) for s, x in zip(items, v, strict=True)))
    if isinstance(schema, MapOf):
        value = schema.value
        return lambda v: isinstance(v, dict) and all(map(fits(value), v.values()))
    if isinstance(schema, Tagged):
        kinds = schema.kinds
        return lambda v: (isinstance(v, dict) and isinstance(v.get("type"), str)
                          and v["type"] in kinds and fits(kinds[v["type"]])(v))
    obj = schema
    return lambda v: (isinstance(v, dict) and obj.required <= v.keys()
                      and all(k not in v or fits(sub)(v[k]) for k, sub in obj.fields.items()))


def problem(schema: Schema, value: Any, where: str = "") -> tuple[str, str] | None:
    """The first (field, why) where ``value`` does not fit ``schema``; None when it fits."""
    if fits(schema)(value):
        return None
    found = _problem(schema, value)
    if found is None:
        return None
    path, why = found
    for key in reversed(path):
        where = _at(where, key)
    return where, why


_Found = tuple[list[str | int], str]  # the path from the innermost field outwards, why


def _problem(schema: Schema, value: Any) -> _Found | None:
    """``problem`` with the path built only on the way out of a failure (a tokenizer.json
    has a million values; formatting a path for each would dominate)."""
    if isinstance(schema, Prim):
        return None if _prim(schema, value) else ([], f"must be {schema.value}")
    if isinstance(schema, Pred):
        ok = _prim(schema.base, value) and schema.test(value)
        return None if ok else ([], f"must be {schema.what}")
    if isinstance(schema, AnyOf):
        # the options of the value's JSON kind: the first that fits, else the first one's
        # complaint (it says more than "one of")
        kin = [o for o in schema.options if _same_kind(o, value)]
        first = None
        for o in kin:
            found = _problem(o, value)
            if found is None:
                return None
            first = first or found
        return first or ([], f"must be {schema.what}")
    if isinstance(schema, (ListOf, Tuple)):
        if not isinstance(value, list):
            return [], f"must be {describe(schema)}"
        if isinstance(schema, Tuple):
            if len(value) != len(schema.items):
                return [], f"must be {describe(schema)}"
            pairs: Any = zip(schema.items, value, strict=True)
        else:
            if isinstance(schema.item, Prim) and all(_prim(schema.item, v) for v in value):
                return None
            pairs = ((schema.item, v) for v in value)
        for i, (s, v) in enumerate(pairs):
            if (found := _problem(s, v)) is not None:
                found[0].append(i)
                return found
        return None
    if not isinstance(value, dict):
        return [], f"must be {describe(schema)}"
    if isinstance(schema, MapOf):
        if isinstance(schema.value, Prim) and all(_prim(schema.value, v)
                                                  for v in value.values()):
            return None
        for k, v in value.items():
            if (found := _problem(schema.value, v)) is not None:
                found[0].append(k)
                return found
        return None
    if isinstance(schema, Tagged):
        kind = value.get("type")
        if not isinstance(kind, str):
            return ["type"], f"must be a string ({schema.what})"
        if kind not in schema.kinds:
            return ["type"], (f"{kind!r} is not {schema.what} filecord knows "
                              f"(known: {', '.join(sorted(schema.kinds))})")
        schema = schema.kinds[kind]
    for key in sorted(schema.required):
        if key not in value:
            return [key], "missing"
    for key, sub in schema.fields.items():
        if key in value and (found := _problem(sub, value[key])) is not None:
            found[0].append(key)
            return found
    return None


def _same_kind(schema: Schema, value: Any) -> bool:
    if isinstance(schema, (Prim, Pred)):
        base = schema if isinstance(schema, Prim) else schema.base
        if base is Prim.NULL:
            return value is None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (value is not None and (base is Prim.STR) == isinstance(value, str)
                and (base is Prim.BOOL) == isinstance(value, bool)
                and (base in (Prim.U32, Prim.NUM)) == number)
    if isinstance(schema, (ListOf, Tuple)):
        return isinstance(value, list)
    if isinstance(schema, AnyOf):
        return any(_same_kind(o, value) for o in schema.options)
    if isinstance(schema, Obj):  # the option whose required keys are there
        return isinstance(value, dict) and schema.required <= value.keys()
    return isinstance(value, dict)


# ---- tokenizer.json, as the tokenizers library reads it -------------------------------------

STR, BOOL, U32, NUM = Prim.STR, Prim.BOOL, Prim.U32, Prim.NUM
OPT_STR = nullable(STR)
PATTERN = AnyOf((Obj({"String": STR}, frozenset({"String"})),
                 Obj({"Regex": STR}, frozenset({"Regex"}))),
                'an object {"String": ...} or {"Regex": ...}')
# "a b": exactly one space (tokenizers splits on it and refuses any other count)
MERGE = AnyOf((Pred(STR, lambda s: s.count(" ") == 1, "'a b' (two pieces, one space)"),
               Tuple((STR, STR))), "'a b' or [a, b]")


def _obj(required: str = "", **fields: Schema) -> Obj:
    return Obj(fields, frozenset(required.split()))


BPE = _obj("vocab merges", vocab=MapOf(U32), merges=ListOf(MERGE),
           dropout=nullable(Pred(NUM, lambda x: 0 <= x <= 1, "a number from 0 to 1")),
           unk_token=OPT_STR, continuing_subword_prefix=OPT_STR, end_of_word_suffix=OPT_STR,
           fuse_unk=BOOL, byte_fallback=BOOL, ignore_merges=BOOL)
MODEL = Tagged({
    "BPE": BPE,
    # read only to compare with a tokenizer.model (Unigram) or to be refused by name
    "Unigram": _obj("vocab", vocab=ListOf(Tuple((STR, NUM))), unk_id=nullable(U32),
                    byte_fallback=BOOL),
    "WordPiece": _obj("vocab", vocab=MapOf(U32), unk_token=STR),
    "WordLevel": _obj("vocab", vocab=MapOf(U32), unk_token=STR),
}, "a tokenizer model")
ADDED = _obj("id content", id=U32, content=STR, single_word=BOOL, lstrip=BOOL, rstrip=BOOL,
             normalized=BOOL, special=BOOL)

NORMALIZER = Tagged({}, "a normalizer")
NORMALIZER.kinds.update({
    **{k: _obj() for k in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Nmt")},
    "Strip": _obj(strip_left=BOOL, strip_right=BOOL),
    "Prepend": _obj("prepend", prepend=STR),
    "Replace": _obj("pattern content", pattern=PATTERN, content=STR),
    "Precompiled": _obj(precompiled_charsmap=OPT_STR),
    "BertNormalizer": _obj(clean_text=BOOL, handle_chinese_chars=BOOL,
                           strip_accents=nullable(BOOL), lowercase=BOOL),
    "Sequence": _obj("normalizers", normalizers=ListOf(NORMALIZER)),
})
BEHAVIOR = Pred(STR, lambda s: s in ("Removed", "Isolated", "MergedWithPrevious",
                                     "MergedWithNext", "Contiguous"),
                "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous")
PRE_TOKENIZER = Tagged({}, "a pre-tokenizer")
PRE_TOKENIZER.kinds.update({
    "ByteLevel": _obj(add_prefix_space=BOOL, trim_offsets=BOOL, use_regex=BOOL),
    "Metaspace": _obj("replacement", replacement=Pred(STR, lambda s: len(s) == 1,
                                                      "one character"),
                      prepend_scheme=Pred(STR, lambda s: s in ("first", "never", "always"),
                                          "first, never or always"),
                      split=BOOL, add_prefix_space=BOOL),
    "Split": _obj("pattern behavior", pattern=PATTERN, behavior=BEHAVIOR, invert=BOOL),
    "Digits": _obj(individual_digits=BOOL),
    "Punctuation": _obj(behavior=BEHAVIOR),
    "CharDelimiterSplit": _obj("delimiter", delimiter=Pred(STR, lambda s: len(s) == 1,
                                                           "one character")),
    **{k: _obj() for k in ("Whitespace", "WhitespaceSplit", "BertPreTokenizer",
                           "UnicodeScripts")},
    "Sequence": _obj("pretokenizers", pretokenizers=ListOf(PRE_TOKENIZER)),
})
TEMPLATE = ListOf(AnyOf((
    Obj({"SpecialToken": _obj("id", id=STR, type_id=U32)}, frozenset({"SpecialToken"})),
    Obj({"Sequence": _obj("id", id=Pred(STR, lambda s: s in ("A", "B"), "A or B"),
                          type_id=U32)}, frozenset({"Sequence"}))),
    "a SpecialToken or a Sequence with an id string"))
POST_PROCESSOR = Tagged({}, "a post-processor")
POST_PROCESSOR.kinds.update({
    "ByteLevel": _obj(add_prefix_space=BOOL, trim_offsets=BOOL, use_regex=BOOL),
    "TemplateProcessing": _obj(
        "single pair", single=TEMPLATE, pair=TEMPLATE,
        special_tokens=MapOf(_obj("id ids tokens", id=STR, ids=ListOf(U32),
                                  tokens=ListOf(STR)))),
    "RobertaProcessing": _obj("sep cls", sep=Tuple((STR, U32)), cls=Tuple((STR, U32)),
                              trim_offsets=BOOL, add_prefix_space=BOOL),
    "BertProcessing": _obj("sep cls", sep=Tuple((STR, U32)), cls=Tuple((STR, U32))),
    "Sequence": _obj("processors", processors=ListOf(POST_PROCESSOR)),
})
DECODER = Tagged({}, "a decoder")
DECODER.kinds.update({
    "ByteLevel": _obj(add_prefix_space=BOOL, trim_offsets=BOOL, use_regex=BOOL),
    "Replace": _obj("pattern content", pattern=PATTERN, content=STR),
    "ByteFallback": _obj(),
    "Fuse": _obj(),
    "Strip": _obj("content start stop", content=Pred(STR, lambda s: len(s) == 1,
                                                     "one character"), start=U32, stop=U32),
    "Metaspace": PRE_TOKENIZER.kinds["Metaspace"],
    "WordPiece": _obj(prefix=STR, cleanup=BOOL),
    "BPEDecoder": _obj(suffix=STR),
    "CTC": _obj(pad_token=STR, word_delimiter_token=STR, cleanup=BOOL),
    "Sequence": _obj("decoders", decoders=ListOf(DECODER)),
})
TOKENIZER_JSON = _obj("model", model=MODEL, added_tokens=ListOf(ADDED),
                      normalizer=nullable(NORMALIZER), pre_tokenizer=nullable(PRE_TOKENIZER),
                      post_processor=nullable(POST_PROCESSOR), decoder=nullable(DECODER))

# ---- tokenizer_config.json: the fields the conversion and gguf-py read ----------------------

TOKEN = AnyOf((Prim.NULL, STR, _obj("content", content=STR)),
              "a string or an object with a content string")
_FLAG = AnyOf((Prim.NULL, BOOL), "true, false or null")
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom")
TOKENIZER_CONFIG = Obj({
    **{f"add_{k}": _FLAG for k in ("bos_token", "eos_token", "sep_token", "prefix_space")},
    **{f"{t}_token": TOKEN for t in SPECIAL_TYPES},
    # chat_template: _hf_vocab.check_chat_template (shared with chat_template.json)
    "added_tokens_decoder": nullable(MapOf(_obj("content", content=STR, special=BOOL))),
    # transformers 5 builds a LlamaTokenizer's steps from these (_hf_vocab.spm_steps)
    "tokenizer_class": nullable(STR),
    "legacy": _FLAG,
})
