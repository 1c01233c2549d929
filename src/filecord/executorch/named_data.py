"""NamedDataStore: blobs by key, for the program (``.pte``) or for external data files by tag.

Theory of operation
-------------------
Keys are global over the program and every tag (the runtime merges all of them into one map).
Re-adding a key with equal bytes is a no-op; with different bytes it raises.  Equal blobs under
different keys are stored once: candidates are found by length, then compared by their first 32
bytes, then by sha256.  Each comparison is lazy and cached, and a ``FileBackedData`` whose
digest is already known (``known_sha256``) is never read, not even for its prefix, when the
other side's digest is known too: a multi-gigabyte blob handed over with its digest costs no
I/O here.  A buffer used by several keys keeps the lcm of their alignments, so every key's
request is met by the single segment it ends up in.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord.executorch._layout import positive_int
from filecord.executorch.errors import InvalidTagError, NamedDataConflictError
from filecord.executorch.values import Blob, PtdEntry, TensorLayout

_PREFIX = 32


@dataclass(frozen=True, slots=True)
class DataEntry:
    """Where a key's bytes are: ``buffer_index`` into the store's buffers, with the alignment
    and layout it was added with."""

    buffer_index: int
    alignment: int
    tensor_layout: TensorLayout | None


def validate_tag(tag: str) -> str:
    """A tag becomes a file name (``<tag>.ptd``): it must be one plain path component."""
    if not isinstance(tag, str) or not tag:
        raise InvalidTagError(f"an external tag must be a non-empty string, got {tag!r}")
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(s in tag for s in seps) or "\0" in tag or tag in (".", ".."):
        raise InvalidTagError(
            f"external tag {tag!r} must be a plain file name (no path separator, NUL, '.', '..')"
        )
    return tag


class NamedDataStore:
    """Blobs by key; see the module docstring for the deduplication rules."""

    def __init__(self) -> None:
        self._buffers: list[Blob] = []
        self._alignment: list[int] = []  # per buffer: lcm over every key using it
        self._pte: dict[str, DataEntry] = {}
        self._external: dict[str, dict[str, DataEntry]] = {}
        self._key_buffer: dict[str, int] = {}
        # Indexes that find an equal buffer without comparing with every earlier one (a merge
        # of 2 x 10k entries would otherwise make 10^8 comparisons): by object identity, by
        # (length, sha256) once a digest is known, and by (length, first bytes), which are read
        # only when a second buffer of that length arrives (``_unread``: not yet indexed).
        self._by_identity: dict[int, int] = {}
        self._by_digest: dict[tuple[int, str], int] = {}
        self._by_prefix: dict[tuple[int, bytes], list[int]] = {}
        self._unread: dict[int, list[int]] = {}
        self._lengths: set[int] = set()
        self._prefix: dict[int, bytes] = {}
        self._digest: dict[int, str] = {}

    # --- views -----------------------------------------------------------------------------
    @property
    def buffers(self) -> tuple[Blob, ...]:
        return tuple(self._buffers)

    @property
    def pte_data(self) -> dict[str, DataEntry]:
        return dict(self._pte)

    @property
    def external_data(self) -> dict[str, dict[str, DataEntry]]:
        return {tag: dict(m) for tag, m in self._external.items() if m}

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(tag for tag, m in self._external.items() if m)

    def buffer_alignment(self, index: int) -> int:
        return self._alignment[index]

    def entries(self, tag: str | None = None) -> dict[str, PtdEntry]:
        """The keys of the program (``tag=None``) or of one tag, ready for ``build_ptd``.

        Keys sharing a buffer share the same data object; each entry carries its buffer's
        (lcm) alignment.
        """
        source = self._pte if tag is None else self._external.get(tag, {})
        return {
            key: PtdEntry(
                key,
                self._buffers[e.buffer_index],
                e.tensor_layout,
                self._alignment[e.buffer_index],
                e.buffer_index,
            )
            for key, e in source.items()
        }

    # --- adding ----------------------------------------------------------------------------
    def add_named_data(
        self,
        key: str,
        data: bytes | bytearray | memoryview | FileBackedData,
        *,
        alignment: int = 1,
        external_tag: str | None = None,
        tensor_layout: TensorLayout | None = None,
    ) -> None:
        """Add ``data`` under ``key``: in the program, or in the data file ``external_tag``.

        Raises :class:`NamedDataConflictError` if ``key`` already holds different bytes
        (anywhere in the store); equal bytes make this a no-op.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be str, not {type(key).__name__}")
        positive_int(alignment, "alignment")
        if external_tag is not None:
            validate_tag(external_tag)
        if tensor_layout is not None and not isinstance(tensor_layout, TensorLayout):
            raise TypeError(f"tensor_layout must be a TensorLayout, not {type(tensor_layout)}")
        blob: Blob
        if isinstance(data, FileBackedData):
            blob = data
        elif isinstance(data, (bytes, bytearray, memoryview)):
            blob = bytes(data)  # a private copy only for mutable buffers (bytes(b) is b)
        else:
            raise TypeError(f"data must be bytes or FileBackedData, not {type(data).__name__}")

        existing = self._key_buffer.get(key)
        if existing is not None:
            if not self._same(existing, blob):
                raise NamedDataConflictError(
                    f"key {key!r} already holds {len(self._buffers[existing])} different bytes"
                )
            return
        index = self._find(blob)
        if index is None:
            index = len(self._buffers)
            self._buffers.append(blob)
            self._alignment.append(alignment)
            self._by_identity[id(blob)] = index  # the list keeps the object, so its id
            self._unread.setdefault(len(blob), []).append(index)
            self._lengths.add(len(blob))
            known = _known_digest(blob)
            if known is not None:
                self._digest[index] = known
                self._by_digest.setdefault((len(blob), known), index)
        else:
            self._alignment[index] = math.lcm(self._alignment[index], alignment)
        target = self._pte if external_tag is None else self._external.setdefault(external_tag, {})
        target[key] = DataEntry(index, alignment, tensor_layout)
        self._key_buffer[key] = index

    def add_tensor(
        self,
        key: str,
        tensor: Any,
        *,
        alignment: int = 16,
        external_tag: str | None = None,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        """Stream a torch tensor into an owned file-backed blob and add it with its layout.

        The bytes go from the tensor's memory to a scratch file in ``directory`` (default: the
        system temp directory; put it on the output's file system so a consuming save can
        move it) one chunk at a time, hashed while written, so deduplication reads nothing.
        The layout (scalar type, sizes, dim order: contiguous or channels-last) is inferred.
        """
        from filecord.executorch._torch_layout import tensor_blob  # torch is imported only there

        where = _sys.gettempdir() if directory is None else os.fspath(directory)
        data, layout = tensor_blob(key, tensor, where)
        self.add_named_data(
            key, data, alignment=alignment, external_tag=external_tag, tensor_layout=layout
        )

    def merge(self, other: NamedDataStore) -> None:
        """Add every key of ``other`` (program keys first, then each tag), sharing its blobs."""
        for key, e in other._pte.items():
            self.add_named_data(
                key,
                other._buffers[e.buffer_index],
                alignment=e.alignment,
                tensor_layout=e.tensor_layout,
            )
        for tag, entries in other._external.items():
            for key, e in entries.items():
                self.add_named_data(
                    key,
                    other._buffers[e.buffer_index],
                    alignment=e.alignment,
                    external_tag=tag,
                    tensor_layout=e.tensor_layout,
                )

    # --- comparison ------------------------------------------------------------------------
    def _same(self, index: int, blob: Blob) -> bool:
        mine = self._buffers[index]
        if mine is blob:
            return True
        if len(mine) != len(blob):
            return False
        known_mine, known_new = self._digest.get(index), _known_digest(blob)
        if known_mine is None and isinstance(mine, FileBackedData):
            known_mine = mine.known_sha256
        if known_mine is not None and known_new is not None:
            return known_mine == known_new
        if self._prefix_of(index) != _prefix(blob):
            return False
        return self._digest_of(index) == _digest(blob)

    def _find(self, blob: Blob) -> int | None:
        """The buffer holding exactly ``blob``'s bytes, or None (every buffer holds different
        bytes, so at most one matches).  Each buffer's prefix and digest are computed at most
        once, and only when a buffer of its length (and prefix) arrives."""
        n = len(blob)
        same = self._by_identity.get(id(blob))
        if same is not None and self._buffers[same] is blob:
            return same
        known = _known_digest(blob)
        if known is not None and (n, known) in self._by_digest:
            return self._by_digest[(n, known)]
        if n not in self._lengths:  # nothing to compare with: nothing read
            return None
        for i in self._unread.pop(n, ()):
            self._by_prefix.setdefault((n, self._prefix_of(i)), []).append(i)
        candidates = self._by_prefix.get((n, _prefix(blob)))
        if not candidates:
            return None
        if n <= _PREFIX:  # the prefix is the whole content
            return candidates[0]
        digest = known if known is not None else _digest(blob)
        for i in candidates:
            mine = self._digest_of(i)
            self._by_digest.setdefault((n, mine), i)
            if mine == digest:
                return i
        return None

    def _prefix_of(self, index: int) -> bytes:
        if index not in self._prefix:
            self._prefix[index] = _prefix(self._buffers[index])
        return self._prefix[index]

    def _digest_of(self, index: int) -> str:
        if index not in self._digest:
            self._digest[index] = _digest(self._buffers[index])
        return self._digest[index]


def _prefix(blob: Blob) -> bytes:
    return blob.prefix(_PREFIX) if isinstance(blob, FileBackedData) else blob[:_PREFIX]


def _digest(blob: Blob) -> str:
    # FileBackedData streams its digest once and caches it on the object.
    return blob.sha256() if isinstance(blob, FileBackedData) else hashlib.sha256(blob).hexdigest()


def _known_digest(blob: Blob) -> str | None:
    return blob.known_sha256 if isinstance(blob, FileBackedData) else None
