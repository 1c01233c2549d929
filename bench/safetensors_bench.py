"""safetensors: filecord against the packages, side by side in one run.

* ``save_file``: ``filecord.safetensors.save_file`` (fsynced, atomic) against
  ``safetensors.torch.save_file``: time and peak RSS above the tensors.
* merge of a sharded checkpoint into one file: ``filecord.safetensors.merge`` (copy, and
  ``consume=True``) against loading every shard with ``safetensors.torch.load_file`` and
  saving with ``save_file``: time, peak RSS, peak allocated disk in the directory (st_blocks,
  sampled every 5 ms), as a multiple of the data.
* reshard of one file into shards: ``filecord.safetensors.reshard`` (consume) against
  ``load_file`` + ``huggingface_hub.save_torch_state_dict``.
* the consuming merge and reshard again with ``transfer.WRITE_BEHIND = 0`` (", write-behind
  off": each window's writeback starts at its fsync, as before issue 26), for before/after in
  one run.

The packages never fsync: each of their runs is timed as it returns and again once an fsync
of every file it wrote and of their directories has returned (the durable column; filecord's
saves are durable when they return).  Each case runs in its own process on a fresh copy of
the inputs, ``--rounds`` times, rotated.
Usage: python bench/safetensors_bench.py [--size 1GiB] [--rounds 3] [--dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from _bench import (
    ROOT,
    child,
    data_size,
    machine,
    parse_size,
    print_rounds,
    record,
    rotations,
    rounds,
)

CHILD = r"""
import json, os, sys
import torch
from _bench import measured
case, size, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if case.endswith(WB_OFF):  # the mover before issue 26: one copy per window, no write-behind
    from filecord._txn import transfer
    transfer.WRITE_BEHIND = 0
    case = case[: -len(WB_OFF)]
n = max(4, size // (64 << 20))
per = size // n // 4
sd = None
if case.startswith("save_file"):
    sd = {f"layer{i}.weight": torch.full((per,), float(i)) for i in range(n)}
out = os.path.join(work, "out.safetensors")
shards = sorted(os.path.join(work, "in", f) for f in os.listdir(os.path.join(work, "in"))
                if f.endswith(".safetensors")) if os.path.isdir(os.path.join(work, "in")) else []
index = os.path.join(work, "in", "model.safetensors.index.json")
o = os.path.join(work, "o")
def job():
    if case == "save_file filecord":
        from filecord.safetensors import save_file; save_file(sd, out)
    elif case == "save_file safetensors":
        from safetensors.torch import save_file; save_file(sd, out)
    elif case == "merge filecord copy":
        from filecord.safetensors import merge; merge(out, [index])
    elif case == "merge filecord consume":
        from filecord.safetensors import merge; merge(out, [index], consume=True)
    elif case == "merge packages":
        from safetensors.torch import load_file, save_file
        loaded = {}
        for s in shards: loaded.update(load_file(s))
        save_file(loaded, out)
    elif case == "reshard filecord consume":
        from filecord.safetensors import reshard
        os.mkdir(o); reshard(o, [shards[0]], max_shard_size=size // 4, consume=True)
    elif case == "reshard packages":
        from safetensors.torch import load_file
        from huggingface_hub import save_torch_state_dict
        os.mkdir(o); save_torch_state_dict(load_file(shards[0]), o, max_shard_size=size // 4)
res = measured(job, durable="filecord" in case, written=[o if "reshard" in case else out],
               disk_of=work)
print(json.dumps({"case": case, "data": n * per * 4, **res}))
""".replace("WB_OFF", repr(", write-behind off"))
WB_OFF = ", write-behind off"

SETUP = r"""
import os, sys
import torch
from filecord.safetensors import save_sharded, save_file
size, where = int(sys.argv[1]), sys.argv[2]
n = max(4, size // (64 << 20)); per = size // n // 4
sd = {f"layer{i}.weight": torch.full((per,), float(i)) for i in range(n)}
os.makedirs(where)
if sys.argv[3] == "sharded":
    save_sharded(sd, where, max_shard_size=size // 3)
else:
    save_file(sd, os.path.join(where, "model.safetensors"))
"""

CASES = [
    ("save_file filecord", None), ("save_file safetensors", None),
    ("merge filecord copy", "sharded"), ("merge filecord consume", "sharded"),
    ("merge filecord consume" + WB_OFF, "sharded"), ("merge packages", "sharded"),
    ("reshard filecord consume", "single"), ("reshard filecord consume" + WB_OFF, "single"),
    ("reshard packages", "single"),
]
REFERENCE = {"save_file filecord": "save_file safetensors",
             "merge filecord copy": "merge packages", "merge filecord consume": "merge packages",
             "merge filecord consume" + WB_OFF: "merge packages",
             "reshard filecord consume": "reshard packages",
             "reshard filecord consume" + WB_OFF: "reshard packages"}
MOVE_WHY = (
    "on ext4 (no reflink) a move copies one sync window, fsyncs it, then cuts it off the "
    "source, window by window (see the fsyncs column; the package + fsync row "
    "fsyncs once), so that the data is on disk once plus one window at every moment; a larger "
    "window where the disk has room (`window=`) "
    "trades that peak for fewer fsyncs, a reflink file system clones instead (0 bytes "
    "copied), and with space to spare the copying path is the fast one")
# Why a filecord row can be slower than its reference at equal durability, and what closes it.
WHY = {
    "save_file filecord": "the data is written and fsynced once, as by the package + fsync; "
    "filecord adds its lock file's fsync and writes through a temp file renamed into place "
    "(atomic: a crash never leaves a partial file under the final name)",
    "merge filecord copy": "copy_file_range into a temp, one data fsync per output, plus the "
    "lock and the rename; the package + fsync row writes from memory it has already loaded",
    "merge filecord consume": MOVE_WHY,
    "reshard filecord consume": MOVE_WHY,
    "merge filecord consume" + WB_OFF: MOVE_WHY + "; and here each window's writeback starts "
    "only at its fsync (the mover before issue 26; the row above starts it part by part)",
    "reshard filecord consume" + WB_OFF: MOVE_WHY + "; and here each window's writeback "
    "starts only at its fsync (the mover before issue 26; the row above starts it part by "
    "part)",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    setups = dict(CASES)
    names = [c for c, _s in CASES]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    for r, case in rotations(names, args.rounds):
        work = tempfile.mkdtemp(prefix="filecord-bench-st-", dir=args.dir)
        try:
            if setups[case]:
                subprocess.run([sys.executable, "-c", SETUP, str(args.size),
                                os.path.join(work, "in"), setups[case]], check=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
            res = child(CHILD, case, args.size, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record(results, r, case, res)
    data = data_size(results, args.size)
    print_rounds(f"data: {data / 2**30:.2f} GiB of float32 tensors; {machine()}; one process "
                 f"per case on a fresh copy of its inputs; {rounds(args.rounds)}, median "
                 "(min-max)", names, results, REFERENCE, WHY, data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
