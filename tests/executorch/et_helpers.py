"""Helpers for the ExecuTorch format tests (imported as ``et_helpers``).

The interop fixture exports every program once per session (ExecuTorch export is the slow
part, ~2-4 s each on CPU) into a session temp dir; pure tests never touch it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from filecord._pieces.cord import Cord


def write_cord(cord: Cord, path: Path) -> Path:
    with open(path, "wb") as f:
        cord.write_to_file(f)
    return path


@dataclass
class Exported:
    name: str
    pte: Path
    ptds: dict[str, Path]
    config: dict[str, Any]  # the ExecutorchBackendConfig knobs used
    x: Any
    expected: Any  # PyTorch's output for x (first call)
    state: dict[str, Any] = field(default_factory=dict)  # the module's state_dict
    manager: Any = None  # the ExecutorchProgramManager that wrote pte/ptds


PROGRAMS = (
    "linear",
    "external",
    "xnnpack",
    "align4096",
    "tensor64",
    "inline_delegate",
    "mutable",
    "two_tags",
)


def export_all(out: Path) -> dict[str, Exported]:
    torch = pytest.importorskip("torch", reason="interop tests need torch")
    pytest.importorskip("executorch", reason="interop tests need executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from torch.export import export

    class Linear(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            return self.lin(x)

    class WithBuffer(Linear):
        def __init__(self) -> None:
            super().__init__()
            # Zeros: the runtime starts a mutable buffer without serialized data from zeros.
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x: Any) -> Any:
            self.count.add_(1.0)
            return self.lin(x) + self.count

    def tagger(node: Any) -> str:
        return "tag_b" if "bias" in node.name else "tag_a"

    torch.manual_seed(1)
    x = torch.randn(2, 4)
    specs: dict[str, tuple[type, dict[str, Any], bool]] = {
        "linear": (Linear, {}, False),
        "external": (Linear, {"external_constants": True}, False),
        "xnnpack": (Linear, {}, True),
        "align4096": (Linear, {"segment_alignment": 4096}, False),
        "tensor64": (Linear, {"constant_tensor_alignment": 64}, False),
        "inline_delegate": (Linear, {"extract_delegate_segments": False}, True),
        "mutable": (WithBuffer, {"emit_mutable_buffer_names": True}, False),
        "two_tags": (Linear, {"external_constants": tagger}, False),
    }
    result = {}
    for name, (cls, config, xnn) in specs.items():
        module = cls().eval()
        state = {k: v.clone() for k, v in module.state_dict().items()}
        partitioner = [XnnpackPartitioner()] if xnn else None
        edge = to_edge_transform_and_lower(export(module, (x,)), partitioner=partitioner)
        et = edge.to_executorch(ExecutorchBackendConfig(**config))
        d = out / name
        d.mkdir()
        et.save(str(d / f"{name}.pte"))
        et.write_tensor_data_to_file(str(d))
        expected = cls().eval()(x)  # fresh module: the exported program starts from init state
        ptds = {p.stem: p for p in sorted(d.glob("*.ptd"))}
        result[name] = Exported(name, d / f"{name}.pte", ptds, config, x, expected, state, et)
    return result


def run_program(pte: os.PathLike[str] | str, x: Any, data_path: Path | None = None) -> Any:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(
        Path(pte), data_path=None if data_path is None else str(data_path)
    )
    return program.load_method("forward").execute([x])[0]


# --- hand-built programs (no executorch needed) ---------------------------------------------

WEIGHT = bytes(range(48))
BIAS = bytes(range(100, 112))
DELEGATE_BLOB = b"delegate-blob-" * 10


def sample_program(*, delegate: bool = True, constants: tuple[bytes, ...] = (b"", WEIGHT, BIAS)):
    """A small Program in emitter form: constants inline, one inline delegate blob."""
    from filecord.executorch.schema import program_table as t

    tensor = t(
        "Tensor",
        scalar_type=6,
        sizes=(3, 4),
        dim_order=(0, 1),
        data_buffer_idx=1,
        extra_tensor_info=t("ExtraTensorInfo", fully_qualified_name="lin.weight"),
    )
    values = (
        t("EValue", val=tensor),
        t("EValue", val=t("Int", int_val=-7)),
        t("EValue", val=t("Double", double_val=2.5)),
        t("EValue", val=t("BoolList", items=(True, False, True))),
        t("EValue", val=t("String", string_val="héllo")),
        t("EValue", val=t("Null")),
    )
    chain = t(
        "Chain",
        inputs=(),
        outputs=(),
        instructions=(
            t("Instruction", instr_args=t("KernelCall", op_index=0, args=(0, 1, 2))),
            t("Instruction", instr_args=t("FreeCall", value_index=1)),
        ),
    )
    delegates = ()
    if delegate:
        ref = t("BackendDelegateDataReference", location=0, index=0)
        delegates = (
            t(
                "BackendDelegate",
                id="DummyBackend",
                processed=ref,
                compile_specs=(t("CompileSpec", key="k", value=(1, 2)),),
            ),
        )
    plan = t(
        "ExecutionPlan",
        name="forward",
        container_meta_type=t("ContainerMetadata", encoded_inp_str="in", encoded_out_str="out"),
        values=values,
        inputs=(0,),
        outputs=(0,),
        chains=(chain,),
        operators=(t("Operator", name="aten::add", overload="out"),),
        delegates=delegates,
        non_const_buffer_sizes=(0, 64),
    )
    return t(
        "Program",
        version=0,
        execution_plan=(plan,),
        constant_buffer=tuple(t("Buffer", storage=c) for c in constants),
        backend_delegate_data=(
            (t("BackendDelegateInlineData", data=DELEGATE_BLOB),) if delegate else ()
        ),
    )
