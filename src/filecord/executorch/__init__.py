"""Clean-room ExecuTorch formats: ``.pte`` programs and ``.ptd`` data files.

One verb per act:

* **read**: ``read_pte``, ``read_ptd`` (every segment a file-backed range, never loaded);
* **build**: ``build_pte`` (program bytes and segments), ``build_ptd`` (named entries),
  ``build_program`` (an emitted Program table and a ``NamedDataStore``: the ``.pte`` and one
  ``.ptd`` per tag, as ExecuTorch's exporter lays them out); each returns Cords holding the
  pieces you gave by reference;
* **merge**: ``merge(output, inputs)`` (``.ptd`` files into one, saved, as every format's
  ``merge`` saves; ``consume=True`` moves their data);
* **export**: ``lean_export()`` (a context manager: ExecuTorch's lowering and emission keep
  each weight as a reference to its storage instead of a copy; ``LeanExportError`` when it
  cannot run);
* **save**: ``Program`` (a ``.pte`` plus its ``.ptd`` files in one transaction), also straight
  from ExecuTorch's ``ExecutorchProgramManager`` or ``ExportSession`` (``from_manager``,
  ``save``); from torch, ``save_state_dict`` and ``save_external_data`` (torch imported on use);
* **verify**: ``verify`` (``Verification``), and ``external_tensors`` (what a program loads
  from data files).

Every writer takes the destination first, as ``filecord.save(path, cord)`` does:
``save(path, manager)``, ``save_state_dict(path, state_dict)``, ``save_external_data(path,
module, program)``; a call in the old order fails with a ``TypeError`` naming the new one.
Schema tools (field tables, the flatbuffer encoder) are in :mod:`filecord.executorch.schema`,
the error classes in :mod:`filecord.executorch.errors`.  Only the ``flatbuffers``
runtime is needed: no generated code, no flatc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from filecord.executorch._build import SerializedProgram, build_program
from filecord.executorch._contents import external_tensors
from filecord.executorch._lean import LeanExportError, lean_export
from filecord.executorch._merge import merge
from filecord.executorch._verify import Verification, verify
from filecord.executorch.adapter import from_manager, save
from filecord.executorch.named_data import NamedDataStore
from filecord.executorch.program import Program
from filecord.executorch.ptd import PtdFile, build_ptd, read_ptd
from filecord.executorch.pte import PteFile, build_pte, read_pte
from filecord.executorch.values import PtdEntry, ScalarType, TensorLayout

if TYPE_CHECKING:
    from filecord.executorch._tensors import save_external_data, save_state_dict

_TORCH = ("save_state_dict", "save_external_data")


def __getattr__(name: str) -> Any:
    if name in _TORCH:  # torch is imported only when these are used
        from filecord.executorch import _tensors

        return getattr(_tensors, name)
    raise AttributeError(f"module 'filecord.executorch' has no attribute {name!r}")


__all__ = [
    # read
    "read_pte",
    "read_ptd",
    "PteFile",
    "PtdFile",
    # build
    "build_pte",
    "build_ptd",
    "build_program",
    "SerializedProgram",
    # merge
    "merge",
    # export
    "lean_export",
    "LeanExportError",
    # save
    "Program",
    "from_manager",
    "save",
    "save_state_dict",
    "save_external_data",
    # verify
    "verify",
    "Verification",
    "external_tensors",
    # values
    "NamedDataStore",
    "PtdEntry",
    "TensorLayout",
    "ScalarType",
]
