"""Building safetensors files as Cords, and the sharded-checkpoint transaction.

Theory of operation
-------------------
A file is a Cord: the encoded header (bytes) followed by each tensor's data by reference
(in-memory views or file-backed ranges; adjacent ranges of one file are joined into one piece so
a plan lists runs, not thousands of tensors).  Nothing is written here: ``filecord.save`` /
``save_many`` do it atomically and durably (temp beside the target, fsync, rename, directory
fsync), moving owned ranges with ``consume=True``.

A sharded checkpoint is written as ONE ``save_many`` transaction: every shard and the index
change names together at the commit, so the old shards and a stale index are replaced only
then, never deleted first.  Files of the same pattern that the new checkpoint no longer uses
(``model.safetensors`` after a switch to shards, or the other way round, or surplus shards) are
removed after the commit and their directory fsynced; a crash in between leaves extra files
that nothing references, never a checkpoint that names missing shards.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Literal

from filecord._io import syscalls as _sys
from filecord._io.paths import is_planned
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord.errors import SaveError
from filecord.safetensors._format import (
    canonical_order,
    encode_header,
    encode_index,
    shard_names,
    split_shards,
)
from filecord.tensors import NamedTensor

log = logging.getLogger(__name__)

Order = Literal["canonical", "given", "clone_ready"]
CLONE_BLOCK = 4096  # the block of btrfs and XFS: a clone needs both offsets on a multiple of it


def _items(tensors: Iterable[NamedTensor] | Mapping[str, NamedTensor]) -> list[NamedTensor]:
    items = list(tensors.values()) if isinstance(tensors, Mapping) else list(tensors)
    seen: set[str] = set()
    for t in items:
        if t.name in seen:
            raise ValueError(f"tensor name {t.name!r} appears twice")
        seen.add(t.name)
    return items


def _join(pieces: list[FileBackedData], wholes: Sequence[FileBackedData]) -> list[FileBackedData]:
    """Adjacent ranges of one file become one range of its whole-file piece."""
    by_file = {(w.identity.dev, w.identity.ino): w for w in wholes if w.offset == 0}
    out: list[FileBackedData] = []
    for p in pieces:
        prev = out[-1] if out else None
        key = (p.identity.dev, p.identity.ino)
        whole = by_file.get(key)
        if (prev is not None and whole is not None and len(p)
                and (prev.identity.dev, prev.identity.ino) == key
                and prev.offset + len(prev) == p.offset):
            out[-1] = whole.slice(prev.offset, len(prev) + len(p))
        elif len(p):
            out.append(p)
    return out


def build_file(
    tensors: Iterable[NamedTensor] | Mapping[str, NamedTensor],
    metadata: Mapping[str, str] | None = None,
    *,
    alignment: int = 8,
    order: Order = "canonical",
    wholes: Sequence[FileBackedData] = (),
) -> Cord:
    """One safetensors file as a Cord holding the tensors' data by reference.

    ``order="canonical"`` lays tensors out as ``safetensors`` does (by dtype group, then name),
    which makes the file byte-identical to ``safetensors.torch.save_file`` of the same tensors
    and metadata; ``"given"`` keeps the iteration order.  ``alignment=4096`` pads the header so
    the data starts on a 4 KiB boundary (valid per the format; lets later saves clone).
    ``wholes``: whole-file pieces whose ranges may be joined when adjacent.

    ``order="clone_ready"`` (implies ``alignment=4096``) is as clone-friendly as the format
    allows.  Its data is contiguous (no gap may separate two tensors), so a tensor starts on a
    4 KiB boundary only if every tensor before it fills whole blocks: tensors whose byte length
    is a multiple of 4096 come first (canonical order among them), then the rest (canonical
    order), so every whole-block tensor and the first of the others start on a 4 KiB file
    offset.  Big weights are usually whole blocks (a dimension of 1024 in 4-byte floats is);
    the rest are biases and norms.  Readers take any order: offsets are in the header.
    """
    items = _items(tensors)
    if order in ("canonical", "clone_ready"):
        by_name = {t.name: t for t in items}
        items = [by_name[n] for n in canonical_order((t.name, t.dtype) for t in items)]
    if order == "clone_ready":
        alignment = max(alignment, CLONE_BLOCK)
        items = ([t for t in items if t.nbytes % CLONE_BLOCK == 0]
                 + [t for t in items if t.nbytes % CLONE_BLOCK])
    header = encode_header([(t.name, t.dtype, t.shape, t.nbytes) for t in items], metadata,
                           alignment=alignment)
    cord = Cord([header])
    run: list[FileBackedData] = []
    for t in items:
        if isinstance(t.data, FileBackedData):
            run.append(t.data)
            continue
        cord.extend(_join(run, wholes))
        run = []
        if len(t.data):
            cord.append(t.data)
    cord.extend(_join(run, wholes))
    return cord


def plan_shards(
    tensors: Sequence[NamedTensor],
    directory: str,
    *,
    max_shard_size: int,
    filename_pattern: str = "model{suffix}.safetensors",
    shard_metadata: Mapping[str, str] | None = None,
    single_metadata: Mapping[str, str] | None = None,
    index_metadata: Mapping[str, str] | None = None,
    alignment: int = 8,
    wholes: Sequence[FileBackedData] = (),
    storage: Mapping[str, Hashable] | None = None,
) -> dict[Target, CordLike]:
    """Every output of a sharded checkpoint (shards and, for several, the index) as Cords.

    Shards are grouped as ``huggingface_hub.split_torch_state_dict_into_shards`` groups them
    (in the order given); each shard is written in canonical order.  One shard gets
    ``single_metadata`` and no index; several get ``shard_metadata`` and an index whose
    metadata is ``{"total_size": ..., **index_metadata}``.  ``storage`` names each tensor's
    storage for the grouping rule of :func:`split_shards` (default: an empty file-backed tensor
    is identified by its file and offset, as a memory map would place it).
    """
    if max_shard_size < 1:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size}")
    by_name = {t.name: t for t in _items(tensors)}
    groups = split_shards([(t.name, t.nbytes) for t in tensors], max_shard_size,
                          {t.name: k for t in tensors if (k := storage_of(t)) is not None}
                          if storage is None else storage)
    names = shard_names(filename_pattern, len(groups))
    outputs: dict[Target, CordLike] = {}
    meta = single_metadata if len(groups) == 1 else shard_metadata
    weight_map: dict[str, str] = {}
    for name, group in zip(names, groups, strict=True):
        outputs[os.path.join(directory, name)] = build_file(
            [by_name[k] for k in group], meta, alignment=alignment, wholes=wholes)
        weight_map.update(dict.fromkeys(group, name))
    if len(groups) > 1:
        total = sum(t.nbytes for t in tensors)
        index = {"total_size": total, **(index_metadata or {})}
        outputs[os.path.join(directory, index_name(filename_pattern))] = Cord(
            [encode_index(index, weight_map)])
    return outputs


def storage_of(t: NamedTensor) -> Hashable | None:
    if t.nbytes or not isinstance(t.data, FileBackedData):
        return None
    return (t.data.identity.dev, t.data.identity.ino, t.data.offset)


def index_name(filename_pattern: str) -> str:
    return filename_pattern.format(suffix="") + ".index.json"


def stale_files(
    directory: str, filename_pattern: str, keep: Iterable[Target], protect: Iterable[str] = ()
) -> list[str]:
    """Files of this checkpoint pattern in ``directory`` that the new outputs do not replace.

    ``protect`` (the inputs of an operation that did not consume them) are never listed.
    """
    prefix, _, suffix = filename_pattern.partition("{suffix}")
    rx = re.compile(re.escape(prefix) + r"(-\d{5}-of-\d{5})?" + re.escape(suffix)
                    + r"(\.index\.json)?")
    if is_planned(directory):  # a dry run's directory, created by the real run: empty
        return []
    try:
        names = _sys.listdir(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else "is not a directory"
        raise SaveError(f"cannot save shards into {directory}: it {why}; nothing was written",
                        errno=exc.errno) from None
    kept = file_ids([*keep, *protect])
    out = []
    for name in sorted(names):
        path = os.path.join(directory, name)
        if rx.fullmatch(name) and not (file_ids([path]) & kept):
            out.append(path)
    return out


def file_ids(paths: Iterable[Target]) -> set[tuple[int, int] | str]:
    """Identities of paths: (dev, ino) of the file each names (symlinks followed), and the
    absolute path itself (so a name that does not exist yet still matches)."""
    ids: set[tuple[int, int] | str] = set()
    for p in paths:
        ids.add(_sys.abspath(os.fspath(p)))
        try:
            st = _sys.stat(os.fspath(p))
        except FileNotFoundError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids


def remove_files(paths: Sequence[str]) -> None:
    """Unlink (missing is fine) and fsync the directories: used after a commit only."""
    for p in paths:
        log.info("removing %s: the new checkpoint no longer uses it", p)
        _sys.unlink_missing_ok(p)  # a consumed input may already be gone
    if paths:
        _sys.fsync_parents(list(paths))
