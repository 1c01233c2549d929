"""Constants as references to tensor storage, in a form ExecuTorch's serializer accepts.

Theory of operation
-------------------
ExecuTorch's Cord and ``NamedDataStore`` take a buffer as ``bytes`` or as an instance of their
``FileBackedData``, which they use only through ``len``, ``prefix``, ``sha256``, ``to_bytes``,
``write_to_file`` and ``close``.  :func:`storage_ref` makes an instance of a subclass that
answers those from a zero-copy view of a tensor's CPU storage: the view is a ctypes array over
the storage's memory that holds the storage object, so the memory lives as long as any view,
Cord or program refers to it.  Its digest is computed once, by feeding the view to sha256 a
chunk at a time (hashlib reads the memory in place), so the digest equals the one of the
``bytes`` copy ExecuTorch would have made and every deduplication decision stays the same.

Nothing here reads a storage into a ``bytes``, except ``to_bytes`` (ExecuTorch's
``manager.buffer`` asks for the whole program); writing streams the view.

Bytes computed during lowering (a quantized, transposed or packed weight) live in an anonymous
allocation that would otherwise stay alive until the save.  :func:`spill` writes such a storage
once, in chunks, into a scratch file (hashing as it goes) and returns ExecuTorch's own
``FileBackedData`` over it, owning the file: the allocation can then be freed at once.  The
scratch file is created with ``O_EXCL`` in the directory the caller names and deleted when its
last reference goes (filecord's save takes such files over, and may move them).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from typing import Any

from filecord._io import names as _names
from filecord._io import syscalls as _sys

CHUNK = 8 << 20  # bytes hashed or written per step


def _view(storage: Any) -> memoryview:
    """A flat byte view over ``storage``'s memory that keeps ``storage`` alive."""
    size = int(storage.nbytes())
    array = (ctypes.c_char * size).from_address(int(storage.data_ptr()))
    setattr(array, "_filecord_storage", storage)  # noqa: B010 - the view's owner holds the memory's
    return memoryview(array).cast("B")


def _digest(view: memoryview) -> bytes:
    h = hashlib.sha256()
    for start in range(0, len(view), CHUNK):
        h.update(view[start:start + CHUNK])
    return h.digest()


@functools.cache
def ref_type() -> type:
    """The reference class, a subclass of ExecuTorch's ``FileBackedData`` (made on first use,
    so executorch stays an optional import)."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    class StorageRef(EtFileBackedData):  # type: ignore[misc]
        """Bytes of a tensor storage, seen in place (see the module docstring)."""

        def __init__(self, storage: Any) -> None:
            # No super().__init__: there is no file to stat and nothing to delete.
            self._storage = storage
            self._view = _view(storage)
            self._size = len(self._view)
            self._sha256: bytes | None = None
            self._finalizer = None

        @property
        def storage(self) -> Any:
            return self._storage

        @property
        def data_ptr(self) -> int:
            return int(self.storage.data_ptr())

        @property
        def view(self) -> memoryview:
            return self._view

        def __repr__(self) -> str:
            return f"StorageRef({self._size} bytes at {self.data_ptr:#x})"

        def __copy__(self) -> Any:
            return self

        def __deepcopy__(self, memo: object) -> Any:
            return self  # the same memory: a copy would only cost its size

        def prefix(self, size: int) -> bytes:
            return bytes(self._view[:size])

        def sha256(self) -> bytes:
            if self._sha256 is None:
                self._sha256 = _digest(self._view)
            return self._sha256

        def to_bytes(self) -> bytes:
            return bytes(self._view)

        def write_to_file(self, outfile: Any) -> None:
            for start in range(0, self._size, CHUNK):
                outfile.write(self._view[start:start + CHUNK])

        def close(self) -> None:
            return None

    return StorageRef


def storage_ref(storage: Any) -> Any:
    """A reference to a CPU ``torch.UntypedStorage``'s bytes (digest computed on first use)."""
    return ref_type()(storage)


def is_ref(item: object) -> bool:
    return isinstance(item, ref_type())


def spill(storage: Any, directory: str) -> Any:
    """ExecuTorch ``FileBackedData`` owning a scratch copy of ``storage`` (digest included)."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    view = _view(storage)
    for _ in range(100):
        path = os.path.join(directory, _names.token_name(
            "lean-export.weight", _names.new_token(), _names.OWNED))
        try:
            fd = _sys.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 random names taken
        raise FileExistsError(f"no free scratch name in {directory}")
    try:
        h = hashlib.sha256()
        for start in range(0, len(view), CHUNK):
            chunk = view[start:start + CHUNK]
            h.update(chunk)
            _sys.write_all(fd, chunk, None)
    except BaseException:
        _sys.close(fd)
        _sys.unlink(path)
        raise
    _sys.close(fd)
    return EtFileBackedData(path, cleanup=True, sha256=h.digest())
