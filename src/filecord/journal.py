"""The save journal's record: encode and decode, pure.

A journal is two lines of JSON.  The first describes the transaction and carries a sha256 of
itself, so a torn or garbled write is recognised instead of trusted.  The second line, appended
and synced at the commit point, says ``committed``; anything else there (nothing, half a line,
garbage) means "not committed".  Writing it is the single atomic step that turns "roll back"
into "finish": before it, recovery restores the sources; after it, recovery completes the
renames.  ``save.py`` and ``recover.py`` do the I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from filecord.errors import RecoverError
from filecord.plan import MoveSource, PieceRef

VERSION = 1
SUFFIX = ".filecord-journal"
TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class JournalOutput:
    """An output: its temp, its final name, and the temp's identity and length, so recovery
    can tell "already renamed" (the final name is that inode) from "lost"."""

    final: str
    temp: str
    dev: int = 0
    ino: int = 0
    length: int = 0


@dataclass(frozen=True)
class JournalSource:
    """A source the transaction may shorten (``run_start < size``) or delete at commit."""

    path: str
    dev: int
    ino: int
    size: int
    run_start: int
    atime_ns: int
    mtime_ns: int
    unlink_at_commit: bool
    dests: tuple[PieceRef, ...]
    adopted_to: str = ""  # the temp the whole file is renamed onto (adoption), else ""

    def as_move(self) -> MoveSource:
        return MoveSource((self.dev, self.ino), self.path, self.size, self.run_start, self.dests,
                          bool(self.adopted_to))


@dataclass(frozen=True)
class Journal:
    token: str
    outputs: tuple[JournalOutput, ...]
    sources: tuple[JournalSource, ...]
    committed: bool = False


COMMIT_LINE = b'{"committed": true}\n'


def _body(j: Journal) -> dict[str, object]:
    return {
        "version": VERSION,
        "token": j.token,
        "outputs": [[o.final, o.temp, o.dev, o.ino, o.length] for o in j.outputs],
        "sources": [
            {
                "path": s.path,
                "dev": s.dev,
                "ino": s.ino,
                "size": s.size,
                "run_start": s.run_start,
                "atime_ns": s.atime_ns,
                "mtime_ns": s.mtime_ns,
                "unlink_at_commit": s.unlink_at_commit,
                "dests": [[d.output, d.out_offset, d.length, d.src_offset] for d in s.dests],
                "adopted_to": s.adopted_to,
            }
            for s in j.sources
        ],
    }


def _digest(body: dict[str, object]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(j: Journal) -> bytes:
    """The first line (with its checksum); the commit line is :data:`COMMIT_LINE`."""
    body = _body(j)
    record = {"body": body, "sha256": _digest(body)}
    return json.dumps(record, sort_keys=True, ensure_ascii=True).encode() + b"\n"


def decode(data: bytes) -> Journal | None:
    """The journal in ``data``; ``None`` if its first line is torn or garbled.

    Raises :class:`RecoverError` for a well-formed record of an unknown version, which must
    not be guessed at.
    """
    first, nl, rest = data.partition(b"\n")
    if not nl:
        return None
    try:
        record = json.loads(first)
        body = record["body"]
        if record["sha256"] != _digest(body):
            return None
    except (ValueError, KeyError, TypeError):
        return None
    if body.get("version") != VERSION:
        raise RecoverError(f"journal version {body.get('version')!r} is not {VERSION}")
    try:
        outputs = tuple(
            JournalOutput(str(f), str(t), int(d), int(i), int(n))
            for f, t, d, i, n in body["outputs"]
        )
        sources = tuple(
            JournalSource(
                path=str(s["path"]),
                dev=int(s["dev"]),
                ino=int(s["ino"]),
                size=int(s["size"]),
                run_start=int(s["run_start"]),
                atime_ns=int(s["atime_ns"]),
                mtime_ns=int(s["mtime_ns"]),
                unlink_at_commit=bool(s["unlink_at_commit"]),
                adopted_to=str(s.get("adopted_to", "")),
                dests=tuple(
                    PieceRef(int(o), 0, int(off), int(n), (int(s["dev"]), int(s["ino"])), int(so))
                    for o, off, n, so in s["dests"]
                ),
            )
            for s in body["sources"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RecoverError(f"journal record is checksummed but malformed: {exc}") from exc
    committed = rest.split(b"\n", 1)[0] + b"\n" == COMMIT_LINE
    return Journal(str(body["token"]), outputs, sources, committed)
