"""Reading the small text files of a Hugging Face checkpoint (``config.json``, the tokenizer's
JSON files, ``model.safetensors.index.json``, chat templates): one reader, so every file is
judged the same way before any library sees it.

A file someone else wrote is checked, in order: that it is a regular file (a FIFO would block,
a directory or a symlink loop is named as such), that it is no larger than its limit (refused,
never cut short), that it is UTF-8, that its JSON nests no deeper than :data:`DEPTH` (Python's
parser recurses once per level: see :mod:`filecord._kit.jsondepth`), that it parses, and that
no string in it is a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but no UTF-8 text, so
writing it into a GGUF would fail half way).  Each failure is a
:class:`~filecord.gguf.errors.CheckpointFileError` naming the file (and the field, for a
surrogate), raised before anything is written.  ``gguf-py`` and ``tokenizers`` read some of the
same files again themselves; they are given only files that passed here.
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any

from filecord._io import syscalls as _sys
from filecord._kit.jsondepth import first_too_deep
from filecord._kit.readfile import kind_of
from filecord.gguf.errors import CheckpointFileError

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
DEPTH = 64  # a tokenizer.json nests about 8 deep; a config.json 3
JSON_LIMIT = 256 << 20  # a tokenizer.json of a 256k vocabulary is ~20 MB


def _bad(path: str, why: str, key: str = "") -> CheckpointFileError:
    name = os.path.basename(path)
    return CheckpointFileError(why, field=f"{name}: {key}" if key else name)


def read_bytes(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them."""
    try:
        fd = _sys.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = ("a symbolic link loop" if exc.errno == errno.ELOOP
               else f"cannot be opened: {exc.strerror}")
        raise _bad(path, why) from None
    try:
        what = kind_of(_sys.fstat(fd).st_mode)
        if what is not None:
            raise _bad(path, f"is {what}: only a regular file is read")
        parts: list[bytes] = []
        offset = 0
        while offset <= limit:
            chunk = _sys.pread(fd, min(1 << 20, limit + 1 - offset), offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
    finally:
        _sys.close(fd)
    if offset > limit:
        raise _bad(path, f"larger than {limit >> 20} MiB, which no such file needs to be")
    return b"".join(parts)


def read_text(path: str, limit: int = JSON_LIMIT) -> str:
    """The file as UTF-8 text (a chat template, a JSON file before it is parsed)."""
    raw = read_bytes(path, limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(path, f"not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})"
                   ) from None


def read_json(path: str, limit: int = JSON_LIMIT) -> Any:
    """The parsed JSON value of the file (see the module notes for what is refused)."""
    text = read_text(path, limit)
    deep = first_too_deep(text, DEPTH)
    if deep is not None:
        raise _bad(path, f"nested more than {DEPTH} deep (character {deep})")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _bad(path, f"not valid JSON: {exc}") from None
    # a lone surrogate can only come from a backslash-u escape of D800 to DFFF: the walk is
    # needed only when the text holds one
    where = _surrogate(value, "") if _SURROGATE_ESCAPE.search(text) else None
    if where is not None:
        raise _bad(path, "holds a lone UTF-16 surrogate escape (not text)", where or "")
    return value


def _surrogate(value: Any, where: str) -> str | None:
    """The field of the first string (key or value) that is not encodable text."""
    if isinstance(value, str):
        return None if _text(value) else where
    if isinstance(value, list):
        for i, v in enumerate(value):
            if (w := _surrogate(v, f"{where}[{i}]")) is not None:
                return w
    elif isinstance(value, dict):
        for k, v in value.items():
            at = f"{where}.{k}" if where else str(k)
            if not _text(k):
                return at.encode("utf-8", "backslashreplace").decode("ascii", "replace")
            if (w := _surrogate(v, at)) is not None:
                return w
    return None


def _text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def exists(path: str) -> bool:
    """Whether anything is at ``path`` (a dangling link or a loop counts: reading it says
    what it is)."""
    return _sys.lexists(path)
