"""Named tensors shared by the formats: a name, a dtype, a shape and the bytes.

The bytes are in memory (``bytes``/``memoryview``) or a :class:`~filecord.FileBackedData`
range that is never loaded.  safetensors uses these values directly; the ExecuTorch ``.ptd``
code and the GGUF reader map their own element types onto :class:`DType`.  Pure: no I/O.

Bytes are always row-major (C order), the layout every one of these formats stores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from filecord._pieces.data import FileBackedData

TensorBytes = Union[bytes, memoryview, FileBackedData]  # noqa: UP007 - a runtime alias on 3.10


class DType(enum.Enum):
    """Element types, named by their safetensors codes (the most widely used spelling)."""

    BOOL = "BOOL"
    U8 = "U8"
    I8 = "I8"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E5M2FNUZ = "F8_E5M2FNUZ"
    F8_E4M3FNUZ = "F8_E4M3FNUZ"
    F8_E8M0 = "F8_E8M0"
    I16 = "I16"
    U16 = "U16"
    F16 = "F16"
    BF16 = "BF16"
    I32 = "I32"
    U32 = "U32"
    F32 = "F32"
    C64 = "C64"
    F64 = "F64"
    I64 = "I64"
    U64 = "U64"
    F4 = "F4"
    F6_E2M3 = "F6_E2M3"
    F6_E3M2 = "F6_E3M2"

    @property
    def bits(self) -> int:
        """Bits per element (4 and 6 for the packed sub-byte float types)."""
        return _BITS[self]


_BITS: dict[DType, int] = {
    DType.BOOL: 8, DType.U8: 8, DType.I8: 8, DType.F8_E5M2: 8, DType.F8_E4M3: 8,
    DType.F8_E5M2FNUZ: 8, DType.F8_E4M3FNUZ: 8, DType.F8_E8M0: 8,
    DType.I16: 16, DType.U16: 16, DType.F16: 16, DType.BF16: 16,
    DType.I32: 32, DType.U32: 32, DType.F32: 32,
    DType.C64: 64, DType.F64: 64, DType.I64: 64, DType.U64: 64,
    DType.F4: 4, DType.F6_E2M3: 6, DType.F6_E3M2: 6,
}


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def nbytes_of(dtype: DType, shape: tuple[int, ...]) -> int:
    """Bytes of a dense tensor; ``ValueError`` when sub-byte elements do not fill whole bytes."""
    bits = numel(shape) * dtype.bits
    if bits % 8:
        raise ValueError(f"{numel(shape)} elements of {dtype.value} do not fill whole bytes")
    return bits // 8


@dataclass(frozen=True, slots=True)
class NamedTensor:
    """One tensor: ``name``, ``dtype``, ``shape`` and exactly ``nbytes`` bytes of ``data``."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    data: TensorBytes = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.shape):
            raise ValueError(f"{self.name!r}: shape {self.shape} must hold non-negative ints")
        if len(self.data) != self.nbytes:
            raise ValueError(
                f"{self.name!r}: {self.dtype.value}{list(self.shape)} needs {self.nbytes} "
                f"bytes, the data has {len(self.data)}"
            )

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.dtype, self.shape)
