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
from autoshard.plan import Plan
from autoshard.runner.config import FAULT_ENV, RunConfig, ShardTable
from autoshard.runner.data import TableBatch, shard_lookups, synthetic_batch, trace_batches
from autoshard.runner.exchange import Assembly, Exchange
from autoshard.runner.shard import PreparedBatch, RankShard
from autoshard.tables import Table

Progress = Callable[[str], None]

#: Per-step parts, ms. ``wait`` is the barrier before the all-to-all: time spent waiting for
#: slower ranks (load imbalance), kept out of the rank's own work.
PARTS = ("hbm_fwd", "uvm_fwd", "combine", "wait", "comm_fwd", "dense", "comm_bwd", "hbm_bwd",
         "uvm_bwd", "step")


_COMPUTE = ("hbm_fwd", "uvm_fwd", "hbm_bwd", "uvm_bwd")
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


def make_batches(spec: dict[str, Any], tables: list[ShardTable], config: RunConfig
                 ) -> list[list[TableBatch]]:
    """The distinct batches of the rank's tables (outer: batch, inner: table)."""
    by_name = {d["name"]: Table.from_dict(d) for d in spec["tables"]}
    count = min(config.distinct_batches, config.warmup + config.iterations)
    if config.trace:
        from autoshard.stats.readers_dlrm import load_trace

        trace = load_trace(config.trace)
        per_table = [trace_batches(trace, by_name[t.name], t.position, config.batch_size, count,
                                   config.trace) for t in tables]
        count = min((len(b) for b in per_table), default=count)
        return [[shard_lookups(b[i], t) for b, t in zip(per_table, tables, strict=True)]
                for i in range(count)]
    # Seeded by table: every shard of a table, on any rank, draws the table's same lookups.
    rngs = [np.random.default_rng([config.seed, t.position]) for t in tables]
    return [[shard_lookups(synthetic_batch(by_name[t.name], config.batch_size, rng), t)
             for t, rng in zip(tables, rngs, strict=True)] for _ in range(count)]


def run_rank(spec: dict[str, Any], rank: int, world: int, init_method: str,
             progress: Progress, local_rank: int = 0, local_world: int = 1
             ) -> list[dict[str, Any]] | None:
    """Runs this rank; returns every rank's result on rank 0, None elsewhere."""
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
        progress("built")
        prepared = [shard.prepare(b) for b in make_batches(spec, layout[rank], config)]
        exchange = Exchange([sum(t.dim for t in ts) for ts in layout], config.batch_size,
                            rank, device)
        progress("ready")
        times = run_steps(shard, exchange, Assembly(layout), prepared, config, rank, progress)
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
    tables' pieces counts with the all-to-all it follows or precedes)."""
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
        mark()
        parts = [shard.forward_tier("hbm", batch)]
        mark()
        parts.append(shard.forward_tier("uvm", batch))
        mark()
        pooled = shard.combine(parts, config.batch_size)
        mark()
        dist.barrier()
        mark()
        features = assembly.forward(exchange.forward(pooled))
        mark()
        if config.train:
            grad = features / max(features.shape[0], 1)  # d/dx of 0.5 * mean_b |x_b|^2
            mark()
            local_grad = exchange.backward(assembly.backward(grad))
            mark()
            shard.backward_tier("hbm", batch, local_grad)
            mark()
            shard.backward_tier("uvm", batch, local_grad)
            mark()
        else:
            wall.extend([wall[-1]] * 4)
            cpu.extend([cpu[-1]] * 4)
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
    """Per-rank medians of every part, and of the derived components."""
    t = {k: np.asarray(v) for k, v in times.items()}
    derived = {
        "lookup": t["hbm_fwd"] + t["uvm_fwd"] + t["combine"],
        "comm": t["comm_fwd"] + t["comm_bwd"],
        "backward_optimizer": t["hbm_bwd"] + t["uvm_bwd"],
        "hbm": t["hbm_fwd"] + t["hbm_bwd"],
        "uvm": t["uvm_fwd"] + t["uvm_bwd"],
        "work": t["step"] - t["wait"] - t["dense"],
        "compute_cpu": sum((t[p] for p in CPU_PARTS), np.zeros_like(t["step"])),
    }
    medians = {k: float(np.median(v)) for k, v in {**t, **derived}.items()}
    return {
        "rank": rank, "host": socket.gethostname(), "device": str(device), "backend": backend,
        "tables": [x.name for x in shard.tables], "hbm_rows": [x.hbm_rows for x in shard.tables],
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


def main(argv: list[str]) -> int:
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
        result = run_rank(spec, rank, spec["world_size"], spec["init_method"], progress,
                          local_rank=rank, local_world=spec["world_size"])
        if result is not None:
            atomic_write_text(work / "result.json", json_text(result, indent=None))
        return 0
    except BaseException as exc:
        atomic_write_text(work / f"rank{rank}.error",
                          f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
