"""Reading GGUF files and split sets: headers parsed, tensors never loaded.

The only I/O here is at the entry points: the header is read through ``filecord._io.syscalls`` in
growing prefixes (1 MiB, then at least doubling, never past the file), so memory stays within
twice the header; every tensor becomes a :class:`~filecord.FileBackedData` range of one
whole-file piece, so all tensors of a file share one owner when read with ``owned=True``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from filecord._io import syscalls as _sys
from filecord._kit.readfile import open_regular
from filecord._pieces.data import FileBackedData
from filecord.errors import DataChangedError, reading
from filecord.gguf._parse import Header, NeedMore, parse_header
from filecord.gguf._types import (
    SPLIT_KEYS,
    SPLIT_NO,
    SPLIT_TENSORS,
    GGUFTensor,
    KeyValue,
    ValueType,
)
from filecord.gguf.errors import InvalidSplitError, InvalidValueError

FIRST_READ = 1 << 20
_SPLIT_RE = re.compile(r"(.*)-(\d{5})-of-(\d{5})\.gguf")


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """One ``.gguf`` file: its validated header and its tensors in data order (read-only)."""

    path: str
    file_size: int
    header: Header
    tensors: Mapping[str, GGUFTensor] = field(repr=False)
    whole: FileBackedData = field(repr=False)

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    @property
    def kvs(self) -> Mapping[str, KeyValue]:
        return self.header.kvs

    @property
    def alignment(self) -> int:
        return self.header.alignment

    @property
    def data_start(self) -> int:
        return self.header.data_start

    def split(self) -> tuple[int, int, int] | None:
        """``(split.no, split.count, split.tensors.count)``, or None when the keys are absent."""
        got = [self.kvs.get(k) for k in SPLIT_KEYS]
        if all(kv is None for kv in got):
            return None
        want = (ValueType.UINT16, ValueType.UINT16, ValueType.INT32)
        out: list[int] = []
        for key, kv, t in zip(SPLIT_KEYS, got, want, strict=True):
            if kv is None or kv.type is not t or not isinstance(kv.value, int):
                raise InvalidValueError(f"must be {t.name} when any split key is present",
                                        field=key, offset=None)
            out.append(kv.value)
        return out[0], out[1], out[2]


@dataclass(frozen=True, slots=True)
class GGUFModel:
    """A model: one file, or a split set opened from its first shard.

    ``kvs`` are the first shard's key-values without the ``split.*`` keys; ``tensors`` are every
    shard's, in shard order.
    """

    path: str
    shards: tuple[GGUFFile, ...]
    kvs: Mapping[str, KeyValue]
    tensors: Mapping[str, GGUFTensor] = field(repr=False)

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        object.__setattr__(self, "kvs", MappingProxyType(dict(self.kvs)))
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    @property
    def wholes(self) -> list[FileBackedData]:
        return [f.whole for f in self.shards]

    def detach_cleanup(self) -> None:
        for f in self.shards:
            f.whole.detach_cleanup()


def _read_header(path: str) -> tuple[int, Header]:
    fd = open_regular(path)
    try:
        size = _sys.fstat(fd).st_size
        buf = _sys.read_all(fd, 0, min(size, FIRST_READ))
        while True:
            try:
                return size, parse_header(buf, size)
            except NeedMore as more:  # noqa: PERF203 - a few rounds at most (doubling)
                n = min(size, max(more.end, 2 * len(buf)))
                buf += _sys.read_all(fd, len(buf), n - len(buf))
    finally:
        _sys.close(fd)


def read_gguf_file(path: str | os.PathLike[str], *, owned: bool = False) -> GGUFFile:
    """Read one ``.gguf`` file (a shard is read alone); see :func:`read_gguf`."""
    with reading(os.fspath(path)):
        return _read_gguf_file(path, owned=owned)


def _read_gguf_file(path: str | os.PathLike[str], *, owned: bool = False) -> GGUFFile:
    """Read one ``.gguf`` file (a shard is read alone); see :func:`read_gguf`."""
    p = os.fspath(path)
    size, header = _read_header(p)
    whole = FileBackedData(p, owned=owned)
    try:
        if len(whole) != size:
            raise DataChangedError(p, expected_size=size, found_size=len(whole),
                                   reason="the file changed while its header was read")
        base = header.data_start
        tensors = {t.name: GGUFTensor(t.name, t.type, t.dims, whole.slice(base + t.offset,
                                                                          t.nbytes))
                   for t in header.infos}
    except BaseException:
        whole.detach_cleanup()  # a failed read must never delete the user's file
        raise
    return GGUFFile(p, size, header, tensors, whole)


def read_gguf(path: str | os.PathLike[str], *, owned: bool = False) -> GGUFModel:
    """Read a ``.gguf`` file, or a whole split set from its first shard.

    Every rule of the format (and of ggml's loader) is checked; malformed input raises a
    :class:`~filecord.gguf.errors.GGUFFormatError` subclass naming the field and byte offset.
    Work and memory are bounded by the header, itself bounded by the file; tensor bytes are
    never read.  A split set must be opened from ``<prefix>-00001-of-0000N.gguf``; the other
    shards are found by name beside it, each must carry its number, and the tensors must add
    up to ``split.tensors.count``.  ``owned=True`` lets a consuming save move the files.
    """
    p = os.fspath(path)
    first = read_gguf_file(p, owned=owned)
    shards = [first]
    try:
        split = first.split()
        if split is not None and split[1] > 1:
            shards.extend(_other_shards(first, split, owned=owned))
        tensors: dict[str, GGUFTensor] = {}
        for f in shards:
            for name, t in f.tensors.items():
                if name in tensors:
                    raise InvalidSplitError(f"tensor {name!r} is in two shards",
                                            field=f.path, offset=None)
                tensors[name] = t
        if split is not None and split[1] > 1 and len(tensors) != split[2]:
            raise InvalidSplitError(f"{split[2]} tensors expected, {len(tensors)} found",
                                    field=SPLIT_TENSORS, offset=None)
    except BaseException:
        for f in shards:
            f.whole.detach_cleanup()
        raise
    kvs = {k: v for k, v in first.kvs.items() if k not in SPLIT_KEYS}
    return GGUFModel(p, tuple(shards), kvs, tensors)


def _other_shards(first: GGUFFile, split: tuple[int, int, int], *,
                  owned: bool) -> list[GGUFFile]:
    no, count, total = split
    m = _SPLIT_RE.fullmatch(os.path.basename(first.path))
    if no != 0 or m is None or int(m.group(2)) != 1 or int(m.group(3)) != count:
        raise InvalidSplitError(
            f"split.no={no} of split.count={count}: open a split set from its first shard, "
            f"named <prefix>-00001-of-{count:05d}.gguf", field=SPLIT_NO, offset=None)
    prefix = os.path.join(os.path.dirname(first.path), m.group(1))
    out: list[GGUFFile] = []
    try:
        for i in range(1, count):
            name = f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf"
            try:
                f = read_gguf_file(name, owned=owned)
            except FileNotFoundError:
                raise InvalidSplitError(f"shard {i + 1} of {count} is missing", field=name,
                                        offset=None) from None
            out.append(f)
            got = f.split()
            if got is None or got[0] != i or got[1] != count or got[2] != total:
                raise InvalidSplitError(f"holds split keys {got}, expected ({i}, {count}, "
                                        f"{total})", field=f.path, offset=None)
    except BaseException:
        for f in out:
            f.whole.detach_cleanup()
        raise
    return out
