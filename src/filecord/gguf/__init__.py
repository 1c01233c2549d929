"""Clean-room GGUF: read to file-backed ranges, write byte-identical to gguf-py, split, merge,
reshard and convert through the save transaction.

Reading (:func:`read_gguf`) validates as strictly as ggml's loader and never loads a tensor; a
split set is opened from its first shard.  Writing: :func:`build_gguf` makes a Cord from
key-values and tensors (and :func:`build_split` the shards of a split set), and
:class:`GGUFWriter` mirrors gguf-py's writer calls (add key-values, add tensors -- arrays,
torch tensors, file-backed ranges or callables producing one when its turn comes -- write),
saving atomically and durably through ``save_many``, byte-identical to gguf-py 0.19.
``merge``/``reshard``/``convert`` rewrite models from their files without loading them.
"""

from __future__ import annotations

from filecord.gguf._build import build_gguf, build_split
from filecord.gguf._encode import encode_header, encode_kv, plan_splits, shard_name
from filecord.gguf._ops import convert, merge, reshard
from filecord.gguf._parse import Header, TensorInfo, parse_header
from filecord.gguf._read import GGUFFile, GGUFModel, read_gguf, read_gguf_file
from filecord.gguf._types import (
    BLOCKS,
    DEFAULT_ALIGNMENT,
    GGMLType,
    GGUFTensor,
    KeyValue,
    ValueType,
    tensor_nbytes,
)
from filecord.gguf._writer import GGUFWriter
from filecord.gguf.errors import (
    BadMagicError,
    DuplicateTensorError,
    GGUFFormatError,
    InvalidAlignmentError,
    InvalidKeyError,
    InvalidOffsetsError,
    InvalidSplitError,
    InvalidTensorInfoError,
    InvalidValueError,
    LimitExceededError,
    TrailingDataError,
    TruncatedError,
    UnrepresentableError,
    UnsupportedVersionError,
)

__all__ = [
    # reading
    "read_gguf",
    "read_gguf_file",
    "GGUFModel",
    "GGUFFile",
    "Header",
    "TensorInfo",
    "parse_header",
    # writing
    "GGUFWriter",
    "build_gguf",
    "build_split",
    "encode_header",
    "encode_kv",
    "plan_splits",
    "shard_name",
    # rewriting models
    "merge",
    "reshard",
    "convert",
    # values
    "GGUFTensor",
    "KeyValue",
    "ValueType",
    "GGMLType",
    "BLOCKS",
    "DEFAULT_ALIGNMENT",
    "tensor_nbytes",
    # errors
    "GGUFFormatError",
    "BadMagicError",
    "UnsupportedVersionError",
    "TruncatedError",
    "LimitExceededError",
    "InvalidKeyError",
    "InvalidValueError",
    "InvalidAlignmentError",
    "InvalidTensorInfoError",
    "InvalidOffsetsError",
    "TrailingDataError",
    "InvalidSplitError",
    "DuplicateTensorError",
    "UnrepresentableError",
]
