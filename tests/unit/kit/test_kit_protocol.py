"""The format protocol: one registration per format, capability flags that match what each
can do, sniffing by content (never blocking on a FIFO), unsupported operations named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from filecord import save
from filecord._formats import FORMATS, able_to, sniff
from filecord._kit.protocol import Capability, Format
from filecord.executorch import PtdEntry, ScalarType, TensorLayout, build_ptd
from filecord.gguf import GGMLType, GGUFTensor, build_gguf
from filecord.safetensors import DType, NamedTensor, build_file


def test_every_format_is_registered_once_and_implements_the_protocol() -> None:
    names = [f.name for f in FORMATS]
    assert names == ["executorch-pte", "executorch-ptd", "safetensors", "gguf"]
    for f in FORMATS:
        assert isinstance(f, Format)


def test_capabilities() -> None:
    assert [f.name for f in able_to(Capability.MERGE)] == ["executorch-ptd", "safetensors",
                                                           "gguf"]
    assert [f.name for f in able_to(Capability.RESHARD)] == ["safetensors", "gguf"]
    assert [f.name for f in able_to(Capability.READ)] == [f.name for f in FORMATS]


def _files(tmp_path: Path) -> dict[str, Path]:
    layout = TensorLayout(ScalarType.BYTE, (1,), (0,))
    out = {"executorch-ptd": tmp_path / "a.ptd", "safetensors": tmp_path / "a.safetensors",
           "gguf": tmp_path / "a.gguf"}
    save(out["executorch-ptd"], build_ptd([PtdEntry("k", b"x", layout, 1)]))
    save(out["safetensors"], build_file([NamedTensor("t", DType.U8, (1,), b"x")], None))
    save(out["gguf"], build_gguf([], [GGUFTensor("t", GGMLType.I8, (1,), b"x")]))
    return out


def test_sniff_by_content_whatever_the_name(tmp_path: Path) -> None:
    for name, path in _files(tmp_path).items():
        renamed = path.with_name(f"{name}.bin")
        path.rename(renamed)
        found = sniff(renamed)
        assert found is not None
        assert found.name == name
    (tmp_path / "junk").write_bytes(b"not a model at all")
    assert sniff(tmp_path / "junk") is None
    assert sniff(tmp_path / "missing") is None


def test_sniff_an_index(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"metadata": {}, "weight_map": {"t": "a.safetensors"}}')
    found = sniff(index)
    assert found is not None
    assert found.name == "safetensors"


def test_sniff_never_opens_a_fifo_for_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    assert sniff(fifo) is None


def test_what_a_format_lacks_is_named(tmp_path: Path) -> None:
    pte = FORMATS[0]
    assert Capability.MERGE not in pte.capabilities
    with pytest.raises(NotImplementedError, match="executorch-pte has no merge"):
        pte.merge(tmp_path / "o.pte", [tmp_path / "a.pte"])


def test_registrations_run_the_packages_operations(tmp_path: Path) -> None:
    files = _files(tmp_path)
    for f in able_to(Capability.MERGE):
        src = files[f.name]
        out = tmp_path / f"merged{src.suffix}"
        report = f.merge(out, [src], dry_run=True)
        assert report.dry_run
        assert not out.exists()
        f.merge(out, [src])
        assert f.sniff(out)
        assert f.read(out) is not None
