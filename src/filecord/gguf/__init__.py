"""Clean-room GGUF: read to file-backed ranges, write byte-identical to gguf-py, split, merge,
reshard and convert through the save transaction.

Reading (:func:`read_gguf`) validates as strictly as ggml's loader and never loads a tensor; a
split set is opened from its first shard.  Writing: :func:`build_gguf` makes a Cord from
key-values and tensors (and :func:`build_split` the shards of a split set), and
:class:`GGUFWriter` mirrors gguf-py's writer calls (add key-values, add tensors -- arrays,
torch tensors, file-backed ranges or callables producing one when its turn comes -- write),
saving atomically and durably through ``save_many``, byte-identical to gguf-py 0.19.
``merge``/``reshard``/``convert`` rewrite models from their files without loading them.
Header tools (``parse_header``, ``encode_kv``, ``plan_splits``, ...) are implementation;
every error class is in :mod:`filecord.gguf.errors`.
"""

from __future__ import annotations

from filecord.gguf._build import build_gguf, build_split
from filecord.gguf._ops import convert, merge, reshard
from filecord.gguf._read import GGUFFile, GGUFModel, read_gguf
from filecord.gguf._types import GGMLType, GGUFTensor, KeyValue, ValueType
from filecord.gguf._writer import GGUFWriter

__all__ = [
    # reading
    "read_gguf",
    "GGUFModel",
    "GGUFFile",
    # writing
    "GGUFWriter",
    "build_gguf",
    "build_split",
    # rewriting models
    "merge",
    "reshard",
    "convert",
    # values
    "GGUFTensor",
    "KeyValue",
    "ValueType",
    "GGMLType",
]
