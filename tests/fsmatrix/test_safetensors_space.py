"""safetensors checkpoints on real, size-limited file systems.

A merge that fits only by moving: ``safetensors`` + ``huggingface_hub`` (load, then save) run
out of space, ``filecord.safetensors.merge(consume=True)`` succeeds with the data on disk once
(peak allocated disk over the data measured through ``st_blocks``).  On XFS a 4 KiB-aligned
checkpoint is resharded by cloning.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import fskit
import pytest

from filecord import save
from filecord._io import syscalls as _sys
from filecord.safetensors import DType, NamedTensor, build_file, merge, read_safetensors, reshard

pytestmark = pytest.mark.root

MiB = fskit.MiB


def _tensor(name: str, size: int, seed: int) -> NamedTensor:
    block = hashlib.sha256(f"{name}{seed}".encode()).digest() * (MiB // 32)
    data = (block * (size // MiB + 1))[:size]
    return NamedTensor(name, DType.U8, (size,), data)


def _write_shards(d: Path, sizes: list[int], *, alignment: int = 8) -> tuple[list[Path], bytes]:
    paths, every = [], []
    for i, n in enumerate(sizes):
        t = _tensor(f"layer.{i}.weight", n, i)
        every.append(t)
        p = d / f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors"
        save(p, build_file([t], {"format": "pt"}, alignment=alignment))
        paths.append(p)
    expected = bytes(build_file(every, {"format": "pt"}))
    return paths, hashlib.sha256(expected).digest()


def test_merge_that_fits_only_by_moving(mount):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    fs = mount("ext4", 200 * MiB)
    shards, want = _write_shards(fs, [40 * MiB, 40 * MiB, 40 * MiB])
    data = 120 * MiB
    free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
    assert free < data  # loading and saving needs the data twice: it cannot fit

    # The packages' way: load every shard, save one file.  It runs out of space.
    loaded: dict[str, object] = {}
    for p in shards:
        loaded |= st_torch.load_file(os.fspath(p))
    with pytest.raises(Exception) as info:  # noqa: PT011 - whatever safetensors raises
        st_torch.save_file(loaded, os.fspath(fs / "theirs.safetensors"))
    assert "space" in str(info.value).lower() or getattr(info.value, "errno", 0) == errno.ENOSPC
    del loaded
    for p in fs.iterdir():  # what the failed save left behind (a temp, or a partial file)
        if p.is_file() and p not in shards:
            p.unlink()
    assert torch is not None

    window = 8 * MiB
    sampler = fskit.Sampler(lambda: fskit.allocated(fs))
    base = fskit.allocated(fs) - sum(p.stat().st_blocks * 512 for p in shards)
    with _sys.use(sampler):
        report = merge(fs / "model.safetensors", shards, consume=True, window=window)
    sampler.sample()
    out = fs / "model.safetensors"
    assert hashlib.sha256(out.read_bytes()).digest() == want
    assert {a.action for a in report.file_actions()} == {"moved"}
    assert sorted(p.name for p in fs.iterdir()) == ["lost+found", "model.safetensors"]
    peak = sampler.peak - base
    assert peak <= data + window + MiB, (peak, data)
    print(f"consumed merge of {data >> 20} MiB: peak allocated {peak / data:.3f}x the data")


def test_aligned_checkpoint_reshards_by_cloning_on_xfs(mount):
    fs = mount("xfs", 300 * MiB)
    sizes = [4 * MiB, 4 * MiB, 2 * MiB, 2 * MiB]
    src = fs / "in.safetensors"
    save(src, build_file([_tensor(f"t{i}", n, i) for i, n in enumerate(sizes)],
                         {"format": "pt"}, alignment=4096))
    f = read_safetensors(src)
    assert f.data_start % 4096 == 0  # type: ignore[union-attr]
    out = fs / "out"
    out.mkdir()
    report = reshard(out, [src], max_shard_size=6 * MiB, alignment=4096)
    acts = {a.action for a in report.file_actions()}
    assert acts == {"cloned"}, report.to_dict()["pieces"]
    again = fs / "again.safetensors"
    merge(again, [out / "model.safetensors.index.json"], alignment=4096)
    assert again.read_bytes() == src.read_bytes()
    # the default 8-byte layout cannot clone: the plan says so
    plain = fs / "plain.safetensors"
    save(plain, build_file([_tensor("t0", 4 * MiB, 0), _tensor("t1", 4 * MiB, 1)], None))
    p = reshard(fs / "out", [plain], max_shard_size=5 * MiB, dry_run=True)
    assert "copied" in {a.action for a in p.file_actions()}
