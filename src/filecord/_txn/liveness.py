"""The liveness proof of a save: one ``flock``ed lock file per directory it writes in.

Theory of operation
-------------------
A save creates ``.STEM.TOKEN.filecord-lock`` with ``O_CREAT|O_EXCL`` in every directory where
it will create a temp, *before* the temp, takes ``flock(LOCK_EX|LOCK_NB)`` on it, and then checks
that the name still names the locked inode (a recover may have removed a lock file it found
unlocked in the instant between ``open`` and ``flock``; the save then stops before creating
anything else).  The descriptors stay open until the save has removed everything else; the
lock files are unlinked last.  The kernel drops an ``flock`` when its holder dies (SIGKILL,
crash), so "the lock can be taken" proves the save is no longer running.

``recover`` acts on a save's files only while it holds that save's lock, taken the same way
(open without creating, ``LOCK_NB``, re-check the name).  A held lock means a live save (or
another recover): it is skipped and reported.  Two recovers exclude each other the same way.

``flock`` locks belong to the open file description, so an in-process ``recover`` contends
with an in-process save exactly as another process would.  On NFS, Linux emulates ``flock``
with byte-range locks through the lock manager; where the server offers none, ``flock`` fails
(``ENOLCK``) and the save refuses rather than run without its proof.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from filecord._io import names as _names
from filecord._io import syscalls as _sys

JOURNALED = b"journaled"  # appended once the save's journal is durable under its name
MOVED = b"moved"  # "moved N": the first N moved sources (journal order) are done, durably
# The pointer's end: every journal name ends so, and no mark line holds it.
JOURNAL_SUFFIX = os.fsencode(_names.JOURNAL)
LOOKED = b"looked"  # "looked DEV INO SIZE MTIME_NS": a source at the save's last look, durably


class LockBusyError(OSError):
    """The lock is held: a save (or a recover) is running on these files right now."""


def _names_same(fd: int, path: str) -> bool:
    try:
        st = _sys.lstat(path)
    except FileNotFoundError:
        return False
    mine = _sys.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def create(path: str, content: bytes) -> int:
    """Create and lock a new lock file (the save's side); the caller closes the descriptor."""
    fd = _sys.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            _sys.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusyError(
                errno.EAGAIN, f"{path} was locked by a recover as it was made"
            ) from None
        if not _names_same(fd, path):
            raise LockBusyError(errno.EAGAIN, f"{path} was removed by a recover as it was made")
        _sys.write_all(fd, content, 0)
        # Durable before any temp exists beside it: a temp's name then implies the pointer.
        _sys.fsync(fd)
    except BaseException:
        # Ours alone (O_EXCL) unless a recover took it: then that recover removes it.
        try:
            if _names_same(fd, path):
                _sys.unlink_missing_ok(path)
        except OSError:  # never hide why the lock could not be made; recover removes it
            pass
        finally:
            with contextlib.suppress(OSError):
                _sys.close(fd)
        raise
    return fd


def acquire(path: str) -> int | None:
    """Lock an existing lock file (the recover's side): its descriptor, or None if it is gone.

    Raises :class:`LockBusyError` when another process holds it.
    """
    try:
        fd = _sys.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            _sys.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusyError(errno.EAGAIN, f"{path} is locked: its save is running") from None
        if not _names_same(fd, path):
            _sys.close(fd)
            return None
    except BaseException:
        _sys.close(fd)
        raise
    return fd


def mark_journaled(fd: int) -> None:
    """Record, durably, that the save's journal exists: from now on a missing journal beside
    this lock means someone removed it, never that the save died before making it."""
    _sys.write_all(fd, JOURNALED + b"\n", _sys.fstat(fd).st_size)
    _sys.fsync(fd)


def mark_moved(fd: int, done: int) -> None:
    """Record, durably, that the first ``done`` moved sources (in journal order) have finished
    their moves: recover then knows each of them must be at its kept prefix, whatever its size
    alone would allow."""
    _sys.write_all(fd, MOVED + b" %d\n" % done, _sys.fstat(fd).st_size)
    _sys.fsync(fd)


def mark_looked(fd: int, looks: list[tuple[int, int, int, int]]) -> None:
    """Record, durably, each consumed source's (dev, ino, size, mtime) as the save last saw it
    just before its commit point: what recover's finish compares a parked source with before
    it deletes it (it has no look of its own)."""
    lines = b"".join(LOOKED + b" %d %d %d %d\n" % look for look in looks)
    _sys.write_all(fd, lines, _sys.fstat(fd).st_size)
    _sys.fsync(fd)


@dataclass(frozen=True, slots=True)
class Marks:
    """What a save recorded in its lock file after the journal: moves done, last looks."""

    moved: int = 0
    looked: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


def read_marks(raw: bytes) -> Marks:
    """The marks of a lock file's content: only the lines after its pointer (the journal path,
    ended by the journal suffix and a newline), and only when the first of them is the
    "journaled" mark.  The path may hold newlines and mark-like lines of its own (a directory
    named "m\njournaled\nmoved 5\nv2"), so nothing before the pointer's end counts; no mark line
    holds the journal suffix, so its last occurrence is that end.  Only whole lines
    (newline-terminated, every field a number) count: a torn append is as if it never reached
    the disk."""
    end = raw.rfind(JOURNAL_SUFFIX + b"\n")
    if end < 0:
        return Marks()
    body = raw[end + len(JOURNAL_SUFFIX) + 1 :]
    if not body.startswith(JOURNALED + b"\n"):
        return Marks()
    moved = 0
    looked: dict[tuple[int, int], tuple[int, int]] = {}
    for line in body[len(JOURNALED) + 1 :].split(b"\n")[:-1]:
        word, *nums = line.split(b" ")
        if not nums or not all(n.isdigit() for n in nums):
            continue
        if word == MOVED and len(nums) == 1:
            moved = max(moved, int(nums[0]))
        elif word == LOOKED and len(nums) == 4:
            dev, ino, size, mtime = (int(n) for n in nums)
            looked[(dev, ino)] = (size, mtime)
    return Marks(moved, looked)


def release(path: str, fd: int) -> None:
    """Remove the lock file while still holding it, then let go."""
    try:
        if _names_same(fd, path):
            _sys.unlink_missing_ok(path)
    finally:
        _sys.close(fd)
