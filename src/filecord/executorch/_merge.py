"""``merge`` (save) and ``merge_ptd`` (build): one data file holding every key of several,
data by reference.

Theory of operation
-------------------
The sources are data files on disk (read with ``read_ptd``: every segment a file-backed range)
or data files still held as Cords (``cord_entries``: every segment the very piece that holds
it).  Their keys go into one :class:`NamedDataStore` in source order, then file order, so equal
bytes are stored once (the store's rules: length, prefix, digest) and a key present twice must
hold equal bytes and an equal tensor layout, or :class:`NamedDataConflictError` names both
sources.  The result is built with ``build_ptd``; nothing is copied, so a merge of files costs
the size of their flatbuffers, whatever their data.

``merge(output, inputs)`` is the operation every format has: it runs on the kit's skeleton
(inputs -> plan -> dry run or save -> remove only what the save consumed), reading each input
as one whole-file piece (owned with ``consume=True``, so the save moves the entries' bytes and
deletes the inputs at its commit; a symlinked, read-only, immutable or hard-linked input is
copied and kept, and the report's ``kept`` says why).  ``merge_ptd`` is its builder: the Cord,
unsaved, from paths or Cords.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from filecord._kit.argorder import input_paths, not_an_input, output_path, require_suffix
from filecord._kit.operation import (
    Inputs,
    Job,
    OperationReport,
    Paths,
    ProgressCallback,
    operate,
)
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.window import DEFAULT_WINDOW
from filecord.executorch._cordptd import cord_entries
from filecord.executorch.errors import NamedDataConflictError
from filecord.executorch.named_data import NamedDataStore
from filecord.executorch.ptd import PtdFile, build_ptd, read_ptd
from filecord.executorch.values import PtdEntry, TensorLayout

Source = str | os.PathLike[str] | Cord
MERGE = "filecord.executorch.merge(output, inputs)"


def _entries(name: str, source: Source | list[PtdEntry]) -> list[PtdEntry]:
    if isinstance(source, list):
        return source
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
    return _merged(_named(sources), segment_alignment=segment_alignment,
                   data_alignment=data_alignment)


def _merged(named: Sequence[tuple[str, Source | list[PtdEntry]]], *, segment_alignment: int,
            data_alignment: Mapping[str, int] | None) -> Cord:
    store = NamedDataStore()
    first: dict[str, tuple[str, TensorLayout | None]] = {}
    alignments = data_alignment or {}
    for name, source in named:
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


def _owned_entries(ptd: PtdFile, whole: FileBackedData) -> list[PtdEntry]:
    """``ptd``'s entries with their data as ranges of ``whole`` (entries sharing a segment
    share one range), so a consuming save can move them out of the one owned piece."""
    ranges: dict[int, FileBackedData] = {}
    out = []
    for e in ptd.entries.values():
        data = e.data
        if not isinstance(data, FileBackedData):  # pragma: no cover - read_ptd makes ranges
            raise TypeError(f"{e.key}: expected file-backed data")
        piece = ranges.setdefault(id(data), whole.slice(data.offset, len(data)))
        out.append(dataclasses.replace(e, data=piece))
    return out


def merge(
    output: str | os.PathLike[str],
    inputs: Paths,
    *,
    consume: bool = False,
    segment_alignment: int = 128,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> OperationReport:
    """Save one ``.ptd`` holding every key of the ``.ptd`` files ``inputs`` (data by reference:
    copied, or with ``consume=True`` moved, never loaded).

    A key in two inputs with different bytes or layouts raises
    :class:`~filecord.executorch.errors.NamedDataConflictError` before anything is written.
    ``dry_run=True`` returns the plan and writes nothing.  The output comes first and must end
    in ``.ptd``; a call in the old order (inputs first) is refused before anything is read.
    """
    out = output_path("merge", MERGE, output)
    paths = input_paths("merge", MERGE, inputs)
    require_suffix("merge", MERGE, out, (".ptd",))
    not_an_input("merge", out, paths, consume=consume)

    def read() -> Inputs[list[tuple[str, list[PtdEntry]]]]:
        wholes: list[FileBackedData] = []
        named: list[tuple[str, list[PtdEntry]]] = []
        try:
            for p in paths:
                ptd = read_ptd(p)
                whole = FileBackedData(p, owned=consume)
                wholes.append(whole)
                named.append((repr(p), _owned_entries(ptd, whole)))
        except BaseException:
            for w in wholes:
                w.detach_cleanup()  # a failed read must never delete the user's file
            raise
        return Inputs(named, tuple(wholes))

    def build(named: list[tuple[str, list[PtdEntry]]]) -> Job:
        return Job({out: _merged(named, segment_alignment=segment_alignment,
                                 data_alignment=None)})

    return operate(read, build, consume=consume, dry_run=dry_run, window=window,
                   progress=progress)
