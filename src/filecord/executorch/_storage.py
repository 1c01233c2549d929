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

The digest is a promise about bytes that stay in the user's hands: a weight written in place
between the export and the save (``weight.mul_(0)``, a shared mapping written through) would
reach the file under keys and hashes of its old bytes.  So the reference remembers the state
of the file it was mapped from when it hashed (``note_file``: device, inode, size, mtime,
ctime), and whoever writes its bytes checks them against the digest first:
:meth:`~StorageRef.check` hashes the view again (``fe.save`` calls it before the transaction
starts, except for a private mapping whose file's state is still the one noted), and
ExecuTorch's own writers (``write_to_file``, ``to_bytes``) hash what they hand out and raise
:class:`~filecord.errors.DataChangedError` at the end instead of returning.

Bytes computed during lowering (a quantized, transposed or packed weight) live in an anonymous
allocation that would otherwise stay alive until the save.  :func:`spill` writes such a storage
once, in chunks, into a scratch file (hashing as it goes) and returns ExecuTorch's own
``FileBackedData`` over it, owning the file: the allocation can then be freed at once.  The
scratch file is created with ``O_EXCL`` in the directory the caller names and deleted when its
last reference goes (filecord's save takes such files over, and may move them).
:func:`adopt_file` does the same for a file a backend already wrote (AOTI's weights blob): it
is renamed to a scratch name beside itself and hashed in chunks, instead of read whole.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from typing import Any

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError

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


def changed(where: str, size: int) -> DataChangedError:
    """The error for a constant whose bytes no longer hash to the digest taken at export."""
    return DataChangedError(
        where, expected_size=size, found_size=size,
        reason="a constant's bytes changed after lean_export() hashed them (a weight written "
               "in place between the export and the save, or its file rewritten); export "
               "again after the change, or save before it",
    )


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
            self._file_state: tuple[int, ...] | None = None
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

        @property
        def file_state(self) -> tuple[int, ...] | None:
            """The mapped file's state when the digest was taken (``note_file``), if any."""
            return self._file_state

        def note_file(self, state: tuple[int, ...] | None) -> None:
            self._file_state = state

        def __repr__(self) -> str:
            return f"StorageRef({self._size} bytes at {self.data_ptr:#x})"

        def _where(self) -> str:
            return f"<tensor storage of {self._size} bytes at {self.data_ptr:#x}>"

        def check(self) -> None:
            """Raise :class:`DataChangedError` unless the bytes still hash to the digest."""
            expected = self.sha256()
            if _digest(self._view) != expected:
                raise changed(self._where(), self._size)

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
            expected = self.sha256()
            out = bytes(self._view)
            if hashlib.sha256(out).digest() != expected:
                raise changed(self._where(), self._size)
            return out

        def write_to_file(self, outfile: Any) -> None:
            expected = self.sha256()
            h = hashlib.sha256()
            for start in range(0, self._size, CHUNK):
                chunk = self._view[start:start + CHUNK]
                h.update(chunk)
                outfile.write(chunk)
            if h.digest() != expected:
                raise changed(self._where(), self._size)

        def close(self) -> None:
            return None

    return StorageRef


def storage_ref(storage: Any) -> Any:
    """A reference to a CPU ``torch.UntypedStorage``'s bytes (digest computed on first use)."""
    return ref_type()(storage)


def is_ref(item: object) -> bool:
    return isinstance(item, ref_type())


def _scratch_name(directory: str) -> str:
    return os.path.join(directory, _names.token_name(
        "lean-export.weight", _names.new_token(), _names.OWNED))


def adopt_file(path: str) -> Any:
    """ExecuTorch ``FileBackedData`` owning the file at ``path``, renamed to a scratch name
    beside it (so ``path`` is gone, as if read and deleted), digest computed in chunks."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    owned = _scratch_name(os.path.dirname(path) or ".")
    _sys.rename(path, owned)  # a fresh random name: nothing there to replace
    fd = _sys.open(owned, os.O_RDONLY)
    try:
        h = hashlib.sha256()
        offset = 0
        while chunk := _sys.pread(fd, CHUNK, offset):
            h.update(chunk)
            offset += len(chunk)
    finally:
        _sys.close(fd)
    return EtFileBackedData(owned, cleanup=True, sha256=h.digest())


def spill(storage: Any, directory: str) -> Any:
    """ExecuTorch ``FileBackedData`` owning a scratch copy of ``storage`` (digest included)."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    view = _view(storage)
    for _ in range(100):
        path = _scratch_name(directory)
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
