"""The llama.cpp scenario at small scale, on a real size-limited ext4.

A Hugging Face Llama checkpoint (bf16, sharded by ``save_pretrained``) sits on a file system
that had 1.06x the checkpoint's size free before it was written.  llama.cpp's own
``convert_hf_to_gguf.py`` cannot convert it: by default it writes the output beside the inputs
and runs out of space; with ``--use-temp-file`` its temp file (``$TMPDIR`` on the same disk)
runs out of space first.  ``filecord convert --consume`` succeeds with the data on disk once
(peak allocated disk measured through ``st_blocks`` at every destructive call) and writes the
same bytes as a copying conversion of the same checkpoint.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fskit
import numpy as np
import pytest

from filecord._io import syscalls as _sys
from filecord.gguf import convert

pytestmark = pytest.mark.root

MiB = fskit.MiB
ROOT = Path(__file__).parents[2]




def test_convert_fits_only_by_moving(mount, tmp_path):
    for mod in ("transformers", "sentencepiece", "gguf"):
        pytest.importorskip(mod)
    sys.path.insert(0, str(ROOT))
    from tests.support.hf_models import reference_or_skip, tiny_model

    ref = reference_or_skip()
    made = tiny_model(tmp_path / "made", dtype="bfloat16", shard="20MB", hidden_size=512,
                      intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=2)
    data = sum(p.stat().st_size for p in made.glob("*.safetensors"))
    want = tmp_path / "want.gguf"
    convert(want, made, name="m")  # the same conversion by copying, off the small file system

    fs = mount("ext4", 300 * MiB)
    # the checkpoint's small files and metadata
    fskit.leave_free(fs, int(1.06 * data) + 1792 * 1024)
    model = fs / "model"
    shutil.copytree(made, model)
    left = fskit.free_bytes(fs)
    print(f"checkpoint {data / MiB:.1f} MiB; free after it: {left / data:.3f}x the data")
    assert left < 0.1 * data

    env = {**os.environ, "TMPDIR": os.fspath(fs)}
    for extra in ([], ["--use-temp-file"]):
        out = fs / "reference.gguf"
        r = subprocess.run([sys.executable, str(ref / "convert_hf_to_gguf.py"), str(model),
                            "--outfile", str(out), *extra], capture_output=True, text=True,
                           env=env, check=False)
        assert r.returncode != 0, extra
        # numpy's short-write error ("N requested and M written") or the file system's ENOSPC
        assert any(s in r.stderr for s in ("requested and", "space", "ENOSPC")), r.stderr[-800:]
        out.unlink(missing_ok=True)

    window = 4 * MiB
    sampler = fskit.Sampler(lambda: fskit.allocated(fs))
    base = fskit.allocated(fs) - sum(p.stat().st_blocks for p in model.glob("*.safetensors")) * 512
    with _sys.use(sampler):
        report = convert(fs / "model.gguf", model, consume=True, window=window, name="m")
    sampler.sample()
    assert report.bytes_copied == 0
    assert not list(model.glob("*.safetensors"))
    assert (fs / "model.gguf").read_bytes() == want.read_bytes()
    peak = sampler.peak - base
    print(f"filecord convert --consume: peak allocated {peak / data:.3f}x the data")
    assert peak <= data + window + MiB, (peak, data)
    assert np.isfinite(peak)


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
