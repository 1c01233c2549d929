"""The demo's real-model step: export a small model with ExecuTorch, stream its weights into
file-backed data, save with ``consume=True``, load it in the ExecuTorch runtime and compare
with PyTorch.  Skipped (with a note) when ``executorch`` is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord._plan.report import SaveReport


@dataclass(frozen=True, slots=True)
class ModelResult:
    seconds: float
    weight_bytes: int
    max_abs_error: float
    report: SaveReport
    verified: bool


def available() -> bool:
    """torch and the real executorch package (its runtime; a bare ``executorch`` folder on the
    path, such as a test directory, does not count)."""
    try:
        return all(
            importlib.util.find_spec(m) is not None for m in ("torch", "executorch.runtime")
        )
    except ModuleNotFoundError:
        return False


def run_model(directory: str) -> ModelResult:
    """Export, save (weights moved), run; the files are removed before returning."""
    import torch
    from torch.export import export

    from filecord._txn.save import save
    from filecord.executorch import save_state_dict

    with _silenced():
        return _run(directory, torch, export, save, save_state_dict)


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """ExecuTorch, torchao and the runtime's C++ print warnings and CPU probes on stdout and
    stderr, some from native code; point both descriptors at /dev/null meanwhile so the demo's
    own table stays readable (``-v`` keeps them)."""
    if logging.getLogger().level < logging.WARNING:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [_sys.dup(1), _sys.dup(2)]
    devnull = _sys.open(os.devnull, os.O_WRONLY)
    try:
        _sys.dup2(devnull, 1)
        _sys.dup2(devnull, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _sys.dup2(saved[0], 1)
        _sys.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            _sys.close(fd)


def _run(directory: str, torch: Any, export: Any, save: Any, save_state_dict: Any) -> ModelResult:
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from filecord.executorch.adapter import from_manager

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    ).eval()
    x = torch.randn(4, 256)
    with torch.no_grad():
        expected = model(x)
    manager = to_edge_transform_and_lower(export(model, (x,))).to_executorch(
        ExecutorchBackendConfig(external_constants=True)
    )
    pte = os.path.join(directory, "model.pte")
    ptd = os.path.join(directory, "model.ptd")
    start = time.perf_counter()
    # The program itself is small (its weights are external); taken over without re-serializing.
    save(pte, from_manager(manager).pte)
    report = save_state_dict(ptd, model.state_dict(), consume=True)
    seconds = time.perf_counter() - start
    program = Runtime.get().load_program(pte, data_path=ptd)
    got = program.load_method("forward").execute([x])[0]
    err = float((got - expected).abs().max())
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for p in (pte, ptd):
        _sys.unlink(p)
    return ModelResult(seconds, weights, err, report, err <= 1e-5)
