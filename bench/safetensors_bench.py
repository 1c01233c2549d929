"""safetensors: filecord against the packages, side by side in one run.

* ``save_file``: ``filecord.safetensors.save_file`` (fsynced, atomic) against
  ``safetensors.torch.save_file`` alone and followed by an fsync of the file and directory:
  time and peak RSS above the tensors.
* merge of a sharded checkpoint into one file: ``filecord.safetensors.merge`` (copy, and
  ``consume=True``) against loading every shard with ``safetensors.torch.load_file`` and
  saving with ``save_file``: time, peak RSS, peak allocated disk in the directory (st_blocks,
  sampled every 5 ms), as a multiple of the data.
* reshard of one file into shards: ``filecord.safetensors.reshard`` (consume) against
  ``load_file`` + ``huggingface_hub.save_torch_state_dict``.

Each case runs in its own process on a fresh copy of the inputs.
Usage: python bench/safetensors_bench.py [--size 1GiB] [--dir DIR] [--json OUT]
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
sys.path.insert(0, os.path.join(sys.argv[4], "src"))
import torch
from filecord._measure import rss_now, rss_peak, rss_reset
case, size, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = max(4, size // (64 << 20))
per = size // n // 4
def alloc():
    t = 0
    for root, _d, files in os.walk(work):
        for f in files:
            try: t += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError: pass
    return t
sd = None
if case.startswith("save_file"):
    sd = {f"layer{i}.weight": torch.full((per,), float(i)) for i in range(n)}
base_disk = alloc()
peak_disk = [base_disk]
stop = threading.Event()
def watch():
    while not stop.is_set():
        peak_disk[0] = max(peak_disk[0], alloc()); time.sleep(0.005)
th = threading.Thread(target=watch, daemon=True); th.start()
rss_reset(); base = rss_now(); t0 = time.perf_counter()
out = os.path.join(work, "out.safetensors")
shards = sorted(os.path.join(work, "in", f) for f in os.listdir(os.path.join(work, "in"))
                if f.endswith(".safetensors")) if os.path.isdir(os.path.join(work, "in")) else []
index = os.path.join(work, "in", "model.safetensors.index.json")
if case == "save_file filecord":
    from filecord.safetensors import save_file; save_file(sd, out)
elif case == "save_file safetensors":
    from safetensors.torch import save_file; save_file(sd, out)
elif case == "save_file safetensors+fsync":
    from safetensors.torch import save_file; save_file(sd, out)
    fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
    fd = os.open(work, os.O_RDONLY); os.fsync(fd); os.close(fd)
elif case == "merge filecord copy":
    from filecord.safetensors import merge; merge([index], out)
elif case == "merge filecord consume":
    from filecord.safetensors import merge; merge([index], out, consume=True)
elif case == "merge packages":
    from safetensors.torch import load_file, save_file
    sd = {}
    for s in shards: sd.update(load_file(s))
    save_file(sd, out)
elif case == "reshard filecord consume":
    from filecord.safetensors import reshard
    os.mkdir(os.path.join(work, "o")); reshard([shards[0]], os.path.join(work, "o"),
                                               max_shard_size=size // 4, consume=True)
elif case == "reshard packages":
    from safetensors.torch import load_file
    from huggingface_hub import save_torch_state_dict
    os.mkdir(os.path.join(work, "o"))
    save_torch_state_dict(load_file(shards[0]), os.path.join(work, "o"), max_shard_size=size // 4)
seconds = time.perf_counter() - t0
stop.set(); th.join()
print(json.dumps({"case": case, "seconds": seconds, "rss": rss_peak() - base,
                  "disk": peak_disk[0], "data": n * per * 4}))
"""

SETUP = r"""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[3], "src"))
import torch
from filecord.safetensors import save_sharded, save_file
size, where = int(sys.argv[1]), sys.argv[2]
n = max(4, size // (64 << 20)); per = size // n // 4
sd = {f"layer{i}.weight": torch.full((per,), float(i)) for i in range(n)}
os.makedirs(where)
if sys.argv[4] == "sharded":
    save_sharded(sd, where, max_shard_size=size // 3)
else:
    save_file(sd, os.path.join(where, "model.safetensors"))
"""

CASES = [
    ("save_file filecord", None), ("save_file safetensors", None),
    ("save_file safetensors+fsync", None),
    ("merge filecord copy", "sharded"), ("merge filecord consume", "sharded"),
    ("merge packages", "sharded"),
    ("reshard filecord consume", "single"), ("reshard packages", "single"),
]


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
    for case, setup in CASES:
        work = tempfile.mkdtemp(prefix="filecord-bench-st-", dir=args.dir)
        try:
            if setup:
                subprocess.run([sys.executable, "-c", SETUP, str(args.size),
                                os.path.join(work, "in"), root, setup], check=True)
            proc = subprocess.run([sys.executable, "-c", CHILD, case, str(args.size), work, root],
                                  capture_output=True, text=True, check=False)
            line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            results.append(json.loads(line[-1]) if proc.returncode == 0 and line else
                           {"case": case, "error": proc.stderr.strip().splitlines()[-1:]})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    data = next((r["data"] for r in results if "data" in r), args.size)
    print(f"data: {data / 2**30:.2f} GiB of float32 tensors; one process per case\n")
    print("| case | time | vs the package | peak RSS above the inputs | peak disk / data |")
    print("|---|---|---|---|---|")
    ref = {"save_file": "save_file safetensors", "merge": "merge packages",
           "reshard": "reshard packages"}
    by = {r["case"]: r for r in results}
    for r in results:
        if "error" in r:
            print(f"| {r['case']} | failed: {r['error']} | | | |")
            continue
        base = by.get(ref[r["case"].split()[0]], {})
        vs = f"{r['seconds'] / base['seconds']:.2f}x" if "seconds" in base else "-"
        print(f"| {r['case']} | {r['seconds']:.2f} s | {vs} | {r['rss'] / 2**20:.0f} MiB | "
              f"{r['disk'] / data:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
