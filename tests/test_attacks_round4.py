"""The fourth outside attack: the last looks, the move order, the lock file's "moved N" and
"looked" marks, the kept changed source, FIEMAP density and chattr'd sources.  One test per
attack; a test that shows a real bug is a strict xfail whose reason names it in one line.

Judged only by docs/guarantees.md (and the README's "What is promised").
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, _sys, recover, save
from filecord.errors import RecoverError, SaveError
from filecord_testing import pattern

W = 4096
SECOND = b"SECOND-PARTY-BYTES"


class FailRenameOnto(_sys.Backend):
    """Fail (EIO) the rename of a temp onto ``final``: the save stops just after its commit
    point, as a crash there would leave it (committed journal, temps, lock files)."""

    def __init__(self, final: Path) -> None:
        self.final = str(final)

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "rename" and str(args[1]) == self.final:
            raise OSError(errno.EIO, "injected after the commit point")


def _names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def _committed_then_stopped(d: Path, sources: dict[str, bytes], window: int = W) -> Path:
    """Save every source (owned, consumed) into d/out.bin, stopping just after the commit
    point; returns the final name (still holding b"OLD")."""
    out = d / "out.bin"
    out.write_bytes(b"OLD")
    datas = []
    for name, data in sources.items():
        (d / name).write_bytes(data)
        datas.append(FileBackedData(d / name, owned=True))
    with _sys.use(FailRenameOnto(out)), pytest.raises(SaveError, match="after its commit"):
        save(out, Cord(datas), consume=True, window=window)
    assert out.read_bytes() == b"OLD"
    assert any(n.endswith(".filecord-committed") for n in _names(d))
    return out


# --- R4-1: a save with many consumed sources outgrows the 64 KiB the lock file may hold ------
#
# guarantees.md, "What a failure leaves": failure after the commit point -> "`recover`
# completes"; crash at any point -> "`recover` restores, completes, ...".  _looks.check appends
# one "looked DEV INO SIZE MTIME" line (~50 bytes) per consumed source to the journal
# directory's lock file, but _recover._read_pointer reads a lock file only up to 1 << 16
# bytes: past ~1250 consumed sources the lock no longer "names" its journal, _lock_all calls it
# a foreign lock, and every recover refuses the save forever; the output never reaches its name.

BUG_1 = ("a save consuming ~1300 sources writes >64 KiB of 'looked' lines to its lock file; "
         "recover's _read_pointer ignores a lock file over 1<<16 bytes, so every recover "
         "refuses the committed save forever ('belongs to another journal')")


@pytest.mark.xfail(strict=True, reason=BUG_1)
def test_r4_1_recover_finishes_a_committed_save_of_1300_consumed_sources(
    tmp_path: Path,
) -> None:
    sources = {f"s{i:04d}.bin": bytes([i % 251]) * 64 for i in range(1300)}
    out = _committed_then_stopped(tmp_path, sources)
    lock = next(tmp_path / n for n in _names(tmp_path) if n.endswith(".filecord-lock"))
    assert lock.stat().st_size > 1 << 16  # the save's own marks, nobody else's
    try:
        recover(tmp_path)
    except RecoverError as exc:
        pytest.fail(f"recover refused a legitimately committed save: {str(exc)[:300]}")
    assert out.read_bytes() == b"".join(sources.values())
    assert _names(tmp_path) == ["out.bin"]


# --- R4-2: a recover that "refused" had already finished the save -----------------------------
#
# guarantees.md, "Recover": "A refusal keeps everything and says which file holds which
# bytes"; Recovered.action "refused" is documented as "no file was touched".  _undo.finish
# renames the temps onto the final names and unlinks the other parked sources, then raises
# DataChangedError for a source changed after the commit; _act turns that into a refusal
# ("the journal and temps are kept"), although the temps are gone and the old output replaced.

BUG_2 = ("recover's finish renames temps onto the final names and unlinks parked sources, then "
         "a kept changed source makes _act report 'refused ... the journal and temps are kept'")


@pytest.mark.xfail(strict=True, reason=BUG_2)
def test_r4_2_a_refused_recover_touched_nothing(tmp_path: Path) -> None:
    a, b = pattern(2 * W, "a"), pattern(3 * W, "b")
    out = _committed_then_stopped(tmp_path, {"a.bin": a, "b.bin": b})
    parked_b = next(tmp_path / n for n in _names(tmp_path)
                    if n.startswith(".b.bin.") and n.endswith(".filecord-src"))
    with parked_b.open("ab") as f:  # an exporter's late append, after the commit point
        f.write(SECOND)
    before = _names(tmp_path)
    with pytest.raises(RecoverError) as info:
        recover(tmp_path)
    results = info.value.results  # type: ignore[attr-defined]
    assert [r.action for r in results] == ["refused"]
    assert "the journal and temps are kept" in results[0].detail
    # The promise of a refusal: nothing was touched.
    assert (_names(tmp_path), out.read_bytes()) == (before, b"OLD")


# --- R4-3: the kept changed source whose name is taken: recover refuses forever ------------
#
# guarantees.md: "failure after the commit point (journal) ... `recover` completes"; the
# in-process save with the same change completes and leaves "none but that file".  recover's
# finish leaves the changed source parked when its name is taken, raises, keeps the journal
# and lock files, and every later recover does the same: recover never completes.

BUG_3 = ("a consumed source changed after the commit point whose own name is taken stays "
         "parked and keeps the committed journal: every later recover refuses again, forever")


@pytest.mark.xfail(strict=True, reason=BUG_3)
def test_r4_3_recover_completes_when_the_kept_sources_name_is_taken(tmp_path: Path) -> None:
    a, b = pattern(2 * W, "a"), pattern(3 * W, "b")
    out = _committed_then_stopped(tmp_path, {"a.bin": a, "b.bin": b})
    parked_a = next(tmp_path / n for n in _names(tmp_path)
                    if n.startswith(".a.bin.") and n.endswith(".filecord-src"))
    with parked_a.open("ab") as f:
        f.write(SECOND)
    (tmp_path / "a.bin").write_bytes(b"a new a.bin, made after the crash")
    for _ in range(3):  # recover is idempotent: the first run is the only one allowed to say so
        with pytest.raises(RecoverError):
            recover(tmp_path)
    assert out.read_bytes() == a + b
    assert parked_a.read_bytes() == SECOND  # the bytes are safe ...
    # ... but the save is never completed: the journal stays and recover refuses forever.
    assert not any(n.endswith(".filecord-committed") for n in _names(tmp_path))
