"""What a program holds and what it needs to run, from a :class:`PteFile` (pure, no I/O beyond
reading delegate payload headers through their file-backed ranges).

Every field read here is validated first (enum values, permutations, signs, counts, indices) and a
bad one raises :class:`~filecord.executorch.errors.BadValueError` or
:class:`~filecord.executorch.errors.OutOfRangeError` naming it, so ``inspect`` and ``verify``
never fail with anything but a :class:`~filecord.errors.FormatError`.  The work is a fixed
amount per decoded object, and the decoder bounds the objects by the file's size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord.executorch import _fbread
from filecord.executorch._delegates import XNNPACK_ID, xnnpack_keys
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import PTE_HEADER_LENGTH
from filecord.executorch.errors import BadValueError, OutOfRangeError
from filecord.executorch.program import Program
from filecord.executorch.pte import PteFile, parse_pte_header, read_pte
from filecord.executorch.schema import PROGRAM_SCHEMA, TENSOR_DATA_LOCATION_EXTERNAL
from filecord.executorch.values import ScalarType, TensorLayout

MAX_DIMS = 16  # ExecuTorch's runtime limit on a tensor's rank
Dynamism = Literal["static", "dynamic (bounded)", "dynamic (unbounded)"]
_DYNAMISM: dict[int, Dynamism] = {0: "static", 1: "dynamic (bounded)", 2: "dynamic (unbounded)"}
_LOCATIONS = (0, TENSOR_DATA_LOCATION_EXTERNAL)
ELEMENT_SIZE = {
    ScalarType.BYTE: 1, ScalarType.CHAR: 1, ScalarType.SHORT: 2, ScalarType.INT: 4,
    ScalarType.LONG: 8, ScalarType.HALF: 2, ScalarType.FLOAT: 4, ScalarType.DOUBLE: 8,
    ScalarType.BOOL: 1, ScalarType.QINT8: 1, ScalarType.QUINT8: 1, ScalarType.QINT32: 4,
    ScalarType.BFLOAT16: 2, ScalarType.BITS16: 2, ScalarType.FLOAT8E5M2: 1,
    ScalarType.FLOAT8E4M3FN: 1, ScalarType.FLOAT8E5M2FNUZ: 1, ScalarType.FLOAT8E4M3FNUZ: 1,
    ScalarType.UINT16: 2, ScalarType.UINT32: 4, ScalarType.UINT64: 8,
}  # sub-byte packed types (QUINT4X2, QUINT2X4) are left out: their byte size is not checked


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A validated program Tensor: ``nbytes`` is ``None`` for a dynamic shape or packed type."""

    where: str
    layout: TensorLayout
    dynamism: Dynamism
    nbytes: int | None
    external_key: str | None  # set for a tensor whose data comes from a data file
    constant_index: int  # data_buffer_idx (0: no constant data)
    planned: bool  # has allocation_info (memory-planned)


@dataclass(frozen=True, slots=True)
class NeededKey:
    """A named-data key the program needs at load time.

    ``needed_by`` is ``"tensor"`` (an external tensor: it must be in a data file, with
    ``layout``) or a delegate's backend id (the key may be in the program's own named data or
    in a data file).  ``size`` is the least number of bytes the key must hold (``None``: not
    known).
    """

    key: str
    size: int | None
    layout: TensorLayout | None
    needed_by: str


@dataclass(frozen=True, slots=True)
class MethodInfo:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    operators: tuple[str, ...]
    instructions: int
    delegate_calls: int


@dataclass(frozen=True, slots=True)
class Contents:
    methods: tuple[MethodInfo, ...]
    tensors: tuple[TensorInfo, ...]
    needs: tuple[NeededKey, ...]  # first need per key, in program order
    delegates_by_backend: Mapping[str, int]
    unparsed_delegates: tuple[str, ...]  # backend ids whose payload needs are not known


def tensor_info(t: Table, where: str) -> TensorInfo:
    """Validate the fields of a program ``Tensor`` table that verify and inspect use."""
    raw_type = t["scalar_type"]
    try:
        scalar_type = ScalarType(raw_type)
    except ValueError:
        raise BadValueError(
            f"scalar_type {raw_type} is not an ExecuTorch ScalarType", field=where, offset=None
        ) from None
    sizes = tuple(t["sizes"] or ())
    dim_order = tuple(t["dim_order"] or ())
    if len(sizes) > MAX_DIMS:
        raise BadValueError(
            f"{len(sizes)} dimensions; the runtime supports at most {MAX_DIMS}",
            field=f"{where}.sizes",
            offset=None,
        )
    if any(s < 0 for s in sizes):
        raise BadValueError(f"negative size in {list(sizes)}", field=f"{where}.sizes", offset=None)
    if len(dim_order) != len(sizes):  # the runtime refuses this: "Dim order size mismatch"
        raise BadValueError(
            f"dim_order {list(dim_order)} has {len(dim_order)} entries for a tensor of "
            f"{len(sizes)} dimensions (sizes {list(sizes)}); the runtime refuses the program",
            field=f"{where}.dim_order",
            offset=None,
        )
    if sorted(dim_order) != list(range(len(sizes))):
        raise BadValueError(
            f"dim_order {list(dim_order)} is not a permutation of 0..{len(sizes) - 1}",
            field=f"{where}.dim_order",
            offset=None,
        )
    dynamism = _DYNAMISM.get(t["shape_dynamism"])
    if dynamism is None:
        raise BadValueError(
            f"shape_dynamism {t['shape_dynamism']} is not 0, 1 or 2",
            field=f"{where}.shape_dynamism",
            offset=None,
        )
    if t["storage_offset"] < 0:
        raise BadValueError(
            f"storage_offset {t['storage_offset']} is negative",
            field=f"{where}.storage_offset",
            offset=None,
        )
    layout = TensorLayout(scalar_type, sizes, dim_order)
    element = ELEMENT_SIZE.get(scalar_type)
    nbytes = element * math.prod(sizes) if element and dynamism == "static" else None
    info = t["extra_tensor_info"]
    key = None
    if info is not None:
        if info["location"] not in _LOCATIONS:
            raise BadValueError(
                f"location {info['location']} is not SEGMENT (0) or EXTERNAL (1)",
                field=f"{where}.extra_tensor_info.location",
                offset=None,
            )
        if info["location"] == TENSOR_DATA_LOCATION_EXTERNAL:
            key = info["fully_qualified_name"]
            if not key:
                raise BadValueError(
                    "external tensor without a fully qualified name",
                    field=f"{where}.extra_tensor_info",
                    offset=None,
                )
    return TensorInfo(
        where, layout, dynamism, nbytes, key, t["data_buffer_idx"], t["allocation_info"] is not None
    )


def describe_value(value: Table | None) -> str:
    """A method input or output in a few characters: ``FLOAT[1, 3, 8, 8]``, ``int``, ``none``."""
    if value is None:
        return "none"
    name = value.spec.name
    if name == "Tensor":
        try:
            return f"{ScalarType(value['scalar_type']).name}{list(value['sizes'] or ())}"
        except ValueError:
            return f"scalar_type {value['scalar_type']}"
    return {"Int": "int", "Bool": "bool", "Double": "float", "String": "str", "Null": "none"}.get(
        name, name
    )


def _indexed(plan: Table, field: str, where: str) -> tuple[str, ...]:
    values = plan["values"] or ()
    out = []
    for j, index in enumerate(plan[field] or ()):
        if not 0 <= index < len(values):
            raise OutOfRangeError(
                f"value index {index} but the method has {len(values)} values",
                field=f"{where}.{field}[{j}]",
                offset=None,
            )
        out.append(describe_value(values[index]["val"]))
    return tuple(out)


def contents(pte: PteFile) -> Contents:
    """Methods, tensors and needed keys of ``pte``; raises FormatError subclasses only."""
    methods = []
    tensors: list[TensorInfo] = []
    needs: dict[str, NeededKey] = {}
    for p, plan in enumerate(pte.program["execution_plan"] or ()):
        where = f"execution_plan[{p}]"
        name = plan["name"] or f"plan {p}"
        operators = tuple(
            f"{op['name'] or '?'}" + (f".{op['overload']}" if op["overload"] else "")
            for op in plan["operators"] or ()
        )
        instructions = delegate_calls = 0
        for chain in plan["chains"] or ():
            for ins in chain["instructions"] or ():
                instructions += 1
                args = ins["instr_args"]
                if args is not None and args.spec.name == "DelegateCall":
                    delegate_calls += 1
        methods.append(
            MethodInfo(
                name,
                _indexed(plan, "inputs", where),
                _indexed(plan, "outputs", where),
                operators,
                instructions,
                delegate_calls,
            )
        )
        for v, value in enumerate(plan["values"] or ()):
            val = value["val"]
            if isinstance(val, Table) and val.spec.name == "Tensor":
                info = tensor_info(val, f"{where}.values[{v}]<Tensor>")
                tensors.append(info)
                if info.external_key is not None and info.external_key not in needs:
                    needs[info.external_key] = NeededKey(
                        info.external_key, info.nbytes, info.layout, "tensor"
                    )
    by_backend: dict[str, int] = {}
    unparsed: list[str] = []
    parsed: set[tuple[str, int]] = set()  # a payload shared by many delegates is read once
    for d in pte.delegates:
        by_backend[d.id] = by_backend.get(d.id, 0) + 1
        if d.id != XNNPACK_ID:
            if d.id not in unparsed:
                unparsed.append(d.id)
            continue
        if (d.location, d.index) in parsed:
            continue
        parsed.add((d.location, d.index))
        where = f"execution_plan[{d.plan}].delegates[{d.position}] ({d.id} payload)"
        keys = xnnpack_keys(d.data, where=where)
        if keys is None:
            if d.id not in unparsed:
                unparsed.append(d.id)
            continue
        for k in keys:
            if k.key not in needs:
                needs[k.key] = NeededKey(k.key, k.size, None, d.id)
    return Contents(tuple(methods), tuple(tensors), tuple(needs.values()),
                    MappingProxyType(by_backend), tuple(unparsed))


def external_layouts(program: Table) -> dict[str, TensorLayout]:
    """Key -> layout of every external tensor of a decoded Program (first use of each key)."""
    out: dict[str, TensorLayout] = {}
    for p, plan in enumerate(program["execution_plan"] or ()):
        for v, value in enumerate(plan["values"] or ()):
            val = value["val"]
            if isinstance(val, Table) and val.spec.name == "Tensor":
                info = tensor_info(val, f"execution_plan[{p}].values[{v}]<Tensor>")
                if info.external_key is not None:
                    out.setdefault(info.external_key, info.layout)
    return out
def external_tensors(
    program: str | os.PathLike[str] | PteFile | Program,
) -> dict[str, TensorLayout]:
    """Key -> TensorLayout of every tensor ``program`` loads from a data file (its external
    constants, ``external_constants=...`` at export), in program order.

    ``program`` is a saved ``.pte``, a :class:`PteFile`, or a :class:`Program` (its program
    flatbuffer is read from the Cord's first pieces; segments are not touched).  Keys that a
    delegate's payload asks for (weights a backend transformed, keyed by a hash) are not
    tensors of the program and are not listed: they come only from the export itself.
    """
    if isinstance(program, PteFile):
        table = program.program
    elif isinstance(program, Program):
        table = _decode_cord_program(program.pte)
    else:
        table = read_pte(program).program
    return external_layouts(table)


def _decode_cord_program(cord: Cord) -> Table:
    head = _cord_prefix(cord, 8 + PTE_HEADER_LENGTH)
    parsed = parse_pte_header(head, len(cord))
    region = _cord_prefix(cord, parsed[1] if parsed else len(cord))
    return _fbread.decode(region, PROGRAM_SCHEMA)


def _cord_prefix(cord: Cord, n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    for piece in cord.pieces:
        if left <= 0:
            break
        if isinstance(piece, Derived):
            raise TypeError(f"{piece!r}: an ExecuTorch file cannot be read from a derived piece")
        chunk = (piece.prefix(left) if isinstance(piece, (FileBackedData, FileRows))
                 else bytes(piece[:left]))
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
