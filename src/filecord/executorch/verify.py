"""Check a saved program and its data files: structure here, and optionally a runtime load.

Structure (no executorch needed): both files parse with every segment in bounds (the readers
check headers, segment tables, subsegment offsets, named-data and delegate indices); every
constant tensor fits in the constant segment; every external tensor's key is in exactly one
data file, with a TensorLayout equal to the tensor's (the runtime dereferences the layout without
a null check) and at least the tensor's bytes; no key is both in the program and in a data file
(the runtime refuses such a merged map).

Runtime: when ``executorch`` is importable and the structure is sound, a child process loads the
program (with its one data file) in ExecuTorch's runtime and loads every method.  A child,
because a file the runtime rejects badly can take the process down with it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from filecord.errors import FormatError
from filecord.executorch._fbschema import Table
from filecord.executorch.ptd import PtdFile, read_ptd
from filecord.executorch.pte import PteFile, read_pte
from filecord.executorch.schema import TENSOR_DATA_LOCATION_EXTERNAL
from filecord.executorch.values import PtdEntry, ScalarType, TensorLayout

_ELEMENT_SIZE = {
    ScalarType.BYTE: 1, ScalarType.CHAR: 1, ScalarType.SHORT: 2, ScalarType.INT: 4,
    ScalarType.LONG: 8, ScalarType.HALF: 2, ScalarType.FLOAT: 4, ScalarType.DOUBLE: 8,
    ScalarType.BOOL: 1, ScalarType.QINT8: 1, ScalarType.QUINT8: 1, ScalarType.QINT32: 4,
    ScalarType.BFLOAT16: 2, ScalarType.BITS16: 2, ScalarType.FLOAT8E5M2: 1,
    ScalarType.FLOAT8E4M3FN: 1, ScalarType.FLOAT8E5M2FNUZ: 1, ScalarType.FLOAT8E4M3FNUZ: 1,
    ScalarType.UINT16: 2, ScalarType.UINT32: 4, ScalarType.UINT64: 8,
}  # sub-byte packed types (QUINT4X2, QUINT2X4) are left out: no size check for them
_STATIC = 0  # TensorShapeDynamism.STATIC
RUNTIME_TIMEOUT_S = 900


@dataclass(frozen=True)
class Problem:
    """One thing wrong: ``where`` names the file and field, ``message`` says what."""

    where: str
    message: str


@dataclass(frozen=True)
class RuntimeCheck:
    """``status``: ``loaded`` (every method loaded), ``failed``, or ``skipped`` (see ``note``)."""

    status: str
    methods: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Verification:
    pte: str
    data: tuple[str, ...]
    problems: tuple[Problem, ...]
    external_tensors: int
    constant_tensors: int
    runtime: RuntimeCheck

    @property
    def ok(self) -> bool:
        return not self.problems and self.runtime.status != "failed"


def _nbytes(t: Table) -> int | None:
    try:
        size = _ELEMENT_SIZE.get(ScalarType(t["scalar_type"]))
    except ValueError:
        return None
    if size is None or t["shape_dynamism"] != _STATIC:
        return None
    return size * math.prod(t["sizes"] or ())


def _tensors(pte: PteFile) -> list[tuple[str, Table]]:
    out = []
    for p, plan in enumerate(pte.program["execution_plan"] or ()):
        name = plan["name"] or f"plan {p}"
        for v, value in enumerate(plan["values"] or ()):
            val = value["val"]
            if isinstance(val, Table) and val.spec.name == "Tensor":
                out.append((f"{pte.path}: method {name!r} value {v}", val))
    return out


def _check_constant(where: str, t: Table, pte: PteFile) -> list[Problem]:
    index = t["data_buffer_idx"]
    if pte.constant_segment is None:
        return [Problem(where, f"constant tensor (buffer {index}) but no constant segment")]
    seg_index, offsets = pte.constant_segment
    if index >= len(offsets):
        return [Problem(where, f"constant buffer {index} but the segment lists {len(offsets)}")]
    seg_size = pte.segments[seg_index].size if seg_index < len(pte.segments) else 0
    need = _nbytes(t)
    if need is not None and offsets[index] + need > seg_size:
        return [
            Problem(
                where,
                f"constant tensor needs bytes [{offsets[index]}, {offsets[index] + need}) of "
                f"the constant segment, which has {seg_size}",
            )
        ]
    return []


def _check_external(
    where: str, t: Table, found: list[tuple[str, PtdEntry]]
) -> list[Problem]:
    key = (t["extra_tensor_info"] or {}).get("fully_qualified_name")
    if not key:
        return [Problem(where, "external tensor without a fully qualified name")]
    if not found:
        return [Problem(where, f"external tensor {key!r} is in none of the data files given")]
    path, entry = found[0]
    problems = []
    if len(found) > 1:
        problems.append(
            Problem(where, f"key {key!r} is in {len(found)} data files: "
                           + ", ".join(p for p, _e in found))
        )
    want = TensorLayout(ScalarType(t["scalar_type"]), t["sizes"] or (), t["dim_order"] or ())
    if entry.layout is None:
        problems.append(Problem(f"{path}: {key}", "no tensor layout (the runtime needs one)"))
    elif entry.layout != want:
        problems.append(
            Problem(f"{path}: {key}", f"layout {_show(entry.layout)} but the program's tensor is "
                                      f"{_show(want)}")
        )
    need = _nbytes(t)
    if need is not None and entry.size < need:
        problems.append(
            Problem(f"{path}: {key}", f"{entry.size} bytes but the tensor needs {need}")
        )
    return problems


def _show(layout: TensorLayout) -> str:
    return f"{layout.scalar_type.name} {list(layout.sizes)} dim_order {list(layout.dim_order)}"


def _read_data(path: str, problems: list[Problem]) -> PtdFile | None:
    try:
        return read_ptd(path)
    except (FormatError, OSError) as exc:
        problems.append(Problem(path, str(exc)))
        return None


def check_structure(
    pte_path: str, data_paths: Sequence[str]
) -> tuple[list[Problem], PteFile | None, int, int]:
    """Problems found without executorch; also the parsed program and the tensor counts."""
    problems: list[Problem] = []
    try:
        pte: PteFile | None = read_pte(pte_path)
    except (FormatError, OSError) as exc:
        problems.append(Problem(pte_path, str(exc)))
        pte = None
    ptds = [f for f in (_read_data(path, problems) for path in data_paths) if f is not None]
    if pte is None:
        return problems, None, 0, 0
    by_key: dict[str, list[tuple[str, PtdEntry]]] = {}
    for f in ptds:
        for key, entry in f.entries.items():
            by_key.setdefault(key, []).append((f.path, entry))
    problems.extend(
        Problem(f"{pte.path}: named data {key!r}", "also in data file " + by_key[key][0][0])
        for key in pte.named_data
        if key in by_key
    )
    external = constant = 0
    for where, t in _tensors(pte):
        info = t["extra_tensor_info"]
        if info is not None and info["location"] == TENSOR_DATA_LOCATION_EXTERNAL:
            external += 1
            key = info["fully_qualified_name"] or ""
            problems.extend(_check_external(where, t, by_key.get(key, [])))
        elif t["data_buffer_idx"] > 0 and t["allocation_info"] is None:
            constant += 1
            problems.extend(_check_constant(where, t, pte))
    return problems, pte, external, constant


def runtime_available() -> bool:
    return importlib.util.find_spec("executorch") is not None


def runtime_load(pte_path: str, data_path: str | None) -> RuntimeCheck:
    """Load the program and every method in ExecuTorch's runtime, in a child process."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runtime_load.py")
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
    problems, _parsed, external, constant = check_structure(pte, data)
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
    return Verification(pte, data, tuple(problems), external, constant, check)
