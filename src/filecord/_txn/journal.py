"""The save's log (journal version 6): one file of length-prefixed, checksummed step records.

Theory of operation
-------------------
A magic line, then one record per line::

    LLLLLLLL SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS {"moved": 1, "stage": "moving"}

``L`` is the payload's length (8 hex digits), ``S`` the first 16 bytes of its sha256 (unlike a
CRC, no digit changed elsewhere can make it match), the payload canonical ASCII JSON.  The one
record kind is the *step*, a stage entered (``stages.Stage``), appended and fsynced before what
it licenses:

* ``journaled`` with ``save``, the head (:class:`Journal`), written under the
  ``.filecord-pending`` name, fsynced, then renamed: a journal name never holds a torn head, so
  a magic line or head that does not check is damage;
* ``moving`` with ``cut: [dev, ino, size]``, after a window's fsync in the temps and before the
  truncate (a truncate may not reach the disk, none runs before its step: ``Log.cuts``);
* ``moving`` with ``moved: N`` once the Nth moved source's last truncate is fsynced, and with
  ``inserted: [dev, ino]`` once an adopted file's inserted space is (its size alone cannot
  say: a writer may have appended as much);
* ``committed`` with ``looked`` (the last look at each parked source): the commit point once
  fsynced (``begin.append_step`` cuts a failed one off before the next step);
* ``rolling back``, then one with ``rebuilt: [dev, ino, new_dev, new_ino]`` per source
  rebuilt in a new file (``undo``: its token name had another link) before that file is
  linked under the source's name: the proof that the file there is the rollback's own;
* ``held``; the lock files (``liveness``) hold ``created`` (the journal's path) and ``journaled``.

:func:`read_log` replays WAL style, strictly: it stops at the first record that does not check,
a torn tail when no later record checks, else damage (a crash only cuts the tail).  A record
whose checksum holds but that no save writes, bytes after a complete last record, or steps in
an order the stage table forbids (``stages.may_follow``) are damage too, never "another
process".  Appends go at the logical end (after the last record that checks), so a torn one is
overwritten, not merged.  Temp and parked paths are derived from the token, never stored;
:func:`confine` bounds every path and range a head holds (the trust rule, ``decide``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._plan.plan import cover
from filecord._plan.types import BLOCK, MoveSource, PieceRef
from filecord._txn.stages import Stage, may_follow
from filecord.errors import RecoverError

VERSION = 6
MAGIC = b"filecord-journal 6\n"
# The stages a step may name and the fields it may carry, as the save writes them (strict:
# anything else is damage).  FILLED, RENAMED and DONE leave nothing a crash needs.
_FIELDS: dict[Stage, tuple[frozenset[str], ...]] = {
    Stage.CREATED: (frozenset({"journal"}),),
    Stage.JOURNALED: (frozenset(), frozenset({"save"})),
    Stage.MOVING: (frozenset({"moved"}), frozenset({"moved", "inserted"}), frozenset({"cut"})),
    Stage.COMMITTED: (frozenset({"looked"}),),
    Stage.ROLLING_BACK: (frozenset(), frozenset({"rebuilt"})),
    Stage.HELD: (frozenset(),),
}


class NotAJournalError(RecoverError):
    """The file is not a filecord journal at all (wrong name or no magic): never touched."""


class JournalVersionError(RecoverError):
    """A journal of another format version: FOREIGN, never touched."""


class JournalDamagedError(RecoverError):
    """A record of a journal (or lock file) that must check does not: refused as "damaged"."""


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
    # Built like the others but unlinked at the commit (``final`` only names its temp): it
    # takes the bytes of consumed sources no published output holds, so they move whole.
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
        """The bytes inserted in front of an adopted source in its output's temp (its offset)."""
        return self.dests[0].out_offset if self.adopt and self.dests else 0

    def adopted_refusal(self, size: int, length: int, *, inserted: bool,
                        hole: bool = True) -> str | None:
        """Why its adoption (or undo) cannot have left the adopted source at ``size`` at its
        temp (None: it can): its own; up to ``length`` from its size plus the space once the
        insert is recorded; exactly that before (done, its step not yet, where ``hole``: the
        space in front is one).  Else another process's."""
        unrecorded = not inserted and self.inserted
        if size == self.size or (size == self.size + self.inserted and hole if unrecorded
                                 else self.size + self.inserted <= size <= length):
            return None
        if unrecorded and size > self.size:
            return (f"{size - self.size} bytes follow the source's {self.size}, and the journal "
                    "does not record the space inserted in front of it: another process "
                    "appended them; nothing was cut (the source's bytes are at offset 0 of "
                    f"this file, or at {self.inserted} if the insert was done and its record "
                    "lost)")
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
    """A file that is not the save's, unlinked after the commit point only while it is still
    the file recorded (device, inode, size, mtime); otherwise kept."""

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
    removals: tuple[JournalRemoval, ...] = ()  # unlinked at the commit, in order

    def temp(self, o: int) -> str:
        return _names.sibling(self.outputs[o].final, self.token, _names.TEMP)

    def parked(self, s: JournalSource) -> str:
        return _names.sibling(s.path, self.token, _names.SOURCE)

    def locks(self) -> dict[str, str]:
        """Each directory holding a temp (in output order) -> its lock file (:func:`lock_files`)."""
        return lock_files((o.final for o in self.outputs if not o.direct), self.token)

    def by_key(self) -> dict[tuple[int, int], JournalSource]:
        return {(s.dev, s.ino): s for s in self.sources}

    def moved(self) -> list[JournalSource]:
        """The sources a move shortens, in the order the moves run."""
        return [s for s in self.sources if not s.adopt and s.run_start < s.size]


def lock_files(finals: Iterable[str], token: str) -> dict[str, str]:
    """Per directory of ``finals`` (first seen first), its lock file, named after its first
    output: the save makes them, recover takes the same names."""
    firsts: dict[str, str] = {}
    for final in finals:
        firsts.setdefault(os.path.dirname(final), final)
    return {d: _names.sibling(f, token, _names.LOCK) for d, f in firsts.items()}


# The head's fields as written, in order (an output, a removal and a range are lists, a source
# an object with its ``dests`` besides): its encoding and its strict parsing both read them here.
_OUTPUT = (("final", str), ("dev", int), ("ino", int), ("length", int), ("mode", int),
           ("uid", int), ("gid", int), ("direct", bool), ("old_dev", int), ("old_ino", int),
           ("discard", bool))
_REMOVAL = (("path", str), ("dev", int), ("ino", int), ("size", int), ("mtime_ns", int))
_DEST = (("output", int), ("out_offset", int), ("length", int), ("src_offset", int))
_SOURCE = (("dev", int), ("ino", int), ("path", str), ("size", int), ("run_start", int),
           ("atime_ns", int), ("mtime_ns", int), ("mode", int), ("adopt", bool), ("dense", bool))


def _row(table: tuple[tuple[str, type], ...], obj: object) -> list[Any]:
    return [getattr(obj, k) for k, _t in table]


def encode(j: Journal) -> bytes:
    """The journal as written under its pending name: the magic line and the head."""
    return MAGIC + step(Stage.JOURNALED, save={
        "version": VERSION,
        "token": j.token,
        "window": j.window,
        "outputs": [_row(_OUTPUT, o) for o in j.outputs],
        "removals": [_row(_REMOVAL, r) for r in j.removals],
        "sources": [{**{k: getattr(s, k) for k, _t in _SOURCE},
                     "dests": [_row(_DEST, d) for d in s.dests]} for s in j.sources],
    })


def _sum(payload: bytes) -> bytes:
    return hashlib.sha256(payload).hexdigest()[:32].encode()


Step = Mapping[str, object]


def frame(step: Step) -> bytes:
    payload = json.dumps(dict(step), sort_keys=True, separators=(",", ":"),
                         ensure_ascii=True).encode()
    return b"%08x %s %s\n" % (len(payload), _sum(payload), payload)


def step(stage: Stage, **fields: object) -> bytes:
    return frame({"stage": stage.value, **fields})


def stage_of(record: Step) -> Stage:
    return Stage(record["stage"])


def unframe(line: bytes) -> dict[str, object]:
    """The step of one record line (without its newline); ValueError if it does not check."""
    if len(line) < 42 or line[8:9] != b" " or line[41:42] != b" ":
        raise ValueError("not a record")
    length, digest, payload = line[:8], line[9:41], line[42:]
    if not all(c in b"0123456789abcdef" for c in length) or int(length, 16) != len(payload):
        raise ValueError("its length does not match")
    if digest != _sum(payload):
        raise ValueError("checksum mismatch")
    try:
        record = json.loads(payload)
        if not isinstance(record, dict) or Stage(record.get("stage")) not in _FIELDS:
            raise ValueError("it is not a step record")
    except (ValueError, RecursionError) as exc:  # JSON nested past the parser's depth
        raise StrayRecordError(str(exc)) from None
    if frozenset(record) - {"stage"} not in _FIELDS[Stage(record["stage"])]:
        raise StrayRecordError(f"a {record['stage']} step has fields {sorted(record)}")
    return record


class StrayRecordError(ValueError):
    """A record whose length and checksum hold but that no save of this version writes: no
    crash makes one (a crash only cuts a record short), so it is damage wherever it is."""


@dataclass(frozen=True, slots=True)
class Replay:
    """The records of a log that check, in order, up to the first that does not."""

    records: tuple[dict[str, object], ...]
    torn: bool = False  # a tail that does not check (cut by a crash): ignored
    damage: str | None = None  # a record that does not check before one that does: why


def _checks(line: bytes) -> bool:
    """Whether the line's length and checksum hold (a stray record checks: it is damage)."""
    try:
        return bool(unframe(line))
    except ValueError as exc:
        return isinstance(exc, StrayRecordError)


def _overlong(line: bytes) -> bool:
    """Whether a line is longer than the record its (intact) header announces: a damaged
    newline merged it with the next record.  A cut record is only ever shorter."""
    head = line[:8]
    return (len(head) == 8 and all(c in b"0123456789abcdef" for c in head)
            and line[8:9] == b" " and len(line) > 42 + int(head, 16))


def replay(lines: list[bytes], *, torn_tail: bool, after: Stage | None = None) -> Replay:
    """WAL replay of whole record lines: stop at the first that does not check, damage when a
    later line checks or it runs into the next record, else the torn tail.  The steps must
    follow each other (from ``after``, the stage before them) as the stage table allows."""
    records: list[dict[str, object]] = []
    for n, line in enumerate(lines, start=1):
        try:
            records.append(unframe(line))
        except StrayRecordError as exc:  # noqa: PERF203 - stops at the first
            return Replay(tuple(records), torn_tail, f"record {n} checks but {exc}")
        except (ValueError, KeyError, TypeError) as exc:
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


@dataclass(frozen=True, slots=True)
class Log:
    """A journal read back: its head, its last step's stage and what its steps say."""

    journal: Journal
    moved: int = 0  # the first N moved sources (journal order) have finished, durably
    inserted: frozenset[tuple[int, int]] = frozenset()  # their ``inserted`` steps
    looked: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    torn: bool = False
    # the last step's (MOVING for the head alone: whether a source was touched, the files tell)
    stage: Stage = Stage.MOVING
    end: int = 0  # the logical end: where the next step is appended
    damage: str | None = None  # ``intact_prefix``: why a record before the last does not check
    # per moved source, the sizes its ``cut`` steps name, in order: besides its own, the only
    # sizes a crash can leave it at, every byte past the last one durable in the temps
    cuts: Mapping[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    # per source rebuilt in a new file by a rollback, that file (its ``rebuilt`` steps)
    rebuilt: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


def _head(lines: list[bytes], data: bytes) -> Journal:
    """The head: the magic line, then the ``journaled`` step carrying the save.  It is renamed
    into place whole, so a head that does not check is damage, never a torn write."""
    # A magic line naming another version is refused naming it, whatever the records after it
    # say (a later version may keep this layout, and is never played back as this one); a flip
    # that turns the digit into another is refused alike, touching nothing.
    version = lines[0].removeprefix(b"filecord-journal ") if lines else b""
    if version.isdigit() and int(version) != VERSION:
        raise JournalVersionError(
            f"the journal was written by {'an older' if int(version) < VERSION else 'another'} "
            f"filecord (journal version {int(version)}): recover it with the filecord that "
            "wrote it")
    try:
        if lines[0] + b"\n" != MAGIC:
            raise ValueError("its magic line is not filecord's")
        if len(lines) < 2:
            raise ValueError("no whole head record follows its magic line")
        rec = unframe(lines[1])
        if stage_of(rec) is not Stage.JOURNALED or "save" not in rec:
            raise ValueError(f"a {rec['stage']} step where the head belongs")
        return _parse(rec["save"])
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        if not data.startswith(MAGIC[:9]) and not (len(lines) > 1 and _checks(lines[1])):
            raise NotAJournalError("the file is not a filecord journal (no magic line, no "
                                   "record)") from None
        raise JournalDamagedError(f"the journal is damaged: its head does not check out ({exc})"
                                  ) from None


def read_log(data: bytes, *, intact_prefix: bool = False) -> Log:
    """The head and the steps after it (WAL replay, strict); :class:`JournalDamagedError` for
    damage.  ``intact_prefix``: a record that does not check before the last gives the steps
    before it, ``damage`` saying why."""
    lines, torn = split_lines(data)
    j = _head(lines, data)
    r = replay(lines[2:], torn_tail=torn, after=Stage.JOURNALED)
    damage = None if r.damage is None else f"the journal is damaged: {r.damage}"
    if damage is not None and not (
            intact_prefix and _succession(list(r.records), Stage.JOURNALED) is None):
        raise JournalDamagedError(damage)
    tail = data[data.rfind(b"\n") + 1:]
    if torn and _overlong(tail) and _checks(tail[:42 + int(tail[:8], 16)]):
        # a whole record and more (no crash appends past a record); a half-written one padded
        # with zeros (unsynced data after a power cut) is a torn tail
        raise JournalDamagedError("the journal is damaged: bytes follow its last record")
    try:
        log = _steps(j, r.records)
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalDamagedError(f"the journal is damaged: a step that checks says {exc}") \
            from None
    end = sum(len(line) + 1 for line in lines[:2 + len(r.records)])
    return replace(log, torn=r.torn, end=end, damage=damage)


def _steps(j: Journal, records: tuple[dict[str, object], ...]) -> Log:
    """What the steps after the head say (moves finished, inserts done, cuts, last looks, the
    last stage), each field checked against the head: one out of range is damage."""
    sources = j.by_key()
    movers = {(s.dev, s.ino): s for s in j.moved()}
    moved = 0
    inserted: set[tuple[int, int]] = set()
    cuts: dict[tuple[int, int], tuple[int, ...]] = {}
    looked: dict[tuple[int, int], tuple[int, int]] = {}
    rebuilt: dict[tuple[int, int], tuple[int, int]] = {}
    stage = Stage.MOVING
    for rec in records:
        stage = stage_of(rec)
        if stage is Stage.JOURNALED:
            stage = Stage.MOVING
        elif "cut" in rec:
            dev, ino, size = (_a(int, v) for v in _a(list, rec["cut"]))
            was, s = cuts.get((dev, ino), ()), movers.get((dev, ino))
            if s is None or not s.run_start <= size < (was[-1] if was else s.size):
                raise ValueError(f"a cut of ({dev}, {ino}) to {size} no move of it makes")
            cuts[(dev, ino)] = (*was, size)
        elif stage is Stage.MOVING:
            moved = max(moved, _a(int, rec["moved"]))
            if moved > len(movers):
                raise ValueError(f"{moved} moves finished of {len(movers)}")
            if "inserted" in rec:
                dev, ino = (_a(int, v) for v in _a(list, rec["inserted"]))
                s = sources.get((dev, ino))
                if s is None or not s.inserted:
                    raise ValueError(f"an insert in front of ({dev}, {ino}), which has none")
                inserted.add((dev, ino))
        elif stage is Stage.COMMITTED:
            for look in _a(list, rec["looked"]):
                dev, ino, size, mtime = (_a(int, v) for v in _a(list, look))
                if (dev, ino) not in sources:
                    raise ValueError(f"a look at ({dev}, {ino}), not a source of the save")
                looked[(dev, ino)] = (size, mtime)
        elif "rebuilt" in rec:
            dev, ino, new_dev, new_ino = (_a(int, v) for v in _a(list, rec["rebuilt"]))
            if (dev, ino) not in sources or not all(0 <= v < 1 << 64 for v in (new_dev, new_ino)):
                raise ValueError(f"a rebuild of ({dev}, {ino}) no rollback of the save makes")
            rebuilt[(dev, ino)] = (new_dev, new_ino)
    return Log(j, moved, frozenset(inserted), looked, stage=stage, cuts=cuts,
               rebuilt=rebuilt)


_T = TypeVar("_T")
_KINDS = {list: "a list", int: "an integer", bool: "true or false", str: "a string"}


def _a(kind: type[_T], v: object) -> _T:
    """``v`` if it is a ``kind`` as JSON reads one (true is not an integer), else TypeError."""
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise TypeError(f"{v!r} is not {_KINDS[kind]}")
    return v


def _entry(table: tuple[tuple[str, type], ...], values: object) -> dict[str, Any]:
    """A list entry of the head: exactly the fields of ``table``, each of its type."""
    if not isinstance(values, list) or len(values) != len(table):
        raise ValueError(f"an entry is not a list of {len(table)} fields")
    return {k: _a(kind, v) for (k, kind), v in zip(table, values, strict=True)}


def _parse(body: object) -> Journal:
    if not isinstance(body, dict):
        raise TypeError("the head is not an object")
    if body["version"] != VERSION:
        raise ValueError(f"version {body['version']!r} is not {VERSION}")
    if set(body) != {"version", "token", "window", "outputs", "removals", "sources"}:
        raise ValueError(f"the head has fields {sorted(body)}")
    sources = []
    for s in _a(list, body["sources"]):
        if not isinstance(s, dict) or set(s) != {"dests", *(k for k, _t in _SOURCE)}:
            raise ValueError(f"a source has fields {sorted(s)}")
        fields: dict[str, Any] = {k: _a(kind, s[k]) for k, kind in _SOURCE}
        key = (fields["dev"], fields["ino"])
        sources.append(JournalSource(**fields, dests=tuple(
            PieceRef(index=0, source=key, **_entry(_DEST, d)) for d in _a(list, s["dests"]))))
    token = _a(str, body["token"])
    if not _names.is_token(token):
        raise ValueError(f"token {token!r} is malformed")
    return Journal(token, _a(int, body["window"]),
                   tuple(JournalOutput(**_entry(_OUTPUT, o)) for o in _a(list, body["outputs"])),
                   tuple(sources),
                   tuple(JournalRemoval(**_entry(_REMOVAL, r)) for r in _a(list, body["removals"])))


def _clean(path: str) -> bool:
    return os.path.isabs(path) and os.path.normpath(path) == path and "\0" not in path


def confine(j: Journal, journal_path: str) -> None:
    """Refuse a head that reaches beyond its save, first reason first (the caller names the
    journal): a path not absolute and normalised, an index or range out of bounds, a token not
    its name's, the journal away from its first output's directory (resolved)."""
    parsed = _names.parse(os.path.basename(journal_path))
    if parsed is None or parsed[0] != j.token:
        raise JournalDamagedError("the record's token is not the one in its name")
    if j.window < 1:
        raise JournalDamagedError(f"window {j.window} is not positive")
    for o in j.outputs:
        if not _clean(o.final):
            raise JournalDamagedError(f"output path {o.final!r} is not confined")
        if o.discard and o.direct:
            raise JournalDamagedError(f"{o.final}: a discard output is direct")
    for s in j.sources:
        if not _clean(s.path):
            raise JournalDamagedError(f"source path {s.path!r} is not confined")
        if not 0 <= s.run_start <= s.size:
            raise JournalDamagedError(f"{s.path}: run start out of range")
        if s.adopt and (len(s.dests) != 1 or s.dests[0].src_offset != 0
                        or s.dests[0].length != s.size or s.dests[0].out_offset % BLOCK):
            raise JournalDamagedError(f"{s.path}: an adopted source must be one whole range at "
                                      "a block-aligned offset")
        if not s.adopt and s.run_start < s.size:
            try:  # a rollback puts back every byte above the kept prefix from where these say
                cover(s.dests, s.run_start, s.size)
            except ValueError:
                raise JournalDamagedError(f"{s.path}: its ranges do not hold the bytes its move "
                                          f"takes ({s.run_start} to {s.size})") from None
        for d in s.dests:
            out = j.outputs[d.output] if 0 <= d.output < len(j.outputs) else None
            if (out is None or out.direct or min(d.length, d.src_offset, d.out_offset) < 0
                    or d.src_offset + d.length > s.size or d.out_offset + d.length > out.length):
                raise JournalDamagedError(
                    f"{s.path}: a range {d.src_offset}+{d.length} -> output {d.output} at "
                    f"{d.out_offset} is outside the source, its outputs or their temps")
    dirs = list(j.locks())
    # A file the commit removes is not named by the token, so it must at least sit where the
    # save worked: beside an output with a temp (a direct output's directory holds no lock
    # file of the save) or a source (``undo.discard_and_remove`` asks recover for proof there).
    near = set(dirs) | {os.path.dirname(s.path) for s in j.sources}
    for r in j.removals:
        if not _clean(r.path) or os.path.dirname(r.path) not in near:
            raise JournalDamagedError(f"removal path {r.path!r} is not confined")
        if r.path in {o.final for o in j.outputs} | {s.path for s in j.sources}:
            raise JournalDamagedError(f"{r.path} is both removed and saved")
    here = _sys.realpath(os.path.dirname(_sys.abspath(journal_path)))
    if not dirs or dirs[0] != here:
        raise JournalDamagedError("the journal is not in its first output's directory")
