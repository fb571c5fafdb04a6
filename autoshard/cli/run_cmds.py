"""Measured runs: ``autoshard run-plan``, on our runner or in TorchRec's
DistributedModelParallel (``--engine torchrec``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table as RichTable

from autoshard.cli.app import app
from autoshard.cli.common import (
    BatchOpt,
    DevicesOpt,
    HbmOpt,
    JsonOpt,
    ModeOpt,
    NodesOpt,
    SeedOpt,
    check_output_path,
    console,
    print_json,
    ranged,
)
from autoshard.cli.context import (
    Given,
    PlanCostModelOpt,
    PlanHardwareOpt,
    PlanOverheadOpt,
    PlanTablesOpt,
    Priced,
    RepriceOpt,
    plan_task,
)
from autoshard.cli.progress import rank_steps
from autoshard.errors import InputError, PlannerError
from autoshard.extras import require
from autoshard.fileio import write_structured
from autoshard.layout.plan import Plan
from autoshard.limits import TIME_LIMIT_S, Range

#: What runs a plan: our runner, or TorchRec's DistributedModelParallel.
ENGINES = ("autoshard", "torchrec")
#: Timed steps, and untimed ones before them.
STEPS = Range(1, 1_000_000, integer=True)
WARMUP_STEPS = Range(0, 1_000_000, integer=True)

TraceOpt = Annotated[str | None, typer.Option(
    help="Lookup trace (indices, offsets, lengths = torch.load(f)); synthetic if omitted.")]
IterationsOpt = Annotated[int, ranged(STEPS, "Timed steps (medians over them).")]
WarmupOpt = Annotated[int, ranged(WARMUP_STEPS, "Untimed steps first.")]
KernelOpt = Annotated[str, typer.Option(
    help="Our runner's kernel: torch (EmbeddingBag) or fbgemm (TBE).")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
TimeoutOpt = Annotated[float, ranged(
    TIME_LIMIT_S, "Seconds a rank may go without progress before the run is stopped.",
    "--timeout")]
LogsOpt = Annotated[Path | None, typer.Option(help="Folder for rank logs.")]
OutputOpt = Annotated[Path | None, typer.Option(
    "--output", "-o", help="Also write the JSON report here.")]
EngineOpt = Annotated[str, typer.Option(
    help="autoshard (our runner) or torchrec (TorchRec's DistributedModelParallel: the sharded "
         "model's outputs checked against the unsharded model's, then a few training steps "
         "timed).")]
TorchrecModelOpt = Annotated[str | None, typer.Option(
    "--torchrec-model", help="With --engine torchrec: MODULE:FACTORY, a callable returning a "
    "module whose EmbeddingBagCollections hold the plan's tables (matched by name); default: "
    "TorchRec's DLRM over the plan's tables (an MLP over them when their dims differ).")]
CompareRunnerOpt = Annotated[bool, typer.Option(
    "--compare-runner", help="With --engine torchrec: also run the plan on our runner and "
    "show its figures beside TorchRec's.")]
NodeColumnsOpt = Annotated[bool, typer.Option(
    "--node-columns", help="With --engine torchrec: run column blocks that all lie in one "
    "node as TorchRec's node-local column sharding (table-column-wise).")]


@app.command("run-plan")
def run_plan_cmd(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    trace: TraceOpt = None,
    iterations: IterationsOpt = 10,
    warmup: WarmupOpt = 3,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    kernel: KernelOpt = "torch",
    device: DeviceOpt = "auto",
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    overhead: PlanOverheadOpt = None,
    cost_model: PlanCostModelOpt = None,
    reprice: RepriceOpt = False,
    seed: SeedOpt = 0,
    timeout: TimeoutOpt = 120.0,
    logs: LogsOpt = None,
    output: OutputOpt = None,
    json_out: JsonOpt = False,
    engine: EngineOpt = "autoshard",
    torchrec_model: TorchrecModelOpt = None,
    compare_runner: CompareRunnerOpt = False,
    node_columns: NodeColumnsOpt = False,
) -> None:
    """Run a plan for real on torch.distributed and time it beside the modelled cost.

    One process per device (gloo on CPU, NCCL on CUDA), or one rank per process under torchrun
    (our runner only). With --engine torchrec, TorchRec's DistributedModelParallel runs it.
    """
    from autoshard.runner import RunConfig

    require("torch", "run")
    torchrec = check_engine(engine, torchrec_model, compare_runner, node_columns)
    if output is not None:
        check_output_path(output)
    loaded = Plan.load(plan_file)
    priced = plan_task(loaded, plan_file, Given(tables, hardware, devices, nodes, hbm_gb,
                                                batch_size, mode, overhead, cost_model), reprice)
    for note in priced.notes:
        typer.echo(f"note: {note}", err=True)
    task = priced.task
    config = RunConfig(batch_size=task.workload.batch_size, iterations=iterations, warmup=warmup,
                       mode=task.workload.mode, seed=seed, kernel=kernel, device=device,
                       timeout_s=timeout, trace=trace)
    if torchrec:
        settings = {"model": torchrec_model, "compare_runner": compare_runner,
                    "node_columns": node_columns}
        run_torchrec(loaded, priced, config, settings, (plan_file, logs, output, json_out))
        return
    run_autoshard(loaded, priced, config, logs, output, json_out)


def check_engine(engine: str, model: str | None, compare_runner: bool,
                 node_columns: bool) -> bool:
    """Whether the engine is TorchRec's; its options given only with it.

    Raises:
        InputError: An unknown engine, or a TorchRec option with our runner.
    """
    if engine not in ENGINES:
        raise InputError(f"must be one of {', '.join(ENGINES)}", source="command line",
                         field="--engine", value=engine)
    torchrec = engine == "torchrec"
    for option, given in (("--torchrec-model", model is not None),
                          ("--compare-runner", compare_runner),
                          ("--node-columns", node_columns)):
        if given and not torchrec:
            raise InputError("only with --engine torchrec", source="command line",
                             field=option,
                             value=model if option == "--torchrec-model" else True)
    return torchrec


def run_autoshard(loaded: Plan, priced: Priced, config: Any, logs: Path | None,
                  output: Path | None, json_out: bool) -> None:
    """Runs the plan on our runner and reports it."""
    from autoshard.runner import run_plan

    with steps_of("running the plan", config) as stages:
        result = run_plan(loaded, priced.task, config, priced.cost_model, logs, stages)
    if result is None:  # a rank other than 0 under torchrun
        return
    doc = result.to_dict()
    if output is not None:
        write_structured(output, doc)
    if json_out:
        print_json(doc)
        return
    show_run(result)


def run_torchrec(loaded: Plan, priced: Priced, config: Any, settings: dict[str, Any],
                 where: tuple[Path, Path | None, Path | None, bool]) -> None:
    """Runs the plan in TorchRec's DistributedModelParallel and reports it; a run whose
    sharded outputs differ from the unsharded model's ends with exit code 1 (the report
    still written and shown).

    Raises:
        InputError: Under torchrun, or the plan cannot run here as planned.
        PlannerError: TorchRec is not installed.
    """
    from autoshard.runner import torchrun_env
    from autoshard.torchrec import torchrec_unavailable

    plan_file, logs, output, json_out = where
    if torchrun_env() is not None:
        raise InputError("--engine torchrec starts its own processes; run it without torchrun",
                         source="command line", field="--engine", value="torchrec")
    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    from autoshard.torchrec.dmp import DmpSettings, run_plan_in_dmp

    report = run_plan_in_dmp(loaded, priced.task, DmpSettings(config, **settings),
                             priced.cost_model, logs, source=str(plan_file),
                             progress=lambda label: steps_of(label, config))
    doc = report.to_dict()
    if output is not None:
        write_structured(output, doc)
    if json_out:
        print_json(doc)
    else:
        show_torchrec(report)
    run = report.torchrec
    if not run.outputs_equal:
        for what, bad in (("pooled embeddings", [r.rank for r in run.per_rank
                                                 if not r.pooled_equal]),
                          ("logits", [r.rank for r in run.per_rank
                                      if r.logits_equal is False])):
            if bad:
                typer.echo(f"error: the sharded model's {what} differ from the unsharded "
                           f"model's on rank(s) {bad} (tolerance {run.tolerance})", err=True)
        raise typer.Exit(1)


def steps_of(label: str, config: Any) -> AbstractContextManager[Callable[[list[str]], None]]:
    """Progress of ranks running ``config``'s warm-up and timed steps
    (:func:`autoshard.cli.progress.rank_steps`)."""
    return rank_steps(f"{label}: steps done on every rank", config.warmup + config.iterations)


def show_run(result: object) -> None:
    """Per-rank measured parts beside the modelled device cost."""
    from autoshard.runner import RunResult

    assert isinstance(result, RunResult)
    m, c = result.measured, result.modelled
    table = RichTable(title=f"plan by {m.sharder or '?'}: measured ({m.backend}, {m.kernel}, "
                      f"{m.mode}, batch {m.batch_size}, median of {m.iterations}) vs "
                      f"{c.cost_model}")
    for col in ("dev", "tables", "lookup", "comm", "bwd+opt", "wait", "step", "work",
                "modelled", "ratio"):
        table.add_column(col, justify="right")
    for d, e, ratio in zip(m.per_device, c.per_device, result.device_ratios, strict=True):
        table.add_row(str(d.device), str(d.tables), f"{d.lookup_ms:.3f}", f"{d.comm_ms:.3f}",
                      f"{d.backward_optimizer_ms:.3f}", f"{d.wait_ms:.3f}", f"{d.step_ms:.3f}",
                      f"{d.total_ms:.3f}", f"{e.total_ms:.4f}", f"{ratio:.1f}")
    console.print(table)
    console.print("[dim]ms, medians per rank; work = the rank's own lookup, comm and bwd+opt "
                  "time (step less wait and the loss); ratio = measured work / modelled[/]")
    if any(d.replicas for d in m.per_device):
        slowest = max(d.allreduce_ms for d in m.per_device)
        sync = (f"comm includes their gradient all-reduce ({slowest:.3f} ms at most)"
                if m.mode == "train" else "each rank pools its own samples")
        console.print(f"[dim]replicated: {', '.join(m.per_device[0].replicas)}; {sync}[/]")
    console.print(
        f"step cost: measured [bold]{m.step_cost_ms:.3f} ms[/] (wall {m.step_wall_ms:.3f} ms), "
        f"modelled {c.step_cost_ms:.4f} ms, measured / modelled [bold]{result.step_ratio:.1f}[/]; "
        f"load balance {m.load_balance:.3f} vs {c.load_balance:.3f}; UVM lookup share "
        f"{m.uvm_lookup_share:.2%} vs {c.uvm_lookup_share:.2%}")
    console.print(f"[dim]{m.note}[/]")


def _ms(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _diff(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _verdicts(run: Any) -> str:
    """One verdict per check, each with what it compared: the pooled embeddings, and the
    logits where both sides share the dense part."""
    def said(equal: bool) -> str:
        return "[bold]equal[/]" if equal else "[bold red]DIFFERENT[/]"

    checked = sum(r.outputs_checked for r in run.per_rank)
    text = (f"pooled embeddings {said(run.pooled_equal)} to the unsharded model's ({checked} "
            f"outputs over {len(run.per_rank)} ranks)")
    if run.logits_equal is None:
        text += "; logits not compared (the model's dense part is its own)"
    else:
        text += (f"; logits {said(run.logits_equal)} (the same dense layers on both sides, "
                 "fed the pooled embeddings)")
    return text + f"; allclose with {run.tolerance}"


def show_torchrec(report: Any) -> None:
    """Per rank: TorchRec's median step beside our runner's and the cost model's figures, and
    the check of the sharded outputs."""
    run, modelled = report.torchrec, report.modelled
    table = RichTable(title=f"plan by {report.sharder or '?'} in TorchRec's "
                      f"DistributedModelParallel ({run.backend}, {run.mode}, batch "
                      f"{run.batch_size}, median of {run.iterations}) vs {modelled.cost_model}",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      show_edge=False)
    for col in ("dev", "tables", "step", "cpu", "runner\nstep", "runner\nwork", "modelled",
                "pooled\nmax |diff|", "logits\nmax |diff|"):
        table.add_column(col, justify="right")
    for r, row in zip(run.per_rank, report.per_device(), strict=True):
        table.add_row(str(r.rank), str(len(r.tables)), _ms(r.step_ms), _ms(r.step_cpu_ms),
                      _ms(row["runner_step_ms"]), _ms(row["runner_work_ms"]),
                      _ms(row["modelled_ms"], 4), _diff(r.max_abs_diff),
                      _diff(r.logits_max_abs_diff))
    console.print(table)
    console.print(f"model: {run.model}; {_verdicts(run)}")
    console.print(f"step: TorchRec [bold]{run.step_ms:.3f} ms[/] (slowest rank), modelled "
                  f"{modelled.step_cost_ms:.4f} ms"
                  + (f", our runner {report.runner.step_wall_ms:.3f} ms wall" if report.runner
                     else ""))
    for note in run.notes:
        console.print(f"[dim]note: {note}[/]")
    console.print("[dim]ms, medians per rank over the timed steps: step = wall clock (ranks "
                  "start each step together), cpu = the rank's own CPU time[/]")
