"""Issues 24, 35: Hugging Face checkpoints to GGUF, filecord against llama.cpp's converter.

* ``filecord convert MODEL_DIR -o OUT.gguf`` copying, with ``--consume``, and ``--outtype q8_0``
  (copying and consuming);
* llama.cpp's ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36's vendored copy, found as the
  tests find it: ``$FILECORD_LLAMA_CPP_SRC`` or a cached ``pip download``) in its default mode
  and with ``--use-temp-file`` (``$TMPDIR`` in the work directory).

The checkpoint is written here without a model in memory: ``config.json`` of the ``--family``
(llama, mistral, qwen2, qwen3, gemma2) with GQA (hidden 2048, 16 heads, 4 KV heads, FFN 5632,
as many layers as ``--size`` needs; each family's own tensors: Qwen2's q/k/v biases, Qwen3's q/k
norms, Gemma 2's sandwich norms), bf16 safetensors shards of at most 1 GiB plus
``model.safetensors.index.json`` (tensors filled from a tiled random block), and the family's
tokenizer trained on a small generated text (SentencePiece, or Qwen2's byte-level BPE; the
reference's pre-tokenizer hash cannot know it, so that one lookup is answered for it).  Both
converters keep the bf16 weights (their default) or write q8_0, and widen the norms to F32.

Time, peak RSS above the start (torch and the converter's modules are imported before the
mark is reset, so the column is the conversion's own memory), peak allocated disk in the work
directory (``st_blocks`` sampled every 5 ms) over the checkpoint.  The reference never fsyncs:
its durable column adds an fsync of its output.  Each case runs in its own process on a fresh
checkpoint, ``--rounds`` times, rotated.  With ``--near-full`` (root: a loop-mounted ext4) each
tool runs once more on a file system that had 1.06x the checkpoint free before it was written.

Usage: python bench/hf_gguf.py [--family llama] [--size 4GiB] [--rounds 1] [--dir DIR]
       [--near-full] [--json F]
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
    GiB,
    MiB,
    child,
    data_size,
    fskit,
    machine,
    parse_size,
    print_rounds,
    record,
    rotations,
    rounds,
    table,
)

sys.path.insert(0, str(ROOT))

SETUP = r"""
import json, os, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from tests.support.hf_models import qwen2_tokenizer, spm_tokenizer
size, where, family = int(sys.argv[1]), sys.argv[2], sys.argv[4]
os.makedirs(where, exist_ok=True)
qwen = family in ("qwen2", "qwen3")
vocab = (qwen2_tokenizer if qwen else spm_tokenizer)(__import__("pathlib").Path(where))
vocab += 4 if qwen else 0  # Qwen pads its embedding past the tokenizer
H, HEADS, KV, FF = 2048, 16, 4, 5632
D = H // HEADS
layer = [("input_layernorm.weight", (H,)), ("mlp.down_proj.weight", (H, FF)),
         ("mlp.gate_proj.weight", (FF, H)), ("mlp.up_proj.weight", (FF, H)),
         ("post_attention_layernorm.weight", (H,)), ("self_attn.k_proj.weight", (KV * D, H)),
         ("self_attn.o_proj.weight", (H, H)), ("self_attn.q_proj.weight", (H, H)),
         ("self_attn.v_proj.weight", (KV * D, H))]
if family == "qwen2":
    layer += [("self_attn.q_proj.bias", (H,)), ("self_attn.k_proj.bias", (KV * D,)),
              ("self_attn.v_proj.bias", (KV * D,))]
if family == "qwen3":
    layer += [("self_attn.q_norm.weight", (D,)), ("self_attn.k_norm.weight", (D,))]
if family == "gemma2":
    layer += [("pre_feedforward_layernorm.weight", (H,)),
              ("post_feedforward_layernorm.weight", (H,))]
per_layer = sum(2 * int(np.prod(s)) for _, s in layer)
n = max(2, round(size / per_layer))
tied = family == "gemma2"
names = [("model.embed_tokens.weight", (vocab, H)), ("model.norm.weight", (H,))]
names += [] if tied else [("lm_head.weight", (vocab, H))]
names += [(f"model.layers.{i}.{k}", s) for i in range(n) for k, s in layer]
names.sort()
rng = np.random.default_rng(0)
block = (rng.standard_normal(4 << 20).astype(np.float32) * 0.02).view(np.uint32)
block = (block >> 16).astype(np.uint16).tobytes()  # 8 MiB of bf16 values
shards, cur, total = [], [], 0
for name, shape in names:
    nbytes = 2 * int(np.prod(shape))
    if cur and total + nbytes > (1 << 30):
        shards.append(cur); cur, total = [], 0
    cur.append((name, shape, nbytes)); total += nbytes
shards.append(cur)
weight_map = {}
for i, group in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, nbytes in group:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
        weight_map[name] = fname
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(os.path.join(where, fname), "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        left = off
        while left:
            k = min(left, len(block)); f.write(block[:k]); left -= k
with open(os.path.join(where, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": sum(t for g in shards for *_, t in g)},
               "weight_map": weight_map}, f)
arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
        "gemma2": "Gemma2ForCausalLM"}[family]
config = {"architectures": [arch], "model_type": family, "hidden_size": H,
          "intermediate_size": FF, "num_hidden_layers": n, "num_attention_heads": HEADS,
          "num_key_value_heads": KV, "max_position_embeddings": 4096,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": vocab,
          "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2,
          "torch_dtype": "bfloat16"}
if family == "mistral":
    config["sliding_window"] = 4096
if family == "qwen3":
    config["head_dim"] = D
if qwen:
    config.update(bos_token_id=None, eos_token_id=vocab - 5)
if family == "gemma2":
    config.update(head_dim=D, query_pre_attn_scalar=D, sliding_window=4096,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                  hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
with open(os.path.join(where, "config.json"), "w") as f:
    json.dump(config, f)
print(n, len(shards), file=sys.stderr)
"""

CHILD = r"""
import json, os, sys
from _bench import measured
case, work, ref, family = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
model, out = os.path.join(work, "model"), os.path.join(work, "model.gguf")
data = sum(os.path.getsize(os.path.join(model, p)) for p in os.listdir(model)
           if p.endswith(".safetensors"))
if case.startswith("reference"):
    import runpy
    import torch, transformers, sentencepiece  # imported before the RSS mark, as filecord's
    sys.path[:0] = [ref, ref + "/gguf-py"]
    import gguf, conversion
    if family in ("qwen2", "qwen3"):  # its hash table cannot know a vocabulary made here
        import conversion.base as base
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    os.environ["TMPDIR"] = work
    argv = [ref + "/convert_hf_to_gguf.py", model, "--outfile", out]
    if case.endswith("temp file"):
        argv.append("--use-temp-file")
    if case.endswith("q8_0"):
        argv += ["--outtype", "q8_0"]
    def job():
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
else:
    from filecord.gguf import convert
    import numpy, sentencepiece, gguf
    def job():
        convert(out, model, consume="consume" in case,
                outtype="q8_0" if case.endswith("q8_0") else "source")
try:
    res = measured(job, durable=case.startswith("filecord"), written=[out], disk_of=work)
except BaseException as exc:  # the reference logs and exits: say what stopped it, on one line
    sys.stderr.write(f"\nTraceback (most recent call last):\n{type(exc).__name__}: {exc}\n")
    sys.exit(1)
print(json.dumps({"case": case, "data": data, **res}))
"""

CASES = ["filecord copy", "filecord --consume", "reference default",
         "reference temp file", "filecord copy q8_0", "filecord --consume q8_0",
         "reference q8_0"]
REFERENCE = {"filecord copy": "reference default", "filecord --consume": "reference default",
             "reference temp file": "reference default",
             "filecord copy q8_0": "reference q8_0", "filecord --consume q8_0": "reference q8_0"}
WHY = {
    "filecord --consume": "on ext4 (no reflink) a move copies one sync window, fsyncs it, "
    "then cuts it off the source, window by window, so that the checkpoint is on disk once "
    "plus one window at every moment; the copying convert is the fast path where space allows",
    "filecord copy": "filecord fsyncs its output before it returns; see the durable column",
}


def _make(size: int, where: str, family: str) -> None:
    subprocess.run([sys.executable, "-c", SETUP, str(size), where, str(ROOT), family],
                   check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def near_full(size: int, ref: str, family: str) -> str:
    """Each tool once on an ext4 that had 1.06x the checkpoint free before it was written."""
    rows = []
    for case in CASES:
        image = int(size * 1.25) + 256 * MiB
        with fskit.mounted("ext4", image, preallocate=True) as point:
            _make(size, str(point / "model"), family)
            data = sum(p.stat().st_size for p in (point / "model").glob("*.safetensors"))
            st = os.statvfs(point)
            want_free = int(0.06 * data)
            have = st.f_bavail * st.f_frsize
            filler = point / "filler"
            with open(filler, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, max(1, have - want_free))
            held = filler.stat().st_blocks * 512  # counted by the disk column: taken off
            res = child(CHILD, case, str(point), ref, family)
            ok = "error" not in res
            rows.append([case, "succeeded" if ok else f"failed: {res['error'][:90]}",
                         f"{(res['disk'] - held) / data:.3f}" if ok and "disk" in res
                         else "-"])
    return table(["case (1.06x free)", "result", "peak disk / data"], rows)


def main() -> int:
    from tests.support.hf_models import reference_converter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=4 * GiB)
    ap.add_argument("--family", default="llama",
                    choices=["llama", "mistral", "qwen2", "qwen3", "gemma2"])
    ap.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--near-full", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ref_dir = reference_converter()
    if ref_dir is None:
        print("llama.cpp's convert_hf_to_gguf.py is not available", file=sys.stderr)
        return 1
    ref = str(ref_dir)
    cases = args.cases.split(",") if args.cases else CASES
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r, case in rotations(cases, args.rounds):
        work = tempfile.mkdtemp(prefix="filecord-bench-hf-", dir=args.dir)
        try:
            _make(args.size, os.path.join(work, "model"), args.family)
            res = child(CHILD, case, work, ref, args.family)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record(results, r, case, res)
    data = data_size(results, args.size)
    print_rounds(f"data: {data / GiB:.2f} GiB bf16 {args.family} checkpoint (GQA, 1 GiB "
                 f"shards); {machine()}; one process per case on a fresh checkpoint; "
                 f"{rounds(args.rounds)}, median (min-max)", cases, results,
                 {k: v for k, v in REFERENCE.items() if k in cases and v in cases}, WHY,
                 data, args.json)
    if args.near_full:
        print("\n" + near_full(args.size, ref, args.family))
    return 0


if __name__ == "__main__":
    sys.exit(main())
