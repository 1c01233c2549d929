"""GGUF (files, and split sets as gguf-split writes them) through the conformance suite."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conformance import Conformance

from filecord import cli
from filecord.gguf import read_gguf

gguf = pytest.importorskip("gguf")


class TestGGUF(Conformance):
    fmt = "gguf"
    suffix = ".gguf"

    def write(self, path: Path, ts: dict[str, np.ndarray]) -> None:
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_string("general.name", "conformance")
        for name, a in ts.items():
            w.add_tensor(name, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def write_set(
        self, directory: Path, ts: dict[str, np.ndarray]
    ) -> tuple[list[Path], list[Path]]:
        directory.mkdir(parents=True, exist_ok=True)
        single = directory / "model.gguf"
        self.write(single, ts)
        assert cli.main(["reshard", str(single), "-o", str(directory), "--max-tensors", "2",
                         "--consume", "-q"]) == 0
        shards = sorted(directory.glob("model-*-of-*.gguf"))
        assert len(shards) >= 2
        assert not single.exists()
        return [shards[0]], shards

    def set_after_rewrite(self, inputs: list[Path], outdir: Path) -> list[Path]:
        firsts = sorted(outdir.glob("model-00001-of-*.gguf"))
        assert len(firsts) == 1, firsts  # the consumed set is gone, not left beside the new one
        return firsts

    def read(self, path: Path) -> object:
        return read_gguf(path)

    def header_end(self, data: bytes) -> int:
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(data)
            f.flush()
            return int(read_gguf(f.name).shards[0].data_start)

    def giants(self, data: bytes) -> dict[str, bytes]:
        def at(offset: int) -> bytes:
            return data[:offset] + struct.pack("<Q", 1 << 62) + data[offset + 8:]

        return {"tensor count": at(8), "key-value count": at(16), "first key's length": at(24)}

    def with_name_bytes(self, data: bytes, old: str, new: bytes) -> bytes:
        field = struct.pack("<Q", len(old)) + old.encode()
        end = self.header_end(data)
        assert data[:end].count(field) == 1
        assert len(new) == len(old)
        return data[:end].replace(field, struct.pack("<Q", len(new)) + new) + data[end:]
