"""The assessment: one look at the files (``observe``), one pure judgement of it (``assess``).

Theory of operation
-------------------
The in-process failure path (``failure``) and ``recover`` both look (:func:`observe`, the
only I/O here: a name holding another inode counts as absent, an error is kept as
``unreadable``), judge (:func:`assess`, pure) and ask ``decide``.  The records are trusted for
what happened (the trust rule, ``decide``); the files are judged only for what another process
or a crash can make differ from them, into one :class:`~filecord._txn.decide.Found`:

* a running save (``Actor.SAVE``): the change it saw mid-move (by its typed kind), then each
  parked source against its last look (size, mtime, ctime, or its truncate in flight);
* recover (``Actor.RECOVER``), by stage: HELD is CHANGED; before a rollback every source at
  its own size or one its ``cut`` steps name (a finished move at its kept prefix) and the
  temps its moved bytes went to there; before a finish every temp at its journaled length.

A record that does not check is DAMAGED (:func:`damaged`), never "another process".
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._plan.plan import cover
from filecord._txn import journal, undo
from filecord._txn.decide import Actor, Found
from filecord._txn.journal import Journal, JournalSource
from filecord._txn.stages import Stage
from filecord._txn.transfer import METADATA_ONLY, Facts, Look
from filecord.errors import ChangeKind, DataChangedError, RecoverError

HELD_WHY = ("a source was changed by another process, so nothing was put back over it: the "
            "journal (held) and temps are kept")
KEPT_WHY = "the journal and temps are kept"

Key = tuple[int, int]  # (st_dev, st_ino)


# --- the facts ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SourceFacts:
    parked: Facts | None = None  # at its parked (token) name
    own: Facts | None = None  # at its own name
    at_temp: Facts | None = None  # an adopted source at its output's temp


@dataclass(frozen=True, slots=True)
class OutputFacts:
    temp: Facts | None = None
    final: Facts | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    sources: tuple[SourceFacts, ...]
    outputs: tuple[OutputFacts, ...]
    unreadable: str | None = None  # why the files could not all be looked at
    # recover: every temp and parked source carrying the token in the save's directories
    token_files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Records:
    """What the save's records (or, for a running save, its memory) say."""

    actor: Actor
    stage: Stage
    moved: int = 0
    inserted: frozenset[Key] = frozenset()  # adopted sources whose insert is recorded
    cuts: Mapping[Key, tuple[int, ...]] = field(default_factory=dict)  # ``journal.Log.cuts``
    looks: Mapping[Key, Look] = field(default_factory=dict)
    during: DataChangedError | None = None  # the change a running save saw mid-move
    cause: BaseException | None = None  # why a running save stopped (the context of a change
    # found since its last look, raised in its place)


# --- the judgement --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Assessment:
    """What was found, the error that says so, notes and why, and the changed source's key."""

    found: Found
    error: BaseException | None = None
    notes: tuple[str, ...] = ()
    why: str = ""
    changed: Key | None = None


def of_change(exc: DataChangedError) -> Found:
    """A change, by its typed kind: a link or a ctime alone changed no byte."""
    return {ChangeKind.LINKED: Found.LINKED,
            ChangeKind.METADATA: Found.METADATA}.get(exc.kind, Found.CHANGED)


def seen_mid_move(exc: BaseException, key: Key | None) -> DataChangedError | None:
    """The change a running save saw while a source was being moved or right after its last
    look (``key``: that source), or None when ``exc`` is something else."""
    return exc if isinstance(exc, DataChangedError) and key is not None else None


def damaged(exc: journal.JournalDamagedError) -> Assessment:
    return Assessment(Found.DAMAGED, exc, why=f"{exc}; nothing was touched")


def locate(j: Journal, s: JournalSource, f: SourceFacts) -> tuple[str, Facts] | None:
    """Where source ``s`` is: its parked (token) name first, then its own name."""
    if f.parked is not None:
        return j.parked(s), f.parked
    if f.own is not None:
        return s.path, f.own
    return None


def assess(j: Journal, records: Records, seen: Observed) -> Assessment:
    return (_running if records.actor is Actor.SAVE else _crashed)(j, records, seen)


def _running(j: Journal, r: Records, seen: Observed) -> Assessment:
    exc = r.during
    if exc is not None:  # bytes were being moved out of the changed file
        found = of_change(exc)
        return Assessment(found, exc, why="a source changed under the move, so nothing was put "
                          "back over it: the journal and temps are kept" +
                          ("" if found is not Found.CHANGED else
                           " (held: recover will not undo over the change)"))
    if seen.unreadable is not None:
        return Assessment(Found.UNREADABLE, notes=(
            f"could not check the sources: {seen.unreadable}",), why=KEPT_WHY)
    for s, f in zip(j.sources, seen.sources, strict=True):
        key = (s.dev, s.ino)
        look = r.looks.get(key)
        at = locate(j, s, f)
        err = None if s.adopt or look is None or at is None else changed_since(
            at[0], at[1], look, "another process changed it after the save's last look")
        if err is None:
            continue
        err.__context__ = r.cause
        found = of_change(err)
        why = ("a source's metadata was changed by another process: the journal and temps "
               "are kept (not held)") if found is Found.METADATA else HELD_WHY
        first = () if r.cause is None else (f"the save had failed first: {r.cause}",)
        return Assessment(found, err, first, why, changed=key)
    sizes = {k: (look.facts.size, *(() if look.pending is None else (look.pending,)))
             for k, look in r.looks.items()}
    bad = check_strict(j, seen, r, sizes)
    if bad is not None:
        return Assessment(Found.CHANGED, notes=(f"{bad}",), why=HELD_WHY)
    return Assessment(Found.AS_LEFT)


def _crashed(j: Journal, r: Records, seen: Observed) -> Assessment:
    if r.stage is Stage.HELD:
        return Assessment(Found.CHANGED, why=(
            "the save stopped because another process changed a source mid-move; nothing "
            "is undone over that change (the notes say where every byte is)"))
    # Every refusal an action can meet is decided here, before its first change.  A token
    # file the journal does not name may hold a source's moved bytes: nothing is touched.
    moving = r.stage is Stage.MOVING
    bad = (RecoverError(seen.unreadable) if seen.unreadable is not None else unaccounted(j, seen)
           or (check_committed(j, seen) if r.stage is Stage.COMMITTED else None)
           or (check_strict(j, seen, r, r.cuts) if moving else None)
           or (check_rollback(j, seen, temps=moving)
               if moving or r.stage is Stage.ROLLING_BACK else None))
    if bad is None:
        return Assessment(Found.AS_LEFT)
    changed = isinstance(bad, DataChangedError)  # else the files could not be checked
    return Assessment(Found.CHANGED if changed else Found.UNREADABLE, bad, why=f"{bad}; {KEPT_WHY}")


# --- the predicates (pure, on observed facts) -------------------------------------------------

def changed_since(name: str, st: Facts, look: Look, why: str) -> DataChangedError | None:
    """The change if ``st`` is not as the save last looked (size, mtime and ctime; or the size
    a truncate of the save in flight leaves): ``METADATA`` when only the ctime moved (a chmod
    or chattr, which holds no journal), else ``why``."""
    if st == look.facts or st.size == look.pending:
        return None
    metadata = (st.size, st.mtime_ns) == (look.facts.size, look.facts.mtime_ns)
    return DataChangedError(name, expected_size=look.facts.size, found_size=st.size,
                            reason=METADATA_ONLY if metadata else why,
                            kind=ChangeKind.METADATA if metadata else ChangeKind.CONTENT)


def check_strict(j: Journal, seen: Observed, r: Records,
                 cuts: Mapping[Key, tuple[int, ...]]) -> DataChangedError | None:
    """A source not as this save can have left it (None: all are): the first ``r.moved``
    moved sources at their kept prefix, the others at their own size or one of their ``cuts``
    (the ``cut`` steps, or the running save's look and truncate in flight)."""
    finished = {(s.dev, s.ino) for s in j.moved()[:r.moved]}
    for s, f in zip(j.sources, seen.sources, strict=True):
        key = (s.dev, s.ino)
        if s.adopt:
            bad = _adopted(j, s, f, inserted=key in r.inserted)
        elif f.parked is None:  # never parked, so never moved
            bad = None if f.own is None else _cut_to(s, s.path, f.own, (s.size,))
        else:
            bad = _cut_to(s, j.parked(s), f.parked, (s.run_start,) if key in finished
                          else (s.size, *cuts.get(key, ())))
        if bad is not None:
            return bad
    return None


def _cut_to(s: JournalSource, name: str, st: Facts, sizes: tuple[int, ...]
            ) -> DataChangedError | None:
    """A parked source at one of the ``sizes`` this save's cuts can have left it at.  At its
    full size it was never shortened (or a rollback finished and put its times back), so its
    mtime is the journaled one: a same-size rewrite is refused, never "restored" over."""
    if st.size not in sizes:
        return DataChangedError(
            name, expected_size=sizes[-1], found_size=st.size,
            reason=f"the save's records leave it at {' or '.join(map(str, sorted(set(sizes))))} "
            "bytes: another process changed it")
    if st.size == s.size and st.mtime_ns != s.mtime_ns:
        return DataChangedError(
            name, expected_size=s.size, found_size=st.size,
            reason=f"its modification time is {st.mtime_ns} ns where the journal recorded "
            f"{s.mtime_ns} ns and this save never shortened it: another process rewrote it")
    return None


def _adopted(j: Journal, s: JournalSource, f: SourceFacts, *,
             inserted: bool) -> DataChangedError | None:
    """An adopted source at its output's temp at a size its adoption leaves (invariant 9);
    under its own name the undo does not touch it: nothing to check."""
    length = j.outputs[s.dests[0].output].length
    whole = not s.inserted and length == s.size  # a file adopted whole is only renamed back
    if f.at_temp is None or whole:
        return None
    why = s.adopted_refusal(f.at_temp.size, length, inserted=inserted)
    return None if why is None else DataChangedError(
        j.temp(s.dests[0].output), expected_size=s.size + s.inserted, found_size=f.at_temp.size,
        reason=why)


def check_rollback(j: Journal, seen: Observed, *, temps: bool) -> OSError | None:
    """Every source where a rollback looks for it and (``temps``) every temp a cut source's
    bytes went to there and reaching their end (temps are sized before the first move), or a
    rollback would stop part way."""
    for s, f in zip(j.sources, seen.sources, strict=True):
        if f.parked is None and f.own is None and f.at_temp is None:
            where = j.temp(s.dests[0].output) if s.adopt and s.dests else j.parked(s)
            return RecoverError(f"{s.path}: the source is neither at its name nor at {where}")
        if not temps or s.adopt or f.parked is None or f.parked.size == s.size:
            continue
        for d in (d for d in s.dests if d.src_offset + d.length > f.parked.size):
            temp = seen.outputs[d.output].temp
            if temp is None:
                renamed_by_hand = "" if seen.outputs[d.output].final is None else (
                    f" from there: it is at {j.outputs[d.output].final}, renamed by another "
                    "process, as this save never reached its commit point")
                return OSError(errno.ENOENT, f"{j.temp(d.output)}, which holds bytes moved out "
                               f"of {s.path}, is missing{renamed_by_hand}")
            if temp.size < d.out_offset + d.length:
                return DataChangedError(
                    j.temp(d.output), expected_size=j.outputs[d.output].length,
                    found_size=temp.size, reason=f"the temp ends before the bytes moved out of "
                    f"{s.path}: another process cut it")
    return None


def unaccounted(j: Journal, seen: Observed) -> RecoverError | None:
    """A temp or parked source carrying the token that the journal does not name."""
    named = {j.temp(o) for o, out in enumerate(j.outputs) if not out.direct}
    named |= {j.parked(s) for s in j.sources}
    for path in seen.token_files:
        if path not in named:
            return RecoverError(f"the journal does not account for {path}, a file carrying "
                                "this save's token: it may hold a source's bytes")
    return None


def token_files(j: Journal) -> tuple[str, ...]:
    """The temps and parked sources carrying the token in the save's and its sources'
    directories, whatever the journal says."""
    dirs = dict.fromkeys([*j.locks(), *(os.path.dirname(s.path) for s in j.sources)])
    return tuple(os.path.join(d, name) for d in dirs for name in sorted(_sys.listdir(d))
                 if (p := _names.parse(name)) is not None and p[0] == j.token
                 and p[1] in (_names.TEMP, _names.SOURCE))


def renamed(j: Journal, seen: Observed) -> bool:
    """Whether an output is under its final name, so the commit point was passed whatever the
    records say.  One at a source's own name is no proof (the inode was the source's first)."""
    own = {s.path for s in j.sources}
    return any(of.final is not None and not out.direct and not out.discard
               and out.final not in own
               for out, of in zip(j.outputs, seen.outputs, strict=False))


def check_committed(j: Journal, seen: Observed) -> DataChangedError | None:
    """A temp not at the journaled length (None: all are): another process cut or grew it.
    Nothing else is re-proved (the trust rule); the finish keeps a parked source written to."""
    for o, (out, of) in enumerate(zip(j.outputs, seen.outputs, strict=True)):
        if (not out.direct and not out.discard and of.temp is not None
                and of.temp.size != out.length):
            return DataChangedError(
                j.temp(o), expected_size=out.length, found_size=of.temp.size,
                reason=f"the temp of {out.final} is not the complete output the journal "
                "records: another process changed it, so it is not renamed onto the final name")
    return None


# --- the one look -----------------------------------------------------------------------------

def observe(j: Journal, *, recover: bool = False,
            rebuilt: Mapping[Key, Key] | None = None) -> Observed:
    """``lstat`` each source at its parked and own names (an adopted one at its temp) and each
    output at its temp and final names (for ``recover``, list its token files too); a source
    at its name is its inode or the file a ``rebuilt`` step names (``journal.Log.rebuilt``)."""
    def _facts(path: str, dev: int, ino: int) -> Facts | None:
        st = undo.same_file(path, dev, ino)
        return None if st is None else Facts.of(st)

    def _rebuilt(s: JournalSource) -> Facts | None:
        st = undo.rebuilt_at(s.path, s, (rebuilt or {}).get((s.dev, s.ino)))
        return None if st is None else Facts.of(st)

    sources: list[SourceFacts] = []
    outputs: list[OutputFacts] = []
    try:
        for s in j.sources:
            temp = j.temp(s.dests[0].output) if s.adopt and s.dests else None
            sources.append(SourceFacts(
                parked=None if s.adopt else _facts(j.parked(s), s.dev, s.ino),
                own=_facts(s.path, s.dev, s.ino) or _rebuilt(s),
                at_temp=None if temp is None else _facts(temp, s.dev, s.ino)))
        for o, out in enumerate(j.outputs):
            # A discard output is never published: its final name is no business of the save.
            outputs.append(OutputFacts(None if out.direct else _facts(j.temp(o), out.dev, out.ino),
                                       None if out.discard else _facts(out.final, out.dev,
                                                                       out.ino)))
        found = token_files(j) if recover else ()
    except OSError as exc:
        return Observed(tuple(sources), tuple(outputs), unreadable=str(exc))
    return Observed(tuple(sources), tuple(outputs), token_files=found)


# --- where every byte is (pure) ------------------------------------------------------------

def whereabouts(j: Journal, seen: Observed, left_at: Mapping[Key, int] | None = None,
                done: int = 0, inserted: frozenset[Key] = frozenset(), *,
                held: bool = False, cuts: Mapping[Key, tuple[int, ...]] | None = None
                ) -> list[str]:
    """One line per source: how many bytes are in it (and under which name), where the rest is.

    The size the move left a source at: ``left_at`` (the in-process error), the kept prefix of
    the first ``done`` moved sources, else its last of ``cuts`` where its size is none they
    name.  ``held``: an adopted file is named as where its bytes were put, not claimed whole
    (a writer that cut it may have left zeros there)."""
    if seen.unreadable is not None:
        return [f"could not look at the sources to say where their bytes are: {seen.unreadable}"]
    left_at = {**{(s.dev, s.ino): s.run_start for s in j.moved()[:done]}, **(left_at or {})}
    # a temp renamed onto its final name by another process holds the bytes there
    temps = [out.final if of.temp is None and of.final is not None else j.temp(o)
             for o, (out, of) in enumerate(zip(j.outputs, seen.outputs, strict=True))]
    return [_adopted_where(j, s, f, inserted=(s.dev, s.ino) in inserted, held=held) if s.adopt
            else _moved_where(j, s, f, left_at, cuts, temps)
            for s, f in zip(j.sources, seen.sources, strict=True)]


def _adopted_where(j: Journal, s: JournalSource, f: SourceFacts, *, inserted: bool,
                   held: bool) -> str:
    """:func:`whereabouts` of an adopted source: its name, or its temp and the offset there."""
    temp = j.temp(s.dests[0].output)
    at = temp if f.at_temp is not None else s.path if f.own is not None else None
    # the space is in front of it only once inserted: a temp at the file's own size holds it
    # at offset 0 (renamed, nothing inserted yet, or already collapsed)
    off = "" if f.at_temp is None or not s.inserted or f.at_temp.size < s.size + s.inserted else (
        f" (at offset {s.inserted})" if inserted else f" (at offset 0, or at {s.inserted} if "
        "the space in front of it was inserted before its record was written)")
    if at and held:
        return (f"{s.path}: the file ({s.size} bytes) was adopted as {at}{off}; another "
                "process changed a source during the save, so that range holds what it left")
    return (f"{s.path}: the whole file ({s.size} bytes) is at {at}{off}" if at else
            f"{s.path}: not found under its name or at {temp}")  # never a guess


def _moved_where(j: Journal, s: JournalSource, f: SourceFacts, left_at: Mapping[Key, int],
                 cuts: Mapping[Key, tuple[int, ...]] | None, temps: list[str]) -> str:
    """:func:`whereabouts` of a moved (or only consumed) source: its bytes in it, the rest
    in the temps."""
    found = locate(j, s, f)
    if found is None:
        return f"{s.path}: not found under its name or {j.parked(s)}"
    name, size = found[0], found[1].size
    sizes = (s.size, *(cuts or {}).get((s.dev, s.ino), ()))
    boundary = left_at.get((s.dev, s.ino), size if cuts is None or size in sizes else sizes[-1])
    if boundary == size:
        line = f"{s.path}: bytes [0, {size}) of {s.size} are in {name}"
    else:
        kept = min(size, boundary)
        line = (f"{s.path}: {name} is {size} bytes long, but the move had left it at "
                f"{boundary}: another process changed it; " + (
                    f"its bytes [0, {kept}) are there" if kept else
                    "none of its bytes are there"))
    if boundary < s.size:
        try:  # a source changed before its journal was written may be longer than its ranges
            segs = cover(s.dests, max(boundary, s.run_start), s.size)
        except ValueError:
            segs = []
        line += "; " + ", ".join(
            f"[{a}, {b}) at offset {d.out_offset + a - d.src_offset} of {temps[d.output]}"
            for a, b, d in segs)
    return line
