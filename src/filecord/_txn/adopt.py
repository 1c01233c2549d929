"""Adoption: a consumed source becomes its output's file where it lies, no byte copied.

Theory of operation
-------------------
The plan decides, once and with its reasons, which sources are adopted (``MoveSource.adopt``):
*whole* (the whole of one output) or *in place* (the ``in_place`` option: used once, whole, at a
block-aligned offset, on a file system that inserts ranges).  What this module finds is only
another process's doing, a ``DataChangedError`` that holds the journal.  Each step is logged
and undone by ``undo._put_back`` (the temp's size says which step it reached):

1. *claim*: the file, as the preflight saw it, renamed onto the output's (empty, journaled)
   temp, both directories fsynced, reopened there with one link.
2. *insert* (in place): ``src.inserted`` bytes inserted in front and fsynced, the source's
   blocks noted (``looks.blocks``), a journal step before a byte is written there (its size
   alone cannot tell the insert from another writer's append).
3. *fill around*: the rest of the output (``fill.fill_output``).
4. *at the commit* (``check_at_commit``): one link; adopted whole, its size and mtime; in
   place, the blocks of step 2 and the output's length.  Past the commit point, the replaced
   file's owner and mode (``take_owner_modes``).
"""

from __future__ import annotations

import logging
import os

from filecord._io import syscalls as _sys
from filecord._plan.types import MoveSource
from filecord._txn import begin, fill, journal, looks, undo
from filecord._txn.stages import Stage
from filecord._txn.state import Txn
from filecord.errors import ChangeKind, DataChangedError

log = logging.getLogger(__name__)


def adopt(txn: Txn, m: MoveSource, src: journal.JournalSource) -> None:
    o = m.dests[0].output
    fd = _claim(txn, m, src)
    if src.inserted or txn.prep.plan.outputs[o].length > m.size:
        _insert(txn, m, src, fd)
    fill.fill_output(txn, o)
    log.debug("adopt %s: the rest of %s written around it", m.path, txn.temps[o])
    # Moved bytes follow: presized only now, so a file adopted whole and cut by someone else
    # meanwhile is never padded back.
    if o in txn.prep.plan.receiving:
        fill.presize(txn, o)


def _claim(txn: Txn, m: MoveSource, src: journal.JournalSource) -> int:
    """Step 1; the descriptor there."""
    o = m.dests[0].output
    temp = txn.journaled()[0].temp(o)
    data = txn.prep.facts.datas[m.key][0]
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
    old, txn.fds[o] = txn.fds[o], None
    if old is not None:
        _sys.close(old)  # the empty temp's inode, replaced by the rename
        txn.dirty.discard(old)
    fd = _sys.open(temp, os.O_RDWR)
    txn.fds[o] = fd
    txn.dirty.add(fd)  # whoever wrote the source may never have synced it
    now = _sys.fstat(fd)  # a cut or write since the look above would be built on
    if (now.st_size, now.st_mtime_ns) != (m.size, data.identity.mtime_ns):
        raise DataChangedError(temp, expected_size=m.size, found_size=now.st_size,
                               reason="another process changed it as it was adopted")
    refuse_linked(now, m.path)
    return fd


def _insert(txn: Txn, m: MoveSource, src: journal.JournalSource, fd: int) -> None:
    """Step 2, noting where the source's bytes lie (where the file system says)."""
    if src.inserted:
        _sys.insert_range(fd, 0, src.inserted)
    # Size and times cannot tell another's cut from the save's writes around it, the blocks
    # can: fsynced first so they are placed.
    txn.counters.fsync(fd)
    where = looks.blocks(fd, src.inserted, m.size)
    now = _sys.fstat(fd)  # a write or cut since the look above (before the blocks')
    if now.st_size != m.size + src.inserted:
        raise DataChangedError(txn.journaled()[0].temp(m.dests[0].output),
                               expected_size=m.size + src.inserted, found_size=now.st_size,
                               reason="another process wrote to or cut it as it was adopted")
    if src.inserted:
        begin.append_step(txn, journal.step(Stage.MOVING, moved=txn.moves_done,
                                            inserted=list(m.key)))
        txn.inserted.add(m.key)
        log.debug("adopt %s: %d bytes inserted in front of it, recorded", m.path, src.inserted)
    if where is not None:
        txn.adopted_blocks[m.dests[0].output] = (src.inserted, m.size, where)


def refuse_linked(st: os.stat_result, path: str) -> None:
    """Another name linked to the adopted file would see the output's bytes in place of the
    source's (the rollback gives that inode its bytes back)."""
    if st.st_nlink != 1:
        raise DataChangedError(path, expected_size=st.st_size, found_size=st.st_size,
                               reason="another name was linked to it while it was adopted",
                               kind=ChangeKind.LINKED)


def check_at_commit(txn: Txn, o: int, fd: int, st: os.stat_result) -> None:
    """Step 4: output ``o``'s adopted file is as the save left it, else a change (held)."""
    p = txn.prep.plan
    key = p.adopted[o]
    path, length = p.outputs[o].path, p.outputs[o].length
    refuse_linked(st, path)
    was = txn.prep.facts.datas[key][0].identity
    # (only a file adopted whole: one adopted in place was written around by the save)
    if was.size == length and (st.st_size, st.st_mtime_ns) != (was.size, was.mtime_ns):
        raise DataChangedError(path, expected_size=was.size, found_size=st.st_size,
                               reason="another process changed the adopted file before the "
                               "commit")
    placed = txn.adopted_blocks.get(o)
    if placed is not None and looks.blocks(fd, placed[0], placed[1]) != placed[2]:
        # Only the blocks say the source's bytes are gone: held, never put back as the source.
        txn.changed = key
        raise DataChangedError(path, expected_size=length, found_size=st.st_size,
                               reason="another process cut or rewrote the adopted file "
                               "during the save: its bytes are not on the blocks adopted")
    if st.st_size != length:
        raise DataChangedError(path, expected_size=length, found_size=st.st_size,
                               reason="another process wrote to the adopted file during the "
                               "save")


def take_owner_modes(txn: Txn, record: journal.Journal) -> None:
    for o in txn.prep.plan.adopted:
        jout = record.outputs[o]
        undo.apply_owner_mode_at(record.temp(o), jout.dev, jout.ino, jout.mode, jout.uid, jout.gid)
