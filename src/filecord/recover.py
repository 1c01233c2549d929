"""Finish or undo a save that was interrupted, from its journal.

Theory of operation
-------------------
A journal's first line lists the outputs (temp -> final) and every source the save may shorten
or delete, with each moved range's destinations.  Its state decides the direction:

* **torn** (first line incomplete or failing its checksum): it was never synced, so nothing
  destructive happened.  Temps with the journal's token in its directory are removed, then the
  journal.
* **committed** (the commit line is there): every temp is complete.  Rename each temp that
  still exists onto its final name, fsync the directories, shorten any moved source still
  longer than its kept prefix, delete the sources marked for deletion (only if they are still
  the same inode), fsync their directories, delete the journal.
* **uncommitted**: put every moved byte back (``transfer.restore_source``: copy back, fsync
  the source, then punch the temp), restore the sources' times, fsync, then delete the temps,
  fsync the directory, delete the journal.

Every step is judged from the files themselves (does the temp exist, how long is the source),
so running recovery again after a crash in the middle continues where it stopped; the journal
is deleted last.  A source that is now a different file (other inode), or shorter than the
journal allows, stops recovery with :class:`RecoverError` rather than guessing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from filecord import _sys, journal, transfer
from filecord.errors import RecoverError
from filecord.plan import DEFAULT_WINDOW

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """One journal handled: ``action`` is "finished", "restored" or "discarded"."""

    journal: str
    action: str
    outputs: tuple[str, ...]
    sources: tuple[str, ...]


def find_journals(directory: str) -> list[str]:
    return sorted(
        os.path.join(directory, n)
        for n in _sys.listdir(directory)
        if n.startswith(".") and n.endswith(journal.SUFFIX)
    )


def recover(path: str | os.PathLike[str]) -> list[Recovered]:
    """Recover the journal at ``path``, or every journal in the directory ``path``.

    Returns what was done per journal (an empty list when a directory holds none).  Safe to
    run again at any time: a recovered journal is gone, and an interrupted recovery resumes.
    """
    target = os.fspath(path)
    st = _sys.stat(target)
    journals = find_journals(target) if os.path.isdir(target) and st else [target]
    return [_recover_one(j) for j in journals]


def _read(path: str) -> bytes:
    fd = _sys.open(path, os.O_RDONLY)
    try:
        size = _sys.fstat(fd).st_size
        return _sys.read_all(fd, 0, size)
    finally:
        _sys.close(fd)


def _token_of(path: str) -> str | None:
    name = os.path.basename(path)
    if not name.endswith(journal.SUFFIX):
        return None
    parts = name[: -len(journal.SUFFIX)].rsplit(".", 1)
    return parts[1] if len(parts) == 2 else None


def _recover_one(path: str) -> Recovered:
    j = journal.decode(_read(path))
    if j is None:
        return _discard_torn(path)
    if j.committed:
        return _finish(path, j)
    return _restore(path, j)


def _discard_torn(path: str) -> Recovered:
    directory = os.path.dirname(path) or "."
    token = _token_of(path)
    removed = []
    if token:
        for name in _sys.listdir(directory):
            if name.endswith(f".{token}{journal.TEMP_SUFFIX}"):
                _sys.unlink_missing_ok(os.path.join(directory, name))
                removed.append(name)
    _sys.unlink_missing_ok(path)
    log.info("journal %s was torn (never synced): removed it and %d temp(s)", path, len(removed))
    return Recovered(path, "discarded", (), ())


def _same_file(path: str, dev: int, ino: int) -> os.stat_result | None:
    try:
        st = _sys.lstat(path)
    except FileNotFoundError:
        return None
    return st if (st.st_dev, st.st_ino) == (dev, ino) else None


def _finish(path: str, j: journal.Journal) -> Recovered:
    for out in j.outputs:
        if out.temp and _exists(out.temp):
            _sys.rename(out.temp, out.final)
        elif out.temp and _same_file(out.final, out.dev, out.ino) is None:
            raise RecoverError(
                f"{out.final}: the journal {path} is committed, but neither its temp "
                f"{out.temp} nor the renamed output is there; the output is lost (the journal "
                "is kept so the sources it lists are not deleted)"
            )
    _sys.fsync_parents([o.final for o in j.outputs if o.temp])
    touched: list[str] = []
    for s in j.sources:
        st = _same_file(s.path, s.dev, s.ino)
        if st is None:
            continue
        touched.append(s.path)
        if s.unlink_at_commit:
            _sys.unlink_missing_ok(s.path)
        elif st.st_size > s.run_start:
            fd = _sys.open(s.path, os.O_RDWR)
            try:
                _sys.ftruncate(fd, s.run_start)
            finally:
                _sys.close(fd)
    _sys.fsync_parents(touched)
    return _drop_journal(path, j, "finished")


def _restore(path: str, j: journal.Journal) -> Recovered:
    temp_fds: list[int | None] = []
    try:
        temp_fds.extend(_open_if_exists(o.temp) if o.temp else None for o in j.outputs)
        for s in j.sources:
            if s.adopted_to:
                _unadopt(path, s)
                continue
            if s.run_start >= s.size:
                continue  # only deleted at commit: never touched before it
            st = _same_file(s.path, s.dev, s.ino)
            if st is None:
                raise RecoverError(
                    f"{s.path}: the source is missing or is now another file; the journal "
                    f"{path} and its temps are kept so the bytes are not lost"
                )
            fd = _sys.open(s.path, os.O_RDWR)
            try:
                n = transfer.restore_source(
                    fd, s.as_move(), temp_fds, DEFAULT_WINDOW, transfer.Counters(), punch=True
                )
                if n or st.st_mtime_ns != s.mtime_ns:
                    _sys.futimens(fd, s.atime_ns, s.mtime_ns)
                    _sys.fsync(fd)
            except OSError as exc:
                raise RecoverError(f"{s.path}: could not put its bytes back: {exc}") from exc
            finally:
                _sys.close(fd)
    finally:
        for tfd in temp_fds:
            if tfd is not None:
                _sys.close(tfd)
    temps = [o.temp for o in j.outputs if o.temp]
    for temp in temps:
        _sys.unlink_missing_ok(temp)
    _sys.fsync_parents(temps)
    return _drop_journal(path, j, "restored")


def _unadopt(path: str, s: journal.JournalSource) -> None:
    """Put an adopted (renamed, not copied) source back under its own name."""
    if _same_file(s.path, s.dev, s.ino) is not None:
        return  # never renamed, or already back
    if _same_file(s.adopted_to, s.dev, s.ino) is None:
        raise RecoverError(
            f"{s.path}: the source is neither at its name nor at {s.adopted_to}; the journal "
            f"{path} is kept"
        )
    _sys.rename(s.adopted_to, s.path)
    _sys.fsync_parents([s.path, s.adopted_to])


def _drop_journal(path: str, j: journal.Journal, action: str) -> Recovered:
    """The last step: the journal goes only when everything it describes is settled."""
    _sys.unlink(path)
    return Recovered(path, action, tuple(o.final for o in j.outputs),
                     tuple(s.path for s in j.sources))


def _exists(path: str) -> bool:
    try:
        _sys.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _open_if_exists(path: str) -> int | None:
    try:
        return _sys.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
