"""safetensors dtypes <-> ExecuTorch scalar types (for ``convert``), pure."""

from __future__ import annotations

from filecord.executorch.values import ScalarType
from filecord.safetensors.errors import UnrepresentableError
from filecord.tensors import DType, NamedTensor

TO_SCALAR: dict[DType, ScalarType] = {
    DType.BOOL: ScalarType.BOOL, DType.U8: ScalarType.BYTE, DType.I8: ScalarType.CHAR,
    DType.I16: ScalarType.SHORT, DType.I32: ScalarType.INT, DType.I64: ScalarType.LONG,
    DType.F16: ScalarType.HALF, DType.F32: ScalarType.FLOAT, DType.F64: ScalarType.DOUBLE,
    DType.BF16: ScalarType.BFLOAT16, DType.U16: ScalarType.UINT16, DType.U32: ScalarType.UINT32,
    DType.U64: ScalarType.UINT64, DType.F8_E5M2: ScalarType.FLOAT8E5M2,
    DType.F8_E4M3: ScalarType.FLOAT8E4M3FN, DType.F8_E5M2FNUZ: ScalarType.FLOAT8E5M2FNUZ,
    DType.F8_E4M3FNUZ: ScalarType.FLOAT8E4M3FNUZ,
}
FROM_SCALAR: dict[ScalarType, DType] = {v: k for k, v in TO_SCALAR.items()}


def scalar_type_of(t: NamedTensor) -> ScalarType:
    st = TO_SCALAR.get(t.dtype)
    if st is None:
        raise UnrepresentableError(f"{t.name!r}: ExecuTorch has no scalar type for "
                                   f"{t.dtype.value}")
    return st


def safetensors_dtype_of(name: str, st: ScalarType) -> DType:
    code = FROM_SCALAR.get(st)
    if code is None:
        raise UnrepresentableError(f"{name!r}: safetensors has no dtype for {st.name}")
    return code
