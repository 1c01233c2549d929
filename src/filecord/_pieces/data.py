"""FileBackedData: bytes that live in a file, a whole file or a range of one.

Theory of operation
-------------------
A piece records the file's size, device, inode and modification time when it is made.  Every read
opens the file, ``fstat``s the descriptor and compares; any difference raises
:class:`DataChangedError`.  The state therefore lives on the file, not in a flag on one object:
a second object on the same file, or a copy, sees a consumed or rewritten file too (failure F2).

An *owned* file is one filecord may delete: explicitly with ``close()``, or by a consuming save
at its commit point.  Nothing deletes an owned file behind the caller's back: no finalizer runs
at collection, so a save that fails, or a script that ends with an exception, leaves every
owned file on disk, byte-exact (failure F9 and the README pattern of issue 14).  The only files
deleted at collection are *scratch* files filecord itself created for an internal step (the
tensor files of ``filecord.torch``), and only while no save has been given them: a save detaches
that finalizer before it reads them.  ``move_from`` adopts a file by renaming it to a private
name in the same directory (``.NAME.TOKEN.filecord-owned``, within NAME_MAX); the private name
is first created with ``O_EXCL`` so the rename can never clobber someone else's file.  A crash
after that rename leaves the data under the private name, never lost.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_mod
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path
from filecord.errors import DataChangedError

CHUNK = 8 << 20  # one reusable read buffer; bounds host memory of every streamed read


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What a file looked like when a piece was made: the facts every read re-checks."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FileBackedData:
    """A range of a file, read lazily and re-checked on every read.

    ``FileBackedData(path, offset=0, length=None, owned=False, sha256=None)``: ``length`` defaults
    to the rest of the file.  ``owned=True`` lets filecord delete the file (``close()``, garbage
    collection, or a consuming save).  ``sha256`` is a hex digest the caller already knows; it is
    trusted and never recomputed.  ``copy.copy`` and ``copy.deepcopy`` return the object itself:
    a file has one owner.
    """

    __slots__ = (
        "__weakref__",
        "_identity",
        "_length",
        "_offset",
        "_owner",
        "_path",
        "_sha256",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        offset: int = 0,
        length: int | None = None,
        owned: bool = False,
        sha256: str | None = None,
    ) -> None:
        self._path = os.fspath(path)
        if offset < 0:
            raise ValueError(f"{self._path}: offset must be >= 0, got {offset}")
        st = _sys.stat(self._path)
        if not stat_mod.S_ISREG(st.st_mode):
            raise ValueError(f"{self._path}: not a regular file")
        if offset > st.st_size:
            raise ValueError(f"{self._path}: offset {offset} is past the end ({st.st_size} bytes)")
        if length is None:
            length = st.st_size - offset
        if length < 0 or offset + length > st.st_size:
            raise ValueError(
                f"{self._path}: range [{offset}, {offset + length}) is outside the file "
                f"({st.st_size} bytes)"
            )
        if sha256 is not None and (len(sha256) != 64 or not _is_hex(sha256)):
            raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
        self._identity = FileIdentity.of(st)
        self._offset = offset
        self._length = length
        self._sha256 = sha256.lower() if sha256 else None
        self._owner = _Owner(self._path, self._identity) if owned else None

    @classmethod
    def _scratch(cls, path: str, *, sha256: str | None = None) -> FileBackedData:
        """An owned temporary (made by filecord, or handed over by ExecuTorch): deleted when
        the last piece of it is collected, unless a save has been given it."""
        data = cls(path, owned=True, sha256=sha256)
        if data._owner is not None:
            data._owner.arm()
        return data

    @classmethod
    def move_from(cls, path: str | os.PathLike[str]) -> FileBackedData:
        """Adopt ``path``: rename it to a private name in its directory and own it."""
        src = os.fspath(path)
        st = _sys.lstat(src)
        if not stat_mod.S_ISREG(st.st_mode):
            raise ValueError(f"{src}: move_from needs a regular file (not a symlink or device)")
        directory, name = os.path.split(kernel_path(src))
        for _ in range(100):
            private = os.path.join(
                directory, _names.token_name(name, _names.new_token(), _names.OWNED)
            )
            try:
                fd = _sys.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            _sys.close(fd)
            try:
                _sys.rename(src, private)
            except BaseException:
                _sys.unlink(private)
                raise
            return cls(private, owned=True)
        raise FileExistsError(errno.EEXIST, f"no free private name next to {src}")

    # --- identity and lifetime ---------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def owned(self) -> bool:
        return self._owner is not None and not self._owner.disowned

    def slice(self, start: int, length: int, *, sha256: str | None = None) -> FileBackedData:
        """A sub-range of this piece, sharing its file and its ownership (no new stat).

        Every slice of an owned file shares one owner: the file is deleted when the last of
        them is collected, or at once when any of them is closed.
        """
        if start < 0 or length < 0 or start + length > self._length:
            raise ValueError(f"slice [{start}, {start + length}) outside a piece of {self._length}")
        new = object.__new__(FileBackedData)
        new._path = self._path
        new._identity = self._identity
        new._offset = self._offset + start
        new._length = length
        new._owner = self._owner
        new._sha256 = sha256.lower() if sha256 else None
        if start == 0 and length == self._length and sha256 is None:
            new._sha256 = self._sha256
        return new

    def same_file_as(self, other: FileBackedData) -> bool:
        """Whether this piece names the same file as ``other``, captured by the same look and
        under the same ownership (slices of one piece): what is checked, owned or cleaned up
        through one holds for the other."""
        return (self._identity is other._identity and self._owner is other._owner
                and self._path == other._path)

    def continues(self, other: FileBackedData) -> bool:
        """Whether this piece is the bytes right after ``other`` of the same file as it
        (:meth:`same_file_as`), and not empty: the two can be planned, copied and moved as
        one range."""
        # same_file_as, spelled out: this runs once per piece of every save
        return (self._offset == other._offset + other._length and self._length > 0
                and self._identity is other._identity and self._owner is other._owner
                and self._path == other._path)

    @property
    def identity(self) -> FileIdentity:
        """The file's facts when this piece was made."""
        return self._identity

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        own = ", owned=True" if self.owned else ""
        return f"FileBackedData({self._path!r}, offset={self._offset}, length={self._length}{own})"

    def __copy__(self) -> FileBackedData:
        return self

    def __deepcopy__(self, memo: object) -> FileBackedData:
        return self

    def _arm_scratch(self) -> None:
        """Give a scratch file back to the collector after a save that used it rolled back in
        full and could not remove it: nothing but filecord ever held its bytes."""
        if self._owner is not None:
            self._owner.arm()

    def _borrowed(self) -> FileBackedData:
        """The same range of the same captured file (its identity as it was when this piece
        was made, so a later rewrite is still a ``DataChangedError``), without the deletion
        right: a save only reads it."""
        new = self.slice(0, self._length)
        new._owner = None
        return new

    def _disown(self) -> None:
        """Give up the deletion right over the file, for every slice of it at once: a
        consuming save then copies its bytes and keeps it (the operation skeleton does this for
        an input it must keep: another hard link, another file system)."""
        if self._owner is not None:
            self._owner.detach()
            self._owner.disowned = True

    def detach_cleanup(self) -> None:
        """Never delete the file at collection (a save was given it); ``close()`` still does."""
        if self._owner is not None:
            self._owner.detach()

    def close(self) -> None:
        """Delete an owned file now (a no-op for files we do not own, and when already gone)."""
        if self._owner is not None:
            self._owner.close()

    # --- checked reads ---------------------------------------------------------------------
    def _mismatch(self, found: os.stat_result | None) -> str | None:
        ident = self._identity
        if found is None:
            return "the file is gone"
        if (found.st_dev, found.st_ino) != (ident.dev, ident.ino):
            return "the path now names another file"
        if found.st_size != ident.size:
            return "the file size changed"
        if found.st_mtime_ns != ident.mtime_ns:
            return "the file was modified"
        return None

    def _raise_changed(self, found: os.stat_result | None, reason: str) -> None:
        raise DataChangedError(
            self._path,
            expected_size=self._identity.size,
            found_size=None if found is None else found.st_size,
            reason=reason,
        )

    def check(self) -> None:
        """Raise :class:`DataChangedError` unless the file still holds this piece's bytes."""
        try:
            found: os.stat_result | None = _sys.stat(self._path)
        except FileNotFoundError:
            found = None
        reason = self._mismatch(found)
        if reason is not None:
            self._raise_changed(found, reason)

    def open_checked(self) -> int:
        """Open the file read-only and verify it through the descriptor; the caller closes it."""
        try:
            fd = _sys.open(self._path, os.O_RDONLY)
        except FileNotFoundError:
            self._raise_changed(None, "the file is gone")
            raise  # unreachable: _raise_changed always raises; keeps the type checker honest
        try:
            found = _sys.fstat(fd)
            reason = self._mismatch(found)
            if reason is not None:
                self._raise_changed(found, reason)
        except BaseException:
            _sys.close(fd)
            raise
        return fd

    def read_range(self, start: int, n: int) -> bytes:
        """``n`` bytes starting ``start`` bytes into this piece."""
        if start < 0 or n < 0 or start + n > self._length:
            raise ValueError(f"range [{start}, {start + n}) outside a piece of {self._length}")
        return self.read_segments([(self._offset + start, n)])[0]

    def read_segments(self, segs: Iterable[tuple[int, int]]) -> list[bytes]:
        """The bytes at each ``(file offset, length)``, through one checked open (a file
        shortened while it is read is reported as the change it is)."""
        fd = self.open_checked()
        try:
            return [_sys.read_all(fd, at, ln) for at, ln in segs]
        except OSError as exc:
            if exc.errno == errno.EIO:
                self.check()  # shortened while we read: report the change
            raise
        finally:
            _sys.close(fd)

    def prefix(self, n: int) -> bytes:
        """The first ``min(n, len(self))`` bytes."""
        return self.read_range(0, min(max(n, 0), self._length))

    def to_bytes(self) -> bytes:
        """All bytes in memory.  Prefer streaming; this costs ``len(self)`` of host memory."""
        return self.read_range(0, self._length)

    def __bytes__(self) -> bytes:
        """``bytes(data)`` loads the whole range into memory, like :meth:`to_bytes`."""
        return self.to_bytes()

    def iter_chunks(self, chunk: int = CHUNK) -> _ChunkReader:
        """Stream the bytes through one reused buffer; each view is valid until the next."""
        return _ChunkReader(self, chunk)

    def sha256(self) -> str:
        """Hex sha256 of the bytes, streamed once and cached (or the digest given at creation)."""
        if self._sha256 is None:
            h = hashlib.sha256()
            with self.iter_chunks() as chunks:
                for view in chunks:
                    h.update(view)
            self._sha256 = h.hexdigest()
        return self._sha256

    @property
    def known_sha256(self) -> str | None:
        """The digest if it is already known, without reading the file."""
        return self._sha256


class _Owner:
    """The deletion right over one file, shared by every piece (slice) of it.

    ``close()`` deletes the file if it still matches what was adopted (inode numbers are reused
    at once, so size and modification time are compared too).  Only scratch files arm the
    finalizer that does the same when the last piece holding it is collected.
    """

    __slots__ = ("__weakref__", "_closed", "_finalizer", "_identity", "_path", "disowned")

    def __init__(self, path: str, identity: FileIdentity) -> None:
        self._path = path
        self._identity = identity
        self._finalizer: weakref.finalize[[str, int, int, int, int], _Owner] | None = None
        self._closed = False
        self.disowned = False  # the right was given up: nothing deletes the file any more

    def arm(self) -> None:
        if self._finalizer is None or not self._finalizer.alive:
            i = self._identity
            self._finalizer = weakref.finalize(
                self, _sys.unlink_if_same, self._path, i.dev, i.ino, i.size, i.mtime_ns
            )

    def detach(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def close(self) -> None:
        self.detach()
        if not self._closed and not self.disowned:
            i = self._identity
            _sys.unlink_if_same(self._path, i.dev, i.ino, i.size, i.mtime_ns)
            self._closed = True


class _ChunkReader:
    """Context manager + iterator over a piece's bytes through one reused buffer.

    The descriptor is opened (and the file verified) on ``__enter__``; each yielded view is
    valid until the next one, so host memory stays at one chunk whatever the piece's size.
    """

    def __init__(self, data: FileBackedData, chunk: int) -> None:
        self._data = data
        self._buf = memoryview(bytearray(max(1, min(chunk, len(data)))))
        self._fd: int | None = None
        self._pos = 0

    def __enter__(self) -> _ChunkReader:
        self._fd = self._data.open_checked()
        self._pos = 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            _sys.close(self._fd)
            self._fd = None

    def __iter__(self) -> _ChunkReader:
        return self

    def __next__(self) -> memoryview:
        if self._fd is None:
            raise RuntimeError("iterate inside `with data.iter_chunks() as chunks:`")
        remaining = len(self._data) - self._pos
        if remaining <= 0:
            raise StopIteration
        view = self._buf[: min(len(self._buf), remaining)]
        got = 0
        while got < len(view):
            n = _sys.preadinto(self._fd, view[got:], self._data.offset + self._pos + got)
            if n <= 0:
                self._data.check()  # a file shortened under us is a change, not an I/O error
                raise OSError(errno.EIO, f"{self._data.path}: unexpected end of file")
            got += n
        self._pos += len(view)
        return view


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True
