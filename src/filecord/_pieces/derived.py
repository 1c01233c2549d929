"""Derived: bytes computed from file-backed ranges by a function, a bounded chunk at a time.

Theory of operation
-------------------
Some output bytes are neither in memory nor a range of a file: a dtype cast of a tensor, a
byte swap.  Holding them in memory costs their size; writing them to a scratch file first puts
a file outside the save's transaction (a crash leaves it behind).  A :class:`Derived` piece
holds no bytes: it names its source ranges (in output order) and an elementwise ``transform``
that turns ``in_item``-byte source elements into ``out_item``-byte output elements, so the
output is ``sum(len(source)) // in_item * out_item`` bytes and any run of whole source
elements maps to a run of whole output elements.

The save writes it like in-memory bytes, into its temp, during the fill: each source is read
at most ``chunk`` bytes (whole elements) at a time, transformed and written at once, so host
memory is one chunk and its transform's output.  The fill runs before any source is parked or
cut, so a Derived piece reads its sources whole even when the same save consumes them; it
reads them through the save's checked descriptors (the same identity and re-check as a copy).
It is copy-only: its bytes are new, never moved or cloned, and never a placement of its
sources (a rollback takes nothing back from them).  A transform that raises stops the fill:
the save fails before its journal, and nothing it made is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from filecord._pieces.data import CHUNK, FileBackedData

Reader = Callable[[FileBackedData, int, int], bytes]  # (range, start in it, length) -> bytes
Transform = Callable[[memoryview], object]  # source elements -> a buffer of output elements


def _read(r: FileBackedData, start: int, n: int) -> bytes:
    return r.read_range(start, n)


class Derived:
    """``Derived(sources, in_item=4, out_item=2, transform=f)``: the bytes ``f`` makes of the
    sources' elements, in order.  Every source's length must be a multiple of ``in_item``;
    ``transform`` must return ``len(raw) // in_item * out_item`` bytes for each chunk (checked).
    ``label`` names it in errors (a tensor's name)."""

    __slots__ = ("_in_item", "_label", "_length", "_out_item", "_sources", "_transform")

    def __init__(self, sources: Sequence[FileBackedData], *, in_item: int, out_item: int,
                 transform: Transform, label: str = "") -> None:
        if in_item < 1 or out_item < 1:
            raise ValueError(f"element sizes must be positive, got {in_item} and {out_item}")
        bad = [len(s) for s in sources if len(s) % in_item]
        if bad:
            raise ValueError(f"{label or 'a derived piece'}: a source of {bad[0]} bytes is not "
                             f"whole {in_item}-byte elements")
        self._sources = tuple(sources)
        self._in_item = in_item
        self._out_item = out_item
        self._transform = transform
        self._label = label
        self._length = sum(len(s) for s in sources) // in_item * out_item

    @property
    def sources(self) -> tuple[FileBackedData, ...]:
        return self._sources

    @property
    def label(self) -> str:
        return self._label

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"Derived({self._label!r}, {len(self._sources)} source range(s), "
                f"{self._length} bytes)")

    def check(self) -> None:
        """Raise ``DataChangedError`` if a source no longer holds its bytes."""
        for s in self._sources:
            s.check()

    def chunks(self, read: Reader = _read, chunk: int = CHUNK) -> Iterator[memoryview]:
        """The output, a chunk at a time: at most ``chunk`` source bytes (at least one element)
        read with ``read(range, start, n)`` and transformed per step."""
        step = max(self._in_item, chunk // self._in_item * self._in_item)
        for r in self._sources:
            for start in range(0, len(r), step):
                n = min(step, len(r) - start)
                made: Any = self._transform(memoryview(read(r, start, n)))
                out = memoryview(made).cast("B")
                if len(out) != n // self._in_item * self._out_item:
                    raise ValueError(f"{self._label or 'a derived piece'}: the transform made "
                                     f"{len(out)} bytes of {n} source bytes")
                yield out

    def to_bytes(self) -> bytes:
        """All bytes in memory (costs ``len(self)``)."""
        return b"".join(bytes(c) for c in self.chunks())
