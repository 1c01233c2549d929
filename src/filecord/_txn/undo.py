"""Roll back or finish a save from its journal record: one implementation for save and recover.

Theory of operation
-------------------
Everything here is judged from the files, never from memory, so the in-process rollback of a
failed save and ``recover`` after a crash run the same code, and both can be interrupted at any
call and run again.

*Roll back* (before the commit point), per source, newest first:

1. an adopted source (renamed onto its output's temp) is found at the temp by device and
   inode; adopted in place, what the save appended is truncated and the space inserted in
   front of it collapsed (``_unadopt``: the temp's size says which step it reached), its
   times put back and fsynced; its mode put back with ``fchmod``, and its name restored;
2. a parked source (``.NAME.TOKEN.filecord-src``, renamed there before it was shortened) gets
   its moved bytes back from the temps (``transfer.restore_source``: copy back, ``fsync`` the
   source, then punch the temp), its times restored with ``futimens`` and ``fsync``ed;
3. its original name is restored with ``link`` then ``unlink`` of the parked name, so a file
   someone created at the original path meanwhile is never replaced (the bytes then stay at
   the parked name and recovery refuses, saying so); the directories are fsynced.

The caller then removes the temps, fsyncs their directories, and removes the journal and the
lock files.  A crash anywhere leaves each source at one of its two names with a size between
its kept prefix and its full size, and the bytes above that size still in the temps.

*Strict* mode (``assess.check_strict``, for a journal whose last step is ``journaled`` or
``moving``) first
checks every source is where and how long a move of this save can have left it: at a window
boundary of its run.
Any other size means someone else changed the file; nothing is done and the caller refuses.
It also checks the move order (``assess.check_order``, journals marked ``ordered``): moves
run one at a time in journal order, so the sources before the one in progress (the first not
at its kept prefix) are at their kept prefixes, those after it at full size, and the first
N, when the
journal's ``moved`` record says N, at their kept prefixes.  A write into a finished source,
or a cut of one whose move never began, is refused even at a size a move could leave.

*Finish* (after the commit point): each temp still holding the journaled inode is given its
recorded mode and owner and renamed onto its final name; a final name already holding that
inode is done; anything else is a lost output and stops recovery. A discard output is never
renamed: its temp is unlinked (``discard_and_remove``, before the parked sources), as are the
head's removals still matching their recorded identity and in a directory proven the save's
(``proven_directories``: its lock is held there, or a parked source of it is there; a journal
is untrusted for what it may touch). The directories are fsynced, then the parked sources
(their names carry the token, so an inode number reused by a new file at the old path can never
be mistaken for them) are unlinked and their directories fsynced. Recover has no in-memory
look, and the journal is written before the moves, so it cannot hold their last stat: the save
puts it in the journal's ``committed`` step, the commit point itself (checksummed, fsynced;
``journal.read_log``). A parked source whose size is not its kept prefix, or whose size and
mtime are not the recorded ones, was written after the save's last look and is kept (named back
if its name is free), never unlinked, and a ``DataChangedError`` says so after everything else
is finished. The look was written by the save, but a crafted journal can carry one too, so it
never proves a move finished (``assess.check_committed``): only the files do (a later move at
its kept prefix, or the outputs holding every moved byte); without that proof a committed
journal is refused. Not ctime: a restore or copy of a crashed tree changes every ctime, mtime
survives it. A rewrite that keeps size and mtime (``utime``, or within one timestamp tick) is
not seen by recover. """

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat as stat_mod
from collections.abc import Mapping

from filecord._io import syscalls as _sys
from filecord._txn import transfer
from filecord._txn.journal import Journal, JournalOutput, JournalSource
from filecord.errors import DataChangedError, RecoverError, add_note

log = logging.getLogger(__name__)


def same_file(path: str, dev: int, ino: int) -> os.stat_result | None:
    """``lstat(path)`` if it names the inode (dev, ino), else None."""
    try:
        st = _sys.lstat(path)
    except FileNotFoundError:
        return None
    return st if (st.st_dev, st.st_ino) == (dev, ino) and stat_mod.S_ISREG(st.st_mode) else None


def open_same(path: str, dev: int, ino: int, flags: int) -> int:
    """Open ``path`` without following a symlink and check it is the inode (dev, ino).

    An ``lstat`` before ``open`` is not enough: a second party can swap the name for a symlink
    to another file in between.  The check on the descriptor is the proof.
    """
    fd = _sys.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = _sys.fstat(fd)
        if (st.st_dev, st.st_ino) != (dev, ino) or not stat_mod.S_ISREG(st.st_mode):
            raise RecoverError(f"{path} changed while recover was looking at it; not touched")
    except BaseException:
        _sys.close(fd)
        raise
    return fd


def keep_changed(parked: str, original: str) -> str:
    """A consumed source changed after the save's last look is never deleted: give it back
    its own name if that is free (a link, never over another file), else leave it parked.
    Returns where it is, for the error's notes."""
    try:
        _name_back(parked, original)
    except RecoverError:
        return f"{original} is now another file, so the changed source is kept at {parked}"
    return f"the changed source is kept under its own name {original}"


def check_temp_lengths(j: Journal) -> None:
    """Refuse (``RecoverError``) to finish while a temp of this save is not the length the
    journal says its output has: a complete output is exactly that long, so another process cut
    it short or grew it, and renaming it would publish a wrong file under the final name.
    Checked for every temp before the first rename, so a refusal renames nothing."""
    for o, out in enumerate(j.outputs):
        if out.direct or out.discard:  # a discard temp is unlinked, whatever it holds
            continue
        st = same_file(j.temp(o), out.dev, out.ino)
        if st is not None and st.st_size != out.length:
            raise RecoverError(
                f"{j.temp(o)}: the temp of {out.final} is {st.st_size} bytes where the journal "
                f"says the complete output has {out.length}: another process changed it, so it "
                "is not renamed onto the final name"
            )


def open_temps(j: Journal) -> list[int | None]:
    """Descriptors of the temps still holding this save's inodes (None where absent)."""
    fds: list[int | None] = []
    try:
        for o, out in enumerate(j.outputs):
            if out.direct or same_file(j.temp(o), out.dev, out.ino) is None:
                fds.append(None)
            else:
                fds.append(open_same(j.temp(o), out.dev, out.ino, os.O_RDWR))
    except BaseException:
        close_all(fds)
        raise
    return fds


def close_all(fds: list[int | None]) -> None:
    """Close every descriptor; the first close error is raised once all are closed."""
    errors = _sys.close_each([fd for fd in fds if fd is not None])
    if errors:
        raise errors[0]


def roll_back(j: Journal, temps: list[int | None], c: transfer.Counters,
              inserted: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Put every source back, byte-exact under its own name; returns how many moved back.
    ``inserted``: the adopted sources whose insert the journal records."""
    restored = 0
    for s in reversed(j.sources):
        restored += _put_back(j, s, temps, c, inserted=(s.dev, s.ino) in inserted)
    return restored


def _put_back(j: Journal, s: JournalSource, temps: list[int | None], c: transfer.Counters, *,
              inserted: bool) -> int:
    if s.adopt:
        temp = j.temp(s.dests[0].output)
        if same_file(temp, s.dev, s.ino) is not None:
            fd = open_same(temp, s.dev, s.ino, os.O_RDWR)
            try:
                if s.inserted or j.outputs[s.dests[0].output].length != s.size:
                    # adopted in place: the output was built on it
                    _unadopt(fd, temp, s, j.outputs[s.dests[0].output].length, c,
                             inserted=inserted)
                _sys.fchmod(fd, stat_mod.S_IMODE(s.mode))
            finally:
                _sys.close(fd)
            _name_back(temp, s.path)
            return 1
        if same_file(s.path, s.dev, s.ino) is None:
            raise RecoverError(f"{s.path}: the adopted source is neither at its name nor at {temp}")
        return 0
    parked = j.parked(s)
    st = same_file(parked, s.dev, s.ino)
    if st is None:
        st = same_file(s.path, s.dev, s.ino)
        if st is None:
            raise RecoverError(f"{s.path}: the source is neither at its name nor at {parked}")
        if st.st_size != s.size:
            raise DataChangedError(s.path, expected_size=s.size, found_size=st.st_size,
                                   reason="changed by another process before the save moved it")
        return 0
    fd = open_same(parked, s.dev, s.ino, os.O_RDWR)
    try:
        size = _sys.fstat(fd).st_size
        if not s.run_start <= size <= s.size:
            raise DataChangedError(parked, expected_size=s.size, found_size=size,
                                   reason="outside the range a move of this save leaves")
        if size < s.size:
            transfer.restore_source(fd, s.as_move(), temps, j.window, c, punch=True,
                                    dense=s.dense)
        # Whole with another mtime: in a rollback (the ``rolling back`` stage) that is this
        # undo's own restore, stopped before this futimens.  A rewrite of a source the save never
        # shortened is refused by ``check_strict`` before ``rolling back`` is appended,
        # so no one else's rewrite reaches here to be hidden.
        _sys.futimens(fd, s.atime_ns, s.mtime_ns)
        c.fsync(fd)
    finally:
        _sys.close(fd)
    _name_back(parked, s.path)
    return 1


def _unadopt(fd: int, temp: str, s: JournalSource, length: int, c: transfer.Counters, *,
             inserted: bool) -> None:
    """Give an adopted source at its output's temp back its own bytes, and only those.

    Judged from the temp's size and whether the journal records the insert
    (``JournalSource.adopted_size``; ``assess`` refused any other first): the source's size
    (nothing was inserted, or the collapse below already ran; nothing was appended, or the
    truncate below already ran): nothing to take back.  At least the source plus the inserted
    space, the insert recorded (or, unrecorded, exactly that and a hole in front): truncate to
    that (what the save appended goes), collapse the space (what was written into it goes),
    fsync.  The source's blocks are
    never written by the save, so they are its bytes.  Its journaled times are put back and
    fsynced whenever the file was touched (an interrupted undo may have collapsed it
    already: the times still go back).
    """
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
    try:
        _sys.link(src, dst)
    except FileExistsError:
        there, here = _sys.lstat(dst), _sys.lstat(src)
        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
            raise RecoverError(
                f"{dst} is now another file; the original bytes are kept at {src}"
            ) from None
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
        raise RecoverError(
            f"{dst} is now another file; the original bytes are kept at {src}"
        ) from exc
    _sys.unlink(src)
    _sys.fsync_parents([dst, src])


def remove_temps(j: Journal) -> None:
    temps = [j.temp(o) for o, out in enumerate(j.outputs) if not out.direct]
    for t in temps:
        _sys.unlink_missing_ok(t)
    _sys.fsync_parents(temps)


def finish(j: Journal, journal_path: str,
           looked: Mapping[tuple[int, int], tuple[int, int]] | None = None
           ) -> tuple[str, ...]:
    """Finish a committed save (see the module's notes); returns the files of the head's
    ``removals`` kept because they are no longer the recorded file."""
    _rename_outputs(j, journal_path)
    # The removals first, while the parked sources prove their directories are the save's.
    _removed, changed = discard_and_remove(j, proven_directories(j))
    if changed:
        log.warning("recover finished %s but kept %s: not provably the file the save recorded",
                    journal_path, ", ".join(changed))
    # A parked source not at the size its finished move leaves, or not at the size and mtime
    # the save's last look recorded (in the journal's ``committed`` step, the commit point),
    # was written by someone else and is kept, never deleted.
    looked = looked or {}
    parked = [j.parked(s) for s in j.sources if not s.adopt]
    kept: list[tuple[JournalSource, os.stat_result, str]] = []
    for s, p in zip((s for s in j.sources if not s.adopt), parked, strict=True):
        st = same_file(p, s.dev, s.ino)
        if st is None:
            continue
        was = looked.get((s.dev, s.ino), (s.run_start, st.st_mtime_ns))
        if st.st_size != s.run_start or (st.st_size, st.st_mtime_ns) != was:
            kept.append((s, st, keep_changed(p, s.path)))
            continue
        _sys.unlink(p)
    _sys.fsync_parents(parked)
    if kept:
        _raise_kept(j, kept)
    return changed


def _rename_outputs(j: Journal, journal_path: str) -> None:
    """Each temp onto its final name (already there: renamed before a crash), fsynced."""
    check_temp_lengths(j)  # again here: every path that renames a temp goes through finish
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


def _raise_kept(j: Journal, kept: list[tuple[JournalSource, os.stat_result, str]]) -> None:
    """The finish is over but for consumed sources another process changed after the commit,
    kept where the notes say: a committed ``DataChangedError``."""
    s, st, _where = kept[0]
    err = DataChangedError(s.path, expected_size=s.run_start, found_size=st.st_size,
                           reason="another process changed this consumed source after the "
                           "commit point, so it was not deleted")
    err.committed = True
    add_note(err, "the outputs are complete under their final names")
    for _s, _st, where in kept:
        add_note(err, where)
    # Where each kept file is now (its own name, or its parked one when that was taken).
    err.kept = tuple(  # type: ignore[attr-defined]
        p if same_file(p, s.dev, s.ino) is not None else s.path
        for s, _st, _w in kept for p in (j.parked(s),)
    )
    raise err


def proven_directories(j: Journal) -> frozenset[str]:
    """The directories recover may remove a file without the token from: those whose lock
    file it holds (each names this journal), and those holding a parked source of this save
    (a token-named file of the journaled inode: only someone who may write there put it
    there).  A journal is untrusted for what it may touch: a removal anywhere else is kept."""
    parked = {os.path.dirname(j.parked(s)) for s in j.sources
              if not s.adopt and same_file(j.parked(s), s.dev, s.ino) is not None}
    return frozenset(j.directories()) | parked


def discard_and_remove(j: Journal, proven: frozenset[str] | None = None
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """After the commit point and the renames (the save's commit and recover's finish alike),
    before the parked sources are unlinked: unlink each discard output's temp still holding its
    inode, then each file of the head's ``removals`` still the recorded file (device, inode,
    size, modification time) and, for recover, in a ``proven`` directory
    (:func:`proven_directories`; None: the running save, which recorded them itself), and
    fsync their directories.  A removal found changed, replaced or unproven is kept.  Judged
    from the files, so it can be interrupted and run again.  Returns (removed, kept)."""
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
    """The final name must still hold what the save meant to replace (or nothing): a file saved
    there after the crash is newer than this save and is never overwritten by finishing it."""
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
