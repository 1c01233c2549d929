"""Fail every ``_sys`` call of a GGUFWriter close (once, and persistently): produced tensors
going to the scratch file, then the split set's one ``save_many``.

After any failure (and ``recover`` where the error names a journal): the split set is all old
or all new, never mixed; the caller's file-backed input is byte-exact; once the writer is
dropped no scratch file, temp or journal is left.  A short count must be absorbed.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import filecord
from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord.gguf import GGMLType, GGUFWriter
from support.faultfs import FaultFS, Tracer

rng = np.random.default_rng(5)
A = rng.standard_normal((64, 32)).astype(np.float32)
B = rng.standard_normal((40,)).astype(np.float16)
C = rng.standard_normal((16, 16)).astype(np.float32)
OLD = {"m-00001-of-00002.gguf": b"old first shard", "m-00002-of-00002.gguf": b"old second"}


def _setup(d: Path) -> Path:
    d.mkdir()
    for name, raw in OLD.items():
        (d / name).write_bytes(raw)
    src = d / "weights.bin"
    src.write_bytes(b"head" + A.tobytes())
    return src


def _write(d: Path, src: Path) -> None:
    w = GGUFWriter(d / "m.gguf", "llama", split_max_tensors=2)
    w.add_uint32("k", 7)
    w.add_tensor("a", FileBackedData(src, offset=4, length=A.nbytes), raw_shape=A.shape,
                 raw_dtype=GGMLType.F32)
    w.add_tensor("b", lambda: B.copy())
    w.add_tensor("c", lambda: C.copy())
    w.close()


def _state(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.usefixtures("young_heap")
def test_every_call_of_a_gguf_writer_close_fails_cleanly(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    src = _setup(ref)
    tracer = Tracer()
    with _sys.use(tracer):
        _write(ref, src)
    gc.collect()
    new = _state(ref)
    assert sorted(new) == sorted([*OLD, "weights.bin"])
    n = len(tracer.calls)
    outcomes: dict[str, int] = {}
    for kind, persistent in (("eio", False), ("enospc", True), ("short-write", False)):
        for at in range(1, n + 1):
            d = tmp_path / f"{kind}-{at}"
            s = _setup(d)
            fault = FaultFS(at, kind, persistent=persistent)
            try:
                with _sys.use(fault):
                    _write(d, s)
                got = "ok"
            except OSError:
                got = "raised"
            gc.collect()
            actions = [r.action for r in filecord.recover(d)]
            gc.collect()
            if "restored" in actions:  # the scratch file the journal kept safe, given back
                for p in d.glob(".m.gguf.*.gguf-tensors"):
                    p.unlink()
            state = _state(d)
            assert state["weights.bin"] == b"head" + A.tobytes(), (kind, at)
            shards = {k: v for k, v in state.items() if k in OLD}
            assert shards in ({k: OLD[k] for k in OLD}, {k: new[k] for k in OLD}), (kind, at)
            assert sorted(state) == sorted([*OLD, "weights.bin"]), (kind, at, sorted(state))
            if kind == "short-write":
                assert got == "ok", at
            outcomes[f"{kind}:{got}"] = outcomes.get(f"{kind}:{got}", 0) + 1
            for a in actions:
                outcomes[f"recover:{a}"] = outcomes.get(f"recover:{a}", 0) + 1
            fd_dir = "/proc/self/fd"
            assert len(os.listdir(fd_dir)) < 64
    print(f"{n} calls per close; outcomes {outcomes}")
    assert sum(v for k, v in outcomes.items() if not k.startswith("recover:")) == 3 * n
    assert outcomes.get("eio:raised", 0) >= n // 2
