"""A serving suite's report: SUITE.md, .csv, .png, .json (and SUITE.bench.* when measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoshard.fileio import atomic_write_text, write_structured
from autoshard.machine import describe_machine
from autoshard.serving.cluster import CALIBRATED
from autoshard.serving.plan_output import deployment_words
from autoshard.serving.report import (
    BENCH_COLUMNS,
    SWEEP_COLUMNS,
    markdown_table,
    plot_measured_vs_simulated,
    plot_p99_vs_servers,
    write_csv,
)
from autoshard.serving.suites import SUITES

ADVANTAGE = ("qps", "servers", "optimiser_total_servers", "optimiser_p99_ms", "best_baseline",
             "best_baseline_total_servers", "best_baseline_p99_ms", "lowest_baseline_p99_ms",
             "equal_servers", "p99_reduction", "within_noise")


def answer_lines(per_rate: list[dict[str, Any]]) -> list[str]:
    """One line per rate: the answer, the answers on the fresh seeds, and whether it is
    marginal (then the servers that meet the target on every seed tried)."""
    lines = []
    for rate in per_rate:
        a = rate["answer"]
        if a["total_servers"] is None:
            text = "no deployment within the profile's servers meets it"
        else:
            text = (f"{deployment_words(a)}; P99 {a['p99_ms']} ms [{a['p99_lo_ms']}, "
                    f"{a['p99_hi_ms']}] (one sample's up to {a.get('p99_sample_hi_ms', '-')}), "
                    f"busiest server {a['max_utilisation']}")
        lines.append(f"- {rate['qps']:g} qps (memory bound {rate['memory_bound_shards']} "
                     f"shards): {text}{seed_text(rate)}")
    return lines


def seed_text(rate: dict[str, Any]) -> str:
    """The fresh seeds' answers, and the verdict on them, as the tail of an answer line."""
    if not rate["seeds"]:
        return ""
    seeds = ", ".join(str(s["seed"]) for s in rate["seeds"])
    again = ", ".join(f"{s['total_servers']} ({s.get('strategy', '-')})"
                      for s in rate["seeds"])
    tail = f". Fresh seeds {seeds}: {again}"
    if rate.get("same"):
        tail += "; the same answer on every seed"
    if rate.get("marginal"):
        tail += (". Marginal: a sample's P99 can reach the target (within the prediction "
                 "interval of one sample's P99, or on a fresh seed's samples); "
                 f"{rate['servers_on_every_seed']} servers meet it on every seed tried")
    elif not rate.get("same"):
        tail += (f"; {rate['servers_on_every_seed']} servers meet the target on every seed "
                 "tried")
    return tail


def measured_lines(measured: dict[str, Any]) -> list[str]:
    pinned = ", each pinned to its core" if measured.get("pinned") else ""
    how = ("each server replayed its own calls alone, one at a time (the load generator on "
           f"another core{pinned}), and every request composed from its servers' measured "
           "calls; simulated with each server on its own machine" if measured["mode"] == "replay"
           else "every server at once on this host; simulated sharing the host's cores")
    return ["## Measured here vs simulated", "",
            f"Mode `{measured['mode']}`: {how}. Each percentile is the median over rounds "
            "(the simulator: over as many draws of its service times on the same requests), "
            "with the range over rounds as its interval.", "",
            f"Over the {measured['points']} points below the utilisation ceiling "
            f"({measured['above_ceiling']} above it left out): Spearman of measured against "
            f"simulated P99 {measured['spearman_p99']}, P90 {measured['spearman_p90']}, P50 "
            f"{measured['spearman_p50']}. Measured over simulated P99: "
            f"{measured['p99_ratio_range'][0]}-{measured['p99_ratio_range'][1]} "
            f"({measured['within_1_5x']} of {measured['points']} points within 1.5x). Load "
            f"average (1, 5, 15 min) before measuring {measured['load_average_before']}, "
            f"after {measured['load_average']}. Simulated with this machine's constants, "
            "measured by `serve calibrate` in the same run: "
            + ", ".join(f"{k} {measured['profile'][k]}" for k in (*CALIBRATED, "host_cores"))
            + ".", "", markdown_table(measured["rows"], BENCH_COLUMNS),
            "One shard of load-balanced tables, on one server and on two replicas:", "",
            markdown_table(measured["replicated"], BENCH_COLUMNS),
            *replica_lines(measured["replica_verdicts"]), "",
            "Load-balanced tables on more shards than this host has cores:", "",
            markdown_table(measured["wide"], BENCH_COLUMNS)]


def replica_lines(verdicts: list[dict[str, Any]]) -> list[str]:
    """One line per rate: two replicas against one, measured and simulated."""
    lines = []
    for v in verdicts:
        sim = "lower" if v["simulated_faster"] else "not lower"
        got = ("lower, the intervals apart" if v["measured_faster_apart"] else
               "not lower beyond the intervals")
        lines.append(f"- {v['qps']:g} qps: two replicas P99 {v['two_p99_ms']} ms "
                     f"{v['two_interval']} against one {v['one_p99_ms']} ms "
                     f"{v['one_interval']}: measured {got}; simulated {sim}")
    return lines


def write_suite(name: str, output: Path, command: str, rows: list[dict[str, Any]],
                per_rate: list[dict[str, Any]], measured: dict[str, Any] | None) -> None:
    """SUITE.csv, SUITE.md, SUITE.png (and SUITE.bench.* when measured), SUITE.json."""
    spec = SUITES[name]
    machine = describe_machine()
    lines = [f"# Serving suite `{name}`", "",
             f"Command: `{command}`  ", f"Machine: {machine}  ",
             f"Model: {spec.tables} tables, {spec.total_gb:g} GB, {spec.groups} feature groups, "
             f"{spec.items} items per request on average (spread {spec.items_sigma:g}); profile "
             f"`{spec.profile}`; P99 target {spec.p99_ms:g} ms, met when every server is below "
             "the utilisation ceiling and the upper end of the P99's 95% interval over the "
             "samples is within the target.", "",
             "## Fewest servers meeting the P99 target", "", *answer_lines(per_rate), "",
             "## Optimiser against the best baseline at equal shards (judging samples)", "",
             "The baseline compared has as many servers in all when one does "
             "(`equal_servers`); else it is among the baselines with the fewest servers. Of "
             "those it is the one chosen on the validation samples, as the optimiser chooses "
             "its seed (`lowest_baseline_p99_ms`: the lowest baseline P99 on the judging "
             "samples, a minimum taken in-sample).", "",
             markdown_table([dict(a, qps=r["qps"]) for r in per_rate for a in r["advantage"]],
                            ADVANTAGE),
             "## Every deployment (simulated)", "", markdown_table(rows, SWEEP_COLUMNS)]
    output.mkdir(parents=True, exist_ok=True)
    if measured is not None:
        lines += measured_lines(measured)
        every = measured["rows"] + measured["replicated"] + measured["wide"]
        write_csv(output / f"{name}.bench.csv", every, BENCH_COLUMNS)
        plot_measured_vs_simulated(every, output / f"{name}.bench.png",
                                   f"{name}: measured vs simulated P99")
    write_csv(output / f"{name}.csv", rows, SWEEP_COLUMNS)
    plot_p99_vs_servers(rows, output / f"{name}.png", f"suite {name}", spec.p99_ms)
    write_structured(output / f"{name}.json", {
        "suite": name, "command": command, "machine": machine, "per_rate": per_rate,
        "measured": measured and {k: v for k, v in measured.items()
                                  if k not in ("rows", "replicated", "wide")}})
    atomic_write_text(output / f"{name}.md", "\n".join(lines) + "\n")
