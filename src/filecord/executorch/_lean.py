"""``lean_export()``: ExecuTorch's lowering and emission without a copy of every weight.

Theory of operation
-------------------
ExecuTorch 1.5.1 copies each constant into a Python ``bytes`` twice over on its way to a file:
the emitter makes one per constant (to hash it and to keep it in its buffer lists), XNNPACK's
node visitor makes two (one to hash, one for its named-data store), and the backend hand-off
deep-copies each partition's program, weights included.  Under :func:`lean_export` those three
steps are replaced, for the duration of the ``with`` block and process-wide, by:

* emission: a constant with CPU storage becomes a :func:`~._storage.storage_ref` (a zero-copy
  view that ExecuTorch's serializer accepts as file-backed data) hashed in place, and is looked
  up and recorded through the emitter's own helpers exactly as ExecuTorch does it, so the buffer
  indices and deduplication do not change.  Constants without bytes and non-CPU storages go
  through ExecuTorch's own code;
* XNNPACK's ``get_serialized_buffer_index``: the same tensor preparation, then the weight is
  given to the named-data store as a reference to its storage when the preparation kept the
  parameter's own storage, or as a scratch file (:func:`~._storage.spill`) when it computed new
  bytes (cast, quantized, permuted, packed), so the computed tensor is freed at once;
* ``BackendDetails.copy_exported_program_for_preprocess`` (the default every backend without its
  own inherits), and the CUDA backend's own (which shares weights only in its
  ``low_memory_mode``): a deep copy of the program that shares the state-dict and constant
  tensors;
* the AOTI backends' ``load_weights_blob`` (CUDA outside ``low_memory_mode``, Metal): the
  compiled weights blob is kept as a file (:func:`~._storage.adopt_file`) instead of read into
  a ``bytes``, with the same digest and so the same named-data key.  The compiled library
  itself is still read whole by ExecuTorch (code, not weights).

The AOTI and CUDA backends are patched only where they import (CUDA needs triton); they cannot
be exercised without a GPU, so their replacements are tested on their own, not through a
CUDA export.

Each replaced attribute is taken from the class's own ``__dict__`` and put back, the very same
object, on exit, whatever ends the block.  Nothing is written into the installed package.
Because the replacements are process-wide, one block may be active at a time in the process: a
nested or concurrent ``lean_export()`` raises :class:`LeanExportError` instead of interleaving
patches.  The ExecuTorch version is checked before anything is patched; the replacements are
written against the versions in :data:`TESTED_VERSIONS` and are refused for any other.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord.errors import FilecordError
from filecord.executorch import _mapped, _storage

log = logging.getLogger(__name__)

TESTED_VERSIONS = ("1.5.1",)
SMALL_COMPUTED = 1 << 20  # computed weights below this stay bytes (cheaper than a scratch file)

_LOCK = threading.Lock()


class LeanExportError(FilecordError, RuntimeError):
    """``lean_export()`` cannot run here: an untested ExecuTorch version, or one already active."""


def executorch_version() -> str | None:
    """The installed ExecuTorch's release (``1.5.1`` for ``1.5.1+cpu``), or None if absent."""
    try:
        from executorch import version
    except ImportError:
        return None
    return str(version.__version__).split("+", 1)[0]


def check_version() -> None:
    found = executorch_version()
    if found not in TESTED_VERSIONS:
        what = "is not installed" if found is None else f"is version {found}"
        raise LeanExportError(
            f"lean_export() replaces steps inside ExecuTorch and was tested with executorch "
            f"{', '.join(TESTED_VERSIONS)} only; the installed executorch {what}. Export "
            f"without lean_export(), or install a tested version"
        )


@dataclass(frozen=True, slots=True)
class _Patch:
    owner: type
    name: str
    original: Any


@contextmanager
def lean_export(*, scratch_dir: str | None = None) -> Iterator[None]:
    """While active, ExecuTorch's export keeps constants as references to their storage (see
    the module docstring); save the resulting manager with ``filecord.executorch.save``
    (ExecuTorch's own save works too, byte for byte the same).  Weights that lowering computes
    are written to scratch files in ``scratch_dir`` (default: the temp directory).

    Raises :class:`LeanExportError` for an ExecuTorch version other than
    :data:`TESTED_VERSIONS`, and when another ``lean_export()`` is active in the process.
    """
    check_version()
    if not _LOCK.acquire(blocking=False):
        raise LeanExportError(
            "lean_export() is already active in this process (it replaces ExecuTorch steps "
            "process-wide, so blocks cannot nest or run in two threads at once)"
        )
    try:
        directory = scratch_dir if scratch_dir is not None else _sys.gettempdir()
        patches = _install(directory)
        try:
            yield
        finally:
            for p in reversed(patches):
                setattr(p.owner, p.name, p.original)
    finally:
        _LOCK.release()


def _aoti_plan() -> list[tuple[type, str, Callable[[Any], Any]]]:
    """The AOTI/CUDA replacements, for the backends this installation can import."""
    plan: list[tuple[type, str, Callable[[Any], Any]]] = []
    try:
        from executorch.backends.aoti.aoti_backend import AotiBackend
    except ImportError:
        return plan
    plan.append((AotiBackend, "load_weights_blob", _lean_blob))
    try:
        from executorch.backends.cuda.cuda_backend import CudaBackend
    except ImportError:  # no triton: the CUDA backend cannot run here at all
        return plan
    plan.append((CudaBackend, "copy_exported_program_for_preprocess", _lean_copy))
    return plan


class _Files:
    """``/proc/self/smaps``, read once per block at the first digest (weights are mapped before
    the export starts), to note the state of the file each digest was taken from."""

    def __init__(self) -> None:
        self._files: _mapped.MappedFiles | None = None

    def note(self, ref: Any) -> None:
        if self._files is None:
            self._files = _mapped.MappedFiles()
        ref.note_file(self._files.state_at(ref.data_ptr))


def _install(directory: str) -> list[_Patch]:
    from executorch.backends.xnnpack.operators import node_visitor
    from executorch.exir.backend.backend_details import BackendDetails
    from executorch.exir.emit._emitter import _Emitter

    files = _Files()
    plan: list[tuple[type, str, Callable[[Any], Any]]] = [
        (_Emitter, "_tensor_spec_to_evalue", lambda original: _lean_emit(original, files)),
        (BackendDetails, "copy_exported_program_for_preprocess", _lean_copy),
        (node_visitor.NodeVisitor, "get_serialized_buffer_index",
         lambda original: _lean_xnnpack(original, node_visitor, directory, files)),
        *_aoti_plan(),
    ]
    done: list[_Patch] = []
    try:
        for owner, name, make in plan:
            original = owner.__dict__[name]
            setattr(owner, name, make(original))
            done.append(_Patch(owner, name, original))
    except BaseException:
        for p in reversed(done):
            setattr(p.owner, p.name, p.original)
        raise
    return done


# --- emission ---------------------------------------------------------------------------------


def _lean_emit(original: Callable[..., Any], files: _Files) -> Callable[..., Any]:
    from executorch.exir.schema import EValue, TensorDataLocation
    from executorch.exir.tensor import make_tensor_value

    def tensor_spec_to_evalue(self: Any, spec: Any, constant_tag: str | None = None) -> Any:
        storage = spec.storage
        if (not spec.const or spec.allocated_memory == 0 or storage is None
                or storage.device.type != "cpu" or spec.nbytes() != storage.nbytes()):
            return original(self, spec, constant_tag)  # nothing to copy, or ExecuTorch's error
        allocation = (self._get_allocation_info(spec)
                      if spec.mem_id is not None and spec.mem_offset is not None else None)
        ref = _storage.storage_ref(storage)
        digest = ref.sha256().hex()
        files.note(ref)
        state = self.program_state
        info = spec.extra_tensor_info
        if allocation and info is None:  # a mutable buffer with an initial value
            index = state.cached_spec_mutable_hash_values.get(digest, -1)
        elif info is not None and info.location == TensorDataLocation.EXTERNAL:
            index = state.external_constant_hash.get(digest, -1)
            if index != -1:  # same bytes under a new name: the name still gets its entry
                self._save_to_external_constant_map(info.fully_qualified_name, index,
                                                    constant_tag)
        else:
            index = state.cached_spec_hash_values.get(digest, -1)
        if index == -1:
            index = self._save_new_const_tensor(spec, ref, digest, allocation, constant_tag)
        return EValue(make_tensor_value(index, allocation, spec))

    return tensor_spec_to_evalue


# --- the backend hand-off ---------------------------------------------------------------------


def _lean_copy(original: Any) -> Any:
    def copy_exported_program_for_preprocess(
        cls: type, edge_program: Any, compile_specs: Any,
    ) -> Any:
        # deepcopy's memo maps an object's id to its copy: naming each weight as its own copy
        # shares it, while the graph, signature and dicts are still copied.  A tensor that is
        # a view into a larger storage is left to deepcopy, which gives it a storage of its
        # own as ExecuTorch's flow does: backends serialize a weight's whole storage.
        memo: dict[int, Any] = {}
        for table in (edge_program.state_dict, edge_program.constants):
            for value in table.values():
                if not _is_view(value):
                    memo[id(value)] = value
        return copy.deepcopy(edge_program, memo)

    return classmethod(copy_exported_program_for_preprocess)


def _is_view(value: Any) -> bool:
    """A tensor whose bytes are only part of its storage."""
    import torch

    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return False
    return bool(value.storage_offset() != 0
                or value.untyped_storage().nbytes() != value.nbytes)


# --- AOTI's weights blob ----------------------------------------------------------------------


def _lean_blob(original: Any) -> Any:
    def load_weights_blob(cls: type, blob_path: str, compile_specs: Any) -> tuple[Any, str]:
        data = _storage.adopt_file(blob_path)
        return data, data.sha256().hex()

    return classmethod(load_weights_blob)


# --- XNNPACK's constants ----------------------------------------------------------------------


def _lean_xnnpack(original: Callable[..., Any], nv: Any, directory: str,
                  files: _Files) -> Callable[..., Any]:
    import torch

    def get_serialized_buffer_index(  # ExecuTorch's signature: called positionally
        self: Any, tensor: Any, xnn_graph: Any, vals_to_ids: Any,
        convert_to_nhwc: bool,  # noqa: FBT001
        swap_in_out_for_weights: bool,  # noqa: FBT001
        quant_params: Any,
        force_fp32: bool = False,  # noqa: FBT001, FBT002
        groups: int = 1,
    ) -> int:
        source = tensor if quant_params is None else quant_params.q_input
        program = self.exported_program
        param = (nv.get_param_tensor(program, source) if nv.is_param_node(program, source)
                 else None)
        if not isinstance(param, torch.Tensor):  # no constant: ExecuTorch's checks and answer
            return original(self, tensor, xnn_graph, vals_to_ids, convert_to_nhwc,  # type: ignore[no-any-return]
                            swap_in_out_for_weights, quant_params, force_fp32, groups)
        nv.check_or_raise(swap_in_out_for_weights or groups == 1,
                          "groups applies only with swap_in_out_for_weights")
        value = _prepared(self, param, nhwc=convert_to_nhwc, swap=swap_in_out_for_weights,
                          quant=quant_params, force_fp32=force_fp32, groups=groups)
        storage = value.untyped_storage()
        size = int(storage.nbytes())
        nv.check_or_raise(size > 0, f"constant {tensor} has no bytes to serialize")
        if value.device.type != "cpu":
            data: Any = bytes(_storage.storage_ref(storage.cpu()).view)
        elif storage.data_ptr() == param.untyped_storage().data_ptr():
            data = _storage.storage_ref(storage)  # the parameter's own bytes, in place
            data.sha256()
            files.note(data)
        elif size < SMALL_COMPUTED:
            data = bytes(_storage.storage_ref(storage).view)
        else:
            data = _storage.spill(storage, directory)
        key = (data.sha256() if not isinstance(data, bytes) else _sha256(data)).hex()
        index = len(xnn_graph.constant_data)
        xnn_graph.constant_data.append(
            nv.ConstantDataOffset(offset=nv.UINT64_MAX, size=size, named_key=key))
        custom = tensor.meta.get("custom", None)
        tag = custom.get("delegate_constant_tag", None) if custom else None
        self._named_data_store.add_named_data(
            key, data, alignment=nv.CONSTANT_TENSOR_ALIGNMENT, external_tag=tag)
        return index

    return get_serialized_buffer_index


def _sha256(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


def _prepared(visitor: Any, value: Any, *, nhwc: bool, swap: bool, quant: Any,
              force_fp32: bool, groups: int) -> Any:
    """The tensor XNNPACK serializes for a weight: made contiguous, quantized when its
    quantization is static (else cast to float32 unless half precision), its in/out channels
    swapped per group for depthwise and transposed convolutions, channels-last for NHWC, and
    4-bit packed for qc4w.  Each step returns its input when there is nothing to do."""
    import torch

    value = value.contiguous()
    if quant is not None and not quant.is_dynamic:
        value = quant.quantize_tensor(value).contiguous()
    elif force_fp32 or value.dtype not in (torch.float16, torch.bfloat16):
        value = value.to(dtype=torch.float32).contiguous()
    if swap:
        shape = tuple(value.shape)
        rest = shape[2:]
        grouped = value.reshape((groups, shape[0] // groups, *shape[1:]))
        swapped = grouped.permute((0, 2, 1, *range(3, grouped.dim())))
        value = swapped.reshape((shape[1] * groups, shape[0] // groups, *rest)).contiguous()
    if nhwc:
        value = value.to(memory_format=torch.channels_last)
    if quant is not None and quant.is_qc4w:
        value = visitor.convert_to_qc4w(value)
    return value
