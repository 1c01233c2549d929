"""Progress: the library reports through a callback; the CLI draws bars only on a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, save
from filecord_testing import pattern

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
for var in ("TQDM_DISABLE", "FILECORD_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS"):
    ENV.pop(var, None)


@pytest.mark.parametrize("consume", [False, True])
def test_callback_is_monotonic_and_reaches_the_total(tmp_path: Path, consume: bool) -> None:
    src = tmp_path / "src"
    src.write_bytes(pattern(3 << 20))
    cord = Cord([b"h" * 100, FileBackedData(src, owned=consume), pattern(20_000, "t")])
    calls: list[tuple[int, int]] = []
    save(tmp_path / "o", cord, consume=consume, window=1 << 20,
         progress=lambda done, total: calls.append((done, total)))
    assert calls
    assert {t for _d, t in calls} == {len(cord)}
    dones = [d for d, _t in calls]
    assert dones == sorted(dones)
    assert dones[-1] == len(cord)


def _pack_stderr(tmp_path: Path, *, tty: bool, extra_env: dict[str, str] | None = None) -> str:
    (tmp_path / "a.bin").write_bytes(pattern(4 << 20))
    out = tmp_path / f"out{tty}{len(extra_env or {})}.ptd"
    env = {**ENV, **(extra_env or {})}
    cmd = [sys.executable, "-m", "filecord.cli", "pack", "-o", str(out), str(tmp_path / "a.bin")]
    if not tty:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60,
                              check=True)
        return proc.stderr
    master, slave = pty.openpty()
    # A new pty is 0 columns wide, and tqdm draws nothing in no columns: give it a size.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc2 = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _w, _x = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc2.wait(timeout=60)
    os.close(master)
    assert proc2.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_bar_on_a_terminal_and_silence_elsewhere(tmp_path: Path) -> None:
    pytest.importorskip("tqdm", reason="the cli extra (tqdm) is not installed")
    on_tty = _pack_stderr(tmp_path, tty=True)
    assert "pack out" in on_tty
    assert "/4.00M" in on_tty  # a byte bar over the 4 MiB total, in binary units
    assert _pack_stderr(tmp_path, tty=False) == ""
    assert "pack out" not in _pack_stderr(tmp_path, tty=True, extra_env={"TQDM_DISABLE": "1"})
