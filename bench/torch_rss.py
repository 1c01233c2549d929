"""Peak host memory above the tensors' own, writing a state dict: filecord vs the peers.

Each writer runs in its own subprocess on the same synthetic state dict (float32 tensors of
64 MiB): the child builds the tensors, resets the kernel's peak-RSS mark, notes its RSS, runs
the save, and reports peak minus that baseline. Side by side in one run:

* filecord ``save_state_dict`` (streams tensors into a scratch file, moves it into the .ptd),
* ``safetensors.torch.save_file``,
* ExecuTorch's ``NamedDataStore`` path (``add_named_data`` of each tensor, which materializes
  ``tobytes()``, then its ``.ptd`` serializer and ``Cord.write_to_file``).

Usage: python bench/torch_rss.py [--size 2GiB] [--dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _bench import parse_size  # one size parser for every bench script

CHILD = r"""
import json, os, sys, time
import torch
sys.path.insert(0, os.path.join(sys.argv[4], "src"))
from filecord._measure import rss_now, rss_peak, rss_reset
case, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = max(1, size // (64 << 20))
sd = {f"layer{i}.weight": torch.full((16 << 20,), float(i)) for i in range(n)}
if case == "executorch":
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer
    from executorch.exir._serialize.data_serializer import DataPayload
rss_reset()
base = rss_now()
t0 = time.perf_counter()
if case == "filecord":
    from filecord.torch import save_state_dict
    save_state_dict(out, sd, consume=True)
elif case == "safetensors":
    from safetensors.torch import save_file
    save_file(sd, out)
elif case == "executorch":
    store = NamedDataStore()
    for k, t in sd.items():
        store.add_named_data(k, t, external_tag="w")
    o = store.get_named_data_store_output()
    cord = FlatTensorSerializer().serialize(DataPayload(o.buffers, o.external_data["w"]))
    with open(out, "wb") as f:
        cord.write_to_file(f)
seconds = time.perf_counter() - t0
print(json.dumps({"case": case, "extra": rss_peak() - base, "seconds": seconds,
                  "bytes": os.path.getsize(out), "data": n * (64 << 20)}))
"""

CASES = ("filecord", "safetensors", "executorch")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=2 << 30)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="filecord-bench-rss-", dir=args.dir)
    results = []
    try:
        for case in CASES:
            out = os.path.join(work, f"{case}.out")
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, case, str(args.size), out, root],
                capture_output=True, text=True, check=False,
            )
            line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            if proc.returncode != 0 or not line:
                results.append({"case": case, "error": proc.stderr.strip().splitlines()[-1:]})
            else:
                results.append(json.loads(line[-1]))
            if os.path.exists(out):
                os.unlink(out)
            time.sleep(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = [r for r in results if "extra" in r]
    data = ok[0]["data"] if ok else args.size
    print(f"state dict: {data / 2**30:.2f} GiB of float32 tensors, one process per writer\n")
    print("| writer | peak RSS above the tensors | x data | time | time vs filecord |")
    print("|---|---|---|---|---|")
    ref = next((r for r in ok if r["case"] == "filecord"), None)
    for r in results:
        if "error" in r:
            print(f"| {r['case']} | failed: {r['error']} | | | |")
            continue
        vs = f"{r['seconds'] / ref['seconds']:.2f}x" if ref else "-"
        print(f"| {r['case']} | {r['extra'] / 2**20:.1f} MiB | {r['extra'] / data:.3f} | "
              f"{r['seconds']:.2f} s | {vs} |")
    if ref is not None:
        verdict = "met" if ref["extra"] <= 64 << 20 else "MISSED"
        print(f"\nfilecord: +{ref['extra'] / 2**20:.1f} MiB above the tensors (target <= 64 MiB: "
              f"{verdict}); one run per writer, so the times are indicative only")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
