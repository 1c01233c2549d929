"""The safetensors byte layout, pure: header bytes in, validated entries out, and back.

Byte map: 8 bytes little-endian ``N``; ``N`` bytes of UTF-8 JSON that begin with ``{`` and may be
padded after the closing ``}`` with spaces (0x20); then the data.  The JSON object maps each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
data start) and may hold ``"__metadata__"``, an object of strings.  The tensors' ranges, sorted,
must tile the data exactly: no hole, no overlap, nothing after the last one.

Strictness (documented differences with the ``safetensors`` package, which is more lenient):
duplicate JSON keys, fields other than the three above, padding other than spaces and a header
not starting with ``{`` are errors here.  ``"__metadata__": null`` is accepted as no metadata.

Writer layout, found by differential tests against ``safetensors`` 0.8 (see tests): tensors in
:data:`DTYPE_ORDER`, then by name; compact JSON, non-ASCII kept as UTF-8; ``__metadata__``
first; the header padded with spaces so the data starts on a multiple of 8.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

from filecord._kit.jsondepth import first_too_deep
from filecord.safetensors.errors import (
    DuplicateKeyError,
    HeaderTooLargeError,
    InvalidHeaderError,
    InvalidOffsetsError,
    SafetensorsFormatError,
    ShapeMismatchError,
    TruncatedFileError,
    UnknownDtypeError,
)
from filecord.tensors import DType

MAX_HEADER = 100_000_000  # the format's limit on N
U64 = 1 << 64
# The deepest JSON a header or index may nest: the safetensors package reads at most 127
# levels (serde_json's limit; one more is its "recursion limit exceeded"), and a valid
# header nests 3 (object, entry, shape).
JSON_DEPTH = 127
METADATA = "__metadata__"
_FIELDS = ("dtype", "shape", "data_offsets")

# safetensors 0.8 writes tensors grouped by dtype in this order (then by name).  The F6 types
# have no torch dtype, so their place could not be observed; it only matters for byte
# identity, which is defined for torch inputs.
DTYPE_ORDER: tuple[DType, ...] = (
    DType.U64, DType.I64, DType.F64, DType.C64, DType.F32, DType.U32, DType.I32, DType.BF16,
    DType.F16, DType.U16, DType.I16, DType.F8_E5M2FNUZ, DType.F8_E4M3FNUZ, DType.F8_E8M0,
    DType.F8_E4M3, DType.F8_E5M2, DType.F6_E3M2, DType.F6_E2M3, DType.I8, DType.U8, DType.F4,
    DType.BOOL,
)
_RANK = {d: i for i, d in enumerate(DTYPE_ORDER)}
_BY_CODE = {d.value: d for d in DType}


@dataclass(frozen=True, slots=True)
class HeaderEntry:
    """One tensor as the header describes it; ``begin``/``end`` are relative to the data."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Header:
    """A validated header: ``size`` is N, ``entries`` are in data order; ``metadata`` is
    read-only."""

    size: int
    metadata: Mapping[str, str] | None
    entries: tuple[HeaderEntry, ...]

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        if self.metadata is not None:
            object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @property
    def data_start(self) -> int:
        return 8 + self.size


def header_size(first: bytes, file_size: int) -> int:
    """N from the first 8 bytes, checked against the limit and the file size."""
    if file_size < 8 or len(first) < 8:
        raise TruncatedFileError(
            f"a safetensors file needs at least 8 bytes, this one has {file_size}",
            field="header_size", offset=0,
        )
    n = int.from_bytes(first[:8], "little")
    if n > MAX_HEADER:
        raise HeaderTooLargeError(f"{n} bytes is above the limit of {MAX_HEADER}",
                                  field="header_size", offset=0)
    if 8 + n > file_size:
        raise TruncatedFileError(
            f"a {n}-byte header does not fit in the {file_size}-byte file",
            field="header_size", offset=0,
        )
    return n


def _key_offset(raw: bytes, key: str) -> int:
    """Where ``key`` first appears as a JSON string in the header (8 when not found)."""
    for ascii_only in (False, True):
        # errors="surrogatepass": a key holding a lone surrogate is looked up (and found in
        # its escaped, ASCII spelling) rather than failing the lookup of where it is
        at = raw.find(json.dumps(key, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
        if at >= 0:
            return 8 + at
    return 8


class _Reject(Exception):
    """Raised inside the JSON decoder's hooks; turned into a format error with an offset."""

    def __init__(self, error: type[SafetensorsFormatError], message: str, key: str) -> None:
        super().__init__(message)
        self.error = error
        self.key = key


def _text(s: str, key: str, what: str) -> None:
    """A JSON escape may spell half of a surrogate pair alone (``\\ud800``): Python decodes it
    to a lone surrogate, which is not Unicode text, no UTF-8 writer can write it again and the
    safetensors package refuses the header.  Refused here too, at read, so that inspect,
    merge, reshard and convert all say the same thing."""
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Reject(InvalidHeaderError,
                      f"{what} {key!r} holds {s[exc.start]!a} (a JSON escape of half a "
                      "surrogate pair): not Unicode text", key) from None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Reject(DuplicateKeyError, f"key {k!r} appears twice in one object", k)
        _text(k, k, "the key")
        if isinstance(v, str):
            _text(v, k, "the value of")
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, str):
                    _text(x, k, "the value of")
        out[k] = v
    return out


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 20:
        raise _Reject(InvalidHeaderError, f"integer {text[:24]}... is out of range", "")
    return int(text)


def _no_float(text: str) -> NoReturn:
    raise _Reject(InvalidHeaderError, f"number {text[:24]!r} is not an integer", "")


def decode_json(raw: bytes, base: int, what: str) -> tuple[Any, int]:
    """Strict JSON: (value, index just past it).  Duplicate keys, floats, NaN and integers
    beyond 64 bits are errors; ``base`` is the absolute offset of ``raw[0]``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidHeaderError(f"not UTF-8 ({exc.reason})", field=what,
                                 offset=base + exc.start) from None
    deep = first_too_deep(text, JSON_DEPTH)
    if deep is not None:  # the parser recurses once per level: refused before it runs
        raise InvalidHeaderError(f"JSON nested more than {JSON_DEPTH} deep", field=what,
                                 offset=base + len(text[:deep].encode("utf-8")))
    decoder = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=_int, parse_float=_no_float,
                               parse_constant=_no_float)
    try:
        value, end = decoder.raw_decode(text)
    except _Reject as exc:
        at = _key_offset(raw, exc.key) - 8 + base if exc.key else base
        raise exc.error(str(exc), field=what, offset=at) from None
    except json.JSONDecodeError as exc:
        at = base + len(text[: exc.pos].encode("utf-8"))
        raise InvalidHeaderError(f"invalid JSON: {exc.msg}", field=what, offset=at) from None
    return value, len(text[:end].encode("utf-8"))


def _uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < U64


def _entry(name: str, v: object, raw: bytes) -> HeaderEntry:
    # The key's offset is looked up only for an error: a search per tensor would make reading
    # N tensors cost N header scans (quadratic), for a number that a valid file never needs.
    if not isinstance(v, dict):
        raise InvalidHeaderError("a tensor entry must be an object", field=name,
                                 offset=_key_offset(raw, name))
    for f in _FIELDS:
        if f not in v:
            raise InvalidHeaderError("missing", field=f"{name}.{f}",
                                     offset=_key_offset(raw, name))
    extra = sorted(set(v) - set(_FIELDS))
    if extra:
        raise InvalidHeaderError(f"unknown field(s) {extra}", field=name,
                                 offset=_key_offset(raw, name))
    code = v["dtype"]
    if not isinstance(code, str) or code not in _BY_CODE:
        raise UnknownDtypeError(f"{code!r} is not a safetensors dtype", field=f"{name}.dtype",
                                offset=_key_offset(raw, name))
    shape = v["shape"]
    if not isinstance(shape, list) or not all(_uint(d) for d in shape):
        raise InvalidHeaderError("must be a list of non-negative 64-bit integers",
                                 field=f"{name}.shape", offset=_key_offset(raw, name))
    offs = v["data_offsets"]
    if not isinstance(offs, list) or len(offs) != 2 or not all(_uint(o) for o in offs):
        raise InvalidHeaderError("must be two non-negative 64-bit integers",
                                 field=f"{name}.data_offsets", offset=_key_offset(raw, name))
    begin, end = offs
    if begin > end:
        raise InvalidOffsetsError(f"begin {begin} is after end {end}",
                                  field=f"{name}.data_offsets", offset=_key_offset(raw, name))
    return HeaderEntry(name, _BY_CODE[code], tuple(shape), begin, end)


def _check_size(e: HeaderEntry, raw: bytes) -> None:
    length = e.end - e.begin
    if 0 in e.shape:
        count = 0
    else:
        count = 1
        for d in e.shape:  # capped: a hostile shape never builds a huge integer
            count = min(count * d, U64)
    bits = count * e.dtype.bits
    if bits % 8:
        raise ShapeMismatchError(
            f"{count} elements of {e.dtype.value} do not end on a byte boundary",
            field=f"{e.name}.shape", offset=_key_offset(raw, e.name))
    if bits // 8 != length:
        raise ShapeMismatchError(
            f"{e.dtype.value}{list(e.shape)} needs {bits // 8} bytes, data_offsets give {length}",
            field=f"{e.name}.data_offsets", offset=_key_offset(raw, e.name))


def parse_header(raw: bytes, file_size: int) -> Header:
    """Validate the N header bytes of a ``file_size``-byte file (every rule of the format)."""
    n = len(raw)
    if not raw or raw[0] != 0x7B:
        raise InvalidHeaderError("must begin with '{'", field="header", offset=8)
    obj, end = decode_json(raw, 8, "header")
    tail = raw[end:]
    if tail.strip(b" "):
        bad = next(i for i, b in enumerate(tail) if b != 0x20)
        raise InvalidHeaderError("only spaces may follow the JSON object", field="header",
                                 offset=8 + end + bad)
    metadata: dict[str, str] | None = None
    entries: list[HeaderEntry] = []
    for name, v in obj.items():
        if name == METADATA:
            if v is None:
                continue
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise InvalidHeaderError("must be an object of strings", field=METADATA,
                                         offset=_key_offset(raw, METADATA))
            metadata = dict(v)
            continue
        e = _entry(name, v, raw)
        _check_size(e, raw)
        entries.append(e)
    data_len = file_size - 8 - n
    entries.sort(key=lambda e: (e.begin, e.end, e.name))
    pos = 0
    for e in entries:
        if e.end > data_len:
            raise TruncatedFileError(
                f"tensor data ends at {8 + n + e.end}, past the end of the {file_size}-byte file",
                field=f"{e.name}.data_offsets", offset=_key_offset(raw, e.name))
        if e.begin != pos:
            what = "a hole before it" if e.begin > pos else "it overlaps the previous tensor"
            raise InvalidOffsetsError(f"begins at {e.begin} but the data before it ends at "
                                      f"{pos}: {what}", field=f"{e.name}.data_offsets",
                                      offset=_key_offset(raw, e.name))
        pos = e.end
    if pos != data_len:
        raise InvalidOffsetsError(f"tensors cover {pos} bytes of data but the file holds "
                                  f"{data_len}", field="data", offset=8 + n + pos)
    return Header(n, metadata, tuple(entries))


# --- writing ------------------------------------------------------------------------------

def canonical_order(items: Iterable[tuple[str, DType]]) -> list[str]:
    """Names in the order ``safetensors`` writes them: by dtype group, then by name."""
    return [name for name, _d in sorted(items, key=lambda x: (_RANK[x[1]], x[0]))]


def encode_header(
    entries: Sequence[tuple[str, DType, tuple[int, ...], int]],
    metadata: Mapping[str, str] | None,
    *,
    alignment: int = 8,
) -> bytes:
    """The 8-byte length and the padded JSON for ``(name, dtype, shape, nbytes)`` in data order.

    The padding makes the data start on a multiple of ``alignment`` (8, or 4096 so that later
    merges and splits can clone on btrfs/XFS); the format allows any amount of it.
    """
    if alignment < 8 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two >= 8, got {alignment}")
    obj: dict[str, object] = {}
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"metadata keys and values must be str; not {bad[0]!r}")
        obj[METADATA] = dict(metadata)
    pos = 0
    for name, dtype, shape, n in entries:
        if name == METADATA:
            raise ValueError(f"{METADATA!r} is reserved and cannot name a tensor")
        if name in obj:
            raise ValueError(f"tensor name {name!r} appears twice")
        obj[name] = {"dtype": dtype.value, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a name or metadata string is not valid Unicode: {exc}") from None
    pad = -(8 + len(text)) % alignment
    return (len(text) + pad).to_bytes(8, "little") + text + b" " * pad


# --- sharding -----------------------------------------------------------------------------

def split_shards(
    sizes: Sequence[tuple[str, int]],
    max_shard_size: int,
    groups: Mapping[str, Hashable] | None = None,
) -> list[list[str]]:
    """Group names into shards the way ``huggingface_hub`` does (found by differential tests).

    In order: a tensor larger than the limit gets a shard of its own at once; the others fill
    the current shard until the next one would push it past the limit.  The current shard is
    appended last.  A name whose ``groups`` key (its storage) was already placed joins that
    shard without counting, after the shard's other names; ``huggingface_hub`` sees empty
    tensors with one storage pointer this way.
    """
    shards: list[list[str]] = []
    current: list[str] = []
    total = 0
    first: dict[Hashable, str] = {}
    later: dict[str, list[str]] = {}
    for name, n in sizes:
        key = None if groups is None else groups.get(name)
        if key is not None:
            if key in first:
                later.setdefault(first[key], []).append(name)
                continue
            first[key] = name
        if n > max_shard_size:
            shards.append([name])
            continue
        if total + n > max_shard_size:
            shards.append(current)
            current, total = [], 0
        current.append(name)
        total += n
    if current:
        shards.append(current)
    return [s + [x for n in s for x in later.get(n, [])] for s in shards if s]


def check_pattern(filename_pattern: str) -> None:
    """Refuse a pattern the checkpoint cannot be named by: without ``{suffix}``, or with a
    directory part (an index names its shards by bare file name, beside it; a shard in
    ``sub/`` or ``../`` would be written, and the index naming it would not load)."""
    if "{suffix}" not in filename_pattern:
        raise ValueError(f"filename_pattern must contain '{{suffix}}': {filename_pattern!r}")
    try:
        name = filename_pattern.format(suffix="")
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"filename_pattern may hold no braces but '{{suffix}}': "
                         f"{filename_pattern!r}") from None
    if "/" in filename_pattern or os.sep in filename_pattern:
        raise ValueError(f"filename_pattern must be a bare file name, without a directory part: "
                         f"{filename_pattern!r} (give the directory as the output instead)")
    if name in ("", ".", ".."):
        raise ValueError(f"filename_pattern {filename_pattern!r} names no file when the suffix "
                         "is empty (one shard): put a name around {suffix}")


def shard_names(filename_pattern: str, count: int) -> list[str]:
    """``model.safetensors`` for one shard, ``model-00001-of-00003.safetensors``... for more."""
    check_pattern(filename_pattern)
    if count == 1:
        return [filename_pattern.format(suffix="")]
    return [filename_pattern.format(suffix=f"-{i:05d}-of-{count:05d}") for i in range(1, count + 1)]


def encode_index(metadata: Mapping[str, object], weight_map: Mapping[str, str]) -> bytes:
    """``model.safetensors.index.json`` exactly as ``huggingface_hub`` writes it."""
    return json.dumps({"metadata": dict(metadata), "weight_map": dict(weight_map)},
                      indent=2).encode("utf-8")
