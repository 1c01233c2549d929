"""``SafetensorsReader``: ``torch.distributed.checkpoint.load`` from one safetensors file or a
sharded checkpoint's index, into any placement (resharding on load).

Each tensor is one chunk covering it whole; DCP's load planner intersects it with every
destination shard and asks for boxes of it.  The header is parsed by filecord's strict reader
(``filecord.safetensors.read_safetensors``: no tensor byte is read for the metadata), and a box
is copied out of a read-only memory map of the file straight into the destination tensor, so
memory is the destination's own plus the page cache.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from filecord._io import syscalls as _sys
from filecord.dcp.errors import UnsupportedStateError
from filecord.safetensors._read import SafetensorsFile, checkpoint_in, read_safetensors
from filecord.safetensors._torch import torch_dtype
from filecord.tensors import NamedTensor


@dataclass(frozen=True, slots=True)
class Stored:
    """Where one tensor is: its file, the absolute offset of its first byte, shape, dtype."""

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _resolve(path: str) -> str:
    if _sys.isdir(path):
        found = checkpoint_in(path)
        if found is not None:
            return found
        raise FileNotFoundError(f"{path} holds neither model.safetensors nor "
                                "model.safetensors.index.json")
    return path


class SafetensorsReader(StorageReader):  # type: ignore[misc, unused-ignore]
    """Read a ``.safetensors`` file, a ``*.index.json`` or a directory holding either."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.stored: dict[MetadataIndex, Stored] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.stored = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        p = os.fspath(checkpoint_id)
        return p.endswith((".safetensors", ".index.json"))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        got = read_safetensors(_resolve(self.path))
        files: Sequence[SafetensorsFile] = got.shards if not isinstance(got, SafetensorsFile) \
            else (got,)
        md: dict[str, Any] = {}
        storage: dict[MetadataIndex, Stored] = {}
        for f in files:
            entries = {e.name: e for e in f.header.entries}
            for name, t in f.tensors.items():
                dtype = _dtype(t)
                shape = t.shape
                zeros = torch.Size([0] * len(shape))
                md[name] = TensorStorageMetadata(
                    TensorProperties(dtype=dtype), torch.Size(shape),
                    [ChunkStorageMetadata(offsets=zeros, sizes=torch.Size(shape))])
                entry = entries[name]
                storage[MetadataIndex(name, zeros)] = Stored(
                    f.path, f.data_start + entry.begin, shape, dtype)
        self.stored = storage
        return Metadata(state_dict_metadata=md, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool,  # noqa: FBT001
                              *args: Any,
                              **kwargs: Any) -> None:
        if metadata.storage_data is not None:
            self.stored = dict(metadata.storage_data)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            where = self.stored.get(item.storage_index)
            if where is None:
                raise UnsupportedStateError(f"{item.storage_index.fqn!r} is not in {self.path}")
            per_file.setdefault(where.path, []).append(item)
        for path, items in per_file.items():
            _read_file(path, items, self.stored, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


def _dtype(t: NamedTensor) -> torch.dtype:
    dtype = torch_dtype(t.dtype)
    if dtype is None:
        raise UnsupportedStateError(f"{t.name!r}: this torch has no dtype for {t.dtype.value}")
    return dtype  # type: ignore[no-any-return, unused-ignore]


def _read_file(path: str, items: list[ReadItem], stored: dict[MetadataIndex, Stored],
               planner: LoadPlanner) -> None:
    fd = _sys.open(path, os.O_RDONLY)
    try:
        size = _sys.fstat(fd).st_size
        mm = _sys.map_read(fd, size)
    finally:
        _sys.close(fd)
    try:
        for item in items:
            where = stored[item.storage_index]
            _copy_box(mm, where, item, planner)
    finally:
        # A view still referenced somewhere keeps the map open: the collector closes it.
        with contextlib.suppress(BufferError):
            mm.close()


def _copy_box(mm: mmap.mmap, where: Stored, item: ReadItem, planner: LoadPlanner) -> None:
    count = 1
    for d in where.shape:
        count *= d
    itemsize = torch.empty((), dtype=where.dtype).element_size()
    target = planner.resolve_tensor(item)
    if count:
        with warnings.catch_warnings():  # the map is read-only, and we only read it
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(mm, dtype=torch.uint8, count=count * itemsize,
                                   offset=where.offset)
        full = raw.view(where.dtype).reshape(where.shape)
        box = full
        for dim, (o, n) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            box = box.narrow(dim, int(o), int(n))
        target.copy_(box)
        del raw, full, box
    planner.commit_tensor(item, target)
