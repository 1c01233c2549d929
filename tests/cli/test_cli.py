"""The command line as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from filecord import __version__
from filecord.cli import demo as _cli_demo_model
from filecord.cli import parse_size

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "filecord.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=600,
        check=False,
    )


def test_python_dash_m_filecord_is_the_command(tmp_path: Path) -> None:
    """``python -m filecord`` behaves as ``filecord``: same version line, and a real
    subcommand (pack) writes the same bytes as through ``python -m filecord.cli``."""
    (tmp_path / "a.bin").write_bytes(b"abc" * 1000)
    outs = []
    for module in ("filecord", "filecord.cli"):
        v = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                           text=True, env=ENV, timeout=60, check=False)
        assert (v.returncode, v.stdout.strip()) == (0, f"filecord {__version__}")
        out = tmp_path / f"{module}.bin"
        r = subprocess.run([sys.executable, "-m", module, "pack", "-o", str(out),
                            str(tmp_path / "a.bin"), "-q"], capture_output=True, text=True,
                           env=ENV, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert len(outs[0]) >= 3000


def test_version_and_help() -> None:
    v = run("--version")
    assert v.returncode == 0
    assert v.stdout.strip() == f"filecord {__version__}"
    h = run("--help")
    assert h.returncode == 0
    for cmd in ("demo", "recover"):
        assert cmd in h.stdout
    bare = run()
    assert bare.returncode == 2
    assert "usage:" in bare.stdout


def test_bad_size_is_a_usage_error() -> None:
    r = run("demo", "--size", "lots")
    assert r.returncode == 2
    assert "not a size" in r.stderr


@pytest.mark.parametrize(
    ("text", "n"), [("4096", 4096), ("1KiB", 1024), ("2M", 2_000_000), ("1.5GiB", 3 << 29)]
)
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_demo_small_completes_verifies_and_cleans_up(tmp_path: Path) -> None:
    r = run("demo", "--size", "6MiB", "--pieces", "3", "--window", "1MiB", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "all output bytes verified" in r.stdout
    lines = r.stdout.splitlines()
    header = lines[1].split("  ")
    assert [c.strip() for c in header if c.strip()] == [
        "save", "time", "peak disk (x data)", "added peak RSS", "bytes by action", "verified"]
    assert any(line.startswith("by copy ") and "2.00" in line for line in lines)
    assert any(line.startswith("consume=True ") and "moved" in line for line in lines)
    assert any(line.startswith("peak disk (x data): the most disk") for line in lines)
    assert os.listdir(tmp_path) == []  # nothing left behind
    if _cli_demo_model.available():
        assert any(line.startswith("model: ") and "matches PyTorch" in line for line in lines)


def test_demo_json(tmp_path: Path) -> None:
    r = run("demo", "--size", "2MiB", "--json", "--dir", str(tmp_path), "--window", "1MiB",
            "--no-model")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verified"] is True
    modes = {run_["mode"]: run_ for run_ in doc["runs"]}
    assert modes["copy"]["report"]["bytes_by_action"]["copied"] == 2 << 20
    # Every engine's bytes are moved, or (where the file system inserts ranges) the largest
    # at a block-aligned offset is adopted in place and the others moved.
    by_action = modes["consume"]["report"]["bytes_by_action"]
    assert by_action["moved"] + by_action.get("adopted", 0) == 2 << 20
    # Copy holds sources and output at once; a move never holds much more than the data.
    assert modes["copy"]["peak_disk_over_data"] >= 1.99
    assert modes["consume"]["peak_disk_over_data"] <= 1.0 + (1 << 20) / (2 << 20) + 0.05
    assert doc["model"] is None


def _killed_consuming_save(d: Path, op: str, suffix: str, nth: int = 1) -> None:
    """A consuming save of a.bin into out.bin in d, SIGKILLed right before its ``nth`` ``op``
    whose first argument ends with ``suffix``."""
    import signal

    from filecord import Cord, FileBackedData, save
    from filecord._io import syscalls as _sys
    from support.killjob import fork_run

    (d / "a.bin").write_bytes(b"A" * 10_000)
    cord = Cord([b"hdr", FileBackedData(d / "a.bin", owned=True)])

    class Kill(_sys.Backend):
        n = 0

        def hook(self, name: str, args: tuple[object, ...]) -> None:
            if name == op and str(args[0]).endswith(suffix):
                self.n += 1
                if self.n == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

    def job() -> None:
        with _sys.use(Kill()):
            save(d / "out.bin", cord, consume=True, window=4096)

    assert fork_run(job) == -signal.SIGKILL


def test_recover_says_a_held_lock_may_be_another_recovers(tmp_path: Path) -> None:
    """A dead save's lock held by another recover: skipped, and the words never say only that
    the save is running (a person would wait for a save that is gone)."""
    import fcntl

    from filecord._io import names as _names

    _killed_consuming_save(tmp_path, "ftruncate", "", 2)  # mid-move, before its first cut
    (lock,) = [p for p in tmp_path.iterdir() if p.name.endswith(_names.LOCK)]
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a recover at work holds
        r = run("recover", str(tmp_path))
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr
    assert "skipped" in r.stdout
    assert "another recover" in r.stdout, r.stdout
    r = run("recover", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "rolled back" in r.stdout
    assert sorted(os.listdir(tmp_path)) == ["a.bin"]
    assert (tmp_path / "a.bin").read_bytes() == b"A" * 10_000


def test_recover_calls_a_lock_left_by_a_save_that_ended_what_it_is(tmp_path: Path) -> None:
    """Killed between removing its journal and its lock file, the save had completed: its
    left-over lock is removed, and never called that of a save that died before its journal."""
    from filecord._io import names as _names

    _killed_consuming_save(tmp_path, "unlink", _names.LOCK)
    assert sorted(p.name.endswith(_names.LOCK) for p in tmp_path.iterdir()) == [
        False, True]  # out.bin and the lock file
    r = run("recover", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "died before its journal" not in r.stdout, r.stdout
    assert "the save had ended" in r.stdout, r.stdout
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]
    assert (tmp_path / "out.bin").read_bytes() == b"hdr" + b"A" * 10_000


def test_recover_on_a_clean_directory(tmp_path: Path) -> None:
    r = run("recover", str(tmp_path))
    assert r.returncode == 0
    assert "nothing to recover" in r.stdout
    missing = run("recover", str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert "No such file" in missing.stderr
