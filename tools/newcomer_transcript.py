"""Regenerate ``docs/newcomer.md``: a newcomer's whole path from a fresh clone, with the real
output of every command.

    python3 tools/newcomer_transcript.py [--out docs/newcomer.md] [--work DIR]
                                         [--clients-from VENV]

It clones this checkout (its committed HEAD) into a new directory, makes a fresh virtual
environment there and installs filecord with the extras a newcomer needs (``.[cli,hf]``), then
runs the README's demo and the Hugging Face path: a tiny random ``LlamaForCausalLM`` saved
sharded by ``save_pretrained`` -> ``merge`` and ``reshard`` -> ``from_pretrained`` on each
output (logits compared) -> ``convert`` to ``.gguf`` and to ``.ptd`` -> ``verify --load`` of
every output.  Each command is shown as typed, with its output (stdout and stderr, as a
terminal would show them), its exit status and its wall time; paths under the work directory
are written as ``$WORK``.  The one edit: pip's ``WARNING: Location ... is ignored`` lines
(about this machine's package index configuration, not about filecord) are left out.

The clients users load the outputs with (torch, transformers, the ExecuTorch runtime,
llama-cpp-python) are big; by default ``torch==2.13.0`` and ``transformers`` are installed
into the fresh environment (the ExecuTorch runtime and llama.cpp are then reported as not
installed).  ``--clients-from VENV`` instead lets the fresh environment see the packages of an
existing one (a ``.pth`` file naming its site-packages, after the fresh environment's own, so
the clone's filecord is the one imported: the transcript shows ``filecord.__file__``), which
is how a machine that already has llama-cpp-python built shows the llama.cpp loads.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE_CHECKPOINT = """\
from pathlib import Path
from tests.support.hf_models import tiny_model  # a tiny random Llama, saved sharded
tiny_model(Path("ckpt"))  # save_pretrained(max_shard_size="40KB") plus a SentencePiece tokenizer
"""

LOGITS = """\
import torch
from transformers import AutoModelForCausalLM
tokens = torch.tensor([[1, 5, 9, 30, 77, 2]])
def logits(folder):
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder)(tokens).logits
want = logits("ckpt")
for folder in ("one", "resharded"):
    got = logits(folder)
    print(f"{folder}: from_pretrained ok, logits identical to ckpt's: {torch.equal(got, want)}")
"""


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(next(x for x in Path("/proc/meminfo").read_text().splitlines()
                       if x.startswith("MemTotal")).split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return (f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


class Transcript:
    def __init__(self, work: Path, clients: str | None = None) -> None:
        self.work = work
        self.clients = clients
        self.lines: list[str] = []
        self.failed: list[str] = []

    def text(self, *lines: str) -> None:
        self.lines.extend([*lines, ""])

    def run(self, command: str, cwd: Path, *, shown: str | None = None,
            env: dict[str, str] | None = None, expect: int = 0) -> str:
        start = time.monotonic()
        r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd,
                           capture_output=True, text=True, env=env, check=False)
        took = time.monotonic() - start
        out = (r.stdout + r.stderr).replace(str(self.work), "$WORK")
        if self.clients:
            out = out.replace(self.clients, "$CLIENTS")
        # the demo works in the temp directory: no machine path goes into the committed doc
        out = out.replace(tempfile.gettempdir().rstrip("/") + "/", "$TMPDIR/")
        out = out.rstrip("\n")
        self.lines.append("```console")
        self.lines.append(f"$ {shown or command}")
        if out:
            self.lines.append(out)
        self.lines.append(f"[exit {r.returncode}, {took:.1f} s]")
        self.lines.extend(["```", ""])
        if r.returncode != expect:
            self.failed.append(f"{shown or command}: exit {r.returncode}, expected {expect}")
        print(f"[{r.returncode}] {took:6.1f}s  {shown or command}",  # noqa: T201 - a script
              file=sys.stderr)
        return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "newcomer.md")
    ap.add_argument("--work", type=Path, default=None,
                    help="where to clone (a new temporary directory by default; kept)")
    ap.add_argument("--clients-from", type=Path, default=None, metavar="VENV",
                    help="reuse the client packages of this virtual environment")
    args = ap.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="filecord-newcomer-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "filecord"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers' shard-writing bar: one line less
    clients = None if args.clients_from is None else str(args.clients_from.resolve())
    t = Transcript(work, clients)
    load_before = os.getloadavg()[0]
    t.text("# A newcomer's path, from a fresh clone",
           "",
           f"Regenerated by `python3 tools/newcomer_transcript.py"
           f"{' --clients-from VENV' if clients else ''}` on {time.strftime('%Y-%m-%d')} "
           f"from commit `{head}`, on {machine()}{{load}}. Every block is a command as typed "
           "and its real output (stdout and stderr), its exit status and its wall time; "
           "`$WORK` is the directory the script cloned into. Left out: pip's `WARNING: "
           "Location ... is ignored` lines, about this machine's package index configuration.")
    header = len(t.lines) - 2
    t.text("## Install", "",
           "A fresh clone and a fresh virtual environment; the extras: `cli` (progress bars) "
           "and `hf` (what `convert -o OUT.gguf` needs to read a Hugging Face tokenizer).")
    t.run(f"git clone -q {shlex.quote(str(ROOT))} filecord", work,
          shown="git clone -q <this repository> filecord && cd filecord")
    t.run("python3 -m venv .venv && .venv/bin/pip install -q -e '.[cli,hf]' 2>&1 | "
          "{ grep -v '^WARNING: Location' || true; } && .venv/bin/filecord --version", clone,
          shown="python3 -m venv .venv && .venv/bin/pip install -q -e '.[cli,hf]' && "
          ".venv/bin/filecord --version", env=env)
    if args.clients_from is None:
        t.text("The clients the outputs are loaded with, as their users install them:")
        t.run(".venv/bin/pip install -q torch==2.13.0 transformers safetensors 2>&1 | "
              "{ grep -v '^WARNING: Location' || true; }", clone,
              shown=".venv/bin/pip install -q torch==2.13.0 transformers safetensors", env=env)
    else:
        site = subprocess.run(
            [str(args.clients_from / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True).stdout.strip()
        t.text("The clients the outputs are loaded with (torch, transformers, the ExecuTorch "
               "runtime, llama-cpp-python, whose build takes long) are taken from an existing "
               "environment on this machine: a `.pth` file makes its packages visible after the "
               "fresh environment's own, so the clone's filecord is the one imported. `$CLIENTS` "
               "is that environment's directory.")
        t.run(f"echo {shlex.quote(site)} > \"$(.venv/bin/python -c 'import sysconfig; "
              "print(sysconfig.get_paths()[\"purelib\"])')/clients.pth\" && .venv/bin/python "
              "-c 'import filecord, transformers, llama_cpp, executorch; "
              "print(filecord.__file__)'", clone,
              shown="echo <site-packages of an environment with the clients> > "
              ".venv/lib/python3.11/site-packages/clients.pth && .venv/bin/python -c "
              "'import filecord, transformers, llama_cpp, executorch; print(filecord.__file__)'",
              env=env)
    fc = ".venv/bin/filecord"
    t.text("## The demo (README: \"Try it\")")
    t.run(f"{fc} demo", clone, shown=".venv/bin/filecord demo", env=env)
    t.text("## A Hugging Face checkpoint", "",
           "A tiny random `LlamaForCausalLM` (2 layers, GQA) saved sharded by `save_pretrained` "
           "with a SentencePiece tokenizer trained here (the tests' own helper):")
    (clone / "make_checkpoint.py").write_text(MAKE_CHECKPOINT)
    t.run("cat make_checkpoint.py && .venv/bin/python make_checkpoint.py && ls ckpt", clone,
          env=env)
    t.text("## Merge and reshard: the plan, then the real run")
    t.run(f"{fc} merge ckpt/model.safetensors.index.json -o one/model.safetensors --dry-run",
          clone, env=env)
    t.run(f"{fc} merge ckpt/model.safetensors.index.json -o one/model.safetensors && ls one",
          clone, env=env)
    t.run(f"{fc} reshard one/model.safetensors -o resharded --max-shard-size 100KB && "
          "ls resharded", clone, env=env)
    t.text("## `from_pretrained` on each output")
    (clone / "logits.py").write_text(LOGITS)
    t.run("cat logits.py && .venv/bin/python logits.py", clone, env=env)
    t.text("## Convert: to GGUF (llama.cpp) and to an ExecuTorch data file")
    t.run(f"{fc} convert ckpt -o gguf/model.gguf", clone, env=env)
    t.run(f"{fc} convert ckpt/model.safetensors.index.json -o et/model.ptd", clone, env=env)
    t.text("## `verify --load` of every output")
    for out in ("one/model.safetensors", "resharded/model.safetensors.index.json",
                "gguf/model.gguf", "et/model.ptd"):
        t.run(f"{fc} verify {out} --load", clone, env=env)
    # The wall times depend on what else the machine ran: its load is part of the record.
    t.lines[header] = t.lines[header].replace("{load}", (
        f", load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the "
        "end (other jobs shared the machine)"))
    if t.failed:
        t.text("**Commands that did not exit as expected:**", "",
               *[f"- `{f}`" for f in t.failed])
    args.out.write_text("\n".join(t.lines).rstrip("\n") + "\n")
    print(f"wrote {args.out}; work directory {work}", file=sys.stderr)  # noqa: T201
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
