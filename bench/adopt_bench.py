"""Issue 26 item 1: a blob behind a header saved to a ``.ptd`` with ``consume=True`` on ext4.

For each size a fresh sparse ext4 image is loop-mounted (removed afterwards); a blob of that
size is written and fsynced, then packed as the one entry of a ``.ptd`` (4096 alignment, as
``filecord pack --align 4096``) with ``consume=True``: adopted in place (the default), and, at
the sizes given to ``--contrast``, with adoption off (``in_place=False``: the move of
every other file system).  Reported: the save's time, ``bytes_copied``/``bytes_moved``, the
blob's physical extents before and after (``filefrag -v``: the same physical blocks, shifted
by the header) and the output's allocated bytes over the blob's.

With ``--runtime SIZES`` it also runs the whole path per size, on a fresh image each, in two
child processes (each one's peak RSS its own).  The first writes the blob (seeded float32 rows),
makes it the weight of an ``nn.Embedding`` (``torch.from_file(..., shared=True)``: file pages,
not anonymous memory) and exports that with ``executorch`` (non-strict ``torch.export``,
``to_edge``, ``to_executorch`` with the weight an external constant tagged ``weights`` and
segments on 4 KiB); the emitter hands the weight back as ``bytes`` (it copies every constant),
which are checked equal to the blob and then replaced in the manager's ``weights`` cord by
ExecuTorch's own ``FileBackedData.move_from(blob)`` (the hand-over ExecuTorch's backends use for
data they keep in files); the same process (``from_manager`` needs the live manager) saves with
``filecord.executorch.save(..., consume=True)``, which adopts the blob in place.  The second
loads the ``.pte`` with the ``.ptd`` as its data file in the ExecuTorch runtime and looks up six
rows, compared byte for byte with PyTorch's output for the same indices; it runs twice: as
root, and as an unprivileged user would (no ``CAP_IPC_LOCK``, a 64 KiB ``RLIMIT_MEMLOCK``), since
the runtime ``mlock``s every segment it maps where it may.

    python bench/adopt_bench.py [--sizes 1G,16G] [--contrast 1G] [--runtime 64M,1G,16G] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench import GiB, MiB, fskit, machine, parse_size, rss_now, rss_peak, rss_reset

import filecord
from filecord import FileBackedData
from filecord.executorch.ptd import build_ptd
from filecord.executorch.values import PtdEntry

CHUNK = 64 * MiB
DIM = 256  # float32 per embedding row: 1 KiB rows
TAG = "weights"


physical = fskit.physical_extents


def covers(extents: list[tuple[int, int, int]], logical: int, phys: int, n: int) -> bool:
    """Whether blocks ``[logical, logical + n)`` of the file map to ``[phys, phys + n)``
    (an extent after may be merged with a neighbour: compare block by block, by range)."""
    for lo, ph, m in extents:
        if lo <= logical < lo + m:
            k = min(n, lo + m - logical)
            if ph + (logical - lo) != phys:
                return False
            if k == n:
                return True
            return covers(extents, logical + k, phys + k, n - k)
    return False


def write_blob(path: Path, size: int) -> None:
    chunk = os.urandom(CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < size:
            n = min(CHUNK, size - done)
            os.pwrite(fd, chunk[:n], done)
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)


def one(size: int, *, adopt: bool) -> dict[str, Any]:
    with fskit.mounted("ext4", size + size // 8 + 512 * MiB) as point:
        blob = point / "weights.bin"
        write_blob(blob, size)
        before = physical(blob)
        cord = build_ptd({"weights": PtdEntry("weights", FileBackedData(str(blob), owned=True),
                                              None, 4096)}, segment_alignment=4096)
        out = point / "model.ptd"
        start = time.perf_counter()
        report = filecord.save(str(out), cord, consume=True, in_place=adopt)
        seconds = time.perf_counter() - start
        act = next(a for a in report.actions if a.source is not None)
        shift = act.out_offset // 4096
        after = physical(out)
        same = all(covers(after, lo + shift, ph, n) for lo, ph, n in before)
        return {
            "size": size, "adopt": adopt, "action": act.action, "offset": act.out_offset,
            "seconds": seconds, "bytes_copied": report.bytes_copied,
            "bytes_moved": report.bytes_moved, "fsyncs": report.fsyncs,
            "extents_before": len(before), "extents_after": len(after),
            "blob_blocks_unchanged": same,
            "allocated_over_blob": os.stat(out).st_blocks * 512 / size,
            "first_extent_before": before[0] if before else None,
            "first_extent_after": after[0] if after else None,
        }


def _anon() -> int:
    """Anonymous resident bytes of this process now (``RssAnon``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def indices(rows: int) -> list[int]:
    """The rows the program looks up: first, last and a few in between (few pages touched)."""
    return sorted({0, 1, rows // 3, rows // 2, rows - 2, rows - 1})


def write_weights(path: Path, rows: int) -> None:
    """Seeded uniform float32 rows (no NaN, so PyTorch and the runtime compare as values too)."""
    import torch

    gen = torch.Generator().manual_seed(26)
    step = CHUNK // (4 * DIM)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for start in range(0, rows, step):
            n = min(step, rows - start)
            os.pwrite(fd, torch.rand(n, DIM, generator=gen).numpy().tobytes(),
                      start * DIM * 4)
        os.fsync(fd)
    finally:
        os.close(fd)


def same_bytes(data: bytes, path: Path) -> bool:
    """Whether ``path`` holds exactly ``data`` (read 64 MiB at a time, no second copy)."""
    view = memoryview(data)
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != len(data):
            return False
        for start in range(0, len(data), CHUNK):
            if f.read(CHUNK) != view[start:start + CHUNK]:
                return False
    return True


def phase_save(work: Path, size: int) -> dict[str, Any]:
    """Write the blob, export the program over it, save with ``consume=True`` (this process)."""
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir._serialize._cord import FileBackedData as EtFileBackedData
    from torch.export import export

    import filecord.executorch as fe

    rows = size // (4 * DIM)
    blob = work / "weights.bin"
    write_weights(blob, rows)
    weight = torch.from_file(str(blob), shared=True, size=rows * DIM,
                             dtype=torch.float32).view(rows, DIM)

    class Lookup(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(rows, DIM, _weight=weight, _freeze=True)

        def forward(self, x: Any) -> Any:
            return self.emb(x)

    module = Lookup().eval()
    assert module.emb.weight.data_ptr() == weight.data_ptr()  # the file's pages, no copy
    x = torch.tensor(indices(rows))
    expected = module(x).numpy().tobytes()
    rss_reset()
    start = time.perf_counter()
    # Non-strict export (torch's default): strict tracing allocated ~4x the weight
    # transiently in a trial at 256 MiB; non-strict none.
    manager = to_edge(export(module, (x,))).to_executorch(
        ExecutorchBackendConfig(external_constants=lambda node: TAG, segment_alignment=4096))
    export_s = time.perf_counter() - start
    export_peak, export_anon = rss_peak(), _anon()
    cord = manager._tensor_data[TAG]
    at = next(i for i, b in enumerate(cord._buffers) if len(b) == size)
    emitted_equal = same_bytes(cord._buffers[at], blob)
    cord._buffers[at] = EtFileBackedData.move_from(str(blob))
    owned = Path(cord._buffers[at]._path)
    gc.collect()
    before = physical(owned)
    out = work / "model.pte"
    rss_reset()
    base = rss_now()
    start = time.perf_counter()
    report = fe.save(out, manager, consume=True)
    save_s = time.perf_counter() - start
    save_peak = rss_peak()
    ptd = work / f"{TAG}.ptd"
    act = next(a for a in report.actions if a.source == str(owned))
    shift = act.out_offset // 4096
    after = physical(ptd)
    return {
        "size": size, "rows": rows, "indices": indices(rows), "expected": expected.hex(),
        "export_s": export_s, "export_peak_rss": export_peak, "export_anon": export_anon,
        "emitted_equal": emitted_equal, "save_s": save_s, "save_peak_rss": save_peak,
        "save_rss_at_start": base, "action": act.action, "offset": act.out_offset,
        "bytes_copied": report.bytes_copied, "bytes_moved": report.bytes_moved,
        "fsyncs": report.fsyncs, "extents_before": len(before), "extents_after": len(after),
        "blob_blocks_unchanged": act.out_offset % 4096 == 0 and bool(before) and all(
            covers(after, lo + shift, ph, n) for lo, ph, n in before),
        "source_gone": not owned.exists() and not blob.exists(),
        "ptd_size": os.stat(ptd).st_size, "pte": out.name, "ptd": ptd.name,
    }


def phase_run(work: Path, pte: str, ptd: str, rows: int) -> dict[str, Any]:
    """Load the saved program with its ``.ptd`` in the ExecuTorch runtime and run it."""
    import torch
    from executorch.runtime import Runtime

    rss_reset()
    start = time.perf_counter()
    program = Runtime.get().load_program(work / pte, data_path=str(work / ptd))
    method = program.load_method("forward")
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    out = method.execute([torch.tensor(indices(rows))])[0]
    run_s = time.perf_counter() - start
    return {"load_s": load_s, "run_s": run_s, "output": out.numpy().tobytes().hex(),
            "peak_rss": rss_peak(), "anon": _anon(), "cap_ipc_lock": _can_lock(),
            "memlock_limit": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]}


def _can_lock() -> bool:
    """Whether this process may ``mlock`` without limit (``CAP_IPC_LOCK`` in effect)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 14 & 1)
    return False


def child(*args: str, lock: bool = True) -> dict[str, Any]:
    """Run one phase in a fresh interpreter; its last stdout line is the JSON result.

    ``lock=False`` runs it as an unprivileged user would: without ``CAP_IPC_LOCK`` (dropped
    with ``setpriv``) and with a 64 KiB ``RLIMIT_MEMLOCK``, so the runtime's ``mlock`` of a
    mapped segment fails (it carries on with the plain mapping)."""
    command = [sys.executable, __file__, "--phase", *args]
    limit = None
    if not lock:
        if shutil.which("setpriv") is None:
            raise RuntimeError("setpriv (util-linux) is needed to drop CAP_IPC_LOCK")
        command = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", *command]

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))

    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          preexec_fn=limit)
    if done.returncode != 0:
        raise RuntimeError(f"phase {args[0]} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def runtime_row(size: int) -> dict[str, Any]:
    with fskit.mounted("ext4", size + size // 8 + 512 * MiB) as point:
        saved = child("save", str(point), str(size))
        run = ("run", str(point), saved["pte"], saved["ptd"], str(saved["rows"]))
        for lock in (True, False):
            ran = child(*run, lock=lock)
            ran["output_matches"] = ran.pop("output") == saved["expected"]
            saved["runtime" if lock else "runtime_no_mlock"] = ran
        return saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1G,16G")
    ap.add_argument("--contrast", default="1G", help="sizes also saved with adoption off")
    ap.add_argument("--runtime", default="",
                    help="sizes also exported, saved and run by the ExecuTorch runtime")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # one step, in a child
    args = ap.parse_args()
    if args.phase:
        kind, work, *rest = args.phase
        if kind == "save":
            result = phase_save(Path(work), int(rest[0]))
        else:
            result = phase_run(Path(work), rest[0], rest[1], int(rest[2]))
        print(json.dumps(result))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    contrast = {parse_size(s) for s in args.contrast.split(",") if s}
    rows = []
    for size in sizes:
        rows.append(one(size, adopt=True))
        if size in contrast:
            rows.append(one(size, adopt=False))
    runs = [runtime_row(parse_size(s)) for s in args.runtime.split(",") if s]
    if args.json:
        print(json.dumps({"adopt": rows, "runtime": runs}, indent=2))
        return 0
    print(f"{machine()}; ext4 on a sparse loop-mounted image, blob written and fsynced first\n")
    print("| blob | save | piece | time s | bytes_copied | bytes_moved | fsyncs | extents "
          "before / after | blob's blocks unchanged | allocated / blob |")
    print("|------|------|-------|--------|--------------|-------------|--------|---------"
          "---------------|-------------------------|------------------|")
    for r in rows:
        print(f"| {r['size'] / GiB:g} GiB | {'adopt (default)' if r['adopt'] else 'move'} "
              f"| {r['action']} at {r['offset']} | {r['seconds']:.3f} | {r['bytes_copied']} | "
              f"{r['bytes_moved']} | {r['fsyncs']} | {r['extents_before']} / "
              f"{r['extents_after']} | {'yes' if r['blob_blocks_unchanged'] else 'no'} | "
              f"{r['allocated_over_blob']:.4f} |")
    if runs:
        print_runs(runs)
    return 0


def print_runs(runs: list[dict[str, Any]]) -> None:
    print("\nThe whole path at each size, each step in its own process; peak RSS is `VmHWM` "
          "(file pages included), anon is `RssAnon` at the step's end\n")
    print("| weights | export s | exporter peak RSS / anon | emitted = blob | save s | RSS at "
          "save's start -> peak | piece | bytes_copied | bytes_moved | blob's blocks unchanged "
          "| source gone |")
    print("|---------|----------|--------------------------|----------------|--------|------"
          "------------------|-------|--------------|-------------|-------------------------"
          "|-------------|")
    for r in runs:
        print(f"| {r['size'] / MiB:g} MiB ({r['rows']} x {DIM} float32) | {r['export_s']:.2f} "
              f"| {r['export_peak_rss'] / MiB:.0f} / {r['export_anon'] / MiB:.0f} MiB | "
              f"{'yes' if r['emitted_equal'] else 'NO'} | {r['save_s']:.3f} | "
              f"{r['save_rss_at_start'] / MiB:.0f} -> {r['save_peak_rss'] / MiB:.0f} MiB | "
              f"{r['action']} at {r['offset']} | {r['bytes_copied']} | {r['bytes_moved']} | "
              f"{'yes' if r['blob_blocks_unchanged'] else 'no'} | "
              f"{'yes' if r['source_gone'] else 'NO'} |")
    print("\n| weights | runtime | mlock allowed | load s | run s | peak RSS / anon | "
          "output = PyTorch's |")
    print("|---------|---------|---------------|--------|-------|-----------------|"
          "--------------------|")
    for r in runs:
        for key, how in (("runtime", "as root"), ("runtime_no_mlock", "no CAP_IPC_LOCK")):
            x = r[key]
            print(f"| {r['size'] / MiB:g} MiB | {how} | "
                  f"{'yes' if x['cap_ipc_lock'] else 'no, limit ' + str(x['memlock_limit'])} | "
                  f"{x['load_s']:.4f} | {x['run_s']:.4f} | {x['peak_rss'] / MiB:.0f} / "
                  f"{x['anon'] / MiB:.0f} MiB | {'yes' if x['output_matches'] else 'NO'} |")

if __name__ == "__main__":
    raise SystemExit(main())
