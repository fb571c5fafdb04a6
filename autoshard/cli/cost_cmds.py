"""Cost-model commands: ``bench`` (microbenchmarks) and ``cost-model fit|eval``."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from autoshard.cli.app import app
from autoshard.cli.common import SeedOpt, check_output_path, console, print_json, ranged
from autoshard.errors import InputError
from autoshard.extras import require, require_all
from autoshard.fileio import output_folder
from autoshard.limits import THREADS, TIME_LIMIT_S, Range


@app.command()
def bench(
    output: Annotated[Path, typer.Option("--output", "-o", help="CSV to append rows to.")],
    grid: Annotated[str, typer.Option(help="Grid: tiny, quick, default or gpu.")] = "default",
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda sweeps hbm, uvm and "
                                              "uvm_caching tiers).")] = "cpu",
    threads: Annotated[int, ranged(THREADS, "Torch CPU threads.")] = 1,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    every: Annotated[int, ranged(Range(1, 1_000_000, integer=True), "Measure every N-th "
                                 "configuration only (to re-measure a sample of a grid).")] = 1,
) -> None:
    """Time embedding operators over a grid; resumes a partly written CSV."""
    torch = require("torch", "costmodel")
    from autoshard.cost_models.microbench import device_configs, sweep

    check_output_path(output)
    if device not in ("cpu", "cuda"):
        raise InputError("must be cpu or cuda", field="device", value=device)
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("no CUDA device is available", field="device", value=device)
    torch.set_num_threads(threads)
    configs, notes = device_configs(grid, device)
    configs = configs[::every]
    for note in notes:
        console.print(note)
    start = time.perf_counter()
    added = sweep(configs, output, device=device, progress=progress)
    console.print(f"measured {added} of {len(configs)} configurations in "
                  f"{time.perf_counter() - start:.1f} s; wrote {output}")


#: LightGBM boosting rounds.
EstimatorsOpt = Annotated[int, ranged(Range(1, 100_000, integer=True), "Boosting rounds.")]

cost_model_app = typer.Typer(help="Fit, evaluate and compare learned cost models.",
                             no_args_is_help=True)
app.add_typer(cost_model_app, name="cost-model")

DataArg = Annotated[list[Path], typer.Argument(
    help="Microbenchmark CSV file(s); a configuration measured in several is pooled.")]
StatOpt = Annotated[str, typer.Option(
    help="Timing statistic learned: median or p10 (lower decile of the repeats).")]


def _load_data(paths: list[Path]) -> tuple[Any, dict[str, Any], list[Any]]:
    """Rows of the CSVs (together, and per file) and a summary of where they were measured."""
    pd = require("pandas", "costmodel")
    from autoshard.fileio import check_csv_header, open_text

    frames = []
    for path in paths:
        with open_text(path) as fh:  # a binary file or a repeated column: an error naming it
            check_csv_header(next(csv.reader(fh), None), str(path))
        try:
            frames.append(pd.read_csv(path, encoding="utf-8-sig"))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise InputError(f"unreadable CSV ({exc})", source=str(path)) from exc
        if frames[-1].empty:
            raise InputError("no measurements (the CSV has a header but no rows)",
                             source=str(path))
    df = pd.concat(frames, ignore_index=True)
    if "config_id" not in df.columns:
        raise InputError("missing column", source=str(paths[0]), field="config_id", value=None)
    info: dict[str, Any] = {"data": [str(p) for p in paths],
                            "configurations": int(df["config_id"].nunique()),
                            "measurements": len(df)}
    for col in ("hardware", "device", "torch_version", "fbgemm_version", "tier"):
        if col in df.columns:
            info[col] = sorted({str(v) for v in df[col].dropna()})
    return df, info, frames


@cost_model_app.command("fit")
def fit_cmd(
    data: DataArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write.")],
    n_estimators: EstimatorsOpt = 600,
    seed: SeedOpt = 0,
    wandb_mode: Annotated[str, typer.Option(help="W&B logging: disabled or offline.")] = (
        "disabled"),
    stat: StatOpt = "p10",
) -> None:
    """Fit the LightGBM cost model on all rows of the data and save it (text model + JSON)."""
    from autoshard.cost_models.evaluate import metrics, shown
    from autoshard.cost_models.features import dataset
    from autoshard.cost_models.model import LightGBMCostModel

    if wandb_mode not in ("disabled", "offline"):
        raise InputError("must be disabled or offline", field="wandb_mode", value=wandb_mode)
    check_output_path(output / "model.txt")
    df, info, _frames = _load_data(data)
    X, y, _ = dataset(df, source=",".join(map(str, data)), stat=stat)
    info["stat"] = stat
    info["machine"] = measured_machine(info)
    model = LightGBMCostModel(n_estimators=n_estimators, random_state=seed).fit(X, y, info=info)
    model.save(output)
    scores = metrics(model.predict(X), y)
    if wandb_mode == "offline":
        _log_wandb(output, model.get_params(), info, scores)
    console.print(f"fitted on {info['configurations']} configurations ({len(y)} samples); "
                  f"training MAPE {shown(scores['mape'], '.2f', 100)}%, Spearman "
                  f"{shown(scores['spearman'])}; wrote {output}")


def measured_machine(info: dict[str, Any]) -> dict[str, Any]:
    """The machine that measured the data: this one (recorded in full) when the data name this
    CPU only, else the CPU name(s) the data give, with no fingerprint."""
    from autoshard.machine import cpu_model, machine_record

    names = info.get("hardware", [])
    if names == [cpu_model()] and info.get("device") == ["cpu"]:
        return machine_record()
    return {"cpu_model": ", ".join(names) or None, "fingerprint": None}


def load_partition_model(model_dir: Path) -> Any:
    """A learned model that predicts partition latency from features (``predict(X)``)."""
    from autoshard.pricing.cost import load_cost_model

    model = load_cost_model(str(model_dir))
    if not hasattr(model, "predict_partitions"):
        raise InputError("not a partition-latency model (LightGBM or calibrated)",
                         source=str(model_dir), field="kind", value=getattr(model, "kind", None))
    return model


def _log_wandb(output: Path, params: dict[str, object], info: dict[str, object],
               scores: dict[str, float]) -> None:
    """Logs the fit as an offline W&B run under ``output``; prints where, and how to sync it."""
    from autoshard.tracking import Tracker, run_name

    tracker = Tracker("offline", output, run_name("cost-model-fit"), {**params, **info},
                      project="autoshard-cost-model", job_type="fit")
    tracker.log({f"train/{k}": v for k, v in scores.items()})
    tracker.finish()


@cost_model_app.command("eval")
def eval_cmd(
    model_dir: Annotated[Path, typer.Argument(help="Model directory from `cost-model fit`.")],
    data: DataArg,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Metrics JSON or YAML to write (default: print only). Never "
                               "inside the model directory.")] = None,
    stat: Annotated[str | None, typer.Option(
        help="Timing statistic (default: the one the model was fitted on).")] = None,
) -> None:
    """Score a saved model on microbenchmark data: MAPE and Spearman, overall and per mode.

    The report is printed, and written to ``--output`` when given; the model directory is only
    read.
    """
    from autoshard.cost_models.evaluate import metrics
    from autoshard.cost_models.features import FEATURE_NAMES, dataset
    from autoshard.fileio import write_structured

    if output is not None:
        if output.resolve().is_relative_to(model_dir.resolve()):
            raise InputError("the report must not be written into the model directory",
                             field="output", value=str(output))
        check_output_path(output)
    model = load_partition_model(model_dir)
    stat = stat or str(model.info_.get("stat", "p10"))
    df, info, _frames = _load_data(data)
    X, y, _ = dataset(df, source=",".join(map(str, data)), stat=stat)
    pred = model.predict_partitions(X)
    train_col = FEATURE_NAMES.index("train")
    doc = {"model": str(model_dir), **info, "stat": stat, "all": metrics(pred, y)}
    for mode, flag in (("infer", 0), ("train", 1)):
        sel = X[:, train_col] == flag
        doc[mode] = metrics(pred[sel], y[sel])
    if output is not None:
        write_structured(output, doc)
    print_json(doc)


@cost_model_app.command("compare")
def compare_cmd(
    data: DataArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Results folder.")] = Path(
        "runs/cost_model"),
    test_share: Annotated[float, ranged(Range(0, 1, open_low=True, open_high=True),
                                        "Share of configurations held out.")] = 0.2,
    seed: SeedOpt = 0,
    mlp_epochs: Annotated[int, ranged(Range(1, 100_000, integer=True),
                                      "MLP training epochs.")] = 300,
    n_estimators: EstimatorsOpt = 600,
    stat: StatOpt = "p10",
) -> None:
    """Held-out MAPE/Spearman of LightGBM, the analytical form and an MLP on one group split.

    Given two or more CSVs that measured the same configurations, also reports how far the
    first two measurements disagree: the noise floor under any model's error.
    """
    torch = require_all({"torch": "costmodel", "lightgbm": "costmodel", "pandas": "costmodel",
                         "matplotlib": "plots"})["torch"]
    from autoshard.cost_models.evaluate import compare, plot, shown
    from autoshard.cost_models.features import dataset
    from autoshard.cost_models.report import write_report

    torch.set_num_threads(1)
    check_output_path(output / "metrics.json")
    df, info, frames = _load_data(data)
    if info["configurations"] < 2:
        raise InputError("need measurements of at least 2 configurations (some are held out, "
                         "the others fit the models)", source=",".join(map(str, data)),
                         field="config_id", value=info["configurations"])
    X, y, groups = dataset(df, source=",".join(map(str, data)), stat=stat)
    start = time.perf_counter()
    result = compare(X, y, groups, test_share=test_share, seed=seed, mlp_epochs=mlp_epochs,
                     n_estimators=n_estimators)
    info["stat"] = stat
    if len(frames) >= 2:
        from autoshard.cost_models.evaluate import repeatability

        result["repeatability"] = dict(repeatability(frames[0], frames[1], stat),
                                       data=f"{data[0]} vs {data[1]}")
    with output_folder(output):  # a failure leaves no new folder behind
        plot(result, str(output / "pred_vs_measured.png"),
             f"held-out configurations, {', '.join(info.get('hardware', []))}")  # type: ignore
        write_report(output, result, info, time.perf_counter() - start)
    for name, m in result["models"].items():
        console.print(f"{name:>10}: MAPE {shown(m['mape'], '.2f', 100)}%  Spearman "
                      f"{shown(m['spearman'])}")
    console.print(f"wrote {output}/metrics.json, metrics.md, pred_vs_measured.png")


@cost_model_app.command("calibrate")
def calibrate_cmd(
    model_dir: Annotated[Path, typer.Argument(help="LightGBM model directory to calibrate.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="New model directory.")],
    budget_s: Annotated[float | None, ranged(TIME_LIMIT_S, "Seconds of measuring at most "
                                             "[default: 90, about two minutes with the fit]."
                                             )] = None,
    size: Annotated[int, ranged(Range(10, 1_000_000, integer=True),
                                "Configurations in the sample at most.")] = 1200,
    grid: Annotated[str, typer.Option(help="Grid the sample is drawn from.")] = "default",
    seed: SeedOpt = 0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure a stratified sample of the model's grid on this machine and write a model
    corrected to it (per-operator scale + small residual correction); resumes its sample."""
    torch = require_all({"torch": "costmodel", "lightgbm": "costmodel",
                         "pandas": "costmodel"})["torch"]
    from autoshard.cost_models.calibrate import BUDGET_S, calibrate

    budget_s = BUDGET_S if budget_s is None else budget_s
    check_output_path(output / "metadata.json")
    torch.set_num_threads(1)
    summary = calibrate(model_dir, output, budget_s=budget_s, size=size, grid=grid, seed=seed,
                        progress=progress)
    cv = summary["cross_validated_mape"]
    tried = ", ".join(f"{k} {100 * v:.1f}%" for k, v in cv.items() if k != "folds")
    console.print(f"measured {summary['configurations']} configurations in "
                  f"{summary['measure_seconds']} s; cross-validated MAPE on them: {tried}; "
                  f"residual: {summary['residual'] or 'none'}; wrote {output}")
