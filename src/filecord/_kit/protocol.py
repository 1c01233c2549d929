"""The format protocol: what every format (``.pte``, ``.ptd``, safetensors, GGUF) offers.

A format says what it can do with :class:`Capability` flags (zarr's store pattern: ask the
flags, never ``isinstance``) and implements :class:`Format`: ``sniff`` (is this file mine?
by its first bytes, never by its name alone), ``read`` (headers only, tensors as file-backed
ranges), ``build`` (a Cord from values) and, where its flags say so, ``merge``, ``reshard`` and
``convert`` (all three save through the operation skeleton and return an
:class:`~filecord._kit.operation.OperationReport`).  A format that lacks an operation raises
``NotImplementedError`` naming the format and the operation; the flags say so beforehand.

Each format package registers one object implementing this (``<package>/_protocol.py``);
:mod:`filecord._formats` lists them.  The formats themselves are not rewritten: each
registration adapts the package's own functions.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from filecord._io import syscalls as _sys
from filecord._kit.operation import OperationReport
from filecord._kit.readfile import kind_of

PathLike = str | os.PathLike[str]


class Capability(enum.Flag):
    """What a format can do."""

    READ = enum.auto()
    BUILD = enum.auto()
    MERGE = enum.auto()
    RESHARD = enum.auto()
    CONVERT = enum.auto()


@runtime_checkable
class Format(Protocol):
    """One file format, as the kit sees it."""

    name: str
    suffixes: tuple[str, ...]
    capabilities: Capability

    def sniff(self, path: PathLike) -> bool:
        """True when ``path`` is a regular file that starts like this format (reads at most a
        few bytes, never blocks: a FIFO or device is never this format)."""
        ...

    def read(self, path: PathLike, *, owned: bool = False) -> object:
        """The file's (or the set's) headers, every tensor a file-backed range."""
        ...

    def build(self, *args: Any, **kwargs: Any) -> object:
        """A Cord (or a mapping of Cords) from values; nothing is written."""
        ...

    def merge(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
              ) -> OperationReport: ...

    def reshard(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
                ) -> OperationReport: ...

    def convert(self, output: PathLike, source: PathLike, **options: Any
                ) -> OperationReport: ...


class Unsupported:
    """The operations a format lacks, each a ``NotImplementedError`` naming it (mix in first
    in a registration that implements only some of them)."""

    name: str

    def merge(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
              ) -> OperationReport:
        raise NotImplementedError(f"{self.name} has no merge")

    def reshard(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
                ) -> OperationReport:
        raise NotImplementedError(f"{self.name} has no reshard")

    def convert(self, output: PathLike, source: PathLike, **options: Any
                ) -> OperationReport:
        raise NotImplementedError(f"{self.name} has no convert")


def head(path: PathLike, n: int) -> bytes | None:
    """The first ``n`` bytes of the regular file ``path`` (fewer if shorter); None when it is
    missing, unreadable or not a regular file.  Stat first, then a non-blocking open."""
    p = os.fspath(path)
    try:
        if kind_of(_sys.stat(p).st_mode) is not None:
            return None
        fd = _sys.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if kind_of(_sys.fstat(fd).st_mode) is not None:
            return None
        return _sys.pread(fd, n, 0)
    except OSError:
        return None
    finally:
        _sys.close(fd)
