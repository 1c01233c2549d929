"""Ranks for tests/interop/test_dcp.py: ``python dcp_worker.py SCENARIO WORLD DIR [ARG]``.

Spawns WORLD gloo ranks on CPU (``torch.multiprocessing.spawn``); each runs SCENARIO and rank 0
writes what it found as JSON to ``DIR/result.json`` for the test to assert on.  A scenario that
raises fails the spawn (exit status 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.tensor import (
    DeviceMesh,
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)

import filecord.dcp as fdcp
from filecord._io import syscalls as _sys


def sha(path: str) -> str:
    with open(path, "rb") as f:  # test code: plain file reads
        return hashlib.sha256(f.read()).hexdigest()


def full_state(world: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 8, generator=g)
    sd = {
        "emb.even": torch.randn(8, 4, generator=g),
        "emb.uneven": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "col": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "t3": torch.randn(4, 6, 5, generator=g).to(torch.float16),
        "ids": torch.randint(-(1 << 40), 1 << 40, (7,), generator=g, dtype=torch.int64),
        "mask": torch.rand(6, 2, generator=g) > 0.5,
        "bias": torch.randn(5, generator=g),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "view": base[:, ::2],  # a plain non-contiguous view
        "grid": torch.randn(6, 8, generator=g),
    }
    if world == 4:
        sd["grid2"] = torch.randn(6, 10, generator=g).to(torch.float16)
    return sd


def placements(world: int) -> dict[str, tuple[Any, ...]]:
    if world == 4:  # a 2x2 mesh
        return {"emb.even": (Shard(0), Shard(0)), "emb.uneven": (Shard(0), Replicate()),
                "col": (Replicate(), Shard(1)), "t3": (Shard(1), Shard(2)),
                "ids": (Shard(0), Replicate()), "mask": (Replicate(), Replicate()),
                "bias": (Replicate(), Replicate()), "grid": (Shard(0), Shard(1)),
                "grid2": (Shard(1), Shard(0))}
    return {"emb.even": (Shard(0),), "emb.uneven": (Shard(0),), "col": (Shard(1),),
            "t3": (Shard(1),), "ids": (Shard(0),), "mask": (Replicate(),),
            "bias": (Replicate(),), "grid": (Shard(1),)}


def other_placements(world: int) -> dict[str, tuple[Any, ...]]:
    """A different placement of every distributed tensor, for loading."""
    out = {}
    for k, p in placements(world).items():
        out[k] = tuple(Shard(0) if not isinstance(x, Shard) or x.dim != 0 else Replicate()
                       for x in p)
    return out


def mesh_for(world: int) -> DeviceMesh:
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def distributed(sd: dict[str, torch.Tensor], mesh: DeviceMesh,
                place: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    return {k: distribute_tensor(v.contiguous(), mesh, list(place[k])) if k in place else v
            for k, v in sd.items()}


def empty_like_state(sd: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if isinstance(v, DTensor):
            out[k] = distribute_tensor(torch.zeros_like(v.full_tensor()), v.device_mesh,
                                       v.placements)
        else:
            out[k] = torch.zeros_like(v)
    return out


def equal_full(loaded: dict[str, Any], full: dict[str, torch.Tensor]) -> list[str]:
    bad = []
    for k, v in full.items():
        got = loaded[k].full_tensor() if isinstance(loaded[k], DTensor) else loaded[k]
        if got.dtype != v.dtype or got.shape != v.shape or not torch.equal(got, v):
            bad.append(k)
    return bad


class FailOnWrite(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "pwrite":
            raise OSError(5, "injected EIO on a rank's write")


def describe(exc: BaseException) -> str:
    """The underlying error of a CheckpointException (per rank), or the error itself."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        errs = {r: e[0] if isinstance(e, tuple) else e for r, e in failures.items()}
        return "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errs.items()))
    return f"{type(exc).__name__}: {exc}"


def _listing(d: str) -> list[str]:
    return sorted(os.listdir(d))


# --- scenarios ------------------------------------------------------------------------------

def scenario_main(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """Identity (single and sharded), loads, failure atomicity, refusals."""
    res: dict[str, Any] = {}
    mesh = mesh_for(world)
    full = full_state(world)
    sd = distributed(full, mesh, placements(world))
    single = os.path.join(out, "one", "model.safetensors")
    shards = os.path.join(out, "shards")
    ref = os.path.join(out, "ref")
    if rank == 0:
        os.makedirs(os.path.dirname(single))
        os.makedirs(shards)
        os.makedirs(os.path.join(ref, "sharded"))
        from safetensors.torch import save_file as st_save_file

        from filecord.safetensors import save_sharded
        contiguous = {k: v.contiguous() for k, v in full.items()}
        st_save_file(contiguous, os.path.join(ref, "model.safetensors"),
                     metadata={"format": "pt"})
        save_sharded(contiguous, os.path.join(ref, "sharded"), max_shard_size=300)
    dist.barrier()
    # 1. one file
    report = fdcp.save(sd, single, metadata={"format": "pt"})
    dist.barrier()
    if rank == 0:
        res["single_sha"] = sha(single)
        res["ref_sha"] = sha(os.path.join(ref, "model.safetensors"))
        res["single_dir"] = _listing(os.path.dirname(single))
        res["report_files"] = None if report is None else len(report.file_actions())
    # 2. hub shards
    fdcp.save(sd, shards, max_shard_size=300)
    dist.barrier()
    if rank == 0:
        refdir = os.path.join(ref, "sharded")
        res["shard_names"] = _listing(shards)
        res["ref_names"] = _listing(refdir)
        res["shards_equal"] = all(sha(os.path.join(shards, n)) == sha(os.path.join(refdir, n))
                                  for n in _listing(refdir))
    # 3. loads into another placement: our reader (file and index), torch's HF reader
    other = distributed(full, mesh, other_placements(world))
    for label, path in (("load_file", single), ("load_index",
                                                 os.path.join(shards,
                                                              "model.safetensors.index.json"))):
        target = empty_like_state(other)
        dcp.load(target, storage_reader=fdcp.SafetensorsReader(path))
        res[label] = equal_full(target, full)
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    target = empty_like_state(other)
    target.pop("empty")  # torch's HF reader cannot load an empty tensor
    dcp.load(target, storage_reader=HuggingFaceStorageReader(os.path.dirname(single)))
    res["load_hf"] = equal_full(target, {k: v for k, v in full.items() if k != "empty"})
    if rank == 0:
        from safetensors.torch import load_file
        got = load_file(single)
        res["load_st"] = [k for k, v in full.items() if not torch.equal(got[k], v)]
    dist.barrier()
    # 4. a rank fails in write_data: the old file stays, nothing else is left
    before = sha(single)
    changed = {k: (v * 2 if v.dtype.is_floating_point else v) for k, v in sd.items()}
    caught = ""
    try:
        if rank == world - 1:
            with _sys.use(FailOnWrite()):
                fdcp.save(changed, single, metadata={"format": "pt"})
        else:
            fdcp.save(changed, single, metadata={"format": "pt"})
    except BaseException as exc:  # CheckpointException is a BaseException
        caught = type(exc).__name__
    dist.barrier()
    if rank == 0:
        res["fail_caught"] = caught
        res["fail_same"] = sha(single) == before
        res["fail_dir"] = _listing(os.path.dirname(single))
    # 5. a re-save of other values over the file: the bytes save_file writes for them
    fdcp.save(changed, single, metadata={"format": "pt"})
    dist.barrier()
    if rank == 0:
        from safetensors.torch import save_file as st_save_file
        twice = {k: (v * 2 if v.dtype.is_floating_point else v).contiguous()
                 for k, v in full.items()}
        st_save_file(twice, os.path.join(ref, "v1.safetensors"), metadata={"format": "pt"})
        res["resave_same"] = sha(single) == sha(os.path.join(ref, "v1.safetensors"))
        res["resave_dir"] = _listing(os.path.dirname(single))
    # 6. refusals before any byte
    res["refusals"] = {}
    for label, state, kwargs in _refusal_cases(sd, mesh):
        d = os.path.join(out, "refuse-" + label)
        if rank == 0:
            os.makedirs(d)
        dist.barrier()
        msg = ""
        try:
            if "writer" in kwargs:
                kw = dict(kwargs)
                kw.pop("writer")
                dcp.save(state, storage_writer=fdcp.SafetensorsWriter(
                    os.path.join(d, "model.safetensors")), **kw)
            else:
                fdcp.save(state, os.path.join(d, "model.safetensors"), **kwargs)
        except BaseException as exc:
            msg = describe(exc)
        dist.barrier()
        if rank == 0:
            res["refusals"][label] = {"msg": msg[:600], "left": _listing(d)}
    return res


class NoCheckPlanner(dcp.DefaultSavePlanner):
    """A custom planner that skips torch's validation (and, with ``drop``, rank 1's part of
    'grid')."""

    def __init__(self, drop: bool) -> None:
        super().__init__()
        self.drop = drop

    def create_local_plan(self):  # type: ignore[no-untyped-def]
        plan = super().create_local_plan()
        if self.drop and dist.get_rank() == 1:
            import dataclasses
            plan = dataclasses.replace(plan, items=[i for i in plan.items
                                                    if i.index.fqn != "grid"])
            self.plan = plan
        return plan

    def create_global_plan(self, all_plans):  # type: ignore[no-untyped-def]
        from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
        from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
        plans, md = create_default_global_save_plan(dedup_save_plans(all_plans))
        self.global_plan, self.metadata = plans, md
        return plans, md


def _refusal_cases(sd: dict[str, Any], mesh: DeviceMesh) -> list[tuple[str, Any, Any]]:
    from torch.distributed.tensor.placement_types import _StridedShard
    rest = [Replicate()] * (mesh.ndim - 1)
    strided = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [Shard(0), *rest])
    strided = DTensor.from_local(strided.to_local(), mesh,
                                 [_StridedShard(0, split_factor=2), *rest],
                                 run_check=False, shape=torch.Size([8, 2]),
                                 stride=(2, 1))
    return [
        ("non_tensor", {"w": sd["bias"], "step": 5}, {}),
        ("complex128", {"z": torch.zeros(3, dtype=torch.complex128)}, {}),
        ("no_collectives", {"w": sd["bias"]}, {"writer": True, "use_collectives": False}),
        ("partial", {"grid": sd["grid"], "bias": sd["bias"]}, {"planner": NoCheckPlanner(True)}),
        ("strided", {"s": strided}, {}),
        ("strided_nocheck", {"s": strided}, {"planner": NoCheckPlanner(False)}),
        ("plan_cache", {"w": sd["bias"]},
         {"planner": dcp.DefaultSavePlanner(enable_plan_caching=True)}),
        # The writer's own check, for a caller of dcp.save: the first save of a cached
        # planner is an ordinary one; the second reuses its plans and is refused.
        ("plan_cache_writer_1", {"w": sd["bias"]},
         {"writer": True, "planner": dcp.DefaultSavePlanner(enable_plan_caching=True)}),
        ("plan_cache_writer_2", {"w": sd["bias"]},
         {"writer": True, "planner": dcp.DefaultSavePlanner(enable_plan_caching=True)}),
    ]


def scenario_kill(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """Save over an existing file and SIGKILL this process at a chosen system call."""
    target = os.path.join(out, "model.safetensors")
    sd = {"w": torch.arange(64.0).reshape(8, 8) + 1, "b": torch.ones(3, dtype=torch.int64)}
    op, _, which = arg.partition(":")

    class Killer(_sys.Backend):
        def hook(self, o: str, args: tuple[Any, ...]) -> None:
            if o != op:
                return
            hit = {"final": len(args) > 1 and args[1] == target,
                   "adopt": len(args) > 1 and ".partial" in os.path.basename(str(args[0]))
                   and ".partial" in os.path.basename(str(args[1])),
                   "journal": len(args) > 1 and str(args[1]).endswith(".filecord-journal"),
                   "lock": ".filecord-lock" in os.path.basename(str(args[0]))}[which]
            if hit:
                os.kill(os.getpid(), signal.SIGKILL)

    if rank == 0:
        with _sys.use(Killer()):
            fdcp.save(sd, target)
    else:  # another rank: it sees the coordinator die (gloo: connection closed)
        with contextlib.suppress(BaseException):
            fdcp.save(sd, target)
    return {"finished": True}


def scenario_plain(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """One save of the main state dict (for strace and the no-space test)."""
    mesh = mesh_for(world)
    full = full_state(world)
    sd = distributed(full, mesh, placements(world))
    caught = ""
    try:
        fdcp.save(sd, os.path.join(out, arg or "model.safetensors"))
    except BaseException as exc:
        caught = describe(exc)
    return {"caught": caught[:800]}


class NoFallocate(_sys.Backend):
    def allocate(self, fd: int, offset: int, length: int) -> None:
        raise OSError(95, "Operation not supported")  # EOPNOTSUPP, as on NFSv3 or FAT


def scenario_nofalloc(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """A file system without fallocate(2): the size by ftruncate, the same bytes."""
    import logging
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("filecord").addHandler(Keep())
    sd = {"w": torch.arange(48.0).reshape(6, 8), "i": torch.arange(5)}
    with _sys.use(NoFallocate()):
        fdcp.save(sd, os.path.join(out, "model.safetensors"))
    from safetensors.torch import save_file as st_save_file
    st_save_file(sd, os.path.join(out, "ref.safetensors"))
    same = sha(os.path.join(out, "model.safetensors")) == sha(os.path.join(out, "ref.safetensors"))
    # one writer, two saves (DCP never calls reset() without a checkpoint_id)
    writer = fdcp.SafetensorsWriter(os.path.join(out, "again.safetensors"))
    dcp.save(sd, storage_writer=writer)
    dcp.save(sd, storage_writer=writer)
    again = sha(os.path.join(out, "again.safetensors")) == sha(os.path.join(out, "ref.safetensors"))
    return {"same": same, "log": records, "again": again, "left": _listing(out)}


def scenario_big(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """A 4 MiB save (for the no-space test)."""
    caught = ""
    try:
        fdcp.save({"w": torch.ones(1 << 20)}, os.path.join(out, "model.safetensors"))
    except BaseException as exc:
        caught = describe(exc)
    return {"caught": caught[:800]}


class ExitOnWrite(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "pwrite":
            os._exit(3)  # a rank dying mid-write: no exception, no clean-up, no goodbye


def scenario_exit(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """The last rank exits in its first write; rank 0 must see the failure and clean up."""
    target = os.path.join(out, "model.safetensors")
    sd = {"w": distribute_tensor(torch.arange(64.0).reshape(8, 8), mesh_for(world),
                                 [Shard(0)])}
    caught = ""
    try:
        if rank == world - 1:
            with _sys.use(ExitOnWrite()):
                fdcp.save(sd, target)
        else:
            fdcp.save(sd, target)
    except BaseException as exc:
        caught = describe(exc)
    return {"caught": caught[:800], "left": _listing(out)}


def scenario_hf(rank: int, world: int, out: str, arg: str) -> dict[str, Any]:
    """torch's HuggingFaceStorageWriter shards (for consolidation), and the reference."""
    mesh = mesh_for(world)
    full = full_state(world)
    full.pop("empty")  # torch's HF writer cannot write an empty tensor
    full.pop("mask")  # nor a bool one
    sd = distributed(full, mesh, placements(world))
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(os.path.join(out, arg),
                                                         save_distributed=True))
    if rank == 0:
        from safetensors.torch import save_file as st_save_file
        st_save_file({k: v.contiguous() for k, v in full.items()},
                     os.path.join(out, "ref.safetensors"))
    return {}


def _recipe_rank(rank: int, world: int, out: str, port: int) -> None:
    """One rank of the documented recipe (docs/dcp.md, "Ending the ranks"): init, a
    shard-mode save, destroy_process_group in a finally, then a normal interpreter exit."""
    import datetime
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        sd = {f"w{i}": torch.full((16, 8), float(i)) for i in range(6)}
        fdcp.save(sd, out, max_shard_size=1200)
    finally:
        dist.destroy_process_group()


def exits(runs: int, world: int, base: str) -> None:
    """``runs`` saves, each by ``world`` ranks forked from this process (torch imported once,
    so a run costs the save, not the imports); each rank ends by leaving the interpreter
    normally (finalization and all), as a script does.  Writes ``base/result.json``: per run,
    every rank's exit status and whether its stderr says ``terminate called``."""
    fdcp.save  # noqa: B018 - the lazy import, done once before forking
    found: list[dict[str, Any]] = []
    for n in range(runs):
        out = os.path.join(base, f"run{n}")
        os.makedirs(out)
        port = _free_port()
        pids = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:  # the rank: stderr to a file, then out through SystemExit
                fd = os.open(os.path.join(base, f"run{n}.{rank}.err"),
                             os.O_WRONLY | os.O_CREAT, 0o644)
                os.dup2(fd, 2)
                code = 0
                try:
                    _recipe_rank(rank, world, out, port)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 1
                sys.exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        errs = []
        for rank in range(world):
            with open(os.path.join(base, f"run{n}.{rank}.err")) as f:
                errs.append(f.read())
        found.append({"codes": codes, "terminate": ["terminate called" in e for e in errs],
                      "stderr": [e[-800:] for e in errs], "files": _listing(out)})
    with open(os.path.join(base, "result.json"), "w") as f:
        json.dump(found, f, indent=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(rank: int, world: int, scenario: str, out: str, arg: str, port: int) -> None:
    import datetime
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(
                                seconds=20 if scenario in ("exit", "kill") else 60))
    try:
        res = globals()["scenario_" + scenario](rank, world, out, arg)
        if rank == 0:
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump(res, f, indent=1)
    finally:
        dist.destroy_process_group()


def main() -> None:
    scenario, world, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    arg = sys.argv[4] if len(sys.argv) > 4 else ""
    torch.set_num_threads(1)
    if scenario == "exits":  # ARG runs of the documented recipe, ranks forked per run
        exits(int(arg), world, out)
        return
    if world == 1:
        _run(0, 1, scenario, out, arg, _free_port())
        return
    if scenario in ("exit", "kill"):  # mp.spawn kills the others when one dies: own processes
        port = _free_port()
        ranks = [mp.get_context("spawn").Process(target=_run,
                                                 args=(r, world, scenario, out, arg, port))
                 for r in range(world)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        sys.exit(ranks[0].exitcode)
    mp.spawn(_run, args=(world, scenario, out, arg, _free_port()), nprocs=world)


if __name__ == "__main__":
    main()
