"""``filecord convert MODEL_DIR -o OUT.gguf`` on real files, without the reference converter:
refusals before anything is written, consume, dry run, splits, and the pieces themselves
(Q/K rows as ranges of the input, casts in bounded chunks).  The comparison with llama.cpp's
own converter and llama.cpp's logits is in ``test_gguf_hf_reference.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

import itertools

from tests.support.hf_models import gguf_contents, tiny_model

import filecord.gguf as fg
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord.gguf import _cast
from filecord.gguf._hf_model import row_order
from filecord.gguf._types import GGMLType

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "convert", *args],
                          capture_output=True, text=True, env=ENV, timeout=600, check=False)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("hf") / "llama", dtype="bfloat16")


def fresh(llama: Path, tmp_path: Path) -> Path:
    """A copy of the module's model that a test may consume or edit."""
    out = tmp_path / "model"
    out.mkdir()
    for p in llama.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    return out


def test_q_k_rows_are_ranges_of_the_input(llama: Path, tmp_path: Path) -> None:
    """The permuted tensors are rows of the checkpoint's own file, in llama.cpp's order, and
    every byte of the output equals what numpy computes from the input."""
    import torch
    from safetensors.torch import load_file

    def tensor(name: str) -> np.ndarray:
        t = load_file(str(llama / index["weight_map"][name]))[name]
        return t.view(torch.int16).numpy().view(np.uint16)  # bf16's bits

    out = tmp_path / "o.gguf"
    report = fg.convert(out, llama)
    _, tensors = gguf_contents(out)
    index = json.loads((llama / "model.safetensors.index.json").read_text())
    name = "model.layers.1.self_attn.k_proj.weight"
    raw = tensor(name)
    rows = raw.reshape(2, 2, 8, 64).swapaxes(1, 2).reshape(32, 64)
    assert tensors["blk.1.attn_k.weight"] == ("BF16", (64, 32), rows.tobytes())
    assert [raw.tobytes()[i * 128:(i + 1) * 128] for i in row_order(32, 2)] == [
        rows.tobytes()[i * 128:(i + 1) * 128] for i in range(32)]
    # the norms are widened to F32 exactly (bf16 -> f32 is a shift)
    norm = tensor("model.norm.weight")
    want = (norm.astype(np.uint32) << 16).view(np.float32)
    assert tensors["output_norm.weight"] == ("F32", (64,), want.tobytes())
    assert report.bytes_copied > 0  # copied, not moved: consume was not asked for
    assert len(list(llama.glob("*.safetensors"))) == 7


def test_consume_moves_the_checkpoint_into_the_gguf(llama: Path, tmp_path: Path) -> None:
    model = fresh(llama, tmp_path)
    copy = tmp_path / "copy.gguf"
    fg.convert(copy, model)
    from filecord.safetensors import read_safetensors

    index = read_safetensors(model / "model.safetensors.index.json")
    shards = index.shards  # type: ignore[union-attr]
    data = sum(t.nbytes for f in shards for t in f.tensors.values())
    out = tmp_path / "moved.gguf"
    report = fg.convert(out, model, consume=True)
    assert out.read_bytes() == copy.read_bytes()
    left = sorted(p.name for p in model.iterdir())
    assert left == ["config.json", "generation_config.json", "tokenizer.model",
                    "tokenizer_config.json"]  # shards and index gone, config and tokenizer kept
    # every byte of the checkpoint was moved (the BF16 norms' own bytes too: they went to a
    # hidden extra output, removed after the commit), none copied; the F32 norms were produced
    assert report.bytes_copied == 0
    assert data <= report.bytes_moved < data + 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf", "model", "moved.gguf"]


def test_consume_with_every_weight_cast(llama: Path, tmp_path: Path) -> None:
    """--outtype f16 from bf16: no tensor is a range of the input; the output is the copying
    conversion's, and the shards (their bytes moved through the hidden unused-bytes output, so
    the save consumes them) and the index are gone after the commit."""
    from filecord.safetensors import read_safetensors

    model = fresh(llama, tmp_path)
    index = read_safetensors(model / "model.safetensors.index.json")
    data = sum(t.nbytes for f in index.shards for t in f.tensors.values())  # type: ignore[union-attr]
    copy = tmp_path / "copy.gguf"
    fg.convert(copy, model, outtype="f16")
    out = tmp_path / "f16.gguf"
    report = fg.convert(out, model, outtype="f16", consume=True)
    assert out.read_bytes() == copy.read_bytes()
    assert not list(model.glob("*.safetensors"))
    assert not (model / "model.safetensors.index.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf", "f16.gguf", "model"]
    assert report.bytes_copied == 0
    # the cast tensors' scratch file into the GGUF, the checkpoint into the unused-bytes file
    assert report.bytes_moved == out.stat().st_size - report.bytes_written + data


def test_dry_run_says_what_would_move_and_writes_nothing(llama: Path, tmp_path: Path) -> None:
    model = fresh(llama, tmp_path)
    before = snapshot(tmp_path)
    r = run(str(model), "-o", str(tmp_path / "o.gguf"), "--consume", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would save 2 file(s)" in r.stdout  # the GGUF and the hidden unused-bytes file
    assert "moved" in r.stdout
    assert "ranges]" in r.stdout  # Q/K rows: one line per shard, not one per row
    assert len(r.stdout.splitlines()) < 40
    r = run(str(model), "-o", str(tmp_path / "o.gguf"), "--outtype", "f16", "-n", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dry_run"] is True
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("consume", [False, True])
def test_split_with_and_without_consume(llama: Path, tmp_path: Path, consume: bool) -> None:
    model = fresh(llama, tmp_path)
    one = tmp_path / "one.gguf"
    fg.convert(one, model)
    args = [str(model), "-o", str(tmp_path / "s.gguf"), "--split-max-size", "40K", "-q"]
    r = run(*args, *(["--consume"] if consume else []))
    assert r.returncode == 0, r.stderr
    shards = sorted(tmp_path.glob("s-*.gguf"))
    assert len(shards) > 2
    _, whole = gguf_contents(one)
    parts: dict[str, object] = {}
    for p in shards:
        kvs, ts = gguf_contents(p)
        assert kvs["split.count"][1] == len(shards)
        parts.update(ts)
    assert parts == whole
    model_set = fg.read_gguf(shards[0])  # filecord's strict reader: a valid split set
    assert len(model_set.tensors) == len(whole)
    assert any(model.glob("*.safetensors")) is not consume


def test_outtype_casts_in_bounded_chunks() -> None:
    """Chunks of any size give the same bytes as one cast of the whole (numpy)."""
    rng = np.random.default_rng(5)
    f32 = rng.standard_normal(1000).astype(np.float32)
    f32[:4] = [np.nan, -np.inf, 65504.0, 1e-8]
    bf = _cast.convert(f32.tobytes(), GGMLType.F32, GGMLType.BF16)
    back = np.frombuffer(bytes(_cast.convert(bytes(bf), GGMLType.BF16, GGMLType.F32)),
                         np.float32)
    assert np.isnan(back[0])
    assert back[1] == -np.inf
    assert np.allclose(back[2:], f32[2:], rtol=1 / 128)
    f16 = np.frombuffer(bytes(_cast.convert(f32.tobytes(), GGMLType.F32, GGMLType.F16)),
                        np.float16)
    assert np.array_equal(f16[1:], f32[1:].astype(np.float16))


def test_cast_chunks_are_bounded(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = np.arange(5000, dtype=np.float32)
    src.write_bytes(data.tobytes())
    whole = FileBackedData(src)
    rows = [whole.slice(i * 400, 400) for i in (3, 1, 4, 0, 2)]
    seen: list[int] = []
    made = _cast.derived([_cast.CastJob("x", rows, GGMLType.F32, GGMLType.F16)],
                         progress=lambda done, total: seen.append(done))
    reads: list[int] = []

    def read(r: FileBackedData, start: int, n: int) -> bytes:
        reads.append(n)
        return r.read_range(start, n)

    got = b"".join(bytes(c) for c in made["x"].chunks(read, chunk=64))
    want = np.concatenate([data[i * 100:(i + 1) * 100] for i in (3, 1, 4, 0, 2)])
    assert got == want.astype(np.float16).tobytes()
    assert len(made["x"]) == len(got)
    assert max(reads) <= 64  # never more than one chunk of source at a time
    assert sum(reads) == 2000
    assert np.diff([0, *seen]).max() <= 64
    assert seen[-1] == 2000
    assert [p.name for p in tmp_path.iterdir()] == ["src.bin"]  # nothing is made on disk


def _refused(tmp_path: Path, model: Path, *args: str, code: int, says: list[str]) -> None:
    before = snapshot(tmp_path)
    r = run(str(model), "-o", str(tmp_path / "o.gguf"), *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    for s in says:
        assert s in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert snapshot(tmp_path) == before  # nothing written, nothing consumed


def test_refusals_name_what_is_supported(llama: Path, tmp_path: Path) -> None:
    model = fresh(llama, tmp_path)
    config = json.loads((model / "config.json").read_text())

    def edit(**changes: object) -> None:
        (model / "config.json").write_text(json.dumps({**config, **changes}))

    edit(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    _refused(tmp_path, model, "--consume", code=1,
             says=["'GPT2LMHeadModel'", "LlamaForCausalLM (llama), MistralForCausalLM"])
    edit(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5})
    _refused(tmp_path, model, "--consume", code=1, says=["'yarn'", "supported: none"])
    edit(num_local_experts=8)
    _refused(tmp_path, model, code=1, says=["mixture-of-experts"])
    edit(hidden_size=128)
    _refused(tmp_path, model, code=1, says=["config.json: ", "tensor(s) do not match it"])
    edit()
    (model / "tokenizer.model").rename(model / "tokenizer.bak")
    _refused(tmp_path, model, "--consume", code=1,
             says=["no tokenizer.model or tokenizer.json", "SentencePiece tokenizer.model"])
    (model / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece",
                                                                "vocab": {"a": 0}}}))
    _refused(tmp_path, model, code=1, says=["'WordPiece' tokenizer is not supported"])
    (model / "tokenizer.json").unlink()
    (model / "tokenizer.bak").rename(model / "tokenizer.model")
    _refused(tmp_path, model, "--outtype", "q4_0", code=2, says=["invalid choice: 'q4_0'"])
    _refused(tmp_path, model / "config.json", code=1, says=["give a model directory"])
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    (pickles / "config.json").write_bytes((model / "config.json").read_bytes())
    (pickles / "pytorch_model.bin").write_bytes(b"not read")
    _refused(tmp_path, pickles, code=1, says=["PyTorch pickles are not supported"])


def test_an_unsupported_dtype_is_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    model = tiny_model(tmp_path / "m", dtype="float32", shard="10MB")
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors[
        "model.layers.0.mlp.up_proj.weight"].to(torch.float64)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    _refused(tmp_path, model, "--consume", code=1,
             says=["model.layers.0.mlp.up_proj.weight (F64)", "supported: F32, F16, BF16"])


def test_library_rows_are_one_piece_of_row_ranges(llama: Path) -> None:
    """The library's own view: attn_q is one piece of the file's rows in llama.cpp's order
    (never loaded): one object for all its rows, whose bytes are those rows."""
    from filecord._pieces.rows import FileRows
    from filecord.gguf._hf import plan_tensors
    from filecord.gguf._hf_model import OutType, model_spec, row_order
    from filecord.safetensors import read_safetensors

    spec = model_spec(json.loads((llama / "config.json").read_text()))
    got = read_safetensors(llama / "model.safetensors.index.json")
    ordered = [t for f in sorted(got.shards, key=lambda f: f.path)  # type: ignore[union-attr]
               for _, t in sorted(f.tensors.items())]
    planned = {p.name: p for p in plan_tensors(spec, ordered, OutType.SOURCE)}
    q = planned["blk.0.attn_q.weight"]
    (rows,) = q.ranges
    assert isinstance(rows, FileRows)
    assert len(Cord(q.ranges)) == 64 * 64 * 2
    assert rows.row == 64 * 2
    src = rows.base
    assert isinstance(src, FileBackedData)
    whole = src.to_bytes()
    order = row_order(64, spec.n_head)
    assert bytes(rows) == b"".join(whole[r * 128:(r + 1) * 128] for r in order)
    breaks = sum(1 for a, b in itertools.pairwise(order) if b != a + 1)
    assert rows.run_count == 1 + breaks > 32  # adjacent rows (a head's last, the next's
    # first) are one range; the rest are not
    assert not q.cast
    assert planned["blk.0.attn_norm.weight"].cast


@pytest.mark.parametrize("consume", [False, True], ids=["copy", "consume"])
@pytest.mark.parametrize("target", ["config.json", "tokenizer.model", "tokenizer_config.json"])
def test_an_output_that_is_a_link_to_a_file_the_converter_reads_is_refused(
        llama: Path, tmp_path: Path, target: str, consume: bool) -> None:
    """The folder's non-weight files are read and never consumed: an output linked to one of
    them would be renamed over it (the outside attack wrote a GGUF over config.json)."""
    model = fresh(llama, tmp_path)
    link = tmp_path / "out.gguf"
    link.symlink_to(model / target)
    before = snapshot(model)
    r = run(str(model), "-o", str(link), "-q", *(["--consume"] if consume else []))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert (f"is also one of the inputs ({model / target}); that file is read, never consumed: "
            "write the output elsewhere") in r.stderr, r.stderr
    assert snapshot(model) == before  # every input byte-exact, nothing consumed
    assert link.is_symlink()
    assert os.readlink(link) == str(model / target)
