"""Every format filecord reads and writes, as the kit's protocol sees them (one registration
per format, each in its package's ``_protocol`` module), and finding a file's format by its
first bytes.  Above the format packages, below the command line."""

from __future__ import annotations

import os

from filecord._kit.protocol import Capability, Format, PathLike
from filecord.executorch._protocol import PTD, PTE
from filecord.gguf._protocol import GGUF
from filecord.safetensors._protocol import SAFETENSORS

FORMATS: tuple[Format, ...] = (PTE, PTD, SAFETENSORS, GGUF)


def sniff(path: PathLike) -> Format | None:
    """The format whose first bytes ``path`` starts with (None: none, or not a regular file;
    a FIFO or a device is never opened for a blocking read)."""
    return next((f for f in FORMATS if f.sniff(path)), None)


def by_suffix(path: PathLike) -> Format | None:
    """The format whose suffix ``path`` ends with (the longest match), whatever it holds."""
    name = os.fspath(path)
    matches = [(len(sfx), f) for f in FORMATS for sfx in f.suffixes if name.endswith(sfx)]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def able_to(capability: Capability) -> tuple[Format, ...]:
    """The formats whose flags include ``capability``."""
    return tuple(f for f in FORMATS if capability in f.capabilities)
