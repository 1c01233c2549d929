"""Errors of the ExecuTorch formats: one class per way a ``.pte`` or ``.ptd`` can be malformed.

Every reader error is a :class:`~filecord.errors.FormatError` (so also a ``ValueError``) and
carries the field it was checking and the byte offset it was looking at, so a report on a
multi-gigabyte file says where to look.  Writer-side mistakes (a key given twice with different
bytes, a tag that cannot be a file name) are ``ValueError``s of their own: the input was wrong,
not a file.
"""

from __future__ import annotations

from filecord.errors import FilecordError, FormatError


class ExecutorchFormatError(FormatError):
    """A ``.pte``/``.ptd`` (or the flatbuffer inside it) is malformed.

    ``field`` names what was being read (``"segments[2].size"``), ``offset`` the absolute byte
    offset involved (``None`` when the problem is not at one place).
    """


class TruncatedError(ExecutorchFormatError):
    """Something the file declares runs past the end of the bytes that hold it."""


class BadMagicError(ExecutorchFormatError):
    """A file identifier or header magic is not the one the format requires."""


class BadHeaderError(ExecutorchFormatError):
    """An extended header's length or sizes contradict each other."""


class OutOfRangeError(ExecutorchFormatError):
    """An index or offset points outside the table or region it must lie in."""


class OverlapError(ExecutorchFormatError):
    """Two segments claim the same bytes."""


class MalformedFlatbufferError(ExecutorchFormatError):
    """The flatbuffer's structure is broken (vtable, alignment, string, union type)."""


class MissingFieldError(ExecutorchFormatError):
    """A field the runtime requires is absent."""


class TooManyObjectsError(ExecutorchFormatError):
    """A flatbuffer refers to far more data than it holds (shared or oversize counts)."""


class DuplicateKeyError(ExecutorchFormatError):
    """A named-data key appears twice in one file."""


class NamedDataConflictError(FilecordError, ValueError):
    """One key was given two different contents (in a store, or across merged data files)."""


class InvalidTagError(FilecordError, ValueError):
    """An external tag that cannot safely become a file name."""


class SegmentTableMismatchError(FilecordError, ValueError):
    """The program's segment table does not describe the segments handed to ``build_pte``."""


class BadValueError(ExecutorchFormatError):
    """A field holds a value outside its allowed set: an unknown enum value (a ScalarType), a
    dim_order that is not a permutation, a negative size, too many dimensions."""
