"""Attacks from outside on consuming saves and ``filecord recover`` (README, docs/guarantees.md,
``convert``/``recover``/``pack --help``): SIGKILL at chosen system calls (``strace -e inject``)
of ``filecord convert --consume`` (Hugging Face -> GGUF, ``--outtype f16``, a sharded checkpoint
with its index) and of a save that adopts a source in place (a file whole at offset 4096 of
the output on ext4), then ``filecord recover`` on every directory involved.  Each
``xfail(strict=True)`` test is a finding that fails today; the plain tests are controls that
held."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
ADOPT = """
import sys
from pathlib import Path
from filecord import Cord, FileBackedData, save
src, out = Path(sys.argv[1]), Path(sys.argv[2])
save(out, Cord([b"H" * 4096, FileBackedData(src, owned=True), b"T" * 10]), consume=True)
"""
DATA = bytes(range(256)) * 4096 * 3 + b"xyz"  # 3 MiB + 3: whole at offset 4096, unaligned end
MTIME = 1_000_000_000


def _strace() -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")


def killed(args: list[str], syscall: str, n: int) -> int:
    _strace()
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e",
                        f"inject={syscall}:signal=SIGKILL:when={n}", sys.executable, *args],
                       capture_output=True, text=True, env=ENV, timeout=120, check=False)
    return r.returncode


def recover(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(path)],
                          capture_output=True, text=True, env=ENV, timeout=60, check=False)


def adopt_setup(tmp_path: Path) -> tuple[Path, Path]:
    s, o = tmp_path / "s", tmp_path / "o"
    s.mkdir()
    o.mkdir()
    (s / "src.bin").write_bytes(DATA)
    os.utime(s / "src.bin", (MTIME, MTIME))
    return s / "src.bin", o / "out.bin"


def kill_adopt(tmp_path: Path, syscall: str, n: int) -> tuple[Path, Path]:
    src, out = adopt_setup(tmp_path)
    assert killed(["-c", ADOPT, str(src), str(out)], syscall, n) != 0
    return src, out


# ---------------------------------------------------------------------------------- findings


# The source was renamed onto the output's temp but nothing was inserted yet (SIGKILL at the 3rd
# fallocate); a new file then took the source's name.  recover refuses (right) and says the
# bytes are "at offset 4096" of the temp, but the temp is the source unshifted: they sit at 0.
@pytest.mark.xfail(strict=True, reason="attack: recover's refusal after an in-place adoption "
                   "killed before the insert names the wrong offset (4096, not 0) of the bytes")
def test_attack_refusal_names_wrong_offset_of_adopted_bytes(tmp_path: Path) -> None:
    src, out = kill_adopt(tmp_path, "fallocate", 3)
    src.write_bytes(b"NEW")
    r = recover(out.parent)
    assert r.returncode == 1, r.stderr
    where = re.search(r"is at (\S+) \(at offset (\d+)\)", r.stderr)
    assert where is not None, r.stderr
    temp, offset = Path(where.group(1)), int(where.group(2))
    held = temp.read_bytes()
    assert held[offset:offset + len(DATA)] == DATA, (offset, len(held))


# ---------------------------------------------------------------------------------- controls


@pytest.mark.parametrize(("syscall", "n"), [("fallocate", 3), ("fsync", 6), ("rename", 3)])
def test_control_kill_during_in_place_adoption_rolls_back(tmp_path: Path, syscall: str,
                                                          n: int) -> None:
    src, out = kill_adopt(tmp_path, syscall, n)
    for _ in range(2):  # recover is idempotent
        for d in (out.parent, src.parent):
            r = recover(d)
            assert r.returncode == 0, r.stderr
    assert os.listdir(out.parent) == []
    assert os.listdir(src.parent) == ["src.bin"]
    assert src.read_bytes() == DATA
    assert os.stat(src).st_mtime == MTIME
