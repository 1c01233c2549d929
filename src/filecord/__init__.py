"""filecord: assemble large artifacts from bytes and file-backed pieces, atomically.

``save``/``save_many`` write through a temp file, fsync, rename and a directory fsync; with
``consume=True`` owned file-backed pieces are moved (or cloned) instead of copied.  ``plan`` is
the dry run and ``recover`` finishes or undoes an interrupted save from its journal.

Argument order: every filecord writer takes its destination first (``save(path, cord)``,
``executorch.save(path, manager)``, ``save_state_dict(path, state_dict)``,
``save_external_data(path, module, program)``, ``safetensors.merge(output, inputs)``,
``reshard(directory, inputs)``, ``convert(output, source)``, ``gguf.merge(output, inputs)``,
``reshard(output, inputs)``, ``convert(output, source)``), because the destination is the one
argument every writer has; calls in the old source-first order are refused before anything is
written.  Drop-ins for another library keep its order (``safetensors.save_file(tensors,
filename)``, ``save_sharded(state_dict, directory)``).

One vocabulary across the formats: ``read_*`` reads headers into file-backed ranges,
``build_*`` returns Cords, ``merge``/``reshard``/``convert`` save (each returns an
:class:`OperationReport`: the save's report plus the inputs it removed or kept, and why),
``dry_run=True`` plans instead of saving, shard size is ``max_shard_size``.  Every error class
is in an ``errors`` module (:mod:`filecord.errors` and one per format package).
"""

from filecord._kit.operation import OperationReport
from filecord._kit.removal import KeepReason, KeptInput
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._plan.types import PieceAction
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.recover import Recovered, recover
from filecord._txn.save import plan, save, save_many

__version__ = "0.1.0"

__all__ = [
    # saving
    "Cord",
    "FileBackedData",
    "save",
    "save_many",
    "plan",
    "recover",
    # results and defaults
    "SaveReport",
    "PieceAction",
    "OperationReport",
    "KeptInput",
    "KeepReason",
    "Recovered",
    "DEFAULT_WINDOW",
    # version
    "__version__",
]
