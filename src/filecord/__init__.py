"""filecord: assemble large artifacts from bytes and file-backed pieces, atomically."""

from filecord.cord import Cord
from filecord.data import FileBackedData
from filecord.errors import (
    DataChangedError,
    FilecordError,
    FormatError,
    InsufficientSpaceError,
    RecoverError,
    SaveError,
    SourceIsOutputError,
)

__version__ = "0.1.0"

__all__ = [
    "Cord",
    "FileBackedData",
    "DataChangedError",
    "FilecordError",
    "FormatError",
    "InsufficientSpaceError",
    "RecoverError",
    "SaveError",
    "SourceIsOutputError",
    "__version__",
]
