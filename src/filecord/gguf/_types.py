"""GGUF value types, ggml tensor types, key-values and tensors: pure values, no I/O.

A :class:`GGUFTensor` is the GGUF view of the shared named-tensor layer (:mod:`filecord.tensors`):
a name, a ggml type, dims in ggml order (``ne``, innermost first: the reverse of the numpy or
safetensors shape) and the same :data:`~filecord.tensors.TensorBytes`.  Types that have a dense
:class:`~filecord.tensors.DType` convert both ways with :meth:`GGUFTensor.to_named` and
:meth:`GGUFTensor.from_named`, bytes untouched; block-quantized types exist only here.
"""

from __future__ import annotations

import array
import enum
from dataclasses import dataclass, field
from typing import Any, Union

from filecord._pieces.cord import Cord
from filecord.tensors import DType, NamedTensor, TensorBytes

# A tensor's bytes: one piece, or (rows reordered, as Q/K for llama.cpp) a Cord of file ranges.
GGUFBytes = Union[TensorBytes, Cord]  # noqa: UP007 - a runtime alias on 3.10

DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME, counting the terminating NUL: names have at most 63 bytes
MAX_STRING = 1 << 30  # ggml's loader refuses longer strings
MAX_ARRAY = 1 << 30  # ... and arrays with more elements
I64_MAX = (1 << 63) - 1
ALIGNMENT_KEY = "general.alignment"
ARCH_KEY = "general.architecture"
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)


class ValueType(enum.IntEnum):
    """Key-value types, by their code in the file."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and size of the fixed-size value types
SCALAR_FORMATS: dict[ValueType, str] = {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.FLOAT32: "f", ValueType.BOOL: "B",
    ValueType.UINT64: "Q", ValueType.INT64: "q", ValueType.FLOAT64: "d",
}
SCALAR_SIZES: dict[ValueType, int] = {
    ValueType.UINT8: 1, ValueType.INT8: 1, ValueType.UINT16: 2, ValueType.INT16: 2,
    ValueType.UINT32: 4, ValueType.INT32: 4, ValueType.FLOAT32: 4, ValueType.BOOL: 1,
    ValueType.UINT64: 8, ValueType.INT64: 8, ValueType.FLOAT64: 8,
}

Scalar = Union[int, float, bool, str, bytes]  # noqa: UP007 - a runtime alias on 3.10
# arrays: a tuple (strings, and what writers are given) or an ``array.array`` (numbers and bools
# read from a file, kept packed so a hostile array costs no more memory than its bytes)
Value = Union[Scalar, tuple[Scalar, ...], "array.array[Any]"]


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key-value.  ``sub_type`` is the element type of an array (``None`` otherwise).

    Arrays read from a file are tuples of ``str`` or packed ``array.array`` of numbers (bools
    as 0/1).  Strings read from a file are ``str`` (bytes that are not UTF-8 decode with
    ``surrogateescape``, so they are written back unchanged); a writer also takes ``bytes``.
    ``encoded``, set by the reader, is the record's exact bytes (key, type, value): rewriting a
    file reuses them, so every value (NaN payloads included) passes through unchanged.
    """

    key: str
    type: ValueType
    value: Value
    sub_type: ValueType | None = None
    encoded: bytes | None = field(default=None, repr=False, compare=False)


class GGMLType(enum.IntEnum):
    """ggml tensor types by id (retired ids 4, 5, 31-33, 36-38 are absent)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42

    @property
    def block(self) -> tuple[int, int]:
        """(elements per block, bytes per block)."""
        return BLOCKS[self]


BLOCKS: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 40), GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144), GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292), GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98), GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110), GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56), GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17), GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18), GGMLType.Q2_0: (64, 18),
}

# ggml types whose elements are a dense DType of the shared layer (bytes pass through)
DENSE: dict[GGMLType, DType] = {
    GGMLType.F32: DType.F32, GGMLType.F16: DType.F16, GGMLType.BF16: DType.BF16,
    GGMLType.F64: DType.F64, GGMLType.I8: DType.I8, GGMLType.I16: DType.I16,
    GGMLType.I32: DType.I32, GGMLType.I64: DType.I64,
}
GGML_OF: dict[DType, GGMLType] = {d: g for g, d in DENSE.items()}


def pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def tensor_nbytes(t: GGMLType, dims: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``dims`` (ggml order); ``ValueError`` when ``ne0`` is not whole
    blocks.  A 0-d tensor is one element."""
    blck, size = BLOCKS[t]
    ne0 = dims[0] if dims else 1
    if ne0 % blck:
        raise ValueError(f"ne0={ne0} is not a multiple of the {t.name} block size {blck}")
    n = ne0 // blck * size
    for d in dims[1:]:
        n *= d
    return n


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor: ``name``, ggml ``type``, ``dims`` (ggml ``ne`` order) and its bytes."""

    name: str
    type: GGMLType
    dims: tuple[int, ...]
    data: GGUFBytes = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.dims):
            raise ValueError(f"{self.name!r}: dims {self.dims} must hold non-negative ints")
        n = tensor_nbytes(self.type, self.dims)
        if len(self.data) != n:
            raise ValueError(f"{self.name!r}: {self.type.name}{list(self.dims)} needs {n} bytes, "
                             f"the data has {len(self.data)}")

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy/safetensors shape: ``dims`` reversed."""
        return tuple(reversed(self.dims))

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.type, self.dims)

    def to_named(self) -> NamedTensor:
        """The shared-layer tensor (dense types only; ``ValueError`` for block types)."""
        dtype = DENSE.get(self.type)
        if dtype is None:
            raise ValueError(f"{self.name!r}: {self.type.name} has no dense dtype")
        if isinstance(self.data, Cord):
            raise ValueError(f"{self.name!r}: reordered rows are no single range")
        return NamedTensor(self.name, dtype, self.shape, self.data)

    @classmethod
    def from_named(cls, t: NamedTensor) -> GGUFTensor:
        """Same bytes, dims reversed; ``ValueError`` when GGUF has no type for the dtype."""
        gt = GGML_OF.get(t.dtype)
        if gt is None:
            raise ValueError(f"{t.name!r}: GGUF has no type for {t.dtype.value}")
        return cls(t.name, gt, tuple(reversed(t.shape)), t.data)
