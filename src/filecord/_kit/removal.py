"""Which inputs of a committed operation may be removed, and removing them without raising.

Theory of operation
-------------------
A consuming merge, reshard or convert hands its inputs' data files to ``save_many`` as owned
pieces; the save itself deletes, at its commit, the ones it moved or cloned, and keeps (copies
from) the ones it may not delete: symlinks (a Hugging Face cache snapshot is all symlinks into
``blobs/``), files with another hard link, read-only files or directories or mounts, immutable
or append-only files (``chattr +i``/``+a``), files on another file system.  What is left is the
files that *describe* inputs (an ``*.index.json``) and the files the new outputs make obsolete
(shards of another count, in a reshard): the operation hands them to the save as removals at
its commit (journaled, so ``recover`` finishes them after a crash), and what the save did not
remove (an index another writer rewrote byte for byte) comes here after the commit.

The rules, applied after the commit point, in this order:

1. An index is removed only when every data file it names is gone (the save consumed them
   all): a kept shard keeps its index, so a kept checkpoint stays loadable through it.
2. Nothing that is a symlink is removed (removing the link would break the snapshot that holds
   it), nor a file the facts say cannot be unlinked (immutable, read-only).
3. An unlink that fails anyway (a race, EROFS, EPERM) is recorded, not raised: the outputs are
   complete and committed, so the operation succeeded (DESIGN invariant 8), and its report
   lists each kept input with a typed reason.

The facts (``lstat``, ``stat``, ``statvfs`` of the directory, the inode flags, ``access``, the
mode bits, whether the file is a mount point of its own) are
gathered through the seam by :func:`observe`; :func:`keep_reason` decides from them alone, so
the decision is tested without a disk.  Removal fsyncs the parent directories afterwards; an
fsync that fails is logged (the unlink is done; only its durability is in doubt).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import stat as stat_mod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from filecord._io import syscalls as _sys
from filecord._plan.facts import mount_id, mount_table

log = logging.getLogger("filecord")


class KeepReason(enum.Enum):
    """Why an input of a consuming operation is still on disk after the commit."""

    SYMLINK = "a symlink"
    HARD_LINKED = "another hard link"
    READ_ONLY = "read-only (its mode, its directory's mode or its mount)"
    IMMUTABLE = "immutable or append-only (chattr +i/+a)"
    OTHER_FS = "on another file system than the output"
    NOT_MOVED = "its bytes were copied, not moved"
    SHARDS_KEPT = "an index whose data files were kept"
    MOUNT_POINT = "a mount point (a bind-mounted file can be neither renamed nor deleted)"
    STREAM_OUTPUT = "the output is a stream (a FIFO or a device), not storage"
    CONTENT_NOT_CARRIED = "content the output does not carry (metadata it drops or overrides)"
    NOT_REMOVABLE = "the unlink failed"


@dataclass(frozen=True, slots=True)
class KeptInput:
    """An input a committed consuming operation left on disk, and why (``detail``: the errno of
    a failed unlink, the save's copy reason, or the kept shards of an index)."""

    path: str
    reason: KeepReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class PathFacts:
    """What the seam saw of one path; pure data for :func:`keep_reason`."""

    path: str
    exists: bool
    symlink: bool = False
    regular: bool = True
    nlink: int = 1
    dev: int = 0
    immutable: bool = False
    writable_dir: bool = True
    read_only_mount: bool = False
    read_only_mode: bool = False
    mount_point: bool = False


def observe(path: str) -> PathFacts:
    """Gather :class:`PathFacts` for ``path`` through the seam; never raises for a missing file."""
    try:
        lst = _sys.lstat(path)
        directory = os.path.dirname(_sys.abspath(path)) or "/"
    except FileNotFoundError:
        return PathFacts(path, exists=False)
    except OSError:  # cannot even look (EACCES on a directory): it cannot be removed either
        return PathFacts(path, exists=True, writable_dir=False)
    try:
        read_only_mount = bool(_sys.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_mount = False
    # Mode bits, not access(2) alone: root passes access() for a 0444 file or a 0555 directory,
    # yet the user who made them read-only meant them kept.
    writable_dir = _sys.access(directory, os.W_OK | os.X_OK) and _dir_mode_writable(directory)
    if stat_mod.S_ISLNK(lst.st_mode):
        return PathFacts(path, exists=True, symlink=True, regular=False, nlink=lst.st_nlink,
                         dev=lst.st_dev, writable_dir=writable_dir,
                         read_only_mount=read_only_mount)
    regular = stat_mod.S_ISREG(lst.st_mode)
    return PathFacts(path, exists=True, symlink=False, regular=regular, nlink=lst.st_nlink,
                     dev=lst.st_dev, immutable=regular and _immutable(path, lst),
                     writable_dir=writable_dir, read_only_mount=read_only_mount,
                     read_only_mode=regular and not lst.st_mode & 0o222,
                     mount_point=regular and _is_mount_point(path, directory))


def _is_mount_point(path: str, directory: str) -> bool:
    """A file bind-mounted over a name (EBUSY on rename and unlink): it is reached through
    another mount than its directory.  Same ``st_dev`` either way, so the mount table says."""
    table = mount_table()
    if not table:
        return False
    return mount_id(path, table) != mount_id(directory, table)


def _dir_mode_writable(directory: str) -> bool:
    try:
        return bool(_sys.stat(directory).st_mode & 0o222)
    except OSError:
        return False


Identity = tuple[int, int, int, int]


def identity(path: str) -> Identity | None:
    """(st_dev, st_ino, st_size, st_mtime_ns) of ``path`` itself (not followed), or None."""
    try:
        st = _sys.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _immutable(path: str, lst: os.stat_result) -> bool:
    # O_NONBLOCK: never wait on anything; O_NOFOLLOW: the path was a regular file a moment ago
    try:
        fd = _sys.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = _sys.fstat(fd)
        if (st.st_ino, st.st_dev) != (lst.st_ino, lst.st_dev):
            return False  # replaced since the lstat: judged by its unlink, if it comes to that
        try:
            flags = _sys.inode_flags(fd)
        except OSError:  # ENOTTY/EOPNOTSUPP: a file system without attributes has none of these
            return False
    finally:
        _sys.close(fd)
    return bool(flags & (_sys.FS_APPEND_FL | _sys.FS_IMMUTABLE_FL))


def keep_reason(facts: PathFacts, *,
                output_devs: frozenset[int] = frozenset()) -> KeepReason | None:
    """Why a file that is still there must stay (None: it may be removed).

    ``output_devs`` are the devices of the outputs' directories; a data file on another one was
    copied, never moved, and stays.  Order matters only for the report: the first fact that
    forbids removal is the one named.
    """
    if not facts.exists:
        return None
    if facts.symlink:
        return KeepReason.SYMLINK
    if facts.immutable:
        return KeepReason.IMMUTABLE
    if facts.mount_point:
        return KeepReason.MOUNT_POINT
    if facts.read_only_mount or not facts.writable_dir or facts.read_only_mode:
        return KeepReason.READ_ONLY
    if facts.nlink > 1:
        return KeepReason.HARD_LINKED
    if output_devs and facts.dev not in output_devs:
        return KeepReason.OTHER_FS
    return None


def why_kept(facts: PathFacts, *, output_devs: frozenset[int], save_reason: str | None
             ) -> KeptInput:
    """The report entry for a data file the save kept: the fact that forbade deleting it, else
    the save's own reason for copying it (not owned, a gap, ...)."""
    reason = keep_reason(facts, output_devs=output_devs)
    if reason is not None:
        return KeptInput(facts.path, reason)
    return KeptInput(facts.path, KeepReason.NOT_MOVED, save_reason or "")


def index_verdict(index: PathFacts, shards: Sequence[PathFacts]) -> KeptInput | None:
    """None when ``index`` may be removed: every shard gone and nothing forbids the unlink."""
    if not index.exists:
        return None
    left = [s.path for s in shards if s.exists]
    if left:
        return KeptInput(index.path, KeepReason.SHARDS_KEPT, ", ".join(left))
    reason = keep_reason(index)
    if reason is KeepReason.HARD_LINKED or reason is None:
        # Its shards are gone: the index describes nothing, under any of its names.
        return None
    return KeptInput(index.path, reason)


def _same_text(path: str, text: str | None) -> bool:
    if text is None:
        return False
    try:
        return _sys.read_text(path, limit=len(text.encode()) + 1) == text
    except (OSError, ValueError):
        return False


def remove_after_commit(paths: Iterable[str],
                        identities: Mapping[str, Identity | None] | None = None,
                        texts: Mapping[str, str | None] | None = None,
                        ) -> tuple[tuple[str, ...], tuple[KeptInput, ...]]:
    """Unlink each path; never raises.  Only what this call unlinked is reported removed: a
    path already gone is neither removed nor kept, and a path whose identity (``identities``,
    captured when the operation read it) changed since is another writer's file, left alone,
    unless it holds the very text read (``texts``: an index rewritten byte for byte).

    Returns (removed, kept): a path whose unlink failed is kept, with the reason the facts give
    (or :attr:`KeepReason.NOT_REMOVABLE` and the errno when they give none).
    """
    removed: list[str] = []
    kept: list[KeptInput] = []
    for p in paths:
        if identities is not None and p in identities:
            now = identity(p)
            if now is None:
                continue  # gone already: someone else removed it
            if now != identities[p] and not _same_text(p, (texts or {}).get(p)):
                log.warning("left %s: replaced by another writer during the operation", p)
                continue
        try:
            _sys.unlink(p)
        except FileNotFoundError:
            continue
        except OSError as exc:
            reason = keep_reason(observe(p))
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            kept.append(KeptInput(p, reason or KeepReason.NOT_REMOVABLE, f"{name}: {exc.strerror}"))
            log.warning("kept %s after the commit: %s (%s)", p,
                        (reason or KeepReason.NOT_REMOVABLE).value, exc.strerror)
            continue
        log.info("removed %s: the committed outputs replace it", p)
        removed.append(p)
    if removed:
        try:
            _sys.fsync_parents(list(removed))
        except OSError as exc:  # the unlinks are done; only their durability is in doubt
            log.warning("removed %d file(s) after the commit, but fsyncing their directories "
                        "failed: %s", len(removed), exc)
    return tuple(removed), tuple(kept)
