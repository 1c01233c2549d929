"""Errors of the GGUF format: one class per way a file or a split set can be malformed.

Reader errors are :class:`~filecord.errors.FormatError` subclasses (so also ``ValueError``)
carrying the field being read and the absolute byte offset involved (``None`` when the problem
is not at one place).  Writer-side mistakes (a name llama.cpp cannot load, a tensor that needs a
transformation) are ``ValueError`` subclasses of their own: the input was wrong, not a file.
"""

from __future__ import annotations

from filecord.errors import FilecordError, FormatError


class GGUFFormatError(FormatError):
    """A GGUF file (or split set) is malformed.

    ``field`` names what was being read (``"kv[3].key"``, ``"tensor 'blk.0.attn_q.weight'
    .offset"``), ``offset`` the absolute byte offset in the file (``None`` when not at one place).
    """


class BadMagicError(GGUFFormatError):
    """The file does not start with ``GGUF``."""


class UnsupportedVersionError(GGUFFormatError):
    """The version is not 2 or 3 (or the file is big-endian, which the format cannot flag)."""


class TruncatedError(GGUFFormatError):
    """The file ends before a field, a string, an array or a tensor's data does."""


class LimitExceededError(GGUFFormatError):
    """A count or a length is above what ggml's loader accepts (strings 1 GiB, arrays 2^30)."""


class InvalidKeyError(GGUFFormatError):
    """A key is empty, not UTF-8, or appears twice."""


class InvalidValueError(GGUFFormatError):
    """A value type is unknown, an array holds arrays, a bool is not 0 or 1, or a key that
    ggml types (``general.alignment``, ``split.*``) has the wrong type or value."""


class InvalidAlignmentError(InvalidValueError):
    """``general.alignment`` is not a u32 non-zero power of two."""


class InvalidTensorInfoError(GGUFFormatError):
    """A tensor record is wrong: a name of 64 bytes or more, a name given twice, more than four
    dims, a dim or size that overflows, an unknown or retired type, a row not made of blocks."""


class InvalidOffsetsError(GGUFFormatError):
    """A tensor's offset is not the running padded size of the tensors before it (gaps,
    overlaps, reordering and shared data are all refused, as ggml's loader refuses them)."""


class TrailingDataError(GGUFFormatError):
    """Bytes follow the padded end of the last tensor."""


class InvalidSplitError(GGUFFormatError):
    """A split set is inconsistent: not opened from its first shard, a missing or misnumbered
    shard, a tensor in two shards, or a total other than ``split.tensors.count``."""


class DuplicateTensorError(FilecordError, ValueError):
    """A tensor name is given twice to a writer, or comes from two inputs of a merge."""


class UnrepresentableError(FilecordError, ValueError):
    """Something cannot be written as GGUF as it is (a tensor needing a cast, permutation or
    quantization; a name llama.cpp cannot load); the message names it and says why."""


class UnsupportedModelError(UnrepresentableError):
    """A Hugging Face checkpoint this converter does not write: an architecture, tokenizer,
    dtype or setting outside what it supports (the message names what is supported).  Raised
    before anything is written."""


class CheckpointFileError(FormatError, UnsupportedModelError):
    """A checkpoint's ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` or
    ``added_tokens.json`` holds a value of the wrong type, or one no model can have (a NaN or
    negative epsilon, a count the tensors contradict).  ``field`` names the file and the key
    (``"config.json: num_hidden_layers"``); raised before anything is written."""
