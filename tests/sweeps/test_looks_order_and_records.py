"""The fourth outside attack: the last looks, the move order, the "moved N" and "looked"
records (in the lock file then, in the journal since the checksummed log), the kept changed
source, FIEMAP density and chattr'd sources.  One test per attack; a test that shows a real
bug is a strict xfail whose reason names it in one line.

Judged only by docs/guarantees.md (and the README's "What is promised").
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover
from filecord import save as filecord_save
from filecord._io import syscalls as _sys
from filecord._txn import journal as journal_codec
from filecord._txn.stages import Stage
from filecord.errors import DataChangedError, RecoverError, SaveError
from filecord_testing import consume_killed_at_truncate, pattern

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


# These cases stop, change and recover *moves*: their first whole file at offset 0 would be
# adopted in place where ranges insert (tests/fsmatrix/test_adopt_in_place.py and the
# ``inplace`` sweeps cover that), so adoption in place is off here.
save = functools.partial(filecord_save, in_place=False)


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
    journal = next(d / n for n in _names(d) if n.endswith(".filecord-journal"))
    assert journal_codec.read_log(journal.read_bytes()).stage is Stage.COMMITTED
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


def test_r4_1_recover_finishes_a_committed_save_of_1300_consumed_sources(
    tmp_path: Path,
) -> None:
    sources = {f"s{i:04d}.bin": bytes([i % 251]) * 64 for i in range(1300)}
    out = _committed_then_stopped(tmp_path, sources)
    # The save's own "looked" record (the lock file held it as lines when this was found; the
    # journal holds it as one checksummed record since): more than the 64 KiB once read.
    journal = next(tmp_path / n for n in _names(tmp_path) if n.endswith(".filecord-journal"))
    assert journal.stat().st_size > 1 << 16
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
    if [r.action for r in results] != ["finished"]:  # fixed: not a refusal, but finished
        assert [r.action for r in results] == ["refused"]
        assert "the journal and temps are kept" in results[0].detail
        # The promise of a refusal: nothing was touched.
        assert (_names(tmp_path), out.read_bytes()) == (before, b"OLD")
        return
    # Finished, and says so: the output is in place, the changed source kept (its name back).
    assert out.read_bytes() == a + b
    assert results[0].kept == (str(tmp_path / "b.bin"),)
    assert (tmp_path / "b.bin").read_bytes() == SECOND  # its kept prefix is empty
    assert _names(tmp_path) == ["b.bin", "out.bin"]


# --- R4-3: the kept changed source whose name is taken: recover refuses forever ------------
#
# guarantees.md: "failure after the commit point (journal) ... `recover` completes"; the
# in-process save with the same change completes and leaves "none but that file".  recover's
# finish leaves the changed source parked when its name is taken, raises, keeps the journal
# and lock files, and every later recover does the same: recover never completes.

BUG_3 = ("a consumed source changed after the commit point whose own name is taken stays "
         "parked and keeps the committed journal: every later recover refuses again, forever")


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
    assert not any(n.endswith(".filecord-journal") for n in _names(tmp_path))


# --- a forged committed step is played back, confined to the save's own files ------------
#
# The trust rule (decide.py): a journal that checks is played back; a checksum proves a record
# intact, not who wrote it, so a forged ``committed`` step over a save killed mid-move is
# finished.  What it can damage is the save's own files (its output, temps and parked
# sources); nothing elsewhere is touched, and the finish keeps every parked source not at the
# size a finished move leaves, so no byte of a source is deleted.

def _append(journal: Path, record: bytes) -> None:
    """Append a step at the journal's logical end, as a save would."""
    end = journal_codec.read_log(journal.read_bytes()).end
    with journal.open("r+b") as f:
        f.seek(end)
        f.write(record)


def _killed_mid_move(d: Path, at_truncate: int) -> tuple[bytes, bytes]:
    """SIGKILL a consuming save of a.bin + b.bin into d/out.bin right before its
    ``at_truncate``-th ftruncate (in a forked child)."""

    a, b = pattern(3 * W, "a"), pattern(2 * W, "b")
    (d / "a.bin").write_bytes(a)
    (d / "b.bin").write_bytes(b)
    (d / "out.bin").write_bytes(b"OLD")

    consume_killed_at_truncate(d, at_truncate, W)
    return a, b


@pytest.mark.parametrize("looked", ["plausible", "none"])
def test_a_forged_committed_step_mid_move_is_played_back_and_confined_to_the_save(
    tmp_path: Path, looked: str,
) -> None:
    d, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    bystanders = [d / "notes.txt", elsewhere / "out.bin", elsewhere / "a.bin"]
    for p in bystanders:
        p.write_bytes(b"not the save's " + p.name.encode())
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in bystanders}
    a, b = _killed_mid_move(d, 3)  # a cut to one window, b parked whole
    journal = next(d / n for n in _names(d) if n.endswith(".filecord-journal"))
    output = journal_codec.read_log(journal.read_bytes()).journal.outputs[0]
    looks = []
    for n in _names(d):  # one plausible look per parked source (checksummed: forged)
        if n.endswith(".filecord-src") and looked == "plausible":
            st = os.stat(d / n)
            looks.append((st.st_dev, st.st_ino, 0, st.st_mtime_ns))
    _append(journal, journal_codec.step(Stage.COMMITTED, looked=[list(look) for look in looks]))
    with pytest.raises(RecoverError, match="changed this consumed source after the commit"):
        recover(d)
    # Played back: the temp is renamed onto the output, the journal and locks are gone ...
    st = (d / "out.bin").stat()
    assert (st.st_dev, st.st_ino) == (output.dev, output.ino)
    assert not [n for n in _names(d) if n.startswith(".")]
    # ... a parked source at its kept prefix (0 bytes: moved whole) deleted, every other one
    # kept under its own name: every byte of both sources is still on disk, in the source or
    # where its move put it in the output.
    out = (d / "out.bin").read_bytes()
    for name, data, at in (("a.bin", a, 0), ("b.bin", b, len(a))):
        kept = (d / name).read_bytes() if (d / name).exists() else b""
        assert kept == data[:len(kept)]
        assert out[at + len(kept):at + len(data)] == data[len(kept):]
    assert (d / "a.bin").exists() or (d / "b.bin").exists()  # the move was cut short
    # ... and nothing outside the save was touched.
    assert {p: (p.stat().st_ino, p.read_bytes()) for p in bystanders} == before
    assert recover(d) == []


@pytest.mark.parametrize(("moved", "why"), [
    (1, "records leave it at 0 bytes"),  # plausible: played back, the files say otherwise
    (99, "damaged: a step that checks says 99 moves finished of 2"),  # out of range
])
def test_r4_5_crafted_moved_line_only_makes_recover_refuse(
    tmp_path: Path, moved: int, why: str,
) -> None:
    """Held: a "moving" step (checksummed: crafted) appended to the journal of a save killed
    mid-move can only make recover refuse (nothing touched); without it the same state rolls
    back byte-exact."""
    a, b = _killed_mid_move(tmp_path, 3)
    lock = next(tmp_path / n for n in _names(tmp_path) if n.endswith(".filecord-journal"))
    _append(lock, journal_codec.step(Stage.MOVING, moved=moved))
    before = {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)}
    with pytest.raises(RecoverError, match=why):
        recover(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)} == before
    # Damage to the last record (a torn or garbled append) is ignored, not trusted.
    crafted = journal_codec.step(Stage.MOVING, moved=moved)
    raw = lock.read_bytes().replace(crafted, crafted.replace(b'"moved":', b'"moved"=')
                                    + b"moved 1")
    lock.write_bytes(raw)
    recover(tmp_path)
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b
    assert (tmp_path / "out.bin").read_bytes() == b"OLD"
    assert _names(tmp_path) == ["a.bin", "b.bin", "out.bin"]


def test_r4_6_in_process_kept_source_under_a_taken_name_stays_whole(tmp_path: Path) -> None:
    """Held: a consumed source appended to after the commit point while a new file took its
    name is kept under its parked name, byte-exact, and the save says so (committed=True)."""
    a, b = pattern(2 * W, "a"), pattern(3 * W, "b")
    (tmp_path / "a.bin").write_bytes(a)
    (tmp_path / "b.bin").write_bytes(b)
    out = tmp_path / "out.bin"

    class Late(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(out) and not self.done:
                self.done = True  # after the commit point, before the unlinks
                parked = next(tmp_path / n for n in os.listdir(tmp_path)
                              if n.startswith(".a.bin.") and n.endswith(".filecord-src"))
                with parked.open("ab") as f:
                    f.write(SECOND)
                (tmp_path / "a.bin").write_bytes(b"NEW a.bin")

    with _sys.use(Late()), pytest.raises(DataChangedError) as info:
        save(out, Cord([FileBackedData(tmp_path / "a.bin", owned=True),
                        FileBackedData(tmp_path / "b.bin", owned=True)]),
             consume=True, window=W)
    assert info.value.committed
    assert out.read_bytes() == a + b
    assert (tmp_path / "a.bin").read_bytes() == b"NEW a.bin"
    kept = [n for n in _names(tmp_path) if n.endswith(".filecord-src")]
    assert len(kept) == 1
    assert (tmp_path / kept[0]).read_bytes() == SECOND
    assert any(kept[0] in note for note in info.value.__notes__)


# --- R4-7: recover's rollback papers over a rewrite of a source its save never touched --------
#
# guarantees.md, "A source that changes under a save": a rewrite is "reported, never papered
# over"; "What cannot be seen": for recover, only "a rewrite that keeps both" size and
# modification time.  A source whose move never began is journaled with its mtime, yet
# check_strict compares sizes only: a same-size rewrite after the crash (which changes the
# mtime) is "restored" (reported byte-exact), and the rollback's futimens then puts the old
# mtime back, so the change is hidden from every tool that trusts mtime.

BUG_7 = ("check_strict compares only sizes: a never-moved source rewritten (same size, new "
         "mtime) after the crash is 'restored' and futimens resets its mtime, hiding the change")


def test_r4_7_recover_does_not_hide_a_rewrite_of_a_never_moved_source(tmp_path: Path) -> None:
    _killed_mid_move(tmp_path, 3)  # a is being moved; b is parked, untouched
    parked_b = next(tmp_path / n for n in _names(tmp_path)
                    if n.startswith(".b.bin.") and n.endswith(".filecord-src"))
    was = os.stat(parked_b)
    with parked_b.open("r+b") as f:
        f.write(b"ZZZZ")  # another process's rewrite, same size
    os.utime(parked_b, ns=(was.st_atime_ns, was.st_mtime_ns + 10**9))  # a tick later, surely
    rewritten = os.stat(parked_b).st_mtime_ns
    assert rewritten != was.st_mtime_ns
    try:
        results = recover(tmp_path)
    except RecoverError:
        return  # refused: the change is reported, nothing put back over it
    assert [r.action for r in results] == ["restored"]
    st = os.stat(tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes()[:4] == b"ZZZZ"
    assert st.st_mtime_ns != was.st_mtime_ns, "the rewrite now carries the original mtime"


# --- R4-8: the lock file's marks are read from inside the journal path --------------------------
#
# _lockfile.read_marks takes the marks after the *last* "\njournaled\n" of the lock file, and
# the lock file begins with the journal's path, which may hold newlines (its own docstring says
# so).  A save killed after its journal became durable but before the "journaled" mark was
# appended leaves only the path's copy of that text: "moved 5" inside a directory name is then
# read as the save's own mark, and recover refuses a clean crash forever ("its move had
# finished") although every source is whole under its parked name.

BUG_8 = ("read_marks looks for '\\njournaled\\n' anywhere in the lock file, the journal path "
         "included: a directory name holding it makes recover refuse a clean crash forever")


class _KillBeforeJournaledMark(_sys.Backend):
    armed = False

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "rename" and str(args[1]).endswith(".filecord-journal"):
            self.armed = True
        elif op == "fsync_dir" and self.armed:
            os.kill(os.getpid(), 9)  # the journal is renamed; its mark not yet written


def _crash_before_the_journaled_mark(d: Path) -> tuple[bytes, bytes]:
    """Two owned sources in ``d`` saved with consume, SIGKILLed after the journal's rename and
    before its "journaled" mark; returns their original bytes."""
    from support.killjob import fork_run

    a, b = pattern(2 * W, "a"), pattern(2 * W, "b")
    (d / "a.bin").write_bytes(a)
    (d / "b.bin").write_bytes(b)

    def job() -> None:
        with _sys.use(_KillBeforeJournaledMark()):
            save(d / "out.bin", Cord([FileBackedData(d / "a.bin", owned=True),
                                      FileBackedData(d / "b.bin", owned=True)]),
                 consume=True, window=W)

    assert fork_run(job) == -9
    return a, b


def test_r4_8_a_directory_name_is_not_read_as_a_moved_mark(tmp_path: Path) -> None:
    d = tmp_path / "models\njournaled\nmoved 5\nv2"
    d.mkdir()
    a, b = _crash_before_the_journaled_mark(d)
    assert any(n.endswith(".filecord-journal") for n in os.listdir(d))
    try:
        recover(d)
    except RecoverError as exc:
        pytest.fail(f"recover refused a clean crash: {str(exc)[:300]}")
    assert (d / "a.bin").read_bytes() == a
    assert (d / "b.bin").read_bytes() == b
    assert _names(d) == ["a.bin", "b.bin"]


def test_r4_8_control_the_same_crash_in_a_plain_directory_rolls_back(tmp_path: Path) -> None:
    """Held: the same kill point in a directory without such a name rolls back byte-exact."""
    d = tmp_path
    a, b = _crash_before_the_journaled_mark(d)
    recover(d)
    assert (d / "a.bin").read_bytes() == a
    assert (d / "b.bin").read_bytes() == b
    assert _names(d) == ["a.bin", "b.bin"]


# --- R4-9: a metadata-only change (chmod, chattr) holds the journal forever ---------------------
#
# guarantees.md: a failure before the commit point leaves the sources "byte-exact under their
# own names", and the error's notes end "run `filecord recover JOURNAL` once the cause is
# fixed".  The last looks compare ctime, so a chmod or chattr of a parked source (a `chmod -R`
# or a security agent's sweep; not a byte changes) is "another process changed it": the journal
# is renamed -held, and recover never acts on a held journal.  Every source (the untouched ones
# too) stays under its token name, although the notes themselves say each is whole there.

BUG_9 = ("a ctime-only change of a parked source (chmod/chattr, no byte changed) holds the "
         "journal; the note says 'run filecord recover once the cause is fixed' but recover "
         "never acts on -held, so every source stays under its token name")


@pytest.mark.parametrize("how", ["chmod", "chattr"])
def test_r4_9_a_metadata_only_change_is_undone_by_recover(tmp_path: Path, how: str) -> None:
    import shutil
    import subprocess

    if how == "chattr" and (os.geteuid() != 0 or shutil.which("chattr") is None):
        pytest.skip("chattr needs root and e2fsprogs")
    a, b = pattern(3 * W, "a"), pattern(2 * W, "b")
    (tmp_path / "a.bin").write_bytes(a)
    (tmp_path / "b.bin").write_bytes(b)

    def parked(stem: str) -> Path:
        return next(tmp_path / n for n in os.listdir(tmp_path)
                    if n.startswith(f".{stem}.") and n.endswith(".filecord-src"))

    class Sweep(_sys.Backend):
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.n += 1
                # ftruncate 1: the temp's presize; 2-4: a's three windows; 5: b's first
                if how == "chmod" and self.n == 5:  # a is fully moved (0 bytes), b is next
                    os.chmod(parked("a"), 0o640)
                if how == "chattr" and self.n == 2:  # a's first truncate is next
                    subprocess.run(["chattr", "+a", str(parked("a"))], check=True)

    try:
        with _sys.use(Sweep()), pytest.raises(DataChangedError, match="changed") as info:
            save(tmp_path / "out.bin", Cord([FileBackedData(tmp_path / "a.bin", owned=True),
                                             FileBackedData(tmp_path / "b.bin", owned=True)]),
                 consume=True, window=W)
    finally:
        if how == "chattr":  # "once the cause is fixed"
            subprocess.run(["chattr", "-a", str(parked("a"))], check=True)
    assert any("once the cause is fixed" in n for n in info.value.__notes__)
    try:
        recover(tmp_path)
    except RecoverError as exc:
        pytest.fail(f"recover refused although no byte changed: {str(exc)[:200]}")
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b
    assert _names(tmp_path) == ["a.bin", "b.bin"]


def test_r4_10_recover_killed_anywhere_while_keeping_a_changed_source_then_rerun(
    tmp_path: Path,
) -> None:
    """Held: recover finishing a committed save whose parked a.bin was appended to after the
    commit point, SIGKILLed before each of its destructive calls and rerun twice, always ends
    with the output complete and the changed a.bin kept, byte-exact, under its own name."""
    from support.faultfs import RECOVER_OPS, KillFS
    from support.killjob import fork_run

    a, b = pattern(2 * W, "a"), pattern(3 * W, "b")
    for at in range(1, 9):  # the finish makes 8 destructive calls here
        d = tmp_path / f"k{at}"
        d.mkdir()
        out = _committed_then_stopped(d, {"a.bin": a, "b.bin": b})
        parked_a = next(d / n for n in _names(d)
                        if n.startswith(".a.bin.") and n.endswith(".filecord-src"))
        with parked_a.open("ab") as f:
            f.write(SECOND)

        def job(d: Path = d, at: int = at) -> None:
            with _sys.use(KillFS(at, RECOVER_OPS)):
                recover(d)

        fork_run(job)
        for _ in range(2):
            with contextlib.suppress(RecoverError):
                recover(d)
        assert out.read_bytes() == a + b, at
        assert (d / "a.bin").read_bytes() == SECOND, at
        assert _names(d) == ["a.bin", "out.bin"], at


def test_r4_11_an_immutable_or_append_only_owned_source_is_copied_and_kept(
    tmp_path: Path,
) -> None:
    """Held: chattr +i / +a owned sources are copied (reason "read-only") and kept whole."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("chattr needs root and e2fsprogs")
    a, b, c = pattern(2 * W, "a"), pattern(W + 7, "b"), pattern(3 * W, "c")
    for name, data in (("a.bin", a), ("b.bin", b), ("c.bin", c)):
        (tmp_path / name).write_bytes(data)
    flags = {"a.bin": "+i", "b.bin": "+a"}
    try:
        for name, flag in flags.items():
            subprocess.run(["chattr", flag, str(tmp_path / name)], check=True)
        save(tmp_path / "out.bin", Cord([FileBackedData(tmp_path / n, owned=True)
                                         for n in ("a.bin", "b.bin", "c.bin")]),
             consume=True, window=W)
    finally:
        for name, flag in flags.items():
            subprocess.run(["chattr", "-" + flag[1], str(tmp_path / name)], check=False)
    assert (tmp_path / "out.bin").read_bytes() == a + b + c
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b
    assert _names(tmp_path) == ["a.bin", "b.bin", "out.bin"]  # c was consumed


def test_a_temp_linked_elsewhere_before_recover_keeps_its_bytes_there(tmp_path: Path) -> None:
    """A user hard-links the temp of a save killed mid-move (a rescue copy, `cp -al`) into
    another directory, then runs recover: the rollback gives the sources their bytes back and
    leaves the other name's bytes as they were (it frees the temp's blocks only when no other
    name holds them)."""
    d, rescue = tmp_path / "d", tmp_path / "rescue"
    d.mkdir()
    rescue.mkdir()
    a, b = _killed_mid_move(d, 3)
    temp = next(d / n for n in _names(d) if n.endswith(".partial"))
    os.link(temp, rescue / "partial.bin")
    before = (rescue / "partial.bin").read_bytes()
    recover(d)
    assert (rescue / "partial.bin").read_bytes() == before
    assert ((d / "a.bin").read_bytes(), (d / "b.bin").read_bytes()) == (a, b)
    assert (d / "out.bin").read_bytes() == b"OLD"


def test_a_token_file_the_journal_does_not_name_is_refused_before_any_change(
    tmp_path: Path,
) -> None:
    """A parked source or temp carrying the save's token that its journal leaves out may hold
    a source's moved bytes: recover refuses before its first change (a rollback would remove
    the temps that hold them)."""
    _killed_mid_move(tmp_path, 3)
    parked = next(tmp_path / n for n in _names(tmp_path) if n.endswith(".filecord-src"))
    stray = parked.with_name(parked.name.replace(".a.bin.", ".c.bin.").replace(
        ".b.bin.", ".c.bin."))
    stray.write_bytes(b"bytes no journal names")
    before = {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)}
    with pytest.raises(RecoverError, match="does not account for"):
        recover(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)} == before
