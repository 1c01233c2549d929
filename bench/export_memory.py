"""Issue 34: host memory of an ExecuTorch export from memory-mapped weights, ExecuTorch's flow
against ``filecord.executorch.lean_export()`` + ``filecord.executorch.save``.

    sudo .venv/bin/python bench/export_memory.py [--sizes 1G,4G,16G] [--cap 16G] [--dir DIR]

The model: a stack of ``nn.Linear(4096, 4096, bias=False)`` (64 MiB of float32 each; 16 per
GiB) built on the meta device, its weights loaded memory-mapped from a checkpoint written once
per size (``torch.load(mmap=True, weights_only=True)`` + ``load_state_dict(assign=True)``), so
before the export the weights are the checkpoint file's pages and no anonymous memory.  Each
weight holds distinct seeded normal values (scale 1/64, so activations stay finite through
hundreds of layers), so no two constants are deduplicated.

Rows, each in a fresh child process (one run per row):

* ``portable``: ``torch.export`` -> ``to_edge`` -> ``to_executorch(ExecutorchBackendConfig(
  external_constants=True))``: every weight an external constant in a ``.ptd``;
* ``xnnpack``: the weights tagged external (``delegate_external_constants_pass_unlifted``, as
  ExecuTorch's LLM export does), ``to_edge_transform_and_lower`` with ``XnnpackPartitioner`` and
  ``to_executorch(external_constants=...)``: the delegate's weights as named data in a ``.ptd``;

each by ExecuTorch's flow (its own ``save`` + ``write_tensor_data_to_file``) and by the same
calls under ``lean_export()`` saved with ``filecord.executorch.save``.  Measured from the
loaded model to the files written: the peak of ``RssAnon`` (``/proc/self/status``, sampled
every 5 ms in a thread of the child) over its value before the export, and the wall time
(ExecuTorch's save never fsyncs; filecord's is durable when it returns, so ExecuTorch's time
is also given with an fsync of its outputs).  The parent compares the sha256 of every output
file of the two flows.

Each child runs in its own memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``)
capped at ``--cap`` or the memory available less 3 GiB, whichever is less, so a flow that
needs more is killed inside its cgroup ("out of memory") and never the machine's other jobs.
``--runtime`` then loads each lean ``.pte`` + ``.ptd`` in the ExecuTorch runtime in a fresh
capped child and runs one forward, against eager PyTorch on the memory-mapped model.  That
child runs without CAP_IPC_LOCK (``setpriv``), as a user does: the runtime's loader mlocks what
it loads and ignores a refusal, so as root it would pin the whole ``.ptd`` in RAM.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _bench import GiB, MiB, Timeline, machine, parse_size, table

DIM = 4096
LAYER = DIM * DIM * 4  # bytes of one layer's weight
TAG = "model"
FLOWS = ("executorch", "lean")
BACKENDS = ("portable", "xnnpack")
SEED = 34
HEADROOM = 3 * GiB  # left to the machine's other jobs below what is available


# --- the child: one row --------------------------------------------------------------------


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon in /proc/self/status")


def load_model(ckpt: Path, layers: int) -> Any:
    import torch

    class Linears(torch.nn.Module):  # type: ignore[misc]
        # A named list, not nn.Sequential: ExecuTorch's delegate_external_constants_pass_unlifted
        # loses its tag on the re-export of a weight whose attribute name starts with a digit
        # (the weights stayed in the .pte), so the layers are ``layers.{i}``.
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(DIM, DIM, bias=False) for _ in range(layers))

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = layer(x)
            return x

    with torch.device("meta"):
        model = Linears()
    state = torch.load(ckpt, mmap=True, weights_only=True)
    model.load_state_dict(state, assign=True)
    return model.eval().requires_grad_(False)


def sample_input() -> Any:
    import torch

    return torch.randn(1, DIM, generator=torch.Generator().manual_seed(SEED))


def export_and_save(model: Any, backend: str, flow: str, out: Path) -> None:
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from torch.export import export

    import filecord.executorch as fe

    x = (sample_input(),)
    lean = fe.lean_export() if flow == "lean" else contextlib.nullcontext()
    pte = out / "model.pte"
    with lean, torch.no_grad():
        ep = export(model, x)
        if backend == "portable":
            manager = to_edge(ep).to_executorch(ExecutorchBackendConfig(external_constants=True))
        else:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
                XnnpackPartitioner,
            )
            from executorch.exir.passes.external_constants_pass import (
                delegate_external_constants_pass_unlifted,
            )

            graph = ep.module()
            delegate_external_constants_pass_unlifted(graph, gen_tag_fn=lambda _node: TAG)
            ep = export(graph, x)
            edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
            manager = edge.to_executorch(
                ExecutorchBackendConfig(external_constants=lambda _node: TAG))
        if flow == "lean":
            fe.save(pte, manager)
        else:
            manager.save(str(pte))
            manager.write_tensor_data_to_file(str(out))


def fsync_dir(out: Path) -> float:
    t0 = time.perf_counter()
    for p in [*out.iterdir(), out]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def child_row(ckpt: Path, layers: int, backend: str, flow: str, out: Path) -> dict[str, Any]:
    model = load_model(ckpt, layers)
    # Imported first: module imports are neither the export's memory nor its time.
    for name in ("executorch.backends.xnnpack.partition.xnnpack_partitioner",
                 "executorch.exir", "executorch.exir.passes.external_constants_pass",
                 "filecord.executorch"):
        importlib.import_module(name)

    base = rss_anon()
    t0 = time.perf_counter()
    with Timeline(rss_anon, every=0.005) as tl:
        export_and_save(model, backend, flow, out)
        seconds = time.perf_counter() - t0
    sync = fsync_dir(out) if flow == "executorch" else 0.0
    return {"seconds": seconds, "durable": seconds + sync, "anon": tl.peak - base,
            "base": base}


def child_runtime(ckpt: Path, layers: int, out: Path) -> dict[str, Any]:
    import torch
    from executorch.runtime import Runtime

    model = load_model(ckpt, layers)
    x = sample_input()
    with torch.no_grad():
        eager = model(x)
    runtime = Runtime.get()
    ptds = sorted(out.glob("*.ptd"))
    if len(ptds) != 1:
        raise SystemExit(f"expected one .ptd beside the program, found {[p.name for p in ptds]}")
    base = rss_anon()
    t0 = time.perf_counter()
    with Timeline(rss_anon, every=0.005) as tl:
        program = runtime.load_program(out / "model.pte", data_path=str(ptds[0]))
        got = program.load_method("forward").execute([x])[0]
        seconds = time.perf_counter() - t0
    diff = float((got - eager).abs().max())
    scale = float(eager.abs().max())
    return {"seconds": seconds, "anon": tl.peak - base, "max_abs_diff": diff, "scale": scale,
            "close": bool(torch.allclose(got, eager, rtol=1e-4, atol=1e-4 * max(scale, 1.0)))}


# --- the parent ------------------------------------------------------------------------------


def write_checkpoint(work: Path, size: int) -> Path:
    """``size`` bytes of seeded normal float32 written once in 64 MiB steps to a raw file,
    each layer a memory-mapped view of it (its own storage), saved with ``torch.save``; the raw
    file is deleted.  Neither file passes through anonymous memory whole."""
    import numpy as np
    import torch

    layers = size // LAYER
    raw = work / "weights.raw"
    rng = np.random.default_rng(SEED)
    with open(raw, "wb") as f:
        for _ in range(layers):
            (rng.standard_normal(DIM * DIM, dtype=np.float32) / 64).tofile(f)
    state = {}
    for i in range(layers):
        view = np.memmap(raw, dtype=np.float32, mode="c", offset=i * LAYER, shape=(DIM, DIM))
        state[f"layers.{i}.weight"] = torch.from_numpy(view)
    ckpt = work / "ckpt.pt"
    torch.save(state, ckpt)
    del state
    raw.unlink()
    return ckpt


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no MemAvailable in /proc/meminfo")


class Cgroup:
    """A memory cgroup of its own for one child (v2 where the memory controller is there,
    else v1), removed on exit; ``oom_killed`` says whether the kernel killed inside it."""

    def __init__(self, limit: int) -> None:
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and "memory" in (
                v2 / "cgroup.controllers").read_text().split():
            self.path, self.v2 = v2 / f"filecord-bench-{os.getpid()}", True
        else:
            self.path, self.v2 = Path(f"/sys/fs/cgroup/memory/filecord-bench-{os.getpid()}"), False
        self.limit = limit

    def __enter__(self) -> Cgroup:
        self.path.mkdir()
        name = "memory.max" if self.v2 else "memory.limit_in_bytes"
        (self.path / name).write_text(str(self.limit))
        return self

    def join(self) -> None:
        """In the child, before it execs: it and everything it starts are capped."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_killed(self) -> bool:
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        counts = dict(line.split() for line in text.splitlines())
        return int(counts.get("oom_kill", "0")) > 0

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def unlocked() -> list[str]:
    """A prefix that runs a command without CAP_IPC_LOCK, as any non-root user runs it.

    The runtime's file loader mlocks every segment it loads, ignoring a refusal: as root
    (CAP_IPC_LOCK) that pins the whole .ptd in RAM, so a 16 GiB program needs 16 GiB of
    unevictable memory; a user without the capability gets a refusal past RLIMIT_MEMLOCK and
    pages that the kernel may drop and read again."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return []
    return [setpriv, "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock"]


def run_child(args: list[str], cap: int, timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    prefix = unlocked() if args[0] == "runtime" else []
    with Cgroup(cap) as cg:
        proc = subprocess.run([*prefix, sys.executable, __file__, "--child", *args],
                              capture_output=True,
                              text=True, check=False, timeout=timeout, preexec_fn=cg.join)
        if proc.returncode != 0 and cg.oom_killed():
            return {"error": f"out of memory (killed at the {cap / GiB:.1f} GiB cap after "
                             f"{time.perf_counter() - t0:.0f} s)"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode == 0 and lines:
        out: dict[str, Any] = json.loads(lines[-1])
        return out
    tail = [x for x in proc.stderr.strip().splitlines() if x and not x[0].isspace()]
    return {"error": tail[-1] if tail else f"exit status {proc.returncode}"}


def digests(out: Path) -> dict[str, str]:
    result = {}
    for p in sorted(out.iterdir()):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(16 * MiB):
                h.update(chunk)
        result[p.name] = h.hexdigest()
    return result


@contextlib.contextmanager
def workdir(base: str | None) -> Iterator[Path]:
    root = Path(base or "/var/tmp") / f"filecord-export-bench-{os.getpid()}"
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1G,4G,16G")
    ap.add_argument("--cap", type=parse_size, default=16 * GiB,
                    help="memory cap of each child (lowered to what is available less 3 GiB)")
    ap.add_argument("--dir", help="work directory (default /var/tmp)")
    ap.add_argument("--runtime", action="store_true",
                    help="load each lean output in the ExecuTorch runtime and run a forward")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--flows", default=",".join(FLOWS),
                    help="which flows to run (a row with one flow has no identity check)")
    ap.add_argument("--checkpoint",
                    help="with one size: use this checkpoint (written there if absent) and "
                         "keep it, so two invocations can share one")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        what, ckpt, layers, *rest = args.child
        if what == "row":
            res = child_row(Path(ckpt), int(layers), rest[0], rest[1], Path(rest[2]))
        else:
            res = child_runtime(Path(ckpt), int(layers), Path(rest[0]))
        print(json.dumps(res))
        return

    import importlib.metadata

    import torch

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    backends = args.backends.split(",")
    rows, runtime_rows, caps = [], [], set()
    with workdir(args.dir) as work:
        for size in sizes:
            layers = size // LAYER
            t0 = time.perf_counter()
            kept = Path(args.checkpoint) if args.checkpoint else None
            if kept is not None and kept.exists():
                ckpt = kept
            else:
                ckpt = write_checkpoint(work, size)
                if kept is not None:
                    ckpt = ckpt.rename(kept)
            print(f"{size / GiB:g} GiB checkpoint written in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
            for backend in backends:
                got: dict[str, dict[str, Any]] = {}
                sha: dict[str, dict[str, str]] = {}
                for flow in [f for f in FLOWS if f in args.flows.split(",")]:
                    out = work / f"{backend}-{flow}"
                    out.mkdir()
                    cap = min(args.cap, mem_available() - HEADROOM)
                    caps.add(round(cap / GiB, 1))
                    res = run_child(["row", str(ckpt), str(layers), backend, flow, str(out)],
                                    cap, args.timeout)
                    res["cap"] = cap
                    got[flow] = res
                    print(f"{size / GiB:g} GiB {backend} {flow}: {res}", file=sys.stderr)
                    if "error" not in res:
                        sha[flow] = digests(out)
                    if flow == "lean" and "error" not in res and args.runtime and (
                            backend == "portable" or size + 2 * GiB < cap):
                        rt = run_child(["runtime", str(ckpt), str(layers), str(out)], cap,
                                       args.timeout)
                        print(f"  runtime: {rt}", file=sys.stderr)
                        runtime_rows.append((size, backend, rt, sha.get("lean", {})))
                    shutil.rmtree(out)
                    os.sync()
                rows.append((size, backend, got, sha))
            if kept is None:
                ckpt.unlink()

    def anon(res: dict[str, Any]) -> str:
        return "-" if "error" in res else f"{res['anon'] / MiB:,.0f}"

    def secs(res: dict[str, Any], key: str) -> str:
        return "-" if "error" in res else f"{res[key]:.1f}"

    lines = []
    for size, backend, got, sha in rows:
        absent = {"error": "not run in this invocation"}
        et, lean = got.get("executorch", absent), got.get("lean", absent)
        if "error" in et or "error" in lean:
            same = "n/a (a flow did not finish)"
        else:
            same = ("yes" if sha["executorch"] == sha["lean"] else
                    f"NO: {sorted(set(sha['executorch'].items()) ^ set(sha['lean'].items()))}")
        ratio = ("-" if "error" in et or "error" in lean or not et["anon"] else
                 f"{lean['anon'] / et['anon']:.3f}x")
        tratio = ("-" if "error" in et or "error" in lean else
                  f"{lean['seconds'] / et['seconds']:.2f}x / "
                  f"{lean['seconds'] / et['durable']:.2f}x")
        lines.append([f"{size / GiB:g}", backend,
                      et.get("error") or f"{anon(et)}",
                      lean.get("error") or f"{anon(lean)}",
                      ratio, f"{secs(et, 'seconds')} ({secs(et, 'durable')})",
                      secs(lean, "seconds"), tratio, same])
    et_version = importlib.metadata.version("executorch")
    print(f"{machine()}; torch {torch.__version__}, executorch {et_version}; work "
          f"directory on the root file system; each row's flows in fresh processes under a "
          f"memory cgroup capped at {', '.join(f'{c:g}' for c in sorted(caps))} GiB\n")
    print(table(["weights GiB", "backend", "ExecuTorch: RssAnon added, MiB",
                 "lean_export + filecord save: RssAnon added, MiB", "lean / ExecuTorch",
                 "ExecuTorch s (+ fsync)", "lean s (durable)", "time lean / ET (/ ET + fsync)",
                 ".pte/.ptd byte-identical"], lines))
    if runtime_rows:
        rt_lines = []
        for size, backend, rt, _sha in runtime_rows:
            if "error" in rt:
                rt_lines.append([f"{size / GiB:g}", backend, rt["error"], "", "", ""])
                continue
            rt_lines.append([f"{size / GiB:g}", backend, f"{rt['seconds']:.1f}",
                             f"{rt['anon'] / MiB:,.0f}",
                             f"{rt['max_abs_diff']:.2e} (max |y| {rt['scale']:.2f})",
                             "yes" if rt["close"] else "NO"])
        print("\nThe lean outputs loaded by the ExecuTorch runtime (`executorch.runtime`), one "
              "forward, against eager PyTorch on the memory-mapped model:\n")
        print(table(["weights GiB", "backend", "load + forward s", "RssAnon added, MiB",
                     "max |runtime - eager|", "allclose (rtol 1e-4)"], rt_lines))


if __name__ == "__main__":
    main()
