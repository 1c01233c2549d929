"""Destination-first arguments for the format operations, and the checks that refuse the old order.

filecord's writers take the destination first (``save(path, cord)``, ``merge(output,
inputs)``, ``convert(output, source)``): the destination is the one argument every writer
has, so it can come first everywhere.  The format operations used to take the source first,
and since both arguments of ``convert`` (and the output of ``merge``) are path strings, a
call written for the old order would type-check and then write over the wrong file.  These
checks run before anything is read or written and turn such a call into a ``TypeError`` (a
list of inputs where the output goes) or a ``ValueError`` (an output whose suffix the
operation never writes, or an output that is one of the inputs), each naming the new order.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence

from filecord._io import syscalls as _sys
from filecord.errors import SourceIsOutputError


def output_path(function: str, usage: str, output: object) -> str:
    """``output`` as a string; a list or tuple there is the old order (inputs first)."""
    if isinstance(output, (list, tuple)):
        raise TypeError(
            f"{function} takes the output first: {usage}, as filecord.save(path, cord) does; "
            f"it was called with a {type(output).__name__} of inputs first (the old order)")
    if not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"{function}: the output must be a str or os.PathLike, "
                        f"not {type(output).__name__}")
    return os.fspath(output)


def input_paths(function: str, usage: str, inputs: object) -> list[str]:
    """``inputs`` as strings; a single path there is the old order (or a missing list)."""
    if isinstance(inputs, (str, bytes, os.PathLike)):
        raise TypeError(
            f"{function} takes the output first and a list of inputs second: {usage}; it was "
            f"called with the single path {os.fsdecode(inputs)!r} second (the old order, or "
            f"a path not wrapped in a list)")
    if not isinstance(inputs, Sequence):
        raise TypeError(f"{function}: inputs must be a list of paths, "
                        f"not {type(inputs).__name__}")
    out = []
    for p in inputs:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"{function}: each input must be a str or os.PathLike, "
                            f"not {type(p).__name__}")
        out.append(os.fspath(p))
    return out


def source_path(function: str, usage: str, source: object) -> str:
    """``source`` as a string (one path, never a list)."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{function}: the source must be a str or os.PathLike, "
                        f"not {type(source).__name__} ({usage})")
    return os.fspath(source)


def require_suffix(function: str, usage: str, output: str, suffixes: tuple[str, ...]) -> None:
    """The output must end in one of ``suffixes``: anything else is a swapped call."""
    if not output.endswith(suffixes):
        raise ValueError(
            f"{function} writes {' or '.join(suffixes)}, not {output!r}: arguments go output "
            f"first: {usage}")


def require_directory(function: str, usage: str, directory: str) -> None:
    """A directory output must not be a file, nor, when it does not exist yet, be named like one
    (an existing directory may have any name)."""
    if _sys.isdir(directory):
        return
    if _sys.lexists(directory) or directory.endswith((".safetensors", ".json", ".gguf", ".ptd")):
        raise ValueError(
            f"{function} writes shards into a directory, not into the file {directory!r}: "
            f"arguments go output first: {usage}")


def not_an_input(function: str, output: str, inputs: Iterable[str], *,
                 consume: bool = False, consumable: bool = True) -> None:
    """Refuse an output that names one of the inputs (by name, or the same file by inode),
    unless consuming: then the save parks the consumed input before its commit takes the name
    (and refuses itself an input it would not consume: a symlink, one it may not delete).

    The save refuses an output that is a source of tensor bytes; an index JSON is read but is
    no source of the save, so only this check keeps an operation from writing over it.
    ``consumable=False`` for inputs no save consumes (a model folder's config and tokenizer):
    they are refused with or without ``consume``.
    """
    if consume and consumable:
        return
    out_abs = _sys.abspath(output)
    out_id = _identity(output)
    for p in inputs:
        if _sys.abspath(p) == out_abs or (out_id is not None and _identity(p) == out_id):
            hint = ("consume=True (--consume) makes this possible: the input is then taken "
                    "into the new output" if consumable else
                    "that file is read, never consumed: write the output elsewhere")
            raise SourceIsOutputError(
                f"{function}: the output {output} is also one of the inputs ({p}); {hint}",
                errno=errno.EINVAL)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = _sys.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
