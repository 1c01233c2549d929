"""The one skeleton every merge, reshard and convert of every format runs on.

Theory of operation
-------------------
An operation is: **inputs** (read headers only; with ``consume`` each data file is one owned
whole-file piece, so the save may move its bytes and delete it) -> **job** (the outputs as
Cords of ranges of those pieces, outputs to discard at the commit, and the files the outputs
make obsolete) -> **dry run** (``plan``: what would happen, nothing written) or **save** (one
transaction, which also removes at its commit the obsolete files and the index of a consumed
set, so ``recover`` finishes those after a crash too) -> **settle** (the report).

Deletion rights: whatever happens, every input piece gives up its deletion right on the way
out (``detach_cleanup``), so only a committed consuming save removes a user's data file, never
a dry run, a failure, or the garbage collector.

Everything about what is kept is decided before the save (:func:`decide`), because an input
whose bytes were moved cannot be kept afterwards: the facts of each input (symlink, read-only
by mount or mode bits, immutable, a mount point, another hard link, another file system than
where the outputs' bytes land, resolved through a symlinked output name), content the outputs
do not carry (``Job.uncarried``), a stream output, and sets that stand or fall together (an
index and its shards, a GGUF split set, one file given under two names).  Each kept input is
disowned, so the save copies it.  :func:`account` then computes ``kept`` and ``removed`` for
the dry run and the run alike, so the forecast is the outcome.

Removal rides on the save (``handed_removals``): the head of its journal records each
obsolete file and each index whose data files the decision lets the save take, with its
identity (device, inode, size, mtime) as read; the save (or recover's finish) unlinks it after
the commit point only if the save consumed every data file it names and it is still that file.
After the commit nothing raises (DESIGN invariant 8): an index the save kept because another
writer replaced it is unlinked by the kit only when it is byte-identical to the one read; a
failed unlink is reported kept, with its errno.  ``removed`` lists only what was unlinked.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import stat as stat_mod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from filecord._io import syscalls as _sys
from filecord._io.paths import stand_in
from filecord._kit.removal import (
    Identity,
    KeepReason,
    KeptInput,
    identity,
    keep_reason,
    observe,
    remove_after_commit,
)
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._plan.types import (
    HARDLINK,
    IN_KEPT_SET,
    MOUNT_POINT,
    NOT_CARRIED,
    NOT_OUR_FILE,
    NOT_OWNED,
    OTHER_FS,
    READ_ONLY,
    SYMLINK,
    Reason,
)
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import Removal, plan, save_many_finishing
from filecord._txn.state import ProgressCallback as ProgressCallback
from filecord.errors import SourceIsOutputError

Paths = Sequence[str | os.PathLike[str]]
T = TypeVar("T")
log = logging.getLogger("filecord")


@dataclass(frozen=True, slots=True)
class Index:
    """A file that names data files (a safetensors ``*.index.json``): it goes with them."""

    path: str
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Inputs(Generic[T]):
    """What an operation read: the format's own value (tensors, headers) for ``build``, its data
    files' whole-file pieces (owned when consuming) and the indexes naming them."""

    value: T
    wholes: tuple[FileBackedData, ...]
    indexes: tuple[Index, ...] = ()
    # Data files that stand or fall together without an index file (a GGUF split set).
    sets: tuple[tuple[str, ...], ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(w.path for w in self.wholes)


@dataclass(frozen=True, slots=True)
class Job:
    """The outputs of an operation, and the files they make obsolete (removed after the commit
    when they are not inputs)."""

    outputs: Mapping[Target, CordLike]
    obsolete: tuple[str, ...] = ()
    # Input files whose non-tensor content (metadata, key-values) the outputs drop or override:
    # copied and kept, never consumed.
    uncarried: tuple[str, ...] = ()
    # Outputs built like the others but never published (the save unlinks their temps at the
    # commit): bytes of consumed inputs that no output keeps, so those inputs move whole.
    discard: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OperationReport(SaveReport):
    """A :class:`~filecord.SaveReport` plus what the operation did to its inputs after the
    commit: ``removed`` (indexes and obsolete files it unlinked; the data files the save
    consumed are gone too, as the report's ``moved``/``cloned`` pieces say) and ``kept``
    (every input of a consuming operation still on disk, with a typed reason; a file kept only
    because its set is, a sibling shard or the second name of one file, is named in the
    ``detail`` of the entry that holds the set, or of its index).  In a dry run
    (``dry_run`` True) both say what the operation would do."""

    removed: tuple[str, ...] = ()
    kept: tuple[KeptInput, ...] = ()

    @classmethod
    def of(cls, report: SaveReport, *, removed: tuple[str, ...] = (),
           kept: tuple[KeptInput, ...] = ()) -> OperationReport:
        values = {f.name: getattr(report, f.name) for f in fields(SaveReport)}
        return cls(**values, removed=removed, kept=kept)

    def to_dict(self) -> dict[str, object]:
        out = SaveReport.to_dict(self)
        out["removed"] = list(self.removed)
        out["kept"] = [{"path": k.path, "reason": k.reason.value, "detail": k.detail}
                       for k in self.kept]
        return out

    def summary(self) -> str:
        lines = [SaveReport.summary(self)]
        lines.extend(f"  removed  {p}" for p in self.removed)
        lines.extend(f"  kept     {k.path}: {k.reason.value}" + (f" ({k.detail})" if k.detail
                                                                  else "") for k in self.kept)
        return "\n".join(lines)


def operate(
    read: Callable[[], Inputs[T]],
    build: Callable[[T], Job],
    *,
    consume: bool,
    dry_run: bool,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
) -> OperationReport:
    """Run one operation: ``read()`` the inputs (owned when consuming; it must give up what it
    opened if it fails), ``build`` the job, then plan (``dry_run``) or save, then settle."""
    inputs = read()
    # Identities as read: after the commit only these very files are judged or unlinked.
    seen = {p: identity(p) for p in dict.fromkeys(
        [*inputs.files, *(i.path for i in inputs.indexes)])}
    # An index rewritten byte for byte by another writer (a new inode) still describes only
    # what was consumed: its text as read lets it go too.
    texts = {i.path: _text(i.path) for i in inputs.indexes} if consume else {}
    try:
        job = build(inputs.value)
        if not consume:
            refuse_replacing_inputs(job, inputs)
        out_devs = _devices(job.outputs)
        input_ids = _ids([*inputs.files, *(i.path for i in inputs.indexes)])
        obsolete = [p for p in job.obsolete
                    if not (_ids([p]) & input_ids) and _unlinkable_kind(p)]
        held = decide(inputs, job, out_devs) if consume else Decision({}, {}, {})
        relabels = disown_held(inputs.wholes, held)
        if dry_run:
            report = _relabel(plan(job.outputs, consume=consume, window=window), relabels)
            removed, kept = account(report, inputs, held, obsolete, consume=consume,
                                    still_there=lambda f: False)
            return OperationReport.of(report, removed=removed, kept=kept)
        # Inputs the kit kept are handed over unowned on purpose, their reasons reported by
        # the kit: the save's "not owned" warning would name the wrong cause.
        saved, done = save_many_finishing(
            job.outputs, consume=consume, window=window, progress=progress,
            discard=frozenset(os.fspath(d) for d in job.discard),
            remove=handed_removals(inputs, held, obsolete, seen, consume=consume),
            quiet_reasons=frozenset({NOT_OWNED}) if consume and relabels else frozenset())
        report = _relabel(saved, relabels)
    finally:
        for w in inputs.wholes:
            w.detach_cleanup()
    # Committed: the outputs are complete under their final names, and the save removed, at
    # its commit, what the operation made obsolete (``done.removed``; after a crash, recover
    # does).  Nothing below raises.
    try:
        doomed, kept = account(report, inputs, held, obsolete, consume=consume,
                               still_there=lambda f: identity(f) == seen.get(f))
        # What the save did not remove: an index rewritten byte for byte by another writer
        # (a new inode: the save kept it) still describes only what was consumed.
        rest = [p for p in doomed if p not in done.removed]
        seen_doomed = {p: seen.get(p) or identity(p) for p in rest}
        late, failed = remove_after_commit(rest, seen_doomed, texts)
        removed = tuple(p for p in doomed if p in done.removed or p in late)
        return OperationReport.of(report, removed=removed, kept=(*kept, *failed))
    except OSError as exc:  # e.g. the working directory vanished: keep, report, return
        log.warning("after the commit, the inputs could not be judged (%s): all are kept", exc)
        return OperationReport.of(report, kept=tuple(
            KeptInput(i.path, KeepReason.NOT_REMOVABLE, str(exc)) for i in inputs.indexes))


def handed_removals(inputs: Inputs[T], held: Decision, obsolete: Sequence[str],
                    seen: Mapping[str, Identity | None], *, consume: bool
                    ) -> tuple[Removal, ...]:
    """The files the save removes at its commit (journaled, so ``recover`` finishes it too):
    the obsolete files there now, and, when consuming, each index whose data files the
    decision lets the save take (it goes only if the save consumes them all), each with the
    identity it has now or had when read."""
    out: list[Removal] = []
    for p in obsolete:
        now = identity(p)
        if now is not None:
            out.append(Removal(p, now))
    if not consume:
        return tuple(out)
    for index in inputs.indexes:
        was = seen.get(index.path)
        if (was is None or index.path not in held.indexes or held.indexes[index.path] is not None
                or any(held.keeps(f) for f in index.files)):
            continue
        out.append(Removal(index.path, was, with_sources=index.files))
    return tuple(out)


def refuse_replacing_inputs(job: Job, inputs: Inputs[T]) -> None:
    """Without consume, no output may land on an input (a data file or an index, by name or
    by inode): the commit would replace a file the user still has, leaving a checkpoint whose
    index names the new shards beside the old ones; nor may the new set make a member of an
    input set (a shard named by an index, a GGUF split) a stale file of its names: the old set
    would stay, broken or mixed, beside the new one.  (A lone input file the new set makes
    stale is kept beside it, as an input is.)  Consuming makes it safe: the save moves
    the input's bytes away (parked, journaled) before the commit takes its name."""
    by_id: dict[tuple[int, int] | str, str] = {}
    for p in [*inputs.files, *(i.path for i in inputs.indexes)]:
        for key in _ids([p]):
            by_id.setdefault(key, p)
    members = _ids([f for i in inputs.indexes for f in i.files]
                   + [f for group in inputs.sets if len(group) > 1 for f in group])
    for target in job.outputs:
        out = os.fspath(target)
        hit = next((by_id[k] for k in _ids([out]) if k in by_id), None)
        if hit is not None:
            raise SourceIsOutputError(
                f"the output {out} would replace the input {hit}; consume=True (--consume) "
                f"makes this possible: the input is then taken into the new output",
                errno=errno.EINVAL)
    for stale in job.obsolete:  # a file of the new set's names that the new set does not use
        hit = next((by_id[k] for k in _ids([stale]) if k in by_id and k in members), None)
        if hit is not None:
            raise SourceIsOutputError(
                f"the new set would leave the input {hit} beside it as a stale file of the "
                f"same names (a mixed checkpoint); consume=True (--consume) makes this "
                f"possible: the input is then taken into the new set", errno=errno.EINVAL)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a consuming operation decided, before its save, to keep: ``own`` (path -> the fact
    that forbids taking it: a symlink, read-only, content the output drops, ...), ``companions``
    (path -> the member of its set it stays with: a kept shard keeps its whole index set or
    GGUF split set, a file given twice stays with its kept other name), and ``indexes`` (index
    path -> the fact that keeps it, None when nothing about the index itself does)."""

    own: Mapping[str, KeepReason]
    companions: Mapping[str, str]
    indexes: Mapping[str, KeepReason | None]

    def keeps(self, path: str) -> bool:
        return path in self.own or path in self.companions


def decide(inputs: Inputs[T], job: Job, output_devs: frozenset[int]) -> Decision:
    """Decide, from the facts before anything is written, which data files the save must not
    take over.  An input whose bytes were moved cannot be kept afterwards, so every rule that
    keeps something is applied here: the facts of each file (:func:`keep_reason`), content the
    outputs do not carry (``job.uncarried``), and sets that stand or fall together (an index
    and its shards, a GGUF split set, one file reached by two names): when any member of a set
    is kept, every member is, so a kept checkpoint stays loadable."""
    outputs = {_sys.abspath(os.fspath(t)) for t in job.outputs}
    files = [f for f in dict.fromkeys(inputs.files) if _sys.abspath(f) not in outputs]
    own: dict[str, KeepReason] = {}
    stream = any(_is_stream(os.fspath(t)) for t in job.outputs)
    for f in files:
        reason = (KeepReason.STREAM_OUTPUT if stream
                  else keep_reason(observe(f), output_devs=output_devs))
        if reason is not None:
            own[f] = reason
    for f in job.uncarried:
        if f in files and f not in own:
            own[f] = KeepReason.CONTENT_NOT_CARRIED
    indexes: dict[str, KeepReason | None] = {}
    groups: list[tuple[str | None, list[str]]] = []  # (index that holds it or None, members)
    for index in inputs.indexes:
        if _sys.abspath(index.path) in outputs:
            continue
        reason = keep_reason(observe(index.path))
        indexes[index.path] = None if reason is KeepReason.HARD_LINKED else reason
        groups.append((index.path if indexes[index.path] else None,
                       [f for f in index.files if f in files]))
    groups.extend((None, [f for f in group if f in files]) for group in inputs.sets)
    by_id: dict[tuple[int, int], list[str]] = {}
    for f in files:
        try:
            st = _sys.stat(f)
        except OSError:
            continue
        by_id.setdefault((st.st_dev, st.st_ino), []).append(f)
    groups.extend((None, same) for same in by_id.values() if len(same) > 1)
    companions: dict[str, str] = {}
    changed = True
    while changed:  # a fixed point: sets may overlap (a file in a set, given twice)
        changed = False
        for holder_index, members in groups:
            holder = holder_index or next(
                (m for m in members if m in own or m in companions), None)
            if holder is None:
                continue
            head = companions.get(holder, holder)
            for m in members:
                if m not in own and m not in companions and m != holder:
                    companions[m] = head
                    changed = True
    return Decision(own, companions, indexes)


def disown_held(wholes: Sequence[FileBackedData], held: Decision) -> dict[str, Reason]:
    """Give up the deletion right over each input the decision keeps, so the save copies it
    (whatever it would have judged by itself: root passes access(2) for a 0444 file).  Returns
    path -> the reason to report on its copies instead of "not owned"."""
    relabels: dict[str, Reason] = {}
    for w in wholes:
        if not held.keeps(w.path):
            continue
        if w.owned:
            w._disown()  # the kit is the one caller of this private right
        reason = held.own.get(w.path)
        relabels[w.path] = _SAVE_REASON[reason] if reason is not None else IN_KEPT_SET
    return relabels


_SAVE_REASON: dict[KeepReason, Reason] = {
    KeepReason.SYMLINK: SYMLINK, KeepReason.HARD_LINKED: HARDLINK,
    KeepReason.READ_ONLY: READ_ONLY, KeepReason.IMMUTABLE: READ_ONLY,
    KeepReason.OTHER_FS: OTHER_FS, KeepReason.CONTENT_NOT_CARRIED: NOT_CARRIED,
    KeepReason.STREAM_OUTPUT: NOT_OUR_FILE, KeepReason.MOUNT_POINT: MOUNT_POINT,
}


def _relabel(report: SaveReport, relabels: Mapping[str, Reason]) -> SaveReport:
    """The copies of kept inputs carry the fact that made the kit keep them, not the "not
    owned" the save saw after the kit gave up their deletion right."""
    if not relabels:
        return report
    actions = tuple(
        dataclasses.replace(a, reason=relabels[a.source])
        if a.source is not None and a.source in relabels and a.action == "copied" else a
        for a in report.actions)
    return dataclasses.replace(report, actions=actions)


def account(report: SaveReport, inputs: Inputs[T], held: Decision, obsolete: Sequence[str], *,
            consume: bool, still_there: Callable[[str], bool]
            ) -> tuple[tuple[str, ...], tuple[KeptInput, ...]]:
    """What the operation removes and keeps: one function for the dry run's forecast and the
    run, from the plan-time decision, so the two agree.  ``still_there`` says whether a data
    file the decision let the save take is still the very file read (the run asks the disk by
    identity, so a new file at a consumed input's name is not the input; the forecast says no:
    the save consumes every owned, undecided input).

    Returns (paths to remove, kept inputs in input order, then indexes)."""
    removed: list[str] = list(obsolete)
    kept: list[KeptInput] = []
    if not consume:
        return tuple(removed), ()
    outputs = {_sys.abspath(o) for o in report.outputs}
    copied = {a.source: a.reason for a in report.actions
              if a.source is not None and a.action == "copied" and a.reason is not None}
    left: set[str] = set()
    for f in dict.fromkeys(inputs.files):
        if _sys.abspath(f) in outputs:
            continue  # replaced by the commit: neither kept nor removed
        if f in held.own:
            with_it = [c for c, h in held.companions.items() if h == f]
            kept.append(KeptInput(f, held.own[f], _with(with_it)))
            left.add(f)
        elif f in held.companions:
            left.add(f)  # named in its holder's entry
        elif still_there(f):  # the save left it although the decision let it be taken
            kept.append(KeptInput(f, KeepReason.NOT_MOVED, copied.get(f, "")))
            left.add(f)
    for index in inputs.indexes:
        if index.path not in held.indexes:
            continue  # an output now: replaced by the commit
        reason = held.indexes[index.path]
        # Its shards' own facts come first (an all-symlink snapshot keeps its index because it
        # keeps its shards); the index's own fact when it alone holds the set.
        if reason is not None and not any(f in held.own for f in index.files):
            kept.append(KeptInput(index.path, reason, _with(list(index.files))))
        elif any(f in left for f in index.files):
            kept.append(KeptInput(index.path, KeepReason.SHARDS_KEPT,
                                  ", ".join(f for f in index.files if f in left)))
        else:
            removed.append(index.path)
    return tuple(removed), tuple(kept)


def _with(paths: Sequence[str]) -> str:
    return "kept with it: " + ", ".join(paths) if paths else ""


def _text(path: str) -> str | None:
    try:
        return _sys.read_text(path, limit=64 << 20)
    except (OSError, ValueError):
        return None


def _is_stream(output: str) -> bool:
    """An output that is (or links to) a FIFO or a device: a stream, not storage, so nothing
    is moved into it and every input stays."""
    try:
        mode = _sys.stat(output).st_mode
    except OSError:
        return False
    return not stat_mod.S_ISREG(mode) and not stat_mod.S_ISDIR(mode)


def _unlinkable_kind(path: str) -> bool:
    """An obsolete name the operation may unlink: a file or a link, never a directory."""
    try:
        return not stat_mod.S_ISDIR(_sys.lstat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _ids(paths: Sequence[str]) -> set[tuple[int, int] | str]:
    ids: set[tuple[int, int] | str] = set()
    for p in paths:
        ids.add(_sys.abspath(p))
        try:
            st = _sys.stat(p)
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids


def _devices(outputs: Mapping[Target, CordLike]) -> frozenset[int]:
    """The devices the outputs' bytes land on: an output name that is a symlink lands where its
    target does, so the resolved path's directory is the one asked."""
    devs = set()
    for target in outputs:
        directory = stand_in(os.path.dirname(_sys.realpath(os.fspath(target))))
        try:
            devs.add(_sys.stat(directory).st_dev)
        except OSError:
            continue
    return frozenset(devs)
