"""One rank of a plan run in TorchRec's DistributedModelParallel (:mod:`autoshard.torchrec.dmp`).

Run by the local launcher (:func:`autoshard.runner.launch.launch_local`) as
``python -m autoshard.torchrec.dmp_worker SPEC RANK``. Each rank:

1. builds the unsharded model (the reference, on CPU, seeded: every rank holds the same
   weights) and a copy of it, which it shards in ``DistributedModelParallel`` with the plan;
2. copies the reference's weights into the sharded model (each local shard from its slice of
   the reference's tables, every other tensor whole);
3. feeds every distinct batch to the sharded and the unsharded EmbeddingBagCollections and
   compares their pooled embeddings (and, for the built-in models, the logits);
4. trains (or, in inference, runs forward) for the warm-up and timed steps: a dense optimizer
   beside TorchRec's fused row-wise Adagrad for the embeddings, and times each step.

Rank 0 gathers every rank's figures and writes them for the launcher.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from autoshard.runner.config import RunConfig
from autoshard.runner.worker import inject_fault, pick_device, rank_main
from autoshard.tables import Table
from autoshard.torchrec.dmp_model import (
    BUILTIN_PATH,
    build_models,
    dense_batch,
    feature_batches,
    feature_tables,
    to_kjt,
)

Progress = Callable[[str], None]


# --- the sharded model --------------------------------------------------------------------------

def sharding_plan(spec: dict[str, Any], paths: dict[str, str], device_type: str,
                  local: int) -> Any:
    """TorchRec's ShardingPlan of the spec's tables, each under its collection's path."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        ParameterSharding,
        ShardingPlan,
    )

    plans: dict[str, Any] = {}
    for t in spec["runs"]:
        shards = t["shards"]
        layout = None if not shards else EnumerableShardingSpec([
            ShardMetadata(shard_offsets=[r0, c0], shard_sizes=[rows, cols],
                          placement=placement(device_type, rank, local))
            for r0, c0, rows, cols, rank in shards])
        clf = t["cache_load_factor"]
        plans.setdefault(paths[t["table"]], EmbeddingModuleShardingPlan())[t["table"]] = (
            ParameterSharding(sharding_type=t["sharding_type"], compute_kernel=t["kernel"],
                              ranks=list(t["ranks"]), sharding_spec=layout,
                              cache_params=None if clf is None else CacheParams(
                                  load_factor=clf)))
    return ShardingPlan(plans)


def shard_model(module: Any, plan: Any, device: Any, learning_rate: float) -> Any:
    """``module`` in DistributedModelParallel under ``plan``; fused row-wise Adagrad for the
    embeddings TorchRec runs with a fused kernel."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel

    sharder = EmbeddingBagCollectionSharder(fused_params={
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": learning_rate})
    return DistributedModelParallel(module, device=device, plan=plan, sharders=[sharder])


def copy_weights(dmp: Any, reference: Any) -> int:
    """Copies the reference's state into the sharded model in place: each local shard of a
    sharded table from its slice (TorchRec's own ``load_state_dict`` cannot splice a rank's
    column blocks of different widths), every other tensor whole; returns the tensors copied.

    Raises:
        RuntimeError: A key the reference lacks, or a state type this cannot copy.
    """
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    source = reference.state_dict()
    copied = 0
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            if key not in source:
                raise RuntimeError(f"the unsharded model has no '{key}'")
            whole = source[key]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    (r0, c0), (rows, cols) = (shard.metadata.shard_offsets,
                                              shard.metadata.shard_sizes)
                    shard.tensor.copy_(whole[r0:r0 + rows, c0:c0 + cols])
            elif isinstance(value, torch.Tensor) and type(value) is torch.Tensor:
                value.copy_(whole)
            else:
                raise RuntimeError(f"cannot copy '{key}' ({type(value).__name__})")
            copied += 1
    return copied


# --- the run ------------------------------------------------------------------------------------

def _wait(result: Any) -> Any:
    return result.wait() if hasattr(result, "wait") else result


def compare_outputs(dmp: Any, reference: Any, keys: dict[str, list[str]],
                    inputs: list[tuple[dict[str, Any], Any]], builtin: bool,
                    tolerance: dict[str, float]) -> dict[str, Any]:
    """Pooled embeddings (and, for the built-in model, whose dense part both sides share,
    logits) of the sharded model against the unsharded one on every input batch. Each check
    has its own verdict: whether all its outputs are finite and close (``torch.allclose``
    with ``tolerance``; None for logits not checked) and its largest absolute difference
    (None if any output is not finite, or not checked)."""
    import torch

    worst = {"pooled": 0.0, "logits": 0.0}
    finite = {"pooled": True, "logits": True}
    close = {"pooled": True, "logits": True}
    checked = 0

    def record(what: str, got: Any, want: Any) -> None:
        got = got.detach().float().cpu()
        if got.numel():
            diff = float((got - want).abs().max())
            finite[what] = (finite[what] and bool(torch.isfinite(got).all())
                            and bool(np.isfinite(diff)))
            worst[what] = max(worst[what], diff if np.isfinite(diff) else 0.0)
        close[what] = close[what] and bool(torch.allclose(got, want, rtol=tolerance["rtol"],
                                                          atol=tolerance["atol"]))

    with torch.no_grad():
        for kjts, dense in inputs:
            for path, names in keys.items():
                cpu = kjts[path].to(torch.device("cpu"))
                want = reference.get_submodule(path)(cpu).to_dict()
                got = _wait(dmp.module.get_submodule(path)(kjts[path])).to_dict()
                for name in names:
                    record("pooled", got[name], want[name])
                    checked += 1
            if builtin:
                features = kjts[BUILTIN_PATH]
                record("logits", dmp(dense[0], features),
                       reference(dense[0].cpu(), features.to(torch.device("cpu"))))

    def verdict(what: str) -> tuple[bool, float | None]:
        return close[what] and finite[what], worst[what] if finite[what] else None

    pooled, pooled_diff = verdict("pooled")
    logits, logits_diff = verdict("logits") if builtin else (None, None)
    return {"pooled_equal": pooled, "logits_equal": logits,
            "equal": pooled and logits is not False, "checked": checked,
            "max_abs_diff": pooled_diff, "logits_max_abs_diff": logits_diff}


def dense_optimizer(dmp: Any, learning_rate: float) -> Any:
    """Adagrad for what TorchRec's fused optimizer does not update (dense layers, replicated
    tables)."""
    import torch
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    return KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=learning_rate))


def make_optimizer(dmp: Any, learning_rate: float, dense: Any = None) -> Any:
    """TorchRec's fused optimizer of the sharded embeddings beside :func:`dense_optimizer` (or
    ``dense``, one made before)."""
    from torchrec.optim.keyed import CombinedOptimizer

    return CombinedOptimizer([dmp.fused_optimizer, dense or dense_optimizer(dmp, learning_rate)])


def make_step(dmp: Any, inputs: list[tuple[dict[str, Any], Any]], builtin: bool,
              train: bool, learning_rate: float, optimizer: Any = None
              ) -> Callable[[int], None]:
    """One step on input batch ``i``: the built-in model's forward and binary cross-entropy; for
    a user's model, its collections alone and 0.5 x the mean squared norm of their pooled
    embeddings (its own forward's signature is the user's). Training adds backward and the
    step of ``optimizer`` (default :func:`make_optimizer`)."""
    import torch

    if train and optimizer is None:
        optimizer = make_optimizer(dmp, learning_rate)
    if not train:
        optimizer = None

    def loss_of(i: int) -> Any:
        kjts, (dense, labels) = inputs[i]
        if builtin:
            logits = dmp(dense, kjts[BUILTIN_PATH]).squeeze(-1)
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        pooled = [_wait(dmp.module.get_submodule(p)(k)).values() for p, k in kjts.items()]
        return sum(0.5 * x.pow(2).sum() / max(x.shape[0], 1) for x in pooled)

    def step(i: int) -> None:
        if optimizer is None:
            with torch.no_grad():
                loss_of(i)
            return
        optimizer.zero_grad()
        loss_of(i).backward()
        optimizer.step()

    return step


def run_steps(step: Callable[[int], None], count: int, config: RunConfig, rank: int,
              device: Any, progress: Progress) -> tuple[list[float], list[float]]:
    """Warm-up and timed steps, all ranks starting each step together; per timed step the
    wall time and this thread's CPU time, ms."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    wall: list[float] = []
    cpu: list[float] = []
    for s in range(config.warmup + config.iterations):
        if s == 0:
            inject_fault(rank)
        progress(f"step {s} (in a collective)")
        dist.barrier()
        sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        step(s % count)
        sync()
        if s >= config.warmup:
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.thread_time() - c0) * 1e3)
        progress(f"step {s} done")
    return wall, cpu


def run_rank(spec: dict[str, Any], rank: int, world: int, init_method: str,
             progress: Progress) -> list[dict[str, Any]] | None:
    """Runs this rank; returns every rank's figures on rank 0, None elsewhere."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    config = RunConfig.from_dict(spec["config"])
    device = pick_device(spec["device_type"], rank, world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
    try:
        progress("connected")
        tables = [Table.from_dict(d) for d in spec["tables"]]
        reference, to_shard = build_models(spec, tables, device)
        found = feature_tables(reference)
        paths = {name: path for path, held in found.items() for name in held}
        plan = sharding_plan(spec, paths, device.type, world)
        dmp = shard_model(to_shard, plan, device, config.learning_rate)
        copy_weights(dmp, reference)
        progress("sharded")
        keys = {path: [f for _, _, names in held.values() for f in names]
                for path, held in found.items()}
        batches = feature_batches(spec, tables, {n: f for held in found.values()
                                                 for n, (_, _, f) in held.items()}, rank)
        local = config.batch_size // world
        inputs = [({p: to_kjt(b, k, device) for p, k in keys.items()},
                   dense_batch(config.seed, rank, i, local, device)) for i, b in enumerate(batches)]
        builtin = spec["model"] is None
        check = compare_outputs(dmp, reference, keys, inputs, builtin, spec["tolerance"])
        progress("checked")
        step = make_step(dmp, inputs, builtin, config.train, config.learning_rate)
        wall, cpu = run_steps(step, len(inputs), config, rank, device, progress)
        result = {"rank": rank, "host": socket.gethostname(), "device": str(device),
                  "backend": backend, "step_ms": float(np.median(wall)),
                  "step_cpu_ms": float(np.median(cpu)), "steps": len(wall), "check": check}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        return gathered if rank == 0 else None
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    """``SPEC RANK``: runs the rank (:func:`autoshard.runner.worker.rank_main`)."""
    return rank_main(argv, lambda spec, rank, progress: run_rank(
        spec, rank, spec["world_size"], spec["init_method"], progress))


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skips the interpreter's teardown, where the threads of TorchRec's and gloo's objects
    # sometimes abort the process ("terminate called without an active exception") after the
    # rank's work and files are done.
    os._exit(code)
