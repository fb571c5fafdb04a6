"""Times embedding operators over a grid of configurations and appends one CSV row per config.

Each row holds the configuration, the partition's statistics (rows, lookups, distinct rows
touched), the median and 10th/90th percentiles of forward and of backward(+optimizer) latency
over repeated runs after warm-up, the clock, and the hardware and library versions.

Clocks: CUDA events on GPU. On CPU, the CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID)
with torch pinned to one thread: on a machine shared with other jobs, wall-clock time also counts
the time the scheduler gives the core to them (on a loaded 2-core machine, 2x for 20 ms
operators), the thread's CPU time does not. Rows are flushed as
they are measured; a rerun skips configuration ids already in the file, so an interrupted sweep
resumes without duplicates or loss (a truncated last line is dropped first).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.cost_models.grid import BenchConfig, grid_configs
from autoshard.cost_models.operators import build_operator, fbgemm_available, make_lookups
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text, read_text
from autoshard.machine import cpu_model

CONFIG_FIELDS = [f for f in BenchConfig.__dataclass_fields__]
COLUMNS = ["config_id", *CONFIG_FIELDS, "part_rows", "lookups", "distinct_rows", "share",
           "fwd_ms", "fwd_p10_ms", "fwd_p90_ms", "bwd_ms", "bwd_p10_ms", "bwd_p90_ms",
           "repeats", "clock", "device", "hardware", "threads", "torch_version", "fbgemm_version"]


@dataclass(frozen=True)
class Timing:
    """How long to measure each configuration.

    Args:
        warmup: Untimed forward+backward iterations first.
        min_repeats: Timed iterations at least.
        max_repeats: Timed iterations at most.
        budget_s: Stop repeating once this many seconds of timed work are done (after
            ``min_repeats``).
    """

    warmup: int = 3
    min_repeats: int = 7
    max_repeats: int = 31
    budget_s: float = 0.25


def environment(device: str) -> dict[str, Any]:
    """Hardware name and library versions recorded with every row."""
    import torch

    hardware = torch.cuda.get_device_name(0) if device.startswith("cuda") else cpu_model()
    try:
        from importlib.metadata import version

        fbgemm = next((version(p) for p in ("fbgemm-gpu", "fbgemm-gpu-cpu")
                       if _has_dist(p)), "")
    except Exception:  # a missing version is recorded as empty
        fbgemm = ""
    return {"device": device, "hardware": hardware, "threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "fbgemm_version": fbgemm}


def _has_dist(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def clock_name(device: str) -> str:
    return "cuda_event" if device.startswith("cuda") else "thread_cpu"


def _clock(device: str) -> Callable[[Callable[[], Any]], tuple[Any, float]]:
    """Runs a callable and returns (result, ms): CUDA events on GPU, the calling thread's CPU
    time on CPU."""
    import torch

    if device.startswith("cuda"):
        def cuda_clock(fn: Callable[[], Any]) -> tuple[Any, float]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            torch.cuda.synchronize()
            return result, float(start.elapsed_time(end))
        return cuda_clock

    def cpu_clock(fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.thread_time_ns()
        result = fn()
        return result, (time.thread_time_ns() - t0) * 1e-6
    return cpu_clock


def time_passes(op: Any, device: str, timing: Timing) -> tuple[list[float], list[float]]:
    """Forward and backward times (ms) of ``op`` (``forward()``, ``backward(out)``): warm-up,
    then repeats until ``timing``'s minimum count and budget are met (at most its maximum)."""
    clock = _clock(device)
    for _ in range(timing.warmup):
        op.backward(op.forward())
    fwd: list[float] = []
    bwd: list[float] = []
    spent = 0.0
    while len(fwd) < timing.max_repeats and (len(fwd) < timing.min_repeats
                                              or spent < timing.budget_s * 1e3):
        out, f_ms = clock(op.forward)
        _, b_ms = clock(partial(op.backward, out))
        fwd.append(f_ms)
        bwd.append(b_ms)
        spent += f_ms + b_ms
    return fwd, bwd


def measure(cfg: BenchConfig, device: str = "cpu", timing: Timing = Timing()) -> dict[str, Any]:
    """Times one configuration; returns its CSV fields (without the environment columns)."""
    lk = make_lookups(cfg)
    op = build_operator(cfg, lk, device)
    fwd, bwd = time_passes(op, device, timing)
    row: dict[str, Any] = {"config_id": cfg.config_id, **asdict(cfg),
                           "part_rows": cfg.part_rows, "lookups": lk.lookups,
                           "distinct_rows": lk.distinct, "share": round(lk.share, 6),
                           "repeats": len(fwd), "clock": clock_name(device)}
    for name, values in (("fwd", fwd), ("bwd", bwd)):
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        row.update({f"{name}_ms": round(p50, 5), f"{name}_p10_ms": round(p10, 5),
                    f"{name}_p90_ms": round(p90, 5)})
    return row


def device_configs(grid: str, device: str) -> tuple[list[BenchConfig], list[str]]:
    """The grid's configurations runnable on ``device``, and notes on what was left out.

    On CPU there is one tier, ``host``. On CUDA every configuration is measured at the ``hbm``,
    ``uvm`` and ``uvm_caching`` tiers (FBGEMM's DEVICE, MANAGED, MANAGED_CACHING); the torch
    operator has no caching tier (its ``uvm`` reads rows from pinned host memory), and FBGEMM
    configurations are dropped where FBGEMM has no working CUDA build.
    """
    cuda = device.startswith("cuda")
    tiers = ("hbm", "uvm", "uvm_caching") if cuda else ("host",)
    configs = [c for tier in tiers for c in grid_configs(grid, tier)]
    notes = []
    if cuda:
        configs = [c for c in configs if not (c.op == "torch" and c.tier == "uvm_caching")]
        if not fbgemm_available(device):
            configs = [c for c in configs if c.op != "fbgemm"]
            notes.append("FBGEMM unavailable on CUDA: torch operator only")
    return configs, notes


def done_ids(path: Path, columns: list[str] = COLUMNS, complete: str = "bwd_p90_ms"
             ) -> set[str]:
    """Config ids already measured in ``path``; drops a truncated last line (and nothing else).

    Args:
        columns: The header the file must have.
        complete: A column that a fully written row fills.

    Raises:
        InputError: the file exists but its header is not this harness's.
    """
    if not path.exists() or path.stat().st_size == 0:
        return set()
    text = read_text(path)
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        atomic_write_text(path, text)
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames != columns:
        raise InputError("not a microbenchmark CSV of this version (header differs)",
                         source=str(path), field="header", value=",".join(reader.fieldnames or []))
    return {row["config_id"] for row in reader if row.get(complete)}


def sweep(configs: Iterable[BenchConfig], output: Path, device: str = "cpu",
          timing: Timing = Timing(), progress: bool = True, budget_s: float | None = None
          ) -> int:
    """Measures every configuration not yet in ``output``, appending a flushed row per config.

    Args:
        budget_s: Stop starting new configurations after this many seconds of wall time.

    Returns:
        The number of rows added.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    done = done_ids(output)
    todo = [c for c in configs if c.config_id not in done]
    env = environment(device)
    new_file = not output.exists() or output.stat().st_size == 0
    start, added = time.perf_counter(), 0
    with output.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
            fh.flush()
        for cfg in _progress(todo, progress, len(done), budget_s):
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            writer.writerow({**measure(cfg, device, timing), **env})
            fh.flush()
            added += 1
    return added


def _progress(items: list[BenchConfig], show: bool, already: int, budget_s: float | None
              ) -> Iterator[BenchConfig]:
    """``items`` while a bar counts the configurations measured, those of an earlier run
    (``already``) included; with a budget the bar fills with the seconds used of it, since the
    sweep stops there, and says how many of the configurations it measured."""
    if not show:
        yield from items
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    total = already + len(items)
    label = "measuring" + (f" ({already:,} measured before)" if already else "")
    if budget_s is None:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("configurations"), TimeElapsedColumn(),
                      TimeRemainingColumn()) as bar:
            task = bar.add_task(label, total=total, completed=already)
            for item in items:
                yield item
                bar.advance(task)
        return
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.fields[measured]:,} of {task.fields[of]:,} "
                             "configurations"), TimeElapsedColumn(),
                  TextColumn(f"of the {budget_s:g} s budget")) as bar:
        task = bar.add_task(label, total=budget_s, measured=already, of=total)
        try:
            for count, item in enumerate(items, start=already + 1):
                yield item
                bar.update(task, completed=min(time.perf_counter() - start, budget_s),
                           measured=count)
        finally:  # the budget ends the sweep: the bar is full either way
            bar.update(task, completed=budget_s)
