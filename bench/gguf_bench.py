"""GGUF: converting a safetensors checkpoint, filecord against gguf-py 0.19, side by side.

* ``filecord convert`` (copy, and ``consume=True``): pass-through F32 tensors, atomic, fsynced;
* gguf-py's ``GGUFWriter`` fed the same tensors in the same order, read the way a conversion
  script holds them (``safe_open(..., "np").get_tensor``: every tensor kept until the write),
  in its default mode and with ``use_temp_file=True`` (``$TMPDIR`` in the work directory).

Time, peak RSS above the start, peak allocated disk in the work directory (``st_blocks``,
sampled every 5 ms) as a multiple of the data.  Each case runs in its own process on a fresh
copy of the checkpoint, ``--rounds`` times, rotated.  gguf-py never fsyncs: each of its runs
is timed as it returns and again once an fsync of its output and directory has returned (the
durable column; filecord's conversions are durable when they return).
Usage: python bench/gguf_bench.py [--size 1GiB] [--rounds 3] [--dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from _bench import child, data_size, machine, parse_size, print_rounds, record, rotations, rounds

CHILD = r"""
import json, os, sys
from _bench import measured
case, work = sys.argv[1], sys.argv[2]
src, out = os.path.join(work, "model.safetensors"), os.path.join(work, "model.gguf")
def job():
    if case.startswith("filecord"):
        # the pass-through of every tensor (dims reversed, bytes unchanged) that this bench
        # measured as ``convert`` before convert took Hugging Face models (bench/hf_gguf.py)
        from filecord import save
        from filecord.gguf import GGUFTensor, KeyValue, ValueType, build_gguf
        from filecord.safetensors import read_safetensors
        consume = case.endswith("consume")
        f = read_safetensors(src, owned=consume)
        ts = [GGUFTensor.from_named(t) for _, t in sorted(f.tensors.items())]
        save(out, build_gguf([KeyValue("general.architecture", ValueType.STRING, "llama")],
                             ts), consume=consume)
        f.whole.detach_cleanup()
        return
    os.environ["TMPDIR"] = work
    import gguf
    from safetensors import safe_open
    w = gguf.GGUFWriter(out, "llama", use_temp_file=case.endswith("temp file"))
    with safe_open(src, "np") as f:
        for name in sorted(f.keys()):
            w.add_tensor(name, f.get_tensor(name))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
data = os.path.getsize(src)
res = measured(job, durable=case.startswith("filecord"), written=[out], disk_of=work)
print(json.dumps({"case": case, "data": data, **res}))
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
REFERENCE = {"filecord convert copy": "gguf-py default",
             "filecord convert consume": "gguf-py default",
             "gguf-py temp file": "gguf-py default"}
WHY = {
    "filecord convert copy": "copy_file_range of every tensor into a temp, one data fsync, "
    "plus the lock and the rename (atomic); gguf-py + fsync writes from memory it has loaded",
    "filecord convert consume": "on ext4 (no reflink) a move copies one sync window, fsyncs "
    "it, then cuts it off the source, window by window (see the fsyncs column), "
    "so the data is on disk once plus one window; a larger window where the disk has room "
    "(`--window`) trades that peak for fewer fsyncs, a reflink file system clones "
    "instead, and with space to spare the copying convert is the fast path",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CASES}
    for r, case in rotations(CASES, args.rounds):
        work = tempfile.mkdtemp(prefix="filecord-bench-gguf-", dir=args.dir)
        try:
            subprocess.run([sys.executable, "-c", SETUP, str(args.size), work], check=True)
            res = child(CHILD, case, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record(results, r, case, res)
    data = data_size(results, args.size)
    print_rounds(f"data: {data / 2**30:.2f} GiB safetensors checkpoint (float32); {machine()}; "
                 f"one process per case on a fresh copy; {rounds(args.rounds)}, median "
                 "(min-max)", CASES, results, REFERENCE, WHY, data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
