"""Replicas: enough servers per shard and for the main tier to stay below the utilisation
ceiling, then more where they lower P99 until the target is met.

Provisioning judges deployments on the task's validation samples, never on the samples the
final deployment is judged on (:attr:`autoshard.serving.task.ServingTask.judge_samples`).

First each tier gets the replicas its offered load needs (cores or network interface, whichever
is busier) to sit below the ceiling; calls are dealt to replicas at random, so a small margin is
kept. Then, while the deployment is infeasible or misses the target on the upper end of its
P99 interval, one replica goes to the busiest tier, as long as that lowers P99 and the profile's
``max_servers`` allows it. Hot shards get replicas; cold ones keep one (ElasticRec).
"""

from __future__ import annotations

import numpy as np

from autoshard.serving.evaluation import Evaluation, Evaluator
from autoshard.serving.mapping import Mapping

#: Share of the ceiling the first replica counts aim for (random dealing is uneven).
MARGIN = 0.95
#: Replicas added one at a time after the first counts, at most.
MAX_STEPS = 8


def first_replicas(ev: Evaluator, mapping: Mapping) -> Mapping:
    """Replica counts that put every tier's offered load below the ceiling (each at most the
    profile's ``max_servers``: beyond it the deployment is infeasible anyway)."""
    main, shards = ev.offered(mapping)
    target = ev.task.profile.utilisation_ceiling * MARGIN
    limit = ev.task.profile.max_servers

    def count(load: float) -> int:
        return int(min(np.floor(load / target) + 1, limit))

    return mapping.with_replicas(tuple(count(u) for u in shards), count(main))


def provision(ev: Evaluator, mapping: Mapping) -> Mapping:
    """The deployment of ``mapping`` with replicas (see the module), chosen on ``ev``'s
    samples."""
    limit = ev.task.profile.max_servers
    current = first_replicas(ev, mapping)
    result = ev.evaluate(current)
    for _ in range(MAX_STEPS):
        if result.meets() or current.total_servers >= limit:
            break
        if result.feasible and ev.task.p99_ms is None:
            break
        tried = ev.evaluate(_one_more(result))
        improved = tried.percentile(99).hi < result.percentile(99).hi * 0.995
        if not (improved or not result.feasible):
            break
        current, result = tried.mapping, tried
    return current


def _one_more(result: Evaluation) -> Mapping:
    """``result``'s deployment with one more replica for its busiest tier."""
    m = result.mapping
    main = max(float(r.main_utilisation.max()) for r in result.runs)
    shards = np.max([r.shard_utilisation for r in result.runs], axis=0) if m.servers else []
    nic = np.max([r.shard_nic for r in result.runs], axis=0) if m.servers else []
    busy = np.maximum(shards, nic) if m.servers else np.zeros(0)
    main_busy = max(main, max(r.main_nic for r in result.runs))
    if not m.servers or main_busy >= float(busy.max()):
        return m.with_replicas(tuple(int(r) for r in m.replica_counts), m.main_replicas + 1)
    reps = [int(r) for r in m.replica_counts]
    reps[int(np.argmax(busy))] += 1
    return m.with_replicas(tuple(reps), m.main_replicas)
