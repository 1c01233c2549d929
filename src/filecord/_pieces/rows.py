"""FileRows: equal-length rows of one file range, in an order of the caller's, as one piece.

Theory of operation
-------------------
A reordering of whole rows (llama.cpp's Q/K permutation of a Hugging Face weight, the rows of a
column-sharded tensor taken from one shard) is a list of byte ranges of one file.  As
separate :class:`~filecord._pieces.data.FileBackedData` slices it costs one object per row in
the cord, and then one placement and one action per row in the plan, the save and its report
(about 0.7 KiB a row: 120,000 rows of a 4 GiB Llama were 88 MiB of RSS).  A ``FileRows`` is
one piece: the range it reads from (``base``, a ``FileBackedData`` that keeps the file's
identity and ownership) and two arrays of machine integers, the start and the length of each
*run* of rows in output order.  Rows that follow each other in the file and in the order are
one run, so a row-sharded tensor is one run and the arrays stay short where nothing is
reordered; where everything is (Q/K), 16 bytes a row.

Every read goes through ``base``: it opens the file and compares the identity captured when
the base was made, exactly as a slice would, so a rewritten or consumed file is a
:class:`~filecord.errors.DataChangedError` here too.  The plan and the transaction see one
piece whose source ranges are :meth:`runs`; they check the source's identity once per piece,
not once per row (the identity is a fact of the file, the same for every row of it).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator

from filecord._pieces.data import CHUNK, FileBackedData, FileIdentity


class FileRows:
    """``row``-byte rows of ``base`` (``order[k]``: the row of ``base`` that is row ``k``).

    ``FileRows(base, row, order)``: ``len(base)`` must be a multiple of ``row`` when
    ``order`` is None (every row once, in file order); otherwise each entry of ``order`` names
    a row of ``base`` (0-based; a row may appear more than once).  Adjacent rows are kept as
    one run.  The piece is ``row * len(order)`` bytes long.
    """

    __slots__ = ("_base", "_length", "_lens", "_row", "_starts")

    def __init__(self, base: FileBackedData, row: int, order: Iterable[int] | None = None
                 ) -> None:
        if row <= 0:
            raise ValueError(f"a row must be at least one byte, got {row}")
        count = len(base) // row
        if order is None:
            if len(base) % row:
                raise ValueError(f"{base.path}: {len(base)} bytes are not rows of {row}")
            order = range(count)
        starts = array("q")
        lens = array("q")
        end = -1
        n = 0
        for r in order:
            if not 0 <= r < count:
                raise ValueError(f"{base.path}: row {r} is outside a range of {count} rows")
            at = r * row
            if at == end:  # the row right after the previous one: the same run
                lens[-1] += row
            else:
                starts.append(at)
                lens.append(row)
            end = at + row
            n += 1
        self._base = base
        self._row = row
        self._starts = starts  # relative to base.offset
        self._lens = lens
        self._length = n * row

    # --- what the plan and the transaction read ----------------------------------------------
    @property
    def base(self) -> FileBackedData:
        """The range the rows are read from (its file, identity and ownership)."""
        return self._base

    @property
    def path(self) -> str:
        return self._base.path

    @property
    def identity(self) -> FileIdentity:
        return self._base.identity

    @property
    def owned(self) -> bool:
        return self._base.owned

    @property
    def row(self) -> int:
        return self._row

    @property
    def run_count(self) -> int:
        """How many source ranges the rows are (adjacent rows count once)."""
        return len(self._starts)

    def runs(self) -> Iterator[tuple[int, int]]:
        """``(file offset, length)`` of each run, in output order."""
        off = self._base.offset
        for s, n in zip(self._starts, self._lens, strict=True):
            yield off + s, n

    @property
    def lowest(self) -> int:
        """The file offset of the lowest byte the rows read (the base's offset when empty)."""
        return self._base.offset + (min(self._starts) if self._starts else 0)

    @property
    def highest(self) -> int:
        """The file offset just past the highest byte the rows read."""
        if not self._starts:
            return self._base.offset
        return self._base.offset + max(s + n for s, n in zip(self._starts, self._lens,
                                                             strict=True))

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"FileRows({self.path!r}, offset={self._base.offset}, row={self._row}, "
                f"rows={self._length // self._row}, runs={len(self._starts)})")

    def check(self) -> None:
        """Raise :class:`DataChangedError` unless the file still holds the base's bytes."""
        self._base.check()

    def slices(self) -> Iterator[FileBackedData]:
        """Each run as a slice of the base (made one at a time, for readers that want ranges)."""
        for s, n in zip(self._starts, self._lens, strict=True):
            yield self._base.slice(s, n)

    def ranges(self, start: int, n: int) -> list[FileBackedData]:
        """The bytes ``[start, start + n)`` of the piece as slices of the base, in order (for
        code that cuts a cord into plain ranges)."""
        if start < 0 or n < 0 or start + n > self._length:
            raise ValueError(f"range [{start}, {start + n}) outside a piece of {self._length}")
        off = self._base.offset
        return [self._base.slice(at - off, ln) for at, ln in self._segments(start, n)]

    # --- checked reads ---------------------------------------------------------------------
    def _segments(self, start: int, n: int) -> Iterator[tuple[int, int]]:
        """``(file offset, length)`` of the bytes ``[start, start + n)`` of the piece."""
        pos = 0
        end = start + n
        off = self._base.offset
        for s, ln in zip(self._starts, self._lens, strict=True):
            lo, hi = max(start, pos), min(end, pos + ln)
            if lo < hi:
                yield off + s + (lo - pos), hi - lo
            pos += ln
            if pos >= end:
                return

    def read_range(self, start: int, n: int) -> bytes:
        """``n`` bytes starting ``start`` bytes into the piece (one checked open)."""
        if start < 0 or n < 0 or start + n > self._length:
            raise ValueError(f"range [{start}, {start + n}) outside a piece of {self._length}")
        return b"".join(self._read_segments(self._segments(start, n)))

    def _read_segments(self, segs: Iterable[tuple[int, int]]) -> list[bytes]:
        return self._base.read_segments(segs)

    def prefix(self, n: int) -> bytes:
        return self.read_range(0, min(max(n, 0), self._length))

    def to_bytes(self) -> bytes:
        """All bytes in memory: costs ``len(self)`` of host memory."""
        return self.read_range(0, self._length)

    def __bytes__(self) -> bytes:
        return self.to_bytes()

    def iter_chunks(self, chunk: int = CHUNK) -> Iterator[bytes]:
        """The bytes in order, at most ``chunk`` at a time (each chunk one checked read)."""
        step = max(1, chunk)
        for start in range(0, self._length, step):
            yield self.read_range(start, min(step, self._length - start))

    def sha256(self) -> str:
        h = hashlib.sha256()
        for part in self.iter_chunks():
            h.update(part)
        return h.hexdigest()
