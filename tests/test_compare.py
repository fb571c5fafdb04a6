"""The comparison harness on the tiny suite: every sharder accounted for, plans valid, resume."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.compare.harness import COLUMNS, read_rows, run_suite
from autoshard.compare.report import markdown_table, summarize
from autoshard.compare.suites import SUITES, TaskSpec, get_suite
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.sharders import sharder_names
from autoshard.workloads import default_pools

BASELINES = ["random", "round_robin", "size_greedy", "dim_greedy", "lookup_greedy",
             "size_lookup_greedy"]


def test_pools_are_disjoint_halves() -> None:
    train, test = default_pools()
    assert len(train) + len(test) == 856
    assert not {t.name for t in train} & {t.name for t in test}


def test_suites_build_capacity_constrained_tasks() -> None:
    task = TaskSpec("x", 20, 4, 0.3).build()
    total = sum(t.rows * t.memory_bytes_per_row(True) for t in task.tables)
    hbm = sum(d.hbm.capacity_bytes for d in task.hardware.devices)
    assert task.num_tables == 20 and task.num_devices == 4
    assert hbm == pytest.approx(0.3 * total, rel=1e-6)
    assert set(SUITES) >= {"constrained-50x4", "constrained-100x8", "constrained-200x8",
                           "constrained-856x128", "rich-100x8", "infer-100x8"}


def test_run_suite_rows_valid_and_resumable(tmp_path: Path) -> None:
    model = AnalyticalCostModel()
    specs = get_suite("tiny")
    rows = run_suite("tiny", specs, model, tmp_path, BASELINES)
    assert len(rows) == len(specs) * len(BASELINES)
    for r in rows:
        assert r.status == "ok", r
        assert r.step_cost_ms >= r.lower_bound_ms * (1 - 1e-9)
        assert r.cost_ratio == pytest.approx(r.step_cost_ms / r.lower_bound_ms)
    csv_path = tmp_path / "tiny.csv"
    # An interrupted write leaves a torn last line: it is dropped and that row recomputed.
    text = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(text[:-1]) + "\n" + text[-1][: len(text[-1]) // 2])
    again = run_suite("tiny", specs, model, tmp_path, BASELINES)
    assert len(again) == len(rows)
    keys = [(r.task, r.sharder) for r in read_rows(csv_path)]
    assert len(keys) == len(set(keys)) == len(rows)


def test_summary_counts_and_markdown(tmp_path: Path) -> None:
    rows = run_suite("tiny", get_suite("tiny"), AnalyticalCostModel(), tmp_path,
                     ["size_greedy", "lookup_greedy"])
    summaries = {s.sharder: s for s in summarize(rows)}
    assert summaries["size_greedy"].ok == 2 and summaries["size_greedy"].failed == 0
    cost = {(r.task, r.sharder): r.step_cost_ms for r in rows}
    tasks = sorted({r.task for r in rows})
    logs = [math.log(cost[t, "size_greedy"] / min(cost[t, "size_greedy"], cost[t, "lookup_greedy"]))
            for t in tasks]
    assert summaries["size_greedy"].vs_best_greedy == pytest.approx(math.exp(sum(logs) / 2))
    assert min(s.vs_best_greedy for s in summaries.values()) >= 1.0 - 1e-12
    assert "| lookup_greedy |" in markdown_table(list(summaries.values()))


@pytest.mark.slow
def test_compare_cli_on_tiny_suite(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "autoshard", "compare", "--suite", "tiny", "--out", str(out),
         "--wandb-mode", "disabled", "--time-limit", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with (out / "tiny.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == COLUMNS
    present = {r["sharder"] for r in rows}
    assert present == set(sharder_names())  # every registered sharder accounted for
    for r in rows:
        assert r["status"] in ("ok", "skipped", "failed")
        if r["status"] == "ok":
            assert float(r["step_cost_ms"]) >= float(r["lower_bound_ms"]) * (1 - 1e-9)
        else:
            assert r["reason"]
    for name in ("tiny.md", "tiny.png", "tiny.devices.png", "tiny.devices.json"):
        assert (out / name).is_file()


def test_compare_cli_rejects_unknown_suite(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "autoshard", "compare", "--suite", "nope",
                           "--out", str(tmp_path), "--wandb-mode", "disabled"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "suite" in proc.stderr and "nope" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_compare_logs_an_offline_wandb_run(tmp_path: Path) -> None:
    from autoshard.training.wandb_runs import offline_history

    proc = subprocess.run(
        [sys.executable, "-m", "autoshard", "compare", "--suite", "tiny", "--out", "cmp",
         "--sharders", "size_greedy,lookup_greedy", "--wandb-mode", "offline"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr
    # Where the offline run went, and how to upload it, is printed.
    (run,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    said = " ".join(proc.stdout.split())
    assert f"offline run saved in runs/wandb/{run.name}" in said
    assert f"wandb sync runs/wandb/{run.name}" in said
    config, history, summary = offline_history(tmp_path / "runs")
    assert json.loads(config["suite"]) == "tiny"
    logged = {key.split("/_")[0].split("/artifact")[0] for row in history for key in row}
    assert {"compare/rows", "compare/tiny", "compare/tiny.devices"} <= logged
    assert {"size_greedy/mean_cost_ratio", "lookup_greedy/mean_cost_ratio"} <= set(summary)
