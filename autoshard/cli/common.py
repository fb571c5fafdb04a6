"""Options and loaders shared by the CLI commands."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autoshard.errors import InputError
from autoshard.fileio import json_text, output_target
from autoshard.hardware import load_hardware
from autoshard.limits import (
    MAX_BATCH_SIZE,
    MAX_CAPACITY_GB,
    MAX_DEVICES,
    MAX_TRACE_CELLS,
    SEED,
    TIME_LIMIT_S,
    TRACE_SIZE,
    Range,
    int_in,
    number_in,
)
from autoshard.reservation import get_reservation
from autoshard.sharders import sharder_names
from autoshard.tables import Table, load_tables
from autoshard.task import MODES, ShardingTask, Workload

console = Console()

TablesOpt = Annotated[str, typer.Option(
    "--tables", "-t", help="Table file (JSON, YAML, CSV), or 'default' (the built-in workload).")]
HardwareOpt = Annotated[str, typer.Option(
    "--hardware", "-H", help="Bundled profile name (see `autoshard hardware list`) or YAML file.")]
DevicesOpt = Annotated[int | None, typer.Option(help="Override the number of devices.")]
NodesOpt = Annotated[int | None, typer.Option(help="Number of full nodes of the profile.")]
HbmOpt = Annotated[float | None, typer.Option(
    "--hbm-gb", help="Override HBM capacity per device for embeddings, GB.")]
BatchOpt = Annotated[int | None, typer.Option(help="Global batch size (default 65536).")]
OverheadOpt = Annotated[str, typer.Option(
    help="HBM the sharder keeps free per table or shard: torchrec (what TorchRec's runtime "
         "adds in its default pipeline: I/O buffers, cache state), torchrec-prefetch (the same "
         "in TorchRec's prefetch pipeline, whose caches are prefetched: ten input buffers per "
         "shard) or none (the weights alone).")]
ModeOpt = Annotated[str | None, typer.Option(help="train or infer (default train).")]
CostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help="'analytical', 'torchrec' (TorchRec's own perf estimator, for the "
    "training pipeline --overhead names; needs the torchrec extra) or a directory with a "
    "learned cost model.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
OptOpt = Annotated[list[str] | None, typer.Option(
    "--opt", help="Sharder option KEY=VALUE, repeatable (VALUE read as JSON: 5, 0.5, true, "
    "null; anything else is a string); SHARDER.KEY=VALUE for one sharder. Checked strictly: "
    "an option the sharder does not take is an error.")]
#: ``plan``'s sharder; the help lists every registered name (the registry is a dict of strings,
#: so listing it at import costs nothing).
SharderOpt = Annotated[str, typer.Option(
    "--sharder", "-s", help=f"Sharder: {', '.join(sharder_names())} (recshard: the MILP, the "
    "best general one; ppo: the learned policy with a search stage, near it and faster; "
    "`autoshard sharders` says which can run here).")]
PolicyOpt = Annotated[Path | None, typer.Option(
    "--policy", help="Folder of a trained PPO policy (config.json, weights.pt) for the ppo "
    "sharder, decoded alone (default: the two shipped with autoshard).")]


def ranged(rng: Range, help: str, *names: str, **options: Any) -> Any:
    """A typer option whose values must lie in ``rng`` (:mod:`autoshard.limits`): its help
    states the range, and a value outside it (NaN and infinities included) is an input error
    naming the option, raised while the command line is read, before any work."""
    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        option = max(param.opts, key=len) if param.opts else str(param.name)
        for one in value if isinstance(value, (list, tuple)) else [value]:
            rng.check(one, field=option, source="command line")
        return value

    return typer.Option(*names, help=f"{help} {rng.help()}", callback=check, **options)


#: A seed: every command's ``--seed`` (the range is :data:`autoshard.limits.SEED`).
SeedOpt = Annotated[int, ranged(SEED, "Seed of everything drawn at random (same seed, same "
                                "result).")]
#: A time limit per plan, seconds (:data:`autoshard.limits.TIME_LIMIT_S`).
TimeLimitOpt = Annotated[float, ranged(TIME_LIMIT_S, "Time limit per plan for the sharders "
                                       "that take one (recshard, torchrec), s.")]


def read_tables(spec: str) -> tuple[Table, ...]:
    """Tables from a file path, or ``default``: the embedded synthetic workload (856 tables)."""
    if spec == "default" and not Path(spec).exists():
        from autoshard.synth import default_tables

        return default_tables()
    return load_tables(spec)


def build_task(tables: str | tuple[Table, ...], hardware: str, devices: int | None = None,
               nodes: int | None = None, hbm_gb: float | None = None,
               batch_size: int | None = None, mode: str | None = None,
               default: Workload | None = None, overhead: str = "torchrec") -> ShardingTask:
    """Loads tables (a spec :func:`read_tables` reads, or the tables themselves) and hardware
    and assembles a task; CLI values override ``default``; the task keeps the reservation named
    ``overhead`` in HBM (:mod:`autoshard.reservation`)."""
    reservation = get_reservation(overhead, field="--overhead", source="command line")
    check_options(devices=devices, nodes=nodes, hbm_gb=hbm_gb, batch_size=batch_size,
                  mode=mode)
    base = default or Workload()
    workload = Workload(batch_size=batch_size if batch_size is not None else base.batch_size,
                        mode=mode if mode is not None else base.mode)
    with options_named():
        profile = load_hardware(hardware, devices=devices, nodes=nodes, hbm_gb=hbm_gb)
    found = read_tables(tables) if isinstance(tables, str) else tables
    return ShardingTask(found, profile, workload, reservation)


def check_options(devices: int | None = None, nodes: int | None = None,
                  hbm_gb: float | None = None, batch_size: int | None = None,
                  mode: str | None = None) -> None:
    """Rejects out-of-range command-line values before any file is read."""
    rules: list[tuple[str, Any, bool, str]] = [
        ("--devices", devices, devices is None or int_in(devices, 1, MAX_DEVICES),
         f"must be in [1, {MAX_DEVICES:,}]"),
        ("--nodes", nodes, nodes is None or int_in(nodes, 1, MAX_DEVICES),
         f"must be in [1, {MAX_DEVICES:,}] (and nodes x devices per node at most that)"),
        ("--hbm-gb", hbm_gb, hbm_gb is None or number_in(hbm_gb, 0, MAX_CAPACITY_GB),
         f"must be a number in [0, {MAX_CAPACITY_GB:g}]"),
        ("--batch-size", batch_size, batch_size is None
         or int_in(batch_size, 1, MAX_BATCH_SIZE), f"must be in [1, {MAX_BATCH_SIZE:,}]"),
        ("--mode", mode, mode is None or mode in MODES, f"must be one of {', '.join(MODES)}"),
    ]
    for option, value, ok, rule in rules:
        if not ok:
            raise InputError(rule, source="command line", field=option, value=value)


def parse_opts(items: list[str] | None, sharders: list[str]) -> dict[str, dict[str, Any]]:
    """``--opt`` values as options per sharder: ``KEY=VALUE`` applies to every sharder in
    ``sharders``, ``SHARDER.KEY=VALUE`` to that one (which must be among them).

    Values are read as JSON scalars (``5``, ``0.5``, ``true``, ``null``, ``"text"``); a value
    that is not JSON is taken as a string (``policy=runs/x/policy``). Option names may use
    dashes for underscores. Whether each sharder takes each option is checked by the caller.

    Raises:
        InputError: A malformed item, a non-finite number, or a sharder not being run.
    """
    given: dict[str, dict[str, Any]] = {name: {} for name in sharders}
    for item in items or []:
        key, sep, text = item.partition("=")
        scope, dot, name = key.strip().rpartition(".")
        name = name.replace("-", "_")
        if not sep or not name.isidentifier():
            raise InputError("expected KEY=VALUE or SHARDER.KEY=VALUE", source="command line",
                             field="--opt", value=item)
        if dot and scope not in given:
            raise InputError(f"sharder not being run (running: {', '.join(sharders)})",
                             source="command line", field="--opt", value=item)
        value = _scalar(text.strip(), item)
        for target in [scope] if dot else sharders:
            given[target][name] = value
    return {name: opts for name, opts in given.items() if opts}


def _scalar(text: str, item: str) -> Any:
    """A JSON scalar, or the text itself when it is not JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, (dict, list)):
        raise InputError("expected a single value (number, true/false, null or text)",
                         source="command line", field="--opt", value=item)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError("must be a finite number", source="command line", field="--opt",
                         value=item)
    return value


def check_trace_size(tables: int, batch: int, batch_option: str = "--batch-size") -> None:
    """Rejects a generated trace's table count and batch when either (:data:`TRACE_SIZE`), or
    their product (the table-samples held in memory), is out of range; errors name the
    option."""
    for option, value in (("--tables", tables), (batch_option, batch)):
        TRACE_SIZE.check(value, option, "command line")
    if tables * batch > MAX_TRACE_CELLS:
        raise InputError(f"--tables x {batch_option} must be at most {MAX_TRACE_CELLS:,} (the "
                         "trace is held in memory)", source="command line", field=batch_option,
                         value=batch)


@contextlib.contextmanager
def options_named(sharder_options: bool = False) -> Iterator[None]:
    """Attributes input errors that name no file to the command line: as ``--option``, or, for
    ``sharder_options``, as ``--opt SHARDER.KEY``."""
    try:
        yield
    except InputError as exc:
        if exc.source:
            raise
        field = (f"--opt {exc.field}" if sharder_options
                 else "--" + (exc.field or "").replace("_", "-"))
        raise InputError(exc.reason, source="command line", field=field,
                         value=exc.value) from exc


def check_output_path(path: Path) -> None:
    """Fails early (before any work) if the output cannot be written: it is a folder, or a
    folder above it is a file (:func:`autoshard.fileio.output_target` owns the rules)."""
    output_target(path, source="command line", field="output")


def print_json(doc: Any) -> None:
    """Prints a document as strict JSON (a NaN or an infinity is an error naming the field)."""
    typer.echo(json_text(doc, source="printed report"), nl=False)
