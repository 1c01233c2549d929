"""Clean-room ExecuTorch formats: ``.pte`` programs and ``.ptd`` data files.

Read them (``read_pte``, ``read_ptd``: every segment a file-backed range, never loaded), build
them (``assemble_pte``, ``build_ptd``, ``merge_ptd``, ``serialize_program``: Cords holding the
pieces you gave by reference), and keep named data (``NamedDataStore``).  Save whole programs
with ``Program`` (a ``.pte`` plus its ``.ptd`` files in one transaction), also straight from
ExecuTorch's ``ExecutorchProgramManager`` or ``ExportSession`` (``from_manager``, ``save``).
Ask what a program loads from data files (``external_tensors``; ``filecord.executorch.verify``
checks every key it needs).  Only the ``flatbuffers`` runtime is needed: no generated code, no
flatc.
"""

from filecord.executorch._contents import external_tensors
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import Aligned, plan_segments
from filecord.executorch._merge import merge_ptd
from filecord.executorch.adapter import from_manager, save
from filecord.executorch.errors import (
    BadHeaderError,
    BadMagicError,
    BadValueError,
    DuplicateKeyError,
    ExecutorchFormatError,
    InvalidTagError,
    MalformedFlatbufferError,
    MissingFieldError,
    NamedDataConflictError,
    OutOfRangeError,
    OverlapError,
    SegmentTableMismatchError,
    TooManyObjectsError,
    TruncatedError,
)
from filecord.executorch.named_data import DataEntry, NamedDataStore, validate_tag
from filecord.executorch.program import (
    Program,
    merged_file_name,
    ptd_file_name,
)
from filecord.executorch.ptd import PtdFile, PtdHeader, build_ptd, read_ptd
from filecord.executorch.pte import (
    PteDelegate,
    PteFile,
    PteHeader,
    assemble_pte,
    encode_program,
    max_force_align,
    read_pte,
)
from filecord.executorch.schema import (
    FLAT_TENSOR_SCHEMA,
    PROGRAM_SCHEMA,
    flat_tensor_table,
    program_table,
)
from filecord.executorch.serialize import SerializedProgram, serialize_program
from filecord.executorch.values import PtdEntry, ScalarType, Segment, TensorLayout

__all__ = [
    # programs
    "Program",
    "from_manager",
    "save",
    "ptd_file_name",
    "merged_file_name",
    "external_tensors",
    # reading
    "read_pte",
    "read_ptd",
    "PteFile",
    "PteHeader",
    "Segment",
    "PteDelegate",
    "PtdFile",
    "PtdHeader",
    "PtdEntry",
    # writing
    "assemble_pte",
    "encode_program",
    "max_force_align",
    "plan_segments",
    "Aligned",
    "build_ptd",
    "merge_ptd",
    "serialize_program",
    "SerializedProgram",
    # values
    "NamedDataStore",
    "DataEntry",
    "validate_tag",
    "TensorLayout",
    "ScalarType",
    "Table",
    "program_table",
    "flat_tensor_table",
    "PROGRAM_SCHEMA",
    "FLAT_TENSOR_SCHEMA",
    # errors
    "ExecutorchFormatError",
    "TruncatedError",
    "BadMagicError",
    "BadValueError",
    "BadHeaderError",
    "OutOfRangeError",
    "OverlapError",
    "MalformedFlatbufferError",
    "MissingFieldError",
    "TooManyObjectsError",
    "DuplicateKeyError",
    "NamedDataConflictError",
    "InvalidTagError",
    "SegmentTableMismatchError",
]
