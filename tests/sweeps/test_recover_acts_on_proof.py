"""Recover acts only on proof; saves lock; owned files outlive failed saves; changed sources are
errors.  Each test reproduces one of the attacks of issue 14 on real files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover, save, save_many
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError, RecoverError
from filecord_testing import close_leaked, leftovers, pattern

W = 8192
SRC = str(Path(__file__).resolve().parents[2] / "src")


def owned(tmp: Path, name: str, data: bytes) -> FileBackedData:
    p = tmp / name
    p.write_bytes(data)
    return FileBackedData(p, owned=True)


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


# --- recover refuses what it cannot prove ----------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"PTE\x00" * 100, b"filecord-journal 2\nxx\n"])
def test_recover_refuses_a_file_that_is_not_a_journal(tmp_path: Path, content: bytes) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(content)
    with pytest.raises(RecoverError, match="not a filecord journal"):
        recover(model)
    assert model.read_bytes() == content
    cli = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(model)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC},
                         check=False)
    assert cli.returncode == 2  # a usage error: it names a file that is no journal
    assert "not a filecord journal" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert model.read_bytes() == content


def test_recover_refuses_junk_under_a_journal_name(tmp_path: Path) -> None:
    tok = _names.new_token()
    fake = tmp_path / _names.token_name("o", tok, _names.JOURNAL)
    fake.write_bytes(b"filecord-journal 2\n{not json}\n")
    temp = tmp_path / _names.token_name("o", tok, _names.TEMP)
    temp.write_bytes(b"moved bytes")
    (tmp_path / _names.token_name("o", tok, _names.LOCK)).write_bytes(b"")
    before = snapshot(tmp_path)
    with pytest.raises(RecoverError, match="refused"):
        recover(tmp_path)
    assert snapshot(tmp_path) == before


def test_temps_without_a_lock_file_are_never_deleted(tmp_path: Path) -> None:
    temp = tmp_path / _names.token_name("o", _names.new_token(), _names.TEMP)
    temp.write_bytes(b"perhaps moved bytes")
    with pytest.raises(RecoverError, match="without its lock file"):
        recover(tmp_path)
    assert temp.read_bytes() == b"perhaps moved bytes"


# --- the lock: a live save is never touched ---------------------------------------------------

def test_recover_skips_a_live_save_and_the_save_completes(tmp_path: Path) -> None:
    a, b = pattern(6 * W + 100, "a"), pattern(5 * W, "b")
    fa, fb = owned(tmp_path, "a", a), owned(tmp_path, "b", b)
    seen: list[list[str]] = []

    class RecoverMidMove(_sys.Backend):
        truncates = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.truncates += 1
                if self.truncates == 4:  # in the middle of moving a
                    with _sys.use(_sys.Backend()):
                        seen.append([r.action for r in recover(tmp_path)])

    with _sys.use(RecoverMidMove()):
        save(tmp_path / "o", Cord([b"h", fa, fb]), consume=True, window=W)
    assert seen == [["skipped"]]
    assert (tmp_path / "o").read_bytes() == b"h" + a + b
    assert leftovers(tmp_path) == []


def test_two_recovers_never_act_on_one_save_at_once(tmp_path: Path) -> None:
    a = pattern(4 * W, "a")
    fa = owned(tmp_path, "a", a)

    class Die(BaseException):
        pass

    class DieMidMove(_sys.Backend):
        n = 0

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate":
                self.n += 1
                if self.n == 3:
                    raise Die

    class Dead(DieMidMove):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if self.n >= 3 and op != "close":
                raise OSError(5, "down")
            super().hook(op, args)

    with _sys.use(Dead()), pytest.raises(Die):
        save(tmp_path / "o", Cord([b"h", fa]), consume=True, window=W)
    close_leaked(tmp_path)
    inner: list[list[str]] = []

    class RecoverInside(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "copy_file_range" and not self.done:  # the first put-back copy
                self.done = True
                with _sys.use(_sys.Backend()):
                    inner.append([r.action for r in recover(tmp_path)])

    with _sys.use(RecoverInside()):
        outer = [r.action for r in recover(tmp_path)]
    assert inner == [["skipped"]]
    assert outer == ["restored"]
    assert Path(fa.path).read_bytes() == a
    assert leftovers(tmp_path) == []


def test_a_dead_save_before_its_journal_is_cleaned_up(tmp_path: Path) -> None:
    class Die(BaseException):
        pass

    temps: dict[int, str] = {}

    class DieInFill(_sys.Backend):
        def open(self, path: str, flags: int, mode: int) -> int:
            fd = super().open(path, flags, mode)
            temps[fd] = path
            return fd

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "pwrite" and str(temps.get(int(args[0]), "")).endswith(".partial"):  # type: ignore[call-overload]
                raise Die

    class Frozen(DieInFill):
        # a crash: nothing the dying process does afterwards reaches the disk
        dead = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if self.dead and op != "close":
                raise OSError(5, "down")
            if op == "pwrite" and str(temps.get(int(args[0]), "")).endswith(".partial"):  # type: ignore[call-overload]
                self.dead = True
            super().hook(op, args)

    with _sys.use(Frozen()), pytest.raises(Die):
        save_many({tmp_path / "x": b"1" * 100, tmp_path / "y": b"2" * 100})
    assert leftovers(tmp_path)  # lock file and temps were left by the "crash"
    close_leaked(tmp_path)
    assert [r.action for r in recover(tmp_path)] == ["discarded"]
    assert leftovers(tmp_path) == []
    assert recover(tmp_path) == []


# --- owned files outlive a failed save -------------------------------------------------------

def test_the_readme_pattern_keeps_owned_files_when_the_save_fails(tmp_path: Path) -> None:
    engine = tmp_path / "engine.bin"
    engine.write_bytes(pattern(100_000, "engine"))
    script = textwrap.dedent(f"""
        from filecord import Cord, FileBackedData, save
        engine = FileBackedData.move_from({str(engine)!r})
        weights = FileBackedData({str(engine)!r}.replace("engine.bin", "w.bin"), owned=True)
        save({str(tmp_path / "missing" / "model.bin")!r}, Cord([b"h", engine, weights]),
             consume=True)
    """)
    (tmp_path / "w.bin").write_bytes(b"w" * 5000)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, check=False)
    assert proc.returncode == 1
    assert "does not exist" in proc.stderr
    owned_names = [n for n in os.listdir(tmp_path) if n.endswith(".filecord-owned")]
    assert len(owned_names) == 1  # move_from's private name, still there after exit
    assert (tmp_path / owned_names[0]).read_bytes() == pattern(100_000, "engine")
    assert (tmp_path / "w.bin").read_bytes() == b"w" * 5000


# --- a source changed by a second party is an error, never papered over ----------------------

class ChangeAt(_sys.Backend):
    """At the ``at``-th call of ``op``, do ``action`` to the file at ``path`` (the second party)."""

    def __init__(self, op: str, at: int, action: str, path_of: object) -> None:
        self.op, self.at, self.action, self.path_of = op, at, action, path_of
        self.n = 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op != self.op:
            return
        self.n += 1
        if self.n != self.at:
            return
        path = self.path_of()  # type: ignore[operator]
        if self.action == "append":
            with open(path, "ab") as f:
                f.write(b"appended by someone else")
        elif self.action == "truncate":
            os.truncate(path, os.path.getsize(path) - 3000)
        else:
            with open(path, "r+b") as f:
                f.write(b"REWRITTEN")


def parked_path(tmp: Path) -> str:
    names = [n for n in os.listdir(tmp) if n.endswith(_names.SOURCE)]
    return str(tmp / names[0])


@pytest.mark.parametrize("action", ["append", "truncate"])
def test_a_source_changed_during_the_move_is_an_error_and_keeps_every_byte(
    tmp_path: Path, action: str
) -> None:
    a = pattern(6 * W, "a")
    fa = owned(tmp_path, "a", a)
    # Each window is one copy_file_range; change the source while the third window is copied
    # (two windows already moved and truncated).
    with _sys.use(ChangeAt("copy_file_range", 3, action, lambda: parked_path(tmp_path))), \
            pytest.raises(DataChangedError) as info:
        save(tmp_path / "o", Cord([b"h", fa]), consume=True, window=W)
    notes = "\n".join(info.value.__notes__)
    assert "recover" in notes
    assert "bytes [0," in notes  # where every byte is
    assert not (tmp_path / "o").exists()
    # Nothing was "restored" over the change: the parked source and the temp hold what they
    # held, and recover refuses instead of writing zeros.
    close_leaked(tmp_path)
    parked = Path(parked_path(tmp_path))
    changed = parked.read_bytes()
    assert changed != a
    with pytest.raises(RecoverError):
        recover(tmp_path)
    assert parked.read_bytes() == changed
    temp = next(p for p in tmp_path.iterdir() if p.name.endswith(".partial"))
    # Two windows had been moved (source left at 4W); the third copy met the change.
    assert temp.read_bytes()[1 + 4 * W : 1 + 6 * W] == a[4 * W :]
    if action == "append":
        assert changed == a[: 4 * W] + b"appended by someone else"
    else:
        assert changed == a[: 4 * W - 3000]  # the other party's truncate, not ours
    assert f"[{4 * W}, {6 * W}) at offset {1 + 4 * W}" in notes


def test_a_source_rewritten_during_a_copy_is_an_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(pattern(3 << 20, "s"))
    d = FileBackedData(src)
    out = tmp_path / "o"
    out.write_bytes(b"old")

    class RewriteMidCopy(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op in ("copy_file_range", "preadinto") and not self.done:
                self.done = True
                with open(src, "r+b") as f:
                    f.seek(2 << 20)
                    f.write(b"REWRITTEN")

    with _sys.use(RewriteMidCopy()), pytest.raises(DataChangedError, match="changed"):
        save(out, Cord([d]))
    assert out.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


# --- plan and reality agree -------------------------------------------------------------------

@pytest.mark.root
def test_a_source_on_a_read_only_mount_is_copied_and_kept(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a read-only bind mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "a").write_bytes(pattern(50_000, "a"))
    r = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)],
                       capture_output=True, check=False)
    if r.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot bind-mount read-only: {r.stderr!r}")
        pytest.skip(f"cannot bind-mount read-only: {r.stderr!r}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=False)
        fa = FileBackedData(ro / "a", owned=True)
        report = save(tmp_path / "o", Cord([b"h", fa]), consume=True)
        assert [(x.action, x.reason) for x in report.file_actions()] == [("copied", "read-only")]
        assert (tmp_path / "o").read_bytes() == b"h" + pattern(50_000, "a")
        assert (ro / "a").read_bytes() == pattern(50_000, "a")  # kept: it cannot be deleted
        assert leftovers(tmp_path) == []
        assert recover(tmp_path) == []
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_sparse_source_counts_at_its_logical_size(tmp_path: Path) -> None:
    from filecord import plan

    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(64 << 20)
        f.write(b"data")
    dense = tmp_path / "dense"
    dense.write_bytes(pattern(1 << 20, "d"))
    ps = plan(tmp_path / "o", Cord([b"h", FileBackedData(sparse, owned=True)]), consume=True)
    pd = plan(tmp_path / "o", Cord([b"h", FileBackedData(dense, owned=True)]), consume=True)
    # The dense move frees what it writes; the sparse one writes 64 MiB its source never held.
    assert ps.peaks[0].needed >= (64 << 20) - os.stat(sparse).st_blocks * 512
    assert pd.peaks[0].needed < (4 << 20)


@pytest.mark.parametrize("name", ["NEWDIR/", "sub/.", "sub/.."])
def test_a_name_that_can_only_be_a_directory_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "sub").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OSError, match="names a directory"):
        save(f"{tmp_path}/{name}", b"x")  # a string: pathlib would drop the "." itself
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_ctrl_c_after_the_save_completed_says_so(tmp_path: Path) -> None:
    class CtrlCAtLastClose(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]).endswith(_names.LOCK):
                raise KeyboardInterrupt

    with _sys.use(CtrlCAtLastClose()), pytest.raises(KeyboardInterrupt) as info:
        save(tmp_path / "o", b"payload")
    assert (tmp_path / "o").read_bytes() == b"payload"
    assert any("had completed" in n for n in info.value.__notes__)
    close_leaked(tmp_path)
    recover(tmp_path)  # the stray lock file is garbage now
    assert leftovers(tmp_path) == []


@pytest.mark.root
def test_a_whole_file_across_two_mounts_of_one_file_system_is_moved_not_renamed(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a bind mount")
    real, bind = tmp_path / "real", tmp_path / "bind"
    real.mkdir()
    bind.mkdir()
    r = subprocess.run(["mount", "--bind", str(real), str(bind)], capture_output=True,
                       check=False)
    if r.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot bind-mount: {r.stderr!r}")
        pytest.skip(f"cannot bind-mount: {r.stderr!r}")
    try:
        data = pattern(5 * W, "b")
        (real / "src").write_bytes(data)
        out_dir = tmp_path / "out"
        out_dir.mkdir()
        # The same file system (same st_dev), but a rename from bind/ to out/ is EXDEV.
        assert os.stat(bind / "src").st_dev == os.stat(out_dir).st_dev
        report = save(out_dir / "o", Cord([FileBackedData(bind / "src", owned=True)]),
                      consume=True, window=W)
        assert [a.action for a in report.file_actions()] == ["moved"]
        assert (out_dir / "o").read_bytes() == data
        assert not (real / "src").exists()
        assert leftovers(out_dir) == []
        assert leftovers(real) == []
    finally:
        subprocess.run(["umount", str(bind)], check=False)
