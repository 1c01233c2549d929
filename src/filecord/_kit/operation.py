"""The one skeleton every merge, reshard and convert of every format runs on.

Theory of operation
-------------------
An operation is: **inputs** (read headers only; with ``consume`` each data file is one owned
whole-file piece, so the save may move its bytes and delete it) -> **job** (the outputs as
Cords of ranges of those pieces, and the files the outputs make obsolete) -> **dry run**
(``plan``: what would happen, nothing written) or **save** (``save_many``: one transaction) ->
**settle** (after the commit: remove what the operation, not the save, must remove).

Deletion rights: whatever happens, every input piece gives up its deletion right on the way
out (``detach_cleanup``), so only a committed consuming save removes a user's data file, never
a dry run, a failure, or the garbage collector.

After the commit nothing raises (DESIGN invariant 8): :mod:`filecord._kit.removal` decides
which index files may go (only with all of their data files) and removes them and the
obsolete files, recording what it kept and why; the data files the save kept are listed too.
The result is an :class:`OperationReport`: the save's report plus ``removed`` and ``kept``.
Inputs are never in the obsolete list (the save decides about them), so a kept input survives
a reshard into its own directory.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from filecord._io import syscalls as _sys
from filecord._kit.removal import (
    KeepReason,
    KeptInput,
    PathFacts,
    index_verdict,
    keep_reason,
    observe,
    remove_after_commit,
    why_kept,
)
from filecord._pieces.data import FileBackedData
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._plan.types import HARDLINK, OTHER_FS, Reason
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import plan, save_many
from filecord._txn.state import ProgressCallback as ProgressCallback

Paths = Sequence[str | os.PathLike[str]]
T = TypeVar("T")
log = logging.getLogger("filecord")
# Kept-input reasons under which the save itself would still delete the file at its commit.
_SAVE_DELETES = (KeepReason.HARD_LINKED, KeepReason.OTHER_FS)


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

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(w.path for w in self.wholes)


@dataclass(frozen=True, slots=True)
class Job:
    """The outputs of an operation, and the files they make obsolete (removed after the commit
    when they are not inputs)."""

    outputs: Mapping[Target, CordLike]
    obsolete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OperationReport(SaveReport):
    """A :class:`~filecord.SaveReport` plus what the operation did to its inputs after the
    commit: ``removed`` (indexes and obsolete files it unlinked; the data files the save
    consumed are gone too, as the report's ``moved``/``cloned`` pieces say) and ``kept``
    (every input of a consuming operation still on disk, with a typed reason).  In a dry run
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
    try:
        job = build(inputs.value)
        out_devs = _devices(job.outputs)
        disowned = disown_kept(inputs.wholes, out_devs) if consume else {}
        input_ids = _ids([*inputs.files, *(i.path for i in inputs.indexes)])
        obsolete = [p for p in job.obsolete if not (_ids([p]) & input_ids)]
        if dry_run:
            report = _relabel(plan(job.outputs, consume=consume, window=window), disowned)
            return forecast(report, inputs, obsolete, consume=consume, output_devs=out_devs)
        report = _relabel(save_many(job.outputs, consume=consume, window=window,
                                    progress=progress), disowned)
    finally:
        for w in inputs.wholes:
            w.detach_cleanup()
    # Committed: the outputs are complete under their final names.  Nothing below raises.
    try:
        return settle(report, inputs, obsolete, consume=consume, output_devs=out_devs)
    except OSError as exc:  # e.g. the working directory vanished: keep, report, return
        log.warning("after the commit, the inputs could not be judged (%s): all are kept", exc)
        return OperationReport.of(report, kept=tuple(
            KeptInput(i.path, KeepReason.NOT_REMOVABLE, str(exc)) for i in inputs.indexes))


def disown_kept(wholes: Sequence[FileBackedData], output_devs: frozenset[int]
                ) -> dict[str, Reason]:
    """Give up the deletion right over each input the operation must keep although the save
    would take it over: one with another hard link (another name still holds the bytes: the
    user has a second copy in mind) or on another file system than the outputs (nothing moves
    across file systems; deleting after a copy would be a silent ``mv``).  Symlinks, read-only
    and immutable files the save keeps by itself, with its own reason for the copy.  Returns
    path -> the save's own reason for copying each, to report instead of "not owned"."""
    disowned: dict[str, Reason] = {}
    for w in wholes:
        reason = keep_reason(observe(w.path), output_devs=output_devs) if w.owned else None
        if reason in _SAVE_DELETES:
            w._disown()  # the kit is the one caller of this private right
            disowned[w.path] = HARDLINK if reason is KeepReason.HARD_LINKED else OTHER_FS
    return disowned


def _relabel(report: SaveReport, disowned: Mapping[str, Reason]) -> SaveReport:
    """The copies of disowned inputs carry the fact that made the kit keep them (another hard
    link, another file system), not the "not owned" the save saw."""
    if not disowned:
        return report
    actions = tuple(
        dataclasses.replace(a, reason=disowned[a.source])
        if a.source is not None and a.source in disowned and a.action == "copied" else a
        for a in report.actions)
    return dataclasses.replace(report, actions=actions)


def forecast(report: SaveReport, inputs: Inputs[T], obsolete: Sequence[str], *,
             consume: bool, output_devs: frozenset[int]) -> OperationReport:
    """A dry run's report: what the operation would remove and keep, from the same facts
    :func:`settle` will judge by (a data file the facts let the save take over counts as
    consumed).  Nothing is touched."""
    kept: list[KeptInput] = []
    removed: list[str] = list(obsolete)
    if consume:
        outputs = {_sys.abspath(o) for o in report.outputs}
        reasons = {a.source: a.reason for a in report.actions if a.reason is not None}
        files = {f: observe(f) for f in dict.fromkeys(inputs.files)}
        left = {}
        for f, facts in files.items():
            if _sys.abspath(f) in outputs or keep_reason(facts, output_devs=output_devs) is None:
                left[f] = PathFacts(f, exists=False)  # the save would take it over
            else:
                left[f] = facts
                kept.append(why_kept(facts, output_devs=output_devs, save_reason=reasons.get(f)))
        for index in inputs.indexes:
            if _sys.abspath(index.path) in outputs:
                continue
            verdict = index_verdict(observe(index.path),
                                    [left.get(f) or observe(f) for f in index.files])
            if verdict is None:
                removed.append(index.path)
            else:
                kept.append(verdict)
    return OperationReport.of(report, removed=tuple(removed), kept=tuple(kept))


def settle(report: SaveReport, inputs: Inputs[T], obsolete: Sequence[str], *, consume: bool,
           output_devs: frozenset[int]) -> OperationReport:
    """After the commit: remove indexes whose data files were all consumed and the obsolete
    files; list every input still on disk with why.  Never raises.

    An input whose name is now an output's (a reshard in place rewrites the index under its
    old name) was replaced by the commit: it is neither kept nor removed.
    """
    kept: list[KeptInput] = []
    doomed: list[str] = list(obsolete)
    if consume:
        outputs = {_sys.abspath(o) for o in report.outputs}
        reasons = {a.source: a.reason for a in report.actions if a.reason is not None}
        files = {f: observe(f) for f in dict.fromkeys(inputs.files)}
        kept.extend(why_kept(facts, output_devs=output_devs, save_reason=reasons.get(f))
                    for f, facts in files.items()
                    if facts.exists and _sys.abspath(f) not in outputs)
        for index in inputs.indexes:
            if _sys.abspath(index.path) in outputs:
                continue
            verdict = index_verdict(observe(index.path), [files.get(f) or observe(f)
                                                          for f in index.files])
            if verdict is None:
                doomed.append(index.path)
            else:
                kept.append(verdict)
    removed, failed = remove_after_commit(doomed)
    return OperationReport.of(report, removed=removed, kept=(*kept, *failed))


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
    devs = set()
    for target in outputs:
        directory = os.path.dirname(_sys.abspath(os.fspath(target)))
        try:
            devs.add(_sys.stat(directory).st_dev)
        except OSError:
            continue
    return frozenset(devs)
