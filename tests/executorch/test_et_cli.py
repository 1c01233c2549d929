"""``filecord inspect`` on hand-built files, through the real command line (no executorch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from et_helpers import sample_program, write_cord

from filecord.executorch import (
    NamedDataStore,
    PtdEntry,
    ScalarType,
    TensorLayout,
    build_program,
    build_ptd,
    read_pte,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "filecord.cli", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_inspect_pte_json_and_text(tmp_path: Path) -> None:
    store = NamedDataStore()
    store.add_named_data("nd", b"N" * 20, alignment=256)
    path = write_cord(build_program(sample_program(), store).pte, tmp_path / "m.pte")
    f = read_pte(path)
    assert f.header is not None
    base = f.header.segment_base_offset
    done = _inspect(str(path), "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["format"] == "pte"
    assert info["header"]["segment_base_offset"] == base
    assert [(s["file_offset"], s["size"]) for s in info["segments"]] == [
        (base, 60),
        (base + 128, 140),
        (base + 512, 20),
    ]
    assert info["constant_segment"] == {"segment_index": 0, "offsets": [0, 0, 48]}
    assert info["named_data"] == [{"key": "nd", "segment_index": 2, "size": 20}]
    assert info["delegates"][0]["location"] == "SEGMENT"
    assert info["delegates"][0]["file_offset"] == base + 128
    summary = info["summary"]
    assert summary["methods"] == [
        {"name": "forward", "inputs": ["FLOAT[3, 4]"], "outputs": ["FLOAT[3, 4]"],
         "instructions": 2, "operators": 1, "delegate_calls": 0}
    ]
    assert summary["delegates"] == {"DummyBackend": 1}
    assert summary["unparsed_delegates"] == ["DummyBackend"]
    assert summary["constant_bytes_inline"] == 60
    assert summary["named_data_in_program"] == {"keys": 1, "bytes": 20}
    assert summary["biggest_segments"][0] == {
        "index": 1, "size": 140, "file_offset": base + 128, "holds": "DummyBackend delegate payload"
    }
    text = _inspect(str(path)).stdout
    assert "    forward(FLOAT[3, 4]) -> FLOAT[3, 4]: 2 instructions, 1 operators" in text
    assert f"  big: segment 1, 140 bytes at {base + 128}: DummyBackend delegate payload" in text
    assert "bytes, +512 from the base" not in text  # the full layout only with --verbose
    verbose = _inspect(str(path), "--verbose").stdout
    assert verbose.startswith(text.rsplit("  (the full layout", 1)[0])
    assert f"[2] bytes {base + 512}..{base + 532} (20 bytes, +512 from the base)" in verbose
    assert "DummyBackend: SEGMENT 1 (140 bytes at" in verbose
    assert "    nd -> segment 2 (20 bytes)" in verbose


def test_inspect_ptd_and_errors(tmp_path: Path) -> None:
    layout = TensorLayout.contiguous(ScalarType.FLOAT, (3, 4))
    path = write_cord(build_ptd([PtdEntry("w", bytes(48), layout)]), tmp_path / "d.ptd")
    info = json.loads(_inspect(str(path), "--json").stdout)
    assert info["entries"] == [
        {
            "key": "w",
            "segment_index": 0,
            "size": 48,
            "layout": {"scalar_type": "FLOAT", "sizes": [3, 4], "dim_order": [0, 1]},
        }
    ]
    text = _inspect(str(path)).stdout.splitlines()
    assert text[1:3] == ["  1 keys in 1 segments, 48 bytes of data", "    w  48 bytes  FLOAT[3, 4]"]
    broken = tmp_path / "broken.ptd"
    broken.write_bytes(path.read_bytes()[:-1])
    done = _inspect(str(broken))
    assert done.returncode != 0
    assert "FH01.segment_data_size at offset 40" in done.stderr
    other = tmp_path / "other.bin"
    other.write_bytes(b"not an executorch file")
    assert _inspect(str(other)).returncode != 0


def test_long_offset_lists_are_collapsed_in_text() -> None:
    from filecord.cli.executorch import _few

    assert _few(list(range(8))) == "[0, 1, 2, 3, 4, 5, 6, 7]"
    assert _few(list(range(300))) == "[0, 1, 2, 3, 4, 5, 6, 7, ... 300 in all]"
