"""Journal version 4's steps, damaged, forged or torn, never make ``recover`` lose a byte or
tell a wrong story; copies of adjacent and interleaved slices see a change between copies.
Written from the documents (README, docs/guarantees.md, docs/reliability.md, ``recover
--help``; not the code).

One scenario for the kills: ``save_many(consume=True, window=1 MiB)`` of one output
``hdr + A[0:1M] + B[0:1M] + A[1M:] + B[1M:]`` from two owned sources A (3 MiB + 17) and B
(2 MiB + 5): interleaved slices of two files, each moved in windows.  A child process is
SIGKILLed at the N-th call of a system call (``strace -e inject``); the journal steps are then
damaged or forged (the framing of docs/reliability.md: a magic line, then per record 8 hex
digits of length, 32 of the payload's sha256, the canonical JSON payload) and ``filecord
recover`` runs through the CLI, twice.  Each ``xfail(strict=True)`` test is a finding that
fails today; the plain tests are controls that held.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from filecord import Cord, FileBackedData, save, save_many
from filecord.errors import DataChangedError
from filecord.executorch import read_ptd

ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
M = 1 << 20
RND = random.Random(30)  # noqa: S311 - test data, not secrets
A_DATA = RND.randbytes(3 * M + 17)
B_DATA = RND.randbytes(2 * M + 5)
MAGIC = b"filecord-journal 6\n"
CHILD = """
import os, sys
from filecord import Cord, FileBackedData, save_many
d = sys.argv[1]
M = 1 << 20
def A(o, n=None):
    return FileBackedData(os.path.join(d, "A.bin"), offset=o, length=n, owned=True)
def B(o, n=None):
    return FileBackedData(os.path.join(d, "B.bin"), offset=o, length=n, owned=True)
save_many({os.path.join(d, "out.bin"): Cord([b"hdr", A(0, M), B(0, M), A(M), B(M)])},
          consume=True, window=M)
"""
PRISTINE = {"A.bin": A_DATA, "B.bin": B_DATA}
DONE = {"out.bin": b"hdr" + A_DATA[:M] + B_DATA[:M] + A_DATA[M:] + B_DATA[M:]}


def _strace() -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")


def state(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def killed(d: Path, syscall: str, n: int) -> int:
    """The scenario in d, its save SIGKILLed at the n-th ``syscall``; the exit status."""
    _strace()
    d.mkdir(parents=True)
    (d / "A.bin").write_bytes(A_DATA)
    (d / "B.bin").write_bytes(B_DATA)
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e",
                        f"inject={syscall}:signal=SIGKILL:when={n}", sys.executable, "-c", CHILD,
                        str(d)], capture_output=True, env=ENV, timeout=120, check=False)
    return r.returncode


def recover(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(path)],
                          capture_output=True, text=True, env=ENV, timeout=60, check=False)


def journal(d: Path) -> Path:
    found = [p for p in d.iterdir() if p.name.endswith(".filecord-journal")]
    assert len(found) == 1, sorted(p.name for p in d.iterdir())
    return found[0]


def parked(d: Path, base: str) -> Path:
    found = [p for p in d.iterdir()
             if p.name.startswith(f".{base}.") and p.name.endswith(".filecord-src")]
    assert len(found) == 1, sorted(p.name for p in d.iterdir())
    return found[0]


def frame(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return b"%08x %s %s\n" % (len(payload), hashlib.sha256(payload).hexdigest()[:32].encode(),
                              payload)


def lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    return data[len(MAGIC):].splitlines(keepends=True)


def stages(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line[42:]) for line in lines(path)]


def find_kill(tmp: Path, syscall: str, want: str) -> Path:
    """The first kill point of ``syscall`` whose journal's last step is ``want``
    ("moved 1": A's move finished, B's not begun; "committed": before the renames)."""
    for n in range(1, 60):
        d = tmp / f"{syscall}{n}"
        rc = killed(d, syscall, n)
        assert rc != 0, "the save finished before the wanted crash point"
        js = [p for p in d.iterdir() if p.name.endswith(".filecord-journal")]
        if js:
            last = stages(js[0])[-1]
            got = "committed" if last["stage"] == "committed" else "cut" if "cut" in last else (
                f"moved {last['moved']}" if last["stage"] == "moving" else last["stage"])
            if got == want and (d / "out.bin").exists() is False:
                return d
        shutil.rmtree(d)
    raise AssertionError(f"no {syscall} kill point leaves a journal at {want!r}")


@pytest.fixture(scope="module")
def moved1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A killed save whose journal's last step is `moving` 1 (A wholly moved, B untouched)."""
    return find_kill(tmp_path_factory.mktemp("moved1"), "fsync", "moved 1")


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A killed save whose journal's last step is `committed`, its temp not yet renamed."""
    return find_kill(tmp_path_factory.mktemp("committed"), "renameat", "committed")


# ---------------------------------------------------------------------------------- findings


# was a finding (fixed): the notes took the nearest size a move leaves (17), not the
# kept prefix the journal's moving step proves (0)
@pytest.mark.parametrize("whole", [False, True], ids=["16-bytes", "back-to-its-size"])
def test_notes_never_place_moved_bytes_in_a_foreign_append(moved1: Path, tmp_path: Path,
                                                          whole: bool) -> None:
    """An append to a moved source is never taken for its bytes, not even one that gives it
    back its recorded size (a size a ``cut`` step names too)."""
    d = tmp_path / "d"
    assert killed(d, "fsync", int(moved1.name.removeprefix("fsync"))) != 0
    assert stages(journal(d))[-1] == {"moved": 1, "stage": "moving"}
    src = parked(d, "A.bin")
    assert src.stat().st_size == 0  # A is at its kept prefix: every byte of A is in the temp
    with open(src, "ab") as f:
        f.write(b"Z" * len(A_DATA) if whole else b"APPENDED-BY-USER")  # another process
    r = recover(d)
    assert r.returncode == 1, r.stderr  # the refusal itself is right
    note = next(line for line in r.stderr.splitlines() if line.strip().startswith(f"{d}/A.bin:"))
    # every place the note gives for A's bytes must hold them, and together they cover A
    covered = bytearray(len(A_DATA))
    there = re.search(r"its bytes \[(\d+), (\d+)\) are there", note) or re.search(
        r"bytes \[(\d+), (\d+)\) of \d+ are in", note)
    if there:
        a, b = int(there[1]), int(there[2])
        assert src.read_bytes()[a:b] == A_DATA[a:b], f"the note says A[{a}, {b}) is in {src}"
        covered[a:b] = b"\x01" * (b - a)
    for a, b, off, path in re.findall(r"\[(\d+), (\d+)\) at offset (\d+) of (\S+?)(?:,|$)", note):
        a, b, off = int(a), int(b), int(off)
        with open(path, "rb") as f:
            f.seek(off)
            assert f.read(b - a) == A_DATA[a:b], f"the note says A[{a}, {b}) is at {off}"
        covered[a:b] = b"\x01" * (b - a)
    assert covered.count(0) == 0, f"no place named for {covered.index(0)} onward: {note}"


def pack_with_late_append(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """``filecord pack -o out.ptd x.bin --consume`` with every rename held 0.5 s after it returns
    (``strace -e inject=renameat:delay_exit``): after the output's rename the commit point is past
    and the output is in place when another process appends 11 bytes to x.bin's parked file
    (``O_APPEND`` without ``O_CREAT``: never a file of its own under that name)."""
    _strace()
    data = A_DATA
    (tmp_path / "x.bin").write_bytes(data)
    out = tmp_path / "out.ptd"
    p = subprocess.Popen(["strace", "-f", "-qq", "-o", os.devnull, "-e",
                          "inject=renameat:delay_exit=500000", sys.executable, "-m", "filecord",
                          "pack", "-q", "-o", str(out), "x.bin", "--consume"],
                         cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    appended = False
    try:
        while p.poll() is None and not appended:
            srcs = [q for q in tmp_path.iterdir() if q.name.endswith(".filecord-src")]
            if srcs and out.exists():
                fd = os.open(srcs[0], os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, b"LATE-APPEND")
                finally:
                    os.close(fd)
                appended = True
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert appended, stderr
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr), data


# was a finding (fixed)
def test_pack_exits_1_after_its_commit(tmp_path: Path) -> None:
    """`filecord pack --consume` whose consumed source another process appends to after the
    commit point: the output is complete, the source kept, and the exit status 0 (README:
    what happens after the commit never changes it), with a warning saying what was kept."""
    r, data = pack_with_late_append(tmp_path)
    assert (tmp_path / "x.bin").read_bytes() == b"LATE-APPEND"  # kept: right
    assert data in (tmp_path / "out.ptd").read_bytes()  # committed and complete
    parsed = read_ptd(tmp_path / "out.ptd")  # ...at exactly its segment's offset
    (entry,) = parsed.entries.values()
    at = parsed.segments[entry.segment_index].file_offset
    assert (tmp_path / "out.ptd").read_bytes()[at:at + len(data)] == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ptd", "x.bin"]
    assert r.returncode == 0, r.stderr
    assert "warning" in r.stderr, r.stderr
    assert "kept" in r.stderr, r.stderr


# was a finding (fixed)
def test_a_change_after_the_commit_says_missing(tmp_path: Path) -> None:
    """The warning for that kept source gives its real sizes (it said 'expected -1 bytes,
    found missing' while the file was there, 11 bytes)."""
    r, _ = pack_with_late_append(tmp_path)
    assert (tmp_path / "x.bin").stat().st_size == 11
    assert "11 bytes" in r.stderr, r.stderr
    assert "found missing" not in r.stderr, r.stderr
    assert "expected -1 bytes" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------- controls


@pytest.mark.parametrize("change", ["rewrite", "truncate-restore"])
@pytest.mark.parametrize("at", [1, 2, 3, 4, 5])
def test_interleaved_slices_changed_between_copies(tmp_path: Path, change: str,
                                                           at: int) -> None:
    """A[0:1M], B[0:1M], A[1M:2M], B[1M:2M], A[2M:]: A changed (same size, mtime put back; or
    cut to 0 and grown back) from the progress callback after the at-th copy: a
    DataChangedError, no output, both sources as the other process left them."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes((A_DATA + B_DATA)[:4 * M])
    b.write_bytes(B_DATA)
    st = a.stat()
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == at:
            with open(a, "r+b") as f:
                if change == "rewrite":
                    f.write(bytes(x ^ 0x5A for x in A_DATA[:4096]))
                else:
                    f.truncate(0)
                    f.truncate(4 * M)
                    f.write(A_DATA[:4096])
            os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))

    pieces = [FileBackedData(a, offset=0, length=M), FileBackedData(b, offset=0, length=M),
              FileBackedData(a, offset=M, length=M), FileBackedData(b, offset=M, length=M),
              FileBackedData(a, offset=2 * M, length=2 * M)]
    with pytest.raises(DataChangedError):
        save(tmp_path / "out.bin", Cord(pieces), progress=progress)
    assert len(calls) >= at
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]
    assert b.read_bytes() == B_DATA


@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_consuming_save_with_a_rewritten_unowned_slice_rolls_back(tmp_path: Path,
                                                                          at: int) -> None:
    """U copied in three slices into two outputs in two directories while A moves: U rewritten
    (mtime put back) after the at-th copy is a DataChangedError; A comes back byte-exact."""
    (tmp_path / "o2").mkdir()
    a, u = tmp_path / "A.bin", tmp_path / "U.bin"
    a.write_bytes(A_DATA)
    u.write_bytes(B_DATA)
    st = u.stat()
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == at:
            with open(u, "r+b") as f:
                f.write(bytes(x ^ 1 for x in B_DATA[:4096]))
            os.utime(u, ns=(st.st_atime_ns, st.st_mtime_ns))

    def owned(o: int, n: int | None = None) -> FileBackedData:
        return FileBackedData(a, offset=o, length=n, owned=True)

    def unowned(o: int, n: int | None = None) -> FileBackedData:
        return FileBackedData(u, offset=o, length=n)

    outs: dict[str | os.PathLike[str], Cord] = {
        tmp_path / "out.bin": Cord([unowned(0, M), owned(0, M), unowned(M, 4096), owned(M)]),
        tmp_path / "o2" / "out2.bin": Cord([unowned(0, 100), unowned(M + 4096)])}
    with pytest.raises(DataChangedError):
        save_many(outs, consume=True, window=M, progress=progress)
    now = state(tmp_path)
    assert now.pop("U.bin")[4096:] == B_DATA[4096:]
    assert now == {"A.bin": A_DATA}


@pytest.mark.parametrize(("syscall", "n"), [("renameat", 2), ("renameat", 3), ("ftruncate", 3),
                                            ("ftruncate", 6), ("fsync", 12), ("fsync", 17),
                                            ("unlinkat", 3), ("pwrite64", 5)])
def test_kill_then_recover_twice_is_all_or_nothing(tmp_path: Path, syscall: str,
                                                           n: int) -> None:
    d = tmp_path / "d"
    assert killed(d, syscall, n) != 0
    first, second = recover(d), recover(d)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert state(d) in (PRISTINE, DONE), {k: len(v) for k, v in state(d).items()}


def test_a_forged_committed_step_mid_move_is_played_back_losing_no_source_byte(
    tmp_path: Path,
) -> None:
    """Killed at the 3rd ftruncate (A cut by one window, no `moving` step): a `committed` step
    that checks, its `looked` the files as they are now, is appended.  The trust rule plays it
    back (decide.py): the temp replaces the output, and the finish keeps every source not at
    its kept prefix under its own name, saying so (exit 1): A's first bytes are in A.bin, the
    rest in the output where the move put them, B whole."""
    d = tmp_path / "d"
    assert killed(d, "ftruncate", 3) != 0
    j = journal(d)
    head = stages(j)[0]["save"]
    looked = []
    for s in head["sources"]:
        st = parked(d, Path(s["path"]).name).stat()
        looked.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
    with open(j, "ab") as f:
        f.write(frame({"looked": looked, "stage": "committed"}))
    kept = parked(d, "A.bin").stat().st_size
    r = recover(d)
    assert r.returncode == 1, r.stderr
    assert "changed this consumed source after the commit point" in r.stderr
    assert sorted(state(d)) == ["A.bin", "B.bin", "out.bin"]
    assert (d / "A.bin").read_bytes() == A_DATA[:kept]
    assert (d / "B.bin").read_bytes() == B_DATA
    out = (d / "out.bin").read_bytes()
    for a, b, at in ((0, M, 3), (M, len(A_DATA), 3 + 2 * M)):  # where A's ranges are put
        lo = max(a, kept)
        if lo < b:
            assert out[at + lo - a:at + b - a] == A_DATA[lo:b]


@pytest.mark.parametrize(("damage", "expect"), [
    ("duplicate the committed step", "damaged"),
    ("swap the two moving steps", "done"),
    ("duplicate a moving step", "done"),
    ("cut the committed step mid-record", "pristine"),
    ("change a digit of looked (checksum kept)", "pristine"),
    ("flip a bit of the second moving step", "damaged"),
    ("moved as a string, re-checksummed", "damaged"),
    ("looked null, re-checksummed", "damaged"),
    ("held after committed, re-checksummed", "damaged"),
])
def test_damaged_steps_of_a_committed_journal(committed: Path, tmp_path: Path,
                                                      damage: str, expect: str) -> None:
    d = tmp_path / "d"
    assert killed(d, "renameat", int(committed.name.removeprefix("renameat"))) != 0
    j = journal(d)
    recs = lines(j)
    assert json.loads(recs[-1][42:])["stage"] == "committed"
    m1, m2 = (i for i, x in enumerate(recs) if "moved" in json.loads(x[42:]))  # cuts between
    assert [json.loads(recs[i][42:])["moved"] for i in (m1, m2)] == [1, 2]
    if damage == "duplicate the committed step":
        recs.append(recs[-1])
    elif damage == "swap the two moving steps":
        recs[m1], recs[m2] = recs[m2], recs[m1]
    elif damage == "duplicate a moving step":
        recs.insert(-1, recs[m2])
    elif damage == "cut the committed step mid-record":
        recs[-1] = recs[-1][:60]
    elif damage == "change a digit of looked (checksum kept)":
        i = recs[-1].index(b'"looked":[[') + 11
        recs[-1] = recs[-1][:i] + (b"1" if recs[-1][i:i + 1] != b"1" else b"2") + recs[-1][i + 1:]
    elif damage == "flip a bit of the second moving step":
        recs[m2] = recs[m2][:50] + bytes([recs[m2][50] ^ 1]) + recs[m2][51:]
    elif damage == "moved as a string, re-checksummed":
        recs[m1] = frame({"moved": "1", "stage": "moving"})
    elif damage == "looked null, re-checksummed":
        recs[-1] = frame({"looked": None, "stage": "committed"})
    else:
        recs.append(frame({"stage": "held"}))
    j.write_bytes(MAGIC + b"".join(recs))
    before = state(d)
    r1, r2 = recover(d), recover(d)
    assert "Traceback" not in r1.stderr + r2.stderr
    if expect == "damaged":
        assert (r1.returncode, r2.returncode) == (1, 1)
        assert "damaged" in r1.stderr, r1.stderr
        assert "another process" not in r1.stderr, r1.stderr
        assert state(d) == before
    else:
        assert (r1.returncode, r2.returncode) == (0, 0), r1.stderr
        assert state(d) == (DONE if expect == "done" else PRISTINE)


@pytest.mark.parametrize("temp", ["removed", "renamed elsewhere", "renamed to its final name"])
def test_committed_journal_and_its_temp(committed: Path, tmp_path: Path,
                                                temp: str) -> None:
    d = tmp_path / "d"
    assert killed(d, "renameat", int(committed.name.removeprefix("renameat"))) != 0
    t = next(p for p in d.iterdir() if p.name.endswith(".partial"))
    if temp == "removed":
        t.unlink()
    elif temp == "renamed elsewhere":
        t.rename(d / "elsewhere.bin")
    else:
        t.rename(d / "out.bin")
    r = recover(d)
    if temp == "renamed to its final name":
        assert r.returncode == 0, r.stderr
        assert state(d) == DONE
        return
    assert r.returncode == 1
    assert "lost" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    journal(d)  # kept
    assert recover(d).returncode == 1


@pytest.mark.parametrize(("damage", "expect"), [
    ("flip the lock's journaled step", "pristine"),
    ("cut the lock's journaled step", "pristine"),
    ("flip the lock's created step", "damaged"),
    ("remove the lock file", "missing"),
    ("remove the journal", "without a journal"),
])
def test_damaged_lock_file_mid_move(tmp_path: Path, damage: str, expect: str) -> None:
    d = tmp_path / "d"
    assert killed(d, "ftruncate", 3) != 0
    lk = next(p for p in d.iterdir() if p.name.endswith(".filecord-lock"))
    recs = lk.read_bytes().splitlines(keepends=True)
    if damage == "flip the lock's journaled step":
        recs[1] = recs[1][:45] + bytes([recs[1][45] ^ 1]) + recs[1][46:]
    elif damage == "cut the lock's journaled step":
        recs[1] = recs[1][:20]
    elif damage == "flip the lock's created step":
        recs[0] = recs[0][:60] + bytes([recs[0][60] ^ 1]) + recs[0][61:]
    if damage == "remove the lock file":
        lk.unlink()
    elif damage == "remove the journal":
        journal(d).unlink()
    else:
        lk.write_bytes(b"".join(recs))
    before = state(d)
    r1, r2 = recover(d), recover(d)
    if expect == "pristine":
        assert (r1.returncode, r2.returncode) == (0, 0), r1.stderr
        assert state(d) == PRISTINE
    else:
        assert (r1.returncode, r2.returncode) == (1, 1), r1.stderr
        assert expect in r1.stderr, r1.stderr
        assert "Traceback" not in r1.stderr
        assert state(d) == before


def test_recover_racing_a_live_save_skips_it(tmp_path: Path) -> None:
    (tmp_path / "o2").mkdir()
    a, b = tmp_path / "A.bin", tmp_path / "B.bin"
    a.write_bytes(A_DATA)
    b.write_bytes(B_DATA)
    seen: list[tuple[int, str]] = []

    def progress(done: int, total: int) -> None:
        for where in (tmp_path, tmp_path / "o2"):
            r = recover(where)
            seen.append((r.returncode, r.stdout + r.stderr))

    def A(o: int, n: int | None = None) -> FileBackedData:
        return FileBackedData(a, offset=o, length=n, owned=True)

    def B(o: int, n: int | None = None) -> FileBackedData:
        return FileBackedData(b, offset=o, length=n, owned=True)

    save_many({tmp_path / "out.bin": Cord([A(0, M), B(0, M), A(M)]),
               tmp_path / "o2" / "out2.bin": Cord([b"x", B(M)])},
              consume=True, window=M, progress=progress)
    assert state(tmp_path) == {"out.bin": A_DATA[:M] + B_DATA[:M] + A_DATA[M:],
                               "o2/out2.bin": b"x" + B_DATA[M:]}
    assert seen
    assert all(rc == 0 for rc, _ in seen), seen
    assert any("skipped" in out for _, out in seen)


ADOPT_CHILD = """
import os, sys
from filecord import Cord, FileBackedData, save_many
d = sys.argv[1]
M = 1 << 20
def A(o, n=None):
    return FileBackedData(os.path.join(d, "A.bin"), offset=o, length=n, owned=True)
W = FileBackedData(os.path.join(d, "W.bin"), owned=True)
r = save_many({os.path.join(d, "out.bin"): Cord([b"H" * 4096, W, A(0, M), b"T" * 10, A(M)])},
              consume=True)
print(r)
"""
W_DATA = RND.randbytes(2 * M + 3 * 4096)  # whole at offset 4096: adopted in place on ext4


@pytest.mark.parametrize(("syscall", "n"), [
    ("fallocate", 1), ("fallocate", 2), ("fallocate", 3), ("renameat", 2), ("renameat", 3),
    ("renameat", 4), ("ftruncate", 1), ("ftruncate", 2), ("fsync", 4), ("fsync", 8),
    ("fsync", 11), ("unlinkat", 2)])
def test_kill_during_adoption_in_place_and_a_sliced_move(tmp_path: Path, syscall: str,
                                                                 n: int) -> None:
    """W whole at offset 4096 (adopted in place where the file system can insert a range, as
    ext4 can) and A in two slices around a 10-byte tail, moved: SIGKILL, recover twice."""
    _strace()
    d = tmp_path / "d"
    d.mkdir()
    (d / "A.bin").write_bytes(A_DATA)
    (d / "W.bin").write_bytes(W_DATA)
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e",
                        f"inject={syscall}:signal=SIGKILL:when={n}", sys.executable, "-c",
                        ADOPT_CHILD, str(d)], capture_output=True, env=ENV, timeout=120,
                       check=False)
    assert r.returncode != 0, r.stdout
    first, second = recover(d), recover(d)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    done = {"out.bin": b"H" * 4096 + W_DATA + A_DATA[:M] + b"T" * 10 + A_DATA[M:]}
    assert state(d) in ({"A.bin": A_DATA, "W.bin": W_DATA}, done), {
        k: len(v) for k, v in state(d).items()}


@pytest.mark.parametrize("damage", ["cut mid-record", "flip a byte", "drop the record"])
def test_torn_or_damaged_last_moving_step_rolls_back(moved1: Path, tmp_path: Path,
                                                             damage: str) -> None:
    """A's move finished (size 0) and its `moving` step is the last record: cut, flipped or
    dropped, it reads as a torn tail; A at 0 is a size its move leaves, so recover rolls back
    byte-exact."""
    d = tmp_path / "d"
    assert killed(d, "fsync", int(moved1.name.removeprefix("fsync"))) != 0
    j = journal(d)
    recs = lines(j)
    assert json.loads(recs[-1][42:]) == {"moved": 1, "stage": "moving"}
    if damage == "cut mid-record":
        recs[-1] = recs[-1][:30]
    elif damage == "flip a byte":
        recs[-1] = recs[-1][:-5] + bytes([recs[-1][-5] ^ 0x10]) + recs[-1][-4:]
    else:
        recs.pop()
    j.write_bytes(MAGIC + b"".join(recs))
    first, second = recover(d), recover(d)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr
    assert state(d) == PRISTINE
