"""Errors of the safetensors format: one class per way a file or an index can be malformed.

Reader errors are :class:`~filecord.errors.FormatError` subclasses (so also ``ValueError``) that
carry the field being checked and the absolute byte offset involved (``None`` when the problem is
not at one place).  Writer-side mistakes (shared memory, a name given twice, a tensor another
format cannot hold) are ``ValueError`` subclasses of their own: the input was wrong, not a file.
"""

from __future__ import annotations

from filecord.errors import FilecordError, FormatError


class SafetensorsFormatError(FormatError):
    """A safetensors file or ``*.index.json`` is malformed.

    ``field`` names what was being read (``"header_size"``, ``"model.embed.data_offsets"``),
    ``offset`` the absolute byte offset in the file (``None`` when not at one place).
    """


class TruncatedFileError(SafetensorsFormatError):
    """The file is shorter than its header or its data say it is."""


class HeaderTooLargeError(SafetensorsFormatError):
    """The header length is above the format's limit (100,000,000 bytes)."""


class InvalidHeaderError(SafetensorsFormatError):
    """The header is not the JSON the format requires (encoding, syntax, types, fields)."""


class DuplicateKeyError(SafetensorsFormatError):
    """A JSON object in the header (or index) names the same key twice."""


class UnknownDtypeError(SafetensorsFormatError):
    """A tensor's ``dtype`` is not one the format defines."""


class ShapeMismatchError(SafetensorsFormatError):
    """A tensor's byte range does not hold exactly ``shape`` elements of ``dtype``."""


class InvalidOffsetsError(SafetensorsFormatError):
    """The tensors' ``data_offsets`` leave a hole, overlap, or do not end at the end of file."""


class InvalidIndexError(SafetensorsFormatError):
    """A ``*.index.json`` is malformed or disagrees with its shards."""


class SharedTensorsError(FilecordError, ValueError, RuntimeError):
    """Tensors given to a writer share memory (``safetensors`` raises ``RuntimeError`` here)."""


class DuplicateTensorError(FilecordError, ValueError):
    """The same tensor name comes from two inputs of a merge."""


class UnrepresentableError(FilecordError, ValueError):
    """A tensor cannot be written in the target format; the message names it and says why."""
