"""The save's last look at each consumed source: the commit deletes, and the rollback puts
back into, only a file still as last seen.

Theory of operation
-------------------
The inode alone proves nothing about a write by a process that had the file open, so per
source the save keeps its last look (``Txn.looks``: size, mtime, ctime), taken as it is parked
(``begin.park_sources``) and after each truncate (``transfer.move_source``, with the size a
truncate in flight leaves), and compares it just before the ``committed`` step (:func:`check`:
a difference is a ``DataChangedError``, the journal held) and in the rollback's assessment.
Size and mtime go into that step: the save and recover's finish unlink only a parked source
still as they say (``undo.unlink_parked``: a changed one is kept, and the committed save
raises once the rest is done).

An adopted file the save writes around is its output's inode, so size and times cannot tell
another process's cut from the save's writes: once its blocks are durable the save records
where its range lies on the device (:func:`placed`, FIEMAP) and the commit requires the same;
where FIEMAP is refused there is no check.  A write through a descriptor kept open past the
unlink is lost by any tool that deletes a file (guarantees.md, "What cannot be seen").
"""

from __future__ import annotations

from filecord._io import syscalls as _sys
from filecord._plan.facts import unless_unsupported
from filecord._txn import assess, undo
from filecord._txn.journal import Journal
from filecord._txn.state import Placed, Txn
from filecord._txn.transfer import Facts


def check(txn: Txn, record: Journal) -> dict[tuple[int, int], tuple[int, int]]:
    """Every parked source as last seen, just before the commit point: the looks (size,
    mtime) for the ``committed`` step and the unlinks after it (``undo.unlink_parked``)."""
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for s in record.sources:
        key = (s.dev, s.ino)
        st = undo.same_file(record.parked(s), *key) if key in txn.looks else None
        if st is None:  # never looked at (adopted), or gone
            continue
        err = assess.changed_since(
            record.parked(s), Facts.of(st), txn.looks[key],
            "another process changed it after the save's last look, before the commit")
        if err is not None:
            txn.changed = key
            raise err
        seen[key] = (st.st_size, st.st_mtime_ns)
    return seen


_UNPLACED = _sys.FIEMAP_EXTENT_UNKNOWN | _sys.FIEMAP_EXTENT_DELALLOC


def placed(extents: list[_sys.Extent], start: int, size: int) -> Placed | None:
    """Where the bytes ``[start, start + size)`` lie on the device: the extents clipped to the
    range and merged where they continue each other (file systems report one stretch split
    or joined as they like); None when an extent has no device offset yet."""
    out: list[tuple[int, int, int]] = []
    end = start + size
    for e in sorted(extents):
        lo, hi = max(e.logical, start), min(e.logical + e.length, end)
        if hi <= lo:
            continue
        if e.flags & _UNPLACED:
            return None
        at, phys, n = lo - start, e.physical + (lo - e.logical), hi - lo
        if out and out[-1][0] + out[-1][2] == at and out[-1][1] + out[-1][2] == phys:
            at, phys, n = out[-1][0], out[-1][1], out[-1][2] + n
            out.pop()
        out.append((at, phys, n))
    return tuple(out)


def blocks(fd: int, start: int, size: int) -> Placed | None:
    """:func:`placed` of the open file; None where FIEMAP is refused."""
    found = unless_unsupported(lambda: _sys.extents(fd, start, size))
    return None if found is None else placed(found, start, size)
