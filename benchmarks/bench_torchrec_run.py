"""Plans of one task run in TorchRec's DistributedModelParallel, beside our runner and the model.

Task: the 26 tables of the DCNv2 model (``autoshard.public_models`` ``dcnv2``: one dim, so the
model run is TorchRec's DLRM) with hash sizes divided by ``--shrink`` (at least 100 rows, never
more than the table has), on 2 devices of 8xH100-80GB whose HBM holds ``--hbm-fraction`` of
the tables' bytes, global batch ``--batch``, train. Every registered sharder plans it
(``autoshard plan``, ``--time-limit`` for those that take one). Each plan then runs
``--rounds`` times, sharders interleaved, as ``autoshard run-plan PLAN --engine torchrec
--compare-runner --device cpu`` on 2 gloo processes, which checks the sharded model's outputs
against the unsharded model's and reports:

- TorchRec's step: the slowest rank's median wall-clock training step (DLRM forward, loss,
  backward, fused row-wise Adagrad and the dense optimizer), and the busiest rank's median CPU
  time per step, which other processes on the host disturb less;
- our runner's measurement of the same plan (``autoshard.runner``): its step cost (the max
  over ranks of a rank's own lookup, all-to-all and backward time) and its wall step;
- the analytical model's step cost for the plan (planning profile: H100-class devices).

Measured figures are the minimum over rounds (other processes only ever add time). A plan that
TorchRec cannot run on CPU (row-wise splits: CUDA only) is listed with the refusal, not
dropped. Spearman's rank correlation of TorchRec's step (and CPU time) against the model's and
our runner's figures over the plans that ran says whether they order the plans alike, whatever
it is. Plans and finished runs are kept and reused by a rerun with the same settings
(``--fresh`` redoes them). Writes
``--out`` (default ``results/torchrec/run``): the tables, every plan and report, and
``benchmark.csv`` / ``benchmark.md`` with the command, the machine and its load average.

    .venv/bin/python benchmarks/bench_torchrec_run.py
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoshard.fileio import atomic_write_text, csv_text
from autoshard.hardware import GB, load_hardware
from autoshard.machine import describe_machine
from autoshard.public_models import model_tables
from autoshard.sharders import sharder_info, sharder_names
from autoshard.tables import Table, save_tables
from autoshard.workloads import total_bytes

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("sharder", "status", "torchrec_step_ms", "torchrec_rounds_ms", "torchrec_cpu_ms",
           "runner_step_ms", "runner_wall_ms", "modelled_ms", "outputs_equal", "max_abs_diff",
           "kernels_changed")


def small_tables(shrink: int) -> tuple[Table, ...]:
    """DCNv2's tables with hash sizes divided by ``shrink`` (at least 100 rows, at most the
    table's own)."""
    return tuple(replace(t, rows=min(t.rows, max(100, t.rows // shrink)))
                 for t in model_tables("dcnv2"))


def cli(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``autoshard ARGS`` in a fresh process from the repository root."""
    return subprocess.run([sys.executable, "-m", "autoshard", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def make_plans(out: Path, hbm_gb: float, args: argparse.Namespace) -> dict[str, str]:
    """Plans every available sharder into ``out/plans``; name -> '' or why there is none."""
    status: dict[str, str] = {}
    (out / "plans").mkdir(parents=True, exist_ok=True)
    for name in sharder_names():
        reason = sharder_info(name).unavailable
        if reason:
            status[name] = f"unavailable: {reason}"
            continue
        plan = out / "plans" / f"{name}.json"
        if plan.is_file() and not args.fresh:
            status[name] = ""
            continue
        done = cli(["plan", "-t", rel(out / "tables.yaml"), "--devices", "2",
                    "--hbm-gb", f"{hbm_gb:.9f}", "--batch-size", str(args.batch), "-s", name,
                    "--seed", "0", "--time-limit", str(args.time_limit), "-o", rel(plan)])
        status[name] = "" if done.returncode == 0 else f"plan failed: {last_line(done.stderr)}"
    return status


def rel(path: Path) -> str:
    """``path`` relative to the repository root (as plans record their tables)."""
    return os.path.relpath(path, ROOT)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_once(out: Path, name: str, round_: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run of one plan: its report, or the reason it did not run."""
    report = out / "runs" / f"{name}.round{round_}.json"
    if report.is_file() and not args.fresh:
        return json.loads(report.read_text())
    report.parent.mkdir(parents=True, exist_ok=True)
    done = cli(["run-plan", rel(out / "plans" / f"{name}.json"),
                "--engine", "torchrec", "--compare-runner", "--device", "cpu",
                "--iterations", str(args.iterations), "--warmup", str(args.warmup),
                "--timeout", "300", "--json", "-o", rel(report)])
    if done.returncode == 2:
        return {"refused": last_line(done.stderr)}
    if not report.is_file():
        return {"refused": f"exit {done.returncode}: {last_line(done.stderr)}"}
    return json.loads(report.read_text())


def row_of(name: str, status: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The CSV row of one sharder from its runs."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
    row["sharder"] = name
    if status:
        row["status"] = status
        return row
    if "refused" in runs[0]:
        row["status"] = f"refused: {runs[0]['refused']}"
        return row
    steps = [r["step_ms"] for r in runs]
    first = runs[0]
    row.update(status="ran", torchrec_step_ms=round(min(steps), 4),
               torchrec_rounds_ms=" ".join(f"{s:.3f}" for s in steps),
               torchrec_cpu_ms=round(min(max(p["torchrec_step_cpu_ms"] for p in r["per_device"])
                                         for r in runs), 4),
               runner_step_ms=round(min(r["runner"]["step_cost_ms"] for r in runs), 4),
               runner_wall_ms=round(min(r["runner_step_ms"] for r in runs), 4),
               modelled_ms=round(first["modelled_step_ms"], 5),
               outputs_equal=all(r["outputs_equal"] for r in runs),
               max_abs_diff=max(p["max_abs_diff"] for r in runs
                                for p in r["torchrec"]["per_rank"]),
               kernels_changed=sum(t["kernel"] != t["planned_kernel"]
                                   for t in first["torchrec"]["tables"]))
    return row


def spearman(rows: list[dict[str, Any]], a: str, b: str) -> tuple[float | None, int]:
    """Spearman's rho of columns ``a`` and ``b`` over the plans that ran, and their count."""
    from scipy.stats import spearmanr

    ran = [r for r in rows if r["status"] == "ran"]
    x, y = [r[a] for r in ran], [r[b] for r in ran]
    if len(ran) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, len(ran)
    return float(spearmanr(x, y)[0]), len(ran)


def markdown(rows: list[dict[str, Any]], setup: str, command: str, load: tuple[str, str]
             ) -> str:
    lines = ["# Plans run in TorchRec's DistributedModelParallel", "", setup, "",
             f"Command: `{command}`", "", f"Machine: {describe_machine(with_gpu=True)}; load "
             f"average (1, 5, 15 min) {load[0]} at the start, {load[1]} at the end.", "",
             "| sharder | status | TorchRec step ms | rounds | TorchRec CPU ms | runner step ms "
             "| runner wall ms | modelled ms | outputs equal | max abs diff | kernels changed |",
             "| " + " | ".join(["---"] * len(COLUMNS)) + " |"]
    for r in rows:
        cells = [r[c] for c in COLUMNS]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
    for a, b, what in (("torchrec_step_ms", "modelled_ms", "TorchRec step vs modelled"),
                       ("torchrec_cpu_ms", "modelled_ms", "TorchRec CPU time vs modelled"),
                       ("torchrec_step_ms", "runner_step_ms", "TorchRec step vs our runner's "
                                                              "step cost"),
                       ("runner_step_ms", "modelled_ms", "our runner's step cost vs modelled")):
        rho, n = spearman(rows, a, b)
        lines.append(f"- Spearman, {what}: {'n/a' if rho is None else f'{rho:.3f}'} over {n} "
                     "plans.")
    lines += ["", "'kernels changed': tables whose planned kernel TorchRec does not offer on "
              "this device and that ran as fused (on CPU it offers fused alone for sharded "
              "tables, so fused_uvm and fused_uvm_caching tables run from the same memory as "
              "the rest; the model prices their host-memory rows, the run cannot show them). "
              "'TorchRec CPU ms': the busiest rank's median CPU time per step (other processes "
              "on the host add less to it than to wall time). "
              "'runner step ms': our runner's step cost (max over ranks of a rank's own "
              "lookup, all-to-all and backward time); 'runner wall ms': its wall-clock step. "
              "The modelled figures price the planning profile (H100-class devices), so only "
              "their order is comparable with a CPU run's.", ""]
    return "\n".join(lines)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shrink", type=int, default=500)
    parser.add_argument("--hbm-fraction", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "torchrec" / "run")
    parser.add_argument("--fresh", action="store_true", help="replan and rerun everything")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start_load, started = load_average(), time.monotonic()
    settings = {k: getattr(args, k) for k in ("shrink", "hbm_fraction", "batch", "iterations",
                                              "warmup", "time_limit")}
    recorded = out / "settings.json"
    if recorded.is_file() and json.loads(recorded.read_text()) != settings:
        args.fresh = True  # plans and runs of other settings are not reused
    atomic_write_text(recorded, json.dumps(settings, indent=2) + "\n")
    tables = small_tables(args.shrink)
    save_tables(out / "tables.yaml", tables)
    need = total_bytes(tables, train=True)
    hbm_gb = args.hbm_fraction * need / 2 / GB
    status = make_plans(out, hbm_gb, args)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n, s in status.items() if not s}
    for round_ in range(args.rounds):
        for name in runs:
            if round_ and "refused" in runs[name][0]:
                continue
            runs[name].append(run_once(out, name, round_, args))
            print(f"round {round_} {name}: {runs[name][-1].get('step_ms', 'refused')}",
                  flush=True)
    rows = [row_of(n, s, runs.get(n, [])) for n, s in status.items()]
    atomic_write_text(out / "benchmark.csv", csv_text(rows, COLUMNS))
    profile = load_hardware("8xH100-80GB", devices=2)
    setup = (f"Task: the 26 DCNv2 tables (dim 128), hash sizes / {args.shrink} (at least 100 "
             f"rows), {need / 2**20:.0f} MiB with optimizer state; {profile.name} "
             f"with {hbm_gb * 1e3:.3f} MB of HBM per device ({args.hbm_fraction:g} of the bytes); "
             f"global batch {args.batch}, train. Each plan ran {args.rounds} times (sharders "
             f"interleaved) on 2 gloo processes; median of {args.iterations} steps after "
             f"{args.warmup} warm-up; measured = minimum over rounds. Took "
             f"{time.monotonic() - started:.0f} s.")
    command = shlex.join([".venv/bin/python", "benchmarks/bench_torchrec_run.py",
                          *(argv if argv is not None else sys.argv[1:])])
    atomic_write_text(out / "benchmark.md", markdown(rows, setup, command,
                                                     (start_load, load_average())))
    print((out / "benchmark.md").read_text())


if __name__ == "__main__":
    main()
