"""``filecord demo``: show a save by copy and a save by move side by side, on synthetic engines.

The demo writes its files in a fresh directory (under ``--dir`` or the system temp directory),
saves a header plus the "engine" files into one artifact twice — once copying, once with
``consume=True`` — verifies every output byte against a digest computed while generating, and
prints time, peak allocated disk, peak RSS and the per-piece actions.  Everything it made is
removed unless ``--keep``, also when the demo is stopped by SIGINT (Ctrl-C) or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import signal
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from filecord._io import syscalls as _sys
from filecord._io.measure import DiskSampler, rss_now, rss_peak, rss_reset
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._txn.save import save
from filecord.cli.common import (
    Bar,
    UsageError,
    add_common,
    add_window_option,
    human,
    parse_size,
    positive_int,
    raise_terminated,
)
from filecord.executorch.ptd import build_ptd, read_ptd
from filecord.executorch.values import PtdEntry

SEGMENT = 4096  # a clone-friendly layout: btrfs and XFS can share the engines' extents


# The two runs of the demo: a plain save (copies) and one with consume=True (moves).
Mode = Literal["copy", "consume"]


@dataclass(frozen=True, slots=True)
class RunResult:
    mode: Mode
    seconds: float
    peak_disk: int
    peak_rss_delta: int
    report: SaveReport
    verified: bool


def make_engines(directory: str, total: int, count: int, tag: str) -> list[tuple[str, str]]:
    """Write ``count`` files of pseudo-random bytes totalling ``total``: (path, sha256) each.

    Each 1 MiB block is a fresh sha256-derived pattern, so no two blocks (or files) are equal
    and a misplaced block cannot verify.  The digest is computed while writing.
    """
    sizes = [total // count + (1 if i < total % count else 0) for i in range(count)]
    made = []
    for i, size in enumerate(sizes):
        path = os.path.join(directory, f"engine{i}.{tag}.bin")
        digest = hashlib.sha256()
        fd = _sys.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            off = 0
            block = 0
            while off < size:
                seed = hashlib.sha256(f"{tag}/{i}/{block}".encode()).digest()
                chunk = (seed * (1 << 15))[: min(1 << 20, size - off)]
                _sys.write_all(fd, chunk, off)
                digest.update(chunk)
                off += len(chunk)
                block += 1
        finally:
            _sys.close(fd)
        made.append((path, digest.hexdigest()))
    return made


def _sha(data: object) -> str | None:
    return data.sha256() if isinstance(data, FileBackedData) else None


def run_once(
    directory: str, total: int, count: int, *, consume: bool, window: int, quiet: bool
) -> RunResult:
    """Pack the engines as named data into a ``.ptd`` by copy or by move, and verify it."""
    mode: Mode = "consume" if consume else "copy"
    made = make_engines(directory, total, count, mode)
    entries = {
        f"engine{i}": PtdEntry(f"engine{i}", FileBackedData(p, owned=consume), None, SEGMENT)
        for i, (p, _digest) in enumerate(made)
    }
    out = os.path.join(directory, f"engines.{mode}.ptd")
    cord = build_ptd(entries, segment_alignment=SEGMENT)
    del entries
    sampler = DiskSampler(directory)
    sampler.sample()
    rss_reset()
    base_rss = rss_now()
    start = time.perf_counter()
    with Bar(f"pack .ptd ({mode})", quiet=quiet) as bar, _sys.use(sampler):
        report = save(out, cord, consume=consume, window=window, progress=bar.callback)
    seconds = time.perf_counter() - start
    sampler.sample()
    rss = max(0, rss_peak() - base_rss)
    del cord
    got = read_ptd(out).entries
    verified = all(_sha(got[f"engine{i}"].data) == d for i, (_p, d) in enumerate(made))
    if consume:
        verified = verified and not any(_sys.exists(p) for p, _d in made)
    del got
    _sys.unlink(out)
    for p, _d in made:
        _sys.unlink_missing_ok(p)
    return RunResult(mode, seconds, sampler.peak, rss, report, verified)


_COLUMNS = ("save", "time", "peak disk (x data)", "added peak RSS", "bytes by action",
            "verified")


def _table(results: list[RunResult], total: int) -> str:
    rows = [_COLUMNS]
    for r in results:
        acts = r.report.bytes_by_action()
        pieces = ", ".join(f"{k} {human(v)}" for k, v in sorted(acts.items()))
        rows.append((
            "by copy" if r.mode == "copy" else "consume=True", f"{r.seconds:.2f} s",
            f"{r.peak_disk / max(total, 1):.3f}x", human(r.peak_rss_delta), pieces,
            "yes" if r.verified else "NO",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _legend(total: int) -> str:
    """What the table's numbers mean, in one paragraph under it."""
    text = (f"peak disk (x data): the most disk the engines and the .ptd held at any instant, "
            f"as a multiple of the {human(total)} of engine bytes (a copy holds both: about "
            f"2x; consume=True moves the bytes: about 1x plus one sync window). added peak "
            f"RSS: memory above what the process held before the save (bytes stream through "
            f"the kernel, not through Python). bytes by action: how the output's bytes got "
            f"there: copied, cloned or moved from the engine files, or written (the header).")
    return textwrap.fill(text, width=96)


# --- the real-model step: export a small model with ExecuTorch, stream its weights into
# file-backed data, save with consume=True, load it in the runtime and compare with PyTorch.
# Skipped (with a note) when executorch is not installed.

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


def _model_step(args: argparse.Namespace, workdir: str) -> ModelResult | None:
    if args.no_model:
        return None
    if not available():
        if not args.quiet and not args.json:
            print("(executorch is not installed: skipping the real-model step)")
        return None
    return run_model(workdir)


def _model_json(m: ModelResult | None) -> dict[str, object] | None:
    if m is None:
        return None
    return {"seconds": m.seconds, "weight_bytes": m.weight_bytes,
            "max_abs_error": m.max_abs_error, "verified": m.verified,
            "report": m.report.to_dict()}


_STOP = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _workdir(parent: str, *, keep: bool) -> Iterator[str]:
    """A fresh directory under ``parent``, removed on the way out unless ``keep``.

    On the way out means normally, by an error, by SIGINT (Ctrl-C) or by SIGTERM: SIGTERM is
    turned into an exception for the duration, both signals are blocked while the directory is
    created (so none can land between its creation and the ``finally`` that owns it), and
    ignored while it is removed (so a second Ctrl-C cannot leave half of it behind).
    """
    main = threading.current_thread() is threading.main_thread()
    before: Any = signal.getsignal(signal.SIGTERM)
    if main:
        signal.signal(signal.SIGTERM, raise_terminated)
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
    made: list[str] = []
    try:
        try:
            made.append(_sys.mkdtemp("filecord-demo-", parent))
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP)  # a pending one raises here
        yield made[0]
    finally:
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in _STOP} if main else {}
        try:
            if made and not keep:
                _sys.rmtree(made[0], ignore_errors=True)
        finally:
            for s, h in saved.items():
                signal.signal(s, h)
            if main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _work_parent(args: argparse.Namespace) -> str:
    """Where the demo may work: an existing directory with room for the copy's peak."""
    parent: str = args.dir or _sys.gettempdir()
    if not _sys.isdir(parent):
        raise UsageError(f"--dir {parent}: no such directory")
    vfs = _sys.statvfs(parent)
    free = vfs.f_bavail * vfs.f_frsize
    needed = 2 * args.size + (16 << 20)  # the copy holds the engines and the output at once
    if needed > free:
        raise UsageError(f"--size {human(args.size)} needs {human(needed)} free in {parent} "
                         f"(the copy holds the engines and the output at once), "
                         f"{human(free)} are free: give a smaller --size or another --dir")
    return parent


def run(args: argparse.Namespace) -> int:
    total: int = args.size
    if total < args.pieces:
        raise UsageError(f"--size ({total} bytes) must be at least one byte per piece "
                         f"(--pieces {args.pieces})")
    parent = _work_parent(args)
    results: list[RunResult] = []
    quiet = args.quiet or args.json
    model: ModelResult | None = None
    with _workdir(parent, keep=args.keep) as workdir:
        if not quiet:
            print(f"filecord demo: {human(total)} of synthetic engines in {args.pieces} files, "
                  f"packed as named data into a .ptd, in {workdir}")
        results.extend(
            run_once(workdir, total, args.pieces, consume=consume, window=args.window,
                     quiet=quiet)
            for consume in (False, True)
        )
        model = _model_step(args, workdir)
    ok = all(r.verified for r in results) and (model is None or model.verified)
    if args.json:
        print(json.dumps({
            "size": total, "pieces": args.pieces, "directory": workdir, "kept": args.keep,
            "verified": ok,
            "runs": [
                {"mode": r.mode, "seconds": r.seconds, "peak_disk": r.peak_disk,
                 "peak_disk_over_data": r.peak_disk / max(total, 1),
                 "peak_rss_delta": r.peak_rss_delta, "verified": r.verified,
                 "report": r.report.to_dict()} for r in results
            ],
            "model": _model_json(model),
        }, indent=2))
        return 0 if ok else 1
    print(_table(results, total))
    print(_legend(total))
    for r in results:
        reasons = r.report.copy_reasons()
        if reasons:
            print(f"{r.mode}: copied instead of moved: {reasons}")
    if model is not None:
        by_action = sorted(model.report.bytes_by_action().items())
        acts = ", ".join(f"{k} {human(v)}" for k, v in by_action)
        print(f"model: exported with ExecuTorch, {human(model.weight_bytes)} of weights streamed "
              f"to a file-backed blob and saved with consume=True ({acts}) in "
              f"{model.seconds:.2f} s; the runtime's output matches PyTorch's "
              f"(max abs error {model.max_abs_error:.1e})" if model.verified else
              f"model: the runtime's output DIFFERS from PyTorch's ({model.max_abs_error:.1e})")
    print("all output bytes verified" if ok else "VERIFICATION FAILED")
    if not args.keep:
        print("cleaned up (use --keep to look at the files)")
    return 0 if ok else 1


def build(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=parse_size, default=1 << 30, help="total engine bytes [1GiB]")
    p.add_argument("--pieces", type=positive_int, default=4, help="number of engine files [4]")
    p.add_argument("--dir", default=None, help="where to work [the system temp directory]")
    add_window_option(p)
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--no-model", action="store_true", help="skip the ExecuTorch model step")
    add_common(p)
