"""safetensors (files, and checkpoints sharded with an index) through the conformance suite."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conformance import Conformance

from filecord.safetensors import read_safetensors

st_numpy = pytest.importorskip("safetensors.numpy")


class TestSafetensors(Conformance):
    fmt = "safetensors"
    suffix = ".safetensors"

    def write(self, path: Path, ts: dict[str, np.ndarray]) -> None:
        st_numpy.save_file(ts, str(path), metadata={"format": "pt"})

    def write_set(
        self, directory: Path, ts: dict[str, np.ndarray]
    ) -> tuple[list[Path], list[Path]]:
        directory.mkdir(parents=True, exist_ok=True)
        names = list(ts)
        parts = [names[: len(names) // 2], names[len(names) // 2:]]
        shards: list[Path] = []
        weight_map: dict[str, str] = {}
        for i, part in enumerate(parts):
            shard = directory / f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            self.write(shard, {n: ts[n] for n in part})
            weight_map.update(dict.fromkeys(part, shard.name))
            shards.append(shard)
        index = directory / "model.safetensors.index.json"
        total = sum(a.nbytes for a in ts.values())
        index.write_text(json.dumps({"metadata": {"total_size": total},
                                     "weight_map": weight_map}))
        return [index], [index, *shards]

    def read(self, path: Path) -> object:
        return read_safetensors(path)

    def header_end(self, data: bytes) -> int:
        return 8 + int(struct.unpack_from("<Q", data)[0])

    def giants(self, data: bytes) -> dict[str, bytes]:
        header = json.dumps({"x": {"dtype": "F32", "shape": [1 << 31, 1 << 31],
                                   "data_offsets": [0, 1 << 64 - 2]}}).encode()
        return {
            "header length": struct.pack("<Q", 1 << 62) + data[8:],
            "shape and offsets": struct.pack("<Q", len(header)) + header + b"\0" * 64,
            "header length past the file": struct.pack("<Q", len(data)) + data[8:],
        }

    def with_name_bytes(self, data: bytes, old: str, new: bytes) -> bytes:
        end = self.header_end(data)
        assert data[8:end].count(old.encode()) == 1
        assert len(new) == len(old)
        return data[:8] + data[8:end].replace(old.encode(), new) + data[end:]

    def convert_args(self, inputs: list[Path], out_dir: Path) -> list[str] | None:
        return ["convert", str(inputs[0]), "-o", str(out_dir / "c.ptd")]
