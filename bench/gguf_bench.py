"""GGUF: converting a safetensors checkpoint, filecord against gguf-py 0.19, side by side.

* ``filecord convert`` (copy, and ``consume=True``): pass-through F32 tensors, atomic, fsynced;
* gguf-py's ``GGUFWriter`` fed the same tensors in the same order, read the way a conversion
  script holds them (``safe_open(..., "np").get_tensor``: every tensor kept until the write),
  in its default mode and with ``use_temp_file=True`` (``$TMPDIR`` in the work directory).

Time, peak RSS above the start, peak allocated disk in the work directory (``st_blocks``,
sampled every 5 ms) as a multiple of the data.  Each case runs in its own process on a fresh
copy of the checkpoint.  gguf-py never fsyncs: its times are page-cache times.
Usage: python bench/gguf_bench.py [--size 1GiB] [--dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.path.join(sys.argv[3], "src"))
from filecord._measure import rss_now, rss_peak, rss_reset
case, work = sys.argv[1], sys.argv[2]
src, out = os.path.join(work, "model.safetensors"), os.path.join(work, "model.gguf")
data = os.path.getsize(src)
def alloc():
    t = 0
    for root, _d, files in os.walk(work):
        for f in files:
            try: t += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError: pass
    return t
peak_disk = [alloc()]
stop = threading.Event()
def watch():
    while not stop.is_set():
        peak_disk[0] = max(peak_disk[0], alloc()); time.sleep(0.005)
th = threading.Thread(target=watch, daemon=True); th.start()
rss_reset(); base = rss_now(); t0 = time.perf_counter()
if case.startswith("filecord"):
    from filecord.gguf import convert
    convert(src, out, arch="llama", consume=case.endswith("consume"))
else:
    os.environ["TMPDIR"] = work
    import gguf
    from safetensors import safe_open
    w = gguf.GGUFWriter(out, "llama", use_temp_file=case.endswith("temp file"))
    with safe_open(src, "np") as f:
        for name in sorted(f.keys()):
            w.add_tensor(name, f.get_tensor(name))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
seconds = time.perf_counter() - t0
stop.set(); th.join()
print(json.dumps({"case": case, "seconds": seconds, "rss": rss_peak() - base,
                  "disk": peak_disk[0], "data": data}))
"""

SETUP = r"""
import os, sys
import numpy as np, torch
from safetensors.torch import save_file
size, where = int(sys.argv[1]), sys.argv[2]
n = max(4, size // (64 << 20)); per = size // n // 4
save_file({f"blk.{i}.weight": torch.full((per // 64, 64), float(i)) for i in range(n)},
          os.path.join(where, "model.safetensors"))
"""

CASES = ["filecord convert copy", "filecord convert consume", "gguf-py default",
         "gguf-py temp file"]


def parse_size(text: str) -> int:
    units = {"gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "": 1}
    t = text.lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(num) * units[t[len(num):]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = []
    for case in CASES:
        work = tempfile.mkdtemp(prefix="filecord-bench-gguf-", dir=args.dir)
        try:
            subprocess.run([sys.executable, "-c", SETUP, str(args.size), work], check=True)
            proc = subprocess.run([sys.executable, "-c", CHILD, case, work, root],
                                  capture_output=True, text=True, check=False)
            line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            results.append(json.loads(line[-1]) if proc.returncode == 0 and line else
                           {"case": case, "error": proc.stderr.strip().splitlines()[-1:]})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    data = next((r["data"] for r in results if "data" in r), args.size)
    print(f"data: {data / 2**30:.2f} GiB safetensors checkpoint (float32); one process per "
          f"case\n")
    print("| case | time | vs gguf-py default | peak RSS | peak disk / data |")
    print("|---|---|---|---|---|")
    base = next((r for r in results if r["case"] == "gguf-py default" and "seconds" in r), {})
    for r in results:
        if "error" in r:
            print(f"| {r['case']} | failed: {r['error']} | | | |")
            continue
        vs = f"{r['seconds'] / base['seconds']:.2f}x" if "seconds" in base else "-"
        print(f"| {r['case']} | {r['seconds']:.2f} s | {vs} | {r['rss'] / 2**20:.0f} MiB | "
              f"{r['disk'] / data:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
