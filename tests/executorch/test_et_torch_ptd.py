"""Tensors streamed into .ptd files that the ExecuTorch runtime loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from et_helpers import Exported, run_program

torch = pytest.importorskip("torch", reason="these tests stream torch tensors")

from filecord.executorch import (  # noqa: E402
    NamedDataStore,
    ScalarType,
    TensorLayout,
    read_ptd,
    save_state_dict,
)


@pytest.mark.interop
@pytest.mark.parametrize("consume", [True, False])
def test_state_dict_ptd_runs_the_external_program(
    exported: dict[str, Exported], tmp_path: Path, consume: bool
) -> None:
    ex = exported["external"]
    ptd = tmp_path / "weights.ptd"
    report = save_state_dict(ptd, ex.state, consume=consume)
    # The whole .ptd is written once into a scratch file, then adopted (consume) or copied.
    assert report.bytes_by_action() == {"moved" if consume else "copied": ptd.stat().st_size}
    assert [n for n in os.listdir(tmp_path) if n != "weights.ptd"] == []  # scratch file gone
    got = run_program(ex.pte, ex.x, ptd)
    assert torch.allclose(got, ex.expected, atol=1e-6)
    # The entries carry the layouts the runtime checks, and the bytes of each tensor.
    entries = read_ptd(ptd).entries
    for key, t in ex.state.items():
        e = entries[key]
        assert e.layout == TensorLayout(ScalarType.FLOAT, tuple(t.shape), tuple(range(t.dim())))
        assert e.data.to_bytes() == t.contiguous().view(torch.uint8).numpy().tobytes()


def test_tied_weights_are_stored_once(tmp_path: Path) -> None:
    w = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    save_state_dict(tmp_path / "t.ptd", {"emb.weight": w, "head.weight": w, "b": torch.ones(3)})
    ptd = read_ptd(tmp_path / "t.ptd")
    assert len(ptd.segments) == 2
    assert ptd.entries["emb.weight"].segment_index == ptd.entries["head.weight"].segment_index
    assert ptd.entries["head.weight"].data.to_bytes() == w.numpy().tobytes()


def test_no_placeholder_file_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout needs no file: the only file created beside the output is the scratch the
    save publishes (and the save's own temp and journal files)."""
    from filecord._io import syscalls as _sys

    created: list[str] = []
    real = _sys.open

    def spy(path: str, flags: int, mode: int = 0o666) -> int:
        if flags & os.O_CREAT:
            created.append(os.path.basename(path))
        return real(path, flags, mode)

    monkeypatch.setattr(_sys, "open", spy)
    save_state_dict(tmp_path / "t.ptd", {"w": torch.ones(4), "b": torch.zeros(2)}, consume=True)
    scratch = [n for n in created if n.endswith(".tensors")]
    assert len(scratch) == 1
    assert scratch[0].startswith(".t.ptd.")
    assert not any("layout" in n for n in created)


def test_bad_dtype_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no ExecuTorch scalar type"):
        save_state_dict(tmp_path / "c.ptd", {"c": torch.ones(2, dtype=torch.complex64)})
    assert os.listdir(tmp_path) == []


def test_add_tensor_infers_layout_and_streams(tmp_path: Path) -> None:
    store = NamedDataStore()
    cl = torch.arange(2 * 3 * 4 * 5, dtype=torch.bfloat16).reshape(2, 3, 4, 5)
    cl = cl.to(memory_format=torch.channels_last)
    store.add_tensor("conv.weight", cl, external_tag="w", directory=tmp_path)
    store.add_tensor("same", cl.clone(memory_format=torch.channels_last), external_tag="w",
                     directory=tmp_path)
    entries = store.entries("w")
    e = entries["conv.weight"]
    assert e.layout == TensorLayout(ScalarType.BFLOAT16, (2, 3, 4, 5), (0, 2, 3, 1))
    memory_order = cl.permute(0, 2, 3, 1).contiguous()
    assert e.data.to_bytes() == memory_order.view(torch.uint8).numpy().tobytes()
    assert entries["same"].data is e.data  # deduplicated by the digest computed while writing
    assert e.alignment == 16


def test_consume_defaults_to_false_everywhere() -> None:
    import inspect

    import filecord
    import filecord.executorch as fe
    import filecord.gguf as fg
    import filecord.safetensors as fst

    functions = [filecord.save, filecord.save_many, filecord.plan, fe.Program.save,
                 fe.Program.plan, fe.Program.write_tensor_data_to_file, fe.save_state_dict,
                 fe.save_external_data, fe.save, fe.merge, fst.merge, fst.reshard, fst.convert,
                 fg.merge, fg.reshard, fg.convert]
    defaults = {f"{f.__module__}.{f.__qualname__}": inspect.signature(f).parameters[
        "consume"].default for f in functions}
    assert defaults == dict.fromkeys(defaults, False)
    assert len(defaults) == 16


def test_the_old_argument_order_fails_naming_the_new_one(tmp_path: Path) -> None:
    """Destination first, as filecord.save(path, cord): the old order is a clear TypeError,
    raised before anything is created."""
    import filecord.executorch as fe
    from filecord.executorch import save_external_data

    sd = {"w": torch.ones(2)}
    with pytest.raises(TypeError, match=r"save_state_dict\(path, state_dict, \.\.\.\)"):
        save_state_dict(sd, tmp_path / "a.ptd")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"save_external_data\(path, module, program, \.\.\.\)"):
        save_external_data(torch.nn.Linear(2, 2), tmp_path / "m.pte", tmp_path / "b.ptd")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"save\(path, manager, \.\.\.\)"):
        fe.save(object(), tmp_path / "c.pte")
    with pytest.raises(TypeError, match=r"must be a str or os\.PathLike"):
        save_state_dict(3, sd)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
