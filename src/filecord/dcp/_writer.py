"""``SafetensorsWriter``: ``torch.distributed.checkpoint.save`` into one safetensors file (or
hub-style shards and their index), every rank writing its own bytes at their final offsets.

Theory of operation
-------------------
DCP calls, in order: on every rank ``set_up_storage_writer`` and ``prepare_local_plan``; on the
coordinator ``prepare_global_plan`` (inside a gather/scatter: its return value, each plan's
``storage_data``, is the only thing the coordinator can send the ranks); on every rank
``write_data``; on the coordinator ``finish``, only once every rank has reported success.

1. ``prepare_local_plan`` refuses what a safetensors file cannot hold (non-tensor values,
   dtypes without a safetensors code) and the modes this writer cannot honour
   (``use_collectives=False``: no coordinator; cached plans: ranks would reuse an old save's
   temp paths), and declares in its plan's ``storage_data`` the dtype and global shape of every
   tensor it holds (:class:`Declared`: the planner's deduplication drops replicated items from
   all ranks but one, so only the declarations show two ranks disagreeing).  Nothing exists
   yet.
2. ``prepare_global_plan`` (coordinator) proves every rank declared the same dtype and shape
   per tensor and the chunks tile every tensor (``_layout``),
   lays out the files ``filecord.safetensors.save_file``/``save_sharded`` would write for the
   full state dict, makes the shards' directory (and its missing parents) as torch's
   ``FileSystemWriter`` does (a single file's directory must exist, as for ``save_file``),
   then draws a save token and creates, in the output directory, the lock
   ``.NAME.TOKEN.filecord-lock`` (``flock``ed, naming a journal that does not exist yet) and
   one temp ``.NAME.TOKEN.partial`` per output file (``O_EXCL``).  Each temp gets its header
   and is preallocated to its final size with ``fallocate(2)`` (never glibc's emulation, which
   writes every block): a full disk is an ``ENOSPC`` here, before any rank writes.  A file
   system without ``fallocate`` gets the size by ``ftruncate`` and a logged warning (a full
   disk then shows up as a rank's write error, cleaned up the same way).  Each rank's plan
   carries only its own items' offsets.
3. ``write_data`` (each rank) refuses a temp path that is not this save's ``.partial`` beside
   the output (a plan changed after the coordinator made it), opens the temps ``O_WRONLY``
   (no create, no truncate), writes each chunk's runs with ``pwrite`` straight from the
   tensor's memory (a view or an off-host tensor is staged through bounded row-major blocks,
   ``_kit.torch_stream.row_major_blocks``), fsyncs, and returns per item the temp, offset and
   bytes written.  No checksum is taken: nothing could check it without re-reading every
   byte, and a pass over the data costs as much as the writes (issue 37's profile).
4. ``finish`` (coordinator) checks that each rank reported exactly the items it assigned that
   rank, at the temp, offset and byte count it laid out (the bytes are not re-read),
   and commits the temps with ONE ``filecord.save_many`` transaction, each temp an owned
   whole-file piece under ``consume=True`` (adopted: fsynced, renamed, journaled, recoverable;
   nothing is copied), the index as bytes.  Then the lock goes.

Failure: DCP has no abort hook.  :meth:`SafetensorsWriter.abort` (called by
``filecord.dcp.save`` for any exception on the coordinator) removes the temps, then the lock,
then the directories the save made that are still empty;
the lock is let go even when a removal fails, so ``filecord recover`` can finish the cleanup.
A coordinator that dies leaves the temps beside a free lock that names no journal: ``filecord
recover DIR`` removes them (the transaction's own proof: a free lock and no journal mean nothing
destructive happened).  Once the save's transaction has begun, its own journal takes over.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._io.paths import make_directories, remove_empty
from filecord._kit.torch_stream import host_view, row_major_blocks
from filecord._pieces.cord import Cord
from filecord._pieces.data import CHUNK, FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._txn import liveness
from filecord._txn.save import save_many
from filecord.dcp import _layout
from filecord.dcp.errors import UnsupportedStateError
from filecord.errors import SaveError, add_note
from filecord.safetensors._torch import _DTYPES, parse_shard_size
from filecord.safetensors._write import remove_files, stale_files
from filecord.tensors import DType

log = logging.getLogger(__name__)

SINGLE_NAME = "model.safetensors"
ItemKey = tuple[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class ItemPlace:
    """Where one rank's chunk goes: the temp (by number), the tensor's first byte in it, the
    tensor's global shape and the element size."""

    file: int
    offset: int
    shape: tuple[int, ...]
    itemsize: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class RankOrders:
    """What the coordinator sends one rank (its plan's ``storage_data``)."""

    token: str
    temps: tuple[str, ...]
    items: Mapping[ItemKey, ItemPlace] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Declared:
    """What a rank declares in its local plan's ``storage_data``: the dtype and global shape of
    every tensor it holds.  The planner's deduplication drops a replicated item from all ranks
    but one before the coordinator sees the plans, so the items alone cannot show that two
    ranks hold different tensors under one key; this declaration survives the deduplication."""

    specs: tuple[_layout.Spec, ...]


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What a rank reports per item (a ``WriteResult``'s ``storage_data``): the save, where it
    wrote (the temp's path, the file number and the tensor's first byte it used) and what."""

    token: str
    temp: str
    file: int
    offset: int
    nbytes: int
    runs: int


def dtype_code(dtype: torch.dtype, fqn: str) -> DType:
    code = _DTYPES.get(str(dtype).removeprefix("torch."))
    if code is None or code is DType.F4:  # F4 packs two values per torch element: refused
        raise UnsupportedStateError(f"{fqn!r}: safetensors has no dtype for {dtype} (or this "
                                    "writer does not split it); nothing was written")
    return code


def _key(index: MetadataIndex) -> ItemKey:
    return index.fqn, tuple(int(x) for x in (index.offset or ()))


def _box(item: WriteItem, rank: int) -> _layout.Box:
    td = item.tensor_data
    if td is None:  # pragma: no cover - refused in prepare_local_plan
        raise UnsupportedStateError(f"{item.index.fqn!r} is not a tensor")
    return _layout.Box(item.index.fqn, rank, tuple(int(x) for x in td.chunk.offsets),
                       tuple(int(x) for x in td.chunk.sizes))


def _spec(item: WriteItem) -> _layout.Spec:
    td = item.tensor_data
    if td is None:  # pragma: no cover - refused in prepare_local_plan
        raise UnsupportedStateError(f"{item.index.fqn!r} is not a tensor")
    return _layout.Spec(item.index.fqn, dtype_code(td.properties.dtype, item.index.fqn),
                        tuple(int(x) for x in td.size))


class SafetensorsWriter(StorageWriter):  # type: ignore[misc, unused-ignore]
    """Write ``dcp.save``'s state dict as ``path`` (one ``.safetensors`` file), or, with
    ``max_shard_size``, as hub-style shards plus ``model.safetensors.index.json`` in the
    directory ``path``: byte-identical to ``filecord.safetensors.save_file`` / ``save_sharded``
    of the full state dict.  Every rank must see ``path`` on one shared file system.

    ``metadata``: the ``__metadata__`` of the single file (as ``save_file``'s argument), or the
    user metadata of a sharded save (as ``save_sharded``'s).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_shard_size: int | str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.max_shard_size = None if max_shard_size is None else parse_shard_size(
            max_shard_size)
        self.path = self._target(path)
        self.metadata = dict(metadata) if metadata is not None else None
        self.directory = self.path if self.max_shard_size is not None else os.path.dirname(
            self.path)
        self.is_coordinator = False
        self.rank = 0
        self.report: SaveReport | None = None
        self.results: dict[ItemKey, ItemResult] = {}
        self._order: list[str] = []
        self._layout: _layout.Layout | None = None
        self._token = ""
        self._temps: list[str] = []
        self._lock: tuple[str, int] | None = None
        self._committed = False
        self._assigned: list[dict[ItemKey, ItemPlace]] = []
        self._made: list[str] = []

    # --- DCP's protocol ------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        # Not called when a writer is passed without a checkpoint_id: the state is set up in
        # __init__, and a checkpoint_id only renames the target.
        if checkpoint_id is not None:
            self.path = self._target(checkpoint_id)
            self.directory = self.path if self.max_shard_size is not None else \
                os.path.dirname(self.path)

    def _target(self, path: str | os.PathLike[str]) -> str:
        """The absolute output; a single file's name spelled as a directory (``"out/"``) is
        refused, never saved as a file named ``out``."""
        given = os.fspath(path)
        if self.max_shard_size is None and given.endswith((os.sep, "/")):
            raise SaveError(f"cannot save {given}: it names a directory, not a file (give "
                            "max_shard_size to save shards into a directory, or a file name "
                            "ending in .safetensors); nothing was written", errno=errno.EISDIR)
        return _sys.abspath(given)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return os.fspath(checkpoint_id).endswith(".safetensors")

    def set_up_storage_writer(self, is_coordinator: bool,  # noqa: FBT001 - DCP's signature
                              *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise UnsupportedStateError(
                "use_collectives=False: without the collectives no coordinator lays out the "
                "file or commits it; nothing was written")
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank", 0))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not plan.usable:
            raise UnsupportedStateError(
                "cached plans (enable_plan_caching=True) would reuse an earlier save's temp "
                "files; use a planner without plan caching; nothing was written")
        for item in plan.items:
            if item.type is WriteItemType.BYTE_IO or item.tensor_data is None:
                raise UnsupportedStateError(
                    f"{item.index.fqn!r} is not a tensor: a safetensors file holds tensors only "
                    "(save other state separately); nothing was written")
            dtype_code(item.tensor_data.properties.dtype, item.index.fqn)
        if self.is_coordinator:
            self._order = list(dict.fromkeys(item.index.fqn for item in plan.items))
        return dataclasses.replace(plan, storage_data=Declared(tuple(
            {s.fqn: s for s in (_spec(i) for i in plan.items)}.values())))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if not all(p.usable for p in plans):
            raise UnsupportedStateError(
                "cached plans (enable_plan_caching=True) would reuse an earlier save's temp "
                "files; use a planner without plan caching; nothing was written")
        declared: list[_layout.Spec] = []
        for p in plans:
            if not isinstance(p.storage_data, Declared):
                raise UnsupportedStateError(
                    "a local plan lost this writer's declaration of its tensors (a planner "
                    "that replaced storage_data); nothing was written")
            declared.extend(p.storage_data.specs)
        # Every rank's declaration, replicated tensors included, then the (deduplicated) items:
        # two ranks holding different dtypes or shapes under one key are refused here.
        specs = _layout.merge_specs(declared + [_spec(i) for p in plans for i in p.items])
        if not specs and self.max_shard_size is not None:
            raise UnsupportedStateError("an empty state dict makes no shards (save_sharded "
                                        "writes nothing for it); nothing was written")
        boxes = [_box(i, r) for r, p in enumerate(plans) for i in p.items]
        _layout.check_tiling(specs, boxes)
        lay = _layout.layout(specs, self._order, self.metadata, self.max_shard_size,
                             os.path.basename(self.path))
        self._layout = lay  # a writer may serve several saves: each starts afresh here
        self._temps, self._committed, self.report, self.results = [], False, None, {}
        self._assigned = []
        paths = self._finals(lay)
        self._made = self._directory()
        self._create(lay, paths)
        out: list[SavePlan] = []
        for p in plans:
            items: dict[ItemKey, ItemPlace] = {}
            for i in p.items:
                spec = specs[i.index.fqn]
                number, offset = lay.where[i.index.fqn]
                box = _box(i, 0)
                items[_key(i.index)] = ItemPlace(number, offset, spec.shape,
                                                 spec.dtype.bits // 8,
                                                 box.volume * spec.dtype.bits // 8)
            self._assigned.append(items)
            touched = {x.file for x in items.values()}
            temps = tuple(t if n in touched else "" for n, t in enumerate(self._temps))
            out.append(SavePlan(p.items, storage_data=RankOrders(self._token, temps, items),
                                planner_data=p.planner_data, usable=p.usable))
        return out

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        orders = plan.storage_data
        if not isinstance(orders, RankOrders):
            raise UnsupportedStateError("the plan carries no filecord layout (a planner that "
                                        "replaced storage_data, or cached plans)")
        fds: dict[int, int] = {}
        results: list[WriteResult] = []
        try:
            for item in plan.items:
                place = orders.items[_key(item.index)]
                temp = self._own_temp(orders, place.file)
                if place.file not in fds:
                    fds[place.file] = _sys.open(temp, os.O_WRONLY)
                tensor = planner.resolve_data(item)
                if not isinstance(tensor, torch.Tensor):  # pragma: no cover - planned as one
                    raise UnsupportedStateError(f"{item.index.fqn!r} resolved to a "
                                                f"{type(tensor).__name__}, not a tensor")
                res = _write_item(fds[place.file], tensor, item, place, orders.token, temp)
                results.append(WriteResult(index=item.index, size_in_bytes=res.nbytes,
                                           storage_data=res))
            for fd in fds.values():
                _sys.fsync(fd)  # this rank's bytes are durable before it reports success
        finally:
            for fd in fds.values():
                _sys.close(fd)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        lay = self._layout
        if lay is None or self._lock is None:
            raise UnsupportedStateError("finish without a plan from this writer")
        self._check_results(lay, results)
        paths = self._finals(lay)
        outputs: dict[Target, CordLike] = {}
        for temp, final in zip(self._temps, paths, strict=True):
            outputs[final] = Cord([FileBackedData(temp, owned=True)])
        if lay.index is not None:
            outputs[os.path.join(self.directory, lay.index[0])] = Cord([lay.index[1]])
        stale = stale_files(self.directory, "model{suffix}.safetensors", outputs) \
            if self.max_shard_size is not None else []
        # The temps are fsynced by the adoption (its writer may never have synced them); each
        # rank already fsynced its own bytes before reporting.
        self.report = save_many(outputs, consume=True)
        self._committed = True
        remove_files(stale)
        lock, fd = self._lock
        self._lock = None
        liveness.release(lock, fd)

    def storage_meta(self) -> None:
        return None

    def _own_temp(self, orders: RankOrders, number: int) -> str:
        """The temp the plan names for file ``number``, refused unless it is one this save's
        coordinator makes: a ``.partial`` with the save's token beside the output.  A plan
        tampered with after the coordinator laid it out (a planner's ``finish_plan``) must not
        make a rank write into the live file or anywhere else."""
        temp = orders.temps[number] if 0 <= number < len(orders.temps) else ""
        name = os.path.basename(temp)
        if self.max_shard_size is None:
            ok = _names.is_token(orders.token) and \
                temp == _names.sibling(self.path, orders.token, _names.TEMP)
        else:
            ok = os.path.dirname(temp) == self.directory and \
                _names.parse(name) == (orders.token, _names.TEMP)
        if not ok:
            raise UnsupportedStateError(
                f"the plan names {temp!r} as file {number}'s temp: not a temp this save's "
                "coordinator created (a planner that changed storage_data); nothing was written "
                "there")
        return temp

    # --- the coordinator's files ---------------------------------------------------------
    def _finals(self, lay: _layout.Layout) -> list[str]:
        if self.max_shard_size is None:
            return [self.path]
        return [os.path.join(self.directory, f.name) for f in lay.files]

    def _directory(self) -> list[str]:
        """The shards' directory is made (with its missing parents) as torch's
        ``FileSystemWriter`` makes its checkpoint directory; the directory of a single file
        must exist, as for ``save_file``.  Returns the directories made."""
        if self.max_shard_size is not None:
            return make_directories(self.directory)
        if not _sys.isdir(self.directory):
            there = _sys.lexists(self.directory)
            raise SaveError(f"cannot save {self.path}: the directory {self.directory} "
                            f"{'is not a directory' if there else 'does not exist'} (create "
                            "it first, or save shards with max_shard_size, whose directory is "
                            "created); nothing was written",
                            errno=errno.ENOTDIR if there else errno.ENOENT)
        return []

    def _create(self, lay: _layout.Layout, paths: Sequence[str]) -> None:
        token = _names.new_token()
        lock = _names.sibling(paths[0], token, _names.LOCK)
        journal = _names.sibling(paths[0], token, _names.JOURNAL)
        self._token = token
        fd = liveness.create(lock, liveness.pointer_record(journal))
        self._lock = (lock, fd)
        try:
            for f, final in zip(lay.files, paths, strict=True):
                temp = _names.sibling(final, token, _names.TEMP)
                tfd = _sys.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                self._temps.append(temp)
                try:
                    _preallocate(tfd, f.size, temp)
                    _sys.write_all(tfd, f.header, 0)
                finally:
                    _sys.close(tfd)
        except BaseException:
            self.abort()
            raise

    def _check_results(self, lay: _layout.Layout, results: list[list[WriteResult]]) -> None:
        """Each rank must report exactly the items the coordinator assigned it, each written
        into the temp the coordinator created, at the offset it laid out, with the byte count
        of the chunk: a plan changed on its way to a rank (offsets swapped between two items
        of the same size, a temp renamed) is refused here, before the commit.  The bytes
        themselves are not checked: that would re-read every byte."""
        if len(results) != len(self._assigned):
            raise UnsupportedStateError(f"{len(results)} ranks reported, {len(self._assigned)} "
                                        "were planned; nothing was committed")
        got: dict[ItemKey, ItemResult] = {}
        for rank, (rank_results, assigned) in enumerate(
                zip(results, self._assigned, strict=True)):
            seen: set[ItemKey] = set()
            for r in rank_results:
                res = r.storage_data
                if not isinstance(res, ItemResult) or res.token != self._token:
                    raise UnsupportedStateError(f"{r.index.fqn!r}: a result from another save")
                key = _key(r.index)
                if key in got:
                    raise UnsupportedStateError(f"{r.index.fqn!r}: written twice")
                place = assigned.get(key)
                if place is None:
                    raise UnsupportedStateError(f"{r.index.fqn!r}: rank {rank} wrote a chunk "
                                                "it was not assigned; nothing was committed")
                where = (res.temp, res.file, res.offset, res.nbytes)
                planned = (self._temps[place.file], place.file, place.offset, place.nbytes)
                if where != planned:
                    raise UnsupportedStateError(
                        f"{r.index.fqn!r}: rank {rank} wrote {res.nbytes} bytes at offset "
                        f"{res.offset} of {res.temp!r}; the coordinator laid out {place.nbytes} "
                        f"bytes at offset {place.offset} of {planned[0]!r} (a plan changed on "
                        "its way to the rank); nothing was committed")
                got[key] = res
                seen.add(key)
            if seen != set(assigned):
                missing = sorted(k[0] for k in set(assigned) - seen)[:5]
                raise UnsupportedStateError(f"rank {rank} reported no result for {missing}; "
                                            "nothing was committed")
        data = sum(f.size - len(f.header) for f in lay.files)
        written = sum(r.nbytes for r in got.values())
        if written != data:
            raise UnsupportedStateError(f"the ranks wrote {written} bytes of the {data} the "
                                        "layout needs; nothing was committed")
        self.results = got

    def abort(self) -> None:
        """Remove this save's temps, then its lock (the coordinator's cleanup after any
        failure; a no-op elsewhere, and after the commit).

        The lock is let go whatever else fails (a temp that cannot be removed, a directory
        made read-only): a lock held by a live process makes ``filecord recover`` skip the
        save as running, so its temps would stay until the process exits.  Once the lock is
        free, ``recover`` removes what is left.  The first cleanup error is raised after that,
        the others attached to it as notes."""
        if self._committed:
            return
        errors: list[OSError] = []
        temps, self._temps = self._temps, []
        made, self._made = self._made, []
        try:
            for temp in temps:
                _collect(errors, _sys.unlink_missing_ok, temp)
            if temps:
                _collect(errors, _sys.fsync_parents, temps[:1])
        finally:
            if self._lock is not None:
                lock, fd = self._lock
                self._lock = None
                # release closes (unlocks) the lock even when its unlink fails
                _collect(errors, liveness.release, lock, fd)
            remove_empty(made)  # the shards' directory this save made, when still empty
        if errors:
            for other in errors[1:]:
                add_note(errors[0], f"also: {type(other).__name__}: {other}")
            raise errors[0]


def _collect(errors: list[OSError], fn: Callable[..., object], *args: Any) -> None:
    """Run one cleanup step; an ``OSError`` is kept for later, so the next step still runs."""
    try:
        fn(*args)
    except OSError as exc:
        errors.append(exc)


def _preallocate(fd: int, size: int, path: str) -> None:
    if size == 0:
        return
    try:
        _sys.allocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        log.warning("%s: the file system has no fallocate(2) (%s): sized with ftruncate; a "
                    "full disk will show up as a rank's write error", path, exc.strerror)
        _sys.ftruncate(fd, size)


def _write_item(fd: int, tensor: torch.Tensor, item: WriteItem, place: ItemPlace,
                token: str, temp: str) -> ItemResult:
    box = _box(item, 0)
    if tuple(int(x) for x in tensor.shape) != box.sizes:
        raise UnsupportedStateError(f"{item.index.fqn!r}: the data has shape "
                                    f"{list(tensor.shape)}, the plan says {list(box.sizes)}")
    even = _layout.strided(place.shape, box.offsets, box.sizes, place.itemsize)
    if even is not None and tensor.device.type == "cpu" and tensor.is_contiguous() \
            and not (tensor.is_conj() or tensor.is_neg()):
        return _write_rows(fd, tensor, place, even, token, temp)
    runs = _layout.runs(place.shape, box.offsets, box.sizes, place.itemsize)
    base = place.offset
    done = 0
    count = 0
    run_dst, run_left = 0, 0
    for block in row_major_blocks(tensor, CHUNK):
        if block.numel() == 0:
            continue
        view = host_view(block.reshape(-1).view(torch.uint8))
        size = len(view)
        pos = 0
        while pos < size:
            if run_left == 0:
                run_dst, run_left = next(runs)
                count += 1
            n = run_left if run_left <= size - pos else size - pos
            piece = view[pos:pos + n]
            if _sys.pwrite(fd, piece, base + run_dst) != n:  # short: finish it
                _sys.write_all(fd, piece, base + run_dst)
            run_dst += n
            run_left -= n
            pos += n
        done += size
    if done != place.nbytes:
        raise UnsupportedStateError(f"{item.index.fqn!r}: {done} bytes for a "
                                    f"{place.nbytes}-byte chunk")
    return ItemResult(token, temp, place.file, place.offset, done, count)


def _write_rows(fd: int, tensor: torch.Tensor, place: ItemPlace,
                even: tuple[int, int, int, int], token: str, temp: str) -> ItemResult:
    """A column shard in host memory, one ``pwrite`` per row straight from the tensor: the
    rows are evenly spaced, so no run is looked up and no block staged (the per-run
    bookkeeping of the general loop cost as much as the writes: issue 37's profile)."""
    first, step, length, count = even
    view = host_view(tensor.reshape(-1).view(torch.uint8))
    pwrite = _sys.pwrite
    at = place.offset + first
    for start in range(0, count * length, length):
        piece = view[start:start + length]
        if pwrite(fd, piece, at) != length:  # short: finish it
            _sys.write_all(fd, piece, at)
        at += step
    return ItemResult(token, temp, place.file, place.offset, len(view), count)
