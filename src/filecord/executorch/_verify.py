"""Check a saved program and its data files: structure here, and optionally a runtime load.

Structure (no executorch needed): both files parse with every segment in bounds (the readers
check headers, segment tables, subsegment offsets, named-data and delegate indices) and every
field read is valid (scalar types, dim orders, sizes); every constant tensor fits in the constant
segment; every named-data key the program needs is found: an external tensor's key in exactly
one data file, with a TensorLayout equal to the tensor's (the runtime dereferences the layout
without a null check) and at least the tensor's bytes; a key an XNNPACK delegate's payload
refers to in the program's named data or a data file, with at least the bytes the payload says;
no key is both in the program and in a data file (the runtime refuses such a merged map).  Keys
found nowhere are reported together, in one problem.  Other backends' payloads are not read
(``unparsed_delegates``): a structure pass is never a promise that the program runs.

Runtime: when ``executorch`` is importable and the structure is sound, a child process loads the
program (with its one data file) in ExecuTorch's runtime and loads every method.  A child,
because a file the runtime rejects badly can take the process down with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from filecord.errors import FormatError
from filecord.executorch._contents import NeededKey, TensorInfo, contents
from filecord.executorch.ptd import PtdFile, read_ptd
from filecord.executorch.pte import PteFile, read_pte
from filecord.executorch.values import PtdEntry, TensorLayout

DEFAULT_TAG = "_default_external_constant"  # ExecuTorch's tag for external_constants=True

RUNTIME_TIMEOUT_S = 900

RuntimeStatus = Literal["loaded", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: ``where`` names the file and field, ``message`` says what."""

    where: str
    message: str


@dataclass(frozen=True, slots=True)
class RuntimeCheck:
    """``status``: ``loaded`` (every method loaded), ``failed``, or ``skipped`` (see ``note``)."""

    status: RuntimeStatus
    methods: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class Verification:
    pte: str
    data: tuple[str, ...]
    problems: tuple[Problem, ...]
    external_tensors: int
    constant_tensors: int
    runtime: RuntimeCheck
    needs: tuple[NeededKey, ...] = ()  # every named-data key the program needs to load
    missing: tuple[NeededKey, ...] = ()  # those found neither in the program nor a data file
    unparsed_delegates: tuple[str, ...] = ()  # backends whose payload needs were not read

    @property
    def ok(self) -> bool:
        return not self.problems and self.runtime.status != "failed"


def _check_constant(info: TensorInfo, pte: PteFile) -> list[Problem]:
    where, index = f"{pte.path}: {info.where}", info.constant_index
    if pte.constant_segment is None:
        return [Problem(where, f"constant tensor (buffer {index}) but no constant segment")]
    seg_index, offsets = pte.constant_segment
    if index >= len(offsets):
        return [Problem(where, f"constant buffer {index} but the segment lists {len(offsets)}")]
    seg_size = pte.segments[seg_index].size if seg_index < len(pte.segments) else 0
    need = info.nbytes
    if need is not None and offsets[index] + need > seg_size:
        return [
            Problem(
                where,
                f"constant tensor needs bytes [{offsets[index]}, {offsets[index] + need}) of "
                f"the constant segment, which has {seg_size}",
            )
        ]
    return []


def _check_found(need: NeededKey, found: list[tuple[str, PtdEntry]]) -> list[Problem]:
    path, entry = found[0]
    problems = []
    if len(found) > 1:
        problems.append(
            Problem(f"key {need.key!r}", f"is in {len(found)} data files: "
                                         + ", ".join(p for p, _e in found))
        )
    if need.layout is not None:
        if entry.layout is None:
            problems.append(
                Problem(f"{path}: {need.key}", "no tensor layout (the runtime needs one)")
            )
        elif entry.layout != need.layout:
            problems.append(
                Problem(f"{path}: {need.key}", f"layout {_show(entry.layout)} but the program's "
                                               f"tensor is {_show(need.layout)}")
            )
    if need.size is not None and entry.size < need.size:
        who = "the tensor" if need.needed_by == "tensor" else f"the {need.needed_by} delegate"
        problems.append(
            Problem(f"{path}: {need.key}", f"{entry.size} bytes but {who} needs {need.size}")
        )
    return problems


def _listed(keys: Sequence[NeededKey], limit: int = 8) -> str:
    shown = ", ".join(
        f"{k.key!r} ({'?' if k.size is None else k.size} bytes"
        + ("" if k.needed_by == "tensor" else f", {k.needed_by}") + ")"
        for k in keys[:limit]
    )
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def missing_message(missing: Sequence[NeededKey], data: Sequence[str]) -> str:
    """One sentence for every key found nowhere, naming the data file it is expected in."""
    where = "no data file was given" if not data else "not in " + ", ".join(data)
    return (
        f"{len(missing)} named-data key(s) the program needs at load time, {where}: "
        f"{_listed(missing)}. They belong in a data file (.ptd): ExecuTorch writes tag T's "
        f"data to T.ptd ({DEFAULT_TAG}.ptd for external_constants=True), filecord's "
        f"merge_data to <program>.ptd"
    )


def _show(layout: TensorLayout) -> str:
    return f"{layout.scalar_type.name} {list(layout.sizes)} dim_order {list(layout.dim_order)}"


def _read_data(path: str, problems: list[Problem]) -> PtdFile | None:
    try:
        return read_ptd(path)
    except (FormatError, OSError) as exc:
        problems.append(Problem(path, str(exc)))
        return None


@dataclass(frozen=True, slots=True)
class Structure:
    problems: tuple[Problem, ...]
    pte: PteFile | None
    external_tensors: int
    constant_tensors: int
    needs: tuple[NeededKey, ...]
    missing: tuple[NeededKey, ...]
    unparsed_delegates: tuple[str, ...]


def check_structure(pte_path: str, data_paths: Sequence[str]) -> Structure:
    """Problems found without executorch; also the parsed program and what it needs."""
    problems: list[Problem] = []
    try:
        pte: PteFile | None = read_pte(pte_path)
    except (FormatError, OSError) as exc:
        problems.append(Problem(pte_path, str(exc)))
        pte = None
    ptds = [f for f in (_read_data(path, problems) for path in data_paths) if f is not None]
    if pte is None:
        return Structure(tuple(problems), None, 0, 0, (), (), ())
    by_key: dict[str, list[tuple[str, PtdEntry]]] = {}
    for f in ptds:
        for key, entry in f.entries.items():
            by_key.setdefault(key, []).append((f.path, entry))
    problems.extend(
        Problem(f"{pte.path}: named data {key!r}", "also in data file " + by_key[key][0][0])
        for key in pte.named_data
        if key in by_key
    )
    try:
        found = contents(pte)
    except FormatError as exc:
        problems.append(Problem(pte.path, str(exc)))
        return Structure(tuple(problems), pte, 0, 0, (), (), ())
    external = sum(1 for t in found.tensors if t.external_key is not None)
    constant = 0
    for t in found.tensors:
        if t.external_key is None and t.constant_index > 0 and not t.planned:
            constant += 1
            problems.extend(_check_constant(t, pte))
    missing = []
    in_program = pte.named_data
    for need in found.needs:
        hits = by_key.get(need.key, [])
        if hits:
            problems.extend(_check_found(need, hits))
        elif need.needed_by != "tensor" and need.key in in_program:
            size = pte.segments[in_program[need.key]].size
            if need.size is not None and size < need.size:
                problems.append(Problem(f"{pte.path}: named data {need.key!r}",
                                        f"{size} bytes but the {need.needed_by} delegate "
                                        f"needs {need.size}"))
        else:
            missing.append(need)
    if missing:
        problems.append(Problem(f"{pte.path}: data", missing_message(missing, data_paths)))
    return Structure(tuple(problems), pte, external, constant, found.needs, tuple(missing),
                     found.unparsed_delegates)


def runtime_available() -> bool:
    return importlib.util.find_spec("executorch") is not None


def runtime_load(pte_path: str, data_path: str | None) -> RuntimeCheck:
    """Load the program and every method in ExecuTorch's runtime, in a child process."""
    script = os.path.join(os.path.dirname(__file__), "_runtime_load.py")  # __file__ is absolute
    cmd = [sys.executable, script, pte_path] + ([data_path] if data_path else [])
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RUNTIME_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return RuntimeCheck("failed", note=f"the runtime load took over {RUNTIME_TIMEOUT_S} s")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode < 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        return RuntimeCheck("failed", note=f"the runtime load process ended ({how}): {tail}")
    result = json.loads(lines[-1])
    if result.get("error"):
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return RuntimeCheck(
            "failed", tuple(result.get("methods", ())), f"{result['error']} {tail}".strip()
        )
    return RuntimeCheck("loaded", tuple(result["methods"]))


def verify(
    pte_path: str | os.PathLike[str],
    data_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    runtime: bool = True,
) -> Verification:
    """Check ``pte_path`` with ``data_paths``; see the module docstring."""
    pte = os.fspath(pte_path)
    data = tuple(os.fspath(p) for p in data_paths)
    found = check_structure(pte, data)
    problems = found.problems
    if not runtime:
        check = RuntimeCheck("skipped", note="runtime load not requested")
    elif problems:
        check = RuntimeCheck("skipped", note="not loaded in the runtime: fix the problems first")
    elif not runtime_available():
        check = RuntimeCheck(
            "skipped", note="executorch is not installed: skipped loading the methods in its "
            "runtime (structural checks only)"
        )
    elif len(data) > 1:
        check = RuntimeCheck(
            "skipped", note="ExecuTorch's Python runtime takes one data file per program: merge "
            "them (Program.save(..., merge_data=True)) to load it"
        )
    else:
        check = runtime_load(pte, data[0] if data else None)
    return Verification(
        pte, data, problems, found.external_tensors, found.constant_tensors, check,
        found.needs, found.missing, found.unparsed_delegates,
    )
