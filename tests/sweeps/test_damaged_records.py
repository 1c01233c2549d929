"""Damage to every record ``recover`` reads, at crash points that leave each kind of record.

Three crashes: a consuming save of a.bin + b.bin killed mid-move of b.bin (the journal holds
its head and a ``moving`` step), one stopped just after its commit point (``moving``,
``moving``, ``committed``), and the same with a discard output (a.bin's first window) and an
index removed at the commit, so the head carries both (their digits are changed like the rest).
In each, every byte of every step record (the journal's head, the steps after it, and both
steps of the lock file) is changed (its lowest bit; the framing also xor 0xFF), and
every decimal digit of every record is changed to another digit (a record that still parses
and looks plausible: only its checksum tells).  After each, ``recover``:

* acts (restores or finishes) and the files are byte-exact, or
* refuses, touches nothing, and says "damaged" -- never "another process": no second party
  was there.  A damaged head (renamed into place whole: no crash leaves one) is always
  refused.

After the sweep the original records are put back and ``recover`` finishes the job byte-exact,
so every refused case had every byte present.
"""

from __future__ import annotations

import errno
import functools
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover
from filecord import save as filecord_save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import RecoverError, SaveError
from filecord_testing import pattern
from support.killjob import run_call

# These cases act on *moves*: their whole files at offset 0 would be adopted in place where
# ranges insert (tests/fsmatrix/test_adopt_in_place.py and the ``inplace`` sweeps cover that),
# so adoption in place is off here.
save = functools.partial(filecord_save, in_place=False)


W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")
# Cases actually run per crash point: about 90% of the 1,914, 2,407, 2,660 and 2,402 that run
# today on tmpfs (every byte of every step record, the head included; the records hold the
# save's paths, so a longer scratch path gives more).
CASES_FLOOR = {"mid-move": 1720, "committed": 2160, "committed-discard": 2390, "renamed": 2160}


def _sources(d: Path) -> Cord:
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    return Cord([FileBackedData(d / "a.bin", owned=True), FileBackedData(d / "b.bin", owned=True)])


class _KillAtFifthTruncate(_sys.Backend):
    n = 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "ftruncate":
            self.n += 1
            if self.n == 5:  # the temp's presize, a.bin's 3 cuts, then b.bin's first
                os.kill(os.getpid(), 9)


def save_until_mid_move(d: str) -> None:
    """The child's side of :func:`mid_move` (run by the fork server: a module-level name)."""
    with _sys.use(_KillAtFifthTruncate()):
        save(Path(d) / "out.bin", _sources(Path(d)), consume=True, window=W)


def mid_move(d: Path) -> None:
    """Killed before b.bin's first cut: a.bin moved (its ``moved`` record durable)."""
    rc, err = run_call(__name__, "save_until_mid_move", str(d))
    assert rc == -9, err


def committed(d: Path) -> None:
    class FailRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(d / "out.bin"):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="after its commit"):
        save(d / "out.bin", _sources(d), consume=True, window=W)


def renamed(d: Path) -> None:
    """Past the commit and the rename onto out.bin: the first unlink of a parked source fails
    (the journal's last step is ``committed``, the output already under its name)."""
    class FailUnlink(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]).endswith(_names.SOURCE):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailUnlink()), pytest.raises(SaveError, match="after its commit"):
        save(d / "out.bin", _sources(d), consume=True, window=W)
    assert (d / "out.bin").read_bytes() == A + B


INDEX = b'{"weight_map": {"a": "a.bin", "b": "b.bin"}}'


def committed_discard(d: Path) -> None:
    """As :func:`committed`, with a.bin's first window in a discard output and an index that
    the commit removes."""
    from filecord._kit.removal import identity
    from filecord._txn.save import Removal, save_many_finishing

    (d / "index.json").write_bytes(INDEX)
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    a = FileBackedData(d / "a.bin", owned=True)
    b = FileBackedData(d / "b.bin", owned=True)
    ident = identity(str(d / "index.json"))
    assert ident is not None

    class FailRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(d / "out.bin"):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="after its commit"):
        save_many_finishing(
            {d / "out.bin": Cord([a.slice(W, 2 * W), b]), d / ".drop": Cord([a.slice(0, W)])},
            consume=True, window=W, progress=None, discard=frozenset({str(d / ".drop")}),
            remove=[Removal(str(d / "index.json"), ident,
                            with_sources=(str(d / "a.bin"), str(d / "b.bin")))],
            in_place=False)


def finished_discard(d: Path) -> bool:
    return sorted(os.listdir(d)) == ["out.bin"] and (d / "out.bin").read_bytes() == A[W:] + B


def restored(d: Path) -> bool:
    return (sorted(os.listdir(d)) == ["a.bin", "b.bin"]
            and (d / "a.bin").read_bytes() == A and (d / "b.bin").read_bytes() == B)


def restored_discard(d: Path) -> bool:
    return (sorted(os.listdir(d)) == ["a.bin", "b.bin", "index.json"]
            and (d / "a.bin").read_bytes() == A and (d / "b.bin").read_bytes() == B
            and (d / "index.json").read_bytes() == INDEX)


def finished(d: Path) -> bool:
    return sorted(os.listdir(d)) == ["out.bin"] and (d / "out.bin").read_bytes() == A + B


def _files(d: Path) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def _targets(d: Path) -> dict[str, Path]:
    names = os.listdir(d)
    journal = next(n for n in names if _names.parse(n) and _names.parse(n)[1] in _names.JOURNALS)
    lock = next(n for n in names if n.endswith(_names.LOCK))
    return {"journal": d / journal, "lock": d / lock}


# A record line: 8 hex digits of length, a space, 32 of checksum, a space, the payload.
PAYLOAD = 42


def _cases(data: bytes, target: str) -> list[tuple[str, int, int]]:
    """(how, line, offset in line): every byte of every step record changed (the journal's
    magic line is not a record), every digit of every record changed to another digit.

    Every byte gets its lowest bit flipped; the framing (the length, the checksum, the two
    spaces, the newline) is also flipped whole (xor 0xFF), where the two tell different
    stories (a plausible length or none, a newline kept or merged).  In the payload a whole
    flip tells the same story as the lowest bit (the length holds, the checksum does not: the
    reader looks no further), so it is left out; the codec's answer to every mask at every
    byte is tests/unit/txn/test_log.py's."""
    lines = data.split(b"\n")[:-1]
    first = 1 if target == "journal" else 0  # the magic line
    out = []
    for n, line in enumerate(lines):
        for k in range(len(line) + 1):  # + its newline
            if n >= first:
                out.append(("bit", n, k))
                if k < PAYLOAD or k == len(line):
                    out.append(("flip", n, k))
            if k < len(line) and line[k:k + 1].isdigit() and k > PAYLOAD:
                out.append(("digit", n, k))
    return out


def _apply(data: bytes, case: tuple[str, int, int]) -> bytes | None:
    how, n, k = case
    lines = data.split(b"\n")[:-1]
    if n >= len(lines) or k > len(lines[n]):
        return None
    at = sum(len(x) + 1 for x in lines[:n]) + k
    c = data[at]
    if how == "flip":
        c ^= 0xFF
    elif how == "bit":
        c ^= 0x01
    elif not chr(c).isdigit():
        return None
    else:
        c = ord("8") if c != ord("8") else ord("3")
    return data[:at] + bytes([c]) + data[at + 1:]


def _last_line(data: bytes, case: tuple[str, int, int]) -> bool:
    return case[1] == len(data.split(b"\n")[:-1]) - 1


# Each crash point's cases in PARTS interleaved shares (case i in part i % PARTS): separate
# tests that pytest-xdist can run side by side; every share meets every kind of record.
PARTS = 2


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize(("point", "crash", "done", "undone"), [
    ("mid-move", mid_move, restored, restored), ("committed", committed, finished, restored),
    ("committed-discard", committed_discard, finished_discard, restored_discard),
    ("renamed", renamed, finished, None),
])
def test_every_damaged_record(ram_path: Path, point: str,
                              crash: Callable[[Path], None],
                              done: Callable[[Path], bool],
                              undone: Callable[[Path], bool] | None, part: int) -> None:
    """``undone``: what a damaged last step may also end as, byte-exact: a committed step
    that does not check is an append a crash may have cut (before its fsync: nothing was
    renamed yet), so recover rolls back.  Once the outputs were renamed (``renamed``) the
    files prove the commit point was passed, and recover finishes, byte-exact.

    On tmpfs (``ram_path``): the sweep judges recover's reading of records, and the crash is
    re-run after every case that acted (thousands of saves, whose fsyncs were most of its
    time on ext4); nothing here is adopted in place, the only call tmpfs lacks."""
    d = ram_path / "t"
    fresh = True
    outcomes: Counter[str] = Counter()
    plan: list[tuple[str, tuple[str, int, int]]] | None = None
    i = 0
    while True:
        if fresh:
            for n in os.listdir(d) if d.exists() else []:
                os.unlink(d / n)
            d.mkdir(exist_ok=True)
            crash(d)
            fresh = False
            targets = _targets(d)
            originals = {t: p.read_bytes() for t, p in targets.items()}
            if plan is None:
                plan = [(t, c) for t, data in originals.items()
                        for c in _cases(data, t)][part::PARTS]
        if i >= len(plan):
            break
        target, case = plan[i]
        i += 1
        damaged = _apply(originals[target], case)
        if damaged is None or damaged == originals[target]:
            continue
        targets[target].write_bytes(damaged)
        before = _files(d)
        story = None
        try:
            recover(d)
        except RecoverError as exc:
            story = (str(exc), " ".join([str(exc), *getattr(exc, "__notes__", [])]))
        assert story is not None or target != "journal" or case[1] > 1, \
            f"{case}: a damaged head was played back"
        if story is not None:
            assert _files(d) == before, f"{target} {case}: refused but touched files"
            assert "damaged" in story[1], f"{target} {case}: refused, not 'damaged': {story}"
            assert "another process" not in story[0], f"{target} {case}: blamed: {story}"
            outcomes["refused, damaged"] += 1
            targets[target].write_bytes(originals[target])
            continue
        if undone is not None and target == "journal" and _last_line(originals[target], case) \
                and undone(d):
            outcomes["rolled back, byte-exact"] += 1
            fresh = True
            continue
        assert done(d), f"{target} {case}: recover reported success but: {_files(d).keys()}"
        outcomes["acted, byte-exact"] += 1
        fresh = True
    # Every byte was there all along: with the records as written, recover completes.
    recover(d)
    assert done(d)
    total = sum(outcomes.values())
    print(f"\n{point}, part {part + 1} of {PARTS}: {total} damaged records: {dict(outcomes)}")
    assert total >= CASES_FLOOR[point] // PARTS
    assert outcomes["refused, damaged"] > 0
    assert outcomes["acted, byte-exact"] > 0
    if point != "mid-move":  # the committed step's digits: only its checksum can tell
        assert outcomes["rolled back, byte-exact" if undone else "refused, damaged"] > 0
