"""The save's log (journal version 4): one file of length-prefixed, checksummed step records.

Theory of operation
-------------------
A journal file is a magic line and then records, one per line::

    LLLLLLLL SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS {"moved": 1, "stage": "moving"}

``L`` is the payload's length (8 hex digits), ``S`` the first 16 bytes of the payload's
sha256 (32 hex digits), the payload canonical JSON in ASCII (so no newline inside it).  Why
sha256 and not CRC32C: it is in the standard library (no dependency), it costs nothing at a
few records per save, and a crafted or single-digit change can neither match by chance nor be
made to (a CRC is linear: one digit changed and a few bytes fixed up elsewhere would pass).

There is one record kind, the *step*: a stage transition of the save (``stages.Stage``), in the
order it happened, each appended and fsynced before what it licenses:

* ``journaled`` with ``save``: the head, what the save is (outputs, some marked *discard*,
  sources, window, the files the commit removes with their identities: :class:`Journal`),
  written **twice** under the ``.filecord-pending`` name, fsynced, then renamed to the journal
  name: a journal name never holds a torn head, and one damaged copy leaves the other to read.
* ``moving`` with ``moved: N``: the first N moved sources (journal order) have finished their
  moves, appended after the last truncate of the Nth is fsynced.
* ``committed`` with ``looked``: the save's last look at each parked source (dev, ino, size,
  mtime), for recover's finish.  The save is COMMITTED once this record's fsync returns; a
  record whose write or fsync failed is cut off before the failure path's own step is
  written (``begin.append_step``); until then a crash keeps it or not, and recover finishes
  or rolls back (nothing was renamed yet).
* ``rolling back`` and ``held``: the failure path (or recover) undoes the save, or holds it
  because another process changed a source mid-move.

An ``adopt`` source (in the head) becomes its output's file where it lies: it is renamed onto
the output's temp and, when its one destination's offset is not 0, that many bytes (a multiple
of the block) are inserted in front of it (``JournalSource.inserted``), then a ``moving`` step
with ``inserted: [dev, ino]`` is appended once the insert is fsynced, before anything is
written into that space.  The size alone cannot say whether the insert happened: a writer that
kept a descriptor could have appended as many bytes before it (the session 33 attack: the
undo then collapsed the source's own first bytes).  Without the step, the temp may be the
source as renamed (its size) or, in the window between the insert's fsync and the step's, the
source behind the inserted space; the undo collapses only when that space is a hole
(``undo._unadopt``).  With it, the temp's size says how far the adoption went.

Replay (:func:`read_log`) is WAL style: records after the head are read in order and stop at
the first that does not check.  What follows it is a torn tail when no later record checks (an
append a crash cut, or one damaged after it was written: the two cannot be told apart, and
either way the save did not rely on it more than on the files, see ``undo``); a bad record
*before* a good one is damage: appends are fsynced one after the other, so a crash cannot
leave that (:class:`JournalDamagedError`, "damaged", never "another process").  The succession
of the steps that check must be one the stage table allows (``stages.may_follow``: a ``moving``
after ``committed``, anything after ``rolling back`` or ``held``, is damage).  The stage of a
crashed save is its last step.  Appends go at the logical end (the end of the last record that
checks), never at the file's size: a torn append followed by the next would otherwise merge
into one overlong line.

The lock files (``liveness``) hold steps in the same framing: ``created`` with the journal's
path, written before any temp, then ``journaled`` once the journal is durable under its name.

Temp and renamed-source paths are not stored: they are derived from the final and source paths
and the token (``_names``), so a crafted record cannot point recovery at other files.
:func:`confine` checks every path a record holds is absolute and normalised and that the
journal sits in its first output's directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._plan.types import BLOCK, MoveSource, PieceRef
from filecord._txn.stages import Stage, may_follow
from filecord.errors import RecoverError

VERSION = 4
MAGIC = b"filecord-journal 4\n"
# The stages a step record may name (the others are never written: FILLED, RENAMED and DONE
# leave nothing a crash needs, FAILED is a running save's end).
RECORDED = frozenset({Stage.CREATED, Stage.JOURNALED, Stage.MOVING, Stage.COMMITTED,
                      Stage.ROLLING_BACK, Stage.HELD})
# Older formats a file may still be in: recover refuses them naming their version.
_OLDER = {b"filecord-journal 2\n": 2, b"filecord-journal 3\n": 3}


class NotAJournalError(RecoverError):
    """The file is not a filecord journal at all (wrong name or no magic): never touched."""


class JournalVersionError(RecoverError):
    """A journal of an older format (version 2 or 3): never touched."""


class JournalDamagedError(RecoverError):
    """The file is a journal (or lock file) but a record that must check does not: it was
    damaged after it was written.  Recovery refuses to act and says "damaged"."""


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
    # Built like the others (a temp, filled, moved into, fsynced) but never published: at the
    # commit its temp is unlinked instead of renamed, and ``final`` only names that temp.  It
    # takes bytes of consumed sources that no published output holds, so those sources can be
    # moved whole (and put back whole by a rollback).
    discard: bool = False


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

    @property
    def inserted(self) -> int:
        """For an adopted source, the bytes inserted in front of it in its output's temp (its
        journaled offset there; 0: a whole-output rename, or one the output starts with)."""
        return self.dests[0].out_offset if self.adopt and self.dests else 0

    def adopted_size(self, size: int, length: int, *, inserted: bool) -> bool:
        """Whether an adoption of this save (or its undo) can have left this adopted source at
        ``size`` at its output's temp, whose complete ``length`` is given; ``inserted``: the
        journal records the insert.  Its own size always; with the insert recorded, from its
        size plus the inserted space up to that length; without, only its size plus the
        inserted space (the insert done, its step not yet: the undo checks the space is a
        hole).  Any other size is a cut or a write by someone else: past the output's end
        the save never writes, and without the insert recorded every byte past the source's
        own is another process's (appended through a descriptor it kept); an undo must not
        cut them off."""
        if size == self.size:
            return True
        if inserted or not self.inserted:  # nothing to insert: nothing to record
            return self.size + self.inserted <= size <= length
        return size == self.size + self.inserted

    def adopted_change(self, size: int, length: int, *, inserted: bool = True) -> str:
        """Why ``size`` is refused by :meth:`adopted_size`, for the error."""
        if not inserted and self.inserted and size > self.size:
            return (f"{size - self.size} bytes follow the source's {self.size}, and the journal "
                    "does not record the space inserted in front of it: another process "
                    "appended them; nothing was cut (the source's bytes are at offset 0 of "
                    "this file, or at "
                    f"{self.inserted} if the insert was done and its record lost)")
        if size > length:
            return (f"another process appended {size - length} bytes past the output's end; "
                    "nothing was cut: the source's bytes are at offset "
                    f"{self.inserted} of this file, the appended ones at {length}")
        return "the adopted source is at a size this save does not leave: another process " \
               "changed it"

    def as_move(self) -> MoveSource:
        return MoveSource((self.dev, self.ino), self.path, self.size, self.run_start, self.dests,
                          self.adopt)


@dataclass(frozen=True, slots=True)
class JournalRemoval:
    """A file that is not the save's, unlinked after the commit point (by the save, or by
    recover's finish) only while it is still the file recorded at the begin: same device,
    inode, size and modification time.  Another file there, or this one changed, is kept."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @property
    def identity(self) -> tuple[int, int, int, int]:
        return (self.dev, self.ino, self.size, self.mtime_ns)


@dataclass(frozen=True, slots=True)
class Journal:
    token: str
    window: int
    outputs: tuple[JournalOutput, ...]
    sources: tuple[JournalSource, ...]
    # Sources listed in the order their moves run (moves first, then the copied/cloned ones):
    # recover's move-order check (``assess.check_order``) relies on it.  Older records are sorted
    # by inode and carry no such promise.
    ordered: bool = False
    # Files the commit removes (:class:`JournalRemoval`), in order.
    removals: tuple[JournalRemoval, ...] = ()

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
             o.old_ino, *([True] if o.discard else [])] for o in j.outputs
        ],
        **({"removals": [[r.path, r.dev, r.ino, r.size, r.mtime_ns] for r in j.removals]}
           if j.removals else {}),
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


def _sum(payload: bytes) -> bytes:
    return hashlib.sha256(payload).hexdigest()[:32].encode()


Step = Mapping[str, object]


def frame(step: Step) -> bytes:
    """One step record: length, checksum and payload on one line."""
    payload = json.dumps(dict(step), sort_keys=True, separators=(",", ":"),
                         ensure_ascii=True).encode()
    return b"%08x %s %s\n" % (len(payload), _sum(payload), payload)


def step(stage: Stage, **fields: object) -> bytes:
    """The framed step record of ``stage`` with its fields."""
    return frame({"stage": stage.value, **fields})


def stage_of(record: Step) -> Stage:
    return Stage(record["stage"])


def unframe(line: bytes) -> dict[str, object]:
    """The step of one record line (without its newline); ValueError if it does not check:
    wrong length, wrong checksum, not JSON, not a step of a recorded stage."""
    if len(line) < 42 or line[8:9] != b" " or line[41:42] != b" ":
        raise ValueError("not a record")
    length, digest, payload = line[:8], line[9:41], line[42:]
    if not all(c in b"0123456789abcdef" for c in length) or int(length, 16) != len(payload):
        raise ValueError("its length does not match")
    if digest != _sum(payload):
        raise ValueError("checksum mismatch")
    record = json.loads(payload)
    if isinstance(record, dict) and "kind" in record:
        raise ValueError("a record of journal version 3")
    if not isinstance(record, dict) or Stage(record.get("stage")) not in RECORDED:
        raise ValueError("not a step record")
    return record


@dataclass(frozen=True, slots=True)
class Replay:
    """The records of a log that check, in order, up to the first that does not."""

    records: tuple[dict[str, object], ...]
    torn: bool = False  # a tail that does not check (cut by a crash): ignored
    damage: str | None = None  # a record that does not check before one that does: why


def _checks(line: bytes) -> bool:
    try:
        unframe(line)
    except (ValueError, KeyError, TypeError):
        return False
    return True


def _overlong(line: bytes) -> bool:
    """Whether a line is longer than the record its (intact) header announces: a damaged
    newline merged it with the next record.  A cut record is only ever shorter."""
    head = line[:8]
    return (len(head) == 8 and all(c in b"0123456789abcdef" for c in head)
            and line[8:9] == b" " and len(line) > 42 + int(head, 16))


def replay(lines: list[bytes], *, torn_tail: bool, after: Stage | None = None) -> Replay:
    """WAL replay of whole record lines: stop at the first that does not check; it is damage
    when a later line checks or it runs into a record that followed it, else the torn tail.
    The steps that check must follow each other as the stage table allows (from ``after``,
    the stage of the records before these, if any): a succession no save writes is damage."""
    records: list[dict[str, object]] = []
    for n, line in enumerate(lines, start=1):
        try:
            records.append(unframe(line))
        except (ValueError, KeyError, TypeError) as exc:  # noqa: PERF203 - stops at the first
            later = next((m for m, rest in enumerate(lines[n:], start=n + 1) if _checks(rest)),
                         None)
            if later is not None:
                return Replay(tuple(records), torn_tail,
                              f"record {n} ({exc}) before record {later}, which checks")
            if _overlong(line):
                return Replay(tuple(records), torn_tail,
                              f"record {n} ({exc}) runs into the record after it")
            return Replay(tuple(records), torn=True, damage=_succession(records, after))
    return Replay(tuple(records), torn_tail, _succession(records, after))


def _succession(records: list[dict[str, object]], after: Stage | None) -> str | None:
    prev = after
    for n, rec in enumerate(records, start=1):
        now = stage_of(rec)
        if prev is not None and not may_follow(prev, now):
            return f"record {n} ({now.value}) cannot follow a {prev.value} step"
        prev = now
    return None


def split_lines(data: bytes) -> tuple[list[bytes], bool]:
    """Whole lines, and whether a cut last line (no newline: a torn append) followed them."""
    lines = data.split(b"\n")
    return lines[:-1], lines[-1] != b""


def encode(j: Journal) -> bytes:
    """The journal as written under its pending name: magic and the head, twice."""
    head = step(Stage.JOURNALED, save=_body(j))
    return MAGIC + head + head


def encode_moving(done: int) -> bytes:
    return step(Stage.MOVING, moved=done)


def encode_inserted(done: int, key: tuple[int, int]) -> bytes:
    """The adopted source ``key`` has the space inserted in front of it, durably."""
    return step(Stage.MOVING, moved=done, inserted=list(key))


def encode_committed(looks: list[tuple[int, int, int, int]]) -> bytes:
    return step(Stage.COMMITTED, looked=[list(look) for look in looks])


@dataclass(frozen=True, slots=True)
class Log:
    """A journal read back: its head, its last step's stage and what its steps say."""

    journal: Journal
    moved: int = 0  # the first N moved sources (journal order) have finished, durably
    # adopted sources whose inserted space is durable (their ``inserted`` steps)
    inserted: frozenset[tuple[int, int]] = frozenset()
    looked: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    torn: bool = False
    # The stage of a crashed save: its last step (MOVING when the head is the last: whether
    # a source was touched, the files tell).
    stage: Stage = Stage.MOVING
    end: int = 0  # the logical end: where the next step is appended


def _head(data: bytes) -> tuple[Journal, list[bytes], bool, int]:
    """The head record, the whole lines after the magic line, whether a torn tail follows,
    and the offset of the first of those lines."""
    lines, torn = split_lines(data)
    start = 0
    if lines and not data.startswith(MAGIC):
        try:  # the magic line itself damaged: the checksum, not the position, is the proof
            unframe(lines[0])
        except (ValueError, KeyError, TypeError):
            start = len(lines[0]) + 1
            lines = lines[1:]
    elif lines:
        start = len(lines[0]) + 1
        lines = lines[1:]
    problems: list[str] = []
    for n, line in enumerate(lines[:2], start=1):
        try:
            rec = unframe(line)
            if stage_of(rec) is not Stage.JOURNALED or "save" not in rec:
                raise ValueError(f"a {rec['stage']} step where the head belongs")
            return _parse(rec["save"]), lines, torn, start
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # noqa: PERF203 - two
            problems.append(f"copy {n}: {exc}")
    for magic, version in _OLDER.items():
        if data.startswith(magic):  # and no record of this version checks
            raise JournalVersionError(
                f"the journal was written by an older filecord (journal version {version}): "
                "recover it with the filecord that wrote it; nothing was touched")
    if not data.startswith(MAGIC[:9]):
        raise NotAJournalError("the file is not a filecord journal (no magic line, no record)")
    raise JournalDamagedError(
        "the journal is damaged: no copy of its head record checks out ("
        + "; ".join(problems or ["empty"]) + ")"
    )


def decode(data: bytes) -> Journal:
    """The head record in ``data``; :class:`NotAJournalError` or :class:`JournalDamagedError`.

    Either copy whose checksum holds is the record, even when the magic line or the other copy
    is damaged."""
    return _head(data)[0]


def read_log(data: bytes) -> Log:
    """The head and the steps after it (WAL replay); :class:`JournalDamagedError` when a
    record that does not check comes before one that does (damage, not a crash: a crash only
    cuts the tail), or when the steps follow each other in a way no save writes.  The head's
    second copy counts as such a record: a damaged newline merges it with the first step,
    which must not vanish unnoticed."""
    j, lines, torn, start = _head(data)
    rest = lines[2:]
    if len(lines) > 1 and not _checks(lines[1]) and (
        _overlong(lines[1]) or any(_checks(line) for line in rest)
    ):
        raise JournalDamagedError("the journal is damaged: the second copy of its head does "
                                  "not check out, and a later record does")
    r = replay(rest, torn_tail=torn, after=Stage.JOURNALED)
    if r.damage is not None:
        raise JournalDamagedError(f"the journal is damaged: {r.damage}")
    try:
        moved, inserted, looked, stage = _steps(r.records)
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalDamagedError(f"the journal is damaged: a step that checks says {exc}") \
            from None
    end = start + sum(len(line) + 1 for line in lines[:2 + len(r.records)])
    return Log(j, moved, inserted, looked, r.torn, stage, end)


def _steps(records: tuple[dict[str, object], ...]
           ) -> tuple[int, frozenset[tuple[int, int]], dict[tuple[int, int], tuple[int, int]],
                      Stage]:
    """What the steps after the head say: moves finished, inserts done, last looks, the last
    stage."""
    moved = 0
    inserted: set[tuple[int, int]] = set()
    looked: dict[tuple[int, int], tuple[int, int]] = {}
    stage = Stage.MOVING
    for rec in records:
        stage = stage_of(rec)
        if stage is Stage.JOURNALED:
            stage = Stage.MOVING
        elif stage is Stage.MOVING:  # the most any says: the files decide the rest
            moved = max(moved, _int(rec["moved"]))
            if "inserted" in rec:
                dev, ino = (_int(v) for v in _list(rec["inserted"]))
                inserted.add((dev, ino))
        elif stage is Stage.COMMITTED:
            for look in _list(rec["looked"]):
                dev, ino, size, mtime = (_int(v) for v in _list(look))
                looked[(dev, ino)] = (size, mtime)
    return moved, frozenset(inserted), looked, stage


def _list(v: object) -> list[object]:
    if not isinstance(v, list):
        raise TypeError(f"{v!r} is not a list")
    return v


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{v!r} is not a string")
    return v


def _parse(body: object) -> Journal:
    if not isinstance(body, dict):
        raise TypeError("the head is not an object")
    if body["version"] != VERSION:
        raise ValueError(f"version {body['version']!r} is not {VERSION}")
    outputs = tuple(_output(o) for o in body["outputs"])
    removals = tuple(
        JournalRemoval(_str(p), _int(d), _int(i), _int(n), _int(m))
        for p, d, i, n, m in body.get("removals", [])
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
                   ordered=body.get("ordered") is True, removals=removals)


def _output(o: object) -> JournalOutput:
    """One output entry: ten fields, and an eleventh ``true`` for a discard output (a head
    written before discard outputs existed has ten)."""
    if not isinstance(o, list) or len(o) not in (10, 11):
        raise ValueError("an output entry is not a list of 10 or 11 fields")
    f, d, i, n, m, u, g, x, od, oi = o[:10]
    if len(o) == 11 and o[10] is not True:
        raise ValueError("an output's discard mark is not true")
    return JournalOutput(_str(f), _int(d), _int(i), _int(n), _int(m), _int(u), _int(g),
                         bool(x), _int(od), _int(oi), discard=len(o) == 11)


def _clean(path: str) -> bool:
    return os.path.isabs(path) and os.path.normpath(path) == path and "\0" not in path


def _confine_source(j: Journal, s: JournalSource, journal_path: str) -> None:
    """One source of :func:`confine`: its path clean, its ranges inside it and its outputs."""
    if not _clean(s.path):
        raise JournalDamagedError(f"{journal_path}: source path {s.path!r} is not confined")
    if not 0 <= s.run_start <= s.size:
        raise JournalDamagedError(f"{journal_path}: {s.path}: run start out of range")
    if s.adopt and (len(s.dests) != 1 or s.dests[0].src_offset != 0
                    or s.dests[0].length != s.size or s.dests[0].out_offset % BLOCK):
        raise JournalDamagedError(f"{journal_path}: {s.path}: an adopted source must be "
                                  "one whole range at a block-aligned offset")
    for d in s.dests:
        if not 0 <= d.output < len(j.outputs) or j.outputs[d.output].direct:
            raise JournalDamagedError(f"{journal_path}: {s.path}: bad destination")
        if d.length < 0 or d.src_offset < 0 or d.out_offset < 0:
            raise JournalDamagedError(f"{journal_path}: {s.path}: negative range")
        if d.src_offset + d.length > s.size:
            raise JournalDamagedError(f"{journal_path}: {s.path}: range past the source")
        if d.out_offset + d.length > j.outputs[d.output].length:
            raise JournalDamagedError(f"{journal_path}: {s.path}: range past the output")


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
        _confine_source(j, s, journal_path)
    dirs = j.directories()
    for o in j.outputs:
        if o.discard and o.direct:
            raise JournalDamagedError(f"{journal_path}: {o.final}: a discard output is direct")
    # A file the commit removes is not named by the token, so it must at least sit where the
    # save worked: beside an output with a temp (a direct output's directory holds no lock
    # file of the save) or a source (``undo.discard_and_remove`` asks recover for proof there).
    near = set(dirs) | {os.path.dirname(s.path) for s in j.sources}
    for r in j.removals:
        if not _clean(r.path) or os.path.dirname(r.path) not in near:
            raise JournalDamagedError(f"{journal_path}: removal path {r.path!r} is not confined")
        if r.path in {o.final for o in j.outputs} | {s.path for s in j.sources}:
            raise JournalDamagedError(f"{journal_path}: {r.path} is both removed and saved")
    here = _sys.realpath(os.path.dirname(_sys.abspath(journal_path)))
    if not dirs or dirs[0] != here:
        raise JournalDamagedError(
            f"{journal_path}: the journal is not in its first output's directory"
        )
