"""Torch tensors into owned files, streamed (host memory: one chunk); see ``_kit.torch_stream``.

``write_tensors`` writes tensors into owned scratch files (each tensor a :class:`TensorBlob`:
a ``FileBackedData`` range, its dtype, sizes, dim order and sha256), ``dense_dim_order`` says
in which order a tensor's memory is packed.  Nothing here knows a file format.

``save_state_dict`` and ``save_external_data`` write ExecuTorch data files; they live in
:mod:`filecord.executorch` and are reachable here too, loaded on first use (PEP 562), so that
importing this module imports no ExecuTorch code and no import cycle forms: the ExecuTorch
package builds on ``_kit.torch_stream``, never on this module.  Both take the destination first,
as :func:`filecord.save` does: ``save_state_dict(path, state_dict)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from filecord._kit.torch_stream import DeviceCopy, TensorBlob, dense_dim_order, write_tensors

if TYPE_CHECKING:
    from filecord.executorch._tensors import save_external_data, save_state_dict

_EXECUTORCH = ("save_state_dict", "save_external_data")


def __getattr__(name: str) -> Any:
    if name in _EXECUTORCH:
        from filecord.executorch import _tensors

        return getattr(_tensors, name)
    raise AttributeError(f"module 'filecord.torch' has no attribute {name!r}")


__all__ = [
    # tensors into owned files
    "write_tensors",
    "TensorBlob",
    "dense_dim_order",
    "DeviceCopy",
    # ExecuTorch data files (loaded from filecord.executorch on first use)
    "save_state_dict",
    "save_external_data",
]
