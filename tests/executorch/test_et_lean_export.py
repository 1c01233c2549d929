"""``lean_export()``: every constant path gives the bytes ExecuTorch's own flow gives, a weight
that is a file mapping reaches the data file by a kernel copy of that file (never through a
``bytes``), the patches come off exactly, and untested ExecuTorch versions are refused."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("executorch")
pytest.importorskip("torch")

import torch
from et_helpers import run_program
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
from executorch.exir.passes.external_constants_pass import (
    delegate_external_constants_pass_unlifted,
)
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from torch.export import export

import filecord.executorch as fe
from filecord._io import syscalls as _sys
from filecord.executorch import _lean, _storage

pytestmark = pytest.mark.interop

Make = Callable[[], Any]


# --- models -----------------------------------------------------------------------------------


class TwoLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Shared(torch.nn.Module):
    """Two names with the same bytes (deduplicated) and one other."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        w = torch.randn(16, 16)
        self.register_buffer("left", w.clone())
        self.register_buffer("right", w.clone())
        self.register_buffer("other", torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.left + x @ self.right - x @ self.other


class Odd(torch.nn.Module):
    """A 0-d constant, an empty one, an offset view and a transposed (non-contiguous) view."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        base = torch.randn(40, 8)
        self.register_buffer("scalar", torch.tensor(1.5))
        self.register_buffer("empty", torch.empty(0))
        self.register_buffer("offset", base[8:16])  # shares base's storage, at an offset
        self.register_buffer("transposed", torch.randn(8, 8).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.offset.t() + x @ self.transposed
        return y * self.scalar + self.empty.sum()


class Counter(torch.nn.Module):
    """A mutable buffer with an initial value (ExecuTorch's mutable segment)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(8, dtype=torch.float32))
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(1)
        return self.lin(x) + self.state


class Convs(torch.nn.Module):
    """Weights XNNPACK computes: channels-last conv weights (one over 1 MiB: a scratch file),
    a depthwise one (in/out swapped) and a half-precision linear it keeps as it is."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.big = torch.nn.Conv2d(128, 256, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(256, 256, 3, padding=1, groups=256)
        self.small = torch.nn.Conv2d(256, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(self.depthwise(self.big(x)))


def _tagged(gm: torch.nn.Module, x: torch.Tensor, tag_of: Callable[[Any], str]) -> Any:
    delegate_external_constants_pass_unlifted(module=gm, gen_tag_fn=tag_of)
    return export(gm, (x,))


def flows() -> dict[str, tuple[Make, torch.Tensor]]:
    """name -> (a fresh manager from the same model each call, an input)."""
    x64, x16, x8 = torch.randn(2, 64), torch.randn(3, 16), torch.randn(2, 8)
    ximg = torch.randn(1, 128, 6, 6)
    two, shared, odd, counter, convs = (TwoLinear().eval(), Shared().eval(), Odd().eval(),
                                        Counter().eval(), Convs().eval())
    external = ExecutorchBackendConfig(external_constants=True)

    def by_layer(node: Any) -> str:
        return "first" if "a" in str(node.target).split(".")[0] else "second"

    def xnn_tagged(m: torch.nn.Module, x: torch.Tensor, tag: Callable[[Any], str]) -> Any:
        ep = _tagged(export(m, (x,)).module(), x, tag)
        return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch(
            external)

    return {
        "portable_in_pte": (lambda: to_edge(export(two, (x64,))).to_executorch(), x64),
        "portable_external": (lambda: to_edge(export(two, (x64,))).to_executorch(external),
                              x64),
        "portable_two_tags": (lambda: to_edge(export(two, (x64,))).to_executorch(
            ExecutorchBackendConfig(external_constants=lambda n: (
                "first" if str(n.target).startswith(("a", "p_a")) else "second"))), x64),
        "portable_shared_external": (lambda: to_edge(export(shared, (x16,))).to_executorch(
            external), x16),
        "portable_shared_in_pte": (lambda: to_edge(export(shared, (x16,))).to_executorch(), x16),
        "portable_odd_views": (lambda: to_edge(export(odd, (x8,))).to_executorch(), x8),
        "portable_odd_external": (lambda: to_edge(export(odd, (x8,))).to_executorch(external),
                                  x8),
        "portable_mutable": (lambda: to_edge(export(counter, (x8,))).to_executorch(
            ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])])), x8),
        "xnnpack_in_pte": (lambda: to_edge_transform_and_lower(
            export(two, (x64,)), partitioner=[XnnpackPartitioner()]).to_executorch(), x64),
        "xnnpack_ptd": (lambda: xnn_tagged(two, x64, lambda n: "model"), x64),
        "xnnpack_two_tags": (lambda: xnn_tagged(two, x64, by_layer), x64),
        "xnnpack_shared": (lambda: xnn_tagged(shared, x16, lambda n: "model"), x16),
        "xnnpack_computed": (lambda: xnn_tagged(convs, ximg, lambda n: "model"), ximg),
    }


FLOWS = flows()


def save_executorch(manager: Any, out: Path) -> dict[str, bytes]:
    out.mkdir()
    manager.save(str(out / "m.pte"))
    manager.write_tensor_data_to_file(str(out))
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def save_filecord(manager: Any, out: Path) -> dict[str, bytes]:
    out.mkdir()
    fe.save(out / "m.pte", manager)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """ExecuTorch's unmodified flow, each program saved by ExecuTorch."""
    root = tmp_path_factory.mktemp("reference")
    return {name: save_executorch(make(), root / name) for name, (make, _) in FLOWS.items()}


# --- byte identity --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FLOWS))
def test_lean_export_is_byte_identical_to_executorch(
    name: str, reference: dict[str, dict[str, bytes]], tmp_path: Path,
) -> None:
    make, _ = FLOWS[name]
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = make()
    theirs = save_executorch(manager, tmp_path / "executorch_save")  # ExecuTorch's own writer
    ours = save_filecord(manager, tmp_path / "filecord_save")
    expected = reference[name]
    assert set(ours) == set(expected) == set(theirs)
    for file, data in expected.items():
        assert theirs[file] == data, file
        assert ours[file] == data, file


def test_flows_cover_every_constant_path(reference: dict[str, dict[str, bytes]]) -> None:
    """The identity above is not vacuous: the flows put data in every place it can go."""
    files = {name: set(saved) for name, saved in reference.items()}
    assert files["portable_in_pte"] == {"m.pte"}
    assert files["portable_external"] == {"m.pte", "_default_external_constant.ptd"}
    assert files["portable_two_tags"] == {"m.pte", "first.ptd", "second.ptd"}
    assert files["xnnpack_ptd"] == {"m.pte", "model.ptd"}
    assert files["xnnpack_two_tags"] == {"m.pte", "first.ptd", "second.ptd"}
    shared = fe.read_ptd(_write(reference["portable_shared_external"],
                                "_default_external_constant.ptd"))
    assert len(shared.entries) == 3
    assert len(shared.segments) == 2  # two names share one buffer


def _write(saved: dict[str, bytes], name: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / name
    path.write_bytes(saved[name])
    return path


def test_computed_weights_go_through_scratch_files_that_are_gone_after_the_save(
    tmp_path: Path,
) -> None:
    make, _ = FLOWS["xnnpack_computed"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with fe.lean_export(scratch_dir=str(scratch)):
        manager = make()
    assert len(os.listdir(scratch)) >= 1  # the channels-last 1.2 MiB conv weight, at least
    (tmp_path / "out").mkdir()
    fe.save(tmp_path / "out" / "m.pte", manager, consume=True)
    del manager
    import gc

    gc.collect()
    assert os.listdir(scratch) == []


# --- the runtime ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["portable_external", "xnnpack_ptd", "xnnpack_computed",
                                  "portable_odd_views"])
def test_runtime_runs_a_lean_export_like_eager(name: str, tmp_path: Path) -> None:
    make, x = FLOWS[name]
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = make()
    fe.save(tmp_path / "m.pte", manager)
    ptds = sorted(tmp_path.glob("*.ptd"))
    got = run_program(tmp_path / "m.pte", x, ptds[0] if ptds else None)
    expected = manager.exported_program().module()(x) if name == "portable_odd_views" else None
    module = {"portable_external": TwoLinear, "xnnpack_ptd": TwoLinear,
              "xnnpack_computed": Convs, "portable_odd_views": Odd}[name]
    eager = module().eval()(x) if expected is None else expected
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)


# --- no weight through a bytes ------------------------------------------------------------------


class KernelCopies(_sys.Backend):
    """Records which descriptor is which file, and every range the kernel copied."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.copied: list[tuple[str, int, int]] = []  # (source path, offset, length)

    def open(self, path: str, flags: int, mode: int) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = os.path.realpath(path)
        return fd

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "copy_file_range":
            src, _dst, count, src_off, _ = args
            self.copied.append((self.paths.get(src, "?"), src_off, count))
        elif op == "sendfile":
            _dst, src, src_off, count = args
            self.copied.append((self.paths.get(src, "?"), src_off, count))
        elif op == "clone_range":
            src, src_off, length, _dst, _ = args
            self.copied.append((self.paths.get(src, "?"), src_off, length))


class Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2048, 2048, bias=False)  # 16 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _mmapped_wide(tmp_path: Path) -> tuple[Wide, Path]:
    ckpt = tmp_path / "weights.pt"
    torch.manual_seed(4)
    torch.save({"lin.weight": torch.randn(2048, 2048)}, ckpt)
    with torch.device("meta"):
        model = Wide()
    model.load_state_dict(torch.load(ckpt, mmap=True, weights_only=True), assign=True)
    return model.eval(), ckpt


def _never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _storage.ref_type()

    def refuse(self: Any) -> bytes:
        raise AssertionError(f"a storage was read into bytes whole: {self!r}")

    monkeypatch.setattr(ref, "to_bytes", refuse)
    real_prefix = ref.prefix
    monkeypatch.setattr(ref, "prefix", lambda self, n: (
        real_prefix(self, n) if n <= 64 else refuse(self)))


@pytest.mark.parametrize("flow", ["portable", "xnnpack"])
def test_a_mapped_weight_reaches_the_ptd_as_a_kernel_copy_of_its_file(
    flow: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, ckpt = _mmapped_wide(tmp_path)
    weight = model.lin.weight
    x = torch.randn(1, 2048)
    _never_whole(monkeypatch)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        if flow == "portable":
            manager = to_edge(export(model, (x,))).to_executorch(
                ExecutorchBackendConfig(external_constants=True))
        else:
            ep = _tagged(export(model, (x,)).module(), x, lambda n: "model")
            manager = to_edge_transform_and_lower(
                ep, partitioner=[XnnpackPartitioner()]).to_executorch(
                ExecutorchBackendConfig(external_constants=True))
    out = tmp_path / "out"
    out.mkdir()
    with _sys.use(KernelCopies()) as seen:
        fe.save(out / "m.pte", manager)
    size = weight.untyped_storage().nbytes()
    from_ckpt = sum(n for path, _, n in seen.copied if path == os.path.realpath(ckpt))
    assert from_ckpt >= size, seen.copied  # the whole weight, copied by the kernel
    ptd = next(out.glob("*.ptd"))
    blob = ptd.read_bytes()
    raw = _storage.storage_ref(weight.untyped_storage()).view
    at = blob.find(raw[:4096].tobytes())
    assert at > 0
    assert blob[at:at + size] == raw.tobytes()
    torch.testing.assert_close(run_program(out / "m.pte", x, ptd), model(x), rtol=1e-4,
                               atol=1e-4)


# --- the patches ----------------------------------------------------------------------------


def _patched_attributes() -> dict[str, object]:
    from executorch.backends.xnnpack.operators.node_visitor import NodeVisitor
    from executorch.exir.backend.backend_details import BackendDetails
    from executorch.exir.emit._emitter import _Emitter

    return {
        "emit": _Emitter.__dict__["_tensor_spec_to_evalue"],
        "copy": BackendDetails.__dict__["copy_exported_program_for_preprocess"],
        "xnnpack": NodeVisitor.__dict__["get_serialized_buffer_index"],
    }


def test_patches_are_in_place_only_inside_the_block_and_restored_exactly() -> None:
    before = _patched_attributes()
    with fe.lean_export():
        inside = _patched_attributes()
        assert all(inside[k] is not before[k] for k in before)
    after = _patched_attributes()
    assert all(after[k] is before[k] for k in before)


def test_patches_are_restored_when_the_block_raises() -> None:
    before = _patched_attributes()
    with pytest.raises(KeyError, match="boom"), fe.lean_export():
        raise KeyError("boom")
    assert all(_patched_attributes()[k] is before[k] for k in before)
    with fe.lean_export():  # and it can be entered again
        pass


def test_nested_or_concurrent_blocks_are_refused() -> None:
    before = _patched_attributes()
    with fe.lean_export():
        with pytest.raises(fe.LeanExportError, match="already active"), fe.lean_export():
            pass
        errors: list[BaseException] = []

        def other() -> None:
            try:
                with fe.lean_export():
                    pass
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1
        assert isinstance(errors[0], fe.LeanExportError)
        assert _patched_attributes()["emit"] is not before["emit"]  # still ours, untouched
    assert all(_patched_attributes()[k] is before[k] for k in before)


@pytest.mark.parametrize("version", ["1.5.0", "1.6.0", None])
def test_an_untested_executorch_is_refused_before_anything_is_patched(
    version: str | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _patched_attributes()
    monkeypatch.setattr(_lean, "executorch_version", lambda: version)
    refused = pytest.raises(fe.LeanExportError, match=r"tested with executorch 1\.5\.1")
    with refused as info, fe.lean_export():
        pytest.fail("the block must not run")
    assert ("not installed" if version is None else f"version {version}") in str(info.value)
    assert all(_patched_attributes()[k] is before[k] for k in before)


def test_the_installed_version_is_a_tested_one() -> None:
    assert _lean.executorch_version() in _lean.TESTED_VERSIONS
