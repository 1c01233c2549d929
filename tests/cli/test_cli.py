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


def test_recover_on_a_clean_directory(tmp_path: Path) -> None:
    r = run("recover", str(tmp_path))
    assert r.returncode == 0
    assert "nothing to recover" in r.stdout
    missing = run("recover", str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert "No such file" in missing.stderr
