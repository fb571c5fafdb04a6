"""Microbenchmark of one device's whole table set: FBGEMM's table-batched operator holding 1 to
64 tables of mixed shapes.

A plan gives each device a set of tables that FBGEMM fuses into one table-batched operator
(TBE); the set's cost is not the sum of its tables' costs measured alone (one kernel launch,
shared caches and threads). Each configuration here is such a set: a random number of tables
(log-uniform over 1-64) with random rows, dim, pooling and Zipf skew each, one batch size,
trained (forward, backward with exact row-wise Adagrad fused). Rows are flushed as measured;
a rerun skips sets already in the file. Timing: the calling thread's CPU time with torch on one
thread, as :mod:`autoshard.cost_models.microbench`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.cost_models.microbench import Timing, done_ids, environment, time_passes
from autoshard.cost_models.operators import zipf_ranks
from autoshard.errors import InputError

DIMS = (8, 16, 32, 64, 128)
ALPHAS = (0.0, 0.8, 1.05, 1.3)
BATCHES = (256, 512, 1024)
#: Largest set, bytes of weights: keeps a sweep within a small shared machine's memory.
MAX_SET_BYTES = 192 * 2**20
COLUMNS = ["config_id", "set_seed", "batch", "num_tables", "rows", "dims", "poolings", "alphas",
           "lookups", "distinct", "fwd_ms", "fwd_p10_ms", "bwd_ms", "bwd_p10_ms", "repeats",
           "clock", "device", "hardware", "threads", "torch_version", "fbgemm_version"]
SET_TIMING = Timing(warmup=2, min_repeats=5, max_repeats=15, budget_s=0.2)


@dataclass(frozen=True)
class TableSet:
    """One device's tables: per-table rows, dim, pooling (lookups per bag), Zipf skew."""

    rows: tuple[int, ...]
    dims: tuple[int, ...]
    poolings: tuple[int, ...]
    alphas: tuple[float, ...]
    batch: int
    seed: int

    @property
    def config_id(self) -> str:
        doc = json.dumps([self.rows, self.dims, self.poolings, self.alphas, self.batch,
                          self.seed])
        return hashlib.sha1(doc.encode()).hexdigest()[:16]


def random_set(seed: int, max_tables: int = 64) -> TableSet:
    """A random set (module docstring) whose weights fit :data:`MAX_SET_BYTES`."""
    rng = np.random.default_rng([seed, 7])
    count = int(np.clip(np.round(np.exp(rng.uniform(0, np.log(max_tables)))), 1, max_tables))
    rows = np.exp(rng.uniform(np.log(100), np.log(300_000), count)).astype(int)
    dims = rng.choice(DIMS, count)
    budget = MAX_SET_BYTES / 4 / count
    rows = np.maximum(100, np.minimum(rows, (budget / dims).astype(int)))
    poolings = np.clip(np.round(np.exp(rng.uniform(0, np.log(40), count))), 1, 40).astype(int)
    return TableSet(tuple(int(r) for r in rows), tuple(int(d) for d in dims),
                    tuple(int(p) for p in poolings),
                    tuple(float(a) for a in rng.choice(ALPHAS, count)),
                    int(rng.choice(BATCHES)), seed)


class SetOperator:
    """FBGEMM's TBE over the set's tables on CPU, fed one step of Zipf lookups per table."""

    def __init__(self, s: TableSet) -> None:
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        specs = [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU)
                 for r, d in zip(s.rows, s.dims, strict=True)]
        self.op = SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01,
            pooling_mode=PoolingMode.SUM)
        rng = np.random.default_rng([s.seed, 11])
        ids, lengths, self.distinct = [], [], []
        for r, p, a in zip(s.rows, s.poolings, s.alphas, strict=True):
            ranks = zipf_ranks(r, a, s.batch * p, rng)
            perm = rng.permutation(r)
            ids.append(perm[ranks])
            lengths.append(np.full(s.batch, p))
            self.distinct.append(int(np.unique(ranks).size))
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
        self.indices = torch.from_numpy(np.concatenate(ids).astype(np.int64))
        self.offsets = torch.from_numpy(offsets.astype(np.int64))

    def forward(self) -> Any:
        return self.op(self.indices, self.offsets)

    def backward(self, out: Any) -> None:
        out.backward(out.detach())


def measure_set(s: TableSet, timing: Timing = SET_TIMING) -> dict[str, Any]:
    """Times one set (thread CPU time); its CSV fields without the environment columns."""
    op = SetOperator(s)
    fwd, bwd = time_passes(op, "cpu", timing)
    row: dict[str, Any] = {
        "config_id": s.config_id, "set_seed": s.seed, "batch": s.batch,
        "num_tables": len(s.rows), "rows": _join(s.rows), "dims": _join(s.dims),
        "poolings": _join(s.poolings), "alphas": _join(s.alphas),
        "lookups": _join([s.batch * p for p in s.poolings]), "distinct": _join(op.distinct),
        "repeats": len(fwd), "clock": "thread_cpu"}
    for name, values in (("fwd", fwd), ("bwd", bwd)):
        p10, p50 = np.percentile(values, [10, 50])
        row[f"{name}_ms"], row[f"{name}_p10_ms"] = round(p50, 5), round(p10, 5)
    return row


def _join(values: Any) -> str:
    return " ".join(str(v) for v in values)


def sweep_sets(count: int, output: Path, first_seed: int = 0, budget_s: float | None = None,
               progress: bool = False) -> int:
    """Measures sets ``first_seed .. first_seed + count - 1`` not yet in ``output``.

    Returns:
        Rows added.
    """
    import torch

    torch.set_num_threads(1)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = done_ids(output, COLUMNS, complete="bwd_p10_ms")
    env = environment("cpu")
    new = not output.exists() or output.stat().st_size == 0
    start, added = time.perf_counter(), 0
    with output.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for seed in range(first_seed, first_seed + count):
            s = random_set(seed)
            if s.config_id in done:
                continue
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            writer.writerow({**measure_set(s), **env})
            fh.flush()
            added += 1
            if progress and added % 10 == 0:
                print(f"{added} sets measured, {time.perf_counter() - start:.0f} s", flush=True)
    return added


def read_sets(path: Path) -> Any:
    """The set rows of a CSV as a DataFrame with list-valued per-table columns."""
    import pandas as pd

    if not path.is_file():
        raise InputError("no such file", source=str(path))
    df = pd.read_csv(path)
    for col in ("rows", "dims", "poolings", "alphas", "lookups", "distinct"):
        if col not in df.columns:
            raise InputError("missing column", source=str(path), field=col)
        df[col] = [np.array(str(v).split(), dtype=float) for v in df[col]]
    return df
