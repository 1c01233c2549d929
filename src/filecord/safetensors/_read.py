"""Reading safetensors files and sharded checkpoints: headers parsed, tensors never loaded.

The only I/O here is at the entry points: the first 8 bytes and the header are read through
``filecord._io.syscalls`` (at most ``min(N, file size)`` bytes, N capped by the format), then every
tensor becomes a :class:`~filecord.FileBackedData` range of one whole-file piece, so all
tensors of a file share one owner when the file is read with ``owned=True``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from filecord._io import syscalls as _sys
from filecord._kit.readfile import open_regular
from filecord._pieces.data import FileBackedData
from filecord.errors import DataChangedError, NotRegularFileError, reading
from filecord.safetensors._format import Header, decode_json, header_size, parse_header
from filecord.safetensors.errors import InvalidIndexError
from filecord.tensors import NamedTensor

MAX_INDEX = 1 << 30  # an index is JSON text; refuse absurd ones before reading them


@dataclass(frozen=True, slots=True)
class SafetensorsFile:
    """One ``.safetensors`` file: its validated header and its tensors in data order
    (read-only)."""

    path: str
    file_size: int
    header: Header
    tensors: Mapping[str, NamedTensor] = field(repr=False)
    whole: FileBackedData = field(repr=False)

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    @property
    def metadata(self) -> Mapping[str, str] | None:
        return self.header.metadata

    @property
    def data_start(self) -> int:
        return self.header.data_start


@dataclass(frozen=True, slots=True)
class SafetensorsIndex:
    """A sharded checkpoint: its ``*.index.json`` and the shards it names, all validated.

    ``tensors`` follows the order of ``weight_map``; ``metadata`` is the index's own (it holds
    ``total_size``), each shard's ``__metadata__`` is on its :class:`SafetensorsFile`.
    """

    path: str
    metadata: Mapping[str, object]
    weight_map: Mapping[str, str]
    shards: tuple[SafetensorsFile, ...]
    tensors: Mapping[str, NamedTensor] = field(repr=False)

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping the caller gave
        for name in ("metadata", "weight_map", "tensors"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


def _read_prefix(path: str) -> tuple[int, bytes, bytes]:
    fd = open_regular(path)
    try:
        size = _sys.fstat(fd).st_size
        first = _sys.read_all(fd, 0, min(8, size))
        n = header_size(first, size)
        raw = _sys.read_all(fd, 8, n)
    finally:
        _sys.close(fd)
    return size, first, raw


def checkpoint_in(directory: str) -> str | None:
    """The file that stands for a Hugging Face folder's checkpoint: its index, else its one
    ``model.safetensors``; None when it holds neither (callers word their own error)."""
    for name in ("model.safetensors.index.json", "model.safetensors"):
        path = os.path.join(directory, name)
        if _sys.isfile(path):
            return path
    return None


def read_file(path: str | os.PathLike[str], *, owned: bool = False) -> SafetensorsFile:
    """Read one ``.safetensors`` file; see :func:`read_safetensors` (a format error names it)."""
    with reading(os.fspath(path)):
        return _read_file(path, owned=owned)


def _read_file(path: str | os.PathLike[str], *, owned: bool = False) -> SafetensorsFile:
    """Read one ``.safetensors`` file; see :func:`read_safetensors`."""
    p = os.fspath(path)
    size, _first, raw = _read_prefix(p)
    header = parse_header(raw, size)
    whole = FileBackedData(p, owned=owned)
    try:
        if len(whole) != size:
            raise DataChangedError(p, expected_size=size, found_size=len(whole),
                                   reason="the file changed while its header was read")
        base = header.data_start
        tensors = {
            e.name: NamedTensor(e.name, e.dtype, e.shape,
                                whole.slice(base + e.begin, e.end - e.begin))
            for e in header.entries
        }
    except BaseException:
        whole.detach_cleanup()  # a failed read must never delete the user's file
        raise
    return SafetensorsFile(p, size, header, tensors, whole)


def _shard_name(name: object, key: str) -> str:
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name):
        raise InvalidIndexError(f"{name!r} is not a file name beside the index",
                                field=f"weight_map[{key!r}]", offset=None)
    return name


def _read_shard(directory: str, name: str, *, owned: bool) -> SafetensorsFile:
    try:
        return read_file(os.path.join(directory, name), owned=owned)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise InvalidIndexError(f"shard {name!r}: {exc.strerror}", field="weight_map",
                                offset=None) from None
    except NotRegularFileError as exc:  # a FIFO, a device, a directory: never opened to read
        raise InvalidIndexError(f"shard {exc.message}", field="weight_map",
                                offset=None) from None


def read_index(path: str | os.PathLike[str], *, owned: bool = False) -> SafetensorsIndex:
    """Read a ``*.index.json`` and every shard it names (file names beside the index only);
    a format error names the file it is in."""
    with reading(os.fspath(path)):
        return _read_index(path, owned=owned)


def _read_index(path: str | os.PathLike[str], *, owned: bool = False) -> SafetensorsIndex:
    """Read a ``*.index.json`` and every shard it names (file names beside the index only)."""
    p = os.fspath(path)
    fd = open_regular(p)
    try:
        size = _sys.fstat(fd).st_size
        if size > MAX_INDEX:
            raise InvalidIndexError(f"{size} bytes is too large for an index", field="index",
                                    offset=0)
        raw = _sys.read_all(fd, 0, size)
    finally:
        _sys.close(fd)
    obj, end = decode_json(raw, 0, "index")
    if raw[end:].strip(b" \t\r\n"):
        raise InvalidIndexError("text after the JSON value", field="index", offset=end)
    if not isinstance(obj, dict) or not isinstance(obj.get("weight_map"), dict):
        raise InvalidIndexError("must be an object with a 'weight_map' object", field="index",
                                offset=0)
    meta = obj.get("metadata", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InvalidIndexError("must be an object", field="metadata", offset=None)
    weight_map = {k: _shard_name(v, k) for k, v in obj["weight_map"].items()}
    directory = os.path.dirname(p)
    shards: dict[str, SafetensorsFile] = {}
    try:
        for name in weight_map.values():
            if name not in shards:
                shards[name] = _read_shard(directory, name, owned=owned)
        tensors = _check_shards(weight_map, shards)
    except BaseException:
        for f in shards.values():
            f.whole.detach_cleanup()  # a failed read must never delete the user's files
        raise
    return SafetensorsIndex(p, meta, weight_map, tuple(shards.values()), tensors)


def _check_shards(
    weight_map: dict[str, str], shards: dict[str, SafetensorsFile]
) -> dict[str, NamedTensor]:
    tensors: dict[str, NamedTensor] = {}
    for key, name in weight_map.items():
        t = shards[name].tensors.get(key)
        if t is None:
            raise InvalidIndexError(f"{name} has no tensor {key!r}", field=f"weight_map[{key!r}]",
                                    offset=None)
        tensors[key] = t
    for name, shard in shards.items():
        for key in shard.tensors:
            if weight_map.get(key) != name:
                raise InvalidIndexError(f"{name} holds {key!r}, which the index does not map "
                                        f"to it", field="weight_map", offset=None)
    return tensors


def read_safetensors(
    path: str | os.PathLike[str], *, owned: bool = False
) -> SafetensorsFile | SafetensorsIndex:
    """Read a ``.safetensors`` file, or a sharded checkpoint through its ``*.index.json``.

    The header is validated against every rule of the format; malformed input raises a
    :class:`~filecord.safetensors.errors.SafetensorsFormatError` subclass naming the field and
    the byte offset.  Work and memory are bounded by the header (itself capped by the format
    and the file's size); tensor bytes are never read: each tensor's ``data`` is a
    ``FileBackedData`` range.  ``owned=True`` lets a consuming save move the files (and
    deletes them when the last piece is dropped; call ``detach_cleanup`` to keep them).
    """
    p = os.fspath(path)
    if p.endswith(".json"):
        return read_index(p, owned=owned)
    return read_file(p, owned=owned)
