"""ExecuTorch data files (.ptd) through the conformance suite.  A set of them is several files
given together (a .ptd has no index); ``verify --no-runtime`` against the runtime on malformed
programs is in ``test_pte.py``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from conformance import Conformance

from filecord import save
from filecord.executorch import PtdEntry, ScalarType, TensorLayout, build_ptd, read_ptd


class TestPtd(Conformance):
    fmt = "ptd"
    suffix = ".ptd"

    def write(self, path: Path, ts: dict[str, np.ndarray]) -> None:
        entries = [PtdEntry(name, a.tobytes(),
                            TensorLayout.contiguous(ScalarType.FLOAT, a.shape), 16)
                   for name, a in ts.items()]
        save(path, build_ptd(entries))

    def write_set(
        self, directory: Path, ts: dict[str, np.ndarray]
    ) -> tuple[list[Path], list[Path]]:
        directory.mkdir(parents=True, exist_ok=True)
        names = list(ts)
        files = []
        for i in range(3):
            part = names[i::3]
            path = directory / f"part{i}.ptd"
            self.write(path, {n: ts[n] for n in part})
            files.append(path)
        return files, files

    def read(self, path: Path) -> object:
        return read_ptd(path)

    def header_end(self, data: bytes) -> int:
        fb_offset, fb_size = struct.unpack_from("<QQ", data, 16)
        return min(len(data), fb_offset + fb_size)

    def giants(self, data: bytes) -> dict[str, bytes]:
        def at(offset: int) -> bytes:
            return data[:offset] + struct.pack("<Q", 1 << 62) + data[offset + 8:]

        return {"flatbuffer size": at(24), "segment base": at(32), "segment data size": at(40)}

    def with_name_bytes(self, data: bytes, old: str, new: bytes) -> bytes:
        end = self.header_end(data)
        assert data[:end].count(old.encode()) == 1
        assert len(new) == len(old)
        return data[:end].replace(old.encode(), new) + data[end:]

    def rewrite_args(self, inputs: list[Path], outdir: Path) -> list[str] | None:
        return None

    def convert_args(self, inputs: list[Path], out_dir: Path) -> list[str] | None:
        return ["convert", str(inputs[0]), "-o", str(out_dir / "c.safetensors")]
