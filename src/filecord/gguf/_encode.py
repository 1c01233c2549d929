"""GGUF bytes from values, pure: key-values, tensor records, the padded header, split plans.

The layout is gguf-py 0.19's ``GGUFWriter`` layout, found by differential tests against the
installed package (see tests/gguf/test_gguf_writer.py): version 3; key-values in the order given;
tensor records in the order given with dims in ggml order and offsets the running sums of the
padded sizes; zeros up to the alignment after the records (also with no tensors) and after
every tensor.  Where gguf-py writes something ggml's loader refuses (an empty key, an array of
arrays, more than 4 dims, a name of 64 bytes or more) the encoder raises instead.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Iterable, Sequence

from filecord.gguf._parse import MAGIC
from filecord.gguf._types import (
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    MAX_DIMS,
    MAX_NAME,
    SCALAR_FORMATS,
    SPLIT_COUNT,
    SPLIT_NO,
    SPLIT_TENSORS,
    GGMLType,
    KeyValue,
    ValueType,
    pad,
)

VERSION = 3


def _string(s: str | bytes) -> bytes:
    raw = s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")
    return len(raw).to_bytes(8, "little") + raw


def _scalar(t: ValueType, v: object, key: str) -> bytes:
    if t is ValueType.STRING:
        if not isinstance(v, (str, bytes)):
            raise TypeError(f"{key!r}: a STRING value must be str or bytes, not "
                            f"{type(v).__name__}")
        return _string(v)
    try:
        return struct.pack("<" + SCALAR_FORMATS[t], bool(v) if t is ValueType.BOOL else v)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"{key!r}: {v!r} is not a {t.name} ({exc})") from None


def encode_value(kv: KeyValue) -> bytes:
    """The value of ``kv`` as stored after its type code."""
    if kv.type is not ValueType.ARRAY:
        return _scalar(kv.type, kv.value, kv.key)
    sub = kv.sub_type
    if sub is None or sub is ValueType.ARRAY:
        raise ValueError(f"{kv.key!r}: an array needs a non-array element type (ggml's loader "
                         f"refuses arrays of arrays)")
    items = kv.value
    if not isinstance(items, (tuple, list, bytes, array.array)):
        raise TypeError(f"{kv.key!r}: an array value must be a sequence")
    if (isinstance(items, array.array) and sub is not ValueType.STRING
            and items.typecode == SCALAR_FORMATS[sub] and sys.byteorder == "little"):
        body = items.tobytes()  # exactly the bytes read (NaN payloads too)
    else:
        body = b"".join(_scalar(sub, x, kv.key) for x in items)
    return sub.to_bytes(4, "little") + len(items).to_bytes(8, "little") + body


def encode_kv(kv: KeyValue) -> bytes:
    """One key-value record (the reader's exact bytes when it has them)."""
    if kv.encoded is not None:
        return kv.encoded
    if not kv.key:
        raise ValueError("an empty key (ggml's loader refuses it)")
    return _string(kv.key) + kv.type.to_bytes(4, "little") + encode_value(kv)


def alignment_of(kvs: Iterable[KeyValue]) -> int:
    for kv in kvs:
        if kv.key == ALIGNMENT_KEY:
            a = kv.value
            if (kv.type is not ValueType.UINT32 or not isinstance(a, int) or a <= 0
                    or a & (a - 1)):
                raise ValueError(f"{ALIGNMENT_KEY} must be a u32 power of two, not {a!r}")
            return a
    return DEFAULT_ALIGNMENT


def check_name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) >= MAX_NAME:
        raise ValueError(f"tensor name {name!r} has {len(raw)} bytes; llama.cpp loads at most "
                         f"{MAX_NAME - 1}")
    return raw


def encode_header(
    kvs: Sequence[KeyValue], infos: Sequence[tuple[str, GGMLType, tuple[int, ...], int]]
) -> bytes:
    """Magic to the start of the data: ``infos`` are ``(name, type, dims, nbytes)`` in data
    order; the alignment is ``general.alignment`` when present, else 32."""
    alignment = alignment_of(kvs)
    keys = [kv.key for kv in kvs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    out = [MAGIC, VERSION.to_bytes(4, "little"), len(infos).to_bytes(8, "little"),
           len(kvs).to_bytes(8, "little")]
    out.extend(encode_kv(kv) for kv in kvs)
    offset = 0
    seen: set[str] = set()
    for name, t, dims, nbytes in infos:
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice")
        seen.add(name)
        if len(dims) > MAX_DIMS:
            raise ValueError(f"{name!r}: {len(dims)} dims; llama.cpp loads at most {MAX_DIMS}")
        out.append(_string(check_name(name).decode()))
        out.append(len(dims).to_bytes(4, "little"))
        out.extend(d.to_bytes(8, "little") for d in dims)
        out.append(int(t).to_bytes(4, "little"))
        out.append(offset.to_bytes(8, "little"))
        offset += pad(nbytes, alignment)
    head = b"".join(out)
    return head + bytes(pad(len(head), alignment) - len(head))


def split_keys(no: int, count: int, total: int) -> list[KeyValue]:
    """The three keys every shard of a split set carries, appended after the others."""
    return [KeyValue(SPLIT_NO, ValueType.UINT16, no),
            KeyValue(SPLIT_COUNT, ValueType.UINT16, count),
            KeyValue(SPLIT_TENSORS, ValueType.INT32, total)]


def plan_splits(sizes: Sequence[int], *, max_tensors: int = 0, max_size: int = 0,
                small_first_shard: bool = False) -> list[list[int]]:
    """Tensor indexes per shard, as gguf-py groups them: a new shard starts when the current
    one has a tensor and adding the next would pass ``max_tensors`` or ``max_size`` (unpadded
    bytes; 0 means no limit).  ``small_first_shard`` gives the first shard no tensors."""
    shards: list[list[int]] = [[]] if small_first_shard else []
    current: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if current and ((max_tensors and len(current) + 1 > max_tensors)
                        or (max_size and total + n > max_size)):
            shards.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current or not shards:
        shards.append(current)
    return shards


def shard_name(stem: str, no: int, count: int) -> str:
    """``gguf-split``'s names: ``<stem>-00001-of-00003.gguf``, numbered from 1."""
    return f"{stem}-{no + 1:05d}-of-{count:05d}.gguf"
