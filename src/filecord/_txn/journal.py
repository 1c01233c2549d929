"""The save journal's record (version 2): encode, decode and confine, pure.

A journal file is a magic line followed by the same record twice, each copy a line of JSON
carrying a sha256 of itself.  One damaged copy (a flipped bit, zeroed or replaced bytes, a
truncation inside the second copy) leaves the other one to read; when neither copy checks out
the journal is *damaged* and recovery refuses to act on it.  The file is written under a
``.filecord-pending`` name, fsynced, and only then renamed to its journal name, so a journal
name never holds a torn record after a crash: whatever fails to parse there was damaged later.

The stage of the transaction is not in the content at all but in the file's *name* (see
``stages``): renames are atomic, and damage to the bytes cannot turn "roll back" into
"finish".  ``save.py`` writes the file; ``recover.py`` reads it; ``undo.py`` acts on it.

Temp and renamed-source paths are not stored: they are derived from the final and source paths
and the token (``_names``), so a crafted record cannot point recovery at other files.
:func:`confine` checks every path a record holds is absolute and normalised and that the
journal sits in its first output's directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._plan.types import MoveSource, PieceRef
from filecord.errors import RecoverError

VERSION = 2
MAGIC = b"filecord-journal 2\n"


class NotAJournalError(RecoverError):
    """The file is not a filecord journal at all (wrong name or no magic): never touched."""


class JournalDamagedError(RecoverError):
    """The file is a journal but no copy of its record checks out: recovery refuses to act."""


@dataclass(frozen=True, slots=True)
class JournalOutput:
    """An output: its final name, the identity and length its temp has when complete, and
    the mode/owner to give it (``-1``: leave as created)."""

    final: str
    dev: int
    ino: int
    length: int
    mode: int = -1
    uid: int = -1
    gid: int = -1
    direct: bool = False  # a FIFO or device written in place: no temp, nothing to recover
    old_dev: int = 0  # the file the save replaces (0, 0: the name was free)
    old_ino: int = 0


@dataclass(frozen=True, slots=True)
class JournalSource:
    """An owned source the save shortens (``run_start < size``), adopts, or deletes at commit."""

    path: str
    dev: int
    ino: int
    size: int
    run_start: int
    atime_ns: int
    mtime_ns: int
    mode: int
    dests: tuple[PieceRef, ...]
    adopt: bool = False
    dense: bool = False  # no holes when journaled: a hole in a temp then proves tampering

    def as_move(self) -> MoveSource:
        return MoveSource((self.dev, self.ino), self.path, self.size, self.run_start, self.dests,
                          self.adopt)


@dataclass(frozen=True, slots=True)
class Journal:
    token: str
    window: int
    outputs: tuple[JournalOutput, ...]
    sources: tuple[JournalSource, ...]
    # Sources listed in the order their moves run (moves first, then the copied/cloned ones):
    # recover's move-order check (``undo.check_order``) relies on it.  Older records are sorted
    # by inode and carry no such promise.
    ordered: bool = False

    def temp(self, o: int) -> str:
        """Output ``o``'s temp path (derived, never stored)."""
        return _names.sibling(self.outputs[o].final, self.token, _names.TEMP)

    def parked(self, s: JournalSource) -> str:
        """Where source ``s`` sits, renamed with the token, between journal and commit."""
        return _names.sibling(s.path, self.token, _names.SOURCE)

    def directories(self) -> list[str]:
        """Every directory holding a temp, in output order, without repeats."""
        return list(dict.fromkeys(
            os.path.dirname(o.final) for o in self.outputs if not o.direct
        ))


def _body(j: Journal) -> dict[str, object]:
    return {
        "version": VERSION,
        "token": j.token,
        "window": j.window,
        **({"ordered": True} if j.ordered else {}),
        "outputs": [
            [o.final, o.dev, o.ino, o.length, o.mode, o.uid, o.gid, o.direct, o.old_dev,
             o.old_ino] for o in j.outputs
        ],
        "sources": [
            {
                "path": s.path, "dev": s.dev, "ino": s.ino, "size": s.size,
                "run_start": s.run_start, "atime_ns": s.atime_ns, "mtime_ns": s.mtime_ns,
                "mode": s.mode, "adopt": s.adopt, "dense": s.dense,
                "dests": [[d.output, d.out_offset, d.length, d.src_offset] for d in s.dests],
            }
            for s in j.sources
        ],
    }


def _digest(body: object) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(j: Journal) -> bytes:
    body = _body(j)
    line = json.dumps({"body": body, "sha256": _digest(body)}, sort_keys=True,
                      ensure_ascii=True).encode() + b"\n"
    return MAGIC + line + line


def decode(data: bytes) -> Journal:
    """The record in ``data``; :class:`NotAJournalError` or :class:`JournalDamagedError`.

    Any line whose checksum holds is the record, even when the magic line or the other copy is
    damaged: the checksum, not the position, is the proof.
    """
    problems: list[str] = []
    lines = data.split(b"\n")
    for n, line in enumerate(lines[1:] if data.startswith(MAGIC) else lines, start=1):
        if not line.strip():
            continue
        try:
            return _parse(line)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            problems.append(f"line {n}: {exc}")
    if not data.startswith(MAGIC[:9]):
        raise NotAJournalError("the file is not a filecord journal (no magic line, no record)")
    raise JournalDamagedError(
        "no copy of the journal's record checks out (" + "; ".join(problems or ["empty"]) + ")"
    )


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{v!r} is not a string")
    return v


def _parse(line: bytes) -> Journal:
    record = json.loads(line)
    body = record["body"]
    if record["sha256"] != _digest(body):
        raise ValueError("checksum mismatch")
    if body["version"] != VERSION:
        raise ValueError(f"version {body['version']!r} is not {VERSION}")
    outputs = tuple(
        JournalOutput(_str(f), _int(d), _int(i), _int(n), _int(m), _int(u), _int(g), bool(x),
                      _int(od), _int(oi))
        for f, d, i, n, m, u, g, x, od, oi in body["outputs"]
    )
    sources = []
    for s in body["sources"]:
        key = (_int(s["dev"]), _int(s["ino"]))
        sources.append(JournalSource(
            path=_str(s["path"]), dev=key[0], ino=key[1], size=_int(s["size"]),
            run_start=_int(s["run_start"]), atime_ns=_int(s["atime_ns"]),
            mtime_ns=_int(s["mtime_ns"]), mode=_int(s["mode"]), adopt=bool(s["adopt"]),
            dense=bool(s["dense"]),
            dests=tuple(
                PieceRef(_int(o), 0, _int(off), _int(n), key, _int(so))
                for o, off, n, so in s["dests"]
            ),
        ))
    token = _str(body["token"])
    if not _names.is_token(token):
        raise ValueError(f"token {token!r} is malformed")
    return Journal(token, _int(body["window"]), outputs, tuple(sources),
                   ordered=body.get("ordered") is True)


def _clean(path: str) -> bool:
    return os.path.isabs(path) and os.path.normpath(path) == path and "\0" not in path


def confine(j: Journal, journal_path: str) -> None:
    """Refuse a record whose paths could reach beyond the save that wrote it.

    Every path must be absolute and normalised (no ``..``, no doubled separators), indexes and
    ranges must be in bounds, the token must be the one in the journal's name, and the journal
    must sit in its first output's directory (``journal_path``'s directory, resolved).
    """
    parsed = _names.parse(os.path.basename(journal_path))
    if parsed is None or parsed[0] != j.token:
        raise JournalDamagedError(f"{journal_path}: the record's token is not the one in its name")
    if j.window < 1:
        raise JournalDamagedError(f"{journal_path}: window {j.window} is not positive")
    for o in j.outputs:
        if not _clean(o.final):
            raise JournalDamagedError(f"{journal_path}: output path {o.final!r} is not confined")
    for s in j.sources:
        if not _clean(s.path):
            raise JournalDamagedError(f"{journal_path}: source path {s.path!r} is not confined")
        if not 0 <= s.run_start <= s.size:
            raise JournalDamagedError(f"{journal_path}: {s.path}: run start out of range")
        for d in s.dests:
            if not 0 <= d.output < len(j.outputs) or j.outputs[d.output].direct:
                raise JournalDamagedError(f"{journal_path}: {s.path}: bad destination")
            if d.length < 0 or d.src_offset < 0 or d.out_offset < 0:
                raise JournalDamagedError(f"{journal_path}: {s.path}: negative range")
            if d.src_offset + d.length > s.size:
                raise JournalDamagedError(f"{journal_path}: {s.path}: range past the source")
            if d.out_offset + d.length > j.outputs[d.output].length:
                raise JournalDamagedError(f"{journal_path}: {s.path}: range past the output")
    dirs = j.directories()
    here = _sys.realpath(os.path.dirname(_sys.abspath(journal_path)))
    if not dirs or dirs[0] != here:
        raise JournalDamagedError(
            f"{journal_path}: the journal is not in its first output's directory"
        )
