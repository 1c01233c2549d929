"""The second outside attack (attacks/), recover side: a save dies (in-process: from the
instant it "dies" every call but ``close`` fails, then ``close_leaked`` drops what the kernel
would), someone deletes, renames or swaps its files, and ``recover`` runs.  It must finish or
restore byte-exact, or refuse with ``RecoverError`` and keep every file.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from filecord import Cord, recover, save, save_many
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import journal
from filecord._txn.stages import Stage
from filecord.errors import RecoverError, SaveError
from filecord_testing import close_leaked, files, leftovers, one, pattern
from filecord_testing import owned_file as owned

W = 4096


class Die(BaseException):
    """The process is killed here."""


When = Callable[[str, tuple[object, ...], int], bool]  # (op, args, how many calls of op so far)


class CrashAt(_sys.Backend):
    """Die at the first call for which ``when(op, args, n)`` holds; afterwards nothing the dying
    process does reaches the disk (every call but ``close`` fails)."""

    def __init__(self, when: When) -> None:
        self.when, self.dead = when, False
        self.counts: Counter[str] = Counter()

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if self.dead:
            if op != "close":
                raise OSError(errno.EIO, "the process is dead")
            return
        self.counts[op] += 1
        if self.when(op, args, self.counts[op]):
            self.dead = True
            raise Die


def nth(op: str, k: int) -> When:
    return lambda o, _args, n: o == op and n == k


def crash(root: Path, when: When,
          run: Callable[[], object]) -> None:
    with _sys.use(CrashAt(when)), pytest.raises(Die):
        run()
    close_leaked(root)





def dirs(root: Path, names: str) -> list[Path]:
    out = [root / d for d in names]
    for d in out:
        d.mkdir()
    return out


# --- 30: a 255-byte non-UTF-8 output name; recover of the other output's directory first ---

def test_30_long_undecodable_name_then_recover_of_the_second_directory(tmp_path: Path) -> None:
    a, b, c = dirs(tmp_path, "ABC")
    long = os.fsdecode(b"\xff" + b"a" * 254)
    d1, d2 = pattern(3 * W, "30a"), pattern(3 * W, "30b")
    f1, f2 = owned(b / "s1", d1), owned(b / "s2", d2)
    crash(tmp_path, lambda op, args, _n: op == "rename" and str(args[1]) == str(c / "o2"),
          lambda: save_many({a / long: Cord([b"H", f1]), c / "o2": Cord([b"I", f2])},
                            consume=True, window=W))
    assert (c / "o2").exists() is False
    assert [r.action for r in recover(c)] == ["finished"]  # found through C's lock file
    assert recover(a) == []
    assert recover(b) == []
    assert files(tmp_path) == {f"A/{long}": b"H" + d1, "C/o2": b"I" + d2}


# --- 14: a late recover must not overwrite a newer save -----------------------------------

def test_14_a_late_recover_keeps_the_newer_save(tmp_path: Path) -> None:
    crash(tmp_path, lambda op, args, _n: op == "rename" and str(args[1]).endswith("b.ptd"),
          lambda: save_many({tmp_path / "a.pte": Cord([b"OLD-SAVE-A"]),
                             tmp_path / "b.ptd": Cord([b"OLD-SAVE-B"])}))
    save(tmp_path / "b.ptd", Cord([b"NEWER-B"]))  # the restarted job
    before = files(tmp_path)
    with pytest.raises(RecoverError, match="replaced after the save"):
        recover(tmp_path)
    assert files(tmp_path) == before
    assert (tmp_path / "b.ptd").read_bytes() == b"NEWER-B"
    assert (tmp_path / "a.pte").read_bytes() == b"OLD-SAVE-A"
    assert one(tmp_path, _names.TEMP).read_bytes() == b"OLD-SAVE-B"  # the dead save's output
    committed = journal.read_log(one(tmp_path, _names.JOURNAL).read_bytes())
    assert committed.stage is Stage.COMMITTED


# --- 02: a live save whose lock file was deleted ------------------------------------------

def test_02_a_live_save_without_its_lock_file_is_not_touched(tmp_path: Path) -> None:
    data = pattern(5 * W, "02")
    f = owned(tmp_path / "engine.bin", data)
    seen: list[tuple[dict[str, bytes], dict[str, bytes]]] = []

    def cleanup_and_recover() -> None:  # a dot-file reaper, then a start-up recover
        for p in tmp_path.iterdir():
            if p.name.endswith(_names.LOCK):
                p.unlink()
        before = files(tmp_path)
        with _sys.use(_sys.Backend()), pytest.raises(RecoverError, match="lock file"):
            recover(tmp_path)
        seen.append((before, files(tmp_path)))

    class AtPark(_sys.Backend):  # rename #1 names the journal, #2 parks the source
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename":
                self.n += 1
                if self.n == 2:
                    cleanup_and_recover()

    with _sys.use(AtPark()):
        save(tmp_path / "model.bin", Cord([b"HDR", f]), consume=True, window=W)
    assert len(seen) == 1
    assert seen[0][0] == seen[0][1]
    assert files(tmp_path) == {"model.bin": b"HDR" + data}


# --- 31: the journal deleted, the sources in another directory -----------------------------

@pytest.mark.parametrize("mode", ["move", "adopt"])
def test_31_a_deleted_journal_with_sources_elsewhere_is_refused(
    tmp_path: Path, mode: str
) -> None:
    a, b = dirs(tmp_path, "AB")
    data = pattern(4 * W, "31")
    f = owned(b / "src.bin", data)
    if mode == "move":
        when = nth("ftruncate", 3)  # #1 presizes the temp: one window moved
    else:
        adopted = [False]

        def when(op: str, args: tuple[object, ...], _n: int) -> bool:
            if op == "rename" and str(args[0]) == str(b / "src.bin"):
                adopted[0] = True
                return False
            return adopted[0] and op == "fsync_dir"  # right after the adoption rename

    out = Cord([f]) if mode == "adopt" else Cord([b"H", f])
    crash(tmp_path, when, lambda: save_many({a / "out": out, a / "o2": Cord([b"x"])},
                                            consume=True, window=W))
    one(a, _names.JOURNAL).unlink()  # "junk"
    before = files(tmp_path)
    with pytest.raises(RecoverError, match="journal"):
        recover(a)
    if mode == "move":
        with pytest.raises(RecoverError):
            recover(b)  # a parked source without lock file or journal
    else:
        assert recover(b) == []
    assert files(tmp_path) == before
    temp = sorted(p for p in a.iterdir() if p.name.startswith(".out.")
                  and p.name.endswith(_names.TEMP))[0].read_bytes()
    if mode == "adopt":
        assert temp == data  # the whole file, at the temp
    else:
        kept = one(b, _names.SOURCE).read_bytes()
        assert kept == data[: len(kept)]
        assert len(kept) == 3 * W
        assert temp[1 + len(kept):] == data[len(kept):]


# --- 26: a committed step appended mid-move ------------------------------------------------
# (In journal version 3 the attack renamed the journal -committed; the stage is a step record
# now, so the same lie is a well-formed, checksummed committed step appended by someone else.
# The trust rule plays it back: the finish is confined to the save's files and keeps the
# source, whose size is not the one a finished move leaves.)

def test_26_a_committed_step_appended_mid_move_is_played_back_keeping_the_source(
    tmp_path: Path,
) -> None:
    data = pattern(4 * W, "26")
    f = owned(tmp_path / "src.bin", data)
    crash(tmp_path, nth("ftruncate", 3),
          lambda: save(tmp_path / "out", Cord([b"H", f]), consume=True, window=W))
    j = one(tmp_path, _names.JOURNAL)
    end = journal.read_log(j.read_bytes()).end
    with j.open("r+b") as fh:
        fh.seek(end)
        fh.write(journal.step(Stage.COMMITTED, looked=[]))
    assert journal.read_log(j.read_bytes()).stage is Stage.COMMITTED
    with pytest.raises(RecoverError, match="changed this consumed source after the commit"):
        recover(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src.bin"]
    assert (tmp_path / "src.bin").read_bytes() == data[: 3 * W]
    assert (tmp_path / "out").read_bytes()[1 + 3 * W:] == data[3 * W:]


@pytest.mark.parametrize("suffix", [_names.COMMITTED, _names.ROLLBACK, _names.HELD])
def test_26_a_journal_under_a_version_3_stage_name_is_refused_naming_it(
    tmp_path: Path, suffix: str,
) -> None:
    """The stage names of journal version 3 are never written now; a journal under one is
    refused as an older version (never finished, never rolled back, never called damaged)."""
    data = pattern(4 * W, "26")
    f = owned(tmp_path / "src.bin", data)
    crash(tmp_path, nth("ftruncate", 3),
          lambda: save(tmp_path / "out", Cord([b"H", f]), consume=True, window=W))
    j = one(tmp_path, _names.JOURNAL)
    j.rename(_names.restage(str(j), suffix))
    before = files(tmp_path)
    with pytest.raises(RecoverError, match="version 3") as info:
        recover(tmp_path)
    assert "damaged" not in str(info.value)
    assert files(tmp_path) == before


# --- 32: the parked source swapped for a symlink while recover works -----------------------

def test_32_a_parked_source_swapped_for_a_symlink_is_never_written_through(
    tmp_path: Path,
) -> None:
    root, elsewhere = dirs(tmp_path, "rv")
    victim = elsewhere / "victim.conf"
    victim.write_bytes(b"VICTIM CONTENT\n" * 1000)
    data = pattern(4 * W, "32")
    f = owned(root / "src.bin", data)
    crash(root, nth("ftruncate", 3),
          lambda: save(root / "out", Cord([b"H", f]), consume=True, window=W))
    parked = one(root, _names.SOURCE)
    held = parked.read_bytes()

    class Swap(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if (op == "open" and str(args[0]) == str(parked) and int(args[1]) & os.O_RDWR  # type: ignore[call-overload]
                    and not self.done):
                self.done = True
                parked.rename(str(parked) + ".stolen")
                parked.symlink_to(victim)

    swap = Swap()
    with _sys.use(swap), pytest.raises(RecoverError):
        recover(root)
    assert swap.done
    assert victim.read_bytes() == b"VICTIM CONTENT\n" * 1000
    assert Path(str(parked) + ".stolen").read_bytes() == held
    assert one(root, _names.TEMP).read_bytes()[1 + len(held):] == data[len(held):]


# --- 11: the source truncated (to a window boundary) by its writer after a crash ----------

@pytest.mark.parametrize(("op", "k", "newsize"), [
    ("rename", 2, 0),          # at the park: nothing moved yet
    ("prefetch", 1, 0),        # journal durable, the source parked, nothing copied yet
    ("prefetch", 1, 2 * W),    # (the temps are presized before the fill, before the journal)
    ("ftruncate", 2, W),       # one window copied, not yet truncated
])
def test_11_a_source_shortened_after_the_crash_is_refused_not_zero_filled(
    tmp_path: Path, op: str, k: int, newsize: int
) -> None:
    data = pattern(4 * W, "11")
    f = owned(tmp_path / "src.bin", data)
    writer = os.open(tmp_path / "src.bin", os.O_RDWR)  # the program that wrote it
    try:
        with _sys.use(CrashAt(nth(op, k))), pytest.raises(Die):
            save(tmp_path / "out", Cord([b"H", f]), consume=True, window=W)
        os.ftruncate(writer, newsize)  # through its old descriptor, after the crash
    finally:
        os.close(writer)
    close_leaked(tmp_path)
    before = files(tmp_path)
    with pytest.raises(RecoverError):
        recover(tmp_path)
    assert files(tmp_path) == before  # no zeros written into the source, nothing removed
    src = [v for n, v in before.items() if n == "src.bin" or n.endswith(_names.SOURCE)]
    assert src == [data[:newsize]]


# --- 06: a 255-byte output name, rolled back and recovered -------------------------------

LONG = "o" * 255


def _save06(tmp: Path, d1: bytes, d2: bytes) -> None:
    f, g = owned(tmp / "src.bin", d1), owned(tmp / "src2.bin", d2)
    save_many({tmp / LONG: Cord([b"H", f]), tmp / "small": Cord([b"x", g])},
              consume=True, window=W)


@pytest.mark.parametrize(("when", "want", "done"), [
    pytest.param(nth("prefetch", 1), "restored", False, id="journaled"),
    pytest.param(nth("ftruncate", 3), "restored", False, id="mid-move"),
    # the 1st fsync is the unnamed lock file's (a crash there leaves nothing to recover); the
    # 2nd the pending journal's: the temps exist, the journal has no name yet
    pytest.param(nth("fsync", 2), "discarded", False, id="copying"),
    pytest.param(lambda op, args, _n: op == "unlink" and str(args[0]).endswith(_names.LOCK),
                 "discarded", True, id="letting-go-of-the-locks"),
])
def test_06_long_names_recover(
    tmp_path: Path, when: When, want: str, done: bool
) -> None:
    d1, d2 = pattern(3 * W, "06a"), pattern(W, "06b")
    crash(tmp_path, when, lambda: _save06(tmp_path, d1, d2))
    assert [r.action for r in recover(tmp_path)] == [want]
    assert leftovers(tmp_path) == []
    if done:
        assert files(tmp_path) == {LONG: b"H" + d1, "small": b"x" + d2}
    else:
        assert files(tmp_path) == {"src.bin": d1, "src2.bin": d2}


def test_06_long_names_in_process_rollback(tmp_path: Path) -> None:
    d1, d2 = pattern(3 * W, "06a"), pattern(W, "06b")

    class EIO(_sys.Backend):
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.n += 1
                if self.n == 2:
                    raise OSError(errno.EIO, "injected")

    with _sys.use(EIO()), pytest.raises(SaveError):
        _save06(tmp_path, d1, d2)
    assert files(tmp_path) == {"src.bin": d1, "src2.bin": d2}
    assert recover(tmp_path) == []


# --- 19: recover through a symlinked directory ---------------------------------------------

@pytest.mark.parametrize("how", ["C/", "linkC/", "linkC"])
def test_19_recover_through_a_symlinked_directory(tmp_path: Path, how: str) -> None:
    a, b, c = dirs(tmp_path, "ABC")
    (tmp_path / "linkC").symlink_to(c)
    data = pattern(4 * W, "19")
    f = owned(b / "src.bin", data)
    crash(tmp_path, nth("ftruncate", 3),
          lambda: save_many({a / "o1": Cord([b"H"]), c / "o2": Cord([b"H", f])},
                            consume=True, window=W))
    assert [r.action for r in recover(str(tmp_path) + "/" + how)] == ["restored"]
    assert files(tmp_path) == {"B/src.bin": data}


# --- 05: names with newlines: the lock file's pointer to the journal -----------------------

@pytest.mark.parametrize(("when", "want"), [
    pytest.param(nth("rename", 1), "discarded", id="before-the-journal"),
    pytest.param(nth("ftruncate", 3), "restored", id="mid-move"),
])
def test_05_newlines_in_names_do_not_break_the_lock_files_pointer(
    tmp_path: Path, when: When, want: str
) -> None:
    a, b = tmp_path / "d\nir", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    data = pattern(3 * W + 7, "05")
    f = owned(b / "s\nrc", data)
    (a / "o\nut\n").write_bytes(b"old")
    crash(tmp_path, when, lambda: save_many({a / "o\nut\n": Cord([b"H", f]),
                                             b / "o2": Cord([b"x"])}, consume=True, window=W))
    # B holds only the other output's temp: its lock file leads to the journal in d\nir.
    assert [r.action for r in recover(b)] == [want]
    # A's own files: handled with B's (restored) or its own dead save's garbage (discarded).
    assert [r.action for r in recover(a)] == ([] if want == "restored" else ["discarded"])
    assert files(tmp_path) == {"d\nir/o\nut\n": b"old", "B/s\nrc": data}


# --- a refusal reached through another directory's lock lets go of that lock -------------


def test_a_refusal_through_a_lock_lets_go_of_it(tmp_path: Path) -> None:
    """recover on a directory holding only a lock file (and parked sources) follows the lock to
    the journal beside the first output; that journal refused (overwritten), the lock it took
    must
    be let go: a second recover in the same process refuses again, never says 'skipped: its
    save is running' (a lock this process still held)."""
    a, b = dirs(tmp_path, "AB")
    d1, d2 = pattern(3 * W, "lk1"), pattern(2 * W, "lk2")
    f, g = owned(a / "s1", d1), owned(b / "s2", d2)
    crash(tmp_path, nth("prefetch", 1),
          lambda: save_many({a / "o1": Cord([b"H", f]), b / "o2": Cord([b"h", g])},
                            consume=True, window=W))
    assert [n.endswith(_names.JOURNAL) for n in os.listdir(b)].count(True) == 0
    one(a, _names.JOURNAL).write_bytes(b"overwritten by another program\n")
    before = files(tmp_path)
    for _ in range(2):
        with pytest.raises(RecoverError) as info:
            recover(b)
        assert [r.action for r in info.value.results] == ["refused"]  # type: ignore[attr-defined]
    assert files(tmp_path) == before
