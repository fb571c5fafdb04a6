"""The ``ppo`` sharder's candidate plans: what made each one (:class:`Candidate`), the rival
sharders whose plans compete, the layouts whose cheapest the improvement stage polishes, and
how a winner's provenance is written (:func:`provenance`).

A candidate's name is derived from its fields, for plan files and reports only: a decode is
``<layout>[-<refill suffix>]-greedy`` (or ``-sample-<i>``), with ``-tuned`` for the tuned
policy's; a rival is its sharder's name; each search step appends ``+<step>``. Logic reads the
fields, never the name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoshard.layout.plan import Plan
from autoshard.provenance import Provenance

#: The table-wise greedy sharders (DreamShard's baselines).
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
#: The greedy family whose plans are candidates: the table-wise four, and, for tasks of up to
#: ``SMALL_TASK`` (table, device) pairs, the variant that splits dominant tables (the
#: policy's own actions are table-wise; the split variant takes 0.8 s at 856 x 128).
CANDIDATES = (*GREEDY, "split_lookup_greedy")
#: The one candidate on tasks over ``SMALL_TASK`` pairs: made first, it is the plan kept
#: where no decode ends before its deadline.
FALLBACK = "lookup_greedy"
#: Appended to the names of the tuned policy's decodes (``ppo-split-greedy-tuned``; the
#: second committed policy, :data:`autoshard.sharders.ppo.sharder.TUNED_POLICY`).
TUNED_SUFFIX = "-tuned"

#: The layout of the policy's whole-table decodes (and of the table-wise rivals' plans).
WHOLE = "ppo"
#: The layout of the decodes in which the policy chooses the splits.
CHOICE = "ppo-choice"
#: The split choice of ``split_lookup_greedy`` (and of the decodes over it).
SPLIT = "ppo-split"
#: Every table whole with light tables replicated (not a split of dominant tables).
WHOLE_REPLICAS = "ppo-replicas"
#: The origin name of the plan in use, carried onto the task, in a re-plan
#: (:func:`autoshard.replan.carry.carry`).
CARRIED = "carried"
#: The layout of each rival sharder's plans.
RIVAL_LAYOUT = {**dict.fromkeys(GREEDY, WHOLE), "split_lookup_greedy": SPLIT}


def _with_replicas(*layouts: str) -> tuple[str, ...]:
    """Each layout and the same with light tables replicated
    (:func:`autoshard.policy.geometries.split_geometries` names them)."""
    return tuple(x for layout in layouts for x in (layout, f"{layout}-replicas"))


#: Layouts whose cheapest candidate is polished besides the cheapest of all: the split choice
#: (the decodes and the greedy sharder over it), the decode where the policy chooses the
#: splits, and the node-local, the finer and the row-only choices, each with its light tables
#: replicated too (:mod:`autoshard.policy.geometries`; a plan whose shards differ can come out
#: ahead of one that cost less before the polish: on the held-out profiled-T200-D64 with
#: TorchRec's room the node-local split's decode wins, ``results/ppo/torchrec-room``).
#: Each group's member polished is the cheapest once its HBM is water-filled.
POLISHED_GROUPS = (_with_replicas(SPLIT), (CHOICE,), _with_replicas("ppo-node-split"),
                   _with_replicas("ppo-fine"), _with_replicas("ppo-node-fine"),
                   _with_replicas("ppo-rows"), _with_replicas("ppo-node-rows"))
#: One more such group on tasks of up to ``SMALL_TASK`` pairs: the whole-table plans (the
#: policy's and the table-wise greedy sharders'). With HBM reserved per table or shard, a
#: whole-table plan can polish to below a split one that cost less before.
WHOLE_GROUP = (WHOLE,)


@dataclass(frozen=True, eq=False)
class Candidate:
    """One candidate plan and what made it.

    Args:
        layout: Which shards it places: a split choice of
            :func:`autoshard.policy.geometries.split_geometries`, :data:`WHOLE` or
            :data:`CHOICE` (a rival's: :data:`RIVAL_LAYOUT`).
        plan: The plan.
        cost_ms: Its step cost.
        rival: The rival sharder that made it; None for a policy's decode.
        tuned: Whether the tuned policy decoded it (else the first policy).
        mode: The refill mode's name suffix where not the policy's own (``-refill``, ...).
        rollout: None for the greedy decode, else the sampled rollout's index.
        steps: Each search step that made it from its origin, as (step, step cost after it).
        origin_ms: The origin's step cost, before any step.
    """

    layout: str
    plan: Plan
    cost_ms: float
    rival: str | None = None
    tuned: bool = False
    mode: str = ""
    rollout: int | None = None
    steps: tuple[tuple[str, float], ...] = ()
    origin_ms: float = 0.0

    @classmethod
    def of_rival(cls, sharder: str, plan: Plan, cost_ms: float) -> Candidate:
        """A rival sharder's plan."""
        return cls(RIVAL_LAYOUT[sharder], plan, cost_ms, rival=sharder, origin_ms=cost_ms)

    @classmethod
    def decoded(cls, layout: str, mode: str, tuned: bool, rollout: int | None, plan: Plan,
                cost_ms: float) -> Candidate:
        """A policy's decode."""
        return cls(layout, plan, cost_ms, tuned=tuned, mode=mode, rollout=rollout,
                   origin_ms=cost_ms)

    def refilled(self, plan: Plan, cost_ms: float) -> Candidate:
        """The same origin with another plan and cost (its HBM water-filled), before steps."""
        return replace(self, plan=plan, cost_ms=cost_ms, origin_ms=cost_ms)

    def then(self, step: str, plan: Plan, cost_ms: float) -> Candidate:
        """The candidate that search step ``step`` made from this one."""
        return replace(self, plan=plan, cost_ms=cost_ms, steps=(*self.steps, (step, cost_ms)))

    @property
    def origin(self) -> tuple[object, ...]:
        """What tells its origin (decode or rival) apart from others', steps aside."""
        return self.layout, self.rival, self.tuned, self.mode, self.rollout

    @property
    def source(self) -> str:
        """Where it came from (:data:`autoshard.provenance.SOURCES`)."""
        if self.rival == CARRIED:
            return "plan in use"
        if self.rival is not None:
            return "rival sharder"
        return "policy" if self.layout == WHOLE else "policy over splits"

    @property
    def origin_name(self) -> str:
        """Its origin's name (plan files and reports)."""
        if self.rival is not None:
            return self.rival
        decode = "greedy" if self.rollout is None else f"sample-{self.rollout}"
        return f"{self.layout}{self.mode}-{decode}{TUNED_SUFFIX if self.tuned else ''}"

    @property
    def name(self) -> str:
        """Its name: the origin's, then ``+<step>`` per step."""
        return self.origin_name + "".join(f"+{step}" for step, _ in self.steps)


def cheapest(candidates: list[Candidate]) -> Candidate:
    """The candidate with the lowest step cost (ties: the earlier one)."""
    return min(candidates, key=lambda c: c.cost_ms)


def provenance(winner: Candidate, candidates: list[Candidate]) -> Provenance:
    """How ``winner`` was found, with every candidate's step cost."""
    return Provenance(winner.origin_name, winner.source, winner.origin_ms, winner.steps,
                      tuple((c.name, c.cost_ms) for c in candidates))
