"""Take an ``executorch`` 1.5.x ``ExecutorchProgramManager``'s serialized program over, unchanged.

Theory of operation
-------------------
The manager serializes in its constructor and keeps the result: ``_pte_data`` (an ExecuTorch
Cord whose ``_buffers`` are ``bytes`` or ExecuTorch ``FileBackedData``) and ``_tensor_data``
(tag -> Cord).  :func:`from_manager` turns these into a :class:`Program` without serializing
again: ``bytes`` are shared as they are, and each ExecuTorch ``FileBackedData`` (``_path``,
``_size``, ``_sha256``, ``_finalizer``) becomes one filecord ``FileBackedData`` on the same
file, however many cords use it.

Ownership: an ExecuTorch object that would delete its file (a live ``_finalizer``) is taken
over.  Its finalizer is detached, so ExecuTorch never deletes a file filecord may be moving; the
filecord object owns the file instead and is attached to the ExecuTorch object, so the file
lives as long as either side still uses it, and exactly one of them deletes it.

The manager keeps working, but through filecord: in its cords every taken-over item is replaced
by a stand-in that reads via the filecord object, which re-checks the file on every read.  After
a consuming save moved the data away, reading the manager (``buffer``) therefore raises
``DataChangedError`` instead of reading a shortened, missing or reused file.  ExecuTorch's
writers open their output before they read the first piece, so a failure there would leave a
truncated file behind; the manager's ``save``, ``write_to_file`` and
``write_tensor_data_to_file`` are therefore wrapped (on that one manager object) to check every
taken-over file first and raise ``DataChangedError`` before ExecuTorch opens anything.

A manager exported under ``lean_export()`` holds, beside those, references to tensor storages
(``_storage.StorageRef``).  Each becomes the file range the storage is a clean mapping of
(``_mapped``: the kernel copies it, memory is never read) or else a view of the storage's
memory, streamed by the save.  They are not taken over: nothing owns a storage's memory but
torch.  Their digests were taken at export, so each is checked first (``StorageRef.check``:
hashed again in place; a weight written in place since raises ``DataChangedError`` before the
transaction starts), except a file range, in a private mapping, whose file is in the state
noted when the digest was taken (device, inode, size, mtime and ctime: a write, a truncate,
``cp -p`` or ``utime`` moves the ctime): from here on the save's own identity checks watch it.
A shared mapping is always hashed: a write through it dirties pages without moving any time
when they were already dirty.  A file cut short since is refused without reading the
mapping (that read would be a SIGBUS).

``from_manager`` (and ``save(path, manager)``) also take ExecuTorch's ``ExportSession`` (the
``executorch.export`` recipe API): its ``get_executorch_program_manager()`` is used.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from filecord._io import syscalls as _sys
from filecord._kit.operation import ProgressCallback
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._plan.window import DEFAULT_WINDOW
from filecord.errors import DataChangedError, add_note
from filecord.executorch import _storage
from filecord.executorch._mapped import MappedFiles
from filecord.executorch.program import Program

log = logging.getLogger(__name__)

_TAKEN = "_filecord_data"  # attribute set on ExecuTorch objects we took over
_NOTE = (
    "filecord took this data over from ExecuTorch (filecord.executorch.from_manager); a "
    "save with consume=True moves it into that save's output, after which it cannot be read here"
)


@functools.cache
def _stand_in_type() -> type:
    """The stand-in class, a subclass of ExecuTorch's ``FileBackedData`` (its Cord accepts only
    ``bytes`` and that class), made on first use so executorch stays an optional import."""
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData

    class FilecordBacked(EtFileBackedData):  # type: ignore[misc]
        """ExecuTorch's view of data that filecord manages: every read is checked by filecord."""

        def __init__(self, data: FileBackedData) -> None:
            # No super().__init__: it would stat the file again and could arm a second deleter.
            self._path = data.path
            self._size = len(data)
            known = data.known_sha256
            self._sha256 = None if known is None else bytes.fromhex(known)
            self._finalizer = None
            self._filecord_data = data

        def _checked(self, read: Any) -> Any:
            try:
                return read()
            except DataChangedError as exc:
                add_note(exc, _NOTE)
                raise

        def prefix(self, size: int) -> bytes:
            return self._checked(lambda: self._filecord_data.prefix(size))  # type: ignore[no-any-return]

        def sha256(self) -> bytes:
            return bytes.fromhex(self._checked(self._filecord_data.sha256))

        def to_bytes(self) -> bytes:
            return self._checked(self._filecord_data.to_bytes)  # type: ignore[no-any-return]

        def write_to_file(self, outfile: Any) -> None:
            self._checked(lambda: Cord([self._filecord_data]).write_to_file(outfile))

        def close(self) -> None:
            self._filecord_data.close()

    return FilecordBacked


def _hex_digest(value: object) -> str | None:
    if isinstance(value, bytes) and len(value) == 32:
        return value.hex()
    if isinstance(value, str) and len(value) == 64:
        return value
    return None


def _take_over(item: Any) -> FileBackedData:
    """The filecord object for one ExecuTorch ``FileBackedData`` (made once per object)."""
    existing = getattr(item, _TAKEN, None)
    if isinstance(existing, FileBackedData):
        return existing
    path = os.fspath(item._path)
    expected = int(item._size)
    try:
        found: int | None = _sys.stat(path).st_size
    except FileNotFoundError:
        found = None
    if found != expected:
        raise DataChangedError(
            path,
            expected_size=expected,
            found_size=found,
            reason="the file no longer has the size ExecuTorch recorded",
        )
    finalizer = getattr(item, "_finalizer", None)
    owned = finalizer is not None and bool(finalizer.alive)
    digest = _hex_digest(getattr(item, "_sha256", None))
    # ExecuTorch's temporaries stay temporaries: deleted when the last object drops them,
    # unless a save is given them (then only that save's commit, or close(), deletes them).
    data = (FileBackedData._scratch(path, sha256=digest) if owned
            else FileBackedData(path, sha256=digest))
    if finalizer is not None and owned:
        finalizer.detach()  # from now on only filecord's owner deletes the file
        log.debug("took over ownership of %s from ExecuTorch", path)
    setattr(item, _TAKEN, data)  # keeps filecord's owner (and the file) alive with ExecuTorch's
    return data


def _adopt_cord(et_cord: Any, what: str, stand_ins: dict[int, Any],
                mapped: Callable[[], MappedFiles]) -> Cord:
    buffers = getattr(et_cord, "_buffers", None)
    if not isinstance(buffers, list):
        raise TypeError(f"{what}: expected an ExecuTorch Cord, got {type(et_cord).__name__}")
    cord = Cord()
    for i, item in enumerate(buffers):
        if isinstance(item, bytes):
            cord.append(item)
            continue
        if _storage.is_ref(item):  # lean_export(): a tensor's storage, seen in place
            cord.append(_checked_ref(item, mapped))
            continue
        if not hasattr(item, "_path") or not hasattr(item, "_size"):
            raise TypeError(f"{what}[{i}]: unsupported piece {type(item).__name__}")
        data = _take_over(item)
        cord.append(data)
        stand_in = stand_ins.get(id(data))
        if stand_in is None:
            stand_in = stand_ins[id(data)] = (
                item if isinstance(item, _stand_in_type()) else _stand_in_type()(data)
            )
        buffers[i] = stand_in
    if len(cord) != len(et_cord):
        raise ValueError(
            f"{what}: pieces add up to {len(cord)} bytes, the cord says {len(et_cord)}"
        )
    return cord


def _checked_ref(ref: Any, mapped: Callable[[], MappedFiles]) -> FileBackedData | memoryview:
    """The piece for a storage reference, once its bytes are known to match its digest."""
    files = mapped()
    state = files.state_at(ref.data_ptr)  # (dev, ino, size, mtime, ctime), one stat
    short = None if state is None else files.cut_short(ref.data_ptr, len(ref), state[2])
    if short is not None:  # reading the mapping past the file's end would kill the process
        raise DataChangedError(short, expected_size=len(ref), found_size=None,
                               reason="the file a weight is mapped from was cut short after "
                                      "lean_export() hashed it")
    found = files.range_of(ref.data_ptr, len(ref))
    untouched = (found is not None and ref.file_state is not None
                 and not files.shared_at(ref.data_ptr) and state == ref.file_state)
    if not untouched:
        ref.check()
    return ref.view if found is None else found


def from_manager(manager: Any) -> Program:
    """A :class:`Program` holding exactly what ``manager`` (``executorch`` 1.5.x's
    ``ExecutorchProgramManager``) serialized; see the module docstring for ownership.

    Raises ``TypeError`` for anything that does not carry 1.5.x's serialized fields, and
    ``DataChangedError`` if a file-backed piece no longer has the size ExecuTorch recorded.
    """
    if getattr(manager, "_pte_data", None) is None:
        session_manager = getattr(manager, "get_executorch_program_manager", None)
        if callable(session_manager):  # an ExportSession
            manager = session_manager()
    pte_data = getattr(manager, "_pte_data", None)
    tensor_data = getattr(manager, "_tensor_data", None)
    if pte_data is None or not isinstance(tensor_data, (dict, type(None))):
        raise TypeError(
            f"from_manager needs an executorch 1.5.x ExecutorchProgramManager (from "
            f"to_executorch()), got {type(manager).__name__} without its serialized program"
        )
    stand_ins: dict[int, Any] = {}
    mapped = functools.cache(MappedFiles)  # /proc/self/smaps read once, if a storage asks
    pte = _adopt_cord(pte_data, "_pte_data", stand_ins, mapped)
    data = {
        tag: _adopt_cord(cord, f"_tensor_data[{tag!r}]", stand_ins, mapped)
        for tag, cord in (tensor_data or {}).items()
    }
    taken = [d for cord in (pte, *data.values()) for d in cord.file_backed_buffers()]
    if taken:
        _guard_writers(manager, taken)
    return Program(
        pte,
        data,
        segment_alignment=_segment_alignment(manager),
        data_alignment=_data_alignment(manager),
    )


_WRITERS = ("save", "write_to_file", "write_tensor_data_to_file")


def _guard_writers(manager: Any, taken: list[FileBackedData]) -> None:
    """Make the manager's writers check the taken-over files before ExecuTorch opens an output
    (see the module docstring).  Done once per manager; the wrappers read ``taken`` live."""
    guarded: list[FileBackedData] | None = getattr(manager, "_filecord_guarded", None)
    if guarded is not None:
        guarded.extend(d for d in taken if all(d is not g for g in guarded))
        return
    files = list(taken)
    for name in _WRITERS:
        original = getattr(manager, name, None)
        if not callable(original):
            continue

        @functools.wraps(original)
        def checked(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            try:
                for data in files:
                    data.check()
            except DataChangedError as exc:
                add_note(exc, _NOTE)
                raise
            return __original(*args, **kwargs)

        try:
            setattr(manager, name, checked)
        except AttributeError:  # pragma: no cover - a manager type that forbids it
            return
    manager._filecord_guarded = files


def _segment_alignment(manager: Any) -> int:
    config = getattr(getattr(manager, "_data_serializer", None), "config", None)
    value = getattr(config, "segment_alignment", 128)
    return value if isinstance(value, int) and value > 0 else 128


def _data_alignment(manager: Any) -> dict[str, int]:
    """Alignments the backends asked for, per external key (the data files do not record them)."""
    named = getattr(manager, "_named_data", None)
    out: dict[str, int] = {}
    for entries in (getattr(named, "external_data", None) or {}).values():
        for key, entry in entries.items():
            alignment = getattr(entry, "alignment", 1)
            if isinstance(alignment, int) and alignment > 0:
                out[key] = alignment
    return out


def save(
    path: str | os.PathLike[str],
    manager: Any,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    consume: bool = False,
    merge_data: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    clone_ready: bool = False,
) -> SaveReport:
    """``from_manager(manager).save(path, ...)``: the program and its data files in one atomic
    transaction; the options are :meth:`Program.save`'s (``clone_ready`` included).

    The destination comes first, as in ``filecord.save(path, cord)``; the old order
    ``save(manager, path)`` raises ``TypeError`` naming this one.
    """
    given: object = path  # typed as a path, but a call in the old order passes the manager here
    if not isinstance(given, (str, os.PathLike)):
        if isinstance(manager, (str, os.PathLike)):
            raise TypeError(
                "filecord.executorch.save takes the destination first: save(path, manager, "
                "...), as filecord.save(path, cord) does; it was called with a "
                f"{type(given).__name__} first and the path {os.fspath(manager)!r} second "
                "(the old order)"
            )
        raise TypeError(f"save: path must be a str or os.PathLike, not {type(given).__name__}")
    return from_manager(manager).save(
        path, data_dir=data_dir, consume=consume, merge_data=merge_data, window=window,
        progress=progress, clone_ready=clone_ready,
    )
