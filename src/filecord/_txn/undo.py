"""Roll back or finish a save from its journal record: one implementation for save and recover.

Theory of operation
-------------------
Judged from the files, never from memory: a failed save's rollback and ``recover`` run the
same code, and both may be interrupted at any call and run again.  Every write goes through
one door, :func:`open_own` (the trust rule, ``decide``: an inode another name reaches is
never written).

*Roll back* (before the commit point), per source, newest first: an adopted source at its
output's temp has what the save appended truncated and the inserted space collapsed (the
temp's size says how far it got); a parked source gets its moved bytes back from the temps;
its times and mode are put back, fsynced, and its name by ``link`` then ``unlink`` (never
over a file made there meanwhile: recovery then refuses).  With another link, its bytes are
built in a new unnamed file (the temps not freed meanwhile), fsynced, its identity logged (a
``rebuilt`` step, fsynced) and then linked to its name, and only the token name unlinked: the
other name keeps what it held.  The step is the proof a rerun needs: the file at the source's
name that it names is the rollback's own (not built again; the source found), never one a
third party put there.  The caller removes the temps, journal and lock files.  A crash leaves
each source at one of its two names, between its kept prefix and its full size, the rest
still in the temps.

*Finish* (after the commit point): each temp still its journaled inode gets its recorded mode
and owner (refused where it has another link and needs them) and is renamed onto its final
name (one already there is done; one lost stops recovery).  Then the discard temps, the
removals still the recorded file in a proven directory (a journal is untrusted for what it may
touch), then the parked sources: one not at its kept prefix, or not at the size and mtime of
the ``committed`` step's look, was written after it and is kept, named back if its name is
free, and a ``DataChangedError`` says so once the rest is finished (not ctime: a restore or
copy of a crashed tree changes every ctime; mtime survives it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from collections.abc import Callable, Mapping

from filecord._io import syscalls as _sys
from filecord._txn import transfer
from filecord._txn.journal import Journal, JournalSource, step
from filecord._txn.stages import Stage
from filecord.errors import DataChangedError, RecoverError, add_note


def same_file(path: str, dev: int, ino: int) -> os.stat_result | None:
    """``lstat(path)`` if it names the inode (dev, ino), else None."""
    st = _there(path)
    return st if st is not None and (st.st_dev, st.st_ino) == (dev, ino) and stat_mod.S_ISREG(
        st.st_mode) else None


def rebuilt_at(path: str, s: JournalSource, new: Key | None) -> os.stat_result | None:
    """``lstat(path)`` if it is ``s`` rebuilt: the inode a ``rebuilt`` step names (``new``)
    with the size and mtime the rebuild gives it before that step (an unnamed file's inode
    number is reused at once, so the number alone proves nothing)."""
    st = None if new is None else same_file(path, *new)
    return st if st is not None and (st.st_size, st.st_mtime_ns) == (s.size, s.mtime_ns) else None


def open_own(path: str, dev: int, ino: int) -> tuple[int, bool]:
    """The one door to every write here (the module's notes): ``path`` opened (no symlink
    followed) and proven through the descriptor the inode (dev, ino) (an ``lstat`` before
    ``open`` leaves a window to swap the name); read-write and True where that name is its one
    link, else read-only and False."""
    flags = os.O_RDWR
    while True:
        fd = _sys.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = _sys.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino) or not stat_mod.S_ISREG(st.st_mode):
                raise RecoverError(f"{path} changed while recover was looking at it; not touched")
        except BaseException:
            _sys.close(fd)
            raise
        if st.st_nlink == 1 or flags == os.O_RDONLY:
            return fd, flags == os.O_RDWR
        _sys.close(fd)
        flags = os.O_RDONLY


Key = tuple[int, int]  # (st_dev, st_ino)


def roll_back(j: Journal, c: transfer.Counters, inserted: frozenset[Key],
              rebuilt: Mapping[Key, Key], log: Callable[[bytes], None]) -> int:
    """Put every source back (the module's notes); how many moved back.  ``inserted``,
    ``rebuilt``: as ``journal.Log``'s; ``log`` appends a step, durably."""
    temps: list[int | None] = []  # the temps still holding this save's inodes
    try:
        for o, out in enumerate(j.outputs):
            held = not out.direct and same_file(j.temp(o), out.dev, out.ino) is not None
            temps.append(open_own(j.temp(o), out.dev, out.ino)[0] if held else None)
        return sum(_put_back(j, s, temps, c, inserted=(s.dev, s.ino) in inserted,
                             new=rebuilt.get((s.dev, s.ino)), log=log)
                   for s in reversed(j.sources))
    finally:
        errors = _sys.close_each([fd for fd in temps if fd is not None])
        if errors:
            raise errors[0]


def _put_back(j: Journal, s: JournalSource, temps: list[int | None], c: transfer.Counters, *,
              inserted: bool, new: Key | None, log: Callable[[bytes], None]) -> int:
    """One source back (``new``: the file its ``rebuilt`` step names)."""
    at = j.temp(s.dests[0].output) if s.adopt else j.parked(s)
    if same_file(at, s.dev, s.ino) is None:
        st = same_file(s.path, s.dev, s.ino)
        st = st or rebuilt_at(s.path, s, new)  # rebuilt and named before a stop
        if st is None:
            raise RecoverError(f"{s.path}: the {'adopted ' if s.adopt else ''}source is neither "
                               f"at its name nor at {at}")
        if not s.adopt and st.st_size != s.size:
            raise DataChangedError(s.path, expected_size=s.size, found_size=st.st_size,
                                   reason="changed by another process before the save moved it")
        return 0
    fd, own = open_own(at, s.dev, s.ino)
    try:
        length = j.outputs[s.dests[0].output].length if s.adopt else 0
        fill = None
        if s.adopt and (s.inserted or length != s.size):  # in place: the output built on it
            fill = _unadopt(fd, at, s, length, c, own=own, inserted=inserted)
        elif s.adopt and own:  # whole: the file as it is, only the output's mode taken back
            _sys.fchmod(fd, stat_mod.S_IMODE(s.mode))
        elif not s.adopt:
            fill = _unpark(fd, at, s, temps, j.window, c, own=own)
        if fill is not None and rebuilt_at(s.path, s, new) is None:
            _copy_out(fd, at, s, c, fill, log)
    finally:
        _sys.close(fd)
    if fill is not None:  # the other name keeps the inode as it was; only the token name goes
        _sys.unlink(at)
        _sys.fsync_parents([s.path, at])
    else:
        _name_back(at, s.path)
    return 1


def _unpark(fd: int, at: str, s: JournalSource, temps: list[int | None], window: int,
            c: transfer.Counters, *, own: bool) -> Callable[[int], object] | None:
    """A parked source's moved bytes back in place where ``own``, else what fills a copy."""
    size = _sys.fstat(fd).st_size
    if not s.run_start <= size <= s.size:
        raise DataChangedError(at, expected_size=s.size, found_size=size,
                               reason="outside the range a move of this save leaves")

    def restore(to: int) -> None:
        if to != fd:  # a new file: the kept prefix first
            transfer.copy_range(fd, to, 0, 0, size, c, kind="restored")
        transfer.restore_source(to, s.as_move(), temps, window, c, dense=s.dense,
                                free=to == fd)  # a new file: not named until it is whole

    if not own:  # whole: named back as it is, nothing written
        return restore if size < s.size else None
    if size < s.size:
        restore(fd)
    # Whole with another mtime is this undo's own restore, stopped before this futimens:
    # ``check_strict`` refuses anyone else's rewrite before ``rolling back``.
    _sys.futimens(fd, s.atime_ns, s.mtime_ns)
    c.fsync(fd)
    return None


def _unadopt(fd: int, temp: str, s: JournalSource, length: int, c: transfer.Counters, *,
             own: bool, inserted: bool) -> Callable[[int], object] | None:
    """Give an adopted source at its output's temp its own bytes back, judged from the temp's
    size (``JournalSource.adopted_refusal``): in place where ``own`` (what follows it truncated,
    the space in front collapsed), else what fills a copy."""
    size = _sys.fstat(fd).st_size
    # An insert not recorded is proven done only by a hole in front of a source that had none
    # (nothing is written there before its step); else the bytes past the source's are
    # another process's append.
    front = not inserted and s.inserted and size == s.size + s.inserted
    why = s.adopted_refusal(size, length, inserted=inserted, hole=not front or (
        s.dense and not _sys.extents(fd, 0, s.inserted)))
    if why is not None:
        raise DataChangedError(temp, expected_size=s.size if front else s.size + s.inserted,
                               found_size=size, reason=why)
    at = s.inserted if size > s.size else 0  # where the source's bytes begin
    if not own:  # untouched (its own size): named back as it is, nothing written
        return None if size == s.size else lambda new: transfer.copy_range(
            fd, new, at, 0, s.size, c, kind="restored")
    if size > s.size + s.inserted:
        _sys.ftruncate(fd, s.size + s.inserted)
    if at:
        _sys.collapse_range(fd, 0, at)
    _sys.futimens(fd, s.atime_ns, s.mtime_ns)
    _sys.fchmod(fd, stat_mod.S_IMODE(s.mode))
    c.fsync(fd)
    return None


def _copy_out(fd: int, at: str, s: JournalSource, c: transfer.Counters,
              fill: Callable[[int], object], log: Callable[[bytes], None]) -> None:
    """Build ``s``'s bytes (``fill``) in a new file with the owner and mode of the inode at
    ``at`` (never set-id bits: a forged journal can name any inode) and the journaled times,
    fsynced, logged (a ``rebuilt`` step), then named ``s.path``."""
    new = _sys.open_unnamed(os.path.dirname(s.path))
    if new is None:
        raise RecoverError(f"{at} has another hard link, and this file system makes no "
                           f"unnamed file to rebuild {s.path} in; nothing was written")
    try:
        fill(new)
        st = _sys.fstat(fd)
        apply_owner_mode(new, st.st_mode & ~(stat_mod.S_ISUID | stat_mod.S_ISGID),
                         st.st_uid, st.st_gid)
        _sys.futimens(new, s.atime_ns, s.mtime_ns)
        c.fsync(new)
        built = _sys.fstat(new)
        log(step(Stage.ROLLING_BACK, rebuilt=[s.dev, s.ino, built.st_dev, built.st_ino]))
        try:
            _sys.link_fd(new, s.path)
        except FileExistsError:
            raise RecoverError(f"{s.path} is now another file; the original bytes are kept "
                               f"at {at} and in the temps") from None
    finally:
        _sys.close(new)


def _name_back(src: str, dst: str) -> None:  # never over another file at dst
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
        if _there(dst) is not None:  # no hard links here (FAT, some FUSE): rename if free
            raise taken from exc
        _sys.rename(src, dst)
        _sys.fsync_parents([dst])
        return
    _sys.unlink(src)
    _sys.fsync_parents([dst, src])


def finish(j: Journal, journal_path: str, looked: Mapping[Key, tuple[int, int]],
           *, removals: bool = True) -> tuple[tuple[str, ...], DataChangedError | None]:
    """Finish a committed save (``removals`` False: only token files go); the removals kept
    and :func:`unlink_parked`'s error."""
    _rename_outputs(j, journal_path)
    # Removals first, while the parked sources prove their directories the save's.
    _removed, removals_kept = discard_and_remove(
        j, proven_directories(j) if removals else frozenset())
    return removals_kept, unlink_parked(j, looked, transfer.Counters())


def unlink_parked(j: Journal, looked: Mapping[Key, tuple[int, int]],
                  c: transfer.Counters) -> DataChangedError | None:
    """The finish's parked sources (the module's notes; ``looked``: the ``committed`` step's
    looks): the save and recover judge alike; the committed error says where any is kept."""
    moved = [s for s in j.sources if not s.adopt]
    err: DataChangedError | None = None  # about the first source kept
    kept: list[str] = []  # where each is kept
    notes = ["the outputs are complete under their final names"]
    for s in moved:
        # Another process's inode put at its name is kept and said like a changed source.
        parked, own = j.parked(s), same_file(j.parked(s), s.dev, s.ino)
        st = own or _there(parked)
        if st is None:
            continue  # unlinked before a stop
        was, mtime = looked.get((s.dev, s.ino), (s.run_start, st.st_mtime_ns))
        unchanged = (st.st_size, st.st_mtime_ns, was) == (s.run_start, mtime, s.run_start)
        if own is not None and unchanged:
            _sys.unlink(parked)
            continue
        at, why = parked, "another kind of file"
        if stat_mod.S_ISREG(st.st_mode):
            try:
                _name_back(parked, s.path)
                at, why = s.path, "under its own name"
            except RecoverError:
                why = f"{s.path} is now another file"
        err = err or DataChangedError(s.path, expected_size=was, found_size=st.st_size,
                                      reason="another process changed this consumed source "
                                      "after the commit point, so it was not deleted")
        kept.append(at)
        notes.append(f"{s.path}: {st.st_size} bytes (the save last saw {was}); kept at {at} "
                     f"({why})")
    c.fsyncs += _sys.fsync_parents([j.parked(s) for s in moved])
    if err is not None:
        err.committed = True
        for note in notes:
            add_note(err, note)
        err.kept = tuple(kept)  # type: ignore[attr-defined]
    return err


def _there(path: str) -> os.stat_result | None:
    try:
        return _sys.lstat(path)
    except FileNotFoundError:
        return None


def _rename_outputs(j: Journal, journal_path: str) -> None:
    """Each temp onto its final name (already there: renamed before a crash), fsynced; each
    at its journaled length (``assess.check_committed``: else nothing is renamed)."""
    finals: list[str] = []
    for o, out in enumerate(j.outputs):
        if out.direct or out.discard:
            continue
        temp = j.temp(o)
        if same_file(temp, out.dev, out.ino) is not None:
            now = _there(out.final)  # what the save replaces, or nothing: never a newer file
            if now is not None and (now.st_dev, now.st_ino) != (out.old_dev, out.old_ino):
                raise RecoverError(f"{out.final} was replaced after the save of {journal_path} "
                                   "stopped; the newer file is kept and this save's output "
                                   "stays at its temp")
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


def proven_directories(j: Journal) -> frozenset[str]:
    """Where recover may remove a file without the token: the directories whose lock it holds
    and those holding a parked source of this save (only someone who may write there put a
    token-named file of the journaled inode there)."""
    parked = {os.path.dirname(j.parked(s)) for s in j.sources
              if not s.adopt and same_file(j.parked(s), s.dev, s.ino) is not None}
    return frozenset(j.locks()) | parked


def discard_and_remove(j: Journal, proven: frozenset[str] | None = None
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Unlink each discard temp and each removal still the recorded file (recover: in a
    ``proven`` directory; None: the running save, which recorded them).  (removed, kept)."""
    gone: list[str] = []
    for o, out in enumerate(j.outputs):
        if out.discard and same_file(j.temp(o), out.dev, out.ino) is not None:
            _sys.unlink(j.temp(o))
            gone.append(j.temp(o))
    removed: list[str] = []
    changed: list[str] = []
    for r in j.removals:
        st = _there(r.path)
        if st is None:
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


def apply_owner_mode_at(path: str, dev: int, ino: int, mode: int, uid: int, gid: int) -> None:
    """``apply_owner_mode`` through :func:`open_own`: a temp with another hard link is given
    no mode or owner (that name's file is never changed), and one that needs them is refused."""
    if mode < 0 and uid < 0 and gid < 0:
        return
    fd, own = open_own(path, dev, ino)
    try:
        if own:
            apply_owner_mode(fd, mode, uid, gid)
            return
        st = _sys.fstat(fd)
        if (mode >= 0 and stat_mod.S_IMODE(st.st_mode) != stat_mod.S_IMODE(mode)) or (
                uid >= 0 and st.st_uid != uid) or (gid >= 0 and st.st_gid != gid):
            raise RecoverError(f"{path} has another hard link, so it is given no mode or owner "
                               "(the file that name reaches is never changed) and not renamed")
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
