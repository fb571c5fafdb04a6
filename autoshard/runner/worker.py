"""One rank of a measured run: builds its shard, runs the steps, times every part.

Run by the local launcher as ``python -m autoshard.runner.worker SPEC RANK``, or in-process by the
CLI under ``torchrun`` (env:// rendezvous). Rank 0 gathers every rank's medians.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.fileio import atomic_write_text, json_text
from autoshard.layout.plan import Plan
from autoshard.runner.check import canonical_weights, check_rank
from autoshard.runner.config import FAULT_ENV, RunConfig, ShardTable
from autoshard.runner.data import TableBatch, global_batches, own_samples, shard_lookups
from autoshard.runner.exchange import Assembly, Exchange, sample_blocks
from autoshard.runner.shard import PreparedBatch, RankShard
from autoshard.runner.step import PARTS, run_step
from autoshard.tables import Table

Progress = Callable[[str], None]

_COMPUTE = ("hbm_fwd", "uvm_fwd", "replica_fwd", "hbm_bwd", "uvm_bwd", "replica_bwd",
            "replica_step")
#: CPU time (this thread) of the compute parts: unlike wall time, it does not grow while other
#: processes hold the cores; meaningful on CPU ranks only (CUDA kernels run asynchronously).
CPU_PARTS = tuple(f"{p}_cpu" for p in _COMPUTE)


def pick_device(choice: str, local_rank: int, local_world: int) -> Any:
    """CUDA when asked (or ``auto`` and every local rank can have its own GPU), else CPU."""
    import torch

    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()
                            and torch.cuda.device_count() >= local_world):
        if torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"rank needs cuda:{local_rank} but "
                               f"{torch.cuda.device_count()} GPU(s) are visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def make_batches(spec: dict[str, Any], tables: list[ShardTable], config: RunConfig,
                 samples: tuple[int, int]) -> list[list[TableBatch]]:
    """The distinct batches of the rank's pieces (outer: batch, inner: piece): a piece's share
    of its table's global batch, a replica's the rank's own ``samples`` (first, end)."""
    by_name = {d["name"]: Table.from_dict(d) for d in spec["tables"]}
    positions = sorted({t.position: t.name for t in tables}.items())
    drawn = global_batches([by_name[n] for _, n in positions], [p for p, _ in positions],
                           config)
    of_table = {p: batches for (p, _), batches in zip(positions, drawn, strict=True)}
    count = min((len(b) for b in drawn),  # a rank holding nothing still steps
                default=min(config.distinct_batches, config.warmup + config.iterations))
    return [[own_samples(of_table[t.position][i], *samples) if t.replica
             else shard_lookups(of_table[t.position][i], t) for t in tables]
            for i in range(count)]


def run_rank(spec: dict[str, Any], rank: int, world: int, init_method: str,
             progress: Progress, local_rank: int = 0, local_world: int = 1
             ) -> list[dict[str, Any]] | None:
    """Runs this rank (timed, or the correctness check where ``spec["check"]``); returns every
    rank's result on rank 0, None elsewhere."""
    import torch
    import torch.distributed as dist

    from autoshard.runner.shard import rank_tables

    torch.set_num_threads(1)
    config = RunConfig.from_dict(spec["config"])
    device = pick_device(config.device, local_rank, local_world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
    try:
        progress("connected")
        dims = {d["name"]: (i, int(d["rows"]), int(d["dim"]))
                for i, d in enumerate(spec["tables"])}
        plan = Plan.from_dict(spec["plan"], source="run spec")
        layout = [rank_tables(plan, dims, r) for r in range(world)]
        shard = RankShard(layout[rank], config, device)
        if spec.get("check"):
            shard.load_weights(canonical_weights(shard.pieces, config.seed))
        progress("built")
        blocks = sample_blocks(config.batch_size, world)
        first = sum(blocks[:rank])
        batches = make_batches(spec, layout[rank], config, (first, first + blocks[rank]))
        prepared = [shard.prepare(b) for b in batches]
        sharded = [[t for t in ts if not t.replica] for ts in layout]
        exchange = Exchange([sum(t.dim for t in ts) for ts in sharded], config.batch_size,
                            rank, device)
        assembly = Assembly(sharded, shard.replicas.tables if shard.replicas else ())
        progress("ready")
        if spec.get("check"):
            result = check_rank(rank, shard, exchange, assembly, prepared, config, progress)
        else:
            times = run_steps(shard, exchange, assembly, prepared, config, rank, progress)
            result = summarise(rank, shard, prepared, times, device, backend)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        return gathered if rank == 0 else None
    finally:
        dist.destroy_process_group()


def run_steps(shard: RankShard, exchange: Exchange, assembly: Assembly,
              prepared: list[PreparedBatch], config: RunConfig, rank: int,
              progress: Progress) -> dict[str, list[float]]:
    """Warm-up and timed steps; each part's time per timed step, ms (the assembly of split
    tables' pieces and of the replicas' output counts with the all-to-all it follows or
    precedes)."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if shard.device.type == "cuda" else (lambda: None)
    wall: list[float] = []
    cpu: list[float] = []

    def mark() -> None:
        sync()
        wall.append(time.perf_counter())
        cpu.append(time.thread_time())

    times: dict[str, list[float]] = {p: [] for p in (*PARTS, *CPU_PARTS)}
    for step in range(config.warmup + config.iterations):
        if step == 0:
            inject_fault(rank)
        batch = prepared[step % len(prepared)]
        progress(f"step {step} (in a collective)")
        dist.barrier()
        wall.clear()
        cpu.clear()
        run_step(shard, exchange, assembly, batch, config, mark)
        missing = len(PARTS) - len(wall)  # parts an inference step does not run
        wall.extend([wall[-1]] * missing)
        cpu.extend([cpu[-1]] * missing)
        if step >= config.warmup:
            record(times, wall, cpu)
        progress(f"step {step} done")
    return times


def record(times: dict[str, list[float]], wall: list[float], cpu: list[float]) -> None:
    """Appends one step's parts (ms) from its marks: wall clock, and CPU time of compute."""
    for i, name in enumerate(PARTS[:-1]):
        times[name].append((wall[i + 1] - wall[i]) * 1e3)
        if name in _COMPUTE:
            times[f"{name}_cpu"].append((cpu[i + 1] - cpu[i]) * 1e3)
    times["step"].append((wall[-1] - wall[0]) * 1e3)


def summarise(rank: int, shard: RankShard, prepared: list[PreparedBatch],
              times: dict[str, list[float]], device: Any, backend: str) -> dict[str, Any]:
    """Per-rank medians of every part, and of the derived components (a replica's work counts
    as fast-tier work, its all-reduce as communication)."""
    t = {k: np.asarray(v) for k, v in times.items()}
    replica = t["replica_bwd"] + t["replica_step"]
    derived = {
        "lookup": t["hbm_fwd"] + t["uvm_fwd"] + t["replica_fwd"] + t["combine"],
        "comm": t["comm_fwd"] + t["comm_bwd"] + t["allreduce"],
        "backward_optimizer": t["hbm_bwd"] + t["uvm_bwd"] + replica,
        "hbm": t["hbm_fwd"] + t["hbm_bwd"] + t["replica_fwd"] + replica,
        "uvm": t["uvm_fwd"] + t["uvm_bwd"],
        "waits": t["wait"] + t["sync_wait"],
        "work": t["step"] - t["wait"] - t["sync_wait"] - t["dense"],
        "compute_cpu": sum((t[p] for p in CPU_PARTS), np.zeros_like(t["step"])),
    }
    medians = {k: float(np.median(v)) for k, v in {**t, **derived}.items()}
    return {
        "rank": rank, "host": socket.gethostname(), "device": str(device), "backend": backend,
        "tables": [x.name for x in shard.pieces], "hbm_rows": [x.hbm_rows for x in shard.pieces],
        "replicas": [x.name for x in shard.pieces if x.replica],
        "median_ms": medians, "bytes": shard.nbytes,
        "lookups": float(np.mean([p.lookups for p in prepared])),
        "uvm_lookups": float(np.mean([p.uvm_lookups for p in prepared])),
        "steps": len(times["step"]),
    }


def inject_fault(rank: int) -> None:
    """The fault of :data:`autoshard.runner.config.FAULT_ENV` if it names this rank."""
    fault = os.environ.get(FAULT_ENV, "")
    target, _, kind = fault.partition(":")
    if not fault or target != str(rank):
        return
    if kind == "exit":
        os._exit(3)
    if kind == "hang":
        while True:
            time.sleep(3600)


def _die_with_parent() -> None:
    """Asks Linux to kill this process when the launcher dies (no orphans)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def rank_main(argv: list[str], run: Callable[[dict[str, Any], int, Progress], Any]) -> int:
    """``SPEC RANK``: runs one rank with ``run(spec, rank, progress)``, writing progress marks,
    its error, and (rank 0) the gathered result beside the spec, as the launchers expect (ours
    and :mod:`autoshard.torchrec.dmp`'s)."""
    spec_path, rank = Path(argv[0]), int(argv[1])
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return 1
    spec = json.loads(spec_path.read_text())
    work = spec_path.parent
    progress_file = work / f"rank{rank}.progress"

    def progress(stage: str) -> None:
        progress_file.write_text(stage)

    try:
        progress("started")
        result = run(spec, rank, progress)
        if result is not None:
            atomic_write_text(work / "result.json", json_text(result, indent=None))
        return 0
    except BaseException as exc:
        atomic_write_text(work / f"rank{rank}.error",
                          f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        return 1


def main(argv: list[str]) -> int:
    return rank_main(argv, lambda spec, rank, progress: run_rank(
        spec, rank, spec["world_size"], spec["init_method"], progress, local_rank=rank,
        local_world=spec["world_size"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
