"""Opening an input file to read its header: never blocks, and only regular files.

A shard named by an index, or by a split GGUF set, is a path someone else chose: it may be a
FIFO (``open`` for reading waits for a writer, forever) or a device (it never ends).  The file
is opened with ``O_NONBLOCK`` (which makes opening a FIFO return at once, and changes nothing
for a regular file) and judged by ``fstat`` of that very descriptor, so nothing can be swapped
in between the look and the read; anything but a regular file is refused with
:class:`~filecord.errors.NotRegularFileError` naming what it is, before a byte is read.
"""

from __future__ import annotations

import os
import stat as stat_mod

from filecord._io import syscalls as _sys
from filecord.errors import NotRegularFileError


def kind_of(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat_mod.S_ISREG(mode):
        return None
    if stat_mod.S_ISFIFO(mode):
        return "a FIFO (reading it would wait for a writer)"
    if stat_mod.S_ISCHR(mode) or stat_mod.S_ISBLK(mode):
        return "a device"
    if stat_mod.S_ISDIR(mode):
        return "a directory"
    if stat_mod.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path``; the caller closes it."""
    fd = _sys.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        what = kind_of(_sys.fstat(fd).st_mode)
    except BaseException:
        _sys.close(fd)
        raise
    if what is not None:
        _sys.close(fd)
        raise NotRegularFileError(f"{path} is {what}: only regular files are read",
                                  field="file type")
    return fd
