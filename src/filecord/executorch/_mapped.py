"""Which file range, if any, a block of this process's memory is a clean mapping of.

Theory of operation
-------------------
A tensor loaded with ``torch.load(mmap=True)``, ``torch.from_file`` or from a memory-mapped
safetensors file has its bytes in a file mapping.  Writing those bytes out of the file (by the
kernel) instead of out of memory is the same data when three things hold, all read from
``/proc/self/smaps`` (through the seam) at the time of the save:

* the memory lies inside one mapping of a named file, whose device and inode still match the
  file now found at that path (a file replaced or deleted since it was mapped does not count);
* the mapping has no anonymous pages: a private mapping whose page was written holds that page
  in anonymous memory, and the file no longer shows what the tensor holds.  Any such page
  anywhere in the mapping rules the whole mapping out;
* the range lies inside the file as it is now.

Anything else is streamed from memory.  The answer is a plain :class:`~filecord.FileBackedData`
range: from then on filecord re-checks the file's identity on every read, as for any piece.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData

SMAPS = "/proc/self/smaps"


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int
    dev: tuple[int, int]
    inode: int
    path: str
    anonymous_kb: int
    shared: bool  # MAP_SHARED: a write through it goes to the file, maybe without a new mtime


def parse_smaps(text: str) -> list[Mapping]:
    """File mappings (with an inode) listed in ``text``, in address order."""
    out: list[Mapping] = []
    head: list[str] | None = None
    anon = 0

    def flush() -> None:
        if head is not None and len(head) >= 6 and int(head[4]) != 0:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            major, minor = (int(x, 16) for x in head[3].split(":"))
            out.append(Mapping(lo, hi, int(head[2], 16), (major, minor), int(head[4]),
                               " ".join(head[5:]), anon, head[1].endswith("s")))

    for line in text.splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and not first.endswith(":"):
            flush()
            head, anon = line.split(), 0
        elif first == "Anonymous:":
            anon = int(line.split()[1])
    flush()
    return out


class MappedFiles:
    """Answers :meth:`range_of` from one reading of ``/proc/self/smaps``."""

    def __init__(self, text: str | None = None) -> None:
        if text is None:
            try:
                text = _sys.read_text(SMAPS, limit=256 << 20)
            except FileNotFoundError:  # no /proc: no mapping is known, every storage streams
                text = ""
        self._maps = parse_smaps(text)

    def range_of(self, address: int, size: int) -> FileBackedData | None:
        """The file range holding ``size`` bytes at ``address``, or None (see module doc)."""
        if size <= 0:
            return None
        for m in self._maps:
            if m.start <= address and address + size <= m.end:
                return self._range(m, address, size)
        return None

    def _at(self, address: int) -> Mapping | None:
        return next((m for m in self._maps if m.start <= address < m.end), None)

    def state_at(self, address: int) -> tuple[int, ...] | None:
        """(device, inode, size, mtime, ctime) of the file mapped at ``address`` while the path
        still names the mapped file, else None.  Every write, truncate or ``utime`` moves the
        ctime, which no caller can set back."""
        m = self._at(address)
        if m is None:
            return None
        try:
            st = _sys.stat(m.path)
        except OSError:
            return None
        if st.st_ino != m.inode or (os.major(st.st_dev), os.minor(st.st_dev)) != m.dev:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def cut_short(self, address: int, size: int, file_size: int) -> str | None:
        """The path of the file mapped at ``address`` when ``file_size`` (its size now, from
        :meth:`state_at`) ends before the ``size`` bytes there (reading them would raise
        SIGBUS), else None."""
        m = self._at(address)
        if m is None:
            return None
        return m.path if m.offset + (address - m.start) + size > file_size else None

    def shared_at(self, address: int) -> bool:
        """Whether ``address`` lies in a shared mapping (the file's mtime may then not move
        when the memory is written: only a clean page's first write fault sets it)."""
        return any(m.start <= address < m.end and m.shared for m in self._maps)

    def _range(self, m: Mapping, address: int, size: int) -> FileBackedData | None:
        if m.anonymous_kb:
            return None
        try:
            data = FileBackedData(m.path, offset=m.offset + (address - m.start), length=size)
        except (OSError, ValueError):  # gone, not a regular file, or shorter than the range
            return None
        found = data.identity
        same = (found.ino == m.inode
                and (os.major(found.dev), os.minor(found.dev)) == m.dev)
        return data if same else None
