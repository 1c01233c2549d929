"""Every format filecord reads and writes, as the kit's protocol sees them (one registration
per format, each in its package's ``_protocol`` module), and finding a file's format by its
first bytes.  Above the format packages, below the command line."""

from __future__ import annotations

from filecord._kit.protocol import Capability, Format, PathLike
from filecord.executorch._protocol import PTD, PTE
from filecord.gguf._protocol import GGUF
from filecord.safetensors._protocol import SAFETENSORS

FORMATS: tuple[Format, ...] = (PTE, PTD, SAFETENSORS, GGUF)


def sniff(path: PathLike) -> Format | None:
    """The format whose first bytes ``path`` starts with (None: none, or not a regular file;
    a FIFO or a device is never opened for a blocking read)."""
    return next((f for f in FORMATS if f.sniff(path)), None)


def able_to(capability: Capability) -> tuple[Format, ...]:
    """The formats whose flags include ``capability``."""
    return tuple(f for f in FORMATS if capability in f.capabilities)
