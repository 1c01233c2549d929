"""``lean_export()``: every constant path gives the bytes ExecuTorch's own flow gives, a weight
that is a file mapping reaches the data file by a kernel copy of that file (never through a
``bytes``), the patches come off exactly, and untested ExecuTorch versions are refused."""

from __future__ import annotations

import hashlib
import os
import threading
import time
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

import filecord
import filecord.executorch as fe
import filecord.safetensors
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError
from filecord.executorch import _lean, _storage, adapter
from filecord.executorch._mapped import MappedFiles
from filecord_testing import built_once

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


class Carved(torch.nn.Module):
    """Parameters that are views at offsets into one larger tensor (as a loader that maps a
    whole file into one storage would make them): delegated, each must still be its own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        base = torch.randn(5000)
        self.w = torch.nn.Parameter(base[100:100 + 32 * 64].view(32, 64))
        self.b = torch.nn.Parameter(base[3000:3032])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.w, self.b)


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
    a small depthwise one (in/out swapped: kept as bytes) and a 1x1 one (its own storage)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.big = torch.nn.Conv2d(128, 256, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(256, 256, 3, padding=1, groups=256)
        self.small = torch.nn.Conv2d(256, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(self.depthwise(self.big(x)))


class Quantizable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.lin = torch.nn.Linear(512, 1024)
        self.conv = torch.nn.Conv2d(8, 16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), self.conv(y)


def _quantized(*, dynamic: bool) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """XNNPACK's quantizer (per channel, static or dynamic): int8 weights and their scales."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    args = (torch.randn(2, 512), torch.randn(1, 8, 8, 8))
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
    prepared = prepare_pt2e(export(Quantizable().eval(), args).module(), quantizer)
    prepared(*args)
    return convert_pt2e(prepared), args


def _tagged(gm: torch.nn.Module, x: torch.Tensor, tag_of: Callable[[Any], str]) -> Any:
    delegate_external_constants_pass_unlifted(module=gm, gen_tag_fn=tag_of)
    return export(gm, (x,))


def flows() -> dict[str, tuple[Make, torch.Tensor]]:
    """name -> (a fresh manager from the same model each call, an input)."""
    x64, x16, x8 = torch.randn(2, 64), torch.randn(3, 16), torch.randn(2, 8)
    ximg = torch.randn(1, 128, 6, 6)
    two, shared, odd, counter, convs = (TwoLinear().eval(), Shared().eval(), Odd().eval(),
                                        Counter().eval(), Convs().eval())
    carved = Carved().eval()
    external = ExecutorchBackendConfig(external_constants=True)

    def by_layer(node: Any) -> str:
        return "first" if "a" in str(node.target).split(".")[0] else "second"

    def xnn_tagged(m: torch.nn.Module, x: torch.Tensor, tag: Callable[[Any], str]) -> Any:
        ep = _tagged(export(m, (x,)).module(), x, tag)
        return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch(
            external)

    static, qargs = _quantized(dynamic=False)
    dynamic, _ = _quantized(dynamic=True)

    def xnn(gm: Any, args: tuple[torch.Tensor, ...]) -> Any:
        return to_edge_transform_and_lower(
            export(gm, args), partitioner=[XnnpackPartitioner()]).to_executorch()

    return {
        "xnnpack_quantized_static": (lambda: xnn(static, qargs), qargs[0]),
        "xnnpack_quantized_dynamic": (lambda: xnn(dynamic, qargs), qargs[0]),
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
        "xnnpack_carved_views": (lambda: to_edge_transform_and_lower(
            export(carved, (x64,)), partitioner=[XnnpackPartitioner()]).to_executorch(), x64),
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
    """ExecuTorch's unmodified flow, each program saved by ExecuTorch (once per session: the
    byte-identity cases below are spread over the workers, and each would export all the
    flows again)."""
    def build(root: Path) -> None:
        for name, (make, _) in FLOWS.items():
            save_executorch(make(), root / name)

    root = built_once(tmp_path_factory, "lean-export-reference", build)
    return {name: {p.name: p.read_bytes() for p in sorted((root / name).iterdir())}
            for name in FLOWS}


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
                                  "portable_odd_views", "xnnpack_carved_views"])
def test_runtime_runs_a_lean_export_like_eager(name: str, tmp_path: Path) -> None:
    make, x = FLOWS[name]
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = make()
    fe.save(tmp_path / "m.pte", manager)
    ptds = sorted(tmp_path.glob("*.ptd"))
    got = run_program(tmp_path / "m.pte", x, ptds[0] if ptds else None)
    expected = manager.exported_program().module()(x) if name == "portable_odd_views" else None
    module = {"portable_external": TwoLinear, "xnnpack_ptd": TwoLinear,
              "xnnpack_computed": Convs, "portable_odd_views": Odd,
              "xnnpack_carved_views": Carved}[name]
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


def _mmapped_wide(tmp_path: Path, how: str) -> tuple[Wide, Path]:
    torch.manual_seed(4)
    weight = torch.randn(2048, 2048)
    with torch.device("meta"):
        model = Wide()
    if how == "torch.load":
        ckpt = tmp_path / "weights.pt"
        torch.save({"lin.weight": weight}, ckpt)
        state = torch.load(ckpt, mmap=True, weights_only=True)
    elif how == "filecord.safetensors":
        ckpt = tmp_path / "model.safetensors"
        filecord.safetensors.save_file({"lin.weight": weight}, str(ckpt))
        state = filecord.safetensors.load_mapped(tmp_path)
    else:
        ckpt = tmp_path / "weights.bin"
        ckpt.write_bytes(weight.numpy().tobytes())
        state = {"lin.weight": torch.from_file(str(ckpt), size=weight.numel()).view(2048, 2048)}
    model.load_state_dict(state, assign=True)
    return model.eval(), ckpt


def _never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _storage.ref_type()

    def refuse(self: Any) -> bytes:
        raise AssertionError(f"a storage was read into bytes whole: {self!r}")

    monkeypatch.setattr(ref, "to_bytes", refuse)
    real_prefix = ref.prefix
    monkeypatch.setattr(ref, "prefix", lambda self, n: (
        real_prefix(self, n) if n <= 64 else refuse(self)))


@pytest.mark.parametrize(("flow", "how"), [("portable", "torch.load"), ("xnnpack", "torch.load"),
                                          ("portable", "torch.from_file"),
                                          ("xnnpack", "filecord.safetensors")])
def test_a_mapped_weight_reaches_the_ptd_as_a_kernel_copy_of_its_file(
    flow: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, ckpt = _mmapped_wide(tmp_path, how)
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
    from executorch.backends.aoti.aoti_backend import AotiBackend
    from executorch.backends.xnnpack.operators.node_visitor import NodeVisitor
    from executorch.exir.backend.backend_details import BackendDetails
    from executorch.exir.emit._emitter import _Emitter

    return {
        "emit": _Emitter.__dict__["_tensor_spec_to_evalue"],
        "copy": BackendDetails.__dict__["copy_exported_program_for_preprocess"],
        "xnnpack": NodeVisitor.__dict__["get_serialized_buffer_index"],
        "aoti_blob": AotiBackend.__dict__["load_weights_blob"],
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


def test_a_written_page_of_a_private_mapping_makes_the_save_stream_from_memory(
    tmp_path: Path,
) -> None:
    """A copy-on-write page holds what the tensor says, not the file: the file is not used."""
    model, ckpt = _mmapped_wide(tmp_path, "torch.from_file")
    with torch.no_grad():
        model.lin.weight[0, 0] = 42.0  # one private page now differs from the file
    x = torch.randn(1, 2048)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = to_edge(export(model, (x,))).to_executorch(
            ExecutorchBackendConfig(external_constants=True))
    reference = to_edge(export(model, (x,))).to_executorch(
        ExecutorchBackendConfig(external_constants=True))
    out = tmp_path / "out"
    out.mkdir()
    with _sys.use(KernelCopies()) as seen:
        fe.save(out / "m.pte", manager)
    assert [c for c in seen.copied if c[0] == os.path.realpath(ckpt)] == []
    expected = save_executorch(reference, tmp_path / "reference")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected


# --- AOTI's weights blob (CUDA, Metal) ---------------------------------------------------------


def test_an_aoti_weights_blob_stays_a_file_with_executorchs_digest(tmp_path: Path) -> None:
    """AOTI compiles a library plus a weights blob; ExecuTorch reads the blob into a bytes to
    hash and store it.  Under lean_export the blob stays a file (renamed beside itself, hashed
    in chunks), and fe.save writes its bytes where ExecuTorch's save would.  (A CUDA export
    needs a GPU; this is the step on its own.)"""
    from executorch.backends.aoti.aoti_backend import AotiBackend
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir._serialize.data_serializer import DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = os.urandom(3 << 20) + b"tail"
    blob = tmp_path / "model.wrapper_weights.blob"
    blob.write_bytes(payload)
    theirs_blob = tmp_path / "theirs.wrapper_weights.blob"
    theirs_blob.write_bytes(payload)
    theirs, theirs_digest = AotiBackend.load_weights_blob(str(theirs_blob), [])
    with fe.lean_export(scratch_dir=str(tmp_path)):
        data, digest = AotiBackend.load_weights_blob(str(blob), [])
    assert isinstance(theirs, bytes)
    assert not isinstance(data, bytes)
    assert digest == theirs_digest == hashlib.sha256(payload).hexdigest()
    assert not blob.exists()
    assert not theirs_blob.exists()
    assert len(data) == len(payload)
    assert Path(data._path).parent == tmp_path
    assert Path(data._path).read_bytes() == payload

    def ptd_of(blob_data: Any) -> Any:  # ExecuTorch's serializer, as its manager calls it
        store = NamedDataStore()
        store.add_named_data(digest + "_weights_blob", blob_data, 1, "aoti_cuda_blob")
        return FlatTensorSerializer().serialize(DataPayload(
            buffers=store.buffers, named_data=store.external_data["aoti_cuda_blob"]))

    assert data._finalizer.alive  # owned, like a spilled weight: deleted when dropped
    mine = adapter._adopt_cord(ptd_of(data), "ptd", {}, MappedFiles)
    filecord.save(tmp_path / "mine.ptd", mine, consume=True)
    assert (tmp_path / "mine.ptd").read_bytes() == bytes(ptd_of(theirs))
    assert not os.path.exists(data._path)  # consumed: moved into the .ptd, not copied


# --- a weight written between the export and the save ----------------------------------------


def _export_two(flow: str, model: torch.nn.Module, x: torch.Tensor, tmp_path: Path) -> Any:
    external = ExecutorchBackendConfig(external_constants=True)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        if flow == "portable_in_pte":
            return to_edge(export(model, (x,))).to_executorch()
        if flow == "portable_external":
            return to_edge(export(model, (x,))).to_executorch(external)
        return _tagged_xnn(model, x)


def _tagged_xnn(model: torch.nn.Module, x: torch.Tensor) -> Any:
    ep = _tagged(export(model, (x,)).module(), x, lambda n: "model")
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch(
        ExecutorchBackendConfig(external_constants=True))


@pytest.mark.parametrize("flow", ["portable_in_pte", "portable_external", "xnnpack_ptd"])
def test_a_weight_written_in_place_after_the_export_fails_every_save_of_it(
    flow: str, tmp_path: Path,
) -> None:
    """The digests (ExecuTorch's keys and dedup) are of the old bytes: writing the new ones
    under them would be a program that lies.  filecord's save raises before writing anything;
    ExecuTorch's own writers raise too (after writing: their output is theirs; its ``save``
    logs the error and returns, as it does for any failed write)."""
    model = TwoLinear().eval()
    x = torch.randn(2, 64)
    manager = _export_two(flow, model, x, tmp_path)
    with torch.no_grad():
        model.a.weight.mul_(0).add_(7)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataChangedError, match="changed after lean_export"):
        fe.save(out / "m.pte", manager)
    assert list(out.iterdir()) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    with pytest.raises(DataChangedError, match="changed after lean_export"):  # noqa: PT012
        with (theirs / "m.pte").open("wb") as f:
            manager.write_to_file(f)
        manager.write_tensor_data_to_file(str(theirs))
    if flow == "portable_in_pte":  # the only flow whose .pte holds the weight
        with pytest.raises(DataChangedError, match="changed after lean_export"):
            manager.buffer  # noqa: B018 - the property serializes the whole program


@pytest.mark.parametrize("how", ["written through a shared mapping", "rewritten by pwrite"])
def test_a_mapped_checkpoint_changed_after_the_export_fails_the_save(
    how: str, tmp_path: Path,
) -> None:
    torch.manual_seed(5)
    weight = torch.randn(2048, 2048)
    ckpt = tmp_path / "weights.bin"
    ckpt.write_bytes(weight.numpy().tobytes())
    past = time.time() - 100
    os.utime(ckpt, (past, past))  # old enough that the save would trust an unchanged file
    with torch.device("meta"):
        model = Wide()
    shared = how == "written through a shared mapping"
    mapped = torch.from_file(str(ckpt), shared=shared, size=weight.numel()).view(2048, 2048)
    model.load_state_dict({"lin.weight": mapped}, assign=True)
    x = torch.randn(1, 2048)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = to_edge(export(model.eval(), (x,))).to_executorch(
            ExecutorchBackendConfig(external_constants=True))
    time.sleep(0.01)
    if shared:
        with torch.no_grad():
            mapped[7, 7] = 1234.0
    else:
        with ckpt.open("r+b") as f:
            f.seek(4096)
            f.write(b"\x00" * 64)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataChangedError, match="changed after lean_export"):
        fe.save(out / "m.pte", manager)
    assert list(out.iterdir()) == []


def test_a_shared_mapping_written_again_without_a_new_mtime_fails_the_save(
    tmp_path: Path,
) -> None:
    """Linux sets a file's mtime at the first write fault on a clean page of a shared mapping:
    a page still dirty from an earlier write takes no fault, so neither size nor mtime moves.
    A storage in a shared mapping is therefore always hashed again."""
    torch.manual_seed(8)
    weight = torch.randn(256, 256)
    ckpt = tmp_path / "w.bin"
    ckpt.write_bytes(weight.numpy().tobytes())
    mapped = torch.from_file(str(ckpt), shared=True, size=weight.numel()).view(256, 256)
    with torch.no_grad():
        mapped.add_(0.0)  # a load step that writes: every page dirty, mtime set now
    past = time.time() - 100
    os.utime(ckpt, (past, past))  # as if that step were long before the export
    model = torch.nn.Linear(256, 256, bias=False).eval()
    model.weight = torch.nn.Parameter(mapped, requires_grad=False)
    x = torch.randn(2, 256)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = to_edge(export(model, (x,))).to_executorch(
            ExecutorchBackendConfig(external_constants=True))
    mtime = ckpt.stat().st_mtime_ns
    with torch.no_grad():
        mapped.mul_(2.0)  # through the mapping, onto pages that are still dirty
    assert ckpt.stat().st_mtime_ns == mtime  # what makes the mtime no witness here
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataChangedError, match="changed after lean_export"):
        fe.save(out / "m.pte", manager)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("touched", [False, True])
def test_a_mapped_file_unchanged_since_the_digest_is_not_hashed_again(
    touched: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check costs a read of every weight; a private mapping whose file is in the state
    noted at the digest (device, inode, size, mtime, ctime) is trusted, and the save's identity
    checks watch it from there.  Any touch (here a utime, which moves the ctime) re-hashes."""
    model, ckpt = _mmapped_wide(tmp_path, "torch.from_file")
    x = torch.randn(1, 2048)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = to_edge(export(model, (x,))).to_executorch(
            ExecutorchBackendConfig(external_constants=True))
    if touched:
        past = time.time() - 1000
        os.utime(ckpt, (past, past))
    hashed: list[int] = []
    real = _storage._digest

    def counting(view: memoryview) -> bytes:
        hashed.append(len(view))
        return real(view)

    monkeypatch.setattr(_storage, "_digest", counting)
    out = tmp_path / "out"
    out.mkdir()
    fe.save(out / "m.pte", manager)  # the bytes did not change: either way it saves
    size = model.lin.weight.untyped_storage().nbytes()
    assert (size in hashed) == touched, hashed


@pytest.mark.parametrize("how", ["rewritten, then given an old mtime (cp -p)", "cut short"])
def test_a_checkpoint_changed_behind_an_old_mtime_or_cut_short_fails_the_save(
    how: str, tmp_path: Path,
) -> None:
    """A file's ctime moves with every write, truncate and utime, so an old mtime does not
    hide a rewrite; a file cut short is refused without reading the mapping past its end
    (a SIGBUS would kill the process)."""
    model, ckpt = _mmapped_wide(tmp_path, "torch.load")
    x = torch.randn(1, 2048)
    with fe.lean_export(scratch_dir=str(tmp_path)):
        manager = to_edge(export(model, (x,))).to_executorch(
            ExecutorchBackendConfig(external_constants=True))
    st = ckpt.stat()
    if how == "cut short":
        os.truncate(ckpt, 4096)
    else:
        data = bytearray(ckpt.read_bytes())
        data[-8192:-4096] = bytes(4096)  # inside the weight's bytes, near the end
        ckpt.write_bytes(bytes(data))
        os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataChangedError):
        fe.save(out / "m.pte", manager)
    assert list(out.iterdir()) == []


# --- the README ---------------------------------------------------------------------------------


def test_the_readmes_three_line_recipe_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## For ExecuTorch users\n", 1)[1]
    recipe = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "fe.lean_export()" in recipe
    assert len([line for line in recipe.splitlines() if not line.startswith(" ")]) == 3
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(5)
    torch.save({"lin.weight": torch.randn(2048, 2048)}, "weights.pt")
    with torch.device("meta"):
        model = Wide()
    args = (torch.randn(1, 2048),)
    namespace = {"torch": torch, "fe": fe, "export": export, "model": model, "args": args,
                 "to_edge_transform_and_lower": to_edge_transform_and_lower,
                 "XnnpackPartitioner": XnnpackPartitioner}
    exec(recipe, namespace)  # noqa: S102 - the README's own text, run as a user would
    eager = Wide().eval()
    eager.load_state_dict(torch.load("weights.pt", weights_only=True))
    theirs = to_edge_transform_and_lower(
        export(eager, args), partitioner=[XnnpackPartitioner()]).to_executorch()
    assert Path("model.pte").read_bytes() == theirs.buffer
    torch.testing.assert_close(run_program("model.pte", args[0]), eager(*args), rtol=1e-4,
                               atol=1e-4)


# --- reading /proc/self/smaps ---------------------------------------------------------------------

SMAPS_SAMPLE = """\
7f0000000000-7f0000400000 r--p 00001000 fd:01 4242                       /data/weights.pt
Size:               4096 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
7f0000400000-7f0000800000 rw-p 00000000 fd:01 4343                       /data/other file.bin
Size:               4096 kB
Anonymous:             8 kB
VmFlags: rd wr mr mw me
7f0000800000-7f0000801000 rw-s 00000000 fd:01 4444                       /data/shared.bin
Anonymous:             0 kB
7f0000900000-7f0000a00000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
"""


def test_smaps_parsing_keeps_file_mappings_with_their_anonymous_pages() -> None:
    from filecord.executorch._mapped import Mapping, parse_smaps

    assert parse_smaps(SMAPS_SAMPLE) == [
        Mapping(0x7F0000000000, 0x7F0000400000, 0x1000, (0xFD, 1), 4242, "/data/weights.pt", 0,
                False),
        Mapping(0x7F0000400000, 0x7F0000800000, 0, (0xFD, 1), 4343, "/data/other file.bin", 8,
                False),
        Mapping(0x7F0000800000, 0x7F0000801000, 0, (0xFD, 1), 4444, "/data/shared.bin", 0, True),
    ]


def test_a_range_is_the_file_only_while_it_is_the_mapped_file(tmp_path: Path) -> None:
    from filecord.executorch._mapped import MappedFiles

    path = tmp_path / "w.bin"
    path.write_bytes(bytes(range(256)) * 64)
    st = path.stat()
    line = (f"7f0000000000-7f0000004000 r--p 00000100 {os.major(st.st_dev):x}:"
            f"{os.minor(st.st_dev):x} {st.st_ino} {path}\nAnonymous: 0 kB\n")
    found = MappedFiles(line).range_of(0x7F0000000010, 32)
    assert found is not None
    assert (found.offset, len(found), found.to_bytes()) == (0x110, 32, bytes(range(16, 48)))
    assert MappedFiles(line).range_of(0x7F0000003FF0, 32) is None  # runs past the mapping
    dirty = line.replace("Anonymous: 0 kB", "Anonymous: 4 kB")
    assert MappedFiles(dirty).range_of(0x7F0000000010, 32) is None
    path.rename(tmp_path / "moved.bin")
    path.write_bytes(bytes(range(256)) * 64)  # same name and bytes, another inode
    assert MappedFiles(line).range_of(0x7F0000000010, 32) is None
