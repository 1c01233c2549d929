"""Stages CREATED (lock files), JOURNALED and MOVING (parking): the proof a crash is undone by.

Theory of operation
-------------------
1. Before any temp, a lock file per directory (``liveness``), its ``created`` step naming the
   journal durable: a temp's name implies its lock and that step.
2. The head (``journal``), fsynced under its pending name with every directory of the save,
   renamed, its directory fsynced; later steps appended through its open descriptor.  Each
   lock file then gets a durable ``journaled`` step: a journal missing later was removed.
3. Every source the save will shorten or delete is renamed to ``.NAME.TOKEN.filecord-src``,
   the directories fsynced, before anything is cut: a crash leaves each source at one of its
   two names, both known to ``recover``.
"""

from __future__ import annotations

import os

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path
from filecord._plan.facts import unless_unsupported
from filecord._txn import journal, liveness, transfer, undo
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import ChangeKind, DataChangedError, SaveError


def journal_name(txn: Txn, suffix: str) -> str:
    first = next(o for o in txn.prep.plan.outputs if not o.direct)
    return _names.sibling(first.target, txn.token, suffix)


def lock_directories(txn: Txn) -> None:
    outs = [o.target for o in txn.prep.plan.outputs if not o.direct]
    if not outs:
        return
    content = liveness.pointer_record(journal_name(txn, _names.JOURNAL))
    for path in journal.lock_files(outs, txn.token).values():
        try:
            fd = liveness.create(path, content)
        except liveness.LockBusyError as exc:
            raise SaveError(f"{path}: {exc.strerror}; nothing was written, retry the save",
                            errno=exc.errno) from exc
        txn.locks.append((path, fd))


def _dense(path: str, st: os.stat_result) -> bool:
    """Whether every byte of the source is written data: no hole, no preallocated block (XFS
    and btrfs copy none of those, so a rollback would find holes and refuse for good).  FIEMAP
    decides (``SEEK_HOLE`` calls XFS's cached unwritten blocks data); without it (tmpfs),
    ``SEEK_HOLE``; without both, dense."""
    if st.st_blocks * 512 < st.st_size:
        return False
    fd = _sys.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        now = _sys.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False  # replaced meanwhile: the weaker claim, the checks at rollback decide
        extents = unless_unsupported(lambda: _sys.extents(fd, 0, st.st_size))
        if extents is not None:
            pos = 0
            for lo, n, flags, _at in sorted(extents):
                if lo > pos or flags & _sys.FIEMAP_EXTENT_UNWRITTEN:
                    return False
                pos = max(pos, lo + n)
            return pos >= st.st_size
        hole = transfer.first_hole(fd, 0)
        return hole is None or hole >= st.st_size
    finally:
        _sys.close(fd)


def _record(txn: Txn) -> journal.Journal:
    p = txn.prep.plan
    moves = {m.key: m for m in p.moves}
    sources = []
    # In the order the moves run, then the sources only deleted at commit (recover checks it).
    for key in [*moves, *sorted(set(p.consumed) - set(moves))]:
        data = txn.prep.facts.datas[key][0]
        st = _sys.stat(data.path)
        m = moves.get(key)
        sources.append(journal.JournalSource(
            path=kernel_path(data.path), dev=key[0], ino=key[1],
            size=st.st_size, run_start=m.run_start if m else st.st_size,
            atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns, mode=st.st_mode,
            dests=m.dests if m else (), adopt=bool(m and m.adopt),
            dense=_dense(data.path, st),
        ))
    outputs = []
    for o, (out, fd, tst) in enumerate(
        zip(p.outputs, txn.fds, txn.prep.facts.target_stats, strict=True)
    ):
        if out.direct or fd is None:
            outputs.append(journal.JournalOutput(out.target, 0, 0, out.length, direct=True))
            continue
        mine = _sys.fstat(fd)
        dev, ino = p.adopted.get(o, (mine.st_dev, mine.st_ino))
        mode, uid, gid = (-1, -1, -1) if tst is None else (tst.st_mode, tst.st_uid, tst.st_gid)
        if o in p.adopted and tst is None:
            mode = mine.st_mode  # the empty temp's: what open() gives a new file here
        old = (0, 0) if tst is None else (tst.st_dev, tst.st_ino)
        outputs.append(journal.JournalOutput(out.target, dev, ino, out.length, mode, uid, gid,
                                             old_dev=old[0], old_ino=old[1],
                                             discard=out.discard))
    return journal.Journal(txn.token, p.window, tuple(outputs), tuple(sources),
                           removals=txn.removals)


def write_journal(txn: Txn) -> journal.Journal:
    record = _record(txn)
    pending, final = journal_name(txn, _names.PENDING), journal_name(txn, _names.JOURNAL)
    head = journal.encode(record)  # once: a head of 100,000 moved ranges is megabytes
    fd = _sys.open(pending, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _sys.write_all(fd, head, 0)
        txn.counters.fsync(fd)
        # Every name the rollback needs (temps, lock files) durable before the journal's.
        txn.counters.fsyncs += _sys.fsync_parents([pending, *filter(None, txn.temps)])
        _sys.rename(pending, final)
    except BaseException:
        _sys.close_each([fd])
        raise
    # kept open: the later steps are appended through it
    txn.log = liveness.Appender(final, len(head), fd=fd, fsync=txn.counters.fsync)
    txn.record = record
    txn.to(Stage.JOURNALED)  # the rename is the transition; a failed fsync below rolls back
    txn.counters.fsyncs += _sys.fsync_parents([final])
    created = len(liveness.pointer_record(final))
    for path, lock_fd in txn.locks:  # a journal missing from now on was removed
        liveness.Appender(path, created, fd=lock_fd)(journal.step(Stage.JOURNALED))
    return record


def park_sources(txn: Txn, record: journal.Journal) -> None:
    """Step 3, each source given its first look there (``looks``)."""
    parked: list[str] = []
    for s in record.sources:
        if s.adopt:
            continue
        txn.to(Stage.MOVING)
        key, data = (s.dev, s.ino), txn.prep.facts.datas[(s.dev, s.ino)][0]
        was = data.identity
        if undo.same_file(data.path, *key) is None:
            data.check()
            raise SaveError(f"{data.path} was replaced during the save")
        parked.append(record.parked(s))
        _sys.rename(data.path, parked[-1])
        st = undo.same_file(parked[-1], *key)
        if st is None or (st.st_size, st.st_mtime_ns) != (was.size, was.mtime_ns):
            txn.changed = key
            raise DataChangedError(parked[-1], expected_size=was.size,
                                   found_size=None if st is None else st.st_size,
                                   reason="another process changed it as it was parked",
                                   kind=ChangeKind.REPLACED if st is None else
                                   ChangeKind.CONTENT)
        txn.looks[key] = transfer.Look(transfer.Facts.of(st))
    txn.counters.fsyncs += _sys.fsync_parents(parked)


def append_step(txn: Txn, record: bytes, stage: Stage | None = None) -> None:
    """One durable step before the action it licenses; ``stage`` is entered once its fsync
    returns.  A step whose write or fsync failed is not taken (``liveness.Appender``): until
    the next cuts it off a crash may keep it, but the files are as it says (every step
    precedes its action)."""
    txn.journaled()[1](record)
    if stage is not None:
        txn.to(stage)
