"""Issue 13: does memory stay flat as the model grows?  Copy and consume of 1, 4 and 16 GiB.

    sudo .venv/bin/python bench/scale.py [--sizes 1G,4G,16G] [--torch-size auto] [--dir /var/tmp]

Per size, a cord of a 4 KiB header and one ``FileBackedData`` of the whole source file is
saved by copy (``consume=False``: the source stays) and then by consume (``consume=True``:
the source's bytes are moved window by window into the output and the source is deleted), each
in a fresh process that resets its peak-RSS mark right before the save.  Then a state dict of
float32 tensors goes through the torch path (``filecord.executorch.save_state_dict``, which
streams the tensors into a scratch file and adopts it), at the largest size this machine's
memory allows next to the page cache: the tensors must be in memory, so ``auto`` takes
``MemAvailable`` minus 6 GiB, rounded down to a GiB, at most the largest cord size.

Peak allocated disk is the sum of ``st_blocks`` of every file in the run's directory (source,
temp, journal, output), sampled through the ``_sys`` seam before every fsync, truncate, rename
and unlink, over the data size.  Every output is checked byte for byte (the cords) or by size
(the state dict) and deleted before the next run, so the disk holds one run at a time (a
16 GiB copy needs 32 GiB at its peak).  Headline: RSS growth from the smallest to the largest
size (target <= 16 MiB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from _bench import GiB, MiB, child, fskit, machine, parse_size, table

GROWTH_TARGET = 16 * MiB
HEADER = 4096
SEED = 13

CORD = r"""
import json, os, sys, time
import fskit
import filecord
from filecord._io import syscalls as _sys
from filecord._io.measure import rss_now, rss_peak, rss_reset
mode, src, dst, work = sys.argv[1:5]
cord = filecord.Cord([b"H" * 4096, filecord.FileBackedData(src, owned=mode == "consume")])
sampler = fskit.Sampler(lambda: fskit.allocated(work))
rss_reset(); base = rss_now(); t0 = time.perf_counter()
with _sys.use(sampler):
    report = filecord.save(dst, cord, consume=mode == "consume")
seconds = time.perf_counter() - t0
rss = rss_peak() - base
sampler.samples.append(("end", fskit.allocated(work)))
print(json.dumps({"seconds": seconds, "rss": rss, "disk": max(v for _o, v in sampler.samples),
                  "actions": sorted({a.action for a in report.file_actions()})}))
"""

TORCH = r"""
import json, os, sys, time
import torch
import fskit
from filecord._io import syscalls as _sys
from filecord._io.measure import rss_now, rss_peak, rss_reset
from filecord.executorch import save_state_dict
size, dst, work = int(sys.argv[1]), sys.argv[2], sys.argv[3]
per = 256 << 20
sd = {f"layer{i}.weight": torch.full((min(per, size - i * per) // 4,), float(i))
      for i in range(-(-size // per))}
sampler = fskit.Sampler(lambda: fskit.allocated(work))
rss_reset(); base = rss_now(); t0 = time.perf_counter()
with _sys.use(sampler):
    report = save_state_dict(dst, sd, consume=True)
seconds = time.perf_counter() - t0
rss = rss_peak() - base
sampler.samples.append(("end", fskit.allocated(work)))
print(json.dumps({"seconds": seconds, "rss": rss, "disk": max(v for _o, v in sampler.samples),
                  "bytes": os.path.getsize(dst),
                  "actions": sorted({a.action for a in report.file_actions()})}))
"""


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def cord_runs(work: Path, size: int) -> list[dict[str, object]]:
    """Copy then consume of one ``size`` source; each output checked, then deleted."""
    src, dst = work / "source.bin", work / "model.bin"
    fskit.write_pattern(src, size, seed=SEED)
    out = []
    for mode in ("copy", "consume"):
        os.sync()
        res = child(CORD, mode, src, dst, work)
        if "error" in res:
            raise SystemExit(f"{mode} of {size} bytes: {res['error']}")
        bad = fskit.mismatch(dst, HEADER, size, seed=SEED)
        if bad is not None:
            raise SystemExit(f"{mode}: {bad}")
        if (mode == "consume") == src.exists():
            raise SystemExit(f"{mode}: the source is {'still there' if src.exists() else 'gone'}")
        dst.unlink()
        out.append({"what": f"cord, {mode}", "size": size, **res})
        print(f"{size / GiB:g} GiB {mode}: {res['seconds']:.2f} s, +{res['rss'] / MiB:.1f} MiB",
              file=sys.stderr)
    return out


def torch_run(work: Path, size: int) -> dict[str, object]:
    dst = work / "model.ptd"
    os.sync()
    res = child(TORCH, size, dst, work)
    if "error" in res:
        raise SystemExit(f"state dict of {size} bytes: {res['error']}")
    if res["bytes"] < size:
        raise SystemExit(f"state dict: wrote {res['bytes']} bytes for {size} of tensors")
    dst.unlink()
    print(f"{size / GiB:g} GiB state dict: {res['seconds']:.2f} s", file=sys.stderr)
    return {"what": "state dict (torch), consume", "size": size, **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1G,4G,16G", help="comma-separated cord sizes")
    ap.add_argument("--torch-size", default="auto", help="state dict size, auto or 0 to skip")
    ap.add_argument("--dir", default="/var/tmp", help="where the files go (a fresh subdirectory)")
    args = ap.parse_args()
    sizes = sorted(parse_size(s) for s in args.sizes.split(","))
    avail = mem_available()
    if args.torch_size == "auto":
        tsize = min(max(0, avail - 6 * GiB) // GiB * GiB, sizes[-1])
    else:
        tsize = parse_size(args.torch_size)
    need = 2 * sizes[-1] + 2 * GiB
    free = shutil.disk_usage(args.dir).free
    if free < need:
        raise SystemExit(f"{args.dir}: {free / GiB:.1f} GiB free, a {sizes[-1] / GiB:g} GiB "
                         f"copy needs {need / GiB:.0f} GiB")
    work = Path(args.dir) / f"filecord-scale-{os.getpid()}"
    work.mkdir()
    rows: list[dict[str, object]] = []
    try:
        for size in sizes:
            rows += cord_runs(work, size)
        if tsize:
            rows.append(torch_run(work, tsize))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = fskit.fs_type(args.dir)
    print(f"\nsizes {', '.join(f'{s / GiB:g} GiB' for s in sizes)}; {machine()}; {where} "
          f"(directory {args.dir}); one run per size and mode, each in a fresh process\n")
    print(table(["what", "size", "action", "seconds", "GiB/s", "peak RSS above baseline, MiB",
                 "peak allocated disk / data"],
                [[r["what"], f"{r['size'] / GiB:g} GiB", ", ".join(r["actions"]),  # type: ignore[arg-type]
                  f"{r['seconds']:.2f}", f"{r['size'] / GiB / r['seconds']:.2f}",  # type: ignore[operator]
                  f"{r['rss'] / MiB:.1f}", f"{r['disk'] / r['size']:.3f}x"]  # type: ignore[operator]
                 for r in rows]))
    for mode in ("copy", "consume"):
        by = {r["size"]: r["rss"] for r in rows if r["what"] == f"cord, {mode}"}
        growth = by[sizes[-1]] - by[sizes[0]]  # type: ignore[operator]
        verdict = "met" if growth <= GROWTH_TARGET else "MISSED"
        print(f"\n{mode}: RSS growth from {sizes[0] / GiB:g} to {sizes[-1] / GiB:g} GiB: "
              f"{growth / MiB:+.1f} MiB (target <= {GROWTH_TARGET // MiB} MiB: {verdict})")
    print(f"\nstate dict: {tsize / GiB:g} GiB (MemAvailable {avail / GiB:.1f} GiB at the start; "
          "the tensors must fit in memory with 6 GiB left for the page cache and the "
          "interpreter)" if tsize else "\nstate dict: skipped")


if __name__ == "__main__":
    main()
