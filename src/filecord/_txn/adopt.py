"""Adoption: a consumed source becomes its output's file where it lies, no byte copied.

Theory of operation
-------------------
The plan decides, once, which sources are adopted (``MoveSource.adopt``): a source that is
the whole of one output is renamed onto it (*whole*); with ``in_place`` (the save's option,
on by default) a source used once, whole, at a block-aligned offset of an output on a file
system whose probe inserts ranges, on the output's mount, is the output's file with the space
in front of it inserted (*in place*).  Every reason a source is not adopted (another hard
link, another file system or mount, a layout that is not whole and aligned, a file system
that inserts no range, ``in_place=False``) is the plan's, with its reason in the report;
nothing here re-decides it.  What this module finds is only what another process did during
the save, and that is a ``DataChangedError`` that holds the journal.

The steps, each logged (``log.debug``) and each with its undo (``undo._put_back``: the temp's
size says which step it reached):

1. *claim*: the file, still as the preflight saw it, is renamed onto the output's temp (the
   empty temp claimed the name, ``O_EXCL``, and the journal names both paths), both
   directories fsynced, and reopened there; it must still have one link (another name would
   see the output's bytes in place of the source's).
2. *insert* (in place, offset ``src.inserted`` not 0): that many bytes are inserted in front of
   its blocks (``insert_range``) and fsynced; the blocks the source's range lies on are noted
   (``looks.blocks``) and the insert is recorded by a journal step before a byte is written
   into the space (the size alone cannot tell an insert from another writer's append).
3. *fill around*: the rest of the output is written (``fill.fill_output``), and the temp gets
   its final length (a hole) when moved bytes of other sources follow.
4. *at the commit* (``check_at_commit``): still one link; a file adopted whole still at its
   size and mtime; one written around still on the blocks noted in step 2 and at the
   output's length.  Then, past the commit point, the replaced file's owner and mode
   (``take_owner_modes``).
"""

from __future__ import annotations

import logging
import os

from filecord._io import syscalls as _sys
from filecord._plan.types import MoveSource
from filecord._txn import begin, fill, journal, looks, undo
from filecord._txn.state import Placed, Txn
from filecord.errors import ChangeKind, DataChangedError, SaveError

log = logging.getLogger(__name__)


def adopt(txn: Txn, m: MoveSource, src: journal.JournalSource) -> None:
    """Make the source ``m`` its output's file (the steps of the module's docstring)."""
    o = m.dests[0].output
    fd = _claim(txn, m, src)
    where = _insert(txn, m, src, fd) if src.inserted or (
        txn.prep.plan.outputs[o].length > m.size) else None
    if where is not None:
        txn.adopted_blocks[o] = (src.inserted, m.size, where)
    fill.fill_output(txn, o)
    log.debug("adopt %s: the rest of %s written around it", m.path, txn.temps[o])
    # Moved bytes of other sources follow: the temp gets its final length (a hole) first.
    # Only then: a file adopted whole, cut by someone else meanwhile, is never padded back.
    if o in txn.prep.plan.receiving:
        length = txn.prep.plan.outputs[o].length
        if _sys.fstat(fd).st_size < length:
            _sys.ftruncate(fd, length)


def _claim(txn: Txn, m: MoveSource, src: journal.JournalSource) -> int:
    """Step 1: rename the source onto its output's temp; its descriptor there."""
    o = m.dests[0].output
    temp = txn.temps[o]
    if temp is None:  # pragma: no cover - the plan adopts only into temps
        raise SaveError(f"{m.path}: no temp to adopt into")
    data = txn.prep.datas[m.key][0]
    st = undo.same_file(data.path, *m.key)
    if st is None or (st.st_size, st.st_mtime_ns) != (m.size, data.identity.mtime_ns):
        raise DataChangedError(data.path, expected_size=m.size,
                               found_size=None if st is None else st.st_size,
                               reason="another process changed or replaced it before it was "
                               "adopted",
                               kind=ChangeKind.REPLACED if st is None else ChangeKind.CONTENT)
    _sys.rename(data.path, temp)
    txn.counters.fsyncs += _sys.fsync_parents([temp, src.path])
    log.debug("adopt %s: renamed onto %s", m.path, temp)
    old = txn.fds[o]
    txn.fds[o] = None
    if old is not None:
        _sys.close(old)  # the empty temp's inode, replaced by the rename
        txn.dirty.discard(old)
    fd = _sys.open(temp, os.O_RDWR)
    txn.fds[o] = fd
    txn.dirty.add(fd)  # whoever wrote the source may never have synced it
    now = _sys.fstat(fd)  # the file as adopted: a cut or write since the look above would
    if (now.st_size, now.st_mtime_ns) != (m.size, data.identity.mtime_ns):  # be built on
        raise DataChangedError(temp, expected_size=m.size, found_size=now.st_size,
                               reason="another process changed it as it was adopted")
    refuse_linked(now, m.path)
    return fd


def _insert(txn: Txn, m: MoveSource, src: journal.JournalSource, fd: int) -> Placed | None:
    """Step 2: the space in front of the source, durable and recorded; where its bytes lie
    (None where the file system does not say)."""
    if src.inserted:
        _sys.insert_range(fd, 0, src.inserted)
    # Written around: size and times cannot tell another process's cut from the save's own
    # writes, the blocks can; fsynced first so they are placed.
    txn.counters.fsync(fd)
    where = looks.blocks(fd, src.inserted, m.size)
    now = _sys.fstat(fd)  # a write or cut since the look above (before the blocks')
    if now.st_size != m.size + src.inserted:
        raise DataChangedError(txn.temps[m.dests[0].output] or m.path,
                               expected_size=m.size + src.inserted, found_size=now.st_size,
                               reason="another process wrote to or cut it as it was adopted")
    if src.inserted:
        begin.append_step(txn, journal.encode_inserted(txn.moves_done, m.key))
        txn.inserted.add(m.key)
        log.debug("adopt %s: %d bytes inserted in front of it, recorded", m.path, src.inserted)
    return where


def refuse_linked(st: os.stat_result, path: str) -> None:
    """An adopted file is the output's inode: another name linked to it meanwhile would see
    the output's bytes in place of the source's (a moved source is checked after each cut,
    ``transfer.move_source``).  Nothing is lost: the rollback gives that inode its bytes back."""
    if st.st_nlink != 1:
        raise DataChangedError(path, expected_size=st.st_size, found_size=st.st_size,
                               reason="another name was linked to it while it was adopted",
                               kind=ChangeKind.LINKED)


def check_at_commit(txn: Txn, o: int, st: os.stat_result) -> None:
    """Step 4: output ``o``'s adopted file is as the save left it.  Someone else's write to it
    is a change, not an I/O error: the journal is held and nothing is claimed."""
    p = txn.prep.plan
    key = p.adopted[o]
    path, length = p.outputs[o].path, p.outputs[o].length
    refuse_linked(st, path)
    was = txn.prep.datas[key][0].identity
    # (only a file adopted whole: one adopted in place was written around by the save)
    if was.size == length and (st.st_size, st.st_mtime_ns) != (was.size, was.mtime_ns):
        raise DataChangedError(path, expected_size=was.size, found_size=st.st_size,
                               reason="another process changed the adopted file before the "
                               "commit")
    placed = txn.adopted_blocks.get(o)
    fd = txn.fds[o]
    if placed is not None and fd is not None and looks.blocks(fd, placed[0],
                                                              placed[1]) != placed[2]:
        # Size and times are as the save left them: only this says the source's bytes are
        # gone, so the failure holds (never puts the cut file back as the source).
        txn.changed = key
        raise DataChangedError(path, expected_size=length, found_size=st.st_size,
                               reason="another process cut or rewrote the adopted file "
                               "during the save: its bytes are not on the blocks adopted")
    if st.st_size != length:  # the save sized it: another writer did not
        raise DataChangedError(path, expected_size=length, found_size=st.st_size,
                               reason="another process wrote to the adopted file during the "
                               "save")


def take_owner_modes(txn: Txn, record: journal.Journal) -> None:
    """Past the commit point: each adopted file takes the replaced file's owner and mode."""
    for o in txn.prep.plan.adopted:
        jout = record.outputs[o]
        undo.apply_owner_mode_at(record.temp(o), jout.dev, jout.ino, jout.mode, jout.uid,
                                 jout.gid)
