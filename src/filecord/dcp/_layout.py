"""Chunks of a distributed state dict -> one safetensors layout, pure (no torch, no I/O).

A distributed save describes every tensor as boxes: per rank, the ``offsets`` and ``sizes`` of
the part it holds, in the coordinates of the tensor's global ``shape``.  Before a byte is
written the coordinator proves, here, that the boxes of each tensor tile it exactly (inside its
bounds, no two overlapping, their volumes adding up to the whole) and that every rank agrees on
its dtype and shape: a custom planner can skip torch's own checks, and torch checks the volume
only when there is more than one plan.

The layout is the one ``filecord.safetensors.save_file`` (and ``save_sharded``) writes for the
full state dict: canonical tensor order, the same header bytes, the same shard grouping, names
and index.  A box of a row-major tensor is a set of *runs* (contiguous byte ranges of the file):
with ``k`` the first dimension after which the box spans every dimension fully, each run covers
dimension ``k`` from ``offsets[k]`` for ``sizes[k]`` rows, and there is one run per index of the
dimensions before ``k`` (one run for a dim-0 shard, one per row for a column shard).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from filecord.dcp.errors import TilingError
from filecord.safetensors._format import (
    canonical_order,
    encode_header,
    encode_index,
    shard_names,
    split_shards,
)
from filecord.tensors import DType


@dataclass(frozen=True, slots=True)
class Box:
    """One rank's part of one tensor."""

    fqn: str
    rank: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def volume(self) -> int:
        return math.prod(self.sizes)


@dataclass(frozen=True, slots=True)
class Spec:
    """A tensor as the state dict declares it: global shape and dtype."""

    fqn: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.bits // 8


@dataclass(frozen=True, slots=True)
class FileLayout:
    """One output file: its name (relative to the directory), header, and tensor offsets
    (absolute file offsets of each tensor's first byte)."""

    name: str
    header: bytes
    offsets: Mapping[str, int]
    size: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Every output file, the index (for several shards), and where each tensor lives."""

    files: tuple[FileLayout, ...]
    index: tuple[str, bytes] | None
    where: Mapping[str, tuple[int, int]]  # fqn -> (file number, absolute offset)


def merge_specs(declared: Sequence[Spec]) -> dict[str, Spec]:
    """One spec per tensor; every rank must declare the same dtype and shape."""
    out: dict[str, Spec] = {}
    for s in declared:
        was = out.setdefault(s.fqn, s)
        if was != s:
            raise TilingError(f"{s.fqn!r}: ranks disagree on the tensor: {was.dtype.value}"
                              f"{list(was.shape)} and {s.dtype.value}{list(s.shape)}")
    return out


def check_tiling(specs: Mapping[str, Spec], boxes: Sequence[Box]) -> None:
    """Raise :class:`TilingError` unless each tensor's boxes tile it exactly."""
    by_fqn: dict[str, list[Box]] = {}
    for b in boxes:
        spec = specs.get(b.fqn)
        if spec is None:
            raise TilingError(f"{b.fqn!r}: a chunk of a tensor no rank declared")
        n = len(spec.shape)
        if len(b.offsets) != n or len(b.sizes) != n:
            raise TilingError(f"{b.fqn!r}: rank {b.rank}'s chunk has {len(b.offsets)} "
                              f"dimensions, the tensor {n}")
        for d, (o, s, full) in enumerate(zip(b.offsets, b.sizes, spec.shape, strict=True)):
            if o < 0 or s < 0 or o + s > full:
                raise TilingError(f"{b.fqn!r}: rank {b.rank}'s chunk [{o}, {o + s}) of "
                                  f"dimension {d} is outside the shape {list(spec.shape)}")
        by_fqn.setdefault(b.fqn, []).append(b)
    for fqn, spec in specs.items():
        got = [b for b in by_fqn.get(fqn, []) if b.volume]
        for a, b in itertools.combinations(got, 2):
            if all(x < y + t and y < x + s for x, s, y, t in
                   zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)):
                raise TilingError(f"{fqn!r}: the chunks of rank {a.rank} (offsets "
                                  f"{list(a.offsets)}) and rank {b.rank} (offsets "
                                  f"{list(b.offsets)}) overlap; a strided or duplicated "
                                  "placement cannot be one file")
        covered = sum(b.volume for b in got)
        want = math.prod(spec.shape)
        if covered != want:
            raise TilingError(f"{fqn!r}: the chunks cover {covered} of its {want} elements "
                              f"(shape {list(spec.shape)}): a partial save cannot be one file")


def run_count(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> int:
    k = _split_dim(shape, offsets, sizes)
    return math.prod(sizes[:k])


def _split_dim(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> int:
    """The first dimension ``k`` such that every dimension after it is spanned fully."""
    k = len(shape) - 1
    while k > 0 and offsets[k] == 0 and sizes[k] == shape[k]:
        k -= 1
    return max(k, 0)


def strided(
    shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], itemsize: int
) -> tuple[int, int, int, int] | None:
    """A box's runs as ``(first, step, length, count)`` when they are evenly spaced, one per
    index of the first dimension (a box that splits the second dimension, every later one
    whole: a column shard); None for any other box, and for an empty one."""
    if len(shape) < 2 or math.prod(sizes) == 0 or _split_dim(shape, offsets, sizes) != 1:
        return None
    row = math.prod(shape[1:])
    inner = math.prod(shape[2:])
    return ((offsets[0] * row + offsets[1] * inner) * itemsize, row * itemsize,
            sizes[1] * inner * itemsize, sizes[0])


def runs(
    shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], itemsize: int
) -> Iterator[tuple[int, int]]:
    """``(byte offset in the tensor, length)`` of each run of a box, in the box's row-major
    byte order (so the box's own bytes are these runs, back to back)."""
    if not shape:  # 0-d: one element
        yield 0, itemsize
        return
    if math.prod(sizes) == 0:
        return
    even = strided(shape, offsets, sizes, itemsize)
    if even is not None:  # the common case (a column shard of a matrix): one run per row
        first, step, length, count = even
        for i in range(count):
            yield first + i * step, length
        return
    k = _split_dim(shape, offsets, sizes)
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    length = sizes[k] * strides[k] * itemsize
    base = offsets[k] * strides[k]
    for index in itertools.product(*(range(o, o + s) for o, s in
                                     zip(offsets[:k], sizes[:k], strict=True))):
        yield (base + sum(i * st for i, st in zip(index, strides, strict=False))) * itemsize, \
            length


def _empty_key(spec: Spec) -> str | None:
    # huggingface_hub groups tensors by storage; every freshly allocated empty tensor reports
    # the same (null) storage pointer, so all empty tensors count as one storage.
    return "empty" if spec.nbytes == 0 else None


def layout(
    specs: Mapping[str, Spec],
    order: Sequence[str],
    metadata: Mapping[str, str] | None,
    max_shard_size: int | None,
    single_name: str,
) -> Layout:
    """The files ``save_file`` (``max_shard_size=None``) or ``save_sharded`` would write.

    ``order`` is the state dict's order (it decides the shard grouping, as it does for
    ``huggingface_hub``); each file is in canonical order.
    """
    names_in_order = [n for n in order if n in specs] + [n for n in specs if n not in order]
    if max_shard_size is None:
        groups = [names_in_order]
        names = [single_name]
        metas: list[Mapping[str, str] | None] = [metadata]
    else:
        if max_shard_size < 1:
            raise ValueError(f"max_shard_size must be positive, got {max_shard_size}")
        keys = {n: k for n in names_in_order if (k := _empty_key(specs[n])) is not None}
        groups = split_shards([(n, specs[n].nbytes) for n in names_in_order], max_shard_size,
                              keys)
        names = shard_names("model{suffix}.safetensors", len(groups))
        single = {"format": "pt", **(metadata or {})}
        metas = [single] if len(groups) == 1 else [{"format": "pt"}] * len(groups)
    files: list[FileLayout] = []
    where: dict[str, tuple[int, int]] = {}
    for number, (name, group, meta) in enumerate(zip(names, groups, metas, strict=True)):
        ordered = canonical_order((n, specs[n].dtype) for n in group)
        header = encode_header([(n, specs[n].dtype, specs[n].shape, specs[n].nbytes)
                                for n in ordered], meta)
        pos = len(header)
        offsets: dict[str, int] = {}
        for n in ordered:
            offsets[n] = pos
            where[n] = (number, pos)
            pos += specs[n].nbytes
        files.append(FileLayout(name, header, offsets, pos))
    index = None
    if len(files) > 1:
        weight_map = {n: f.name for f, g in zip(files, groups, strict=True) for n in g}
        total = sum(specs[n].nbytes for n in names_in_order)
        index = ("model.safetensors.index.json",
                 encode_index({"total_size": total, **(metadata or {})}, weight_map))
    return Layout(tuple(files), index, where)
