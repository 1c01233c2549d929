"""Value types shared by the data file, the store and the program: scalar types, tensor layouts,
segments and named entries."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from filecord._pieces.data import FileBackedData
from filecord.executorch._fbschema import Table
from filecord.executorch.schema import flat_tensor_table


class ScalarType(enum.IntEnum):
    """ExecuTorch's element types, with the values its schemas store."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29


@dataclass(frozen=True, slots=True)
class TensorLayout:
    """Scalar type, sizes and dim order of a tensor stored as named data.

    The runtime compares these with the program's Tensor before using external data, so they
    must match it exactly; ``dim_order`` must be a permutation of ``range(len(sizes))``.
    """

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "scalar_type", ScalarType(self.scalar_type))
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        object.__setattr__(self, "dim_order", tuple(int(d) for d in self.dim_order))
        if any(s < 0 or s >= 1 << 31 for s in self.sizes):
            raise ValueError(f"sizes must be non-negative 32-bit integers, got {self.sizes}")
        if sorted(self.dim_order) != list(range(len(self.sizes))):
            raise ValueError(
                f"dim_order {self.dim_order} is not a permutation of range({len(self.sizes)})"
            )

    @classmethod
    def contiguous(cls, scalar_type: ScalarType, sizes: tuple[int, ...]) -> TensorLayout:
        return cls(scalar_type, tuple(sizes), tuple(range(len(sizes))))

    def to_table(self) -> Table:
        return flat_tensor_table(
            "TensorLayout",
            scalar_type=int(self.scalar_type),
            sizes=self.sizes,
            dim_order=self.dim_order,
        )

    @classmethod
    def from_table(cls, t: Table) -> TensorLayout:
        return cls(ScalarType(t["scalar_type"]), t["sizes"] or (), t["dim_order"] or ())


Blob = bytes | FileBackedData
"""The bytes of one segment or key: in memory, or a range of a file (never loaded)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment of a ``.pte`` or ``.ptd`` as read: ``offset`` is relative to the segment
    base, ``file_offset`` to the file, ``data`` the file-backed range that holds it."""

    index: int
    offset: int
    size: int
    file_offset: int
    data: FileBackedData = field(repr=False)


@dataclass(frozen=True, slots=True)
class PtdEntry:
    """One key of a data file.

    ``data`` is the entry's bytes (a file-backed range when read from a file; entries that
    share a segment share the same object).  ``segment_index`` is where a reader found it
    (ignored when building), ``alignment`` what a writer must align it to.
    """

    key: str
    data: Blob = field(repr=False)
    layout: TensorLayout | None = None
    alignment: int = 1
    segment_index: int | None = None

    @property
    def size(self) -> int:
        return len(self.data)
