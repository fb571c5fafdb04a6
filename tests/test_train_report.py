"""What `autoshard train` reports: one held-out figure everywhere, the steps run, defaults in
--help, no infinity, and every option's range checked before anything is written."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_helpers import run_cli

from autoshard.compare.harness import CompareRow
from autoshard.errors import InputError
from autoshard.training.callbacks import RunState
from autoshard.training.config import LIMITS, TrainConfig
from autoshard.training.evaluation import POLICY_SHARDER, best_greedy_ratio, mean_ratio
from autoshard.training.plots import training_curve
from autoshard.training.report import (
    TrainResult,
    describe,
    held_out_note,
    results_csv,
    summary,
)
from autoshard.training.train import train

#: A run of a few hundred steps on tiny tasks of one workload, evaluated twice on four
#: held-out tasks.
TINY = {"timesteps": 256, "n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
        "train_tables": (4, 8), "batch_sizes": (4096,), "modes": ("train",),
        "eval_tables": (8, 30), "eval_devices": (2, 4), "eval_repeats": 1, "eval_every": 128,
        "checkpoint_every": 128, "hidden": 16, "wandb_mode": "disabled"}
#: The same on the command line, without the evaluation period.
TINY_ARGS = ["--n-envs", "2", "--n-steps", "64", "--batch-size", "64", "--n-epochs", "2",
             "--train-tables", "4", "8", "--batch-sizes", "4096", "--modes", "train",
             "--eval-tables", "8", "--eval-devices", "2", "--eval-repeats", "1", "--hidden",
             "16", "--wandb-mode", "disabled"]


def strict_json(path: Path) -> Any:
    """A JSON file read strictly: NaN and Infinity are refused."""
    def refuse(name: str) -> None:
        raise ValueError(f"{path} holds {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.slow
def test_summary_curve_and_evaluation_report_one_held_out_figure(tmp_path: Path) -> None:
    """The periodic evaluation plans as the final one does (the ppo-policy sharder's
    decodes), so the best figure of summary.json and the curve is eval.csv's mean for the kept
    policy (they were 41.4 and 1.04 for one run when the two decoded differently)."""
    result = train(TrainConfig(out=str(tmp_path / "run"), **TINY))  # type: ignore[arg-type]
    run = tmp_path / "run"
    summary = strict_json(run / "summary.json")
    history = strict_json(run / "history.json")
    evals = [h["eval_ratio"] for h in history if "eval_ratio" in h]
    assert len(evals) == 2 and all(r is not None and r >= 1.0 for r in evals)
    with (run / "eval.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["sharder"] == POLICY_SHARDER]
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    final = float(np.mean([float(r["cost_ratio"]) for r in rows]))
    assert summary["best_held_out_ratio"] == pytest.approx(final, rel=1e-12)
    assert summary["held_out_ratio"] == pytest.approx(final, rel=1e-12)
    assert summary["best_held_out_ratio"] == min(evals) == result.best_ratio
    assert summary["held_out_sharder"] == POLICY_SHARDER and summary["held_out_tasks"] == 4
    kept = strict_json(run / "policy" / "config.json")["trained"]
    assert kept["held_out_cost_ratio"] == summary["best_held_out_ratio"]


@pytest.mark.slow
def test_steps_printed_are_those_run_and_no_evaluation_is_said_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """100 steps asked of rollouts of 2 x 64: 128 are run, printed with the reason; no
    evaluation ran (one every 20,000 steps), so there is no best figure: null and words,
    never inf or Infinity."""
    code, out, err = run_cli(["train", "--timesteps", "100", "--out", str(tmp_path / "run"),
                              *TINY_ARGS], capsys)
    assert code == 0, err
    line = " ".join(out.split())
    assert line.startswith("trained 128 steps (100 asked; PPO collects whole rollouts of "
                           "2 x 64 = 128 steps, so the request was rounded up)")
    assert "no evaluation ran during training (one every 20,000 steps)" in line
    assert "inf" not in line.split("policy in")[0]
    summary = strict_json(tmp_path / "run" / "summary.json")
    assert (summary["steps"], summary["steps_asked"], summary["rollout_steps"]) == (128, 100, 128)
    assert summary["best_held_out_ratio"] is None
    assert "no evaluation ran" in summary["held_out_note"]
    assert summary["held_out_ratio"] >= 1.0  # the last policy, evaluated at the end
    strict_json(tmp_path / "run" / "checkpoints" / "state.json")


def shown_default(value: Any, name: str) -> str:
    """How --help shows a field's default."""
    if isinstance(value, bool):
        return name.replace("_", "-") if value else "no-" + name.replace("_", "-")
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    return "(none)" if value == "" else str(value)


def test_help_shows_every_default_and_range(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run_cli(["train", "--help"], capsys)
    assert code == 0
    lines = {line.split()[1]: " ".join(line.split()) for line in out.splitlines()
             if line.strip("│ ").startswith("--")}
    for f in fields(TrainConfig):
        line = lines["--" + f.name.replace("_", "-")]
        assert f"[default: {shown_default(f.default, f.name)}]" in line, line
        if f.name in LIMITS:
            assert LIMITS[f.name].help() in line, line


def test_every_number_has_a_range_and_is_refused_outside_it() -> None:
    numeric = {f.name for f in fields(TrainConfig)
               if not isinstance(f.default, (bool, str)) and not (
                   isinstance(f.default, tuple) and isinstance(f.default[0], str))}
    assert numeric == set(LIMITS)
    for name, limit in LIMITS.items():
        default = getattr(TrainConfig(), name)
        for bad in (limit.high * 2 + 1, limit.low - 1, float("nan")):
            value = (bad,) * len(default) if isinstance(default, tuple) else bad
            with pytest.raises(InputError, match=rf"field '{name}'.*{re.escape(str(limit))}"):
                TrainConfig(**{name: value})


@pytest.mark.parametrize("args", [["--learning-rate", "nan"], ["--gamma", "2"],
                                  ["--clip-range", "-1"], ["--train-tables", "10", "5"],
                                  ["--hidden", "1000000000"], ["--batch-size", "1"],
                                  ["--modes", "serve"], ["--init-policy", "/nonexistent/p"]])
def test_bad_options_fail_before_the_run_folder_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    out = tmp_path / "deep" / "run"
    code, _, err = run_cli(["train", "--out", str(out), *TINY_ARGS, *args], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "Traceback" not in err
    option = args[0].lstrip("-").replace("-", "_")
    assert option in err.replace("-", "_") or "/nonexistent/p" in err, err
    assert not (tmp_path / "deep").exists()


def test_a_range_message_names_the_option_value_and_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--gamma", "2"], capsys)
    assert code == 2
    assert err.strip() == ("error: command line, field '--gamma', value 2.0: must be a number "
                           "in [0, 1]")


def test_a_saved_config_is_checked_like_a_new_one() -> None:
    with pytest.raises(InputError, match=r"run/config.json, field 'hidden', value 'wide'"):
        TrainConfig.from_dict({"hidden": "wide"}, source="run/config.json")
    with pytest.raises(InputError, match=r"run/config.json, field 'gamma'"):
        TrainConfig.from_dict({"gamma": [1]}, source="run/config.json")
    with pytest.raises(InputError, match="expected a mapping"):
        TrainConfig.from_dict([1, 2], source="run/config.json")  # type: ignore[arg-type]
    assert TrainConfig.from_dict({"train_tables": [4, 8]}).train_tables == (4, 8)


def row(task: str, sharder: str, ratio: float | None) -> CompareRow:
    """A comparison row: ok with ``ratio``, failed without one."""
    base = {"suite": "s", "task": task, "tables": 8, "devices": 2, "mode": "train",
            "sharder": sharder}
    if ratio is None:
        return CompareRow(status="failed", reason="no room", **base)  # type: ignore[arg-type]
    return CompareRow(status="ok", cost_ratio=ratio, step_cost_ms=ratio, lower_bound_ms=1.0,
                      **base)  # type: ignore[arg-type]


def test_a_failed_task_leaves_no_figure_and_says_why(tmp_path: Path) -> None:
    """Where the policy (or every greedy sharder) fails a task there is no mean: None, never
    inf or NaN, in the figures, the CSV, the summary and the printed line."""
    rows = [row("a", POLICY_SHARDER, 1.5), row("b", POLICY_SHARDER, None)]
    greedy = [row("a", "size_greedy", 2.0), row("a", "dim_greedy", 3.0),
              row("b", "size_greedy", None), row("b", "dim_greedy", 4.0)]
    assert mean_ratio(rows) is None and mean_ratio(rows[:1]) == 1.5
    assert best_greedy_ratio(greedy) == 3.0 and best_greedy_ratio(greedy[2:3]) is None
    csv_text = results_csv(rows + greedy)
    assert "nan" not in csv_text.lower() and "inf" not in csv_text.lower()
    cfg = TrainConfig(**TINY)  # type: ignore[arg-type]
    result = TrainResult(tmp_path, 256, 256, 0, 1.0, False, None, tmp_path / "policy",
                         held_out_tasks=2)
    note = held_out_note(cfg, result, evaluated=True)
    assert "no evaluation during training found a plan for every held-out task" in note
    assert "the kept policy found no plan" in note
    line = describe(replace(result, held_out_note=note))
    assert "inf" not in line and "nan" not in line and "found no plan" in line
    doc = summary(cfg, replace(result, held_out_note=note), None)
    assert json.loads(json.dumps(doc, allow_nan=False))["best_held_out_ratio"] is None
    history = [{"step": 128, "eval_ratio": None, "greedy_ratio": None, "failed_tasks": 1},
               {"step": 128, "train_ratio": 3.0}]
    assert training_curve(history, tmp_path / "curve.png").is_file()
    assert RunState(history=history).to_dict()["best_ratio"] is None


def test_resume_takes_the_runs_own_options_and_says_which_policy_is_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--resume`` needs only the run folder (and what it changes); training shows its steps
    as it goes (lines on stderr here, no terminal); the line printed says which step's policy
    is kept."""
    run = tmp_path / "run"
    code, out, err = run_cli(["train", "--timesteps", "128", "--eval-every", "64",
                              "--out", str(run), *TINY_ARGS], capsys)
    assert code == 0, err
    assert "training (environment steps): 128 of 128 steps (100%)" in err
    code, out, err = run_cli(["train", "--resume", "--timesteps", "256", "--out", str(run)],
                             capsys)
    assert code == 0, err
    line = " ".join(out.split())
    assert line.startswith("trained 256 steps")
    summary = strict_json(run / "summary.json")
    kept = summary["kept_policy_step"]
    assert kept in (64, 128, 192, 256) and f"of step {kept:,}" in line
    assert strict_json(run / "policy" / "config.json")["trained"]["steps"] == kept
    code, _, err = run_cli(["train", "--resume", "--hidden", "32", "--out", str(run)], capsys)
    assert code == 2 and "hidden" in err  # a setting of the run itself cannot change
    code, _, err = run_cli(["train", "--resume", "--out", str(tmp_path / "none")], capsys)
    assert code == 2 and "no run to resume" in err


def test_a_fine_tuning_run_that_never_beat_its_start_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A policy fine-tuned for fewer steps than the evaluation period keeps its starting
    policy (evaluated at step 0): the line says it is that policy, unchanged, and why."""
    start = tmp_path / "start"
    code, _, err = run_cli(["train", "--timesteps", "128", "--out", str(tmp_path / "first"),
                            "--export-policy", str(start), *TINY_ARGS], capsys)
    assert code == 0, err
    code, out, err = run_cli(["train", "--timesteps", "128", "--out", str(tmp_path / "tuned"),
                              "--init-policy", str(start), *TINY_ARGS], capsys)
    assert code == 0, err
    line = " ".join(out.split())
    assert "kept the starting policy (step 0), unchanged: no evaluation ran during training " \
        "(one every 20,000 steps)" in line
    assert strict_json(tmp_path / "tuned" / "summary.json")["kept_policy_step"] == 0
