"""filecord's errors with keyword-only fields survive pickling with every field and their notes
(DCP pickles a coordinator's exception to send it to every rank; multiprocessing and
pytest-xdist do the same)."""

from __future__ import annotations

import errno
import pickle
from typing import TypeVar

import pytest

from filecord.errors import (
    ChangeKind,
    DataChangedError,
    FormatError,
    InsufficientSpaceError,
    SaveError,
    SourceIsOutputError,
    SourceState,
    add_note,
)

E = TypeVar("E", bound=BaseException)


def _roundtrip(e: E) -> E:
    back = pickle.loads(pickle.dumps(e))  # noqa: S301 - our own bytes
    assert type(back) is type(e)
    return back


@pytest.mark.parametrize("cls", [SaveError, InsufficientSpaceError, SourceIsOutputError])
def test_save_error_fields_and_notes(cls: type[SaveError]) -> None:
    src = SourceState("/d/a.bin", 100, 40, (("/d/.x.0123456789abcdef.partial", 8),))
    e = cls("no space", errno=errno.ENOSPC, journal_path="/d/.x.j", sources=(src,))
    add_note(e, "the old file is untouched")
    back = _roundtrip(e)
    assert type(back) is cls
    assert isinstance(back, OSError)
    assert str(back) == "no space"
    assert back.errno == errno.ENOSPC
    assert back.strerror == "no space"
    assert back.journal_path == "/d/.x.j"
    assert back.sources == (src,)
    assert getattr(back, "__notes__", None) == ["the old file is untouched"]


def test_save_error_without_errno() -> None:
    back = _roundtrip(SaveError("failed"))
    assert isinstance(back, SaveError)
    assert back.errno is None
    assert (str(back), back.journal_path, back.sources) == ("failed", None, ())


def test_data_changed_error_fields_committed_and_notes() -> None:
    e = DataChangedError("/d/w.bin", expected_size=10, found_size=None, reason="gone",
                         kind=ChangeKind.REPLACED)
    e.committed = True
    add_note(e, "kept, not deleted")
    back = _roundtrip(e)
    assert type(back) is DataChangedError
    assert (back.path, back.expected_size, back.found_size, back.reason, back.kind) == (
        "/d/w.bin", 10, None, "gone", ChangeKind.REPLACED)
    assert back.committed is True
    assert str(back) == str(e)
    assert getattr(back, "__notes__", None) == ["kept, not deleted"]


def test_format_error_keeps_its_notes() -> None:
    e = FormatError("bad", field="header", offset=8)
    add_note(e, "in shard 2")
    back = _roundtrip(e)
    assert str(back) == "header at offset 8: bad"
    assert getattr(back, "__notes__", None) == ["in shard 2"]
