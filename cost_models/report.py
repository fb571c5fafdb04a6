"""Writes the held-out comparison of cost models as JSON and Markdown."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from autoshard.cost_models.evaluate import shown
from autoshard.fileio import atomic_write_text, write_structured

_LABELS = {"lightgbm": "LightGBM (cost_models.model)",
           "analytical": "Analytical form, bandwidth + overhead fitted",
           "mlp": "MLP 128-64 (DreamShard-style cost network)"}


def write_report(folder: Path, result: dict[str, Any], info: dict[str, Any],
                 seconds: float) -> None:
    """``metrics.json`` (everything) and ``metrics.md`` (a table) in ``folder``."""
    doc = {"data": info, "split": result["split"], "models": result["models"],
           "repeatability": result.get("repeatability"),
           "compare_seconds": round(seconds, 1), "python": platform.python_version()}
    write_structured(folder / "metrics.json", doc)
    atomic_write_text(folder / "metrics.md", markdown(doc))


def markdown(doc: dict[str, Any]) -> str:
    """The comparison as a Markdown table."""
    data, split = doc["data"], doc["split"]
    lines = [
        "# Cost models on held-out microbenchmark configurations",
        "",
        f"Data: {', '.join(data.get('data', []))} ({data.get('configurations')} configurations, "
        f"{data.get('measurements')} measurements; "
        f"hardware: {', '.join(data.get('hardware', []))}; torch "
        f"{', '.join(data.get('torch_version', []))}, fbgemm "
        f"{', '.join(data.get('fbgemm_version', []))}). Latency: the {data.get('stat')} of "
        "each configuration's repeated timings.",
        f"Split by configuration: {split['test_configurations']} of {split['configurations']} "
        f"held out (seed {split['seed']}); {split['test_samples']} test samples (inference and "
        "training latency of each held-out configuration).",
        "",
        "| model | MAPE | median APE | p90 APE | Spearman | MAPE infer | MAPE train |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in doc["models"].items():
        pct = [shown(v, ".2f", 100) for v in (m["mape"], m["median_ape"], m["p90_ape"],
                                              m["infer"]["mape"], m["train"]["mape"])]
        lines.append(
            f"| {_LABELS.get(name, name)} | {pct[0]}% | {pct[1]}% | {pct[2]}% "
            f"| {shown(m['spearman'])} | {pct[3]}% | {pct[4]}% |")
    fitted = doc["models"].get("analytical", {}).get("fitted")
    if fitted:
        lines += ["", f"Analytical form fitted on the training split: "
                  f"{fitted['overhead_ms_per_pass'] * 1e3:.1f} us per pass, effective bandwidth "
                  f"{fitted['bandwidth_gbps']:.2f} GB/s."]
    again = doc.get("repeatability")
    if again:
        lines += ["", f"Noise floor: {again['configurations']} configurations measured twice "
                  f"({again['data']}): the second measurement differs from the first by "
                  f"{shown(again['mape'], '.2f', 100)}% MAPE (median "
                  f"{shown(again['median_ape'], '.2f', 100)}%, Spearman "
                  f"{shown(again['spearman'])})."]
    return "\n".join(lines) + "\n"
