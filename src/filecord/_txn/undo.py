"""Roll back or finish a save from its journal record: one implementation for save and recover.

Theory of operation
-------------------
Everything here is judged from the files, never from memory, so the rollback of a failed save
and ``recover`` run the same code, and both can be interrupted at any call and run again.

*Roll back* (before the commit point), per source, newest first: an adopted source is found at
its output's temp by device and inode and, adopted in place, what the save appended truncated
and the space inserted in front collapsed (``_unadopt``: the temp's size says how far it got);
a parked source gets its moved bytes back (``transfer.restore_source``); then its times and
mode are put back and fsynced, and its name restored by ``link`` then ``unlink`` (never over a
file created there meanwhile: the bytes then stay at the parked name and recovery refuses).
The caller then removes the temps, the journal and the lock files.  A crash anywhere leaves
each source at one of its two names, between its kept prefix and its full size, the bytes
above that size still in the temps.

*Finish* (after the commit point): each temp still holding its journaled inode gets its
recorded mode and owner and is renamed onto its final name (one already there is done; one
lost stops recovery).  Then the discard temps and the head's removals still the recorded file
in a proven directory (``discard_and_remove``; a journal is untrusted for what it may touch),
then the parked sources: one not at its kept prefix, or not at the size and mtime of the
save's last look (the ``committed`` step), was written after that look and is kept, named
back if its name is free, and a ``DataChangedError`` says so once the rest is finished.  Not
ctime: a restore or copy of a crashed tree changes every ctime; mtime survives it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat as stat_mod
from collections.abc import Callable, Mapping

from filecord._io import syscalls as _sys
from filecord._txn import transfer
from filecord._txn.journal import Journal, JournalOutput, JournalSource
from filecord.errors import DataChangedError, RecoverError, add_note

log = logging.getLogger(__name__)


def same_file(path: str, dev: int, ino: int) -> os.stat_result | None:
    """``lstat(path)`` if it names the inode (dev, ino), else None."""
    st = _there(path)
    return st if st is not None and (st.st_dev, st.st_ino) == (dev, ino) and stat_mod.S_ISREG(
        st.st_mode) else None


def open_same(path: str, dev: int, ino: int, flags: int) -> int:
    """Open ``path`` (no symlink followed) and prove through the descriptor that it is the
    inode (dev, ino): an ``lstat`` before ``open`` leaves a window to swap the name."""
    fd = _sys.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = _sys.fstat(fd)
        if (st.st_dev, st.st_ino) != (dev, ino) or not stat_mod.S_ISREG(st.st_mode):
            raise RecoverError(f"{path} changed while recover was looking at it; not touched")
    except BaseException:
        _sys.close(fd)
        raise
    return fd


def _open_temps(j: Journal) -> list[int | None]:
    """Descriptors of the temps still holding this save's inodes (None where absent)."""
    fds: list[int | None] = []
    try:
        for o, out in enumerate(j.outputs):
            if out.direct or same_file(j.temp(o), out.dev, out.ino) is None:
                fds.append(None)
            else:
                fds.append(open_same(j.temp(o), out.dev, out.ino, os.O_RDWR))
    except BaseException:
        _close_all(fds)
        raise
    return fds


def _close_all(fds: list[int | None]) -> None:
    errors = _sys.close_each([fd for fd in fds if fd is not None])
    if errors:
        raise errors[0]


def roll_back(j: Journal, c: transfer.Counters,
              inserted: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Put every source back, byte-exact under its own name; how many moved back.
    ``inserted``: the adopted sources whose insert the journal records."""
    temps = _open_temps(j)
    try:
        return sum(_put_back(j, s, temps, c, inserted=(s.dev, s.ino) in inserted)
                   for s in reversed(j.sources))
    finally:
        _close_all(temps)


def _put_back(j: Journal, s: JournalSource, temps: list[int | None], c: transfer.Counters, *,
              inserted: bool) -> int:
    at = j.temp(s.dests[0].output) if s.adopt else j.parked(s)
    if same_file(at, s.dev, s.ino) is None:
        st = same_file(s.path, s.dev, s.ino)
        if st is None:
            raise RecoverError(f"{s.path}: the {'adopted ' if s.adopt else ''}source is neither "
                               f"at its name nor at {at}")
        if not s.adopt and st.st_size != s.size:
            raise DataChangedError(s.path, expected_size=s.size, found_size=st.st_size,
                                   reason="changed by another process before the save moved it")
        return 0
    fd = open_same(at, s.dev, s.ino, os.O_RDWR)
    try:
        if s.adopt:
            length = j.outputs[s.dests[0].output].length
            if s.inserted or length != s.size:  # adopted in place: the output was built on it
                _unadopt(fd, at, s, length, c, inserted=inserted)
            _sys.fchmod(fd, stat_mod.S_IMODE(s.mode))
        else:
            size = _sys.fstat(fd).st_size
            if not s.run_start <= size <= s.size:
                raise DataChangedError(at, expected_size=s.size, found_size=size,
                                       reason="outside the range a move of this save leaves")
            if size < s.size:
                transfer.restore_source(fd, s.as_move(), temps, j.window, c, dense=s.dense)
            # Whole with another mtime is this undo's own restore, stopped before this
            # futimens: ``check_strict`` refuses anyone else's rewrite before ``rolling back``.
            _sys.futimens(fd, s.atime_ns, s.mtime_ns)
            c.fsync(fd)
    finally:
        _sys.close(fd)
    _name_back(at, s.path)
    return 1


def _unadopt(fd: int, temp: str, s: JournalSource, length: int, c: transfer.Counters, *,
             inserted: bool) -> None:
    """Give an adopted source at its output's temp back its own bytes (the save never writes
    its blocks), judged from the temp's size (``JournalSource.adopted_size``): past the source
    and its inserted space, truncate; then collapse the space; its times back, fsynced."""
    size = _sys.fstat(fd).st_size
    if not s.adopted_size(size, length, inserted=inserted):
        raise DataChangedError(temp, expected_size=s.size + s.inserted, found_size=size,
                               reason=s.adopted_change(size, length, inserted=inserted))
    if not inserted and s.inserted and size > s.size and (
            not s.dense or _sys.extents(fd, 0, s.inserted)):
        # The insert is not recorded: only a hole in front of a source that had none proves
        # it was done (nothing is written there before its step); else the bytes past the
        # source's are another process's append.
        raise DataChangedError(temp, expected_size=s.size, found_size=size,
                               reason=s.adopted_change(size, length, inserted=inserted))
    if size > s.size:
        if size > s.size + s.inserted:
            _sys.ftruncate(fd, s.size + s.inserted)
        if s.inserted:
            _sys.collapse_range(fd, 0, s.inserted)
    _sys.futimens(fd, s.atime_ns, s.mtime_ns)
    c.fsync(fd)


def _name_back(src: str, dst: str) -> None:
    """Give ``src``'s inode back the name ``dst``, never replacing another file there."""
    taken = RecoverError(f"{dst} is now another file; the original bytes are kept at {src}")
    try:
        _sys.link(src, dst)
    except FileExistsError:
        there, here = _sys.lstat(dst), _sys.lstat(src)
        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
            raise taken from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        # No hard links here (FAT, some FUSE): rename, after checking the name is free.
        try:
            _sys.lstat(dst)
        except FileNotFoundError:
            _sys.rename(src, dst)
            _sys.fsync_parents([dst])
            return
        raise taken from exc
    _sys.unlink(src)
    _sys.fsync_parents([dst, src])


def remove_temps(j: Journal) -> None:
    temps = [j.temp(o) for o, out in enumerate(j.outputs) if not out.direct]
    for t in temps:
        _sys.unlink_missing_ok(t)
    _sys.fsync_parents(temps)


def finish(j: Journal, journal_path: str, looked: Mapping[tuple[int, int], tuple[int, int]],
           *, removals: bool = True) -> tuple[tuple[str, ...], DataChangedError | None]:
    """Finish a committed save (the module's notes); the removals kept (not the recorded
    file, or ``removals`` False: only files carrying the save's token are removed) and the
    error for the parked sources kept (:func:`unlink_parked`)."""
    _rename_outputs(j, journal_path)
    # Removals first, while the parked sources prove their directories the save's.
    _removed, removals_kept = discard_and_remove(
        j, proven_directories(j) if removals else frozenset())
    if removals_kept:
        log.warning("recover finished %s but kept %s: not provably the file the save recorded",
                    journal_path, ", ".join(removals_kept))

    def changed(s: JournalSource, st: os.stat_result) -> int | None:
        was = looked.get((s.dev, s.ino), (s.run_start, st.st_mtime_ns))
        if st.st_size != s.run_start or (st.st_size, st.st_mtime_ns) != was:
            return was[0]
        return None
    return removals_kept, unlink_parked(j, changed, transfer.Counters())


def unlink_parked(j: Journal, changed: Callable[[JournalSource, os.stat_result], int | None],
                  c: transfer.Counters) -> DataChangedError | None:
    """Unlink each parked source still its inode unless ``changed`` gives the size last seen
    of one that is no longer as last seen (the save's look, or the ``committed`` step's): that
    one was written after the look and is kept, named back if its name is free, and the
    committed error returned says where, once the rest are gone."""
    moved = [s for s in j.sources if not s.adopt]
    kept: list[tuple[JournalSource, int, int, str]] = []
    for s in moved:
        st = same_file(j.parked(s), s.dev, s.ino)
        if st is None:  # gone (unlinked before a stop), or another inode put at its name:
            # that one is another process's, kept and reported like a changed source (never
            # deleted, never left unsaid under the save's token)
            st = _there(j.parked(s))
            if st is None:
                continue
            was = s.run_start
        else:
            seen = changed(s, st)
            if seen is None:
                _sys.unlink(j.parked(s))
                continue
            was = seen
        where = (_keep_changed(j.parked(s), s.path) if stat_mod.S_ISREG(st.st_mode)
                 else f"another kind of file is kept at {j.parked(s)}")
        kept.append((s, was, st.st_size, f"{s.path}: {st.st_size} bytes (the save last saw "
                     f"{was}); " + where))
    c.fsyncs += _sys.fsync_parents([j.parked(s) for s in moved])
    if not kept:
        return None
    s, was, size, _where = kept[0]
    err = DataChangedError(s.path, expected_size=was, found_size=size,
                           reason="another process changed this consumed source after the "
                           "commit point, so it was not deleted")
    err.committed = True
    for note in ["the outputs are complete under their final names", *(k[3] for k in kept)]:
        add_note(err, note)
    err.kept = tuple(  # type: ignore[attr-defined]
        j.parked(s) if _there(j.parked(s)) is not None else s.path for s, *_rest in kept)
    return err


def _there(path: str) -> os.stat_result | None:
    try:
        return _sys.lstat(path)
    except FileNotFoundError:
        return None


def _keep_changed(parked: str, original: str) -> str:
    """Name a changed consumed source back if its name is free, else leave it parked; where
    it is, for the notes."""
    try:
        _name_back(parked, original)
    except RecoverError:
        return f"{original} is now another file, so the changed source is kept at {parked}"
    return f"the changed source is kept under its own name {original}"


def _rename_outputs(j: Journal, journal_path: str) -> None:
    """Each temp onto its final name (already there: renamed before a crash), fsynced.  A
    temp not its output's length was changed by someone else: nothing is renamed."""
    for o, out in enumerate(j.outputs):
        st = None if out.direct or out.discard else same_file(j.temp(o), out.dev, out.ino)
        if st is not None and st.st_size != out.length:
            raise temp_changed(j, o, st.st_size)
    finals: list[str] = []
    for o, out in enumerate(j.outputs):
        if out.direct or out.discard:
            continue
        temp = j.temp(o)
        if same_file(temp, out.dev, out.ino) is not None:
            _check_replaceable(out, journal_path)
            apply_owner_mode_at(temp, out.dev, out.ino, out.mode, out.uid, out.gid)
            _sys.rename(temp, out.final)
        elif same_file(out.final, out.dev, out.ino) is None:
            raise RecoverError(
                f"{out.final}: the journal {journal_path} is committed, but neither its temp "
                f"{temp} nor the renamed output is there; the output is lost (the journal is "
                "kept so the sources it lists are not deleted)"
            )
        finals.append(out.final)
    _sys.fsync_parents(finals)


def temp_changed(j: Journal, o: int, size: int) -> RecoverError:
    out = j.outputs[o]
    return RecoverError(f"{j.temp(o)}: the temp of {out.final} is {size} bytes where the journal "
                        f"says the complete output has {out.length}: another process changed "
                        "it, so it is not renamed onto the final name")


def proven_directories(j: Journal) -> frozenset[str]:
    """Where recover may remove a file without the token: the directories whose lock it holds
    and those holding a parked source of this save (only someone who may write there put a
    token-named file of the journaled inode there)."""
    parked = {os.path.dirname(j.parked(s)) for s in j.sources
              if not s.adopt and same_file(j.parked(s), s.dev, s.ino) is not None}
    return frozenset(j.locks()) | parked


def discard_and_remove(j: Journal, proven: frozenset[str] | None = None
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Unlink each discard temp still its inode, then each removal still the recorded file
    and (for recover) in a ``proven`` directory (None: the running save, which recorded them);
    fsync their directories.  (removed, kept)."""
    gone: list[str] = []
    for o, out in enumerate(j.outputs):
        if out.discard and same_file(j.temp(o), out.dev, out.ino) is not None:
            _sys.unlink(j.temp(o))
            gone.append(j.temp(o))
    removed: list[str] = []
    changed: list[str] = []
    for r in j.removals:
        try:
            st = _sys.lstat(r.path)
        except FileNotFoundError:
            continue  # gone already (a finish that ran before, or someone else)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != r.identity or (
                proven is not None and os.path.dirname(r.path) not in proven):
            changed.append(r.path)
            continue
        _sys.unlink(r.path)
        removed.append(r.path)
    if gone or removed:
        _sys.fsync_parents([*gone, *removed])
    return tuple(removed), tuple(changed)


def _check_replaceable(out: JournalOutput, journal_path: str) -> None:
    """The final name must hold what the save replaces, or nothing: never a newer file."""
    try:
        st = _sys.lstat(out.final)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) != (out.old_dev, out.old_ino):
        raise RecoverError(
            f"{out.final} was replaced after the save of {journal_path} stopped; the newer "
            f"file is kept and this save's output stays at its temp"
        )


def apply_owner_mode_at(path: str, dev: int, ino: int, mode: int, uid: int, gid: int) -> None:
    if mode < 0 and uid < 0 and gid < 0:
        return
    fd = open_same(path, dev, ino, os.O_RDONLY)
    try:
        apply_owner_mode(fd, mode, uid, gid)
    finally:
        _sys.close(fd)


def apply_owner_mode(fd: int, mode: int, uid: int, gid: int) -> None:
    """Owner first (a chown clears set-id bits), then the mode; an owner we may not give is
    left as it is (an unprivileged process cannot give a file away)."""
    if uid >= 0 or gid >= 0:
        st = _sys.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            with contextlib.suppress(PermissionError):
                _sys.fchown(fd, uid, gid)
    if mode >= 0:
        _sys.fchmod(fd, stat_mod.S_IMODE(mode))
