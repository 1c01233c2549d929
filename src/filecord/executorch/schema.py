"""Schema tools: our own field tables for ExecuTorch's two schemas, the program (``ET12``) and
the data file (``FT01``), the tables built from them (``program_table``, ``flat_tensor_table``,
:class:`Table`) and the Program flatbuffer encoder (``encode_program``).

Fields are listed in declaration order, which fixes both their slot ids and the order in which
the encoder builds them (see ``_fbwrite``).  The two force-aligned byte vectors carry an
``align_key`` naming the configured alignment that replaces the schema's default of 16.
"""

from __future__ import annotations

from typing import Any

from filecord.executorch import _fbwrite
from filecord.executorch._fbschema import (
    BOOL,
    F64,
    I8,
    I32,
    I64,
    U8,
    U32,
    U64,
    Schema,
    Table,
    TableSpec,
    aligned_bytes,
    scalar,
    string,
    table,
    tables,
    union,
    vector,
)

TENSOR_ALIGNMENT = "tensor"
DELEGATE_ALIGNMENT = "delegate"
DEFAULT_FORCE_ALIGN = 16  # the schema's own force_align for both byte vectors

KERNEL_TYPES = (
    "Null",
    "Int",
    "Bool",
    "Double",
    "Tensor",
    "String",
    "IntList",
    "DoubleList",
    "BoolList",
    "TensorList",
    "OptionalTensorList",
)
INSTRUCTION_ARGUMENTS = ("KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall")

# Enum values used by the data-locating fields.
DATA_LOCATION_INLINE = 0
DATA_LOCATION_SEGMENT = 1
TENSOR_DATA_LOCATION_SEGMENT = 0
TENSOR_DATA_LOCATION_EXTERNAL = 1


def _specs(*specs: TableSpec) -> dict[str, TableSpec]:
    return {s.name: s for s in specs}


_T = TableSpec

PROGRAM_SCHEMA = Schema(
    root="Program",
    identifier=b"ET12",
    tables=_specs(
        _T("ContainerMetadata", (string("encoded_inp_str"), string("encoded_out_str"))),
        _T("Null", ()),
        _T(
            "AllocationDetails",
            (
                scalar("memory_id", U32),
                scalar("memory_offset_low", U32),
                scalar("memory_offset_high", U32),
            ),
        ),
        _T(
            "ExtraTensorInfo",
            (
                scalar("mutable_data_segments_idx", U64),
                string("fully_qualified_name"),
                scalar("location", I8),
                scalar("device_type", I8),
                scalar("device_index", I8),
            ),
        ),
        _T(
            "Tensor",
            (
                scalar("scalar_type", I8),
                scalar("storage_offset", I32),
                vector("sizes", I32),
                vector("dim_order", U8),
                scalar("requires_grad", BOOL, default=False),
                scalar("data_buffer_idx", U32),
                table("allocation_info", "AllocationDetails"),
                scalar("layout", I8),
                scalar("shape_dynamism", I8),
                table("extra_tensor_info", "ExtraTensorInfo"),
            ),
        ),
        _T("Int", (scalar("int_val", I64),)),
        _T("Bool", (scalar("bool_val", BOOL, default=False),)),
        _T("Double", (scalar("double_val", F64, default=0.0),)),
        _T("String", (string("string_val"),)),
        _T("IntList", (vector("items", I64),)),
        _T("DoubleList", (vector("items", F64),)),
        _T("BoolList", (vector("items", BOOL),)),
        _T("TensorList", (vector("items", I32),)),
        _T("OptionalTensorList", (vector("items", I32),)),
        _T("EValue", (union("val", *KERNEL_TYPES),)),
        _T("Operator", (string("name"), string("overload"))),
        _T("KernelCall", (scalar("op_index", I32), vector("args", I32))),
        _T("DelegateCall", (scalar("delegate_index", I32), vector("args", I32))),
        _T("MoveCall", (scalar("move_from", I32), scalar("move_to", I32))),
        _T(
            "JumpFalseCall",
            (scalar("cond_value_index", I32), scalar("destination_instruction", I32)),
        ),
        _T("FreeCall", (scalar("value_index", I32),)),
        _T("Instruction", (union("instr_args", *INSTRUCTION_ARGUMENTS),)),
        _T("Frame", (string("filename"), scalar("lineno", I32), string("name"), string("context"))),
        _T("FrameList", (tables("items", "Frame"),)),
        _T("BackendDelegateDataReference", (scalar("location", I8), scalar("index", U32))),
        _T("CompileSpec", (string("key"), vector("value", U8))),
        _T(
            "BackendDelegate",
            (
                string("id"),
                table("processed", "BackendDelegateDataReference"),
                tables("compile_specs", "CompileSpec"),
            ),
        ),
        _T(
            "Chain",
            (
                vector("inputs", I32),
                vector("outputs", I32),
                tables("instructions", "Instruction"),
                tables("stacktrace", "FrameList"),
            ),
        ),
        _T(
            "NonConstBufferDevice",
            (scalar("buffer_idx", I32), scalar("device_type", I8), scalar("device_index", I8)),
        ),
        _T(
            "ExecutionPlan",
            (
                string("name"),
                table("container_meta_type", "ContainerMetadata"),
                tables("values", "EValue"),
                vector("inputs", I32),
                vector("outputs", I32),
                tables("chains", "Chain"),
                tables("operators", "Operator"),
                tables("delegates", "BackendDelegate"),
                vector("non_const_buffer_sizes", I64),
                tables("non_const_buffer_device", "NonConstBufferDevice"),
            ),
        ),
        _T("Buffer", (aligned_bytes("storage", TENSOR_ALIGNMENT),)),
        _T("BackendDelegateInlineData", (aligned_bytes("data", DELEGATE_ALIGNMENT),)),
        _T("DataSegment", (scalar("offset", U64), scalar("size", U64))),
        _T("SubsegmentOffsets", (scalar("segment_index", U32), vector("offsets", U64))),
        _T("NamedData", (string("key"), scalar("segment_index", U32))),
        _T(
            "Program",
            (
                scalar("version", U32),
                tables("execution_plan", "ExecutionPlan"),
                tables("constant_buffer", "Buffer"),
                tables("backend_delegate_data", "BackendDelegateInlineData"),
                tables("segments", "DataSegment"),
                table("constant_segment", "SubsegmentOffsets"),
                tables("mutable_data_segments", "SubsegmentOffsets"),
                tables("named_data", "NamedData"),
            ),
        ),
    ),
)

FLAT_TENSOR_SCHEMA = Schema(
    root="FlatTensor",
    identifier=b"FT01",
    tables=_specs(
        _T(
            "TensorLayout",
            (scalar("scalar_type", I8), vector("sizes", I32), vector("dim_order", U8)),
        ),
        _T("DataSegment", (scalar("offset", U64), scalar("size", U64))),
        _T(
            "NamedData",
            (string("key"), scalar("segment_index", U32), table("tensor_layout", "TensorLayout")),
        ),
        _T(
            "FlatTensor",
            (
                scalar("version", U32),
                tables("segments", "DataSegment"),
                tables("named_data", "NamedData"),
            ),
        ),
    ),
)


def program_table(name: str, /, **values: Any) -> Table:
    """A table of the program schema: ``program_table("DataSegment", offset=0, size=60)``."""
    return Table(PROGRAM_SCHEMA.spec(name), values)


def flat_tensor_table(name: str, /, **values: Any) -> Table:
    """A table of the data-file schema."""
    return Table(FLAT_TENSOR_SCHEMA.spec(name), values)


def max_force_align(*, constant_tensor_alignment: int = 16, delegate_alignment: int = 16) -> int:
    """The largest force_align of the schema a program was encoded with."""
    return max(DEFAULT_FORCE_ALIGN, constant_tensor_alignment, delegate_alignment)


def encode_program(
    program: Table, *, constant_tensor_alignment: int = 16, delegate_alignment: int = 16
) -> bytes:
    """The plain Program flatbuffer, byte-identical to ExecuTorch's encoder for the same values."""
    return _fbwrite.encode(
        program,
        PROGRAM_SCHEMA,
        alignments={
            TENSOR_ALIGNMENT: constant_tensor_alignment,
            DELEGATE_ALIGNMENT: delegate_alignment,
        },
    )


__all__ = [
    "PROGRAM_SCHEMA",
    "FLAT_TENSOR_SCHEMA",
    "Table",
    "program_table",
    "flat_tensor_table",
    "encode_program",
    "max_force_align",
    "DEFAULT_FORCE_ALIGN",
    "TENSOR_ALIGNMENT",
    "DELEGATE_ALIGNMENT",
    "DATA_LOCATION_INLINE",
    "DATA_LOCATION_SEGMENT",
    "TENSOR_DATA_LOCATION_SEGMENT",
    "TENSOR_DATA_LOCATION_EXTERNAL",
]
