"""Issue 35: every family of the converter's table against llama.cpp's converter, q8_0 included.

Runs ``bench/hf_gguf.py`` once per family (llama, mistral, qwen2, qwen3, gemma2) on a fresh
checkpoint of ``--size`` per case, with the cases ``filecord copy``, ``filecord --consume``,
their ``q8_0`` variants, and the reference's default and ``--outtype q8_0``, and prints each
family's table under its name.

Usage: python bench/hf_gguf_families.py [--size 1GiB] [--families llama,qwen2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from _bench import ROOT

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2"]
CASES = ["filecord copy", "filecord --consume", "reference default", "filecord copy q8_0",
         "filecord --consume q8_0", "reference q8_0"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    for family in args.families.split(","):
        cmd = [sys.executable, str(ROOT / "bench" / "hf_gguf.py"), "--family", family,
               "--size", args.size, "--rounds", "1", "--cases", ",".join(CASES)]
        if args.dir:
            cmd += ["--dir", args.dir]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        print(f"### {family}\n")
        print(r.stdout.strip() if r.returncode == 0 else f"failed: {r.stderr[-500:]}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
