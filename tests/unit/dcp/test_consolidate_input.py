"""filecord.dcp.consolidate refuses, before it writes anything, sharding information nested
too deeply (a format error naming the file and the field, not a RecursionError) and an output
whose directory is missing (before a shard is read).  Shards are written byte by byte here:
no torch needed."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

import filecord.dcp as fdcp
from filecord.dcp._consolidate import SHARDING_DEPTH
from filecord.errors import FormatError, SaveError

NAME = "shard-00001-model-00001-of-00001.safetensors"
FIELD = "__metadata__.DCP_SHARDING_INFO"


def shard(path: Path, info: str) -> bytes:
    """A one-rank shard holding w = F32[2] (1.0, 2.0) with ``info`` as its sharding info."""
    data = struct.pack("<2f", 1.0, 2.0)
    header = json.dumps({"__metadata__": {"DCP_SHARDING_INFO": info},
                         "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    blob = struct.pack("<Q", len(header)) + header + data
    path.write_bytes(blob)
    return blob


def nested(levels: int) -> str:
    """Sharding info whose extra key nests ``levels`` deep in all (the object itself is 1)."""
    inner = "[" * (levels - 2) + "]" * (levels - 2)
    return '{"w": {"saved_offsets": [0], "extra": ' + inner + "}}"


def test_sharding_info_at_the_depth_limit_consolidates(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shard(ckpt / NAME, nested(SHARDING_DEPTH))
    out = tmp_path / "model.safetensors"
    fdcp.consolidate(out, ckpt)
    blob = out.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    assert json.loads(blob[8:8 + n])["w"] == {"dtype": "F32", "shape": [2],
                                               "data_offsets": [0, 8]}
    assert blob[8 + n:] == struct.pack("<2f", 1.0, 2.0)


@pytest.mark.parametrize("levels", [SHARDING_DEPTH + 1, 200_000])
def test_sharding_info_nested_too_deep_is_a_format_error(tmp_path: Path, levels: int) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    blob = shard(ckpt / NAME, nested(levels))
    out = tmp_path / "model.safetensors"
    with pytest.raises(fdcp.ShardSetError) as info:
        fdcp.consolidate(out, ckpt, consume=True)
    assert isinstance(info.value, FormatError)
    assert info.value.field == FIELD
    assert str(ckpt / NAME) in str(info.value)
    assert f"nested more than {SHARDING_DEPTH} deep" in str(info.value)
    assert (ckpt / NAME).read_bytes() == blob  # consume=True moved nothing
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no output, no temp, no lock


def test_missing_output_directory_is_refused_before_a_shard_is_read(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    blob = shard(ckpt / NAME, '{"w": {"saved_offsets": [0]}}')
    digest = hashlib.sha256(blob).hexdigest()
    # a bad shard after the good one: reading the shards would raise a FormatError first
    (ckpt / "shard-00002-model-00001-of-00001.safetensors").write_bytes(b"\x10" + bytes(7))
    out = tmp_path / "missing" / "deeper" / "model.safetensors"
    with pytest.raises(SaveError) as info:
        fdcp.consolidate(out, ckpt, consume=True)
    assert info.value.errno == errno.ENOENT
    assert f"the directory {out.parent} does not exist" in str(info.value)
    assert not (tmp_path / "missing").exists()  # nothing created
    assert hashlib.sha256((ckpt / NAME).read_bytes()).hexdigest() == digest
    # an output "directory" that is a file
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(SaveError) as info:
        fdcp.consolidate(tmp_path / "file" / "model.safetensors", ckpt)
    assert info.value.errno == errno.ENOTDIR
    assert (tmp_path / "file").read_bytes() == b"x"
