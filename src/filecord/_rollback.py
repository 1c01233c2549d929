"""What a failed save leaves behind, and the rollback that makes it retryable.

Theory of operation
-------------------
Before the commit point (no commit line durable in the journal, no rename done):

1. If a journal exists, it is first truncated back to its first line and fsynced.  A commit
   line whose fsync failed may still reach the disk; un-committing first guarantees that a
   crash during the rollback is recovered as a rollback, never as a commit of temps whose
   bytes are being released.  If that fails, nothing more is touched: the temps are complete
   and ``recover`` can finish either way.
2. Each source the move shortened gets its bytes back (``transfer.restore_source``: copy back
   from the temps, fsync the source, only then punch the temps), then its access and
   modification times are restored, so every ``FileBackedData`` on it reads again.
3. Descriptors are closed, temps unlinked, the journal unlinked last.

A failure in 2 stops there: the journal and temps stay, and the error names them and the
command that finishes the job.  After the commit point nothing is undone; the error says where
the complete outputs are.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NoReturn

from filecord import _sys, transfer
from filecord.errors import FilecordError, SaveError, SourceState, add_note
from filecord.plan import MoveSource

if TYPE_CHECKING:
    from filecord.save import _Txn


def _try(notes: list[str], what: str, fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except OSError as exc:
        notes.append(f"could not {what}: {exc}")


def _close_everything(txn: _Txn, notes: list[str]) -> None:
    from filecord.save import close_descriptors  # save imports this module

    notes.extend(f"could not close a descriptor: {exc}" for exc in close_descriptors(txn))


def _uncommit(journal_path: str) -> None:
    fd = _sys.open(journal_path, os.O_RDWR)
    try:
        first = _sys.pread(fd, 1 << 24, 0).split(b"\n", 1)[0]
        _sys.ftruncate(fd, len(first) + 1)
        _sys.fsync(fd)
    finally:
        _sys.close(fd)


def _rollback(txn: _Txn) -> int:
    """Put every moved byte back; returns the number of sources restored."""
    window = txn.prep.plan.window
    temps: list[int | None] = list(txn.fds)
    restored = 0
    for m, fd in reversed(txn.started):
        if m.adopt:
            _unadopt(txn, m)
            restored += 1
            continue
        own = fd < 0
        if own:
            fd = _sys.open(m.path, os.O_RDWR)
        try:
            transfer.restore_source(fd, m, temps, window, txn.counters, punch=True)
            atime, mtime = txn.times[m.key]
            _sys.futimens(fd, atime, mtime)
            txn.counters.fsync(fd)
        finally:
            if own:
                _sys.close(fd)
        for d in txn.prep.datas[m.key]:
            d.rearm_cleanup()
        restored += 1
    return restored


def _unadopt(txn: _Txn, m: MoveSource) -> None:
    """Rename an adopted source back from its temp, if the rename had happened."""
    temp = txn.temps[m.dests[0].output]
    if temp is None:  # pragma: no cover - adoption always has a temp
        return
    try:
        st = _sys.lstat(temp)
    except FileNotFoundError:
        st = None
    if st is not None and (st.st_dev, st.st_ino) == m.key:
        _sys.rename(temp, m.path)
        _sys.fsync_parents([m.path, temp])
    for d in txn.prep.datas[m.key]:
        d.rearm_cleanup()


def _source_states(txn: _Txn) -> tuple[SourceState, ...]:
    states = []
    for m, _fd in txn.started:
        try:
            size = _sys.stat(m.path).st_size
        except OSError:
            size = -1
        rest = tuple(
            (txn.temps[d.output] or "", d.out_offset) for d in m.dests
        )
        states.append(SourceState(m.path, m.size, size, rest))
    return tuple(states)


def _finish_error(exc: BaseException, message: str, notes: list[str], **kw: object) -> NoReturn:
    if isinstance(exc, FilecordError) and not kw:
        for n in [message, *notes]:
            add_note(exc, n)
        raise exc
    if isinstance(exc, OSError):
        err = SaveError(
            f"{message}: {exc.strerror or exc}", errno=exc.errno, **kw  # type: ignore[arg-type]
        )
        for n in notes:
            add_note(err, n)
        raise err from exc
    for n in [message, *notes]:
        add_note(exc, n)
    raise exc


def fail(txn: _Txn, exc: BaseException) -> NoReturn:
    """Clean up after ``exc`` and raise the error the caller sees."""
    names = ", ".join(o.path for o in txn.prep.plan.outputs)
    notes: list[str] = []
    if txn.committed or txn.renamed:
        _close_everything(txn, notes)
        if txn.journal_path is not None:
            notes.append(
                f"the outputs are complete; run `filecord recover {txn.journal_path}` to "
                "finish moving them to their final names and removing the consumed sources"
            )
            _finish_error(exc, f"saving {names} failed after its commit point", notes,
                          journal_path=txn.journal_path)
        notes.append(f"{names} holds the complete new content, but syncing its directory "
                     "failed: after a power loss the old file may come back")
        _finish_error(exc, f"saving {names} failed after the rename", notes)

    if txn.journal_path is not None:
        try:
            _uncommit(txn.journal_path)
        except OSError as uexc:
            _close_everything(txn, notes)
            notes.append(f"could not mark the journal uncommitted ({uexc}); the temps are "
                         f"complete: run `filecord recover {txn.journal_path}`")
            _finish_error(exc, f"saving {names} failed", notes,
                          journal_path=txn.journal_path, sources=_source_states(txn))
    try:
        restored = _rollback(txn)
    except BaseException as rexc:  # noqa: BLE001 - any failure here leaves the journal in charge
        states = _source_states(txn)
        _close_everything(txn, notes)
        notes.append(f"rolling back also failed: {rexc!r}")
        notes.extend(
            f"{s.path}: {s.bytes_in_source} of {s.original_size} bytes in the source; the "
            f"rest is in {', '.join(sorted({t for t, _o in s.rest_at}))}"
            for s in states
        )
        notes.append(f"run `filecord recover {txn.journal_path}` to put the bytes back")
        _finish_error(exc, f"saving {names} failed", notes,
                      journal_path=txn.journal_path, sources=states)
    _close_everything(txn, notes)
    for temp in txn.temps:
        if temp is not None:
            _try(notes, f"remove the temp file {temp}", _sys.unlink_missing_ok, temp)
    if txn.journal_path is not None:
        j = txn.journal_path
        _try(notes, f"remove the journal {j}", _sys.unlink_missing_ok, j)
    if restored:
        notes.append(f"the moved bytes were put back into {restored} source file(s), byte-exact")
    notes.append("no final name was changed and the sources are intact: the save can be retried")
    _finish_error(exc, f"saving {names} failed", notes)
