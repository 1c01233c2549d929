"""The preflight's eyes: stat the sources and destinations, probe file systems (I/O, no decisions).

Theory of operation
-------------------
Only reads happen here, plus two optional probes.  The clone probe: two tiny files in the
destination directory, one cloned into the other, so that a file system that says it
is XFS but was made without reflink is known before the plan promises a clone.  The insert probe
(:func:`probe_insert`, run by every consuming save that could adopt a source in place): one file
of two blocks without a name (``O_TMPFILE``; where that is refused, a named one ``O_EXCL``,
unlinked after), a block inserted in front of its data and collapsed again: whether the file
system shifts extents (ext4 and XFS do; btrfs and tmpfs refuse with EOPNOTSUPP), tried, not
guessed from the type's name.  Both probes make their files without a name (``O_TMPFILE``) where
the file system can, so a crash during a probe leaves nothing; only where ``O_TMPFILE`` is refused
can a crash leave a ``.filecord-probe.*`` file of a few KiB.  A probe that finds the disk full
says "no": the plan counts the save without that capability and the space check refuses it
with the numbers.  Nothing is cached across saves: a probe costs about 0.1 ms (measured on
ext4 and XFS), while a device number outlives its file system (a loop device reformatted, a
partition remade, an anonymous device reused by the next mount), so a cached answer could
promise a clone or an insert the file system under that number no longer has.  One preflight
probes each output file system once.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from typing import TypeVar

from filecord._io import syscalls as _sys
from filecord._plan.types import BLOCK, CLONING_FILESYSTEMS, NO_HOLE_FILESYSTEMS, FsFacts


def fs_type(path: str) -> str:
    """The file system type holding ``path`` (from ``/proc/self/mountinfo``), or "unknown"."""
    try:
        dev = _sys.stat(path).st_dev
        text = _sys.read_text("/proc/self/mountinfo")
    except OSError:
        return "unknown"
    want = f"{os.major(dev)}:{os.minor(dev)}"
    real = _sys.realpath(path)
    best, best_len = "unknown", -1
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        mount_point = fields[4].replace("\\040", " ")
        kind = right.split()[0] if right.split() else "unknown"
        if fields[2] == want:
            return kind
        # btrfs subvolumes report anonymous devices: fall back to the longest mount prefix.
        prefix = mount_point.rstrip("/") + "/"
        if (real + "/").startswith(prefix) and len(prefix) > best_len:
            best, best_len = kind, len(prefix)
    return best


def mount_table() -> list[tuple[str, int]]:
    """(mount point + "/", mount id) for every mount, longest point first (empty if unknown)."""
    try:
        text = _sys.read_text("/proc/self/mountinfo")
    except OSError:
        return []
    table = []
    for line in text.splitlines():
        fields = line.split(" - ", 1)[0].split()
        if len(fields) >= 5 and fields[0].isdigit():
            table.append((fields[4].replace("\\040", " ").rstrip("/") + "/", int(fields[0])))
    # The last of equal points wins (a mount over a mount): stable sort keeps file order.
    table.reverse()
    table.sort(key=lambda t: -len(t[0]))
    return table


def mount_id(path: str, table: list[tuple[str, int]]) -> int:
    """The id of the mount ``path`` is reached through; 0 when the table cannot say.

    Two mounts of one file system (a bind mount) share ``st_dev``, but a rename between them
    fails with EXDEV; the mount id tells them apart.
    """
    real = _sys.realpath(path) + "/"
    return next((mid for point, mid in table if real.startswith(point)), 0)


def probe_clone(directory: str) -> bool:
    """Whether the file system under ``directory`` clones ranges (tried, not guessed)."""
    token = secrets.token_hex(6)
    named: list[str] = []
    fds: list[int] = []
    ok = False
    try:
        for end in ("a", "b"):
            fd = _sys.open_unnamed(directory)  # a crash must leave no name behind
            if fd is None:
                path = os.path.join(directory, f".filecord-probe.{token}.{end}")
                fd = _sys.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                named.append(path)
            fds.append(fd)
        _sys.write_all(fds[0], bytes(4096), 0)
        try:
            _sys.clone_range(fds[0], 0, 4096, fds[1], 0)
            ok = True
        except OSError as exc:
            if exc.errno not in _CLONE_REFUSALS:
                raise
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        return False  # no room for the probe: the space check will say why
    finally:
        for fd in fds:
            _sys.close(fd)
        for p in named:
            _sys.unlink_missing_ok(p)
    return ok


def probe_insert(directory: str) -> bool:
    """Whether the file system under ``directory`` inserts and collapses block ranges.

    A file of two blocks gets one block inserted at offset 0 and collapsed again; a refusal
    (EOPNOTSUPP and its kin) is "no", any other error is raised.
    """
    vfs = _sys.statvfs(directory)
    block = vfs.f_frsize or vfs.f_bsize or BLOCK
    named: str | None = None
    ok = False
    try:
        fd = _sys.open_unnamed(directory)  # a save probes: a crash must leave no name behind
        if fd is None:
            named = os.path.join(directory, f".filecord-probe.{secrets.token_hex(6)}.i")
            fd = _sys.open(named, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _sys.write_all(fd, bytes(2 * block), 0)
            try:
                _sys.insert_range(fd, 0, block)
                _sys.collapse_range(fd, 0, block)  # an adoption's undo: both, or neither
                ok = True
            except OSError as exc:
                if exc.errno not in _INSERT_REFUSALS:
                    raise
        finally:
            _sys.close(fd)
            if named is not None:
                _sys.unlink_missing_ok(named)
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        return False  # no room for the probe: the space check will say why
    return ok


_INSERT_REFUSALS = frozenset(
    {errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTTY}
)


# A probe that finds no room says "no": the plan then counts the save without that
# capability, and the space check refuses it with the numbers.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


_CLONE_REFUSALS = frozenset(
    {errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
)


# FIEMAP_EXTENT_SHARED: the extent's blocks are shared with another file (a reflink copy, a
# snapshot); cutting this file frees none of them.  FIEMAP_EXTENT_ENCODED: compressed (btrfs),
# its length the uncompressed one; cutting it frees only what it holds on disk, unknown here,
# so nothing is counted.
_EXTENT_SHARED = 0x2000
_EXTENT_ENCODED = 0x8
# btrfs frees a data extent only when no file refers to any of it; it writes extents of at
# most 128 MiB (256 MiB when preallocated), and its FIEMAP may report neighbours as one.
_BTRFS_EXTENT_MAX = 256 * 1024 * 1024


def freeable(path: str, allocated: int, fs_type: str) -> int:
    """A lower bound on the bytes that cutting the file at ``path`` from its end gives back,
    where the file system shares extents (``CLONING_FILESYSTEMS``; elsewhere ``allocated``,
    from ``st_blocks``, is the answer).  Extents shared with another file, or compressed,
    are counted as giving nothing back;
    on btrfs a cut frees an extent only once it is past the extent's start, so the extent the
    cut is in holds on: the largest is taken off (as if it were cut last).  The planner
    counts the rest as freed late in the move (``space._highest``), so this bound is safe
    wherever in the file the shared extents lie.  A file system that will not map its
    extents (FIEMAP refused) keeps ``allocated``."""
    if fs_type not in CLONING_FILESYSTEMS or allocated <= 0:
        return allocated
    fd = _sys.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        size = _sys.fstat(fd).st_size
        found = unless_unsupported(lambda: _sys.extents(fd, 0, size))
    finally:
        _sys.close(fd)
    if found is None:
        return allocated
    own = [e.length for e in found if not e.flags & (_EXTENT_SHARED | _EXTENT_ENCODED)]
    held = min(max(own, default=0), _BTRFS_EXTENT_MAX) if fs_type == "btrfs" else 0
    return max(0, min(allocated, sum(own)) - held)


def inode_flags(path: str, st: os.stat_result) -> int | None:
    """The file's attribute flags (``FS_IOC_GETFLAGS``), or None where the file system keeps
    none or the name holds another file than ``st`` now (the save's own checks see that)."""
    fd = _sys.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if (_sys.fstat(fd).st_ino, st.st_dev) != (st.st_ino, st.st_dev):
            return None
        return unless_unsupported(lambda: _sys.inode_flags(fd))
    finally:
        _sys.close(fd)


_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS})
T = TypeVar("T")


def unless_unsupported(call: Callable[[], T]) -> T | None:
    """``call()``, or None where the file system does not answer that ioctl at all."""
    try:
        return call()
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise


def fs_facts(directory: str, *, want_clone: bool, want_insert: bool = False) -> FsFacts:
    st = _sys.stat(directory)
    vfs = _sys.statvfs(directory)
    kind = fs_type(directory)
    can_clone = False
    if want_clone and kind in CLONING_FILESYSTEMS:
        can_clone = probe_clone(directory)
    keeps_holes = kind not in NO_HOLE_FILESYSTEMS
    return FsFacts(
        dev=st.st_dev,
        fs_type=kind,
        free=vfs.f_bavail * vfs.f_frsize,
        can_clone=can_clone,
        keeps_holes=keeps_holes,
        block=vfs.f_frsize or vfs.f_bsize or BLOCK,
        can_insert=want_insert and keeps_holes and probe_insert(directory),
    )


def is_clone_refusal(exc: OSError) -> bool:
    return exc.errno in _CLONE_REFUSALS
