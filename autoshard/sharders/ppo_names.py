"""The names of the ``ppo`` sharder's candidates: its rivals, the groups whose cheapest the
improvement stage polishes, and how a winner's name says where it came from
(:func:`provenance`).

A decode is named ``<prefix>[-<refill suffix>]-greedy`` (or ``-sample-<i>``): the prefix its
split choice (``ppo``: every table whole; :mod:`autoshard.policy.geometries`), the suffix the
refill mode where it is not the policy's own (:mod:`autoshard.policy.refill`). Each step of
the improvement stage appends ``+<step>``.
"""

from __future__ import annotations

from autoshard.policy.refill import SUFFIX
from autoshard.provenance import Provenance

#: The table-wise greedy sharders (DreamShard's baselines).
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
#: Candidates whose cheapest is polished besides the cheapest of all, by split choice: the
#: plans over the split choice (the decodes and the greedy sharder over it), the decode where
#: the policy chooses the splits, and the decodes over the node-local, the finer and the
#: row-only choices (:mod:`autoshard.policy.geometries`; a plan whose shards differ can come
#: out ahead of one that cost less before the polish: on the held-out profiled-T200-D64 with
#: TorchRec's room the node-local split's decode wins, ``results/ppo/torchrec-room``).
#: Each group's member polished is the cheapest once its HBM is water-filled.
POLISHED_GROUPS = (("ppo-split", "split_lookup_greedy"), ("ppo-choice",), ("ppo-node-split",),
                   ("ppo-fine",), ("ppo-node-fine",), ("ppo-rows",), ("ppo-node-rows",))
#: The policy's whole-table decodes, in every refill mode (name prefixes).
POLICY_WHOLE = ("ppo-greedy", "ppo-sample", *(f"ppo-{s}-" for s in SUFFIX.values()))
#: One more such group on tasks of up to ``SMALL_TASK`` pairs: the whole-table plans (the
#: policy's and the table-wise greedy sharders'). With HBM reserved per table or shard, a
#: whole-table plan can polish to below a split one that cost less before.
WHOLE_GROUP = (*POLICY_WHOLE, *GREEDY)
#: The greedy family whose plans are candidates: the table-wise four, and, for tasks of up to
#: ``SMALL_TASK`` (table, device) pairs, the variant that splits dominant tables (the
#: policy's own actions are table-wise; the split variant takes 0.8 s at 856 x 128).
CANDIDATES = (*GREEDY, "split_lookup_greedy")
#: The one candidate on tasks over ``SMALL_TASK`` pairs: made first, it is the plan kept
#: where no decode ends before its deadline.
FALLBACK = "lookup_greedy"
#: Appended to the names of the tuned policy's decodes (``ppo-split-greedy-tuned``; the
#: second committed policy, :data:`autoshard.sharders.ppo.TUNED_POLICY`).
TUNED_SUFFIX = "-tuned"


def is_tuned(name: str) -> bool:
    """Whether candidate ``name`` (``<candidate>+<step>+...``) comes from a tuned policy's
    decode."""
    return name.split("+")[0].endswith(TUNED_SUFFIX)


def provenance(winner: str, costs: dict[str, float]) -> Provenance:
    """How the winning candidate ``winner`` (``<candidate>+<step>+...``) was found, from every
    candidate's step cost (each step's result is a candidate of its own name)."""
    base, *stages = winner.split("+")
    steps, name = [], base
    for stage in stages:
        name = f"{name}+{stage}"
        steps.append((stage, costs[name]))
    source = ("rival sharder" if base in CANDIDATES else
              "policy" if base.startswith(POLICY_WHOLE) else "policy over splits")
    return Provenance(base, source, costs[base], tuple(steps), tuple(costs.items()))
