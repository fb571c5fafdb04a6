"""Profiler throughput (lookups per second on one core) and peak memory, against a plain
``np.unique`` profiler measured in the same run, on a synthetic trace of >= 100 M lookups.

    .venv/bin/python benchmarks/bench_profiler.py            # writes results/bench/profiler.md

Two traces are generated to /tmp (about 8 bytes per lookup each) and reused by later runs:
Meta's batch size over as many default tables as reach the lookups, and all 856 default tables
over a smaller batch (more rows per lookup, so more of the work is per row).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from autoshard.fileio import atomic_write_text  # noqa: E402
from autoshard.machine import describe_machine  # noqa: E402
from autoshard.stats import profile_trace_file  # noqa: E402
from autoshard.stats.readers.dlrm import Trace, load_trace, save_trace  # noqa: E402
from autoshard.stats.table_stats import profile_table, reuse_bin  # noqa: E402
from autoshard.synth import (  # noqa: E402
    DEFAULT_BATCH,
    DEFAULT_COUNT,
    SynthTable,
    draw_tables,
    generate_trace,
)
from autoshard.tables import REUSE_BINS  # noqa: E402


def unique_profile(indices: np.ndarray, lengths: np.ndarray, rows: int) -> dict[str, object]:
    """The baseline: the textbook profiler, np.unique for counts, a sort for the CDF."""
    _, counts = np.unique(indices, return_counts=True)
    hot = np.sort(counts)[::-1]
    cdf = np.cumsum(hot) / max(hot.sum(), 1)
    bins = reuse_bin(counts)
    present = lengths > 0
    return {"rows_used": counts.size, "cdf": cdf[:: max(cdf.size // 64, 1)],
            "reuse": np.bincount(bins, minlength=REUSE_BINS), "coverage": present.mean(),
            "pooling": lengths[present].mean() if present.any() else 0.0}


def ensure_trace(path: Path, specs: Sequence[SynthTable], batch: int, seed: int) -> None:
    if path.is_file():
        return
    print(f"generating {path}: {len(specs)} tables x {batch} samples", flush=True)
    save_trace(path, *generate_trace(specs, batch, seed))


def workloads(lookups: float, seed: int) -> list[tuple[str, list[SynthTable], int]]:
    """(label, tables, batch): Meta's batch of 65536 over as many of the default tables as
    reach ``lookups``, and all 856 tables over as small a batch as reaches it."""
    specs = list(draw_tables(DEFAULT_COUNT, seed))
    per_sample = np.cumsum([t.pooling_factor * t.coverage for t in specs])
    count = int(np.searchsorted(per_sample * DEFAULT_BATCH, lookups * 1.05)) + 1
    batch = int(np.ceil(lookups * 1.05 / per_sample[-1]))
    return [(f"batch{DEFAULT_BATCH}", specs[:count], DEFAULT_BATCH),
            (f"t{DEFAULT_COUNT}", specs, batch)]


def timed(fn: Callable[[], object]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds of this process (one thread: time on one core) and the
    tracemalloc peak (bytes) of one call."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, cpu, peak


def in_memory(trace: Trace, sizes: list[int], fn: Callable[..., object]) -> Callable[[], None]:
    def run() -> None:
        for t in range(trace.num_tables):
            indices, lengths = trace.table(t)
            fn(indices, lengths, sizes[t])
    return run


def measure(path: Path, sizes: list[int]
            ) -> tuple[Trace, list[tuple[str, float, float, float]]]:
    trace = load_trace(path)
    np.asarray(trace.indices).sum()  # page the memory-mapped trace in before timing
    rows = [
        ("autoshard, in memory (bincount)",
         *timed(in_memory(trace, sizes, lambda i, ln, h: profile_table("t", i, ln, h)))),
        ("autoshard, from the file (load, checks, profile)",
         *timed(lambda: profile_trace_file(path, sizes))),
        ("baseline: np.unique + sort, in memory",
         *timed(in_memory(trace, sizes, unique_profile))),
    ]
    return trace, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=float, default=1e8, help="Lookups per trace.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/bench/profiler.md"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    lines = [
        "# Profiler throughput",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_profiler.py --lookups {args.lookups:g} "
        f"--seed {args.seed}`",
        f"Machine: {describe_machine()}; one thread (OMP/MKL/torch threads = 1), load average "
        f"{os.getloadavg()[0]:.1f} at the start (the machine is shared, so wall time "
        "includes waiting for a core; CPU time is the time spent on one). "
        f"Python {sys.version.split()[0]}, numpy {np.__version__}.",
        "",
    ]
    for label, specs, batch in workloads(args.lookups, args.seed):
        path = Path(f"/tmp/autoshard_bench_{label}_{args.lookups:g}_{args.seed}.pt")
        ensure_trace(path, specs, batch, args.seed)
        sizes = [t.rows for t in specs]
        trace, rows = measure(path, sizes)
        n = int(trace.indices.size)
        lines += [
            f"## {trace.num_tables} tables x {trace.batch_size} samples",
            "",
            f"Synthetic trace (calibrated generator, seed {args.seed}): {n:,} lookups, "
            f"{sum(sizes):,} rows in all ({n / sum(sizes):.2f} lookups per row).",
            "",
            "| profiler | wall s | CPU s | lookups / CPU s | lookups / wall s | speed-up vs "
            "baseline (CPU) | peak traced memory |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        base = rows[-1][2]
        for name, seconds, cpu, peak in rows:
            lines.append(f"| {name} | {seconds:.2f} | {cpu:.2f} | {n / cpu / 1e6:.1f} M | "
                         f"{n / seconds / 1e6:.1f} M | {base / cpu:.2f}x | "
                         f"{peak / 2**20:.0f} MiB |")
        lines.append("")
        print("\n".join(lines[-8:]), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    lines += [f"Peak resident memory of the whole run (incl. generating the traces and the "
              f"memory-mapped trace): {rss:.0f} MiB. Peak traced memory counts numpy "
              "allocations while profiling (tracemalloc), not the memory-mapped file.", ""]
    atomic_write_text(args.out, "\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
