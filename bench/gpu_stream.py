"""Issue 13 item 6: a state dict on the GPU streamed to a ``.ptd``, against safetensors.

    python bench/gpu_stream.py [--size 4G] [--dir /var/tmp]

Needs CUDA.  Without a CUDA device it says so and exits with status 0 (nothing measured);
the CPU benchmarks never depend on it.  With one: float32 tensors of ``--size`` on the GPU,
one process per writer, host peak RSS above the baseline and time (until durable: the
package's output is fsynced after it returns) for ``filecord.executorch.save_state_dict`` (each
tensor copied to the host through one pinned buffer, chunk by chunk) and
``safetensors.torch.save_file`` (which copies every tensor to the host first); then the
``.ptd`` is converted back to safetensors by filecord and every tensor compared with the
package's file.  Not part of ``bench/run``: written where no GPU was available, so its CUDA
path has not been run yet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _bench import ROOT, GiB, MiB, child, parse_size, table

CHILD = r"""
import json, sys
import torch
from _bench import measured
case, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
per = 256 << 20
sd = {f"layer{i}.weight": torch.full((min(per, size - i * per) // 4,), float(i), device="cuda")
      for i in range(-(-size // per))}
torch.cuda.synchronize()
def job():
    if case == "filecord":
        from filecord.executorch import save_state_dict
        save_state_dict(out, sd, consume=True)
    else:
        from safetensors.torch import save_file
        save_file(sd, out)
print(json.dumps({"case": case, **measured(job, durable=case == "filecord", written=[out])}))
"""

CHECK = r"""
import sys
import torch
from safetensors import safe_open
a, b = sys.argv[1], sys.argv[2]
with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
    assert sorted(fa.keys()) == sorted(fb.keys()), "different tensor names"
    for k in fa.keys():
        assert torch.equal(fa.get_tensor(k), fb.get_tensor(k)), f"{k} differs"
print("every tensor equal")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=4 * GiB)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here (torch.cuda.is_available() is False): the GPU path of "
              "issue 13 item 6 was not measured")
        return 0
    work = Path(args.dir) / f"filecord-gpu-{os.getpid()}"
    work.mkdir()
    try:
        ptd, theirs = work / "model.ptd", work / "theirs.safetensors"
        rows = [child(CHILD, "filecord", args.size, ptd),
                child(CHILD, "safetensors", args.size, theirs)]
        back = work / "back.safetensors"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        subprocess.run([sys.executable, "-m", "filecord.cli", "convert", str(ptd), "-o", str(back),
                        "-q"], check=True, env=env)
        check = subprocess.run([sys.executable, "-c", CHECK, str(back), str(theirs)],
                               capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gpu = torch.cuda.get_device_name()
    print(f"state dict: {args.size / GiB:g} GiB of float32 tensors on {gpu}; one process per "
          "writer, one run each\n")
    print(table(["writer", "seconds until durable", "host peak RSS above baseline, MiB"],
                [[r.get("case", "?"), f"{r['durable']:.2f}" if "durable" in r else r["error"],
                  f"{r['rss'] / MiB:.0f}" if "rss" in r else "-"] for r in rows]))
    print(f"\nbytes: {check.stdout.strip() or check.stderr.strip().splitlines()[-1:]}")
    return 0 if check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
