"""The GGUF header, pure: a prefix of the file in, validated key-values and tensor records out.

Byte map (v3, little-endian): ``GGUF``; u32 version; u64 tensor count; u64 key-value count;
the key-values (string key, u32 type, value); the tensor records (string name, u32 n_dims,
n_dims u64 dims in ggml order, u32 ggml type, u64 offset relative to the data); zeros up to the
alignment; the data, each tensor followed by zeros up to the alignment.  A string is a u64
length and UTF-8 bytes; an array a u32 element type, a u64 count and the elements.

Rules (each one ggml's loader enforces, some stricter; every violation raises one
:class:`~filecord.gguf.errors.GGUFFormatError` subclass naming the field and offset):
version 2 or 3; counts fit in an i64 and in the bytes left; keys non-empty, UTF-8, unique;
known value types; no array of arrays; strings at most 1 GiB, arrays at most 2^30 elements, both
inside the file; bools 0 or 1 (stricter); ``general.alignment`` a u32 non-zero power of two;
tensor names UTF-8, unique, under 64 bytes; at most 4 dims, each below 2^63, no element or byte
count overflow; a known type whose ``ne0`` is whole blocks; each offset equal to the running
sum of the padded sizes before it; every tensor's bytes inside the file; nothing after the
padded end of the last tensor (stricter).

Work is bounded by the bytes given: every count is checked against the bytes left before a loop
or an allocation.  When the prefix ends before the header does, :class:`NeedMore` says how far
to read; the entry point reads more (never past the file) and parses again.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from filecord.gguf._types import (
    ALIGNMENT_KEY,
    BLOCKS,
    DEFAULT_ALIGNMENT,
    I64_MAX,
    MAX_ARRAY,
    MAX_DIMS,
    MAX_NAME,
    MAX_STRING,
    SCALAR_FORMATS,
    SCALAR_SIZES,
    GGMLType,
    KeyValue,
    Scalar,
    Value,
    ValueType,
    pad,
    tensor_nbytes,
)
from filecord.gguf.errors import (
    BadMagicError,
    GGUFFormatError,
    InvalidAlignmentError,
    InvalidKeyError,
    InvalidOffsetsError,
    InvalidTensorInfoError,
    InvalidValueError,
    LimitExceededError,
    TrailingDataError,
    TruncatedError,
    UnsupportedVersionError,
)

MAGIC = b"GGUF"
_MIN_KV = 8 + 1 + 4 + 1  # key length, one key byte, type, the smallest value
_MIN_TI = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


class NeedMore(Exception):
    """The header runs past the prefix given; parse again with at least ``end`` bytes."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor record: ``offset`` is relative to the data start, ``at`` is where the record
    begins in the file."""

    name: str
    type: GGMLType
    dims: tuple[int, ...]
    offset: int
    nbytes: int
    at: int


@dataclass(frozen=True, slots=True)
class Header:
    """A validated header of a ``file_size``-byte file (``kvs`` read-only, in file order)."""

    version: int
    kvs: Mapping[str, KeyValue]
    infos: tuple[TensorInfo, ...]
    alignment: int
    info_end: int  # where the tensor records end
    data_start: int  # info_end padded to the alignment

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        object.__setattr__(self, "kvs", MappingProxyType(dict(self.kvs)))


class _Cursor:
    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf: bytes | memoryview, file_size: int) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.size = file_size

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if end > self.size:
            raise TruncatedError(f"needs {n} bytes but the {self.size}-byte file ends first",
                                 field=what, offset=self.pos)
        if end > len(self.buf):
            raise NeedMore(end)
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "little")

    def u64(self, what: str) -> int:
        return int.from_bytes(self.take(8, what), "little")

    def string(self, what: str, *, strict: bool,
               error: type[GGUFFormatError] = InvalidKeyError) -> str:
        at = self.pos
        n = self.u64(f"{what} length")
        if n > MAX_STRING:
            raise LimitExceededError(f"a string of {n} bytes is above ggml's limit of "
                                     f"{MAX_STRING}", field=what, offset=at)
        raw = bytes(self.take(n, what))
        try:
            return raw.decode("utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError as exc:
            raise error(f"not UTF-8 ({exc.reason})", field=what,
                        offset=at + 8 + exc.start) from None


def _vtype(code: int, what: str, at: int) -> ValueType:
    try:
        return ValueType(code)
    except ValueError:
        raise InvalidValueError(f"unknown value type {code}", field=what, offset=at) from None


def _bools_ok(raw: memoryview, what: str, at: int) -> None:
    if raw and max(raw) > 1:
        bad = next(i for i, v in enumerate(raw) if v > 1)
        raise InvalidValueError(f"a bool must be 0 or 1, not {raw[bad]}", field=what,
                                offset=at + bad)


def _scalar(cur: _Cursor, t: ValueType, what: str) -> Scalar:
    at = cur.pos
    raw = cur.take(SCALAR_SIZES[t], what)
    if t is ValueType.BOOL:
        _bools_ok(raw, what, at)
        return bool(raw[0])
    value: Scalar = struct.unpack("<" + SCALAR_FORMATS[t], raw)[0]
    return value


def _array(cur: _Cursor, t: ValueType, count: int, what: str) -> array.array[Any]:
    """``count`` elements kept packed (one machine value each: memory is the file's bytes)."""
    at = cur.pos
    raw = cur.take(count * SCALAR_SIZES[t], what)
    if t is ValueType.BOOL:
        _bools_ok(raw, what, at)
    out = array.array(SCALAR_FORMATS[t])
    out.frombytes(raw)
    if sys.byteorder == "big":  # pragma: no cover - little-endian hosts only here
        out.byteswap()
    return out


def _value(cur: _Cursor, t: ValueType, what: str) -> tuple[Value, ValueType | None]:
    if t is ValueType.STRING:
        return cur.string(what, strict=False), None
    if t is not ValueType.ARRAY:
        return _scalar(cur, t, what), None
    at = cur.pos
    sub = _vtype(cur.u32(f"{what} element type"), f"{what} element type", at)
    if sub is ValueType.ARRAY:
        raise InvalidValueError("an array of arrays (ggml's loader refuses them)",
                                field=f"{what} element type", offset=at)
    n_at = cur.pos
    count = cur.u64(f"{what} count")
    if count > MAX_ARRAY:
        raise LimitExceededError(f"{count} elements is above ggml's limit of {MAX_ARRAY}",
                                 field=f"{what} count", offset=n_at)
    least = 8 if sub is ValueType.STRING else SCALAR_SIZES[sub]
    if count * least > cur.left:
        raise TruncatedError(f"{count} elements need at least {count * least} bytes, "
                             f"{cur.left} are left", field=f"{what} count", offset=n_at)
    if sub is ValueType.STRING:
        return tuple(cur.string(f"{what}[{i}]", strict=False) for i in range(count)), sub
    return _array(cur, sub, count, what), sub


def _count(cur: _Cursor, what: str, least: int) -> int:
    at = cur.pos
    n = cur.u64(what)
    if n > I64_MAX:
        raise LimitExceededError(f"{n} does not fit in an i64", field=what, offset=at)
    if n * least > cur.left:
        raise TruncatedError(f"{n} records need at least {n * least} bytes, {cur.left} are "
                             f"left", field=what, offset=at)
    return n


def _kvs(cur: _Cursor, n_kv: int) -> dict[str, KeyValue]:
    kvs: dict[str, KeyValue] = {}
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"kv[{i}].key", strict=True)
        if not key:
            raise InvalidKeyError("empty key", field=f"kv[{i}].key", offset=start)
        if key in kvs:
            raise InvalidKeyError(f"key {key!r} appears twice", field=f"kv[{i}].key",
                                  offset=start)
        t_at = cur.pos
        t = _vtype(cur.u32(f"{key!r} type"), f"{key!r} type", t_at)
        value, sub = _value(cur, t, repr(key))
        kvs[key] = KeyValue(key, t, value, sub, encoded=bytes(cur.buf[start:cur.pos]))
    return kvs


def _alignment(kvs: dict[str, KeyValue]) -> int:
    kv = kvs.get(ALIGNMENT_KEY)
    if kv is None:
        return DEFAULT_ALIGNMENT
    a = kv.value
    if kv.type is not ValueType.UINT32 or not isinstance(a, int) or a <= 0 or a & (a - 1):
        raise InvalidAlignmentError(f"must be a u32 non-zero power of two, not {kv.type.name} "
                                    f"{a!r}", field=ALIGNMENT_KEY, offset=None)
    return a


def _info(cur: _Cursor, i: int, names: set[str]) -> TensorInfo:
    at = cur.pos
    name = cur.string(f"tensor[{i}].name", strict=True, error=InvalidTensorInfoError)
    what = f"tensor {name!r}"
    if len(name.encode("utf-8")) >= MAX_NAME:
        raise InvalidTensorInfoError(f"a name of {len(name.encode())} bytes; ggml allows at "
                                     f"most {MAX_NAME - 1}", field=f"{what}.name", offset=at)
    if name in names:
        raise InvalidTensorInfoError("the name appears twice", field=f"{what}.name", offset=at)
    names.add(name)
    n_at = cur.pos
    n_dims = cur.u32(f"{what}.n_dims")
    if n_dims > MAX_DIMS:
        raise InvalidTensorInfoError(f"{n_dims} dims; ggml allows at most {MAX_DIMS}",
                                     field=f"{what}.n_dims", offset=n_at)
    dims = tuple(cur.u64(f"{what}.dims") for _ in range(n_dims))
    if any(d > I64_MAX for d in dims):
        raise InvalidTensorInfoError(f"dims {list(dims)} do not fit in an i64",
                                     field=f"{what}.dims", offset=n_at + 4)
    t_at = cur.pos
    code = cur.u32(f"{what}.type")
    try:
        t = GGMLType(code)
    except ValueError:
        raise InvalidTensorInfoError(f"unknown or retired ggml type {code}",
                                     field=f"{what}.type", offset=t_at) from None
    blck = BLOCKS[t][0]
    ne = [*dims, 1, 1, 1, 1][:4]
    if ne[0] % blck:
        raise InvalidTensorInfoError(f"ne0={ne[0]} is not a multiple of the {t.name} block "
                                     f"size {blck}", field=f"{what}.dims", offset=n_at + 4)
    numel = 1
    for d in ne:
        numel *= d
    nbytes = tensor_nbytes(t, dims)
    if numel > I64_MAX or nbytes > I64_MAX:
        raise InvalidTensorInfoError(f"{list(dims)} overflows an i64 count",
                                     field=f"{what}.dims", offset=n_at + 4)
    offset = cur.u64(f"{what}.offset")
    return TensorInfo(name, t, dims, offset, nbytes, at)


def parse_header(buf: bytes | memoryview, file_size: int) -> Header:
    """Validate the header held in ``buf`` (a prefix of a ``file_size``-byte file)."""
    cur = _Cursor(buf, file_size)
    if bytes(cur.take(4, "magic")) != MAGIC:
        raise BadMagicError(f"{bytes(cur.buf[:4])!r} is not b'GGUF'", field="magic", offset=0)
    version = cur.u32("version")
    if version not in (2, 3):
        why = ("the file is big-endian (or from another machine)" if version & 0xFFFF == 0
               else "filecord reads versions 2 and 3")
        raise UnsupportedVersionError(f"version {version}: {why}", field="version", offset=4)
    n_tensors = _count(cur, "tensor_count", 0)
    n_kv = _count(cur, "kv_count", _MIN_KV)
    if n_tensors * _MIN_TI > cur.left:
        raise TruncatedError(f"{n_tensors} tensor records need at least {n_tensors * _MIN_TI} "
                             f"bytes, {cur.left} are left", field="tensor_count", offset=8)
    kvs = _kvs(cur, n_kv)
    alignment = _alignment(kvs)
    names: set[str] = set()
    infos = tuple(_info(cur, i, names) for i in range(n_tensors))
    info_end = cur.pos
    data_start = pad(info_end, alignment)
    _check_data(infos, alignment, info_end, data_start, file_size)
    return Header(version, kvs, infos, alignment, info_end, data_start)


def _check_data(infos: tuple[TensorInfo, ...], alignment: int, info_end: int, data_start: int,
                file_size: int) -> None:
    pos = 0
    for t in infos:
        if t.offset != pos:
            what = ("a gap before it" if t.offset > pos
                    else "it overlaps or reorders the tensors before it")
            raise InvalidOffsetsError(
                f"offset {t.offset}, but the padded tensors before it end at {pos}: {what}",
                field=f"tensor {t.name!r}.offset", offset=t.at)
        if data_start + t.offset + t.nbytes > file_size:
            raise TruncatedError(
                f"data ends at {data_start + t.offset + t.nbytes}, past the end of the "
                f"{file_size}-byte file", field=f"tensor {t.name!r}.offset", offset=t.at)
        pos += pad(t.nbytes, alignment)
    end = data_start + pos
    least = info_end if not infos else data_start + infos[-1].offset + infos[-1].nbytes
    if not least <= file_size <= end:
        raise TrailingDataError(f"{file_size - end} bytes after the padded end of the data "
                                f"at {end}", field="data", offset=end)
