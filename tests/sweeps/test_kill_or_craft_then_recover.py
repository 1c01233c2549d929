"""A consuming save killed at any point, or its journal crafted, then ``recover``: all or
nothing, byte for byte, and nothing outside the save touched.

Written against the documents only (README, docs/guarantees.md, docs/reliability.md and the
journal's on-disk format, version 3, since moved to version 4), not the code.  Each finding is
an ``xfail(strict=True)`` test that states the promise and fails today; the controls are
attacks that held.

One scenario throughout: ``save_many(consume=True, window=4096)`` of three outputs in two
directories, from owned sources A (dense, 300,000 bytes, used three times in two outputs), S
(sparse, 2,000,000 bytes, three data islands) and W (adopted whole as out3, which replaces an
old file), and an unowned U (copied).  A child process runs it and SIGKILLs itself at the
N-th progress callback; the parent recovers through the CLI (``python -m filecord.cli``), with
a timeout so that a hang is a failure, and compares every byte of every file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MAGIC = b"filecord-journal 6\n"

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import filecord
    from filecord import Cord, FileBackedData
    d, window, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def owned(n):
        return FileBackedData(os.path.join(d, n), owned=True)
    A, S, W = owned("src/A.bin"), owned("src/S.bin"), owned("src/W.bin")
    U = FileBackedData(os.path.join(d, "src/U.bin"))
    outs = {
        os.path.join(d, "out1.bin"): Cord([b"hdr1", A, S]),
        os.path.join(d, "src/out2.bin"): Cord([A, b"mid", U, A]),
        os.path.join(d, "out3.bin"): Cord([W]),
    }
    calls = [0]
    def progress(done, total):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    print("go", flush=True)
    filecord.save_many(outs, consume=True, window=window, progress=progress)
    print("calls", calls[0], flush=True)
    """
)

Snap = dict[str, tuple[int, int, bytes | None]]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


def make_tree(d: Path, seed: int) -> dict[str, bytes]:
    """The sources and the old out3; returns every file's bytes (the pristine state)."""
    rnd = random.Random(seed)  # noqa: S311 - test data, not secrets
    (d / "src").mkdir(parents=True)
    a, w, u = rnd.randbytes(300_000), rnd.randbytes(200_000), rnd.randbytes(5000)
    size = 2_000_000
    s = bytearray(size)
    with open(d / "src/S.bin", "wb") as f:
        f.truncate(size)  # sparse: holes between three islands
        for off in (0, size // 2, size - 5000):
            island = rnd.randbytes(3000)
            s[off:off + 3000] = island
            f.seek(off)
            f.write(island)
    files = {"src/A.bin": a, "src/W.bin": w, "src/U.bin": u, "out3.bin": b"old out3 content"}
    for rel, data in files.items():
        (d / rel).write_bytes(data)
    files["src/S.bin"] = bytes(s)
    return files


def done_state(files: dict[str, bytes]) -> dict[str, bytes]:
    a, s, w, u = (files[k] for k in ("src/A.bin", "src/S.bin", "src/W.bin", "src/U.bin"))
    return {"out1.bin": b"hdr1" + a + s, "src/out2.bin": a + b"mid" + u + a,
            "out3.bin": w, "src/U.bin": u}


def contents(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def full_snap(d: Path) -> Snap:
    """Every name under d with its inode, mode and bytes (None for a non-regular file)."""
    out: Snap = {}
    for p in d.rglob("*"):
        st = p.lstat()
        body = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(p.relative_to(d))] = (st.st_ino, st.st_mode, body)
    return out


def judge(d: Path, files: dict[str, bytes]) -> str:
    now = contents(d)
    if now == files:
        return "pristine"
    if now == done_state(files):
        return "done"
    return "neither: " + repr({k: len(v) for k, v in sorted(now.items())})


def run_save(d: Path, tmp: Path, kill_at: int,
             window: int = 4096) -> subprocess.CompletedProcess[bytes]:
    child = tmp / "child.py"
    if not child.exists():
        child.write_text(CHILD)
    return subprocess.run([sys.executable, str(child), str(d), str(window), str(kill_at)],
                          capture_output=True, env=_env(), timeout=120)


def killed(tmp: Path, name: str, seed: int, kill_at: int) -> tuple[Path, dict[str, bytes], Path]:
    """A tree whose save was SIGKILLed at the kill_at-th progress call, and its journal."""
    d = tmp / name
    files = make_tree(d, seed)
    r = run_save(d, tmp, kill_at)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)
    journals = [p for p in d.iterdir() if p.name.endswith(".filecord-journal")]
    assert len(journals) == 1, sorted(p.name for p in d.iterdir())
    return d, files, journals[0]


def cli_recover(path: Path, timeout: float = 30) -> tuple[int | str, str]:
    try:
        r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(path)],
                           capture_output=True, env=_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang", ""
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace")


# The journal's on-disk format (version 4), written from its documentation: a magic line, then
# one record per line: 8 hex digits of payload length, 32 hex digits of the payload's sha256,
# the payload (canonical JSON: sorted keys, no spaces, ASCII).
def frame(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    digest = hashlib.sha256(payload).hexdigest()[:32].encode()
    return b"%08x %s %s\n" % (len(payload), digest, payload)


def read_records(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    return [json.loads(line[42:]) for line in data[len(MAGIC):].splitlines()]


def rewrite(path: Path, edit: Callable[[list[dict[str, Any]]], None]) -> None:
    records = read_records(path)
    edit(records)
    path.write_bytes(MAGIC + b"".join(frame(r) for r in records))


def heads(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["save"] for r in records if r["stage"] == "journaled" and "save" in r]


def source(body: dict[str, Any], base: str) -> dict[str, Any]:
    return next(s for s in body["sources"] if s["path"].endswith("/" + base))


KILL_MID_S = 300  # A fully moved (a durable `moved` record), S part way through its move


def parked(d: Path, base: str) -> Path:
    found = [p for p in (d / "src").iterdir() if p.name.startswith(f".{base}.")
             and p.name.endswith(".filecord-src")]
    assert len(found) == 1
    return found[0]


# ---------------------------------------------------------------------------------------------
# Findings (fail today)
# ---------------------------------------------------------------------------------------------


def test_fifo_named_like_a_lock_file_does_not_hang_recover(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / ".x.bin.0123456789abcdef.filecord-lock")
    (d / "keep.bin").write_bytes(b"user data")
    before = full_snap(d)
    rc, out = cli_recover(d, timeout=15)
    assert rc != "hang", "recover blocked on a FIFO named like a lock file"
    assert rc == 1, out  # refused, like a FIFO named like a journal (a control below)
    assert full_snap(d) == before


def test_refusal_for_a_missing_parked_source_touches_nothing(tmp_path: Path) -> None:
    d, _files, journal = killed(tmp_path, "t", 3, KILL_MID_S)
    parked(d, "S.bin").rename(tmp_path / "aside.bin")  # a user moved the odd hidden file away
    before = full_snap(d)
    rc, out = cli_recover(d)
    assert rc == 1, out
    assert "refused" in out, out
    assert full_snap(d) == before, "a refusal changed the directory: " + repr(
        sorted(set(before) ^ set(full_snap(d))))
    assert journal.exists()


def test_refusal_of_a_crafted_outside_source_touches_nothing(tmp_path: Path) -> None:
    d, _files, journal = killed(tmp_path, "t", 7, KILL_MID_S)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "S.bin").write_bytes(b"victim")

    def edit(records: list[dict[str, Any]]) -> None:
        for body in heads(records):
            source(body, "S.bin")["path"] = str(outside / "S.bin")

    rewrite(journal, edit)
    before, outside_before = full_snap(d), full_snap(outside)
    rc, out = cli_recover(d)
    assert full_snap(outside) == outside_before
    assert rc == 1, out
    assert full_snap(d) == before, sorted(set(before) ^ set(full_snap(d)))


def test_crafted_journal_omitting_a_parked_source_loses_no_byte(tmp_path: Path) -> None:
    d, files, journal = killed(tmp_path, "t", 7, KILL_MID_S)
    s_parked = parked(d, "S.bin")
    assert 0 < s_parked.stat().st_size < len(files["src/S.bin"])  # part of S is in a temp

    def edit(records: list[dict[str, Any]]) -> None:
        for body in heads(records):
            body["sources"] = [s for s in body["sources"] if not s["path"].endswith("/S.bin")]

    rewrite(journal, edit)
    before = full_snap(d)
    rc, out = cli_recover(d)
    cli_recover(d / "src")
    # Either it refuses and touches nothing, or S is whole again; never S's tail gone.
    if full_snap(d) != before:
        s_now = [p for p in (d / "src").iterdir() if p.name == "S.bin" or
                 p.name.startswith(".S.bin.")]
        assert any(p.read_bytes() == files["src/S.bin"] for p in s_now), (rc, out, judge(d, files))


def test_refusal_notes_say_where_the_bytes_really_are(tmp_path: Path) -> None:
    d, _files, journal = killed(tmp_path, "t", 7, KILL_MID_S)

    def edit(records: list[dict[str, Any]]) -> None:
        for body in heads(records):
            source(body, "S.bin")["adopt"] = True

    rewrite(journal, edit)
    rc, out = cli_recover(d)
    assert rc == 1, out
    claim = f"{d}/src/S.bin: the whole file (2000000 bytes) is at {d}/src/S.bin"
    if claim in out:
        assert (d / "src/S.bin").exists(), "the note names a file that is not there"


def test_rollback_of_a_crafted_output_name_leaves_no_token_file(tmp_path: Path) -> None:
    d, files, journal = killed(tmp_path, "t", 7, KILL_MID_S)

    def edit(records: list[dict[str, Any]]) -> None:
        for body in heads(records):
            body["outputs"][2][0] = str(d / "src/U.bin")

    rewrite(journal, edit)
    rc, out = cli_recover(d)
    left = [k for k in contents(d) if ".filecord-" in k or k.endswith(".partial")]
    if rc == 0:  # "rolled back: sources restored byte-exact, temps removed"
        assert left == [], (out, left)
        assert contents(d) == files


COMMIT_CHILD = CHILD.replace(
    "calls = [0]",
    textwrap.dedent(
        """
        import filecord._io.syscalls as _seam  # the test's kill switch, not the save's logic
        _write_all = _seam.write_all
        def _kill_after_commit(fd, data, offset):
            _write_all(fd, data, offset)
            if b'"stage":"committed"' in bytes(data):  # the journal's committed step
                os.kill(os.getpid(), signal.SIGKILL)
        _seam.write_all = _kill_after_commit
        calls = [0]
        """
    ),
)


def killed_after_commit(tmp: Path, name: str, seed: int) -> tuple[Path, dict[str, bytes]]:
    """A tree whose save was SIGKILLed right after its journal's committed step was written."""
    d = tmp / name
    files = make_tree(d, seed)
    child = tmp / "commit_child.py"
    child.write_text(COMMIT_CHILD)
    r = subprocess.run([sys.executable, str(child), str(d), "65536", "0"],
                       capture_output=True, env=_env(), timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    assert [p for p in d.iterdir() if p.name.endswith(".filecord-journal")
            and b'"stage":"committed"' in p.read_bytes()]
    return d, files


def temp_of(d: Path, base: str) -> Path:
    found = [p for p in d.iterdir()
             if p.name.startswith(f".{base}.") and p.name.endswith(".partial")]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("change", ["truncate-out1", "append-out1", "truncate-adopted-out3"])
def test_committed_recover_never_renames_a_wrong_length_temp(tmp_path: Path, change: str) -> None:
    d, files = killed_after_commit(tmp_path, "t", 11)
    if change == "truncate-out1":
        os.truncate(temp_of(d, "out1.bin"), 1000)
    elif change == "append-out1":
        with open(temp_of(d, "out1.bin"), "ab") as f:
            f.write(b"x" * 100)
    else:
        os.truncate(temp_of(d, "out3.bin"), 10)
    rc, out = cli_recover(d)
    cli_recover(d / "src")
    want = done_state(files)
    for rel in ("out1.bin", "out3.bin"):
        p = d / rel
        # a final name holds its old content or the complete new file, never a partial one
        assert not p.exists() or p.read_bytes() in (files.get(rel), want[rel]), (
            rc, rel, p.stat().st_size, out[:300])


def test_committed_source_appended_after_commit_is_kept(tmp_path: Path) -> None:
    d, files = killed_after_commit(tmp_path, "t", 11)
    with open(parked(d, "A.bin"), "ab") as f:
        f.write(b"NEW USER DATA")
    rc, out = cli_recover(d)
    assert rc == 1, out
    assert "kept" in out, out
    assert (d / "src/A.bin").read_bytes() == b"NEW USER DATA"
    want = done_state(files)
    assert {k: v for k, v in contents(d).items() if k != "src/A.bin"} == want


def test_committed_recover_finishes_exactly(tmp_path: Path) -> None:
    d, files = killed_after_commit(tmp_path, "t", 12)
    for sub in (d, d / "src"):
        rc, out = cli_recover(sub)
        assert rc == 0, out
    assert judge(d, files) == "done"


# ---------------------------------------------------------------------------------------------
# Controls (hold today)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kill_at", [1, 150, 300, 540])
def test_sigkill_then_recover_twice_is_all_or_nothing(tmp_path: Path, kill_at: int) -> None:
    d = tmp_path / "t"
    files = make_tree(d, kill_at)
    r = run_save(d, tmp_path, kill_at)
    assert r.returncode in (0, -signal.SIGKILL), r.stderr
    for sub in (d, d / "src"):
        rc, out = cli_recover(sub)
        assert rc == 0, out
    state = judge(d, files)
    assert state in ("pristine", "done"), state
    assert r.returncode != 0 or state == "done"
    for sub in (d, d / "src"):
        rc, out = cli_recover(sub)
        assert rc == 0, out
        assert "nothing to recover" in out, out
    assert judge(d, files) == state


def test_sigkill_at_random_times_then_recover(tmp_path: Path) -> None:
    rnd = random.Random(22)  # noqa: S311 - kill times, not secrets
    seen: dict[str, int] = {}
    for i in range(2):
        d = tmp_path / f"r{i}"
        files = make_tree(d, 100 + i)
        (tmp_path / "child.py").write_text(CHILD)
        p = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(d), "4096", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
        assert p.stdout is not None
        assert p.stdout.readline() == b"go\n"
        time.sleep(rnd.uniform(0.0, 0.5))
        p.kill()
        p.communicate()
        for sub in (d, d / "src"):
            rc, out = cli_recover(sub)
            assert rc == 0, out
        state = judge(d, files)
        assert state in ("pristine", "done"), state
        seen[state] = seen.get(state, 0) + 1
    print("random SIGKILLs:", seen)


def test_recover_killed_midway_then_again(tmp_path: Path) -> None:
    for i, delay in enumerate((0.2, 0.45)):
        d, files, _j = killed(tmp_path, f"r{i}", 20 + i, 250)
        p = subprocess.Popen([sys.executable, "-m", "filecord.cli", "recover", str(d)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
        time.sleep(delay)
        p.kill()
        p.communicate()
        for sub in (d, d / "src", d):
            rc, out = cli_recover(sub)
            assert rc == 0, out
        assert judge(d, files) == "pristine"


def _moved(n: object) -> Callable[[list[dict[str, Any]]], None]:
    return lambda records: records.append({"stage": "moving", "moved": n})


def _each_head(f: Callable[[dict[str, Any]], None]) -> Callable[[list[dict[str, Any]]], None]:
    def edit(records: list[dict[str, Any]]) -> None:
        for body in heads(records):
            f(body)
    return edit


def _set(base: str, key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda body: source(body, base).__setitem__(key, value)


def _dest(index: int, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda body: source(body, "S.bin")["dests"][0].__setitem__(index, value)


REFUSED = {
    "moved-claims-S-finished": _moved(2),
    "moved-claims-more-than-exist": _moved(99),
    # (version 3 crafted a "looked" record here; its looks are the committed step's now)
    "committed-mid-move": lambda r: r.append({"stage": "committed", "looked": []}),
    "moving-after-committed": lambda r: r.extend([{"stage": "committed", "looked": []},
                                                  {"stage": "moving", "moved": 2}]),
    "second-begin-after-progress": lambda r: r.append(dict(r[0])),
    "S-size-larger": _each_head(_set("S.bin", "size", 2_100_000)),
    "S-size-negative": _each_head(_set("S.bin", "size", -5)),
    "S-size-float": _each_head(_set("S.bin", "size", 2_000_000.0)),
    "dest-offset-past-eof": _each_head(_dest(1, 10**12)),
    "dest-offset-negative": _each_head(_dest(1, -100)),
    "dest-length-huge": _each_head(_dest(2, 10**15)),
    "window-zero": _each_head(lambda b: b.__setitem__("window", 0)),
    "window-huge": _each_head(lambda b: b.__setitem__("window", 10**18)),
    "window-bool": _each_head(lambda b: b.__setitem__("window", True)),
    "another-token": _each_head(lambda b: b.__setitem__("token", "0123456789abcdef")),
    "source-through-dotdot": _each_head(
        lambda b: source(b, "S.bin").__setitem__(
            "path", source(b, "S.bin")["path"].replace("/src/S.bin", "/src/../../x/S.bin"))),
    "sources-reordered": _each_head(
        lambda b: b.__setitem__("sources", [b["sources"][1], b["sources"][0], b["sources"][2]])),
    "source-listed-twice": _each_head(lambda b: b["sources"].append(dict(source(b, "S.bin")))),
    "version-2": _each_head(lambda b: b.__setitem__("version", 2)),
    # strict journal (version 5): a field no save writes is damage; the cut steps gone, the
    # parked source's size is proven by no record
    "extra-field": _each_head(lambda b: b.__setitem__("extra", 1)),
    "moved-removed": lambda r: r.__delitem__(slice(2, None)),
}
# Journals that check, played back under the trust rule (decide.py): what they touch stays
# within the save; recover ends with an answer, never an internal error or a change elsewhere.
PLAYED_BACK = {
    "committed-mid-move": REFUSED.pop("committed-mid-move"),
    "window-huge": REFUSED.pop("window-huge"),
    "source-listed-twice": REFUSED.pop("source-listed-twice"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_crafted_journal_is_refused_and_nothing_changes(tmp_path: Path, case: str) -> None:
    d, _files, journal = killed(tmp_path, "t", 7, KILL_MID_S)
    rewrite(journal, REFUSED[case])
    before = full_snap(d)
    rc, out = cli_recover(d)
    assert rc == 1, out
    assert "refused" in out, out
    assert full_snap(d) == before


@pytest.mark.parametrize("case", sorted(PLAYED_BACK))
def test_crafted_journal_that_checks_is_played_back_within_the_save(tmp_path: Path,
                                                                     case: str) -> None:
    d, _files, journal = killed(tmp_path, "t", 7, KILL_MID_S)
    bystander = tmp_path / "bystander.bin"
    bystander.write_bytes(b"not the save's")
    rewrite(journal, PLAYED_BACK[case])
    rc, out = cli_recover(d)
    assert rc in (0, 1), out
    assert "internal error" not in out, out
    assert bystander.read_bytes() == b"not the save's"


@pytest.mark.parametrize("case", ["moved-duplicated", "moved-n-negative", "head-copy-dropped"])
def test_crafted_but_harmless_journal_rolls_back_exactly(tmp_path: Path, case: str) -> None:
    d, files, journal = killed(tmp_path, "t", 7, KILL_MID_S)
    edits: dict[str, Callable[[list[dict[str, Any]]], None]] = {
        "moved-duplicated": _moved(1),
        "moved-n-negative": _moved(-1),
        "head-copy-dropped": lambda r: r.__delitem__(1),
    }
    rewrite(journal, edits[case])
    rc, out = cli_recover(d)
    assert rc == 0, out
    assert judge(d, files) == "pristine"


@pytest.mark.parametrize("suffix", ["filecord-journal", "filecord-committed",
                                    "filecord-rollback", "filecord-pending", "partial",
                                    "filecord-src"])
def test_fifo_named_like_a_save_file_is_refused_without_blocking(tmp_path: Path,
                                                                 suffix: str) -> None:
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / f".x.bin.0123456789abcdef.{suffix}")
    before = full_snap(d)
    rc, out = cli_recover(d, timeout=15)
    assert rc == 1, out
    assert full_snap(d) == before


def test_real_journal_replaced_by_fifo_or_symlink_is_refused(tmp_path: Path) -> None:
    d, files, journal = killed(tmp_path, "t", 3, KILL_MID_S)
    real = tmp_path / "real-journal"
    journal.rename(real)
    os.mkfifo(journal)
    before = full_snap(d)
    assert cli_recover(d, timeout=15)[0] == 1
    assert full_snap(d) == before
    journal.unlink()
    journal.symlink_to(real)
    before = full_snap(d)
    assert cli_recover(d, timeout=15)[0] == 1
    assert full_snap(d) == before
    journal.unlink()
    real.rename(journal)
    assert cli_recover(d)[0] == 0
    assert judge(d, files) == "pristine"


def test_parked_source_replaced_by_a_same_size_file_is_refused(tmp_path: Path) -> None:
    d, files, _journal = killed(tmp_path, "t", 3, KILL_MID_S)
    aside = tmp_path / "aside.bin"
    parked(d, "S.bin").rename(aside)
    (d / "src/S.bin").write_bytes(b"\x07" * len(files["src/S.bin"]))
    rc, out = cli_recover(d)
    assert rc == 1, out
    # S's moved tail is still in the temp: nothing that held it was removed.
    assert any(p.name.startswith(".out1.bin.") and p.name.endswith(".partial")
               for p in d.iterdir())


def test_recover_races_a_live_save(tmp_path: Path) -> None:
    import filecord
    from filecord.errors import RecoverError

    d = tmp_path / "t"
    files = make_tree(d, 9)
    (tmp_path / "child.py").write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(d), "4096", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert p.stdout is not None
    assert p.stdout.readline() == b"go\n"
    outcomes: dict[str, int] = {}
    while p.poll() is None:
        for sub in (d, d / "src"):
            try:  # another process: flock contends as a start-up recover's would
                got = [r.action for r in filecord.recover(sub)]
            except RecoverError as e:  # refusing, touching nothing, is allowed while it runs
                got = ["refused:" + str(e)[:40]]
            except FileNotFoundError:
                got = ["vanished"]
            for a in got or ["nothing"]:
                outcomes[a.split(":")[0]] = outcomes.get(a.split(":")[0], 0) + 1
            assert all(a in ("skipped", "nothing", "vanished") or a.startswith("refused")
                       for a in got or ["nothing"]), got
    assert p.returncode == 0, p.communicate()
    assert judge(d, files) == "done"
    print("recover raced the live save:", outcomes)


def test_journal_of_another_save_copied_in_is_refused_and_kept(tmp_path: Path) -> None:
    da, _fa, ja = killed(tmp_path, "a", 7, KILL_MID_S)
    db, fb, _jb = killed(tmp_path, "b", 8, 200)
    shutil.copy(ja, db / ja.name)
    a_before = full_snap(da)
    rc, out = cli_recover(db)
    assert rc == 1, out  # B's own save rolled back, A's journal refused
    assert full_snap(da) == a_before
    assert {k: v for k, v in contents(db).items() if k != ja.name} == fb
    assert (db / ja.name).read_bytes() == ja.read_bytes()


def test_lock_files_swapped_between_saves_are_refused(tmp_path: Path) -> None:
    da, _fa, _ja = killed(tmp_path, "a", 7, KILL_MID_S)
    db, _fb, _jb = killed(tmp_path, "b", 8, 200)
    la = next(p for p in da.iterdir() if p.name.endswith(".filecord-lock"))
    lb = next(p for p in db.iterdir() if p.name.endswith(".filecord-lock"))
    ba, bb = la.read_bytes(), lb.read_bytes()
    la.write_bytes(bb)
    lb.write_bytes(ba)
    before = full_snap(tmp_path)
    for d in (da, db):
        rc, out = cli_recover(d)
        assert rc == 1, out
    assert full_snap(tmp_path) == before


@pytest.mark.parametrize("kill_at", [1, 300, 600])
def test_a_source_used_whole_and_again_elsewhere_is_not_adopted_away(tmp_path: Path,
                                                                    kill_at: int) -> None:
    d = tmp_path / "t"
    files = make_tree(d, kill_at)
    child = tmp_path / "twice.py"
    child.write_text(CHILD.replace(
        'Cord([b"hdr1", A, S])',
        'Cord([b"hdr1", A, S, FileBackedData(os.path.join(d, "src/W.bin"), owned=True)])'))
    r = subprocess.run([sys.executable, str(child), str(d), "4096", str(kill_at)],
                       capture_output=True, env=_env(), timeout=120)
    for sub in (d, d / "src"):
        rc, out = cli_recover(sub)
        assert rc == 0, out
    want = done_state(files)
    want["out1.bin"] += files["src/W.bin"]
    now = contents(d)
    assert now in (files, want), {k: len(v) for k, v in now.items()}
    assert r.returncode == -signal.SIGKILL or now == want


def test_thousands_of_stray_journals_are_refused_quickly(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    for i in range(2000):
        (d / f".f{i}.bin.{i:016x}.filecord-journal").write_bytes(MAGIC + b"junk\n")
    (d / "keep.bin").write_bytes(b"user")
    before = full_snap(d)
    t0 = time.monotonic()
    rc, _out = cli_recover(d, timeout=120)
    assert rc == 1
    assert full_snap(d) == before
    print("2000 stray journals refused in", round(time.monotonic() - t0, 1), "s")
    shutil.rmtree(d)
