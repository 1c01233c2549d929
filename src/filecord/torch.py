"""Torch tensors into owned files, streamed (host memory: one chunk); see ``_torch_stream``.

``write_tensors`` writes tensors into owned scratch files (each tensor a :class:`TensorBlob`:
a ``FileBackedData`` range, its dtype, sizes, dim order and sha256), ``dense_dim_order`` says
in which order a tensor's memory is packed.  Nothing here knows a file format: the ExecuTorch
data-file writers built on this (``save_state_dict``, ``save_external_data``) are in
:mod:`filecord.executorch`, their one home.
"""

from __future__ import annotations

from filecord._kit.torch_stream import DeviceCopy, TensorBlob, dense_dim_order, write_tensors

__all__ = [
    # tensors into owned files
    "write_tensors",
    "TensorBlob",
    "dense_dim_order",
    "DeviceCopy",
]
