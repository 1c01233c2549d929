"""The public ExecuTorch surface: 23 names, each resolvable, no module hidden by a function, and
importing it pulls in neither torch nor an import cycle (the README's list of these names is
checked with every other package's in tests/api/test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import filecord.executorch as fe

ROOT = Path(__file__).resolve().parents[2]


def test_all_has_21_names_that_resolve() -> None:
    # That the README lists exactly these is tests/api/test_public_api.py's check, for every
    # package.
    assert len(fe.__all__) == len(set(fe.__all__)) == 23
    for name in fe.__all__:
        assert getattr(fe, name) is not None


def test_no_submodule_is_hidden_by_a_function() -> None:
    """``fe.verify`` and ``fe.save`` are functions; no module of that name exists to shadow."""
    package = Path(fe.__file__).parent
    modules = {p.stem for p in package.glob("*.py")}
    assert not modules & set(fe.__all__)
    assert callable(fe.verify)
    assert callable(fe.save)


def test_schema_tools_live_in_the_schema_module() -> None:
    from filecord.executorch import schema

    for name in ("program_table", "flat_tensor_table", "Table", "encode_program",
                 "PROGRAM_SCHEMA", "FLAT_TENSOR_SCHEMA"):
        assert hasattr(schema, name)
        assert name not in fe.__all__


def test_importing_the_formats_does_not_import_torch() -> None:
    # filecord.torch itself needs torch; the ExecuTorch package must not import it.
    only_et = "import sys, filecord.executorch\nprint('torch' in sys.modules)\n"
    env = {"PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", only_et], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "False"
    # filecord.torch knows no format: it never loads the ExecuTorch package.
    alone = ("import sys, filecord.torch as ft\n"
             "print('filecord.executorch' in sys.modules, hasattr(ft, 'save_state_dict'))\n")
    out = subprocess.run([sys.executable, "-c", alone], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_value_types_are_frozen_slotted_and_pickle() -> None:
    import dataclasses
    import pickle

    from filecord.executorch import _contents, _verify, ptd, pte, values

    classes = [values.TensorLayout, values.PtdEntry, values.Segment, ptd.PtdFile, ptd.PtdHeader,
               ptd.PtdLayout, pte.PteFile, pte.PteHeader, pte.PteDelegate, fe.Program,
               fe.SerializedProgram, fe.Verification, _verify.RuntimeCheck, _verify.Problem,
               _contents.Contents, _contents.TensorInfo, _contents.NeededKey, _verify.Structure]
    for cls in classes:
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        assert "__slots__" in cls.__dict__, cls
    layout = fe.TensorLayout(fe.ScalarType.FLOAT, (2, 3), (1, 0))
    entry = fe.PtdEntry("k", b"abc", layout, 4)
    check = fe.Verification("a.pte", (), (_verify.Problem("w", "m"),), 0, 0,
                            _verify.RuntimeCheck("skipped"))
    for value in (layout, entry, check):
        assert pickle.loads(pickle.dumps(value)) == value  # noqa: S301 - our own bytes
