"""The llama.cpp scenario at small scale, on a real size-limited ext4.

A safetensors checkpoint is converted to GGUF on a file system that had 1.05x the
checkpoint's size free before it was written.  gguf-py 0.19 cannot do it: its default mode
writes the output beside the inputs and runs out of space, leaving a partial file under the
final name that announces every tensor; with ``use_temp_file`` its temp file (``$TMPDIR`` on the
same disk) runs out of space first.  ``filecord convert --consume`` succeeds with the data on
disk once (peak allocated disk measured through ``st_blocks`` at every destructive call).
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import fskit
import numpy as np
import pytest

from filecord._io import syscalls as _sys
from filecord.gguf import convert, read_gguf

pytestmark = pytest.mark.root

MiB = fskit.MiB
N, PER = 6, 20 * MiB  # six 20 MiB float32 tensors: 120 MiB of data
GGUF_PY = r"""
import os, sys
import numpy as np
from safetensors import safe_open
import gguf
src, out, temp = sys.argv[1], sys.argv[2], sys.argv[3] == "temp"
w = gguf.GGUFWriter(out, "llama", use_temp_file=temp)
with safe_open(src, "np") as f:
    for name in sorted(f.keys()):
        w.add_tensor(name, f.get_tensor(name))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"""


def _checkpoint(d: Path) -> tuple[Path, dict[str, bytes]]:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    arrays = {f"blk.{i}.w": rng.standard_normal(PER // 4).astype(np.float32).reshape(-1, 64)
              for i in range(N)}
    p = d / "model.safetensors"
    save_file({k: torch.from_numpy(v) for k, v in arrays.items()}, os.fspath(p))
    return p, {k: hashlib.sha256(v.tobytes()).digest() for k, v in arrays.items()}


def _leave_free(fs: Path, free: int) -> None:
    st = os.statvfs(fs)
    have = st.f_bavail * st.f_frsize
    filler = fs / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, have - free)


def _free(fs: Path) -> int:
    st = os.statvfs(fs)
    return st.f_bavail * st.f_frsize


def test_convert_fits_only_by_moving(mount, tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("safetensors")
    data = N * PER
    fs = mount("ext4", 400 * MiB)
    _leave_free(fs, int(1.05 * data) + 2 * MiB)  # the checkpoint's header and metadata
    src, want = _checkpoint(fs)
    left = _free(fs)
    print(f"checkpoint {data >> 20} MiB; free after it: {left / data:.3f}x the data")
    assert left < 0.1 * data

    env = {**os.environ, "TMPDIR": os.fspath(fs)}
    for mode in ("ram", "temp"):
        out = fs / f"gguf-py-{mode}.gguf"
        r = subprocess.run([sys.executable, "-c", GGUF_PY, os.fspath(src), os.fspath(out),
                            mode], capture_output=True, text=True, env=env, check=False)
        assert r.returncode != 0, mode
        assert "space" in r.stderr.lower() or f"Errno {errno.ENOSPC}" in r.stderr, r.stderr[-500:]
        if mode == "ram":  # a partial file stays under the final name, header complete
            assert out.exists()
            assert out.read_bytes()[:4] == b"GGUF"
            assert out.stat().st_size < data
        for p in fs.iterdir():
            if p.name.startswith("gguf-py-"):
                p.unlink()

    window = 4 * MiB
    sampler = fskit.Sampler(lambda: fskit.allocated(fs))
    base = fskit.allocated(fs) - src.stat().st_blocks * 512
    with _sys.use(sampler):
        report = convert(fs / "model.gguf", src, arch="llama", consume=True, window=window)
    sampler.sample()
    assert {a.action for a in report.file_actions()} == {"moved"}
    assert not src.exists()
    model = read_gguf(fs / "model.gguf")
    assert {k: hashlib.sha256(t.data.to_bytes()).digest()  # type: ignore[union-attr]
            for k, t in model.tensors.items()} == want
    peak = sampler.peak - base
    print(f"filecord convert --consume: peak allocated {peak / data:.3f}x the data")
    assert peak <= data + window + MiB, (peak, data)


def test_page_aligned_gguf_reshards_and_merges_by_cloning_on_xfs(mount):
    """With general.alignment 4096 every tensor starts on a page, so a split and a merge clone
    on XFS (no bytes copied, no extra disk); the default 32 cannot."""
    from filecord.gguf import GGUFWriter, merge, reshard

    fs = mount("xfs", 300 * MiB)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(n // 4).astype(np.float32) for n in
              (4 * MiB, 4 * MiB + 4, 2 * MiB - 12, 2 * MiB)]
    for name, align in (("aligned.gguf", 4096), ("plain.gguf", None)):
        w = GGUFWriter(fs / name, "llama")
        if align:
            w.add_custom_alignment(align)
        for i, a in enumerate(arrays):
            w.add_tensor(f"t{i}", a)
        w.close()
    out = fs / "out"
    out.mkdir()
    report = reshard(out / "m.gguf", [fs / "aligned.gguf"], max_shard_size=6 * MiB)
    assert {a.action for a in report.file_actions()} == {"cloned"}, report.to_dict()["pieces"]
    assert len(os.listdir(out)) == 3
    again = fs / "again.gguf"
    report = merge(again, [out / "m-00001-of-00003.gguf"])
    assert {a.action for a in report.file_actions()} == {"cloned"}
    assert again.read_bytes() == (fs / "aligned.gguf").read_bytes()
    p = reshard(fs / "p.gguf", [fs / "plain.gguf"], max_shard_size=6 * MiB, dry_run=True)
    assert "copied" in {a.action for a in p.file_actions()}


def test_full_disk_leaves_the_old_model_and_nothing_else(mount):
    """Where gguf-py leaves a partial file under the final name, filecord's writer refuses
    before writing (in-memory tensors: the preflight sees the space is missing) or fails while
    producing (callables: the scratch file fills) and removes what it wrote."""
    from filecord.errors import InsufficientSpaceError
    from filecord.gguf import GGUFWriter

    fs = mount("tmpfs", 16 * MiB)
    old = fs / "model.gguf"
    old.write_bytes(b"the previous model")
    big = np.ones(5 * MiB, dtype=np.float32)  # 20 MiB
    w = GGUFWriter(old, "llama")
    w.add_tensor("big", big)
    with pytest.raises(InsufficientSpaceError):
        w.close()
    assert sorted(p.name for p in fs.iterdir()) == ["model.gguf"]
    assert old.read_bytes() == b"the previous model"
    w = GGUFWriter(old, "llama")
    for i in range(4):
        w.add_tensor(f"t{i}", lambda: np.ones(MiB, dtype=np.float32))  # 4 MiB each
    with pytest.raises(OSError) as info:  # noqa: PT011 - the errno is checked below
        w.close()
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in fs.iterdir()) == ["model.gguf"]
    assert old.read_bytes() == b"the previous model"
