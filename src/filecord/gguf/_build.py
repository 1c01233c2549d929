"""GGUF files and split sets as Cords: the header as bytes, each tensor's data by reference.

Nothing is written here: ``filecord.save``/``save_many`` write atomically and durably, moving
owned ranges with ``consume=True``.  A tensor read from a GGUF file brings as much of its own
padding along as the output needs (the bytes that follow it in its file, which every writer
fills with zeros; zero bytes make up the rest), so when the output's alignment is at least the
source's, the ranges of one source run without gaps and a consuming save moves them all.
Adjacent ranges of one file are joined so a plan lists runs, not thousands of tensors.
Everything else is padded with zero bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Union

from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord.gguf._encode import (
    alignment_of,
    encode_header,
    plan_splits,
    shard_name,
    split_keys,
)
from filecord.gguf._read import GGUFFile
from filecord.gguf._types import ALIGNMENT_KEY, SPLIT_KEYS, GGUFTensor, KeyValue, ValueType, pad
from filecord.gguf.errors import DuplicateTensorError

KVs = Union[Mapping[str, KeyValue], Iterable[KeyValue]]  # noqa: UP007 - runtime alias on 3.10
Piece = Union[FileBackedData, FileRows, Derived, bytes, memoryview]  # noqa: UP007


def kv_list(kvs: KVs, alignment: int | None = None) -> list[KeyValue]:
    """The key-values in order; ``alignment`` replaces ``general.alignment`` in place (or
    appends it).  A key given twice keeps its first position with its last value."""
    items = list(kvs.values()) if isinstance(kvs, Mapping) else list(kvs)
    out: dict[str, KeyValue] = {}
    for kv in items:
        out[kv.key] = kv
    if alignment is not None:
        out[ALIGNMENT_KEY] = KeyValue(ALIGNMENT_KEY, ValueType.UINT32, alignment)
    return list(out.values())


def _own_padding(t: GGUFTensor, alignment: int, sources: Sequence[GGUFFile]
                 ) -> tuple[FileBackedData, int] | None:
    """The tensor's range extended over the padding that follows it in its GGUF file (as much
    of it as the output needs; zeros make up the rest), for a range that is one of that
    file's tensors."""
    data = t.data
    if not isinstance(data, FileBackedData):
        return None
    for f in sources:
        if f.whole.identity != data.identity:
            continue
        own = f.tensors.get(t.name)
        mine = own.data if own is not None else None
        if not isinstance(mine, FileBackedData) or (mine.offset, len(mine)) != (data.offset,
                                                                              len(data)):
            continue
        n = len(data)
        room = min(pad(n, alignment), pad(n, f.alignment), f.file_size - data.offset)
        return f.whole.slice(data.offset, room), pad(n, alignment) - room
    return None


def _joined(pieces: list[Piece], wholes: Sequence[FileBackedData]
            ) -> list[Piece]:
    by_file = {(w.identity.dev, w.identity.ino): w for w in wholes if w.offset == 0}
    out: list[Piece] = []
    for p in pieces:
        if not len(p):
            continue
        prev = out[-1] if out else None
        if isinstance(p, FileBackedData) and isinstance(prev, FileBackedData):
            whole = by_file.get((p.identity.dev, p.identity.ino))
            if (whole is not None and prev.identity == p.identity
                    and prev.offset + len(prev) == p.offset):
                out[-1] = whole.slice(prev.offset, len(prev) + len(p))
                continue
        if (isinstance(p, bytes) and isinstance(prev, bytes) and len(p) + len(prev) <= 1 << 16
                and not any(p) and not any(prev)):
            out[-1] = prev + p
            continue
        out.append(p)
    return out


def build_gguf(
    kvs: KVs,
    tensors: Iterable[GGUFTensor],
    *,
    alignment: int | None = None,
    sources: Sequence[GGUFFile] = (),
) -> Cord:
    """One GGUF file as a Cord, byte-identical to gguf-py's ``GGUFWriter`` given the same
    key-values and tensors in the same order.

    ``alignment`` sets ``general.alignment`` (in place, or appended); 4096 puts every tensor on
    a page boundary so later saves can clone.  ``sources``: GGUF files the tensors may come
    from, whose padding may travel with them (see the module notes).
    """
    kv = kv_list(kvs, alignment)
    align = alignment_of(kv)
    items = list(tensors)
    header = encode_header(kv, [(t.name, t.type, t.dims, t.nbytes) for t in items])
    pieces: list[Piece] = []
    for t in items:
        own = _own_padding(t, align, sources)
        if own is not None:
            pieces.append(own[0])
            pieces.append(bytes(own[1]))
            continue
        if isinstance(t.data, Cord):
            pieces.extend(t.data.pieces)
        else:
            pieces.append(t.data)
        pieces.append(bytes(pad(t.nbytes, align) - t.nbytes))
    cord = Cord([header])
    cord.extend(_joined(pieces, [f.whole for f in sources]))
    return cord


def build_split(
    kvs: KVs,
    tensors: Sequence[GGUFTensor],
    path: str | os.PathLike[str],
    *,
    max_tensors: int = 0,
    max_size: int = 0,
    small_first_shard: bool = False,
    alignment: int | None = None,
    sources: Sequence[GGUFFile] = (),
) -> dict[str, Cord]:
    """Every file of a model as Cords, split as gguf-py splits (see :func:`plan_splits`).

    One shard: ``path`` itself, without split keys.  Several: ``<stem>-00001-of-0000N.gguf``
    beside ``path`` (``stem`` is ``path`` without ``.gguf``); the first holds every key-value
    plus the split keys, the others only the split keys.  Existing ``split.*`` keys are
    dropped first.
    """
    names = [t.name for t in tensors]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise DuplicateTensorError(f"tensor name {dup!r} appears twice")
    kv = [x for x in kv_list(kvs, alignment) if x.key not in SPLIT_KEYS]
    groups = plan_splits([t.nbytes for t in tensors], max_tensors=max_tensors,
                         max_size=max_size, small_first_shard=small_first_shard)
    p = os.fspath(path)
    if len(groups) == 1:
        return {p: build_gguf(kv, tensors, sources=sources)}
    stem = p[:-5] if p.endswith(".gguf") else p
    align = [x for x in kv if x.key == ALIGNMENT_KEY]
    out: dict[str, Cord] = {}
    for no, group in enumerate(groups):
        keys = (kv if no == 0 else align) + split_keys(no, len(groups), len(tensors))
        out[shard_name(stem, no, len(groups))] = build_gguf(
            keys, [tensors[i] for i in group], sources=sources)
    return out
