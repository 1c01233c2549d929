"""``GGUFWriter``: gguf-py's writer calls, saved atomically and durably, data on disk once.

Porting a conversion script is an import change: the calls are gguf-py 0.19's (``add_*`` for
key-values, ``add_tensor``, ``add_tensor_info`` + ``write_tensor_data``, the ``write_*_to_file``
steps, ``close``) and the bytes are the same.  The differences are the point:

* nothing is written under the final name until ``close``: then every file (all the shards of
  a split set) is saved by one ``save_many`` transaction (temp beside the target, fsync,
  rename, directory fsync); a failure leaves the old files and no partial one;
* ``add_tensor`` also takes torch tensors, file ranges (:class:`~filecord.FileBackedData`,
  moved with ``consume=True``) and callables that produce a tensor when its turn comes, so a
  script streams: each produced tensor is written at once to an owned scratch file beside the
  output and dropped (host memory: the tensor being produced), and the save moves those bytes
  into place instead of copying them; ``write_tensor_data`` does the same for the streaming
  calls;
* what llama.cpp cannot load is refused instead of written: an empty key, an array of arrays,
  more than 4 dims, a tensor name of 64 bytes or more;
* with a custom alignment, every shard carries ``general.alignment`` (gguf-py 0.19 writes it
  only into the first shard but pads the others to it, so its later shards read wrong).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord._kit.operation import ProgressCallback
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._plan.types import NOT_OWNED
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import plan, save_many, save_many_finishing
from filecord.gguf._build import build_split
from filecord.gguf._pieces import to_tensor
from filecord.gguf._types import (
    ALIGNMENT_KEY,
    ARCH_KEY,
    GGMLType,
    GGUFTensor,
    KeyValue,
    ValueType,
)
from filecord.gguf.errors import DuplicateTensorError

log = logging.getLogger(__name__)
Producer = Callable[[], Any]


def infer_type(v: object) -> ValueType:
    """gguf-py's rule for an untyped value: bool, int -> INT32, float -> FLOAT32, str/bytes."""
    if isinstance(v, bool):
        return ValueType.BOOL
    if isinstance(v, int):
        return ValueType.INT32
    if isinstance(v, float):
        return ValueType.FLOAT32
    if isinstance(v, (str, bytes)):
        return ValueType.STRING
    if isinstance(v, (list, tuple)):
        return ValueType.ARRAY
    raise TypeError(f"no GGUF value type for {type(v).__name__}")


def array_kv(key: str, val: Sequence[Any], sub_type: ValueType | None = None) -> KeyValue:
    """An array key-value; the element type is the first element's unless given."""
    if isinstance(val, bytes):
        return KeyValue(key, ValueType.ARRAY, tuple(val), sub_type or ValueType.UINT8)
    if not isinstance(val, (list, tuple)):
        raise TypeError(f"{key!r}: an array must be a list, tuple or bytes")
    if not val:
        raise ValueError(f"{key!r}: an empty array needs no key (gguf-py refuses it)")
    if sub_type is None:
        sub_type = infer_type(val[0])
        if any(infer_type(x) is not sub_type for x in val[1:]):
            raise ValueError(f"{key!r}: all items of a GGUF array must have one type")
    if sub_type is ValueType.ARRAY:
        raise ValueError(f"{key!r}: arrays of arrays cannot be loaded by llama.cpp")
    return KeyValue(key, ValueType.ARRAY, tuple(val), sub_type)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A tensor whose data comes later: from ``producer``, or from ``write_tensor_data``."""

    name: str
    producer: Producer | None
    raw_shape: Sequence[int] | None
    raw_dtype: object
    nbytes: int | None = None


@dataclass(frozen=True, slots=True)
class _Spilled:
    """A produced tensor, now at ``offset`` in the scratch file (its memory is released)."""

    name: str
    type: GGMLType
    dims: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFWriter:
    """gguf-py's ``GGUFWriter`` calls; see the module notes.  ``close()`` saves and returns
    the :class:`~filecord.SaveReport` (also kept as ``.report``)."""

    def __init__(self, path: str | os.PathLike[str], arch: str, use_temp_file: bool = False,  # noqa: FBT001, FBT002
                 *, split_max_tensors: int = 0, split_max_size: int = 0,
                 small_first_shard: bool = False, consume: bool = False,
                 window: int = DEFAULT_WINDOW, progress: ProgressCallback | None = None) -> None:
        del use_temp_file  # never needed: produced tensors always go to scratch files
        self.path = os.fspath(path)
        self.arch = arch
        self.kv_data: dict[str, KeyValue] = {}
        self.split_max_tensors, self.split_max_size = split_max_tensors, split_max_size
        self.small_first_shard, self.consume = small_first_shard, consume
        self.window, self.progress = window, progress
        self.report: SaveReport | None = None
        self._slots: list[GGUFTensor | _Pending | _Spilled] = []
        self._names: set[str] = set()
        self._scratch: tuple[str, int] | None = None
        self._scratch_file: FileBackedData | None = None
        self._end = 0
        self._failed: BaseException | None = None
        self.add_string(ARCH_KEY, arch)

    # --- key-values ---------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., None]:
        """gguf-py's named key helpers (``add_context_length``, ``add_token_list``, ...): when
        the ``gguf`` package is installed, its helper runs against this writer, so it names
        the key and calls one of the typed ``add_*`` calls above."""
        if name.startswith("add_") and not name.startswith("add_tensor"):
            try:
                import gguf
            except ImportError:
                pass
            else:
                helper = getattr(gguf.GGUFWriter, name, None)
                if callable(helper):
                    return functools.partial(helper, self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def add_key_value(self, key: str, val: Any, vtype: Any,
                      sub_type: Any = None) -> None:
        t = ValueType(int(vtype))
        if not key:
            raise ValueError("an empty key cannot be loaded by llama.cpp")
        if t is ValueType.ARRAY:
            kv = array_kv(key, val, None if sub_type is None else ValueType(int(sub_type)))
        else:
            kv = KeyValue(key, t, val)
        if key in self.kv_data:
            log.warning("duplicated key %r: its value is replaced in place", key)
        self.kv_data[key] = kv

    def add_uint8(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.UINT8)

    def add_int8(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.INT8)

    def add_uint16(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.UINT16)

    def add_int16(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.INT16)

    def add_uint32(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.UINT32)

    def add_int32(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.INT32)

    def add_float32(self, key: str, val: float) -> None:
        self.add_key_value(key, val, ValueType.FLOAT32)

    def add_uint64(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.UINT64)

    def add_int64(self, key: str, val: int) -> None:
        self.add_key_value(key, val, ValueType.INT64)

    def add_float64(self, key: str, val: float) -> None:
        self.add_key_value(key, val, ValueType.FLOAT64)

    def add_bool(self, key: str, val: bool) -> None:  # noqa: FBT001 - gguf-py's signature
        self.add_key_value(key, val, ValueType.BOOL)

    def add_string(self, key: str, val: str) -> None:
        if val:  # gguf-py skips empty strings here (not in add_key_value)
            self.add_key_value(key, val, ValueType.STRING)

    def add_array(self, key: str, val: Sequence[Any]) -> None:
        if len(val):  # ... and empty arrays
            self.add_key_value(key, val, ValueType.ARRAY)

    def add_custom_alignment(self, alignment: int) -> None:
        self.add_uint32(ALIGNMENT_KEY, alignment)

    # --- tensors ------------------------------------------------------------------------
    def _claim(self, name: str) -> None:
        if name in self._names:
            raise DuplicateTensorError(f"tensor name {name!r} appears twice")
        self._names.add(name)

    def add_tensor(self, name: str, tensor: Any, raw_shape: Sequence[int] | None = None,
                   raw_dtype: Any = None) -> None:
        """A numpy array, torch tensor, bytes or FileBackedData (bytes and ranges need
        ``raw_shape`` and ``raw_dtype``), or a callable returning one of those, called in
        tensor order at ``write_tensors_to_file``/``close``."""
        self._claim(name)
        if callable(tensor):
            self._slots.append(_Pending(name, tensor, raw_shape, raw_dtype))
        else:
            self._slots.append(to_tensor(name, tensor, raw_shape, raw_dtype))

    def add_tensor_info(self, name: str, tensor_shape: Sequence[int], tensor_dtype: Any,
                        tensor_nbytes: int, raw_dtype: Any = None) -> None:
        """Declare a tensor whose data comes later through :meth:`write_tensor_data`."""
        del tensor_dtype  # the data's own dtype is used, as gguf-py writes the data's bytes
        self._claim(name)
        self._slots.append(_Pending(name, None, tensor_shape, raw_dtype, tensor_nbytes))

    def write_tensor_data(self, tensor: Any) -> None:
        """The data of the next declared tensor (streaming calls): written to scratch now."""
        i = next((i for i, s in enumerate(self._slots)
                  if isinstance(s, _Pending) and s.producer is None), None)
        if i is None:
            raise ValueError("write_tensor_data without a tensor declared by add_tensor_info")
        slot = self._slots[i]
        if not isinstance(slot, _Pending):  # pragma: no cover - found as a _Pending above
            raise TypeError(slot)
        self._check()
        t = to_tensor(slot.name, tensor, slot.raw_shape, slot.raw_dtype)
        if slot.nbytes is not None and t.nbytes != slot.nbytes:
            raise ValueError(f"{slot.name!r}: declared {slot.nbytes} bytes, got {t.nbytes}")
        try:
            self._slots[i] = self._spill(t)
        except BaseException as exc:
            self._abandon(exc)
            raise

    # --- the gguf-py write steps ----------------------------------------------------------
    def write_header_to_file(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is not None:
            self.path = os.fspath(path)

    def write_kv_data_to_file(self) -> None:
        """Nothing to do: the header is computed at ``close``."""

    def write_ti_data_to_file(self) -> None:
        """Nothing to do: the header is computed at ``close``."""

    def write_tensors_to_file(self, *, progress: bool = False) -> None:
        """Produce every pending tensor, in order, into the scratch file."""
        del progress
        self._check()
        try:
            for i, s in enumerate(self._slots):
                if isinstance(s, _Pending) and s.producer is not None:
                    self._slots[i] = self._spill(to_tensor(s.name, s.producer(), s.raw_shape,
                                                           s.raw_dtype))
        except BaseException as exc:
            self._abandon(exc)
            raise

    def _check(self) -> None:
        if self._failed is not None:
            raise ValueError("this writer failed while producing tensors; start a new one") \
                from self._failed

    def _abandon(self, exc: BaseException) -> None:
        """A tensor could not be produced: the scratch file goes, the writer is spent."""
        self._failed = exc
        if self._scratch is not None:
            path, fd = self._scratch
            self._scratch = None
            try:
                _sys.close(fd)
            finally:
                _sys.unlink_missing_ok(path)

    def _spill(self, t: GGUFTensor) -> GGUFTensor | _Spilled:
        """A produced tensor's bytes go to the scratch file now; its memory is released."""
        if isinstance(t.data, (FileBackedData, Cord)):
            return t
        if self._scratch is None:
            d = os.path.dirname(_sys.abspath(self.path))
            p = os.path.join(d, f".{os.path.basename(self.path)}.{secrets.token_hex(6)}"
                                ".gguf-tensors")
            self._scratch = (p, _sys.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        _sys.write_all(self._scratch[1], memoryview(t.data).cast("B"), self._end)
        self._end += t.nbytes
        return _Spilled(t.name, t.type, t.dims, self._end - t.nbytes, t.nbytes)

    def tensors(self) -> list[GGUFTensor]:
        """Every tensor, in order (producing pending ones first)."""
        self.write_tensors_to_file()
        missing = [s.name for s in self._slots if isinstance(s, _Pending)]
        if missing:
            raise ValueError(f"no data was written for {missing}")
        if self._scratch is not None:
            path, fd = self._scratch
            self._scratch = None
            try:
                _sys.close(fd)
                whole = FileBackedData._scratch(path)
            except BaseException as exc:
                self._failed = exc
                _sys.unlink_missing_ok(path)  # no owner yet: nothing else would remove it
                raise
            self._scratch_file = whole
            for i, s in enumerate(self._slots):
                if isinstance(s, _Spilled):
                    self._slots[i] = GGUFTensor(s.name, s.type, s.dims,
                                                whole.slice(s.offset, s.nbytes))
        return [s for s in self._slots if isinstance(s, GGUFTensor)]

    def _consume(self) -> tuple[bool, dict[Target, CordLike]]:
        """The outputs, and whether to save them consuming: produced tensors are always moved
        out of their scratch file; without ``consume`` the caller's own files are then only
        read (their pieces are given as not owned)."""
        tensors = self.tensors()
        spilled = self._scratch_file is not None
        if spilled and not self.consume:
            tensors = [self._unowned(t) for t in tensors]
        outs = build_split(self.kv_data, tensors, self.path, max_tensors=self.split_max_tensors,
                           max_size=self.split_max_size,
                           small_first_shard=self.small_first_shard)
        return self.consume or spilled, dict(outs.items())

    def _unowned(self, t: GGUFTensor) -> GGUFTensor:
        """The caller's owned range as a range that is only read (the scratch stays owned)."""
        d, scratch = t.data, self._scratch_file
        if (not isinstance(d, FileBackedData) or not d.owned
                or (scratch is not None and d.identity == scratch.identity)):
            return t
        # The captured identity stays: a file rewritten since add_tensor is a DataChangedError
        # (a fresh FileBackedData here would stat the new file and write its bytes silently).
        return GGUFTensor(t.name, t.type, t.dims, d._borrowed())

    def plan(self) -> SaveReport:
        """What ``close`` would do (pending tensors are produced to learn their sizes)."""
        consume, outs = self._consume()
        return plan(outs, consume=consume, window=self.window)

    def close(self) -> SaveReport:
        """Save every output in one transaction (once; later calls return the report)."""
        if self.report is not None:
            return self.report
        consume, outs = self._consume()
        try:
            if consume and not self.consume:  # only the writer's own scratch is consumed
                # Pieces it keeps on purpose are handed over unowned: no reason to warn.
                self.report = save_many_finishing(
                    outs, consume=True, window=self.window, progress=self.progress,
                    quiet_reasons=frozenset({NOT_OWNED}))[0]
            else:
                self.report = save_many(outs, consume=consume, window=self.window,
                                        progress=self.progress)
        except BaseException as exc:
            # Rolled back in full (no journal left): the scratch file holds only bytes the
            # writer produced, so it goes.  With a journal, ``filecord recover`` may need it.
            if getattr(exc, "journal_path", None) is None and self._scratch_file is not None:
                try:
                    self._scratch_file.close()
                except OSError:  # left to the collector: the bytes are the writer's own
                    self._scratch_file._arm_scratch()
            raise
        return self.report

    def write(self) -> SaveReport:
        """All the write steps and ``close`` at once."""
        return self.close()

