"""The one I/O seam: every system call filecord makes goes through this module.

Theory of operation
-------------------
Durability bugs hide in the order and the outcome of system calls, so tests must be able to fail
any call, shorten any write, lose unsynced data or kill the process at any call.  Monkeypatching
``os`` misses calls made through file objects, so filecord never uses file objects for its own
I/O: it calls the functions below, which forward to the active :class:`Backend`.  Each call first
passes through ``Backend.hook(op, args)``; a test backend overrides ``hook`` to raise or to kill,
and overrides single methods to return short counts or to record what is durable.

A path names a file by walking directories, so a check (``lstat``) and the act after it
(``unlink``) may each reach a different directory when someone renames one above it in between.
Inside ``with pinned(dirs):`` each of those directories is opened once, and every call below
that names a file in one of them (or the directory itself, for ``open``, ``fsync_dir`` and
``listdir``) is made relative to that descriptor (``unlinkat(dirfd, name)``, ...): the checks
and the acts of a save or a recover all reach the directory inode it pinned, whatever is
renamed or symlinked above it.  The pins are per thread and nest; the hook and the test
backends still receive the paths, and only the real calls resolve them.

Nothing here orders calls or retries them; callers own the protocol.  ``fsync`` uses
``F_FULLFSYNC`` where the platform has it, because plain ``fsync`` on macOS leaves data in the
drive's cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import shutil
import stat as _stat_mod
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

# --- constants the os module lacks, and fallocate through libc ------------------------------


class Extent(NamedTuple):
    """One extent FIEMAP reports: where it is in the file, where on the device (``physical``,
    meaningful only without FIEMAP_EXTENT_UNKNOWN/DELALLOC), how long, its flags."""

    logical: int
    length: int
    flags: int
    physical: int


# FICLONERANGE = _IOW(0x94, 13, struct file_clone_range); Python 3.11 has no constant for it.
_FICLONERANGE = 0x4020940D
# FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap); the header is 32 bytes, each extent 56.
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_EXTENTS = 64
_FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2  # no physical address (yet)
FIEMAP_EXTENT_DELALLOC = 0x4  # delayed allocation: no block yet
FIEMAP_EXTENT_UNWRITTEN = 0x800
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20
FS_EXTENT_FL = 0x80000  # ext4: mapped by extents (INSERT_RANGE needs it)
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
# fallocate(2) modes that shift a file's extents instead of its bytes (ext4, XFS; not btrfs,
# tmpfs): COLLAPSE removes a block-aligned range and pulls the rest down, INSERT opens a
# block-aligned hole and pushes the rest up.  Neither moves a byte of data.
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_INSERT_RANGE = 0x20

# sync_file_range(2) flag: start writeback of the range's dirty pages, do not wait for it.
SYNC_FILE_RANGE_WRITE = 0x2

_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        if hasattr(_libc, "sync_file_range"):
            _libc.sync_file_range.argtypes = [
                ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint
            ]
    return _libc


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _c().fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# --- pinned directories: where a path's directory is a descriptor --------------------------

class _Pins(threading.local):
    def __init__(self) -> None:
        self.fds: dict[str, int] = {}  # directory (absolute, normalised) -> its descriptor
        self.scopes: list[list[str]] = []  # per open ``pinned``: the directories it opened


_pins = _Pins()


def _key(path: str) -> str | None:
    """The pin key of ``path``; None where it has a ``..`` (after a symlink the kernel's ``..``
    is not the text's: such a path is never matched to a pin, it stays path based)."""
    full = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    return None if ".." in full.split(os.sep) else os.path.normpath(full)


def _at(path: str) -> tuple[int | None, str]:
    """``(dir_fd, name)`` for a path whose directory is pinned, else ``(None, path)``."""
    full = _key(path) if _pins.fds else None
    if full is None:
        return None, path
    head, name = os.path.split(full)
    fd = _pins.fds.get(head)
    if fd is None or name in ("", ".", ".."):
        return None, path
    return fd, name


def _here(path: str) -> tuple[int | None, str]:
    """As :func:`_at`, and a pinned directory itself is ``(its fd, ".")``."""
    key = _key(path) if _pins.fds else None
    fd = None if key is None else _pins.fds.get(key)
    return (fd, ".") if fd is not None else _at(path)


# --- the backend: real calls, and the hook that tests override ------------------------------

class Backend:
    """The real system.  Subclass it in tests; override :meth:`hook` to inject faults."""

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        """Called before every operation with its name and arguments; the real one does nothing."""

    # --- descriptors -----------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int) -> int:
        fd, name = _here(path)
        return os.open(name, flags | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=fd)

    def open_dir(self, path: str) -> int:
        """A descriptor of the directory ``path`` for :func:`pinned` (symlinks followed)."""
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int:
        return os.preadv(fd, [buf], offset)

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def write(self, fd: int, data: memoryview | bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if sys.platform == "darwin":  # pragma: no cover - exercised on macOS only
            fcntl.fcntl(fd, getattr(fcntl, "F_FULLFSYNC", 51))
        else:
            os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def map_read(self, fd: int, length: int) -> mmap.mmap:
        return mmap.mmap(fd, length, access=mmap.ACCESS_READ)

    def map_private(self, fd: int, length: int) -> mmap.mmap:
        return mmap.mmap(fd, length, access=mmap.ACCESS_COPY)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def lseek(self, fd: int, offset: int, whence: int) -> int:
        return os.lseek(fd, offset, whence)

    def fchown(self, fd: int, uid: int, gid: int) -> None:
        os.fchown(fd, uid, gid)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def futimens(self, fd: int, atime_ns: int, mtime_ns: int) -> None:
        os.utime(fd, ns=(atime_ns, mtime_ns))

    def copy_file_range(self, src: int, dst: int, count: int, src_off: int, dst_off: int) -> int:
        return os.copy_file_range(src, dst, count, src_off, dst_off)

    def sendfile(self, dst: int, src: int, src_off: int, count: int) -> int:
        return os.sendfile(dst, src, src_off, count)

    def clone_range(self, src: int, src_off: int, length: int, dst: int, dst_off: int) -> None:
        # struct file_clone_range { s64 src_fd; u64 src_offset, src_length, dest_offset; }
        arg = (
            src.to_bytes(8, "little", signed=True)
            + src_off.to_bytes(8, "little")
            + length.to_bytes(8, "little")
            + dst_off.to_bytes(8, "little")
        )
        fcntl.ioctl(dst, _FICLONERANGE, arg)

    def inode_flags(self, fd: int) -> int:
        # FS_IOC_GETFLAGS = _IOR('f', 1, long); the kernel reads and writes an int there.
        buf = bytearray(8)
        fcntl.ioctl(fd, 0x80086601, buf)
        return int.from_bytes(buf[:4], "little")

    def extents(self, fd: int, offset: int, length: int) -> list[Extent]:
        """Every extent the file has in the range (FIEMAP); a hole has none."""
        found: list[Extent] = []
        pos, end = offset, offset + length
        while pos < end:
            head = (pos.to_bytes(8, "little") + (end - pos).to_bytes(8, "little")
                    + (0).to_bytes(4, "little") + (0).to_bytes(4, "little")
                    + _FIEMAP_EXTENTS.to_bytes(4, "little") + (0).to_bytes(4, "little"))
            buf = bytearray(head + bytes(56 * _FIEMAP_EXTENTS))
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
            mapped = int.from_bytes(buf[20:24], "little")
            if mapped == 0:
                break
            last = False
            for i in range(mapped):
                e = buf[32 + 56 * i : 32 + 56 * (i + 1)]
                logical, n = int.from_bytes(e[0:8], "little"), int.from_bytes(e[16:24], "little")
                flags = int.from_bytes(e[40:44], "little")
                found.append(Extent(logical, n, flags, int.from_bytes(e[8:16], "little")))
                pos = max(pos, logical + n)
                last = last or bool(flags & _FIEMAP_EXTENT_LAST)
            if last:
                break
        return found

    def punch_hole(self, fd: int, offset: int, length: int) -> None:
        _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length)

    def insert_range(self, fd: int, offset: int, length: int) -> None:
        _fallocate(fd, FALLOC_FL_INSERT_RANGE, offset, length)

    def prefetch(self, fd: int, offset: int, length: int) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        libc = _c()
        if not hasattr(libc, "sync_file_range"):  # not Linux: nothing to start, fsync does it
            return
        if libc.sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def collapse_range(self, fd: int, offset: int, length: int) -> None:
        _fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, offset, length)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        # fallocate(2) mode 0, never posix_fallocate: glibc's emulation writes every block
        # where the file system lacks the call; here that is an EOPNOTSUPP the caller sees.
        _fallocate(fd, 0, offset, length)

    # --- names -----------------------------------------------------------------------------
    def fsync_dir(self, path: str) -> None:
        at, name = _here(path)
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0), dir_fd=at)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        (sfd, sname), (dfd, dname) = _at(src), _at(dst)
        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def unlink(self, path: str) -> None:
        fd, name = _at(path)
        os.unlink(name, dir_fd=fd)

    def link(self, src: str, dst: str) -> None:
        (sfd, sname), (dfd, dname) = _at(src), _at(dst)
        os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)

    def symlink(self, target: str, dst: str) -> None:
        fd, name = _at(dst)
        os.symlink(target, name, dir_fd=fd)

    def link_fd(self, fd: int, dst: str) -> None:
        # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: the unprivileged way to give an
        # O_TMPFILE file a name (os.link uses plain link(2) unless a directory fd is given)
        proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            at, name = _at(dst)
            os.link(str(fd), name, src_dir_fd=proc, dst_dir_fd=at, follow_symlinks=True)
        finally:
            os.close(proc)

    def stat(self, path: str) -> os.stat_result:
        fd, name = _at(path)
        return os.stat(name, dir_fd=fd)

    def lstat(self, path: str) -> os.stat_result:
        fd, name = _at(path)
        return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def statvfs(self, path: str) -> os.statvfs_result:
        return os.statvfs(path)

    def listdir(self, path: str) -> list[str]:
        fd, name = _here(path)
        return os.listdir(path if fd is None or name != "." else fd)

    def access(self, path: str, mode: int) -> bool:
        return os.access(path, mode)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def getcwd(self) -> str:
        return os.getcwd()

    # --- the CLI's own: descriptors it redirects, the demo's work directory ---------------
    def dup(self, fd: int) -> int:
        return os.dup(fd)

    def dup2(self, fd: int, fd2: int) -> int:
        return os.dup2(fd, fd2)

    def gettempdir(self) -> str:
        return tempfile.gettempdir()

    def mkdtemp(self, prefix: str, parent: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)

    def rmtree(self, path: str, ignore_errors: bool) -> None:  # noqa: FBT001 - as shutil's
        shutil.rmtree(path, ignore_errors=ignore_errors)

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)


_active: Backend = Backend()


@contextlib.contextmanager
def use(backend: Backend) -> Iterator[Backend]:
    """Route every filecord system call through ``backend`` inside the ``with`` block."""
    global _active
    previous, _active = _active, backend
    try:
        yield backend
    finally:
        _active = previous


# --- pinned directories ---------------------------------------------------------------------

@contextlib.contextmanager
def pinned(dirs: Iterable[str] = ()) -> Iterator[None]:
    """Pin ``dirs`` (and whatever :func:`pin` adds) while the block runs: every call of this
    module naming a file in one of them acts through the descriptor opened here, so a
    directory renamed away and replaced (by a symlink elsewhere) is not followed.  Nested
    blocks share the outer pins; each closes only what it opened."""
    _pins.scopes.append([])
    try:
        pin(dirs)
        yield
    finally:
        for d in _pins.scopes.pop():
            os.close(_pins.fds.pop(d))


def pin(dirs: Iterable[str]) -> None:
    """Pin ``dirs`` too, until the innermost :func:`pinned` block ends.  A directory already
    pinned keeps its first descriptor (the one the checks so far used); one that does not
    exist is not pinned (nothing can be made in it: acts there fail as they would)."""
    if not _pins.scopes:
        raise RuntimeError("syscalls.pin outside a syscalls.pinned block")
    for d in dict.fromkeys(_key(d) for d in dirs):
        if d is None or d in _pins.fds:
            continue
        _active.hook("pin", (d,))
        try:
            fd = _active.open_dir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        _pins.fds[d] = fd
        _pins.scopes[-1].append(d)


# --- descriptors: open, map, read, write, sync, size, locks ---------------------------------

def open(path: str, flags: int, mode: int = 0o666) -> int:
    _active.hook("open", (path, flags, mode))
    return _active.open(path, flags, mode)


def close(fd: int) -> None:
    _active.hook("close", (fd,))
    _active.close(fd)


def map_read(fd: int, length: int) -> mmap.mmap:
    """A read-only map of the first ``length`` (> 0) bytes: pages are read when touched."""
    _active.hook("map_read", (fd, length))
    return _active.map_read(fd, length)


def map_private(fd: int, length: int) -> mmap.mmap:
    """A copy-on-write map of the first ``length`` (> 0) bytes: a page written through it
    becomes the process's own (anonymous) and the file never changes."""
    _active.hook("map_private", (fd, length))
    return _active.map_private(fd, length)


def pread(fd: int, n: int, offset: int) -> bytes:
    _active.hook("pread", (fd, n, offset))
    return _active.pread(fd, n, offset)


def preadinto(fd: int, buf: memoryview, offset: int) -> int:
    _active.hook("preadinto", (fd, len(buf), offset))
    return _active.preadinto(fd, buf, offset)


def pwrite(fd: int, data: memoryview | bytes, offset: int) -> int:
    _active.hook("pwrite", (fd, len(data), offset))
    return _active.pwrite(fd, data, offset)


def write(fd: int, data: memoryview | bytes) -> int:
    _active.hook("write", (fd, len(data)))
    return _active.write(fd, data)


def fsync(fd: int) -> None:
    _active.hook("fsync", (fd,))
    _active.fsync(fd)


def ftruncate(fd: int, size: int) -> None:
    _active.hook("ftruncate", (fd, size))
    _active.ftruncate(fd, size)


def fstat(fd: int) -> os.stat_result:
    _active.hook("fstat", (fd,))
    return _active.fstat(fd)


def fchmod(fd: int, mode: int) -> None:
    _active.hook("fchmod", (fd, mode))
    _active.fchmod(fd, mode)


def lseek(fd: int, offset: int, whence: int) -> int:
    _active.hook("lseek", (fd, offset, whence))
    return _active.lseek(fd, offset, whence)


def fchown(fd: int, uid: int, gid: int) -> None:
    _active.hook("fchown", (fd, uid, gid))
    _active.fchown(fd, uid, gid)


def flock(fd: int, operation: int) -> None:
    _active.hook("flock", (fd, operation))
    _active.flock(fd, operation)


def futimens(fd: int, atime_ns: int, mtime_ns: int) -> None:
    _active.hook("futimens", (fd, atime_ns, mtime_ns))
    _active.futimens(fd, atime_ns, mtime_ns)


# --- moving bytes between descriptors: copy, clone, punch -----------------------------------

def copy_file_range(src: int, dst: int, count: int, src_off: int, dst_off: int) -> int:
    _active.hook("copy_file_range", (src, dst, count, src_off, dst_off))
    return _active.copy_file_range(src, dst, count, src_off, dst_off)


def sendfile(dst: int, src: int, src_off: int, count: int) -> int:
    _active.hook("sendfile", (dst, src, src_off, count))
    return _active.sendfile(dst, src, src_off, count)


def clone_range(src: int, src_off: int, length: int, dst: int, dst_off: int) -> None:
    _active.hook("clone_range", (src, src_off, length, dst, dst_off))
    _active.clone_range(src, src_off, length, dst, dst_off)


def inode_flags(fd: int) -> int:
    """The inode's ``FS_*_FL`` attributes (``chattr``), FS_IOC_GETFLAGS."""
    _active.hook("inode_flags", (fd,))
    return _active.inode_flags(fd)


def extents(fd: int, offset: int, length: int) -> list[Extent]:
    _active.hook("extents", (fd, offset, length))
    return _active.extents(fd, offset, length)


def punch_hole(fd: int, offset: int, length: int) -> None:
    _active.hook("punch_hole", (fd, offset, length))
    _active.punch_hole(fd, offset, length)


def prefetch(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start reading ``length`` bytes at ``offset`` into the page cache and
    return at once (``posix_fadvise(WILLNEED)``): a hint, so a refusal is ignored, and it
    changes no data and no size.  A move asks it for its next window before it waits on the
    current window's fsync, so the disk reads one while it writes the other."""
    _active.hook("prefetch", (fd, offset, length))
    with contextlib.suppress(OSError):  # a hint: nothing depends on it being taken
        _active.prefetch(fd, offset, length)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` dirty bytes at ``offset`` to the disk and
    return without waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``): it makes nothing
    durable (no metadata, no cache flush; only a later ``fsync`` does), so it is a hint, and
    a refusal is ignored.  A move starts the writeback of each 16 MiB of a window it has
    copied while more is left, so the disk writes while the rest of the window is read and
    copied, and the window's fsync has less left to wait for."""
    _active.hook("start_writeback", (fd, offset, length))
    with contextlib.suppress(OSError):  # a hint: the fsync that follows does the real work
        _active.start_writeback(fd, offset, length)


def insert_range(fd: int, offset: int, length: int) -> None:
    """Open ``length`` bytes of hole at ``offset``, shifting the data from there up unmoved
    (``fallocate(FALLOC_FL_INSERT_RANGE)``).  Both must be multiples of the file system's
    block and ``offset`` below the file's size; the size grows by ``length``.  A file system
    that cannot raises OSError(EOPNOTSUPP); a bad alignment or offset, EINVAL."""
    _active.hook("insert_range", (fd, offset, length))
    _active.insert_range(fd, offset, length)


def collapse_range(fd: int, offset: int, length: int) -> None:
    """Remove ``length`` bytes at ``offset``, shifting the data above down unmoved
    (``fallocate(FALLOC_FL_COLLAPSE_RANGE)``): the undo of :func:`insert_range`.  Same
    alignment rules; the range must end below the file's size (EINVAL otherwise)."""
    _active.hook("collapse_range", (fd, offset, length))
    _active.collapse_range(fd, offset, length)


def allocate(fd: int, offset: int, length: int) -> None:
    """Reserve blocks (``fallocate(2)`` mode 0; the size grows to ``offset + length``)."""
    _active.hook("allocate", (fd, offset, length))
    _active.allocate(fd, offset, length)


# --- names: directories, renames, links, stat -----------------------------------------------

def fsync_dir(path: str) -> None:
    _active.hook("fsync_dir", (path,))
    _active.fsync_dir(path)


def rename(src: str, dst: str) -> None:
    _active.hook("rename", (src, dst))
    _active.rename(src, dst)


def unlink(path: str) -> None:
    _active.hook("unlink", (path,))
    _active.unlink(path)


def link(src: str, dst: str) -> None:
    _active.hook("link", (src, dst))
    _active.link(src, dst)


def symlink(target: str, dst: str) -> None:
    _active.hook("symlink", (target, dst))
    _active.symlink(target, dst)


def link_fd(fd: int, dst: str) -> None:
    """Give the file open at ``fd`` (made ``O_TMPFILE``) the name ``dst``; EEXIST if taken."""
    _active.hook("link", (f"/proc/self/fd/{fd}", dst))
    _active.link_fd(fd, dst)


def open_unnamed(directory: str) -> int | None:
    """A file without a name in ``directory`` (``O_TMPFILE``: gone with its last descriptor,
    even after a crash), or None where the file system or platform cannot make one."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        return open(directory, os.O_RDWR | flag, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None
        raise


def stat(path: str) -> os.stat_result:
    _active.hook("stat", (path,))
    return _active.stat(path)


def lstat(path: str) -> os.stat_result:
    _active.hook("lstat", (path,))
    return _active.lstat(path)


def statvfs(path: str) -> os.statvfs_result:
    _active.hook("statvfs", (path,))
    return _active.statvfs(path)


def listdir(path: str) -> list[str]:
    _active.hook("listdir", (path,))
    return _active.listdir(path)


def access(path: str, mode: int) -> bool:
    _active.hook("access", (path, mode))
    return _active.access(path, mode)


def realpath(path: str) -> str:
    """The path with every symlink, ``.`` and ``..`` resolved (as ``os.path.realpath``)."""
    _active.hook("realpath", (path,))
    return _active.realpath(path)


def getcwd() -> str:
    _active.hook("getcwd", ())
    return _active.getcwd()


# --- the process: descriptor numbers, temp directories --------------------------------------

def dup(fd: int) -> int:
    _active.hook("dup", (fd,))
    return _active.dup(fd)


def dup2(fd: int, fd2: int) -> int:
    _active.hook("dup2", (fd, fd2))
    return _active.dup2(fd, fd2)


def gettempdir() -> str:
    """The system temp directory (``tempfile`` may create and remove a probe file to pick it)."""
    _active.hook("gettempdir", ())
    return _active.gettempdir()


def mkdtemp(prefix: str, parent: str) -> str:
    """A new directory ``parent/prefix<random>``, mode 0700; returns its path."""
    _active.hook("mkdtemp", (prefix, parent))
    return _active.mkdtemp(prefix, parent)


def rmtree(path: str, *, ignore_errors: bool = False) -> None:
    """Remove the directory ``path`` and everything under it (with ``ignore_errors``, as much
    of it as can be removed, silently)."""
    _active.hook("rmtree", (path,))
    _active.rmtree(path, ignore_errors)


def mkdir(path: str, mode: int = 0o777) -> None:
    """Create the directory ``path`` (its parent must exist), as ``os.mkdir``."""
    _active.hook("mkdir", (path, mode))
    _active.mkdir(path, mode)


def rmdir(path: str) -> None:
    """Remove the empty directory ``path``, as ``os.rmdir``."""
    _active.hook("rmdir", (path,))
    _active.rmdir(path)


# --- small helpers built only on the calls above --------------------------------------------


def read_all(fd: int, offset: int, n: int) -> bytes:
    """Read exactly ``n`` bytes at ``offset`` or raise ``EIO`` on a premature end of file."""
    parts: list[bytes] = []
    done = 0
    while done < n:
        chunk = pread(fd, n - done, offset + done)
        if not chunk:
            raise OSError(errno.EIO, f"unexpected end of file at offset {offset + done}")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def write_all(fd: int, data: memoryview | bytes, offset: int | None) -> None:
    """Write all of ``data`` at ``offset`` (or sequentially when ``None``), looping on short writes.

    A write that returns 0 would loop forever, so it is an error (``EIO``).
    """
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        piece = view[done:]
        n = write(fd, piece) if offset is None else pwrite(fd, piece, offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        done += n


def read_text(path: str, limit: int = 1 << 20) -> str:
    """A small text file (``/proc`` entries) read through the seam."""
    fd = open(path, os.O_RDONLY)
    try:
        parts: list[bytes] = []
        offset = 0
        while offset < limit:
            chunk = pread(fd, 65536, offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
        return b"".join(parts).decode("utf-8", "replace")
    finally:
        close(fd)


def close_each(fds: list[int]) -> list[OSError]:
    """Close every descriptor even when one close fails (Linux frees it either way); returns
    the errors, for the caller to raise or to note."""
    return [e for e in map(_close_reporting, fds) if e is not None]


def _close_reporting(fd: int) -> OSError | None:
    try:
        close(fd)
    except OSError as exc:
        return exc
    return None


def unlink_missing_ok(path: str) -> None:
    """Unlink ``path``; a name that is already gone is what we wanted."""
    try:
        unlink(path)
    except FileNotFoundError:
        return


def unlink_if_same(
    path: str, dev: int, ino: int, size: int | None = None, mtime_ns: int | None = None
) -> bool:
    """Unlink ``path`` only if it still names the file (dev, ino); never someone's new file.

    Inode numbers are reused at once on ext4, so callers that know the file's size and
    modification time pass them too.
    """
    try:
        st = lstat(path)
    except FileNotFoundError:
        return False
    if (st.st_dev, st.st_ino) != (dev, ino):
        return False
    if size is not None and st.st_size != size:
        return False
    if mtime_ns is not None and st.st_mtime_ns != mtime_ns:
        return False
    unlink_missing_ok(path)
    return True


# --- path queries built on stat -------------------------------------------------------------

def exists(path: str) -> bool:
    """Whether ``path`` names something (symlinks followed), as ``os.path.exists``."""
    try:
        stat(path)
    except (OSError, ValueError):
        return False
    return True


def lexists(path: str) -> bool:
    """Whether ``path`` names something, a dangling symlink included (``os.path.lexists``)."""
    try:
        lstat(path)
    except (OSError, ValueError):
        return False
    return True


def isfile(path: str) -> bool:
    """Whether ``path`` names a regular file (symlinks followed), as ``os.path.isfile``."""
    try:
        return _stat_mod.S_ISREG(stat(path).st_mode)
    except (OSError, ValueError):
        return False


def isdir(path: str) -> bool:
    """Whether ``path`` names a directory (symlinks followed), as ``os.path.isdir``."""
    try:
        return _stat_mod.S_ISDIR(stat(path).st_mode)
    except (OSError, ValueError):
        return False


def abspath(path: str) -> str:
    """``path`` made absolute against the working directory and normalised, as
    ``os.path.abspath`` (only a relative path asks for the working directory)."""
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(getcwd(), path))


def _parent(path: str) -> str:
    head, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.dirname(os.path.realpath(path))
    return os.path.realpath(head or ".")


def fsync_parents(paths: list[str]) -> int:
    """fsync the directory holding each path, once per distinct directory; returns how many.

    The directory is the one the kernel used for the path (symlinks resolved before ``..``),
    not a textual normalisation of it.
    """
    dirs = list(dict.fromkeys(_parent(p) for p in paths))
    for d in dirs:
        fsync_dir(d)
    return len(dirs)
