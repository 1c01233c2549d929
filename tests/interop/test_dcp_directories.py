"""Where ``filecord.dcp.save`` and ``save_sharded`` write when the output's directory is missing:
shards go into a directory made with its parents, as torch's ``FileSystemWriter`` makes its
checkpoint directory (and as ``save_pretrained`` does); a single file's directory must exist,
as for ``save_file``, and its absence is a ``SaveError`` naming it.  A save that fails removes
the directories it made.  One process, no process group: DCP runs its single-rank path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import filecord.dcp as fdcp  # noqa: E402
from filecord._io import syscalls as _sys  # noqa: E402
from filecord.errors import SaveError  # noqa: E402
from filecord.safetensors import save_sharded  # noqa: E402

pytestmark = pytest.mark.interop


def _state() -> dict[str, Any]:
    return {"w": torch.arange(48.0).reshape(6, 8), "b": torch.arange(7, dtype=torch.int16),
            "e": torch.ones(3, 5, dtype=torch.bfloat16)}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_file_system_writer_makes_its_missing_checkpoint_directory(tmp_path: Path) -> None:
    """The peer's behaviour that filecord's shard saves follow."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(tmp_path / "a" / "b" / "ck")))
    assert (tmp_path / "a" / "b" / "ck" / ".metadata").is_file()


def test_a_shard_save_makes_its_missing_directory_and_writes_what_save_sharded_does(
    tmp_path: Path,
) -> None:
    report = fdcp.save(_state(), tmp_path / "x" / "y" / "ck", max_shard_size=200)
    assert report is not None
    got = _tree(tmp_path / "x" / "y" / "ck")
    save_sharded(_state(), tmp_path / "p" / "q" / "ref", max_shard_size=200)
    want = _tree(tmp_path / "p" / "q" / "ref")
    assert len(want) == 3  # two shards and the index
    assert got == want
    assert sorted(os.listdir(tmp_path)) == ["p", "x"]


def test_a_single_file_save_into_a_missing_directory_names_it_and_writes_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / "missing" / "model.safetensors"
    with pytest.raises(CheckpointException) as caught:
        fdcp.save(_state(), target)
    errors = _errors(caught.value)
    assert isinstance(errors[0], SaveError)
    assert str(errors[0]) == (
        f"cannot save {target}: the directory {target.parent} does not exist (create it "
        "first, or save shards with max_shard_size, whose directory is created); nothing was "
        "written")
    assert os.listdir(tmp_path) == []


def _errors(exc: CheckpointException) -> list[BaseException]:
    """The errors of the ranks that failed (DCP keeps each with its traceback)."""
    return [e[0] if isinstance(e, tuple) else e for e in exc.failures.values()]


class _FailOnWrite(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "pwrite":
            raise OSError(5, "injected EIO")


def test_a_failed_shard_save_removes_the_directories_it_made(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    with _sys.use(_FailOnWrite()), pytest.raises(CheckpointException) as caught:
        fdcp.save(_state(), tmp_path / "kept" / "new" / "deeper", max_shard_size=200)
    assert str(_errors(caught.value)[0]) == "[Errno 5] injected EIO"
    assert os.listdir(tmp_path) == ["kept"]
    assert os.listdir(tmp_path / "kept") == []
    with _sys.use(_FailOnWrite()), pytest.raises(OSError, match="injected EIO"):
        save_sharded(_state(), tmp_path / "kept" / "new" / "deeper", max_shard_size=200)
    assert os.listdir(tmp_path / "kept") == []


def test_save_sharded_into_a_file_is_a_save_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"x")
    with pytest.raises(SaveError) as caught:
        save_sharded(_state(), tmp_path / "plain", max_shard_size=200)
    assert str(caught.value) == (f"cannot save shards into {tmp_path / 'plain'}: it is not a "
                                 "directory; nothing was written")
    assert (tmp_path / "plain").read_bytes() == b"x"


def test_a_single_file_path_spelled_as_a_directory_is_refused(tmp_path: Path) -> None:
    """``save(sd, "out/")`` without max_shard_size never writes a file named ``out``; with it,
    ``out/`` is the shards' directory, made."""
    with pytest.raises(SaveError) as caught:
        fdcp.save(_state(), f"{tmp_path}/out/")
    assert str(caught.value) == (
        f"cannot save {tmp_path}/out/: it names a directory, not a file (give max_shard_size "
        "to save shards into a directory, or a file name ending in .safetensors); nothing was "
        "written")
    assert os.listdir(tmp_path) == []
    fdcp.save(_state(), f"{tmp_path}/out/", max_shard_size=200)
    assert sorted(os.listdir(tmp_path / "out")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"]
