"""The liveness proof of a save: one ``flock``ed lock file per directory it writes in.

Theory of operation
-------------------
A save makes ``.STEM.TOKEN.filecord-lock`` in every directory where it will create a temp,
before the temp: unnamed (``O_TMPFILE``), locked (``flock(LOCK_EX|LOCK_NB)``), written and
fsynced, then linked to its name (:func:`create`), so no recover finds it unlocked or empty
(an emptied or zeroed one is damage).  Where the file system makes no unnamed file it is made
under its name and locked at once, and the save checks the name still names its inode (a
recover may have removed it in between; the save then stops).  The lock files are unlinked
last.  The kernel drops an ``flock`` when its holder dies, so "the lock can be taken" proves
the save is no longer running.  ``recover`` acts on a save's files only while holding its lock
(taken the same way, the name re-checked); a held one is a live save or another recover, and
is skipped.  ``flock`` belongs to the open file description, so an in-process recover contends
like another process; on NFS without a lock manager ``flock`` fails (``ENOLCK``) and the save
refuses rather than run without its proof.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat as stat_mod
from collections.abc import Callable
from dataclasses import dataclass

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import journal
from filecord._txn.stages import Stage


class LockBusyError(OSError):
    """The lock is held: a save (or a recover) is running on these files right now."""


class NotALockFileError(OSError):
    """A name like a lock file's that is not a regular file (a FIFO, a device, a symlink):
    never a save's, and never opened in a way that could block or follow it."""


def open_regular(path: str, flags: int = os.O_RDONLY, *, sole: bool = False) -> int:
    """Open a file recover finds by its name only if it is a regular file (and, ``sole``, its
    one name; else ``NotALockFileError``), never following a symlink nor blocking
    (``O_NONBLOCK``: a FIFO)."""
    try:
        fd = _sys.open(path, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise NotALockFileError(errno.ELOOP, f"{path} is a symlink, not a regular file") \
                from None
        raise
    try:
        st = _sys.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise NotALockFileError(errno.EINVAL, f"{path} is not a regular file")
        if sole and st.st_nlink > 1:  # never written where another name reaches it (0: gone)
            raise NotALockFileError(errno.EMLINK, f"{path} has {st.st_nlink} links: another "
                                    "name reaches the journal, which is written to (a copy "
                                    "made with `cp -al`? give it one name, copy it with `cp`, "
                                    "and run recover again)")
    except BaseException:
        _sys.close(fd)
        raise
    return fd


@dataclass(slots=True)
class Appender:
    """Every step's append (the save's, recover's): at the journal's logical end, fsynced before
    the call returns.  ``torn``: what follows ``end`` (a torn tail, a step whose write or fsync
    failed) is cut off first, else a shorter step would leave its rest as a record that does
    not check.  Through ``fd`` while the save holds it open, else opened by ``path``."""

    path: str
    end: int
    torn: bool = False
    fd: int | None = None
    fsync: Callable[[int], None] = _sys.fsync

    def __call__(self, record: bytes) -> None:
        fd = open_regular(self.path, os.O_WRONLY, sole=True) if self.fd is None else self.fd
        try:
            if self.torn:
                _sys.ftruncate(fd, self.end)
            self.torn = True  # until its fsync returns
            _sys.write_all(fd, record, self.end)
            self.fsync(fd)
            self.end, self.torn = self.end + len(record), False
        finally:
            if fd != self.fd:
                _sys.close(fd)

    def close(self) -> list[OSError]:
        """Let go of ``fd`` (a later step opens the journal by name); the close's error."""
        fd, self.fd = self.fd, None
        return _sys.close_each([] if fd is None else [fd])


def _names_same(fd: int, path: str) -> bool:
    try:
        st = _sys.lstat(path)
    except FileNotFoundError:
        return False
    mine = _sys.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _lock(fd: int, path: str, held: str) -> None:
    try:
        _sys.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockBusyError(errno.EAGAIN, f"{path} {held}") from None


def create(path: str, content: bytes) -> int:
    """The save's side (the module's steps); the descriptor."""
    fd = _sys.open_unnamed(os.path.dirname(path) or ".")
    named = fd is None
    if fd is None:  # no unnamed file here: made under its name, locked at once
        fd = _sys.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _lock(fd, path, "was locked by a recover as it was made")
        if named and not _names_same(fd, path):
            raise LockBusyError(errno.EAGAIN, f"{path} was removed by a recover as it was made")
        _sys.write_all(fd, content, 0)
        _sys.fsync(fd)  # durable before any temp beside it: a temp's name implies the pointer
        if not named:
            _sys.link_fd(fd, path)
    except BaseException:
        # The name is ours alone (a signal can land after the link), unless a recover took
        # it: then that recover removes it.  Never hide why the lock could not be made.
        with contextlib.suppress(OSError):
            release(path, fd)
        raise
    return fd


def acquire(path: str) -> int | None:
    """Lock an existing lock file (the recover's side): its descriptor, None if it is gone,
    :class:`LockBusyError` if held."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    try:
        _lock(fd, path, "is locked: its save is running")
        if not _names_same(fd, path):
            _sys.close(fd)
            return None
    except BaseException:
        _sys.close(fd)
        raise
    return fd


def pointer_record(journal_path: str) -> bytes:
    """A new lock file's content: the checksummed ``created`` step naming its save's journal."""
    return journal.step(Stage.CREATED, journal=journal_path)


@dataclass(frozen=True, slots=True)
class Pointer:
    """A lock file read back: the journal it names (None: empty or torn), whether it was
    marked journaled, and ``damage`` when a whole record does not check."""

    journal: str | None
    journaled: bool = False
    damage: str | None = None


def read_pointer(raw: bytes, token: str) -> Pointer:
    """``created`` (with the journal's path), then at most ``journaled``; else damage."""
    lines, _torn = journal.split_lines(raw)
    r = journal.replay(lines, torn_tail=_torn)
    if r.damage is not None:
        return Pointer(None, damage=f"its lock file is damaged ({r.damage})")
    if not r.records:
        return Pointer(None)  # empty or torn: written before any temp, never fsynced
    stages = [journal.stage_of(rec) for rec in r.records]
    path = r.records[0].get("journal")
    if (stages not in ([Stage.CREATED], [Stage.CREATED, Stage.JOURNALED])
            or not isinstance(path, str) or not os.path.isabs(path)
            or _names.parse(os.path.basename(path)) != (token, _names.JOURNAL)):
        return Pointer(None, damage="its lock file does not point at a journal of its save")
    return Pointer(path, len(stages) == 2)


def release(path: str, fd: int) -> None:
    """Remove the lock file while still holding it, then let go."""
    try:
        if _names_same(fd, path):
            _sys.unlink_missing_ok(path)
    finally:
        _sys.close(fd)
