"""One error base: every format's error carries ``field`` and ``offset`` from
``filecord.errors.FormatError``, without its own ``__init__``, and survives pickling."""

from __future__ import annotations

import pickle

import pytest

from filecord.errors import FormatError, NotRegularFileError
from filecord.executorch.errors import ExecutorchFormatError, TruncatedError
from filecord.gguf.errors import BadMagicError, GGUFFormatError
from filecord.safetensors.errors import InvalidIndexError, SafetensorsFormatError


@pytest.mark.parametrize("base", [ExecutorchFormatError, SafetensorsFormatError,
                                  GGUFFormatError])
def test_format_bases_derive_from_format_error_and_add_no_init(base: type[FormatError]) -> None:
    assert issubclass(base, FormatError)
    assert "__init__" not in base.__dict__


@pytest.mark.parametrize("cls", [TruncatedError, BadMagicError, InvalidIndexError,
                                 NotRegularFileError, FormatError])
def test_field_offset_message_and_pickle(cls: type[FormatError]) -> None:
    e = cls("runs past the end", field="segments[2].size", offset=4096)
    assert str(e) == "segments[2].size at offset 4096: runs past the end"
    assert (e.field, e.offset, e.message) == ("segments[2].size", 4096, "runs past the end")
    assert isinstance(e, ValueError)
    back = pickle.loads(pickle.dumps(e))  # noqa: S301 - our own bytes
    assert type(back) is cls
    assert (back.field, back.offset, str(back)) == (e.field, e.offset, str(e))


def test_field_and_offset_are_optional() -> None:
    assert str(FormatError("bad", field="header")) == "header: bad"
    assert str(FormatError("bad")) == "bad"
