"""``merge_ptd``: one data file holding every key of several, data by reference.

Theory of operation
-------------------
The sources are data files on disk (read with ``read_ptd``: every segment a file-backed range)
or data files still held as Cords (``cord_entries``: every segment the very piece that holds
it).  Their keys go into one :class:`NamedDataStore` in source order, then file order, so equal
bytes are stored once (the store's rules: length, prefix, digest) and a key present twice must
hold equal bytes and an equal tensor layout, or :class:`NamedDataConflictError` names both
sources.  The result is built with ``build_ptd``; nothing is copied, so a merge of files costs
the size of their flatbuffers, whatever their data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from filecord._pieces.cord import Cord
from filecord.executorch._cordptd import cord_entries
from filecord.executorch.errors import NamedDataConflictError
from filecord.executorch.named_data import NamedDataStore
from filecord.executorch.ptd import build_ptd, read_ptd
from filecord.executorch.values import PtdEntry, TensorLayout

Source = str | os.PathLike[str] | Cord


def _entries(name: str, source: Source) -> list[PtdEntry]:
    if isinstance(source, Cord):
        return cord_entries(source, name)
    return list(read_ptd(source).entries.values())


def _named(sources: Sequence[Source] | Mapping[str, Cord]) -> list[tuple[str, Source]]:
    if isinstance(sources, Mapping):
        return [(f"tag {tag!r}", cord) for tag, cord in sources.items()]
    if isinstance(sources, (str, os.PathLike, Cord)):
        raise TypeError("merge_ptd takes a sequence of data files (paths or Cords), not one")
    return [
        (f"data file {i}" if isinstance(s, Cord) else repr(os.fspath(s)), s)
        for i, s in enumerate(sources)
    ]


def merge_ptd(
    sources: Sequence[Source] | Mapping[str, Cord],
    *,
    segment_alignment: int = 128,
    data_alignment: Mapping[str, int] | None = None,
) -> Cord:
    """One data file holding every key of ``sources``: paths of ``.ptd`` files, data files held
    as Cords, or a mapping tag -> Cord (a :class:`Program`'s ``data``; the tag names each in
    errors).  Data stays by reference; equal contents are stored once.

    A key in two sources with different bytes or layouts raises
    :class:`~filecord.executorch.errors.NamedDataConflictError`.  ``data_alignment`` (key ->
    alignment) raises a key's segment alignment to ``lcm(segment_alignment, alignment)``: the
    data files do not record what a backend asked for, the export does.
    """
    store = NamedDataStore()
    first: dict[str, tuple[str, TensorLayout | None]] = {}
    alignments = data_alignment or {}
    for name, source in _named(sources):
        for entry in _entries(name, source):
            seen = first.get(entry.key)
            if seen is not None and seen[1] != entry.layout:
                raise NamedDataConflictError(
                    f"merge: key {entry.key!r} has layout {seen[1]} in {seen[0]} and "
                    f"{entry.layout} in {name}"
                )
            try:
                store.add_named_data(
                    entry.key,
                    entry.data,
                    alignment=alignments.get(entry.key, 1),
                    tensor_layout=entry.layout,
                )
            except NamedDataConflictError as exc:
                raise NamedDataConflictError(
                    f"merge: key {entry.key!r} holds different bytes in {first[entry.key][0]} "
                    f"and in {name}; they cannot share one file"
                ) from exc
            first.setdefault(entry.key, (name, entry.layout))
    return build_ptd(store.entries(), segment_alignment=segment_alignment)
