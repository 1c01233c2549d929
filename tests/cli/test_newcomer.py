"""A newcomer's path through the command line: ``verify`` for every format filecord reads,
merge and reshard of a Hugging Face folder that ``from_pretrained`` loads, errors that name the
file, the field and the suffix that chose the format, and headers whose JSON spells half a
surrogate pair.  Every check runs the ``filecord`` command in a subprocess and asserts its
exit status and its words."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy")

SRC = Path(__file__).parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{Path(__file__).parents[2]}",
       "FILECORD_NO_PROGRESS": "1"}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    st_numpy.save_file({"w": rng.standard_normal((4, 8)).astype(np.float32),
                        "b": np.arange(3, dtype=np.int16)}, str(tmp_path / "a.safetensors"))
    st_numpy.save_file({"v": rng.standard_normal((2, 8)).astype(np.float32)},
                       str(tmp_path / "b.safetensors"))
    st_numpy.save_file({"w": np.zeros((4, 8), np.float32)}, str(tmp_path / "c.safetensors"))
    return tmp_path


def _gguf(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from filecord.gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- verify, every format ----------------------------------------------------------------------

def test_verify_accounts_for_every_byte_of_a_safetensors_file(files: Path) -> None:
    r = run("verify", "a.safetensors", cwd=files)
    assert r.returncode == 0, r.stderr
    size = (files / "a.safetensors").stat().st_size
    header = 8 + int.from_bytes((files / "a.safetensors").read_bytes()[:8], "little")
    assert r.stdout.splitlines() == [
        "ok: a.safetensors: safetensors, 1 file(s), 2 tensors (1 F32, 1 I16); every byte "
        "accounted for:",
        f"  a.safetensors: {size} bytes = {header} header + 134 tensor + 0 zero padding",
        "NOT loaded by a client: give --load to load it as its users do",
    ]
    got = json.loads(run("verify", "a.safetensors", "--json", cwd=files).stdout)
    regions = got["files"][0]["regions"]
    assert [(x["start"], x["end"], x["kind"]) for x in regions] == [
        (0, 8, "header"), (8, header, "header"), (header, header + 128, "tensor"),
        (header + 128, size, "tensor")]


def test_verify_load_reads_each_tensor_back_through_the_safetensors_package(
    files: Path,
) -> None:
    r = run("verify", "a.safetensors", "--load", cwd=files)
    assert r.returncode == 0, r.stderr
    assert "ok: safetensors (pt) loaded 2 tensors, each with the bytes filecord found for it" in (
        r.stdout.splitlines()) or "ok: safetensors (numpy) loaded 2 tensors" in r.stdout


def test_verify_of_a_gguf_names_its_padding_and_a_split_set_every_shard(files: Path) -> None:
    _gguf(files / "m.gguf", {"t": np.ones(4, np.float32), "u": np.ones(3, np.float32)})
    r = run("verify", "m.gguf", "--load", cwd=files)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ok: m.gguf: gguf, 1 file(s), 2 tensors (2 F32); every byte accounted for:"
    size = (files / "m.gguf").stat().st_size
    header = json.loads(run("verify", "m.gguf", "--json", cwd=files).stdout)
    b = header["files"][0]["bytes"]
    assert b["tensor"] == 28
    assert b["header"] + b["tensor"] + b["padding"] == size
    assert lines[1] == (f"  m.gguf: {size} bytes = {b['header']} header + 28 tensor + "
                        f"{b['padding']} zero padding")
    assert "ok: gguf-py read 2 tensors at the offsets and sizes filecord found" in lines
    assert ("note: not loaded in llama.cpp: no tokenizer.ggml.model key: not a model llama.cpp "
            "loads") in lines
    split = run("reshard", "m.gguf", "-o", "split", "--max-tensors", "1", "-q", cwd=files)
    assert split.returncode == 0, split.stderr
    r = run("verify", "split/m-00001-of-00002.gguf", "--load", cwd=files)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("ok: split/m-00001-of-00002.gguf: gguf, 2 file(s), 2 "
                                        "tensors (2 F32); every byte accounted for:")
    assert "ok: gguf-py read 2 tensors at the offsets and sizes filecord found" in r.stdout


def test_verify_refuses_padding_that_is_not_zeros_naming_its_range(files: Path) -> None:
    _gguf(files / "m.gguf", {"t": np.ones(3, np.float32)})
    data = bytearray((files / "m.gguf").read_bytes())
    data[-1] = 7  # the last byte is padding after the 12-byte tensor
    (files / "m.gguf").write_bytes(bytes(data))
    r = run("verify", "m.gguf", cwd=files)
    assert r.returncode == 1
    n = len(data)
    start = n - 20  # 32-byte alignment: 12 tensor bytes, then 20 of padding
    assert r.stderr == (f"filecord verify: m.gguf: bytes {start}..{n} (20) are in no header or "
                        "tensor and are not zero padding shorter than 32\n")
    assert r.stdout == ""


def test_verify_of_a_ptd_accounts_for_its_segments(files: Path) -> None:
    assert run("convert", "a.safetensors", "-o", "a.ptd", "-q", cwd=files).returncode == 0
    r = run("verify", "a.ptd", "--load", cwd=files)
    assert r.returncode == 0, r.stderr
    got = json.loads(run("verify", "a.ptd", "--json", cwd=files).stdout)
    assert got["format"] == "ExecuTorch .ptd"
    assert got["dtypes"] == {"FLOAT": 1, "SHORT": 1}
    f = got["files"][0]
    assert sum(f["bytes"].values()) == f["size"] == (files / "a.ptd").stat().st_size
    assert f["bytes"]["tensor"] == 134
    assert ("note: not loaded in ExecuTorch runtime: the runtime loads a .ptd only with its "
            "program: verify PROGRAM.pte --data FILE.ptd") in r.stdout.splitlines()


def test_verify_of_a_broken_file_names_it_and_exits_1(files: Path) -> None:
    (files / "bad.gguf").write_bytes(b"GGUF\x09\0\0\0" + bytes(24))
    r = run("verify", "bad.gguf", cwd=files)
    assert r.returncode == 1
    assert r.stderr == ("filecord verify: bad.gguf: version at offset 4: version 9: filecord "
                        "reads versions 2 and 3\n")
    r = run("verify", "a.safetensors", "--data", "x.ptd", cwd=files)
    assert r.returncode == 2
    assert r.stderr == "filecord verify: error: --data applies to a program (.pte) only\n"
    r = run("verify", "bad.gguf", "--no-runtime", cwd=files)  # a no-op beside a non-program
    assert r.returncode == 1
    assert r.stderr.startswith("filecord verify: bad.gguf: version at offset 4")


def test_verify_of_a_program_still_reads_a_pte(files: Path) -> None:
    """A .pte whose first bytes are wrong goes to the program check: its error."""
    (files / "x.pte").write_bytes(b"\0" * 64)
    r = run("verify", "x.pte", cwd=files)
    assert r.returncode == 1
    assert "x.pte: file identifier at offset 4" in r.stderr
    (files / "x.bin").write_bytes(b"\0" * 64)
    r = run("verify", "x.bin", cwd=files)
    assert r.returncode == 1
    assert r.stderr == ("filecord verify: x.bin: its first bytes match no format filecord "
                        "reads (.pte, .ptd, .safetensors, a safetensors index .json, .gguf) "
                        "and its name ends in none of those suffixes\n")


@pytest.mark.parametrize(("name", "damage", "says"), [
    ("brace.safetensors", lambda b: b[:8] + b"[" + b[9:], "header at offset 8"),
    ("empty.safetensors", lambda b: b"", "safetensors"),
    ("short.safetensors", lambda b: b[:7], "safetensors"),
    ("magic.gguf", lambda b: b"GGUX" + b[4:], "magic at offset 0"),
    ("model.safetensors.index.json", lambda b: b'{"weight_map": ', "index"),
])
def test_verify_of_a_damaged_file_reads_it_as_its_suffix_says_not_as_a_program(
    files: Path, name: str, damage: Any, says: str,
) -> None:
    """First bytes that match no format: the suffix chose the reader, and the error says so
    (never an ExecuTorch file identifier or a runtime)."""
    source = files / ("a.safetensors" if "safetensors" in name else "g.gguf")
    if name.endswith(".gguf"):
        _gguf(source, {"t": np.ones(4, np.float32)})
    (files / name).write_bytes(damage(source.read_bytes()))
    r = run("verify", name, cwd=files)
    assert r.returncode == 1, r.stdout
    assert r.stderr.startswith(f"filecord verify: {name}"), r.stderr
    assert says in r.stderr
    fmt = "gguf" if name.endswith(".gguf") else "safetensors"
    assert r.stderr.rstrip().endswith(
        f"(read as {fmt} because of its suffix: its first bytes match no format)"), r.stderr
    assert "ET12" not in r.stderr
    assert "runtime" not in r.stderr + r.stdout


# --- errors that name the file, the field and the suffix ---------------------------------------

def test_merge_into_another_formats_suffix_is_refused_naming_the_file_and_the_suffix(
    files: Path,
) -> None:
    r = run("merge", "a.safetensors", "b.safetensors", "-o", "out.gguf", cwd=files)
    assert r.returncode == 2
    assert r.stderr == (
        "filecord merge: error: a.safetensors is a safetensors file or index, but the output's "
        "suffix .gguf chose GGUF: merge -o OUT.gguf reads its inputs as GGUF (merge keeps the "
        "format; convert changes it)\n")
    assert not (files / "out.gguf").exists()


def test_a_malformed_input_names_the_file_and_the_suffix_that_chose_its_format(
    files: Path,
) -> None:
    (files / "bad.gguf").write_bytes(b"GGUF\x09\0\0\0" + bytes(24))
    r = run("merge", "bad.gguf", "-o", "out.gguf", cwd=files)
    assert r.returncode == 1
    assert r.stderr == ("filecord: error: bad.gguf: version at offset 4: version 9: filecord "
                        "reads versions 2 and 3\n  read as GGUF because the output's suffix is "
                        ".gguf\n")


def test_reshard_says_which_suffix_chose_the_format(files: Path) -> None:
    _gguf(files / "x.gguf", {"t": np.ones(4, np.float32)})
    r = run("reshard", "a.safetensors", "x.gguf", "-o", "rr", cwd=files)
    assert r.returncode == 2
    assert r.stderr == (
        "filecord reshard: error: x.gguf is a GGUF file, but the inputs' suffix chose "
        "safetensors: reshard reads its inputs as GGUF only when every one ends in .gguf, else "
        "as safetensors\n")
    (files / "bad.gguf").write_bytes(b"GGUF\x09\0\0\0" + bytes(24))
    r = run("reshard", "bad.gguf", "-o", "rr", cwd=files)
    assert r.returncode == 1
    assert r.stderr == ("filecord: error: bad.gguf: version at offset 4: version 9: filecord "
                        "reads versions 2 and 3\n  read as GGUF because every input's suffix "
                        "is .gguf\n")
    assert not (files / "rr").exists()


def test_merge_names_a_repeated_tensor_and_both_files(files: Path) -> None:
    r = run("merge", "a.safetensors", "c.safetensors", "-o", "m.safetensors", cwd=files)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == ("filecord: error: tensor 'w' is in both a.safetensors "
                                        "and c.safetensors")
    assert not (files / "m.safetensors").exists()


# --- a JSON escape of half a surrogate pair ----------------------------------------------------

def _surrogate_file(path: Path, header: str) -> None:
    raw = header.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))


@pytest.mark.parametrize(("header", "message"), [
    ('{"w\\ud800":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
     "s.safetensors: header at offset 9: the key 'w\\ud800' holds '\\ud800' (a JSON escape of "
     "half a surrogate pair): not Unicode text"),
    ('{"__metadata__":{"k":"\\ud800"},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
     "s.safetensors: header at offset 25: the value of 'k' holds '\\ud800' (a JSON escape of "
     "half a surrogate pair): not Unicode text"),
])
def test_a_lone_surrogate_is_one_clear_refusal_in_every_command(
    files: Path, header: str, message: str,
) -> None:
    """Refused at read, so inspect, verify, merge, reshard and convert say the same thing
    (the safetensors package refuses such a header too); never an internal error."""
    _surrogate_file(files / "s.safetensors", header)
    before = sorted(os.listdir(files))
    for command, prefix in [
        (["inspect", "s.safetensors"], "filecord inspect: "),
        (["verify", "s.safetensors"], "filecord verify: "),
        (["merge", "s.safetensors", "b.safetensors", "-o", "m.safetensors"], "filecord: error: "),
        (["reshard", "s.safetensors", "-o", "rs"], "filecord: error: "),
        (["convert", "s.safetensors", "-o", "s.ptd"], "filecord: error: "),
    ]:
        r = run(*command, cwd=files)
        assert r.returncode == 1, (command, r.stderr)
        assert r.stderr.splitlines()[0] == prefix + message, command
        assert "internal error" not in r.stderr
    assert sorted(os.listdir(files)) == before
    from safetensors import SafetensorError, safe_open

    with pytest.raises(SafetensorError), safe_open(str(files / "s.safetensors"), "numpy"):
        pass


# --- a Hugging Face folder: merge and reshard keep it loadable ---------------------------------

@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from tests.support.hf_models import spm_tokenizer, tiny_model

    model = tiny_model(tmp_path_factory.mktemp("hf") / "ckpt")
    # SentencePiece's default normalizer table (~100 KB, as the Hub's .model files carry one):
    # the carry test needs a tokenizer larger than its file system's slack
    spm_tokenizer(model, normalization="nmt_nfkc")
    return model


def _logits(folder: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        out = model(torch.tensor([[1, 5, 9, 30, 77, 2]])).logits
    return np.asarray(out.numpy())


@pytest.mark.slow
def test_merged_and_resharded_folders_load_with_from_pretrained_and_give_the_same_logits(
    hf: Path, tmp_path: Path,
) -> None:
    carried = ["config.json", "generation_config.json", "tokenizer.model",
               "tokenizer_config.json"]
    assert sorted(p.name for p in hf.iterdir() if not p.name.endswith(".safetensors")
                  and p.name != "model.safetensors.index.json") == carried
    index = str(hf / "model.safetensors.index.json")
    r = run("merge", index, "-o", "one/model.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (
        "carried 4 non-weight file(s) of the Hugging Face folder (--weights-only: none): "
        + ", ".join(carried))
    r = run("reshard", "one/model.safetensors", "-o", "rs", "--max-shard-size", "100KB", "-q",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    want = _logits(hf)
    for out in ("one", "rs"):
        for name in carried:
            assert (tmp_path / out / name).read_bytes() == (hf / name).read_bytes()
        assert np.array_equal(_logits(tmp_path / out), want), out
    r = run("verify", "rs/model.safetensors.index.json", "--load", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert run("verify", "rs", cwd=tmp_path).stdout.splitlines()[0] == (
        "ok: rs/model.safetensors.index.json: safetensors index, 6 file(s), 21 tensors (21 "
        "F32); every byte accounted for:")
    empty = run("verify", "ckpt-missing", cwd=tmp_path)
    assert empty.returncode == 1
    assert ("ok: transformers loaded LlamaForCausalLM from rs (115008 parameters; no weight "
            "missing, unexpected or mismatched)") in r.stdout.splitlines()


@pytest.mark.slow
def test_verify_load_of_an_index_loads_the_index_not_a_model_safetensors_beside_it(
    hf: Path, tmp_path: Path,
) -> None:
    """from_pretrained(folder) reads model.safetensors when there is one: verify of the index
    must not report that file's verdict as the index's."""
    import shutil

    good = tmp_path / "good"
    shutil.copytree(hf, good)
    st_numpy.save_file({"junk": np.zeros(3, np.float32)}, str(good / "model.safetensors"))
    r = run("verify", "good/model.safetensors.index.json", "--load", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("the index and its shards alone: from_pretrained would read the model.safetensors "
            "beside them") in r.stdout
    broken = tmp_path / "broken"  # an index of two shards that lacks layer 1
    broken.mkdir()
    shutil.copy(hf / "config.json", broken / "config.json")
    whole: dict[str, np.ndarray] = {}
    for shard in sorted(hf.glob("model-*.safetensors")):
        whole.update(st_numpy.load_file(str(shard)))
    kept = sorted(n for n in whole if ".layers.1." not in n)
    assert 0 < len(kept) < len(whole)
    halves = {"model-00001-of-00002.safetensors": kept[:len(kept) // 2],
              "model-00002-of-00002.safetensors": kept[len(kept) // 2:]}
    for shard, names in halves.items():
        st_numpy.save_file({n: whole[n] for n in names}, str(broken / shard))
    (broken / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {}, "weight_map": {n: s for s, ns in halves.items() for n in ns}}))
    r = run("merge", str(hf / "model.safetensors.index.json"), "-o",
            "broken/model.safetensors", "--weights-only", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # a complete model beside the incomplete index
    r = run("verify", "broken/model.safetensors.index.json", "--load", cwd=tmp_path)
    assert r.returncode == 1, r.stdout
    assert "transformers failed to load it" in r.stderr
    r = run("verify", "broken", cwd=tmp_path)
    assert r.returncode == 2
    assert "holds both model.safetensors.index.json and model.safetensors" in r.stderr


def test_weights_only_carries_nothing_and_a_differing_file_is_refused(
    hf: Path, tmp_path: Path,
) -> None:
    index = str(hf / "model.safetensors.index.json")
    r = run("merge", index, "-o", "w/model.safetensors", "--weights-only", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "w")) == ["model.safetensors"]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text("{}")
    r = run("merge", index, "-o", "x/model.safetensors", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"filecord merge: error: x/config.json exists and differs from "
                        f"{hf}/config.json; remove it, or give --weights-only to write the "
                        "weights alone\n")
    assert sorted(os.listdir(tmp_path / "x")) == ["config.json"]


def test_a_dry_run_says_what_it_would_carry_and_carries_nothing(hf: Path, tmp_path: Path) -> None:
    index = str(hf / "model.safetensors.index.json")
    dry = run("reshard", index, "-o", "new/rs", "-n", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1].startswith("would carry 4 non-weight file(s)")
    assert not (tmp_path / "new").exists()


def test_the_carried_files_are_outputs_of_the_weights_own_save(hf: Path, tmp_path: Path) -> None:
    """One plan, one journaled commit: the report (text and --json) names the carried files
    as outputs beside the weights, the dry run plans them too, and a consuming merge moves
    the shards while it copies the carried files and keeps them."""
    index = str(hf / "model.safetensors.index.json")
    carried = ["config.json", "generation_config.json", "tokenizer.model",
               "tokenizer_config.json"]
    dry = run("merge", index, "-o", "j/model.safetensors", "-n", "--json", cwd=tmp_path)
    real = run("merge", index, "-o", "j/model.safetensors", "--json", cwd=tmp_path)
    assert dry.returncode == real.returncode == 0, (dry.stderr, real.stderr)
    planned, done = json.loads(dry.stdout), json.loads(real.stdout)
    assert [o["path"] for o in done["outputs"]] == [
        "j/model.safetensors", *(f"j/{n}" for n in carried)]
    assert planned["outputs"] == done["outputs"]
    assert done["journal"] is True  # several outputs: one journaled transaction
    for n in carried:
        assert (tmp_path / "j" / n).read_bytes() == (hf / n).read_bytes()
    mine = tmp_path / "mine"
    mine.mkdir()
    for f in hf.iterdir():
        (mine / f.name).write_bytes(f.read_bytes())
    r = run("merge", "mine/model.safetensors.index.json", "-o", "c/model.safetensors",
            "--consume", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(mine)) == carried
    assert sorted(os.listdir(tmp_path / "c")) == sorted([*carried, "model.safetensors"])


@pytest.mark.root
def test_a_carry_that_does_not_fit_is_refused_with_the_weights_before_anything_is_written(
    hf: Path, tmp_path: Path,
) -> None:
    """The carried files count in the plan's space check: on a file system where the weights
    fit and the weights with the tokenizer do not, the dry run says so (exit 1) and the real
    run is refused before anything is written (exit 1); --weights-only fits."""
    index = str(hf / "model.safetensors.index.json")
    weights = sum((hf / n).stat().st_size for n in os.listdir(hf)
                  if n.endswith(".safetensors"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    size = weights + 96 * 1024  # the tokenizer model alone is larger than what is left
    assert (hf / "tokenizer.model").stat().st_size > 96 * 1024
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                   check=True)
    try:
        dry = run("merge", index, "-o", "mnt/out/model.safetensors", "-n", cwd=tmp_path)
        real = run("merge", index, "-o", "mnt/out/model.safetensors", cwd=tmp_path)
        left = os.listdir(mnt)
        alone = run("merge", index, "-o", "mnt/out/model.safetensors", "-n", "--weights-only",
                    cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert dry.returncode == 1, dry.stdout
    assert "DOES NOT FIT" in dry.stdout
    assert "would carry" not in dry.stdout
    assert real.returncode == 1
    assert "not enough free space" in real.stderr
    assert left == []
    assert alone.returncode == 0, alone.stdout
    assert alone.stdout.rstrip().endswith(": fits")


def test_a_shard_pattern_that_could_name_a_carried_file_is_a_usage_error(
    hf: Path, tmp_path: Path,
) -> None:
    index = str(hf / "model.safetensors.index.json")
    for pattern, why in [
        ("config{suffix}.json", "the shards' names must end in .safetensors"),
        ("../x{suffix}.safetensors", "without a directory part"),
        ("{suffix}", "names no file when the suffix is empty"),
        ("{x}{suffix}.safetensors", "may hold no braces but '{suffix}'"),
    ]:
        r = run("reshard", index, "-o", "out", "--pattern", pattern, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(f"filecord reshard: error: --pattern {pattern!r}: ")
        assert why in r.stderr
    assert os.listdir(tmp_path) == []


def test_a_reader_that_goes_away_after_the_commit_changes_no_exit_status(
    hf: Path, tmp_path: Path,
) -> None:
    """`merge ... | head -1`: the save and its carried files are committed before anything is
    printed, and the exit status stays 0; a report-only command (verify) whose reader went
    away ends as a filter SIGPIPE killed (141), with nothing on stderr."""
    index = str(hf / "model.safetensors.index.json")

    def gone(*args: str) -> tuple[int, bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "filecord.cli", *args], cwd=tmp_path,
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first write
        err = proc.stderr.read()
        return proc.wait(timeout=120), err

    assert gone("merge", index, "-o", "p/model.safetensors") == (0, b"")
    assert sorted(os.listdir(tmp_path / "p")) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.model",
        "tokenizer_config.json"]
    assert gone("verify", "p/model.safetensors") == (141, b"")


def test_a_bad_config_value_is_not_said_to_be_read_as_safetensors(
    hf: Path, tmp_path: Path,
) -> None:
    """config.json is the model folder's, not an input the output's suffix chose a format
    for: its error names the file and the key, without the suffix note."""
    folder = tmp_path / "k"
    folder.mkdir()
    for f in hf.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["rms_norm_eps"] = "1e-5"
    (folder / "config.json").write_text(json.dumps(config))
    r = run("convert", "k", "-o", "out/m.gguf", cwd=tmp_path)
    assert r.returncode == 1
    assert "config.json: rms_norm_eps" in r.stderr
    assert "rms_norm_eps: must be a positive number a float32 holds" in r.stderr
    assert "read as" not in r.stderr
    assert not (tmp_path / "out").exists()


# --- installs ----------------------------------------------------------------------------------

def test_a_missing_hf_package_names_every_missing_one_with_advice_for_a_checkout_and_pypi(
    tmp_path: Path,
) -> None:
    """Run with the hf packages hidden: one message names them all and both installs."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(  # None in sys.modules: "not installed"
        "import sys\nsys.modules['gguf'] = sys.modules['sentencepiece'] = None\n")
    code = ("from filecord.gguf._hf_vocab import _import\n"
            "try:\n    _import('gguf')\nexcept Exception as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**ENV, "PYTHONPATH": f"{hide}"
                       f"{os.pathsep}{SRC}"}, capture_output=True, text=True, check=False)
    assert r.stdout.strip() == (
        "reading this tokenizer needs the 'gguf' package; of the hf extra, gguf, sentencepiece "
        "are not installed: pip install gguf sentencepiece (or the extra: pip install -e "
        "'.[hf]' in a checkout of filecord, pip install 'filecord[hf]' from PyPI)"), r.stderr


def test_pyproject_license_is_an_spdx_string() -> None:
    import tomllib

    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())
    assert project["project"]["license"] == "BSD-3-Clause"
    assert project["build-system"]["requires"] == ["setuptools>=77"]


@pytest.mark.slow
def test_verify_load_has_llama_cpp_load_a_converted_model_whole_and_split(
    hf: Path, tmp_path: Path,
) -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    for out, extra, first in (("m.gguf", [], "m.gguf"),
                              ("s/m.gguf", ["--split-max-tensors", "8"],
                               "s/m-00001-of-00003.gguf")):
        r = run("convert", str(hf), "-o", out, "-q", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = run("verify", first, "--load", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        shards = 1 if not extra else 3
        assert lines[0] == (f"ok: {first}: gguf, {shards} file(s), 21 tensors (21 F32); every "
                            "byte accounted for:")
        assert "ok: gguf-py read 21 tensors at the offsets and sizes filecord found" in lines
        assert "ok: llama.cpp loaded the model: 320 tokens in its vocabulary, 64 embedding " \
            "width" in lines
