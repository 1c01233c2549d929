"""Finish or undo interrupted saves, acting only on proof.

Theory of operation
-------------------
What recover may touch, and what a journal is trusted for, is ``decide``'s trust rule.  A
file argument must be named like a journal, regular, with a head ``journal.confine`` accepts
(else refused before a byte changes).  A directory's token-named files are grouped by token:
without a journal, the lock file is taken (``LOCK_NB``): held is a running save (skipped),
free names the journal it was made for (found and recovered, or never durable: the rest is
garbage, removed); files without a lock file or journal are refused.  Before acting, recover
takes the lock file of every directory the journal lists, each naming this journal.

Then the files are judged against the records that check (``assess``) and the table's row
acts (``decide``).  An output under its final name proves a ``committed`` step lost or
damaged (:data:`RENAMED`; damaged records: then only token files removed); without it,
damage is refused naming the files to check.  Every result is a row, judged from the files,
so recover is idempotent and may be interrupted and run again.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mod
from collections.abc import Sequence
from dataclasses import dataclass, field

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import assess, journal, liveness, transfer, undo
from filecord._txn import decide as table
from filecord._txn.decide import Found
from filecord._txn.stages import Stage
from filecord.errors import DataChangedError, RecoverError, add_note

log = logging.getLogger(__name__)

Action = table.Outcome  # the words of ``decide.OUTCOME``: one vocabulary
JOURNAL_LIMIT = 1 << 30  # a journal is a few bytes per piece; anything larger is not ours
FAILED = "recover failed after it began"  # a system call's error midway: files may be changed
BUSY = "its lock is held: its save is running, or another recover is at work on it"
ENDED = ("its journal was made and is gone with every file of the save but this lock file: "
         "the save had ended (completed or rolled back) before it could remove it; removed")
RENAMED = ("but its outputs were under their final names (renamed only after the committed "
           "step's fsync): finished from the files and the records that check, the parked "
           "sources judged by their size alone")


@dataclass(frozen=True, slots=True)
class Recovered:
    """One interrupted save handled.

    ``action``: "finished" (completed after its commit point), "restored" (rolled back: the
    sources whole again), "discarded" (nothing to undo: its temps or lock file removed),
    "skipped" (its lock is held) or "refused" (``detail`` says why; ``began`` where recover
    had begun to change files when a system call or a check stopped it: ``detail`` then
    begins with :data:`FAILED`).
    ``kept``: consumed sources another process changed after the commit point, kept (never
    deleted) under their own names or, when taken, their parked names; ``detail`` and
    ``notes`` say where.
    ``not_removed``: files a finished save was to remove (an index of consumed data files)
    that another process changed or replaced since: kept, never an error.
    """

    journal: str
    action: Action
    outputs: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    detail: str = ""
    notes: tuple[str, ...] = field(default=(), repr=False)
    kept: tuple[str, ...] = ()
    not_removed: tuple[str, ...] = ()
    began: bool = False  # refused only after recover began to change files (:data:`FAILED`)


def recover(path: str | os.PathLike[str]) -> list[Recovered]:
    """Recover the journal at ``path``, or every interrupted save in the directory ``path``.

    Returns what was done per save (an empty list when there is nothing to do).  Raises
    :class:`RecoverError` when ``path`` is a file that is not a journal, and, after handling
    everything else, when anything was refused or a finished save kept a changed source; its
    ``results`` attribute holds the list.
    """
    with _sys.pinned():  # the directories recover checks and acts in (see _io)
        return _recover(os.fspath(path))


def _recover(target: str) -> list[Recovered]:
    st = _sys.stat(target)  # a directory reached through a symlink is that directory
    where = ""  # a journal given is named once, by its result
    if stat_mod.S_ISDIR(st.st_mode):
        where = f" in {target}"
        real = _sys.realpath(target)
        _sys.pin([real])
        # Saves with a journal first, then a fresh scan for the rest: a rollback gives an
        # adopted file its name back, and that name may carry another, journal-less save's
        # token (a filecord.dcp temp committed by a save that died), whose clean-up must see it.
        groups = _scan(real)
        journaled = sorted(t for t, names in groups.items()
                           if any(s in names for s in _names.JOURNALS))
        results = [_recover_token(real, token, groups[token]) for token in journaled]
        results += [_recover_token(real, token, names)
                    for token, names in sorted(_scan(real).items()) if token not in journaled]
    else:
        results = [_recover_file(target)]
    done = [r for r in results if r is not None]
    failed = [r for r in done if r.began]
    refused = [r for r in done if r.action == "refused" and r not in failed]
    kept = [r for r in done if r.kept]
    if refused or failed or kept:
        err = RecoverError("; ".join(
            f"recover {what} {len(rs)} save(s){where}{but}: "
            + "; ".join(f"{r.journal}: {r.detail}" for r in rs)
            for what, but, rs in (("refused", "", refused), ("failed in", "", failed),
                                  ("finished", " but kept consumed sources changed after the "
                                   "commit point", kept)) if rs))
        for r in refused + failed + kept:
            for note in r.notes:
                add_note(err, note)
        err.results = done  # type: ignore[attr-defined]
        raise err
    return done


def _scan(directory: str) -> dict[str, dict[str, list[str]]]:
    found: dict[str, dict[str, list[str]]] = {}
    for name in _sys.listdir(directory):
        parsed = _names.parse(name)
        if parsed is not None:
            token, suffix = parsed
            found.setdefault(token, {}).setdefault(suffix, []).append(name)
    return found


def _decided(where: str, stage: Stage, found: Found, why: str,
             notes: Sequence[str] = ()) -> Recovered:  # skip or refuse: nothing done
    action = table.decide(table.Actor.RECOVER, stage, found)
    if action is table.Action.REFUSE:
        log.warning("recover refused %s: %s", where, why)
    return Recovered(where, table.OUTCOME[action], detail=why, notes=tuple(notes))


def _recover_file(path: str) -> Recovered | None:
    parsed = _names.parse(os.path.basename(path))
    if parsed is None or parsed[1] not in _names.JOURNALS:
        raise journal.NotAJournalError(
            f"{path} is not a filecord journal (journals are named "
            ".NAME.TOKEN.filecord-journal); nothing was touched"
        )
    # Named like a journal: a symlink or FIFO is refused as one (a row), not as a typo.
    real = os.path.join(_real_dir(path), os.path.basename(path))
    _sys.pin([os.path.dirname(real)])
    return _recover_journal(real, parsed[1], {})


def _recover_token(directory: str, token: str, names: dict[str, list[str]]) -> Recovered | None:
    journals = [(n, s) for s in _names.JOURNALS for n in names.get(s, [])]
    if len(journals) > 1:
        return _decided(os.path.join(directory, journals[0][0]), Stage.MOVING, Found.DAMAGED,
                        "several journals carry one token; nothing was touched")
    if journals:
        return _recover_journal(os.path.join(directory, journals[0][0]), journals[0][1], {})
    if _names.LOCK in names:
        return _recover_journal_less(directory, token, names)
    # A consuming save parks its sources beside them but keeps its lock and journal beside
    # its outputs: point there, the one place recover can act from.
    parked, first = names.get(_names.SOURCE), next(iter(names.values()))[0]
    return _decided(os.path.join(directory, parked[0] if parked else first), Stage.CREATED,
                    Found.UNPROVEN, f"a source parked by save {token}, with no lock file or "
                    "journal of that save here: if they are in the directory of its output "
                    f"(.OUTPUT.{token}{_names.JOURNAL}), run `filecord recover` there; if that "
                    "save finished and kept this file (another process changed it after the "
                    "commit point, as the save warned), it holds that process's bytes: move "
                    "it back to its name or delete it; nothing was touched" if parked else
                    "files of an interrupted save without its lock file: cannot prove the "
                    "save is over or that no journal needs them; nothing was touched")


def _recover_journal_less(directory: str, token: str,
                          names: dict[str, list[str]]) -> Recovered | None:
    """Its lock file says whether a journal was made (and where), else the rest is garbage."""
    others = [n for s, ns in names.items() if s != _names.LOCK for n in ns]
    lock = _sys.abspath(os.path.join(directory, names[_names.LOCK][0]))
    fd = _acquire(lock)
    if isinstance(fd, tuple):
        return _decided(lock, Stage.CREATED, *fd)
    if fd is None:
        return None  # removed by whoever held it a moment ago
    try:
        said = _read_pointer(fd, token)
        if said.journal is not None and _sys.lexists(said.journal):
            return _recover_journal(said.journal, _names.JOURNAL, {_real_dir(lock): (lock, fd)})
    except BaseException:
        _sys.close_each([fd])
        raise
    refusals = (  # the first that holds; a lock made "journaled" whose journal is gone was
        # removed by someone, and its temps may hold bytes moved out of a source
        (said.journal is None and others, Found.DAMAGED,
         f"{said.damage or 'its lock file is damaged'} and other files remain"),
        (names.get(_names.SOURCE), Found.UNPROVEN, "parked sources without a journal"),
        (said.journaled and others, Found.UNPROVEN, f"its journal {said.journal} was made and "
         "is gone, and its temps may hold moved bytes"),
    )
    refused = next(((found, why) for hit, found, why in refusals if hit), None)
    if refused is not None:
        _sys.close(fd)
        return _decided(lock, Stage.CREATED, refused[0], f"{refused[1]}; nothing was touched")
    action = table.decide(table.Actor.RECOVER, Stage.CREATED, Found.AS_LEFT)  # DISCARD
    garbage = [os.path.join(directory, n) for n in others]
    for p in garbage:
        _sys.unlink_missing_ok(p)
    _sys.fsync_parents([lock])
    liveness.release(lock, fd)
    return Recovered(lock, table.OUTCOME[action], detail=ENDED if said.journaled else
                     f"it died before its journal: removed {len(garbage)} temp file(s)")


_LOCK_LIMIT = 1 << 16  # bytes of a lock file read: two short records, far below this


def _acquire(lock: str) -> int | tuple[Found, str] | None:
    """:func:`liveness.acquire`, a lock held or not a lock file said as what it proves."""
    try:
        return liveness.acquire(lock)
    except liveness.LockBusyError:
        return Found.BUSY, BUSY
    except liveness.NotALockFileError as exc:  # its strerror names it
        return Found.DAMAGED, f"{exc.strerror}; nothing was touched"


def _read_pointer(fd: int, token: str) -> liveness.Pointer:
    size = min(_sys.fstat(fd).st_size, _LOCK_LIMIT)
    return liveness.read_pointer(_sys.read_all(fd, 0, size), token)


def _real_dir(path: str) -> str:
    return _sys.realpath(os.path.dirname(_sys.abspath(path)))


def _read(path: str) -> tuple[bytes, os.stat_result]:  # a journal's bytes, the file read
    fd = liveness.open_regular(path, sole=True)  # recover appends to it: refused before then
    try:
        st = _sys.fstat(fd)
        if st.st_size > JOURNAL_LIMIT:
            raise journal.NotAJournalError(f"{path} is {st.st_size} bytes: not a filecord journal")
        return _sys.read_all(fd, 0, st.st_size), st
    finally:
        _sys.close(fd)


def _lock_all(j: journal.Journal, locks: dict[str, tuple[str, int]], pointer: str
              ) -> tuple[Found, str] | None:
    """Take the lock file of every directory of the save into ``locks``; what proves nothing
    (None: all do).  One missing is UNPROVEN (the save removes each after its journal), one
    naming another journal, or one held in a directory it does not list, FOREIGN."""
    strays = [d for d in locks if d not in j.locks()]
    if strays:
        return Found.FOREIGN, f"a lock file in {strays[0]} names this journal, but the journal " \
            "does not list that directory; nothing was touched"
    for directory, path in j.locks().items():
        if directory in locks:
            continue
        fd = _acquire(path)
        if fd is None or isinstance(fd, tuple):
            return fd or (Found.UNPROVEN, f"its lock file {path} is missing, so nothing proves "
                          "the save is over; nothing was touched")
        locks[directory] = (path, fd)
        said = _read_pointer(fd, j.token)
        if said.damage is not None:
            return Found.DAMAGED, f"{said.damage}: {path}; nothing was touched"
        if said.journal is None:  # emptied or zeroed: a lock file is linked whole
            return Found.DAMAGED, f"its lock file {path} is damaged (it names no journal: " \
                "emptied or zeroed after it was written); nothing was touched"
        if said.journal != pointer:
            return Found.FOREIGN, f"the lock file {path} belongs to another journal: this one " \
                "reaches beyond its save; nothing was touched"
    return None


def _recover_journal(path: str, suffix: str, held: dict[str, tuple[str, int]]) -> Recovered | None:
    """Recover the save whose journal is ``path`` (None: gone while we looked).  Every lock
    taken or ``held`` is removed once the save is over, else only closed."""
    locks, result = dict(held), None
    try:
        result = _judge(path, suffix, locks)
    finally:  # a raise leaves result None: every lock only closed
        for lock, fd in locks.values():
            if result is not None and result.action in ("finished", "restored", "discarded"):
                liveness.release(lock, fd)
            else:
                _sys.close_each([fd])
    return result


def _judge(path: str, suffix: str, locks: dict[str, tuple[str, int]]) -> Recovered | None:
    """:func:`_recover_journal`'s body, taking lock files into ``locks``."""
    try:
        if suffix in _names.OLD_JOURNALS:  # version 3 named its stages
            raise journal.JournalVersionError(
                f"named {suffix}: a journal of version 3 (its stage in its name), written "
                "by an older filecord; recover it with the filecord that wrote it")
        raw, seen = _read(path)
        log_ = journal.read_log(raw, intact_prefix=True)
        journal.confine(log_.journal, path)
        j = log_.journal  # confined: now its directories are pinned
        _sys.pin(os.path.dirname(f) for f in [*(o.final for o in j.outputs),
                                              *(s.path for s in j.sources),
                                              *(r.path for r in j.removals)])
    except FileNotFoundError:
        return None  # removed since the scan: its save (or another recover) ended it
    except OSError as exc:  # refused: a symlink or FIFO, or a record that does not check, is
        # damaged; a version not this one's or a path beyond the save, foreign
        odd = isinstance(exc, liveness.NotALockFileError)
        found = (Found.DAMAGED if odd or isinstance(exc, journal.JournalDamagedError)
                 else Found.FOREIGN if isinstance(exc, RecoverError) else Found.UNREADABLE)
        return _decided(path, Stage.MOVING, found,
                        f"{exc.strerror if odd else exc}; nothing was touched")
    refused = _lock_all(j, locks, path)
    if refused is None:
        return _act(path, log_)
    # A save removes its journal before its lock files: a lock gone with the journal too is a
    # save that ended after the scan.
    if refused[0] is Found.UNPROVEN and undo.same_file(path, seen.st_dev, seen.st_ino) is None:
        return None
    return _decided(path, log_.stage, *refused)


def _act(path: str, log_: journal.Log) -> Recovered:
    j = log_.journal
    stage, found, torn_why = _assess(log_)
    action = table.decide(table.Actor.RECOVER, stage, found.found)
    if action is table.Action.REFUSE:  # records missing: not where the bytes are, where to look
        return _decided(path, stage, found.found, found.why, [
            "the files to check: " + ", ".join([path, *assess.token_files(j),
                                                *(s.path for s in j.sources)])]
            if log_.damage is not None else [*([f"the files: {torn_why}"] if torn_why else []),
                                             *_where(log_, acted=stage is Stage.ROLLING_BACK)])
    try:
        if action is table.Action.FINISH:
            return _finish(path, log_, action, lost=log_.stage is not stage)
        return _roll_back(path, log_, stage, action)
    except (RecoverError, DataChangedError, OSError) as exc:
        # Every refusal was decided above, before the first change: what stops the act now (a
        # check meeting a file put there meanwhile, a system call's error) may come after
        # files were changed, so it is never said as a refusal.
        log.warning("recover failed %s after it began: %s", path, exc)
        again = "" if isinstance(exc, (RecoverError, DataChangedError)) else ": run it again"
        return Recovered(path, table.OUTCOME[table.Action.REFUSE], detail=f"{FAILED}: {exc}; "
                         f"the journal and temps are kept{again}", notes=tuple(_where(log_)),
                         began=True)


def _where(log_: journal.Log, *, acted: bool = True) -> list[str]:
    """Where every byte is, looked at afresh: what the moves left, unless a rollback (which
    grows sources back) has begun or recover ``acted``."""
    j = log_.journal
    return assess.whereabouts(j, assess.observe(j, rebuilt=log_.rebuilt), None,
                              0 if acted else log_.moved, log_.inserted,
                              held=log_.stage is Stage.HELD, cuts=None if acted else log_.cuts)


def _assess(log_: journal.Log) -> tuple[Stage, assess.Assessment, str | None]:
    """The stage and what the files say, from the records that check.  An output under its
    final name proves the commit point passed (renamed only after the ``committed`` step's
    fsync): COMMITTED, lost step or not, unless whole records disprove it (the ``committed``
    step follows every ``moved`` and ``inserted`` step: without one, a temp renamed by hand).
    A torn last record with files the whole records do not account for is DAMAGED, never
    another process; the third value says what they showed."""
    j, stage = log_.journal, log_.stage
    seen = assess.observe(j, recover=True, rebuilt=log_.rebuilt)
    lost = stage is Stage.MOVING and assess.renamed(j, seen) and (log_.damage is not None or (
        log_.moved == len(j.moved()) and all((s.dev, s.ino) in log_.inserted
                                             for s in j.sources if s.adopt and s.inserted)))
    stage = Stage.COMMITTED if lost else stage
    if log_.damage is not None and stage is not Stage.COMMITTED:  # nothing proves the rest
        return stage, assess.damaged(journal.JournalDamagedError(log_.damage)), None
    records = assess.Records(table.Actor.RECOVER, stage, log_.moved, log_.inserted,
                             log_.cuts)
    found = assess.assess(j, records, seen)
    if (log_.torn or lost) and found.found is not Found.DAMAGED and table.decide(
            table.Actor.RECOVER, stage, found.found) is table.Action.REFUSE:
        return stage, assess.damaged(journal.JournalDamagedError(log_.damage or (
            "the journal is damaged: its last record does not check out and the files are "
            "not as the records before it leave them"))), found.why
    return stage, found, None


def _finish(path: str, log_: journal.Log, action: table.Action, *, lost: bool) -> Recovered:
    j = log_.journal
    outputs, sources = tuple(o.final for o in j.outputs), tuple(s.path for s in j.sources)
    left, kept = undo.finish(j, path, log_.looked, removals=log_.damage is None)
    _sys.unlink(path)
    detail = [str(kept)] if kept is not None else []  # the changed source: the notes say where
    if log_.damage is not None or lost:
        detail.append(f"{log_.damage or 'its committed step is damaged or lost'}, {RENAMED}"
                      + (", only files carrying the save's token removed" if log_.damage else ""))
    if left:
        detail.append("kept, as no longer the file the save recorded (or not in a directory "
                      "the save's lock or parked files prove its own): " + ", ".join(left))
    if left or kept is not None:
        log.warning("recover finished %s: %s", path, "; ".join(detail))
    return Recovered(path, table.OUTCOME[action], outputs, sources, detail="; ".join(detail),
                     notes=tuple(getattr(kept, "__notes__", ())),
                     kept=tuple(getattr(kept, "kept", ())), not_removed=left)


def _roll_back(path: str, log_: journal.Log, stage: Stage, action: table.Action) -> Recovered:
    j = log_.journal
    log = liveness.Appender(path, log_.end, torn=log_.torn)
    if stage is Stage.MOVING:  # ROLL_BACK from journaled or moving: first the log says so
        log(journal.step(Stage.ROLLING_BACK))
    undo.roll_back(j, transfer.Counters(), log_.inserted, log_.rebuilt, log)
    temps = [j.temp(o) for o, out in enumerate(j.outputs) if not out.direct]
    for temp in temps:
        _sys.unlink_missing_ok(temp)
    _sys.fsync_parents(temps)
    # The claim "temps removed" is checked against the directories, not the journal.
    left = assess.token_files(j)
    if left:
        raise RecoverError(f"the sources are restored, but {', '.join(left)} still "
                           "carr(ies) this save's token")
    _sys.unlink(path)
    return Recovered(path, table.OUTCOME[action], tuple(o.final for o in j.outputs),
                     tuple(s.path for s in j.sources))
