"""Measured vs modelled step cost of the plans of one task, and whether the two rank plans alike.

Plans one small DLRM-like task (``--tables`` tables from :func:`autoshard.workloads.dlrm_tables`
with hash sizes divided by ``--shrink`` so that every table fits this host; 2 devices whose HBM
holds half the tables' bytes, so plans split rows into host memory) with every sharder in the
registry (unavailable ones are listed with the reason; a plan that fails is counted, not
dropped). Each plan runs on 2 gloo ranks with ``autoshard.runner.run_plan`` for ``--rounds``
rounds, sharders interleaved within a round. The measured step cost (max over ranks of the
rank's own median work; the minimum over rounds, as other processes only ever add time) is
compared with the analytical model under two profiles: the planning profile (H100-class
devices, HBM capped) and a profile of this host (both tiers at the single-thread DRAM copy
bandwidth, links at the 2-rank gloo all-to-all bandwidth, both measured at the start of the same
run). Spearman's rank correlation says whether measured and modelled costs order the plans
alike; the correlation between rounds 1 and 2 says how repeatable the measurement itself is on
this host.

Per cost model (``--cost-models``: the analytical model under this host's profile, learned
model folders such as the committed LightGBM model, one calibrated to this machine and the
device-level set model), it also compares modelled with measured compute per device (each
plan's ranks: the forward, backward and optimizer CPU time of a rank's two tiers, minimum over
rounds) by Spearman's rank correlation and MAPE. Learned models price this host's profile,
where both tiers have the same bandwidth, as the runner's ranks do on CPU.

Interrupted runs resume: finished measurements are kept in ``<out>/benchmark.partial.jsonl``
and reused by a rerun with the same settings.

    .venv/bin/python benchmarks/bench_run_plan.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import PlannerError
from autoshard.fileio import atomic_write_text, csv_text
from autoshard.hardware import HardwareProfile, Tier
from autoshard.layout.plan import Plan
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.runner import RunConfig, run_plan
from autoshard.sharders import common_options, get_sharder, sharder_info, sharder_names
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

COLUMNS = ("sharder", "status", "measured_ms", "measured_rounds_ms", "measured_wall_ms",
           "modelled_ms", "modelled_host_ms", "measured_over_modelled", "measured_compute_ms",
           "measured_compute_rounds_ms", "measured_cpu_ms", "measured_cpu_rounds_ms",
           "modelled_compute_ms", "modelled_host_compute_ms",
           "measured_balance", "modelled_balance", "measured_uvm_share", "modelled_uvm_share")
#: Measures compared by rank (measured column, its per-round column, modelled columns): the step
#: (lookups, all-to-all, backward), its compute alone (max over ranks of the two tiers' forward,
#: backward and optimizer time), which is what the plans change (the all-to-all volume is the
#: same for every plan), and that compute as CPU time, which other processes on the host
#: disturb less than wall time.
MEASURES = {
    "step": ("measured_ms", "measured_rounds_ms", "modelled_ms", "modelled_host_ms"),
    "compute": ("measured_compute_ms", "measured_compute_rounds_ms", "modelled_compute_ms",
                "modelled_host_compute_ms"),
    "compute CPU time": ("measured_cpu_ms", "measured_cpu_rounds_ms", "modelled_compute_ms",
                         "modelled_host_compute_ms"),
}


def compute_ms(report: dict[str, Any]) -> float:
    """Max over devices of the HBM-tier plus host-tier time of a report (as a dict)."""
    return max(d["hbm_ms"] + d["uvm_ms"] for d in report["per_device"])


def small_tables(count: int, shrink: int, seed: int = 0) -> tuple[Table, ...]:
    """DLRM-like tables with hash sizes divided by ``shrink`` (at least 100 rows)."""
    return tuple(replace(t, rows=max(100, t.rows // shrink)) for t in dlrm_tables(count, seed))


def copy_bandwidth_gbps(megabytes: int = 256, repeats: int = 5) -> float:
    """Single-thread DRAM copy bandwidth (read + write bytes / s), best of ``repeats``, GB/s."""
    import torch

    torch.set_num_threads(1)
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def _alltoall_rank(rank: int, port: int, floats: int, repeats: int, out: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    send, recv = torch.ones(floats), torch.empty(floats)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_to_all_single(recv, send)
        best = min(best, time.perf_counter() - start)
    if rank == 0:
        out.put(send.nbytes / 2 / best / 1e9)  # bytes leaving one rank per second
    dist.destroy_process_group()


def alltoall_gbps(megabytes: int = 8, repeats: int = 10) -> float:
    """Bandwidth of a 2-rank gloo all-to-all on loopback: bytes leaving a rank / s, GB/s."""
    import torch.multiprocessing as mp

    from autoshard.runner.launch import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_alltoall_rank, args=(free_port(), megabytes * 2**18, repeats, queue),
                       nprocs=2, start_method="spawn")
    return float(queue.get())


def host_profile(profile: HardwareProfile, memory_gbps: float, link_gbps: float
                 ) -> HardwareProfile:
    """The planning profile's capacities with both tiers at ``memory_gbps`` and the links at
    ``link_gbps``."""
    devices = tuple(replace(d, hbm=Tier(d.hbm.capacity_bytes, memory_gbps),
                            host=Tier(d.host.capacity_bytes, memory_gbps))
                    for d in profile.devices)
    return replace(profile, name="this-host", devices=devices, intra_node_gbps=link_gbps,
                   inter_node_gbps=link_gbps)


def make_plans(task: ShardingTask) -> tuple[dict[str, Plan], dict[str, str]]:
    """A plan per available sharder; the reason for each sharder without one."""
    model = AnalyticalCostModel()
    plans: dict[str, Plan] = {}
    skipped: dict[str, str] = {}
    for name in sharder_names():
        reason = sharder_info(name).unavailable
        if reason:
            skipped[name] = f"unavailable: {reason}"
            continue
        try:
            plans[name] = get_sharder(name, **common_options(name, {"seed": 0})).shard(task, model)
        except PlannerError as exc:
            skipped[name] = f"failed: {exc}"
    return plans, skipped


def measure(plans: dict[str, Plan], task: ShardingTask, config: RunConfig, rounds: int,
            partial: Path, key: str) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` measured runs of every plan, interleaved; resumes from ``partial``."""
    done: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
    if partial.is_file():
        for line in partial.read_text().splitlines():
            entry = json.loads(line)
            if entry["key"] == key and entry["sharder"] in done:
                done[entry["sharder"]].append(entry["measured"])
    for r in range(rounds):
        for name, plan in plans.items():
            if len(done[name]) > r:
                continue
            result = run_plan(plan, task, config)
            assert result is not None
            doc = result.measured.to_dict()
            done[name].append(doc)
            with partial.open("a") as fh:
                fh.write(json.dumps({"key": key, "sharder": name, "measured": doc}) + "\n")
            print(f"round {r + 1}: {name} {doc['step_cost_ms']:.2f} ms", flush=True)
    return done


def spearman(a: list[float], b: list[float]) -> tuple[float, float]:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan"), float("nan")
    rho, p = spearmanr(a, b)
    return float(rho), float(p)


def build_rows(plans: dict[str, Plan], skipped: dict[str, str], task: ShardingTask,
               host_task: ShardingTask, runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    model = AnalyticalCostModel()
    rows: list[dict[str, Any]] = []
    for name, plan in plans.items():
        modelled = evaluate(plan, task, model).to_dict()
        on_host = evaluate(plan, host_task, model).to_dict()
        steps = [m["step_cost_ms"] for m in runs[name]]
        compute = [compute_ms(m) for m in runs[name]]
        cpu = [max(d["compute_cpu_ms"] for d in m["per_device"]) for m in runs[name]]
        rows.append({
            "sharder": name, "status": "ok", "measured_ms": min(steps),
            "measured_rounds_ms": ";".join(f"{s:.3f}" for s in steps),
            "measured_wall_ms": min(m["step_wall_ms"] for m in runs[name]),
            "modelled_ms": modelled["step_cost_ms"],
            "modelled_host_ms": on_host["step_cost_ms"],
            "measured_over_modelled": min(steps) / modelled["step_cost_ms"],
            "measured_compute_ms": min(compute),
            "measured_compute_rounds_ms": ";".join(f"{s:.3f}" for s in compute),
            "measured_cpu_ms": min(cpu),
            "measured_cpu_rounds_ms": ";".join(f"{s:.3f}" for s in cpu),
            "modelled_compute_ms": compute_ms(modelled),
            "modelled_host_compute_ms": compute_ms(on_host),
            "measured_balance": statistics.median(m["load_balance"] for m in runs[name]),
            "modelled_balance": modelled["load_balance"],
            "measured_uvm_share": runs[name][0]["uvm_lookup_share"],
            "modelled_uvm_share": modelled["uvm_lookup_share"]})
    rows += [{"sharder": n, "status": why} for n, why in skipped.items()]
    return rows


def correlations(rows: list[dict], runs: dict[str, list[dict[str, Any]]]
                 ) -> dict[str, tuple[float, float]]:
    """Spearman (rho, p) of measured vs modelled, per measure, and between rounds."""
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict[str, tuple[float, float]] = {}
    for measure, (meas, key, mod, host) in MEASURES.items():
        got = [r[meas] for r in ok]
        out[f"{measure}: measured vs modelled (planning profile)"] = spearman(
            got, [r[mod] for r in ok])
        out[f"{measure}: measured vs modelled (this-host profile)"] = spearman(
            got, [r[host] for r in ok])
        per_round = np.array([[float(v) for v in r[key].split(";")] for r in ok]).T
        pairs = [spearman(list(a), list(b)) for i, a in enumerate(per_round)
                 for b in per_round[i + 1:]]
        if pairs:
            out[f"{measure}: one round vs another, mean over {len(pairs)} pairs "
                "(repeatability)"] = (float(np.mean([p[0] for p in pairs])),
                                      float(np.mean([p[1] for p in pairs])))
    return out


#: Cost models compared per device by default (missing folders are reported as skipped).
DEFAULT_MODELS = ("analytical,autoshard/data/cost_model,results/cost_model/calibration/model,"
                  "results/cost_model/set_model/model")


def per_device_models(plans: dict[str, Plan], host_task: ShardingTask,
                      runs: dict[str, list[dict[str, Any]]], specs: list[str]
                      ) -> dict[str, dict[str, Any]]:
    """Spearman and MAPE of modelled vs measured compute CPU time per (plan, device)."""
    from autoshard.errors import InputError
    from autoshard.pricing.cost import load_cost_model

    measured = np.array([min(m["per_device"][d]["compute_cpu_ms"] for m in runs[name])
                         for name in plans for d in range(host_task.num_devices)])
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        try:
            model = load_cost_model(spec)
        except InputError as exc:
            out[spec] = {"skipped": str(exc)}
            continue
        modelled = np.array([d.hbm_ms + d.uvm_ms for name, plan in plans.items()
                             for d in evaluate(plan, host_task, model).per_device])
        rho, p = spearman(list(measured), list(modelled))
        out[spec] = {"model": model.name, "spearman": rho, "p": p, "points": int(measured.size),
                     "mape": float(np.mean(np.abs(modelled - measured) / measured))}
    return out


def models_markdown(per_model: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["", "Modelled vs measured compute per device (each plan's ranks; measured: CPU time "
             "of a rank's lookups, backward and optimizer over both tiers, minimum over rounds; "
             "modelled: the model's HBM + host compute of that device under this host's "
             "profile):", "", "| cost model | kind | Spearman | p | MAPE | points |",
             "|---|---|---:|---:|---:|---:|"]
    for spec, r in per_model.items():
        if "skipped" in r:
            lines.append(f"| `{spec}` | skipped: {r['skipped']} | | | | |")
            continue
        lines.append(f"| `{spec}` | {r['model']} | {r['spearman']:.3f} | {r['p']:.2g} | "
                     f"{100 * r['mape']:.1f}% | {r['points']} |")
    return lines


def to_markdown(rows: list[dict], corr: dict[str, tuple[float, float]], setup: str,
                command: str, machine: str) -> str:
    lines = ["# Measured vs modelled step cost (autoshard run-plan)", "",
             f"Command: `{command}`", "", f"Machine: {machine}", "", setup, "",
             "| sharder | step ms measured | wall ms | step ms modelled (planning / this host) | "
             "compute ms measured (wall / CPU) | compute ms modelled (planning / this host) | "
             "balance meas. / mod. | UVM lookups meas. / mod. |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['sharder']} | {r['status']} | | | | | | |")
            continue
        lines.append(
            f"| {r['sharder']} | {r['measured_ms']:.2f} | {r['measured_wall_ms']:.2f} | "
            f"{r['modelled_ms']:.4f} / {r['modelled_host_ms']:.3f} | "
            f"{r['measured_compute_ms']:.2f} / {r['measured_cpu_ms']:.2f} | "
            f"{r['modelled_compute_ms']:.4f} / {r['modelled_host_compute_ms']:.3f} | "
            f"{r['measured_balance']:.3f} / {r['modelled_balance']:.3f} | "
            f"{r['measured_uvm_share']:.1%} / {r['modelled_uvm_share']:.1%} |")
    lines += ["", "Per-round figures are in benchmark.csv.", "",
              "| Spearman rank correlation over the plans | rho | p |", "|---|---:|---:|"]
    lines += [f"| {k} | {rho:.3f} | {p:.3f} |" for k, (rho, p) in corr.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=16)
    parser.add_argument("--shrink", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kernel", default="torch", choices=("torch", "fbgemm"))
    parser.add_argument("--out", type=Path, default=Path("results/run_plan"))
    parser.add_argument("--cost-models", default=DEFAULT_MODELS,
                        help="Comma-separated cost models compared per device.")
    args = parser.parse_args(argv)
    command = " ".join([".venv/bin/python", "benchmarks/bench_run_plan.py",
                        *(argv if argv is not None else sys.argv[1:])])
    machine = describe_machine(with_gpu=True)
    load = os.getloadavg()
    gbps = copy_bandwidth_gbps()
    link = alltoall_gbps()
    tables = small_tables(args.tables, args.shrink)
    task = constrained_task(tables, 2, hbm_fraction=0.5, batch_size=args.batch)
    host_task = ShardingTask(task.tables, host_profile(task.hardware, gbps, link), task.workload)
    plans, skipped = make_plans(task)
    config = RunConfig(batch_size=args.batch, iterations=args.iterations, warmup=args.warmup,
                       kernel=args.kernel, device="cpu", timeout_s=300)
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "benchmark.partial.jsonl"
    key = json.dumps([args.tables, args.shrink, config.to_dict()])
    runs = measure(plans, task, config, args.rounds, partial, key)
    rows = build_rows(plans, skipped, task, host_task, runs)
    corr = correlations(rows, runs)
    mib = sum(t.rows * (t.row_bytes + 4) for t in tables) / 2**20
    setup = (f"Task: {args.tables} DLRM-like tables (hash sizes / {args.shrink}, "
             f"{mib:.0f} MiB with optimizer state), 2 devices of {task.hardware.name} with HBM "
             f"holding half the bytes, batch {args.batch}, train. Each plan ran {args.rounds} "
             f"times (sharders interleaved) on 2 gloo ranks, {args.kernel} kernel, median of "
             f"{args.iterations} steps after {args.warmup} warm-up; 'step ms measured' is the "
             "minimum over rounds (the least disturbed by other processes) of the max over "
             "ranks of a rank's own work (lookup + all-to-all + backward/optimizer), 'wall ms' "
             "likewise of the step wall clock including waits, 'compute ms' the max over ranks "
             "of the tiers' lookup, backward and optimizer time without the all-to-all (whose "
             "volume is the same for every plan), as wall time and as the ranks' CPU time. "
             "Load average (1 min) at the start / end: "
             f"{load[0]:.1f} / {os.getloadavg()[0]:.1f}. This-host "
             f"profile: both tiers at {gbps:.1f} GB/s (single-thread DRAM copy) and the "
             f"links at {link:.2f} GB/s (2-rank gloo all-to-all on loopback), both measured at "
             "the start of this run. On this host the 'devices' are 2 processes sharing its "
             "CPU cores and both tiers are the same DRAM, so measured costs do not see the "
             "HBM/host split the planning profile prices; absolute ratios measured / modelled "
             "compare a CPU with an H100 model and mean little, the rankings are the point.")
    atomic_write_text(args.out / "benchmark.csv", csv_text(rows, COLUMNS))
    per_model = per_device_models(plans, host_task, runs, args.cost_models.split(","))
    markdown = to_markdown(rows, corr, setup, command, machine)
    markdown += "\n".join(models_markdown(per_model)) + "\n"
    atomic_write_text(args.out / "benchmark.md", markdown)
    atomic_write_text(args.out / "per_device_models.json", json.dumps(
        {"command": command, "machine": machine, "models": per_model}, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    print(markdown)
    print(f"wrote {args.out}/benchmark.csv and {args.out}/benchmark.md")


if __name__ == "__main__":
    main()
