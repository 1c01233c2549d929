"""ExecuTorch programs: ``filecord verify --no-runtime`` agrees with the ExecuTorch runtime on
malformed programs.  Each program holds one tensor value (the method's input and output) with
one field changed; the runtime's verdict is a load of the method, ours the structure checks
alone (exit 0 or 1).  A verdict that differs is a finding: a program we pass and the runtime
rejects fails on a device, one we reject and the runtime loads is a false alarm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from filecord import cli
from filecord.executorch import NamedDataStore, build_program
from filecord.executorch.schema import program_table

CASES: list[Any] = [
    pytest.param({}, id="valid 2-D"),
    pytest.param({"sizes": (3,), "dim_order": (0,)}, id="valid 1-D"),
    pytest.param({"sizes": (3,), "dim_order": ()}, id="1-D with empty dim_order"),
    pytest.param({"dim_order": (0,)}, id="2-D with a 1-D dim_order"),
    pytest.param({"sizes": (), "dim_order": ()}, id="valid 0-D"),
    pytest.param({"dim_order": (1, 0)}, id="valid permuted dim_order"),
    pytest.param({"sizes": (2, 3, 4), "dim_order": (0, 1)}, id="3-D with a 2-D dim_order"),
    pytest.param({"dim_order": (0, 0)}, id="dim_order not a permutation"),
    pytest.param({"dim_order": (1, 2)}, id="dim_order out of range"),
    pytest.param({"scalar_type": 99}, id="unknown scalar type"),
    pytest.param({"sizes": (3, -4)}, id="negative size"),
    pytest.param({"sizes": (1,) * 17, "dim_order": tuple(range(17))}, id="17 dimensions"),
]


def program(**fields: Any) -> bytes:
    """A method whose one value, a FLOAT [3, 4] tensor, is its input and output (the runtime
    loads it as it is), with ``fields`` changed; laid out by ``build_program`` (an empty
    constant segment: the runtime no longer reads ``constant_buffer``)."""
    t = program_table
    tensor = t("Tensor", **{"scalar_type": 6, "sizes": (3, 4), "dim_order": (0, 1), **fields})
    plan = t("ExecutionPlan", name="forward", values=(t("EValue", val=tensor),), inputs=(0,),
             outputs=(0,), non_const_buffer_sizes=(0,), delegates=(), operators=(),
             chains=(t("Chain", inputs=(), outputs=(), instructions=()),))
    empty = t("Program", execution_plan=(plan,), constant_buffer=(t("Buffer", storage=b""),))
    return bytes(build_program(empty, NamedDataStore()).pte)


def runtime_loads(path: Path) -> bool:
    from executorch.runtime import Runtime

    try:
        Runtime.get().load_program(path).load_method("forward")
    except Exception:  # any refusal of the runtime is its verdict
        return False
    return True


@pytest.mark.interop
@pytest.mark.parametrize("fields", CASES)
def test_verify_no_runtime_agrees_with_the_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any]
) -> None:
    pytest.importorskip("executorch.runtime")
    path = tmp_path / "p.pte"
    path.write_bytes(program(**fields))
    ours = cli.main(["verify", "--no-runtime", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ours in (0, 1)
    assert (ours == 0) == runtime_loads(path), err
