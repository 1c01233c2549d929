"""The named-tensor layer shared by the formats: sizes, sub-byte types, validation."""

from __future__ import annotations

import pytest

from filecord import FileBackedData
from filecord.tensors import DType, NamedTensor, nbytes_of


def test_bits_and_sizes_of_every_dtype():
    assert {d: d.bits for d in DType} == {
        **dict.fromkeys([DType.BOOL, DType.U8, DType.I8, DType.F8_E5M2, DType.F8_E4M3,
                         DType.F8_E5M2FNUZ, DType.F8_E4M3FNUZ, DType.F8_E8M0], 8),
        **dict.fromkeys([DType.I16, DType.U16, DType.F16, DType.BF16], 16),
        **dict.fromkeys([DType.I32, DType.U32, DType.F32], 32),
        **dict.fromkeys([DType.C64, DType.F64, DType.I64, DType.U64], 64),
        DType.F4: 4, DType.F6_E2M3: 6, DType.F6_E3M2: 6,
    }
    assert nbytes_of(DType.F32, (2, 3)) == 24
    assert nbytes_of(DType.F32, ()) == 4
    assert nbytes_of(DType.F4, (3, 2)) == 3
    assert nbytes_of(DType.F6_E2M3, (4,)) == 3
    assert nbytes_of(DType.BF16, (0, 10**30)) == 0
    with pytest.raises(ValueError, match="whole bytes"):
        nbytes_of(DType.F4, (3,))


def test_named_tensor_checks_its_bytes(tmp_path):
    p = tmp_path / "d.bin"
    p.write_bytes(bytes(range(16)))
    t = NamedTensor("w", DType.I32, (2, 2), FileBackedData(p))
    assert (t.numel, t.nbytes) == (4, 16)
    assert NamedTensor("m", DType.U8, (3,), memoryview(b"abc")).nbytes == 3
    with pytest.raises(ValueError, match="needs 8 bytes"):
        NamedTensor("w", DType.F32, (2,), b"\0" * 7)
    with pytest.raises(ValueError, match="non-negative"):
        NamedTensor("w", DType.F32, (-1,), b"")
    with pytest.raises(AttributeError):
        t.name = "x"  # type: ignore[misc]
