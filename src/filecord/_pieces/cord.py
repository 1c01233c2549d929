"""Cord: an ordered sequence of pieces: in-memory bytes, file-backed ranges, derived bytes.

A cord never copies file-backed bytes into memory on its own; only ``bytes(cord)`` (explicit,
and documented as costly) does.  ``write_to_file`` streams into a file object the caller opened,
always as a copy: a foreign file object may be a pipe, a compressor or opened ``O_APPEND``, so
nothing is ever moved into it (failure F4).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Protocol, Union

from filecord._pieces.data import CHUNK, FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows

log = logging.getLogger(__name__)

Piece = Union[memoryview, FileBackedData, FileRows, Derived]  # noqa: UP007 - a runtime alias on 3.10
PieceLike = Union[bytes, bytearray, memoryview, FileBackedData, FileRows, Derived, "Cord"]


class Writable(Protocol):
    def write(self, data: bytes | memoryview, /) -> object: ...


def as_piece(item: bytes | bytearray | memoryview | FileBackedData | FileRows | Derived
             ) -> Piece:
    """Normalize one piece; in-memory buffers become flat byte views (no copy)."""
    if isinstance(item, (FileBackedData, FileRows, Derived)):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        view = memoryview(item)
        if not view.contiguous:
            raise ValueError("in-memory pieces must be contiguous buffers")
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    raise TypeError(
        f"a Cord piece must be bytes, bytearray, memoryview, FileBackedData, FileRows, Derived "
        f"or Cord, "
        f"not {type(item).__name__}"
    )


class Cord:
    """An ordered sequence of pieces; ``len`` is the total byte count.

    ``Cord([b"header", data])``; ``append`` takes a piece or another cord (which extends).
    In-memory buffers are kept by reference: do not mutate a bytearray after appending it.
    """

    __slots__ = ("_length", "_pieces")

    def __init__(self, pieces: Iterable[PieceLike] = ()) -> None:
        self._pieces: list[Piece] = []
        self._length = 0
        for p in pieces:
            self.append(p)

    def append(self, item: PieceLike) -> None:
        if isinstance(item, Cord):
            if item is self:
                raise ValueError("cannot append a cord to itself")
            self._pieces.extend(item._pieces)
            self._length += item._length
            return
        piece = as_piece(item)
        self._pieces.append(piece)
        self._length += len(piece)

    def extend(self, items: Iterable[PieceLike]) -> None:
        for item in items:
            self.append(item)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        return tuple(self._pieces)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Piece]:
        return iter(self._pieces)

    def __repr__(self) -> str:
        files = sum(isinstance(p, (FileBackedData, FileRows)) for p in self._pieces)
        return f"Cord({len(self._pieces)} pieces, {self._length} bytes, {files} file-backed)"

    def __bytes__(self) -> bytes:
        """Every byte in memory, file-backed pieces included: costs ``len(self)`` of RAM."""
        if any(isinstance(p, (FileBackedData, FileRows)) for p in self._pieces):
            log.debug("bytes(cord) reads %d bytes of file-backed data into memory", self._length)
        return b"".join(p if isinstance(p, memoryview) else p.to_bytes() for p in self._pieces)

    def file_backed_buffers(self) -> list[FileBackedData]:
        """The distinct file-backed pieces, in first-use order (a :class:`FileRows` by its
        base range)."""
        seen: dict[int, FileBackedData] = {}
        for p in self._pieces:
            if isinstance(p, FileRows):
                p = p.base
            if isinstance(p, FileBackedData):
                seen.setdefault(id(p), p)
        return list(seen.values())

    def check(self) -> None:
        """Raise ``DataChangedError`` if any file-backed piece (or a derived piece's source) no
        longer holds its bytes."""
        for p in self.file_backed_buffers():
            p.check()
        for piece in self._pieces:
            if isinstance(piece, Derived):
                piece.check()

    def write_to_file(self, fileobj: Writable, *, chunk: int = CHUNK) -> int:
        """Stream every byte into ``fileobj`` (a copy, never a move); returns the bytes written.

        Every file-backed piece is verified before the first byte is written, so a changed file
        is reported before the caller's file is touched.
        """
        self.check()
        written = 0
        for p in self._pieces:
            if isinstance(p, FileBackedData):
                with p.iter_chunks(chunk) as chunks:
                    for view in chunks:
                        _write_fully(fileobj, view)
                        written += len(view)
            elif isinstance(p, FileRows):
                for got in p.iter_chunks(chunk):
                    _write_fully(fileobj, memoryview(got))
                    written += len(got)
            elif isinstance(p, Derived):
                for view in p.chunks(chunk=chunk):
                    _write_fully(fileobj, view)
                    written += len(view)
            else:
                for start in range(0, len(p), chunk):
                    part = p[start : start + chunk]
                    _write_fully(fileobj, part)
                    written += len(part)
        return written


def _write_fully(fileobj: Writable, view: memoryview) -> None:
    # Raw (unbuffered) files may write less than asked and say so; loop until all is written.
    done = 0
    while done < len(view):
        n = fileobj.write(view[done:])
        if n is None or not isinstance(n, int):
            return  # text-agnostic writers that return nothing wrote everything or raised
        if n <= 0:
            raise OSError(f"{fileobj!r}.write wrote {n} bytes")
        done += n
