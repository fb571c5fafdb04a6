"""Tables from a TorchRec model: ``plan --torchrec-model`` and ``tables from-torchrec``.

``MODULE:FACTORY`` names a function that returns the model (MODULE a dotted module, found from
the working folder too, or a ``path/to/file.py``). It is called on the meta device, so no
weights are allocated, and the tables of its ``EmbeddingBagCollection`` and
``EmbeddingCollection`` modules are read with their rows, dims and element types
(:mod:`autoshard.torchrec.model_tables`); statistics come from ``--stats`` (a table file, matched
by table or feature name), else TorchRec's default pooling factor, with a warning.

A plan made from a model records its tables inline in its context
(:class:`autoshard.layout.plan_context.PlanContext`), with the source
``torchrec-model:MODULE:FACTORY``, so ``evaluate``, ``export`` and ``run-plan`` price it without
importing the model again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoshard.cli.app import app
from autoshard.cli.common import check_output_path, console
from autoshard.errors import InputError
from autoshard.tables import Table

#: The table source a plan made from a model records: ``torchrec-model:MODULE:FACTORY``.
MODEL_SOURCE = "torchrec-model:"

PlanTablesOpt = Annotated[str | None, typer.Option(
    "--tables", "-t", help="Table file (JSON, YAML, CSV), or 'default' (the built-in workload); "
    "or give --torchrec-model.")]
TorchRecModelOpt = Annotated[str | None, typer.Option(
    "--torchrec-model", help="MODULE:FACTORY: plan the tables of the TorchRec model FACTORY() "
    "returns (MODULE a dotted module or a .py file; built on the meta device, no weights "
    "allocated), instead of --tables.")]
StatsOpt = Annotated[Path | None, typer.Option(
    "--stats", help="Table file of statistics for the model's tables, matched by table or "
    "feature name (default: TorchRec's pooling factor 1.0, with a warning).")]


def plan_tables(tables: str | None, model: str | None, stats: Path | None
                ) -> tuple[str, str | tuple[Table, ...], dict[str, str] | None]:
    """Where ``plan``'s tables come from and what they are: (the source its context records,
    the ``--tables`` spec or the model's tables, and for a model each table's collection's
    module path).

    Raises:
        InputError: Both or neither of ``--tables`` and ``--torchrec-model``, ``--stats``
            without a model, or a model that cannot be read (named).
    """
    if tables is not None and model is not None:
        raise InputError("give --tables or --torchrec-model, not both", source="command line",
                         field="--torchrec-model", value=model)
    if model is None:
        if stats is not None:
            raise InputError("goes with --torchrec-model (a table file carries its own "
                             "statistics)", source="command line", field="--stats",
                             value=str(stats))
        if tables is None:
            raise InputError("give the tables: --tables FILE (or 'default'), or "
                             "--torchrec-model MODULE:FACTORY", source="command line",
                             field="--tables")
        return tables, tables, None
    found, paths = read_model_tables(model, stats, "--torchrec-model")
    return MODEL_SOURCE + model, found, paths


def read_model_tables(model: str, stats: Path | None, field: str
                      ) -> tuple[tuple[Table, ...], dict[str, str]]:
    """The tables of the model ``MODULE:FACTORY`` returns (the module docstring), with each
    table's collection's module path; a warning on stderr names those that fell back to
    TorchRec's default pooling factor.

    Raises:
        InputError: TorchRec is not installed, or the model or statistics cannot be read.
    """
    from autoshard.torchrec import torchrec_unavailable

    reason = torchrec_unavailable(load=True)
    if reason:
        raise InputError(reason, source="command line", field=field, value=model)
    from autoshard.tables import check_unique_names
    from autoshard.torchrec.model_tables import (
        fallback_note,
        our_tables,
        read_factory,
        read_statistics,
    )

    found = read_factory(model, field)
    tables, fell_back = our_tables(found, read_statistics(stats), warn=False)
    check_unique_names(tables, model)
    if fell_back:
        typer.echo(f"warning: {fallback_note(fell_back)}", err=True)
    return tables, {t.name: t.path for t in found}


tables_app = typer.Typer(help="Table files.", no_args_is_help=True)
app.add_typer(tables_app, name="tables")


@tables_app.command("from-torchrec")
def from_torchrec(
    model: Annotated[str, typer.Argument(
        metavar="MODULE:FACTORY", help="A function returning the TorchRec model (MODULE a "
        "dotted module or a .py file); called on the meta device, no weights allocated.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Table file to write (YAML for "
                                                          ".yaml/.yml, else JSON).")],
    stats: StatsOpt = None,
) -> None:
    """Write the table file of a TorchRec model's embedding tables, as `plan --torchrec-model`
    reads them."""
    from autoshard.tables import save_tables

    check_output_path(out)
    if out.suffix.lower() == ".csv":
        raise InputError("writes JSON or YAML (a CSV file holds no access statistics)",
                         source="command line", field="--out", value=str(out))
    tables, paths = read_model_tables(model, stats, "MODULE:FACTORY")
    save_tables(out, tables)
    where = sorted(set(paths.values()))
    console.print(f"wrote {len(tables)} tables of {model} to {out} (with their features; "
                  f"collections: {', '.join(repr(p) for p in where)})", markup=False)
