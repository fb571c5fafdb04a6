"""The task a command prices a plan on: the plan's own context, unless told otherwise.

``evaluate``, ``export`` and ``run-plan`` read the tables, hardware, workload, reservation and
cost model a plan records (:class:`autoshard.layout.plan_context.PlanContext`). An option that gives
something else is an error naming both values, unless ``--reprice`` asks to price the plan on
what the options give; then the report says what changed. A plan of an earlier schema records
no context: the options say what it is priced on, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from autoshard.cli.common import build_task, check_options
from autoshard.errors import InputError
from autoshard.hardware import GB, HardwareProfile, load_hardware
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import PlanContext, read_table_set, tables_digest
from autoshard.pricing.cost import model_identity, spec_of
from autoshard.reservation import get_reservation
from autoshard.task import ShardingTask, Workload

DEFAULT_HARDWARE = "8xH100-80GB"

PlanTablesOpt = Annotated[str | None, typer.Option(
    "--tables", "-t", help="Table file (JSON, YAML, CSV) or 'default' (default: the tables the "
    "plan records).")]
PlanHardwareOpt = Annotated[str | None, typer.Option(
    "--hardware", "-H", help="Bundled profile name or YAML file (default: the hardware the plan "
    "records, overrides included).")]
PlanOverheadOpt = Annotated[str | None, typer.Option(
    help="HBM reservation: torchrec, torchrec-prefetch or none (default: the plan's).")]
PlanCostModelOpt = Annotated[str | None, typer.Option(
    "--cost-model", help="'analytical', 'torchrec' or a learned model's folder (default: the "
    "cost model the plan records).")]
RepriceOpt = Annotated[bool, typer.Option(
    "--reprice", help="Price the plan on what the options give (tables, hardware, workload, "
    "reservation, cost model) where they differ from the plan's own context; without it such "
    "an option is an error.")]


@dataclass(frozen=True)
class Given:
    """What the command line gave (None: not given) for the task and the cost model."""

    tables: str | None = None
    hardware: str | None = None
    devices: int | None = None
    nodes: int | None = None
    hbm_gb: float | None = None
    batch_size: int | None = None
    mode: str | None = None
    overhead: str | None = None
    cost_model: str | None = None


@dataclass(frozen=True)
class Priced:
    """The task and cost model to price a plan on, and what differs from its context."""

    task: ShardingTask
    cost_model: str
    notes: tuple[str, ...] = ()


def plan_task(plan: Plan, plan_file: Path, given: Given, reprice: bool = False) -> Priced:
    """The task and cost model to price ``plan`` on (see the module docstring).

    Raises:
        InputError: An option contradicts the plan's context (without ``reprice``), naming
            both values; the plan records no context and no ``--tables`` is given; the
            tables recorded cannot be read or have changed.
    """
    check_options(devices=given.devices, nodes=given.nodes, hbm_gb=given.hbm_gb,
                  batch_size=given.batch_size, mode=given.mode)
    context = plan.context
    if context is None:
        return _without_context(plan, plan_file, given)
    source = str(plan_file)
    tables = (context.read_tables(source) if given.tables is None
              else read_table_set(given.tables))
    hardware = _hardware(context, given)
    workload = Workload(given.batch_size or context.workload.batch_size,
                        given.mode or context.workload.mode)
    reservation = get_reservation(given.overhead or context.reservation, "--overhead",
                                  "command line")
    model = given.cost_model or spec_of(context.cost_model)
    found = _differences(context, given, tables, hardware, workload, model)
    if found and not reprice:
        option, value, recorded, asked = found[0]
        raise InputError(f"gives {asked}, but the plan was made for {recorded}; leave the "
                         "option out to use the plan's, or add --reprice to price the plan on "
                         "the given one", source=source, field=option, value=value)
    notes = tuple(f"re-priced on {asked} ({option} {value}); the plan was made for {recorded}"
                  for option, value, recorded, asked in found)
    return Priced(ShardingTask(tables, hardware, workload, reservation), model, notes)


def _hardware(context: PlanContext, given: Given) -> HardwareProfile:
    """The plan's hardware, or the one the options give: a profile named by ``--hardware``
    with only the overrides given, else the plan's with the overrides given applied."""
    if given.hardware is not None:
        return load_hardware(given.hardware, devices=given.devices, nodes=given.nodes,
                             hbm_gb=given.hbm_gb)
    profile = context.hardware
    if given.devices is not None:
        profile = profile.with_devices(given.devices)
    elif given.nodes is not None:
        profile = profile.with_nodes(given.nodes)
    if given.hbm_gb is not None:
        profile = profile.with_hbm_bytes(int(given.hbm_gb * GB))
    return profile


def _differences(context: PlanContext, given: Given, tables: tuple, hardware: HardwareProfile,
                 workload: Workload, model: str) -> list[tuple[str, object, str, str]]:
    """(option, its value, what the plan recorded, what the option gives) for each given
    option that differs from the context."""
    found: list[tuple[str, object, str, str]] = []
    if given.tables is not None and tables_digest(tables) != context.tables_digest:
        found.append(("--tables", given.tables, f"tables '{context.tables}'",
                      f"other tables ({len(tables)})"))
    if hardware.to_dict() != context.hardware.to_dict():
        option, value = next((o, v) for o, v in (
            ("--hardware", given.hardware), ("--devices", given.devices),
            ("--nodes", given.nodes), ("--hbm-gb", given.hbm_gb)) if v is not None)
        found.append((option, value, f"hardware {_describe(context.hardware)}",
                      f"hardware {_describe(hardware)}"))
    if workload.batch_size != context.workload.batch_size:
        found.append(("--batch-size", workload.batch_size,
                      f"batch size {context.workload.batch_size}",
                      f"batch size {workload.batch_size}"))
    if workload.mode != context.workload.mode:
        found.append(("--mode", workload.mode, f"mode {context.workload.mode}",
                      f"mode {workload.mode}"))
    if given.overhead is not None and given.overhead != context.reservation:
        found.append(("--overhead", given.overhead, f"reservation '{context.reservation}'",
                      f"reservation '{given.overhead}'"))
    if given.cost_model is not None and model_identity(model) != context.cost_model:
        found.append(("--cost-model", model, f"cost model '{context.cost_model}'",
                      f"cost model '{model_identity(model)}'"))
    return found


def _describe(profile: HardwareProfile) -> str:
    """A profile in a few words: name, devices and HBM per device."""
    hbm = {d.hbm.capacity_bytes for d in profile.devices}
    per = f"{hbm.pop() / GB:g} GB HBM each" if len(hbm) == 1 else "mixed HBM"
    return f"{profile.name} ({profile.num_devices} devices, {per})"


def _without_context(plan: Plan, plan_file: Path, given: Given) -> Priced:
    """A plan of an earlier schema: priced on what the options give, as before."""
    if given.tables is None:
        raise InputError("this plan records no context (an earlier schema): give --tables and "
                         "the hardware it was planned for", source=str(plan_file),
                         field="--tables")
    task = build_task(given.tables, given.hardware or DEFAULT_HARDWARE, given.devices,
                      given.nodes, given.hbm_gb, given.batch_size, given.mode,
                      default=plan.workload, overhead=given.overhead or "torchrec")
    notes: tuple[str, ...] = ()
    if plan.hardware and plan.hardware != task.hardware.name:
        notes = (f"{plan_file} was planned for '{plan.hardware}', priced on "
                 f"'{task.hardware.name}'",)
    return Priced(task, given.cost_model or "analytical", notes)


def record_context(task: ShardingTask, tables: str, hardware: str, devices: int | None,
                   nodes: int | None, hbm_gb: float | None, cost_model: str,
                   inline: bool = False, module_paths: dict[str, str] | None = None
                   ) -> PlanContext:
    """The context ``plan`` records for a task made from these options (its tables recorded
    themselves when ``inline``: a TorchRec model's, with their collections' module paths)."""
    spec = {"profile": hardware, "devices": devices, "nodes": nodes, "hbm_gb": hbm_gb}
    return PlanContext.of(task, tables, spec, model_identity(cost_model), inline=inline,
                          module_paths=module_paths)
