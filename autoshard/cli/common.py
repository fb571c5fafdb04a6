"""Options and loaders shared by the CLI commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autoshard.errors import InputError
from autoshard.hardware import load_hardware
from autoshard.tables import Table, load_tables
from autoshard.task import ShardingTask, Workload

console = Console()

TablesOpt = Annotated[str, typer.Option("--tables", "-t", help="Table file (JSON, YAML, CSV).")]
HardwareOpt = Annotated[str, typer.Option(
    "--hardware", "-H", help="Bundled profile name (see `autoshard hardware list`) or YAML file.")]
DevicesOpt = Annotated[int | None, typer.Option(help="Override the number of devices.")]
NodesOpt = Annotated[int | None, typer.Option(help="Number of full nodes of the profile.")]
HbmOpt = Annotated[float | None, typer.Option(
    "--hbm-gb", help="Override HBM capacity per device for embeddings, GB.")]
BatchOpt = Annotated[int | None, typer.Option(help="Global batch size (default 65536).")]
ModeOpt = Annotated[str | None, typer.Option(help="train or infer (default train).")]
CostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help="'analytical' or a directory with a learned cost model.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]


def read_tables(spec: str) -> tuple[Table, ...]:
    """Tables from a file path."""
    return load_tables(spec)


def build_task(tables: str, hardware: str, devices: int | None = None, nodes: int | None = None,
               hbm_gb: float | None = None, batch_size: int | None = None,
               mode: str | None = None, default: Workload | None = None) -> ShardingTask:
    """Loads tables and hardware and assembles a task; CLI values override ``default``."""
    base = default or Workload()
    workload = Workload(batch_size=batch_size if batch_size is not None else base.batch_size,
                        mode=mode if mode is not None else base.mode)
    profile = load_hardware(hardware, devices=devices, nodes=nodes, hbm_gb=hbm_gb)
    return ShardingTask(read_tables(tables), profile, workload)


def check_output_path(path: Path) -> None:
    """Fails early (before any work) if the output's folder cannot be created."""
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if parent.is_file():
        raise InputError("output folder is a file", field="output", value=str(path))


def print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2))
