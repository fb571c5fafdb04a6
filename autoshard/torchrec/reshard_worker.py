"""One rank of a re-shard check (:func:`autoshard.torchrec.reshard.run_reshard`), run by the
local launcher as ``python -m autoshard.torchrec.reshard_worker SPEC RANK``. Each rank:

1. builds the unsharded model (seeded: every rank holds the same weights) and shards two copies
   of it in DistributedModelParallel under the plan in use: the one to re-shard, and a control
   that is never re-sharded; copies the unsharded weights into both and checks that the sharded
   outputs equal the unsharded model's;
2. trains both ``before_steps`` steps alike (TorchRec's fused row-wise Adagrad, Adagrad for the
   dense layers), so that the optimizer holds state;
3. gathers the trained weights into the unsharded model, and every table's optimizer state;
4. re-shards the first model in place (:func:`autoshard.torchrec.reshard.reshard`: TorchRec's
   ``DistributedModelParallel.reshard`` with the delta of the moved tables);
5. checks that its outputs still equal the unsharded model's (with the trained weights), that
   its optimizer state is the one gathered before, and that the moved tables' ranks are the new
   plan's;
6. trains both models ``after_steps`` more steps alike and checks that their outputs stay equal:
   the control moved nothing, so optimizer state lost or scrambled by the move would show here.

Rank 0 gathers every rank's figures.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

from autoshard.runner.config import RunConfig
from autoshard.runner.worker import rank_main
from autoshard.tables import Table
from autoshard.torchrec.dmp_model import (
    BUILTIN_PATH,
    build_models,
    dense_batch,
    feature_batches,
    feature_tables,
    to_kjt,
)
from autoshard.torchrec.dmp_worker import (
    Progress,
    compare_outputs,
    copy_weights,
    dense_optimizer,
    make_optimizer,
    make_step,
    shard_model,
    sharding_plan,
)
from autoshard.torchrec.reshard import Delta, reshard


def run_rank(spec: dict[str, Any], rank: int, world: int, init_method: str,
             progress: Progress) -> list[dict[str, Any]] | None:
    """Runs this rank (module docstring); returns every rank's figures on rank 0."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
    try:
        models = _Models.build(spec, rank, world)
        progress("sharded")
        result: dict[str, Any] = {"rank": rank, "sharded": models.against(models.reference)}
        lr = models.config.learning_rate
        dense = (dense_optimizer(models.dmp, lr), dense_optimizer(models.control, lr))
        control_step = models.step(models.control, dense[1])
        _train((models.step(models.dmp, dense[0]), control_step), spec["before_steps"],
               len(models.inputs))
        progress("trained before")
        _load_trained(models.reference, models.dmp, world)
        state = _optimizer_state(models.dmp, world)
        delta = Delta.from_dict(spec["delta"])
        result["volume_mib"] = reshard(models.dmp, delta, models.paths)
        progress("re-sharded")
        result["resharded"] = models.against(models.reference)
        result["optimizer_state"] = _same_state(state, _optimizer_state(models.dmp, world))
        result["ranks"] = {s.table: list(models.dmp.plan.plan[models.paths[s.table]][s.table]
                                         .ranks) for s in delta.tables}
        # The fused optimizer is made anew by the re-shard; the dense one carries on.
        _train((models.step(models.dmp, dense[0]), control_step), spec["after_steps"],
               len(models.inputs))
        progress("trained after")
        result["control"] = _against_control(models)
        result["steps_after"] = spec["after_steps"]
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
        return gathered if rank == 0 else None
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class _Models:
    """One rank's models and inputs: the unsharded reference, the model re-sharded and the
    control, their collections' paths by table and features by path, and the input batches."""

    spec: dict[str, Any]
    config: RunConfig
    reference: Any
    dmp: Any
    control: Any
    paths: dict[str, str]
    keys: dict[str, list[str]]
    inputs: list[tuple[dict[str, Any], Any]]

    @classmethod
    def build(cls, spec: dict[str, Any], rank: int, world: int) -> _Models:
        """Step 1 of the module docstring, the check aside."""
        import torch

        config = RunConfig.from_dict(spec["config"])
        device = torch.device("cpu")
        tables = [Table.from_dict(d) for d in spec["tables"]]
        reference, first = build_models(spec, tables, device)
        _, second = build_models(spec, tables, device)
        found = feature_tables(reference)
        paths = {name: path for path, held in found.items() for name in held}
        plan = sharding_plan(spec, paths, device.type, world)
        dmp, control = (shard_model(m, plan, device, config.learning_rate)
                        for m in (first, second))
        for model in (dmp, control):
            copy_weights(model, reference)
        keys = {path: [f for _, _, names in held.values() for f in names]
                for path, held in found.items()}
        inputs = _inputs(spec, tables, found, keys, config, rank, world, device)
        return cls(spec, config, reference, dmp, control, paths, keys, inputs)

    @property
    def builtin(self) -> bool:
        return self.spec["model"] is None

    def against(self, reference: Any) -> dict[str, Any]:
        """The re-sharded model's outputs against the unsharded ``reference``'s."""
        return compare_outputs(self.dmp, reference, self.keys, self.inputs, self.builtin,
                               self.spec["tolerance"])

    def step(self, model: Any, dense: Any) -> Any:
        """A training step of ``model`` with its fused optimizer as it is now and ``dense``."""
        lr = self.config.learning_rate
        return make_step(model, self.inputs, self.builtin, True, lr,
                         make_optimizer(model, lr, dense))


def _inputs(spec: dict[str, Any], tables: list[Table], found: dict[str, dict[str, Any]],
            keys: dict[str, list[str]], config: RunConfig, rank: int, world: int,
            device: Any) -> list[tuple[dict[str, Any], Any]]:
    """This rank's input batches: features per collection, and a dense batch."""
    batches = feature_batches(spec, tables, {n: f for held in found.values()
                                             for n, (_, _, f) in held.items()}, rank)
    local = config.batch_size // world
    return [({p: to_kjt(b, k, device) for p, k in keys.items()},
             dense_batch(config.seed, rank, i, local, device)) for i, b in enumerate(batches)]


def _train(steps: tuple[Any, Any], count: int, batches: int) -> None:
    """``count`` steps of both models, on the same batches."""
    for i in range(count):
        for step in steps:
            step(i % batches)


def _load_trained(reference: Any, dmp: Any, world: int) -> None:
    """Copies ``dmp``'s weights (every rank's shards gathered) into the unsharded
    ``reference``."""
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    local, whole = {}, {}
    for key, value in dmp.state_dict().items():
        if isinstance(value, ShardedTensor):
            local[key] = [(tuple(s.metadata.shard_offsets), s.tensor.detach().cpu())
                          for s in value.local_shards()]
        else:
            whole[key] = value.detach().cpu()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    target = reference.state_dict()
    with torch.no_grad():
        for key, value in whole.items():
            target[key].copy_(value)
        for shards in gathered:
            for key, pieces in shards.items():
                for (r0, c0), tensor in pieces:
                    target[key][r0:r0 + tensor.shape[0], c0:c0 + tensor.shape[1]].copy_(tensor)


def _optimizer_state(dmp: Any, world: int) -> dict[str, Any]:
    """Every rank's fused optimizer state, by state name and shard offsets."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    local = {}
    for state in dmp.fused_optimizer.state_dict()["state"].values():
        for name, value in state.items():
            if isinstance(value, ShardedTensor):
                for s in value.local_shards():
                    local[f"{name}@{list(s.metadata.shard_offsets)}"] = s.tensor.detach().cpu()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return {k: v for part in gathered for k, v in part.items()}


def _same_state(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Whether the optimizer state is the same before and after (and how much of it there
    is, and how much of it is not zero: state that was there to carry)."""
    import torch

    same = sorted(before) == sorted(after) and all(
        torch.equal(before[k], after[k]) for k in before)
    return {"carried": bool(same), "entries": len(before),
            "nonzero": int(sum(int((v != 0).sum()) for v in before.values()))}


def _against_control(models: _Models) -> dict[str, Any]:
    """The re-sharded model's outputs against the control's, on every batch."""
    import torch

    def out(model: Any, kjts: dict[str, Any], dense: Any) -> list[Any]:
        pooled = []
        for path, names in models.keys.items():
            got = model.module.get_submodule(path)(kjts[path])
            got = (got.wait() if hasattr(got, "wait") else got).to_dict()
            pooled += [got[n].detach() for n in names]
        if models.builtin:
            pooled.append(model(dense[0], kjts[BUILTIN_PATH]).detach())
        return pooled

    worst, equal = 0.0, True
    with torch.no_grad():
        for kjts, dense in models.inputs:
            for a, b in zip(out(models.dmp, kjts, dense), out(models.control, kjts, dense),
                            strict=True):
                worst = max(worst, float((a - b).abs().max()) if a.numel() else 0.0)
                equal = equal and bool(torch.allclose(a, b, **models.spec["tolerance"]))
    return {"equal": equal, "max_abs_diff": worst}


def main(argv: list[str]) -> int:
    """``SPEC RANK``: runs the rank (:func:`autoshard.runner.worker.rank_main`)."""
    return rank_main(argv, lambda spec, rank, progress: run_rank(
        spec, rank, spec["world_size"], spec["init_method"], progress))


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as autoshard.torchrec.dmp_worker: no teardown of TorchRec's threads
