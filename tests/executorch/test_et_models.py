"""Real models, small configs, random weights, in the five ways ExecuTorch users export them.

Models: ``transformers``' Llama built from a config (one layer, hidden size 32), a convolution +
batch-norm network and an attention block of our own.  Configurations: XNNPACK with weights in
the program, ``external_constants=True``, the XNNPACK delegate's weights tagged external the way
ExecuTorch's LLM export does (``delegate_external_constants_pass_unlifted``), two tags, and no
delegate.  ExecuTorch writes every file; then for each of the 15 programs:

* the runtime loads it with its data (two tags: filecord's ``merge_data`` file, since the Python
  runtime takes one data file) and its output equals eager PyTorch;
* ``verify`` without the runtime passes with that data, and fails naming exactly the missing
  keys when the data file is absent, is another program's, or lacks a key (and the runtime
  fails on that last one too).

Each test prints its counts; the suite asserts them, so an empty enumeration cannot pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from et_helpers import run_program, write_cord

import filecord
import filecord.executorch as fe
from filecord.cli.executorch import summarize_pte
from filecord.errors import InsufficientSpaceError
from filecord.executorch import build_ptd, external_tensors, read_ptd, read_pte, verify

torch = pytest.importorskip("torch", reason="interop tests need torch")
pytest.importorskip("executorch", reason="interop tests need executorch")

pytestmark = pytest.mark.interop

CONFIGS = ("xnnpack", "external", "xnnpack_external", "two_tags", "portable")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
MODELS = ("convbn", "attention") + (("llama",) if HAS_TRANSFORMERS else ())


@dataclass
class Case:
    model: str
    config: str
    pte: Path
    ptds: dict[str, Path]  # file name -> path, as ExecuTorch wrote them
    runnable_data: Path | None  # the one data file the runtime loads (merged for two tags)
    manager: Any
    module: Any
    x: Any
    expected: Any


def _conv_bn() -> Any:
    class ConvBN(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.bn = torch.nn.BatchNorm2d(8)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    m = ConvBN().eval()
    with torch.no_grad():  # random statistics, so batch-norm folding is really exercised
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, torch.randn(1, 3, 8, 8)


def _attention() -> Any:
    class Attention(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, dim: int = 16, heads: int = 2) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.out = torch.nn.Linear(dim, dim)
            self.norm = torch.nn.LayerNorm(dim)

        def forward(self, x: Any) -> Any:
            b, n, d = x.shape
            q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
            q, k, v = (t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
                       for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, n, d)
            return x + self.out(y)

    return Attention().eval(), torch.randn(1, 6, 16)


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )

    class Llama(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.m = LlamaForCausalLM(config).eval()

        def forward(self, ids: Any) -> Any:
            return self.m(input_ids=ids, use_cache=False).logits

    return Llama().eval(), torch.randint(0, 64, (1, 8))


BUILDERS: dict[str, Callable[[], Any]] = {
    "convbn": _conv_bn, "attention": _attention, "llama": _llama,
}


def _export(model: str, config: str, module: Any, x: Any, out: Path) -> Case:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import (
        delegate_external_constants_pass_unlifted,
    )
    from torch.export import export

    ep = export(module, (x,))
    options: dict[str, Any] = {}
    if config == "xnnpack_external":
        graph = ep.module()
        delegate_external_constants_pass_unlifted(graph, gen_tag_fn=lambda _node: "model")
        ep = export(graph, (x,))
        options["external_constants"] = lambda _node: "model"
    elif config == "external":
        options["external_constants"] = True
    elif config == "two_tags":
        options["external_constants"] = lambda n: "weights" if "weight" in n.name else "rest"
    xnn = config.startswith("xnnpack")
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()] if xnn else None)
    manager = edge.to_executorch(ExecutorchBackendConfig(**options))
    d = out / f"{model}_{config}"
    d.mkdir()
    manager.save(str(d / "m.pte"))
    manager.write_tensor_data_to_file(str(d))
    ptds = {p.name: p for p in sorted(d.glob("*.ptd"))}
    runnable = next(iter(ptds.values())) if len(ptds) == 1 else None
    if len(ptds) > 1:
        merged_dir = d / "merged"
        merged_dir.mkdir()
        fe.from_manager(manager).save(merged_dir / "m.pte", merge_data=True)
        runnable = merged_dir / "m.ptd"
    with torch.no_grad():
        expected = module(x)
    return Case(model, config, d / "m.pte", ptds, runnable, manager, module, x, expected)


# The tests that read ``cases`` share one worker (the suite runs ``--dist loadgroup``): the
# fixture exports 15 programs (minutes on 2 cores), which each worker drawing one of them
# would otherwise do again.  Its managers and modules are live objects, not files another
# process could read.
ONE_EXPORT = pytest.mark.xdist_group("et_models_cases")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Case]:
    out = tmp_path_factory.mktemp("models")
    result = {}
    start = time.monotonic()
    for model in MODELS:
        torch.manual_seed(0)
        module, x = BUILDERS[model]()
        for config in CONFIGS:
            result[(model, config)] = _export(model, config, module, x, out)
    print(f"exported {len(result)} programs in {time.monotonic() - start:.1f} s")
    return result


def _keys(paths: list[Path]) -> set[str]:
    return {k for p in paths for k in read_ptd(p).entries}


def _close(y: Any, expected: Any) -> bool:
    return bool(torch.allclose(y, expected, atol=1e-4, rtol=1e-4))


def test_transformers_is_installed_for_the_llama_cases() -> None:
    # pyproject's dev extra installs it; without it the Llama cases would silently vanish.
    assert HAS_TRANSFORMERS, "install the dev extra: transformers is needed for the Llama model"


@ONE_EXPORT
@pytest.mark.slow  # started first: its group exports for minutes
def test_each_program_runs_and_verify_agrees(cases: dict[tuple[str, str], Case]) -> None:
    counts = {"runs": 0, "verify_pass": 0, "needs_data": 0, "absent": 0, "wrong": 0,
              "missing_key": 0, "runtime_rejects_missing_key": 0}
    for (model, config), c in cases.items():
        label = f"{model}/{config}"
        data = [] if c.runnable_data is None else [c.runnable_data]
        y = run_program(c.pte, c.x, c.runnable_data)
        assert _close(y, c.expected), label
        counts["runs"] += 1
        ok = verify(c.pte, [str(p) for p in data], runtime=False)
        assert ok.ok, (label, ok.problems)
        assert ok.runtime.status == "skipped"
        counts["verify_pass"] += 1
        if config in ("external", "two_tags", "xnnpack_external"):
            assert c.ptds, label
        else:
            assert not c.ptds, label
        summary = summarize_pte(read_pte(c.pte))
        listed = {n["key"]: n["size"] for n in summary["needs_from_data_files"]}
        if not c.ptds:
            assert listed == {}, label  # inspect: "needs no data file"
            continue
        needed = _keys(list(c.ptds.values()))
        counts["needs_data"] += 1
        assert {n.key for n in ok.needs} >= needed, label
        # inspect lists exactly the keys ExecuTorch put in data files, with their sizes.
        assert set(listed) == needed, label
        sizes = {k: e.size for p in c.ptds.values() for k, e in read_ptd(p).entries.items()}
        assert all(listed[k] is None or listed[k] <= sizes[k] for k in needed), label

        absent = verify(c.pte, [], runtime=False)
        assert {n.key for n in absent.missing} == needed, label
        assert [p.where for p in absent.problems] == [f"{c.pte}: data"], label
        assert "no data file was given" in absent.problems[0].message
        counts["absent"] += 1

        other_model = next(m for m in MODELS if m != model)
        other = cases[(other_model, config)]
        wrong = verify(c.pte, [str(p) for p in other.ptds.values()], runtime=False)
        assert not wrong.ok, label
        assert {n.key for n in wrong.missing} == needed - _keys(list(other.ptds.values()))
        counts["wrong"] += 1

        assert c.runnable_data is not None
        entries = dict(read_ptd(c.runnable_data).entries)
        dropped = next(iter(entries))
        del entries[dropped]
        lacking = write_cord(build_ptd(entries), c.pte.parent / "lacking.ptd")
        partial = verify(c.pte, [str(lacking)], runtime=False)
        assert [n.key for n in partial.missing] == [dropped], label
        assert f"'{dropped}'" in partial.problems[-1].message
        counts["missing_key"] += 1
        with pytest.raises(RuntimeError):
            run_program(c.pte, c.x, lacking)
        counts["runtime_rejects_missing_key"] += 1
    print(counts)
    n = len(MODELS)
    assert counts == {"runs": 5 * n, "verify_pass": 5 * n, "needs_data": 3 * n, "absent": 3 * n,
                      "wrong": 3 * n, "missing_key": 3 * n,
                      "runtime_rejects_missing_key": 3 * n}


@ONE_EXPORT
@pytest.mark.slow  # started first: its group exports for minutes
def test_verify_names_the_delegate_keys_of_an_xnnpack_program(
    cases: dict[tuple[str, str], Case],
) -> None:
    """The delegate's keys are hashes read from its payload; ExecuTorch's own data file holds
    exactly the ones not in the program, with the sizes the payload asks for."""
    for model in MODELS:
        c = cases[(model, "xnnpack_external")]
        (ptd,) = c.ptds.values()
        result = verify(c.pte, [str(ptd)], runtime=False)
        entries = read_ptd(ptd).entries
        from_delegate = {n.key: n.size for n in result.needs if n.needed_by == "XnnpackBackend"}
        in_program = read_pte(c.pte).named_data
        assert set(entries) <= set(from_delegate) | {n.key for n in result.needs}
        assert set(from_delegate) <= set(entries) | set(in_program), model
        for key, size in from_delegate.items():
            if key in entries:
                assert entries[key].size >= (size or 0), (model, key)


@ONE_EXPORT
@pytest.mark.slow  # started first: its group exports for minutes
def test_cli_verify_summary_and_structure_only_warning(
    cases: dict[tuple[str, str], Case], tmp_path: Path
) -> None:
    c = cases[("convbn", "external")]
    alone = tmp_path / c.pte.name  # without the data file ExecuTorch wrote beside it
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "filecord.cli", "verify", *args],
                              capture_output=True, text=True, env=env, check=False)

    shutil.copyfile(c.pte, alone)
    missing = cli(str(alone), "--no-runtime")
    assert missing.returncode == 1
    assert missing.stderr.count("filecord verify:") == 1, missing.stderr
    assert "9 named-data key(s) the program needs at load time, no data file was given" in (
        missing.stderr)
    assert "_default_external_constant.ptd" in missing.stderr
    (ptd,) = c.ptds.values()
    as_json = json.loads(cli(str(alone), "--no-runtime", "--json").stdout)
    assert as_json["ok"] is False
    assert as_json["missing"] == list(read_ptd(ptd).entries)
    assert [n["key"] for n in as_json["needs"]] == as_json["missing"]
    passed = cli(str(alone), "--data", str(ptd), "--no-runtime")
    assert passed.returncode == 0, passed.stderr
    beside = cli(str(c.pte), "--no-runtime")  # the data file ExecuTorch wrote beside it
    assert beside.returncode == 0, beside.stderr
    assert f"note: using {ptd}, found beside the program" in beside.stdout
    assert "NOT loaded in the runtime: a structure pass does not show that the program runs" in (
        passed.stdout)


@ONE_EXPORT
@pytest.mark.slow  # started first: its group exports for minutes
def test_recipe_writes_the_data_file_a_llama_program_needs(
    cases: dict[tuple[str, str], Case], tmp_path: Path
) -> None:
    """``save_state_dict(model.state_dict())`` misses the rotary buffers (non-persistent), so
    the runtime cannot load the program; ``save_external_data`` takes the keys from the program
    and the tensors from the module's parameters and buffers, and the program runs."""
    from filecord.executorch import save_external_data, save_state_dict

    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    c = cases[("llama", "external")]
    keys = external_tensors(c.pte)
    state = c.module.state_dict()
    not_in_state = sorted(set(keys) - set(state))
    assert not_in_state == ["m.model.rotary_emb.inv_freq", "m.model.rotary_emb.original_inv_freq"]

    from_state = tmp_path / "state.ptd"
    save_state_dict(from_state, state)
    result = verify(c.pte, [str(from_state)], runtime=False)
    assert sorted(n.key for n in result.missing) == not_in_state
    with pytest.raises(RuntimeError):
        run_program(c.pte, c.x, from_state)

    recipe = tmp_path / "model.ptd"
    report = save_external_data(recipe, c.module, c.pte, consume=True)
    assert [a.action for a in report.file_actions()] == ["moved"]  # its own scratch, adopted
    assert verify(c.pte, [str(recipe)], runtime=False).ok
    assert _close(run_program(c.pte, c.x, recipe), c.expected)
    # The same keys, layouts and bytes as ExecuTorch's own data file.
    (theirs,) = c.ptds.values()
    ours_entries, their_entries = read_ptd(recipe).entries, read_ptd(theirs).entries
    assert list(ours_entries) == list(keys)
    assert set(ours_entries) == set(their_entries)
    for key, entry in their_entries.items():
        assert ours_entries[key].layout == entry.layout
        assert ours_entries[key].data.to_bytes() == entry.data.to_bytes(), key
    # The README's form: a Program from the manager, the program saved alone, then its data.
    program = fe.from_manager(c.manager)
    assert list(external_tensors(program)) == list(keys)
    filecord.save(tmp_path / "model.pte", program.pte)
    save_external_data(tmp_path / "readme.ptd", c.module, program, consume=True)
    assert (tmp_path / "readme.ptd").read_bytes() == recipe.read_bytes()
    assert _close(run_program(tmp_path / "model.pte", c.x, tmp_path / "readme.ptd"), c.expected)


@ONE_EXPORT
@pytest.mark.slow  # started first: its group exports for minutes
def test_recipe_refuses_a_module_that_is_not_the_exported_one(
    cases: dict[tuple[str, str], Case], tmp_path: Path
) -> None:
    from filecord.executorch import save_external_data

    c = cases[("convbn", "external")]
    other, _x = _attention()
    with pytest.raises(KeyError, match=r"not parameters or buffers of the module: 'conv\.weight'"):
        save_external_data(tmp_path / "x.ptd", other, c.pte)
    wider, _ = _conv_bn()
    wider.head = torch.nn.Linear(8, 5)
    with pytest.raises(ValueError, match=r"'head.weight': the module's tensor is FLOAT\[5, 8\]"):
        save_external_data(tmp_path / "x.ptd", wider, c.pte)
    assert not (tmp_path / "x.ptd").exists()


def test_export_session_is_accepted(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
    from executorch.export import ExportRecipe
    from executorch.export import export as et_export

    module, x = _conv_bn()
    session = et_export(module, [(x,)], ExportRecipe.get_recipe(XNNPackRecipeType.FP32))
    report = fe.save(tmp_path / "s.pte", session)
    expected = session.get_executorch_program_manager().buffer
    assert (tmp_path / "s.pte").read_bytes() == expected
    assert report.sizes == (len(expected),)
    assert _close(run_program(tmp_path / "s.pte", x), module(x))
    with pytest.raises(ValueError, match=r"a program is saved to a \.pte path"):
        fe.save(tmp_path / "s.bin", session)
    assert not (tmp_path / "s.bin").exists()


def _fskit() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fskit", Path(__file__).resolve().parents[1] / "fsmatrix" / "fskit.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.root
def test_space_check_accepts_a_program_that_fits_a_14_mib_tmpfs(tmp_path: Path) -> None:
    """A 13.94 MB program onto a 14 MiB tmpfs fits (the old fixed 1 MiB margin refused it);
    one that is larger than the free space is refused before anything is created."""
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import export

    fskit = _fskit()
    reason = fskit.unavailable("tmpfs")
    if reason is not None:
        pytest.skip(f"tmpfs: {reason}")

    def program(n_in: int, n_out: int) -> Any:
        torch.manual_seed(0)
        lin = torch.nn.Linear(n_in, n_out).eval()
        return to_edge_transform_and_lower(export(lin, (torch.randn(1, n_in),))).to_executorch()

    fits = program(1865, 1868)
    size = len(fits.buffer)
    assert 13_940_000 < size < 13_950_000
    with fskit.mounted("tmpfs", 14 * 1024 * 1024, base=tmp_path) as small:
        free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
        assert free == 14 * 1024 * 1024
        report = fe.save(small / "m.pte", fits)
        assert (small / "m.pte").read_bytes() == fits.buffer
        assert report.peaks[0].needed <= free
        os.unlink(small / "m.pte")

        too_big = program(1920, 1920)
        assert len(too_big.buffer) > free
        with pytest.raises(InsufficientSpaceError, match=r"are free$") as info:
            fe.save(small / "m.pte", too_big)
        assert "consume" not in str(info.value)  # every piece is in memory: nothing to move
        assert os.listdir(small) == []
