"""Paths as the kernel resolves them (I/O: each answer is a ``stat`` or ``realpath`` through the
seam).

A save names its sources and outputs by path; the journal, the lock and the plan need the
directory the kernel will actually use (symlinks followed the way ``open()`` follows them), so
this is resolved once, here, below every layer that needs it.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod

from filecord._io import syscalls as _sys


def kernel_path(path: str) -> str:
    """``path`` as the kernel reads it: the directory part through its symlinks, then the name.

    Text normalisation (``os.path.abspath``) is wrong wherever a symlink precedes ``..``:
    with ``ldir`` a link to ``elsewhere/deep``, ``ldir/../x`` is ``elsewhere/x`` for ``open()``
    but ``./x`` for ``abspath``.  The directory part is resolved by the kernel itself (a
    ``stat`` of it as given): where ``open()`` would fail (a missing directory or a file before
    ``..``) this raises the same ``FileNotFoundError`` or ``NotADirectoryError``, and the
    name returned (``realpath``) is checked to be that very directory.  The last component is
    kept as given (it may be a symlink the caller means to follow or not); a last component of
    ``.`` or ``..`` names a directory and is resolved with it.
    """
    head, name = os.path.split(path)
    if name in ("", ".", ".."):
        head, name = path, ""
    directory = head or "."
    found = _sys.stat(directory)  # raises as open() would
    if not stat_mod.S_ISDIR(found.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
    real = _sys.realpath(directory)
    named = _sys.stat(real)
    if (named.st_dev, named.st_ino) != (found.st_dev, found.st_ino):  # pragma: no cover - a race
        raise OSError(errno.EAGAIN, f"{directory} changed while it was being resolved")
    return os.path.join(real, name) if name else real


def resolve_target(path: str) -> tuple[str, os.stat_result | None]:
    """The file a save to ``path`` replaces, and its stat (None when it does not exist yet).

    The path is resolved as ``open()`` resolves it (:func:`kernel_path`).  A symlink to a
    regular file is followed and the file it names is replaced.  A path that names something
    else (a FIFO, ``/dev/stdout``) is returned with only its directory resolved, to be opened
    as is.
    """
    named = kernel_path(path)
    try:
        st = _sys.stat(named)
    except FileNotFoundError:
        return _sys.realpath(named), None  # absent, or a dangling link: create its target
    if stat_mod.S_ISREG(st.st_mode):
        return _sys.realpath(named), st
    return named, st
