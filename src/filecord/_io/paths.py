"""Paths as the kernel resolves them (I/O: each answer is a ``stat`` or ``realpath`` through the
seam).

A save names its sources and outputs by path; the journal, the lock and the plan need the
directory the kernel will actually use (symlinks followed the way ``open()`` follows them), so
this is resolved once, here, below every layer that needs it.

A writer whose output is a directory creates it and its missing parents
(:func:`make_directories`, as torch's ``FileSystemWriter`` and ``save_pretrained`` do), durably:
each new directory's entry is fsynced in its parent, since a save fsyncs the directory that
holds its output but not that directory's own entry, and a power cut could otherwise lose a
committed output with the new directory that holds it.  A writer that fails removes again the
directories it made that are still empty (:func:`remove_empty`), so a refused save leaves no
trace.

A dry run of a command that creates its output's directories plans as if they existed
(:func:`planned_directories`), without creating them: a planned directory is empty and has
the file system, mount, free space and permissions of its nearest existing ancestor (a
directory made there could have no others), so :func:`kernel_path` resolves a name under it
through that ancestor and :func:`stand_in` names the ancestor to every ``stat``, ``statvfs``
and probe that asks about it.  Outside that context nothing here differs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from collections.abc import Iterable, Iterator
from contextvars import ContextVar

from filecord._io import syscalls as _sys

# The directories a dry run plans as created (absolute, and as realpath resolves them).
_PLANNED: ContextVar[frozenset[str]] = ContextVar("filecord_planned", default=frozenset())


def missing_directories(directory: str) -> list[str]:
    """The absolute names of ``directory`` and its ancestors that do not exist, deepest
    first (a dangling symlink exists: ``mkdir`` under it fails, as it should)."""
    missing: list[str] = []
    d = _sys.abspath(directory)
    while not _sys.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    return missing


def make_directories(directory: str) -> list[str]:
    """Create ``directory`` and its missing parents, each entry fsynced in its parent; the
    directories made, deepest first (for :func:`remove_empty`).  A ``mkdir`` that fails
    removes what this call made before raising."""
    made: list[str] = []
    try:
        for d in reversed(missing_directories(directory)):
            _sys.mkdir(d)
            made.insert(0, d)
        for d in reversed(made):
            _sys.fsync_dir(os.path.dirname(d))
    except BaseException:
        remove_empty(made)
        raise
    return made


def remove_empty(made: Iterable[str]) -> None:
    """Remove the directories ``made`` (deepest first) that are still empty; one that
    something else wrote into meanwhile is left alone, and a removal that fails is no error
    (the directory stays, empty, as ``mkdir -p`` would have left it)."""
    for d in made:
        with contextlib.suppress(OSError):
            _sys.rmdir(d)


@contextlib.contextmanager
def planned_directories(directories: Iterable[str]) -> Iterator[None]:
    """For the duration, the missing ``directories`` (the ones the real run would create) are
    planned as if they existed: see the module's docstring."""
    names = set()
    for d in directories:
        names.add(_sys.abspath(d))
        names.add(_sys.realpath(d))
    token = _PLANNED.set(_PLANNED.get() | names)
    try:
        yield
    finally:
        _PLANNED.reset(token)


def is_planned(directory: str) -> bool:
    """Whether ``directory`` is one a dry run plans as created, and is still missing."""
    planned = _PLANNED.get()
    return bool(planned) and _sys.abspath(directory) in planned and not _sys.lexists(directory)


def stand_in(directory: str) -> str:
    """The directory to ask about ``directory``: itself, or for one a dry run plans, its
    nearest existing ancestor."""
    if not is_planned(directory):
        return directory
    d = _sys.abspath(directory)
    while d in _PLANNED.get() and not _sys.lexists(d):
        d = os.path.dirname(d)
    return d


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
    if is_planned(directory):  # a dry run's: the ancestor resolved, then the names to create
        base = stand_in(directory)  # an ancestor of the absolute name: a prefix of it
        real = os.path.join(kernel_path(os.path.join(base, "")),
                            _sys.abspath(directory)[len(base):].lstrip(os.sep))
        return os.path.join(real, name) if name else real
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
