"""Capacity planning: every strategy over a range of shard counts, each deployment provisioned
with replicas and judged on fresh request samples, and the fewest servers that meet a P99
target, whatever strategy gives them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoshard.errors import PlannerError
from autoshard.progress import Advance
from autoshard.serving.evaluation import Evaluation, Evaluator
from autoshard.serving.hotcold import with_main_cache
from autoshard.serving.mapping import Mapping
from autoshard.serving.provision import provision
from autoshard.serving.registry import get_strategy
from autoshard.serving.task import ServingTask


@dataclass(frozen=True)
class PlanOptions:
    """How deployments are built.

    Args:
        replicas: Provision replicas (:mod:`autoshard.serving.provision`); else one server per
            shard and one main server.
        cache: Move the hottest rows of remote tables to the main server's spare memory.
        strategy_options: Per strategy name, its constructor options.
    """

    replicas: bool = True
    cache: bool = False
    strategy_options: dict[str, dict[str, Any]] | None = None


def server_range(task: ServingTask, span: int) -> list[int]:
    """Shard counts to sweep: from the memory bound, ``span`` counts."""
    low = max(task.min_servers(), 1)
    return list(range(low, min(low + span, task.profile.max_servers + 1)))


def deployment(task: ServingTask, name: str, count: int, options: PlanOptions,
               validate: Evaluator | None = None) -> Mapping:
    """Strategy ``name``'s deployment on ``count`` shards, with the cache and the replicas
    asked for (chosen on the validation samples, never the judging ones).

    Raises:
        PlannerError: The strategy cannot map the tables on ``count`` shards.
    """
    validate = validate or Evaluator(task, task.validate_samples)
    strategy = get_strategy(name, **(options.strategy_options or {}).get(name, {}))
    if hasattr(strategy, "deploy"):  # a strategy that provisions its own deployment
        mapping: Mapping = strategy.deploy(validate, count, options)
        return mapping
    mapping = strategy.map(task, count)
    if options.cache and mapping.servers:
        mapping = with_main_cache(task, mapping)
    return provision(validate, mapping) if options.replicas else mapping


def sweep_size(strategies: Sequence[str], servers: Sequence[int]) -> int:
    """The deployments :func:`sweep` evaluates."""
    return sum(len(servers) if get_strategy(name).needs_servers else 1 for name in strategies)


def sweep(task: ServingTask, strategies: Sequence[str], servers: Sequence[int],
          options: PlanOptions | None = None, advance: Advance | None = None
          ) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Evaluation]]:
    """(a row per strategy and shard count, the evaluations by (strategy, count));
    ``main_only`` once, at 0 shards. A strategy that cannot map a count gives an error row.
    Each row also gives the deployment's mean P99 on the validation samples
    (``validation_p99_ms``), the evidence choices before judging are made on.
    ``advance(1)`` is called as each deployment is done (a progress display)."""
    options = options or PlanOptions()
    judge, validate = Evaluator(task), Evaluator(task, task.validate_samples)
    rows, found = [], {}
    for name in strategies:
        counts = list(servers) if get_strategy(name).needs_servers else [0]
        for count in counts:
            try:
                mapping = deployment(task, name, count, options, validate)
                result = judge.evaluate(mapping)
            except PlannerError as exc:
                rows.append({"strategy": name, "servers": count, "error": str(exc),
                             "qps": task.qps})
                continue
            finally:
                if advance is not None:
                    advance(1)
            found[(name, count)] = result
            checked = validate.evaluate(mapping)
            rows.append(dict(result.row(), qps=task.qps,
                             validation_p99_ms=round(checked.percentile(99).mean, 4),
                             validation_feasible=checked.feasible))
    return rows, found


def fewest_servers(rows: Sequence[dict[str, Any]]) -> dict[str, int | None]:
    """Per strategy, the fewest total servers of a row that meets the target (None: none)."""
    out: dict[str, int | None] = {}
    for row in rows:
        name = row["strategy"]
        out.setdefault(name, None)
        if row.get("error") or not row.get("meets"):
            continue
        best = out[name]
        out[name] = row["total_servers"] if best is None else min(best, row["total_servers"])
    return out


#: What the answer minimises first: servers, or cost (the profile's cost per server type).
OBJECTIVES = ("servers", "cost")


def answer(rows: Sequence[dict[str, Any]], by: str = "servers") -> dict[str, Any] | None:
    """The row meeting the target with the fewest servers then the least cost (or the least
    cost then the fewest servers); None when no row meets it.

    Among rows tied on both, the first strategy in the rows' order (the registry's, simplest
    first), then the fewest shards, then the lowest upper P99. The target asks for no lower
    P99 than it, and which of two deployments that meet it is lower is often a question
    another draw of samples answers the other way; the order does not change with the seed.
    """
    ok = [r for r in rows if not r.get("error") and r.get("meets")]
    if not ok:
        return None
    rank = {name: i for i, name in enumerate(dict.fromkeys(r["strategy"] for r in rows))}
    first = ("cost", "total_servers") if by == "cost" else ("total_servers", "cost")
    return min(ok, key=lambda r: (*(r[k] for k in first), rank[r["strategy"]], r["servers"],
                                  r["p99_hi_ms"]))


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows' P99 intervals overlap (their difference is within sampling noise)."""
    return bool(a["p99_hi_ms"] >= b["p99_lo_ms"] and b["p99_hi_ms"] >= a["p99_lo_ms"])


def seed_check(first: dict[str, Any] | None, again: Sequence[dict[str, Any] | None],
               held: Sequence[bool] = ()) -> dict[str, Any]:
    """Whether an answer holds on fresh seeds: ``same`` (every seed's answer has its servers
    and strategy); ``marginal`` (its row is marginal, or its deployment misses the target on
    a fresh seed's samples: ``held`` says, per seed, whether it meets it there); and
    ``servers_on_every_seed``, the fewest servers meeting the target on every seed tried (the
    first seed's included; None when some seed has no answer)."""
    answers = [first, *again]
    counts = [None if a is None else a["total_servers"] for a in answers]
    key = (None if first is None else (first["total_servers"], first["strategy"]))
    return {"same": all((None if a is None else (a["total_servers"], a["strategy"])) == key
                        for a in answers),
            "marginal": bool(first is not None and (first.get("marginal")
                                                    or not all(held))),
            "servers_on_every_seed": None if None in counts else max(
                c for c in counts if c is not None)}


def replan(task: ServingTask, first: dict[str, Any] | None,
           found: dict[tuple[str, int], Evaluation], seeds: Sequence[int],
           strategies: Sequence[str], span: int, options: PlanOptions | None = None,
           by: str = "servers", advance: Advance | None = None
           ) -> tuple[list[dict[str, Any] | None], dict[str, Any]]:
    """The plan made again on each of ``seeds`` (same rate, target and sweep): (each seed's
    answer, :func:`seed_check` of ``first``, whose deployment ``found`` holds, against them);
    ``advance(1)`` as each deployment of the sweeps is done."""
    from dataclasses import replace

    mapping = None if first is None else found[(first["strategy"], first["servers"])].mapping
    again, held = [], []
    for other in seeds:
        fresh = replace(task, seed=other)
        again.append(answer(sweep(fresh, strategies, server_range(fresh, span), options,
                                  advance)[0], by))
        held.append(mapping is None or Evaluator(fresh).evaluate(mapping).meets())
    return again, seed_check(first, again, held)


def advantage_at_equal_servers(rows: Sequence[dict[str, Any]],
                               ours: str = "optimiser") -> list[dict[str, Any]]:
    """Per shard count: our P99 on the judging samples (never the search's) against the best
    baseline's with as many servers in all (``equal_servers``; else the baselines with the
    fewest servers), how much lower ours is, and whether the two intervals overlap.

    The best baseline is chosen as the optimiser chooses its seed: feasible on the validation
    samples, then the lowest mean P99 there (``validation_p99_ms``), so both choices are made
    out of sample. ``lowest_baseline_p99_ms`` is the lowest baseline P99 on the judging samples
    themselves (a minimum taken on the figures it is compared on, so biased low).
    """
    out = []
    counts = sorted({r["servers"] for r in rows if r["strategy"] == ours and not r.get("error")})
    for count in counts:
        at = [r for r in rows if r["servers"] == count and not r.get("error")]
        mine = next(r for r in at if r["strategy"] == ours)
        others = [r for r in at if r["strategy"] != ours]
        if not others:
            continue
        same = [r for r in others if r["total_servers"] == mine["total_servers"]]
        fewest = min(r["total_servers"] for r in others)
        pool = same or [r for r in others if r["total_servers"] == fewest]
        best = min(pool, key=lambda r: (not r.get("validation_feasible", r["feasible"]),
                                        r.get("validation_p99_ms", r["p99_ms"])))
        out.append({"servers": count, "optimiser_p99_ms": mine["p99_ms"],
                    "optimiser_total_servers": mine["total_servers"],
                    "best_baseline": best["strategy"], "best_baseline_p99_ms": best["p99_ms"],
                    "best_baseline_total_servers": best["total_servers"],
                    "lowest_baseline_p99_ms": min(r["p99_ms"] for r in pool),
                    "equal_servers": bool(same),
                    "p99_reduction": round(1 - mine["p99_ms"] / best["p99_ms"], 4),
                    "within_noise": overlap(mine, best)})
    return out
