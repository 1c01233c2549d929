"""Torch tensors into ExecuTorch data files: ``save_state_dict`` and ``save_external_data``.

Theory of operation
-------------------
The ``.ptd`` is planned before any tensor byte exists: its layout (``ptd_layout``) is a pure
function of each key's name, length, alignment and tensor layout.  The whole file is then
written into ONE owned scratch file beside the output (``O_CREAT|O_EXCL``, ``_torch_stream``):
the header, flatbuffer and padding at offset 0, each tensor streamed from its own memory to its
final offset, one chunk at a time (host memory: one chunk).  A save then publishes that file:
with ``consume=True`` it adopts the scratch by rename (every byte written once); without it
(the default, as everywhere in filecord) it copies it and the scratch is deleted, so the data
is written twice and held twice on disk at the peak.  The tensors are never changed, and only
filecord's own scratch file is ever consumed.  The scratch is not fsynced here: the save
syncs its output before it shortens or removes a source.  A crash leaves a
``.NAME.TOKEN.tensors`` file, garbage; a failed save that left no journal deletes it.

Argument order
--------------
filecord's own verbs take the destination first, as :func:`filecord.save` does
(``save(path, cord)``): ``save_state_dict(path, state_dict)``, ``save_external_data(path,
module, program)``, ``filecord.executorch.save(path, manager)``.  A call in the old order
(``save_state_dict(state_dict, path)``) is refused with a ``TypeError`` that names the new
order, never silently misread.  Why the destination: it is the one argument every writer
has, so it can be first everywhere; what comes after it differs (a Cord, a state dict, a
module and its program).
Drop-ins for another library's function keep that library's order
(:func:`filecord.safetensors.save_file` mirrors ``safetensors.torch.save_file(tensors,
filename)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path
from filecord._kit.torch_stream import chunks, new_file, tensor_items
from filecord._pieces.cord import Cord
from filecord._pieces.data import CHUNK, FileBackedData
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import save
from filecord.executorch._contents import external_tensors
from filecord.executorch._torch_layout import tensor_layout
from filecord.executorch.ptd import PtdLayout, ptd_layout
from filecord.executorch.values import TensorLayout

if TYPE_CHECKING:
    from filecord._plan.report import SaveReport
    from filecord.executorch.program import Program
    from filecord.executorch.pte import PteFile

def _view_identity(t: torch.Tensor) -> tuple[object, ...]:
    # Two keys naming the very same view (tied weights) are written once and stored once.
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype,
            tuple(t.shape), t.stride())


def _destination_first(function: str, path: object, value: object, what: str) -> str:
    """``path`` as a string; a call in the old order (value first) fails naming the new one."""
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    if isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{function} takes the destination first: {function}(path, {what}, ...), as "
            f"filecord.save(path, cord) does; it was called with a {type(path).__name__} "
            f"first and the path {os.fspath(value)!r} second (the old order)"
        )
    raise TypeError(f"{function}: path must be a str or os.PathLike, not {type(path).__name__}")


def save_state_dict(
    path: str | os.PathLike[str],
    state_dict: Mapping[str, torch.Tensor],
    *,
    consume: bool = False,
    alignment: int = 16,
    segment_alignment: int = 128,
    window: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SaveReport:
    """Write ``state_dict`` as an ExecuTorch ``.ptd`` at ``path``: one entry per key, with its
    layout, streamed (see the module docstring; ``consume=True`` writes every byte once).

    Keys are used as they are.  For a program's data file use :func:`save_external_data`,
    which takes the keys from the program itself: ``model.state_dict()`` leaves out
    non-persistent buffers (a Hugging Face Llama's ``rotary_emb.inv_freq``) that such a
    program may need.  Tied weights (the same view under two keys) are stored once.
    """
    target = _destination_first("save_state_dict", path, state_dict, "state_dict")
    directory = os.path.dirname(kernel_path(target))  # beside the file ``open()`` would name
    firsts: dict[tuple[object, ...], int] = {}
    unique: list[tuple[str, torch.Tensor]] = []
    keys: list[tuple[str, int, TensorLayout | None]] = []
    for key, t in tensor_items(state_dict):
        ident = _view_identity(t)
        if ident not in firsts:
            firsts[ident] = len(unique)
            unique.append((key, t))
        index = firsts[ident]
        keys.append((key, index, tensor_layout(unique[index][0], unique[index][1])))
    plan = ptd_layout(
        keys,
        [(t.numel() * t.element_size(), alignment) for _k, t in unique],
        segment_alignment=segment_alignment,
    )
    scratch = _write_ptd(plan, [t for _k, t in unique], directory, os.path.basename(target))
    try:
        report = save(target, Cord([scratch]), consume=consume, window=window or DEFAULT_WINDOW,
                      progress=progress)
    except BaseException as exc:
        # Rolled back in full (no journal left): the scratch is only a copy of the tensors.
        # close() deletes it only if it is still exactly the file written above.
        if getattr(exc, "journal_path", None) is None:
            scratch.close()
        raise
    scratch.close()  # copied (consume=False): ours alone, and nobody else's bytes
    return report


def module_tensors(
    module: torch.nn.Module, keys: Iterable[str]
) -> dict[str, torch.Tensor]:
    """``keys`` looked up in ``module``'s parameters and buffers, non-persistent buffers
    included (``state_dict()`` leaves those out), detached.  Raises ``KeyError`` naming every
    key the module does not have."""
    named: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    wanted = list(keys)
    absent = [k for k in wanted if k not in named]
    if absent:
        shown = ", ".join(repr(k) for k in absent[:8]) + (
            f" and {len(absent) - 8} more" if len(absent) > 8 else ""
        )
        raise KeyError(
            f"{len(absent)} key(s) the program needs are not parameters or buffers of the "
            f"module: {shown}"
        )
    return {k: named[k].detach() for k in wanted}


def save_external_data(
    path: str | os.PathLike[str],
    module: torch.nn.Module,
    program: str | os.PathLike[str] | PteFile | Program,
    *,
    consume: bool = False,
    alignment: int = 16,
    segment_alignment: int = 128,
    window: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SaveReport:
    """Write at ``path`` the data file of ``program``, exported with ``external_constants=...``:
    every tensor the program loads from a data file (:func:`filecord.executorch.external_tensors`),
    taken from ``module``'s parameters and buffers, streamed as :func:`save_state_dict` does.

    The keys and the layouts come from the program, not from ``module.state_dict()``, which
    leaves out non-persistent buffers.  Each tensor's dtype, shape and dim order must equal the
    program's layout (``ValueError`` otherwise), so a module that differs from the exported one
    is refused before anything is written.  Weights a delegate transformed (XNNPACK packs and
    keys them by a hash) are not the module's tensors: they come only from the export itself
    (``filecord.executorch.save(path, manager)``).
    """
    if isinstance(path, torch.nn.Module):
        raise TypeError(
            "save_external_data takes the destination first: save_external_data(path, module, "
            "program, ...), as filecord.save(path, cord) does; it was called with the module "
            "first (the old order)"
        )
    target = _destination_first("save_external_data", path, None, "module")
    layouts = external_tensors(program)
    tensors = module_tensors(module, layouts)
    for key, want in layouts.items():
        got = tensor_layout(key, tensors[key])
        if got != want:
            raise ValueError(
                f"{key!r}: the module's tensor is {got.scalar_type.name}{list(got.sizes)} "
                f"dim_order {list(got.dim_order)}, the program's is "
                f"{want.scalar_type.name}{list(want.sizes)} dim_order {list(want.dim_order)}"
            )
    return save_state_dict(
        target, tensors, consume=consume, alignment=alignment,
        segment_alignment=segment_alignment, window=window, progress=progress,
    )


def _write_ptd(
    plan: PtdLayout, tensors: list[torch.Tensor], directory: str, stem: str
) -> FileBackedData:
    """The whole ``.ptd`` in one owned scratch file: ``plan.head`` at 0, each tensor's bytes
    streamed to its segment's offset.  The file is new, so the gaps between segments (under an
    alignment) read as zeros without being written."""
    path, fd = new_file(directory, stem)
    try:
        _sys.write_all(fd, plan.head, 0)
        base = plan.segment_base_offset
        for t, (offset, _size) in zip(tensors, plan.segments, strict=True):
            pos = base + offset
            for view in chunks(t, CHUNK, None):
                _sys.write_all(fd, view, pos)
                pos += len(view)
        _sys.ftruncate(fd, plan.size)
    except BaseException:
        _sys.close(fd)
        _sys.unlink_missing_ok(path)
        raise
    _sys.close(fd)
    return FileBackedData._scratch(path)
