"""The error hierarchy.

Every error filecord raises derives from :class:`FilecordError` and also from the builtin a
caller would naturally catch (``OSError`` for I/O, ``ValueError`` for malformed input), so code
written against the standard library keeps working.  Errors carry structured fields; the
human-readable story goes into ``add_note`` so tracebacks show it.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass


class FilecordError(Exception):
    """Base class of every filecord error."""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note`` on 3.11+; on 3.10 the note is kept in ``__notes__`` all the same."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(exc, "__notes__", None)
        if notes is None:
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(note)


class ChangeKind(enum.Enum):
    """What a :class:`DataChangedError` found, for code to decide on (never the message text).

    ``CONTENT``: its size or content (modification time) changed, or the move order says it
    was cut or written by someone else; the save's journal is held, nothing is put back over it.
    ``REPLACED``: the name no longer holds the file (gone, or another file).
    ``LINKED``: another name was linked to it; no byte changed, a rollback may put the bytes
    back into the shared file.
    ``METADATA``: only its change time moved (a chmod, chown or chattr); no byte changed as far
    as size and modification time tell, so the journal is kept, not held.
    """

    CONTENT = "content"
    REPLACED = "replaced"
    LINKED = "linked"
    METADATA = "metadata"


class DataChangedError(FilecordError, OSError):
    """A file-backed piece no longer holds the bytes it was made with.

    ``path`` is the file, ``expected_size``/``found_size`` its size when the piece was made and
    now (``None`` when the file is gone), and ``reason`` says what differed.  ``committed`` is
    True when the save (or recover) had passed its commit point: the outputs are complete
    under their final names, and only a consumed source changed after the save's last look was
    kept instead of deleted (the notes say where).  ``kind`` (:class:`ChangeKind`) says what
    differed.
    """

    committed: bool = False

    def __init__(
        self, path: str, *, expected_size: int, found_size: int | None, reason: str,
        kind: ChangeKind = ChangeKind.CONTENT,
    ) -> None:
        found = "missing" if found_size is None else f"{found_size} bytes"
        super().__init__(
            f"{path}: file-backed data changed since it was captured ({reason}; "
            f"expected {expected_size} bytes, found {found})"
        )
        self.path = path
        self.expected_size = expected_size
        self.found_size = found_size
        self.reason = reason
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only fields: the default (type, args) reduction cannot call __init__ again;
        # the state (notes, ``committed``) travels as __dict__
        return (_rebuild_data_changed, (type(self), self.path, self.expected_size,
                                        self.found_size, self.reason, self.kind),
                dict(self.__dict__))


def _rebuild_data_changed(cls: type[DataChangedError], path: str, expected_size: int,
                          found_size: int | None, reason: str,
                          kind: ChangeKind) -> DataChangedError:
    return cls(path, expected_size=expected_size, found_size=found_size, reason=reason,
               kind=kind)


@dataclass(frozen=True, slots=True)
class SourceState:
    """Where the bytes of one consumed source are after a failed save."""

    path: str
    original_size: int
    bytes_in_source: int
    rest_at: tuple[tuple[str, int], ...]  # (temp file, offset) holding bytes past bytes_in_source


class SaveError(FilecordError, OSError):
    """A save failed.  The final names are untouched unless ``journal_path`` says otherwise.

    ``journal_path`` names a journal that ``filecord recover`` must finish (``None`` when the
    save cleaned up completely); ``sources`` lists, per consumed source, where its bytes are.
    ``committed`` is True when every output was already complete under its final name and only
    the clean-up after it failed (removing the consumed sources' parked copies or the
    journal): the save succeeded, and ``recover`` removes what is left.
    """

    committed: bool = False

    def __init__(
        self,
        message: str,
        *,
        errno: int | None = None,
        journal_path: str | None = None,
        sources: tuple[SourceState, ...] = (),
        committed: bool = False,
    ) -> None:
        if errno is None:
            super().__init__(message)
        else:
            super().__init__(errno, message)
        self.message = message
        self.journal_path = journal_path
        self.sources = sources
        self.committed = committed

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        # DCP pickles a coordinator's exception to broadcast it to every rank: the default
        # (type, args) reduction would call __init__(errno, message) and fail
        return (_rebuild_save_error, (type(self), self.message, self.errno, self.journal_path,
                                      self.sources), dict(self.__dict__))


def _rebuild_save_error(cls: type[SaveError], message: str, errno: int | None,
                        journal_path: str | None,
                        sources: tuple[SourceState, ...]) -> SaveError:
    return cls(message, errno=errno, journal_path=journal_path, sources=sources)


class InsufficientSpaceError(SaveError):
    """The preflight found too little free space; nothing was created."""


class SourceIsOutputError(SaveError):
    """An output of the save is also one of its sources."""


class RecoverError(FilecordError, OSError):
    """A journal could not be recovered (unreadable, or a file it names is not as recorded)."""


class FormatError(FilecordError, ValueError):
    """A file is not a well-formed instance of its format.

    ``field`` names what was being read (``"header_size"``, ``"segments[2].size"``,
    ``"kv[3].key"``), ``offset`` the absolute byte offset in the file (``None`` when the problem
    is not at one place, or when the error is raised without one).  The message starts with
    both, so a report on a multi-gigabyte file says where to look.  Every format's error base
    (``ExecutorchFormatError``, ``SafetensorsFormatError``, ``GGUFFormatError``) derives from
    this class and adds nothing to it.

    ``path`` names the file the problem is in, set by the reader that read it (the innermost
    one: a shard an index names is named itself, not the index), and the message then starts
    with it: ``shard.safetensors: header_size at offset 0: ...``.
    """

    path: str | None = None

    def __init__(self, message: str, *, field: str | None = None,
                 offset: int | None = None) -> None:
        where = field if offset is None or field is None else f"{field} at offset {offset}"
        super().__init__(message if where is None else f"{where}: {message}")
        self.message = message
        self.field = field
        self.offset = offset

    def in_file(self, path: str) -> None:
        """Name the file the problem is in, once (a reader further out leaves it be)."""
        if self.path is None:
            self.path = path
            self.args = (f"{path}: {self.args[0]}", *self.args[1:]) if self.args else (path,)

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only fields: pickling (multiprocessing, pytest-xdist) must pass them again
        return (_rebuild_format_error,
                (type(self), self.message, self.field, self.offset, self.path),
                {k: v for k, v in self.__dict__.items() if k != "path"})


def _rebuild_format_error(cls: type[FormatError], message: str, field: str | None,
                          offset: int | None, path: str | None = None) -> FormatError:
    exc = cls(message, field=field, offset=offset)
    if path is not None:
        exc.in_file(path)
    return exc


@contextlib.contextmanager
def reading(path: str) -> Iterator[None]:
    """A format error raised inside names ``path`` as its file (see :attr:`FormatError.path`)."""
    try:
        yield
    except FormatError as exc:
        exc.in_file(path)
        raise


class NotRegularFileError(FormatError):
    """An input (a file given, or one an index or a split set names) is a FIFO, a device, a
    directory or a socket: refused before it is read, since reading a FIFO waits forever."""
