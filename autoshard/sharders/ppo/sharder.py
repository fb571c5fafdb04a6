"""The ``ppo`` sharder (:class:`PPOSharder`) and the policy alone (:class:`PPOPolicySharder`):
the policies loaded, their decodes made into candidates (:mod:`autoshard.sharders.ppo.
candidates`), the portfolio's improvement stage run over them (:mod:`autoshard.sharders.ppo.
portfolio`), the cheapest returned. The package docstring tells the whole story.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import autoshard
from autoshard.errors import DeadlineReached, InputError, PlannerError
from autoshard.extras import missing
from autoshard.layout.shards import ShardGeometry, ShardLayout, pricing_task
from autoshard.limits import SEED, THREADS, TIME_LIMIT_S, Range
from autoshard.policy.geometries import split_geometries
from autoshard.policy.refill import decode_modes
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import step_cost_ms, task_bound_ms
from autoshard.replan.budget import Moves
from autoshard.search.enforce import enforce
from autoshard.search.stage import refine
from autoshard.sharders.base import Sharded, Sharder
from autoshard.sharders.ppo import tuning
from autoshard.sharders.ppo.candidates import (
    CHOICE,
    SPLIT,
    TUNED_SUFFIX,
    WHOLE,
    WHOLE_REPLICAS,
    Candidate,
    cheapest,
    provenance,
)
from autoshard.sharders.ppo.portfolio import (
    Clock,
    add_rivals,
    filled,
    polish_candidates,
    refined_starts,
    resolve,
    settle,
    within_budget,
)
from autoshard.task import ShardingTask

#: The committed policy, shipped as package data (``autoshard train --export`` writes one).
DEFAULT_POLICY = Path(autoshard.__file__).resolve().parent / "data" / "ppo_policy"
#: A second committed policy, fine-tuned from the first on up to 32 devices with TorchRec's
#: room drawn and the water-filled reward (``results/ppo-tuned-train``). Where no policy is
#: named, ``ppo`` decodes it beside the first on tasks of up to :data:`SMALL_TASK` pairs that
#: keep HBM room per table, its candidates named with :data:`TUNED_SUFFIX`
#: (``ppo-split-greedy-tuned``, ...).
TUNED_POLICY = DEFAULT_POLICY.parent / "ppo_policy_tuned"
def _small(task: ShardingTask) -> bool:
    """Whether ``task`` has at most :data:`SMALL_TASK` (table, device) pairs."""
    return task.num_tables * task.num_devices <= tuning.SMALL_TASK


def policy_folders(policy: str | Path | None) -> list[Path]:
    """The policy folders a sharder given ``policy`` loads: that one alone, or, for None, the
    committed policy and the tuned one (:data:`TUNED_POLICY`)."""
    return [Path(policy)] if policy is not None else [DEFAULT_POLICY, TUNED_POLICY]


def policy_missing(folder: Path) -> str | None:
    """Why no policy can be loaded from ``folder`` (None if the files are there)."""
    if reason := missing("torch", "learned"):
        return reason
    for name in ("config.json", "weights.pt"):
        if not (folder / name).is_file():
            return (f"no trained policy: {folder / name} is missing (train one with "
                    f"`autoshard train --export results/ppo`, or pass policy=<folder>)")
    return None


@dataclass(frozen=True)
class Choice:
    """Which candidate won a plan (by name), every candidate's step cost (ms) by name, and the
    candidates themselves: the ``ppo`` sharders' :attr:`~autoshard.sharders.base.Sharded.
    details`."""

    winner: str
    costs: dict[str, float]
    candidates: tuple[Candidate, ...] = ()


class Decoded(NamedTuple):
    """One episode of a decode and what made it (:class:`~autoshard.sharders.ppo.candidates.
    Candidate`'s fields)."""

    mode: str
    tuned: bool
    rollout: int | None
    episode: Any


def _rollouts(samples: int) -> list[int | None]:
    """The greedy decode (None) and each sampled rollout's index, in a decode's order."""
    return [None, *range(samples)]


class PPOSharder(Sharder):
    """Plans with a trained placement policy: tables costliest first, each placed on a
    (device, HBM-split bucket) option.

    Candidates: the policy's greedy decode (the highest allowed logit at every step),
    ``samples`` rollouts that sample each action from the policy (seeded, so plans are
    deterministic), all run in lockstep with one batched network call per table, and, if
    ``candidates``, the plans of the greedy family (:data:`CANDIDATES`). With ``split``, on
    tasks of up to :data:`SMALL_TASK` (table, device) pairs where some table dominates, the same
    decodes also run over the task's shards (``ppo-split-greedy``, ``ppo-split-sample-i``) and
    with the split choice in the policy's actions (``ppo-choice-greedy``,
    ``ppo-choice-sample-i``: the policy decides, table by table, which dominant tables to split).
    On tasks with fewer than :data:`~autoshard.policy.geometries.FINE_TABLES_PER_DEVICE`
    tables per device the decodes also run over a finer split (``ppo-fine-greedy``, ...).
    Each decode keeps the devices the policy chose, its HBM rows water-filled per device over
    the items placed there (the policy's buckets approximate that split; with TorchRec's room
    far from it), and is priced by the cost model. With ``polish``, the cheapest candidate
    and the cheapest of each group (:data:`POLISHED_GROUPS`, :data:`WHOLE_GROUP`) then go
    through the improvement stage of :mod:`autoshard.search.polish` (HBM rows re-chosen
    per device, tables and shards moved off the most loaded device), competing as
    ``<name>+polish`` if that improves them (the stage stops after a number of rounds, so
    plans stay deterministic, unless its time guard ends it first, as on large tasks). Where
    tables dominate (the split decodes ran) the two cheapest candidates of distinct decodes
    (:data:`~autoshard.sharders.ppo.tuning.REFINED`; the winner alone over :data:`SMALL_TASK`
    pairs) then have their
    heaviest tables' splits re-chosen (:mod:`autoshard.search.resplit`) and kicks around
    them (:mod:`autoshard.search.kick`), winning as ``<name>+resplit`` / ``+kick`` where that
    lowers their cost; on tasks over :data:`HUGE_TASK` pairs neither runs, and the winner's
    polish runs on instead (``+settle``). On tasks of up to :data:`SMALL_TASK` pairs the
    winner then goes through the search stage's large-neighbourhood search
    (:mod:`autoshard.search.lns`), the MILP re-solved on the most loaded device and a
    lighter one at a time while it improves, in the time left
    (:func:`autoshard.sharders.ppo.portfolio.resolve`, ``+lns``; with at least
    :data:`~autoshard.sharders.ppo.tuning.MIN_RESOLVE_S` left). The cheapest step cost wins
    (ties: the earlier candidate).
    The result's details (:class:`Choice`) say which won. ``samples=0, candidates=False,
    polish=False`` is the policy alone: its greedy decodes (whole tables, shards where tables
    were split, and the decode in which it chooses the splits), each with its HBM water-filled.

    Args:
        policy: Folder with ``config.json`` and ``weights.pt`` (default: the committed one,
            and :data:`TUNED_POLICY` beside it on tasks of up to :data:`SMALL_TASK` pairs
            that keep HBM room per table).
        threads: torch threads for the policy (1: one CPU core).
        samples: Sampled rollouts (K of best-of-K); None: :data:`SAMPLES`.
        candidates: Whether the greedy sharders' plans compete (over :data:`SMALL_TASK`
            pairs :data:`FALLBACK`'s alone, where it is made: :data:`FALLBACK_MARGIN`).
        seed: Seed of the sampled rollouts.
        split: Whether the policy also places the shards of the dominant tables (and chooses
            which to split).
        polish: Whether the cheapest candidates go through the improvement stage.
        time_limit: Seconds for the whole run (module docstring).
        refills: On tasks of up to :data:`SMALL_TASK` pairs, also decode the policy in the
            refill modes it was not trained in (:func:`autoshard.policy.refill.decode_modes`;
            ``ppo-refill-greedy``, ``ppo-split-level-greedy``, ...).
    """

    name: ClassVar[str] = "ppo"
    summary: ClassVar[str] = ("learned placement policy: greedy and best-of-K sampled decodes, "
                              "greedy sharders as candidates")
    option_ranges: ClassVar[dict[str, Range]] = {
        "threads": THREADS, "samples": Range(0, 1000, integer=True), "seed": SEED,
        "time_limit": TIME_LIMIT_S}

    def __init__(self, policy: str | Path | None = None, threads: int = 1,
                 samples: int | None = None, candidates: bool = True, seed: int = 0,
                 split: bool = True, polish: bool = True, time_limit: float = 60.0,
                 refills: bool = True) -> None:
        if samples is not None and samples < 0:
            raise InputError("must be >= 0", field="samples", value=samples)
        TIME_LIMIT_S.check(time_limit, "time_limit", "sharder options")
        self._folders = policy_folders(policy)
        self.policy = self._folders[0]
        self.tuned = len(self._folders) > 1  # the second committed policy decodes too
        self.threads, self.samples, self.candidates, self.seed = threads, samples, candidates, seed
        self.split, self.polish, self.time_limit = split, polish, float(time_limit)
        self.refills = refills
        self._net: Any = None  # the first policy (its refill mode names the decodes' modes)
        self._nets: list[tuple[Any, Any]] = []  # each policy on one grid and on two
        self._multipliers: tuple[float, ...] = ()
        self._load()  # load (and import torch) now, so that solve() is planning only

    @classmethod
    def unavailable(cls, policy: str | Path | None = None) -> str | None:
        """Why the policy in ``policy`` (default: the committed ones) cannot be loaded here."""
        return next(filter(None, map(policy_missing, policy_folders(policy))), None)

    def _load(self) -> None:
        from autoshard.policy.choice import GRIDS
        from autoshard.policy.network import load_policy, regrid

        for folder in self._folders:
            reason = policy_missing(folder)
            if reason:
                raise InputError(reason, field="policy", value=str(folder))
            net, multipliers, _ = load_policy(folder)
            if self._nets and (multipliers, net.refill) != (self._multipliers,
                                                             self._nets[0][0].refill):
                raise InputError(f"bucket multipliers {multipliers} or refill mode "
                                 f"{net.refill!r} differ from the first policy's",
                                 field="policy", value=str(folder))
            # The policy on one option grid (whole tables) and on two (with the split choice).
            self._multipliers = multipliers
            self._nets.append((regrid(net, 1), regrid(net, GRIDS)))
        self._net = self._nets[0][0]

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[Choice]:
        """Plans ``task``: the cheapest candidate's plan, what the time limit cut (notes) and
        which candidate won (:class:`Choice`)."""
        start = time.perf_counter()
        clock = Clock(*(start + share * self.time_limit
                        for share in (tuning.DECODE_SHARE, tuning.DECODE_STOP_SHARE, 1.0,
                                      tuning.TUNED_SHARE if self.polish
                                      else tuning.DECODE_SHARE)))
        notes: list[str] = []
        small = _small(task)
        rivals: list[Candidate] = []
        # First: the plan kept if no decode ends before its deadline.
        fallback_first = self.candidates and (small or tuning.FALLBACK_MARGIN * (
            tuning.decode_seconds(task.num_tables, task.num_devices, self._samples))
            > clock.left(clock.decodes_end))
        if fallback_first:
            add_rivals(task, cost_model, rivals, small)
        curves: dict[bytes, Curves] = {}
        candidates, dominated = self._policy_plans(task, cost_model, clock, bool(rivals), curves,
                                                   notes)
        if self.candidates and not fallback_first and not candidates:  # no decode made a plan
            add_rivals(task, cost_model, rivals, small)
        candidates += rivals
        first_s = (polish_candidates(task, cost_model, candidates, clock, curves, small)
                   if self.polish else 0.0)
        winner = cheapest(candidates)
        if self.polish:
            winner = self._search(task, cost_model, candidates, clock, curves, first_s,
                                  dominated)
        choice = Choice(winner.name, {c.name: c.cost_ms for c in candidates}, tuple(candidates))
        return Sharded(replace(winner.plan, sharder=self.name,
                               provenance=provenance(winner, candidates)), choice,
                       notes=tuple(notes))

    def solve_within(self, task: ShardingTask, cost_model: CostModel, moves: Moves
                     ) -> Sharded[Choice]:
        """Re-plans ``task`` within ``moves``: the candidates of :meth:`solve`, made in
        :data:`~autoshard.sharders.ppo.tuning.REPLAN_EXPLORE_SHARE` of the time limit without
        the budget, then brought within it beside the carried plan and searched there until
        the limit (:func:`~autoshard.sharders.ppo.portfolio.within_budget`); the cheapest wins
        (step cost plus the moves' price per step where they are priced)."""
        start = time.perf_counter()
        explore = copy.copy(self)
        explore.time_limit = tuning.REPLAN_EXPLORE_SHARE * self.time_limit
        found = explore.solve(task, cost_model)
        end = start + self.time_limit
        candidates = within_budget(task, cost_model, list(found.details.candidates), moves,
                                   Clock(end, end, end, end), self.seed)
        winner = cheapest(candidates)
        choice = Choice(winner.name, {c.name: c.cost_ms for c in candidates}, tuple(candidates))
        return Sharded(replace(winner.plan, sharder=self.name,
                               provenance=provenance(winner, candidates)), choice,
                       notes=found.notes)

    def _search(self, task: ShardingTask, cost_model: CostModel, candidates: list[Candidate],
                clock: Clock, curves: dict[bytes, Curves], first_s: float, dominated: bool
                ) -> Candidate:
        """The search stage after the polish: where tables dominate, the re-split and kicks
        from the :func:`~autoshard.sharders.ppo.portfolio.refined_starts` (the winner alone
        on large tasks, none on huge ones), then the group re-solve on small tasks or the
        settle on large ones; each result joins ``candidates``. Returns the winner."""
        small = _small(task)
        winner = cheapest(candidates)
        huge = task.num_tables * task.num_devices > tuning.HUGE_TASK
        if not huge and (dominated or (not small and self.split)):
            bound = task_bound_ms(task, cost_model)  # the steps' time goes where the gap is
            for begun in refined_starts(candidates) if small else [winner]:
                if begun is not winner and not clock.left():
                    break
                refined = refine(begun.plan, task, cost_model, begun.cost_ms, seed=self.seed,
                                 seconds=clock.left(), bound_ms=bound)
                for tag, cost in refined.steps:
                    begun = begun.then(tag, refined.plan, cost)
                    candidates.append(begun)
            winner = cheapest(candidates)
        if small:
            return resolve(task, cost_model, winner, candidates, clock, self.seed)
        return settle(task, cost_model, winner, candidates, clock, curves, first_s,
                      self.time_limit)

    @property
    def _samples(self) -> int:
        """The sampled rollouts each decode plays (``samples``, or :data:`SAMPLES`)."""
        return tuning.SAMPLES if self.samples is None else self.samples

    def _policy_plans(self, task: ShardingTask, cost_model: CostModel, clock: Clock,
                      fallback: bool, curves: dict[bytes, Curves], notes: list[str]
                      ) -> tuple[list[Candidate], bool]:
        """The policies' decodes (:meth:`_policies`) as candidates; and whether some table
        dominates (the split decodes ran). Each decode's HBM rows are water-filled over the
        items it placed on each device (:func:`~autoshard.sharders.ppo.portfolio.filled`; the
        curves priced go into ``curves``). Once some plan exists (``fallback``: a rival's;
        else the first decode's, which runs to its end) a decode runs only if ``clock`` says it
        can end before the decodes' deadline (:data:`~autoshard.sharders.ppo.tuning.
        DECODE_SECONDS_PER_PAIR`); one that does not is dropped, and a line in ``notes`` says
        so."""
        import torch

        samples = self._samples
        out: list[Candidate] = []
        if fallback and not self._in_time(clock, WHOLE, task.num_tables, task.num_devices,
                                          samples, notes):
            return out, False  # no decode would end in time: no split priced either
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            geometries = (split_geometries(task, cost_model, variants=_small(task))
                          if self.split else {})
            # On large tasks where tables dominate, whole-table plans are far behind split ones
            # (31.4 against 11.0 ms on constrained-856x128): no whole-table decode there.
            whole = _small(task) or not geometries
            def timed() -> Clock | None:
                return clock if fallback or out else None

            decoded = (self._decode(task, cost_model, samples, WHOLE, timed(), clock, notes)
                       if whole else [])
            for d in decoded:
                ep = d.episode
                out.append(Candidate.decoded(WHOLE, d.mode, d.tuned, d.rollout,
                                             ep.plan(self.name), step_cost_ms(
                                                 task, cost_model, ep.state.device,
                                                 ep.state.hbm_rows)))
            if SPLIT in geometries:
                self._choose_splits(task, cost_model, geometries[SPLIT], samples, out,
                                    timed(), clock, notes)
            for layout_name, geometry in geometries.items():
                if not _small(task) and any(c.layout == CHOICE for c in out):
                    break  # large tasks: the policy's own split choice stands for this decode
                self._decode_shards(task, cost_model, layout_name, geometry, samples, out,
                                    timed(), clock, notes)
        finally:
            torch.set_num_threads(before)
        out = [c.refilled(*filled(c.plan, task, cost_model, c.cost_ms, curves)) for c in out]
        # Some table dominates where a split ran (replicas alone do not say so).
        return out, any(name != WHOLE_REPLICAS for name in geometries)

    def _decode_shards(self, task: ShardingTask, cost_model: CostModel, layout_name: str,
                       geometry: ShardGeometry, samples: int, out: list[Candidate],
                       clock: Clock | None, later: Clock, notes: list[str]) -> None:
        """Adds the decodes over ``geometry``'s shards (:meth:`_decode_or_greedy`), each
        layout's constraints enforced; none where some shard fits nowhere."""
        shards = pricing_task(task, geometry)
        try:
            decoded = self._decode_or_greedy(shards, cost_model, samples, layout_name, clock,
                                             later, notes)
        except PlannerError:  # some shard fits nowhere once others are placed
            return
        for d in decoded:
            ep = d.episode
            layout = enforce(task, ShardLayout(geometry, ep.state.device,
                                               ep.state.hbm_rows).even_shares(task), cost_model)
            out.append(Candidate.decoded(layout_name, d.mode, d.tuned, d.rollout,
                                         layout.to_plan(task, self.name),
                                         step_cost_ms(shards, cost_model, layout.device,
                                                      layout.hbm_rows)))

    def _choose_splits(self, task: ShardingTask, cost_model: CostModel, geometry: ShardGeometry,
                       samples: int, out: list[Candidate], clock: Clock | None,
                       later: Clock, notes: list[str]) -> None:
        """Adds the decodes in which the policy chooses which tables of ``geometry``'s split to
        split (``ppo-choice-greedy``, ``ppo-choice-sample-i``; those in the other refill modes
        on ``later``'s clock)."""
        from autoshard.policy.network import decode_choice, price_choice

        priced = None  # one pricing of the task and its offer for every mode
        for (mode, suffix), (_, choice_net, tuned) in self._policies(task):
            timed = self._timed(clock, later, suffix, tuned)
            label = f"{CHOICE}{suffix}{TUNED_SUFFIX if tuned else ''}"
            if not self._in_time(timed, label, geometry.num_shards, task.num_devices, samples,
                                 notes):
                return
            try:
                priced = priced or price_choice(task, cost_model, self._multipliers, geometry)
                episodes = decode_choice(choice_net, self._multipliers, task, cost_model,
                                         geometry, samples, self.seed,
                                         None if timed is None else timed.decodes_stop, mode,
                                         priced)
            except PlannerError:  # some item fits nowhere once others are placed
                continue
            except DeadlineReached:
                notes.append(f"{label}: stopped, it would not end in time; dropped")
                return
            for rollout, ep in zip(_rollouts(samples), episodes, strict=True):
                layout = ep.shard_layout().even_shares(task)
                out.append(Candidate.decoded(
                    CHOICE, suffix, tuned, rollout, layout.to_plan(task, self.name),
                    step_cost_ms(pricing_task(task, layout.geometry), cost_model,
                                 layout.device, layout.hbm_rows)))

    def _decode_or_greedy(self, task: ShardingTask, cost_model: CostModel, samples: int,
                          layout: str, clock: Clock | None, later: Clock, notes: list[str]
                          ) -> list[Decoded]:
        """:meth:`_decode`, or its greedy decode alone where a sampled rollout places some
        item nowhere (the samples run in lockstep: one failure ends them all)."""
        try:
            return self._decode(task, cost_model, samples, layout, clock, later, notes)
        except PlannerError:
            if samples == 0:
                raise
            return self._decode(task, cost_model, 0, layout, clock, later, notes)

    def _decode(self, task: ShardingTask, cost_model: CostModel, samples: int, layout: str,
                clock: Clock | None, later: Clock, notes: list[str]) -> list[Decoded]:
        """The policy's greedy and ``samples`` sampled episodes on ``task`` (over ``layout``'s
        items); none when ``clock`` says they would not end in time, or they do not (said in
        ``notes``). On small tasks the same in the other refill modes, on ``later``'s clock,
        over one pricing of the task."""
        from autoshard.policy.network import decode, price_task

        out: list[Decoded] = []
        priced = None
        for (mode, suffix), (net, _, tuned) in self._policies(task):
            timed = self._timed(clock, later, suffix, tuned)
            label = f"{layout}{suffix}{TUNED_SUFFIX if tuned else ''}"
            if not self._in_time(timed, label, task.num_tables, task.num_devices, samples,
                                 notes):
                break
            priced = priced or price_task(task, cost_model, self._multipliers)
            try:
                episodes = decode(net, self._multipliers, task, cost_model, samples,
                                  self.seed, None if timed is None else timed.decodes_stop, mode,
                                  priced)
            except DeadlineReached:
                notes.append(f"{label}: stopped, it would not end in time; dropped")
                break
            except PlannerError:  # the first policy's own mode raises; another is left out
                if not suffix and not tuned:
                    raise
                continue
            out += [Decoded(suffix, tuned, rollout, ep)
                    for rollout, ep in zip(_rollouts(samples), episodes, strict=True)]
        return out

    def _policies(self, task: ShardingTask
                  ) -> list[tuple[tuple[str, str], tuple[Any, Any, bool]]]:
        """The decodes to play, in order: each refill mode (its name suffix) by each policy
        (whole-table network, split-choice network, whether it is the tuned one); the tuned
        policy (:data:`TUNED_POLICY`) on tasks of up to :data:`~autoshard.sharders.ppo.tuning.
        SMALL_TASK` pairs that keep HBM room per table (TorchRec's buffers), right after the
        first in each mode, so that both get the modes that fit. On the validation tasks it
        was better than the first with the room and no better without
        (``results/ppo-tuned-train``)."""
        nets = [(*self._nets[0], False)]
        if _small(task) and task.reservation.keeps_room:
            nets += [(*pair, True) for pair in self._nets[1:]]
        return [(m, n) for m in decode_modes(self._net.refill, self.refills and _small(task))
                for n in nets]

    @staticmethod
    def _timed(clock: Clock | None, later: Clock, suffix: str, tuned: bool) -> Clock | None:
        """The clock of a decode: ``clock`` for the first policy's own mode, ``later`` for its
        other modes, and ``later`` ending by :data:`~autoshard.sharders.ppo.tuning.TUNED_SHARE`
        for the tuned policy's."""
        if tuned:
            return replace(later, decodes_end=min(later.decodes_end, later.tuned_end))
        return later if suffix else clock

    def _in_time(self, clock: Clock | None, name: str, items: int, devices: int,
                 samples: int, notes: list[str]) -> bool:
        """Whether a decode of ``items`` on ``devices`` may start (always without ``clock``);
        a skipped one is noted in ``notes``."""
        if clock is None:
            return True
        need = tuning.decode_seconds(items, devices, samples)
        if need <= clock.left(clock.decodes_end):
            return True
        notes.append(f"{name}: not decoded, its estimated {need:.1f} s exceeds the "
                     f"{clock.left(clock.decodes_end):.1f} s left to the decodes")
        return False


class PPOPolicySharder(PPOSharder):
    """The learned policy alone: its greedy decodes (whole tables, shards of the dominant
    tables, and the decode in which it chooses the splits), each keeping the devices the policy
    chose with its HBM water-filled per device (no item moves), without rival sharders or the
    search stage; the cheapest decode wins. ``ppo`` adds those to it; comparing the two shows
    what the policy contributes.

    Args:
        policy, threads, samples, seed, split, time_limit: As for :class:`PPOSharder`.
    """

    name: ClassVar[str] = "ppo-policy"
    summary: ClassVar[str] = "learned placement policy alone: its decodes, no rivals, no search"

    def __init__(self, policy: str | Path | None = None, threads: int = 1,
                 samples: int | None = None, seed: int = 0, split: bool = True,
                 time_limit: float = 60.0, refills: bool = True) -> None:
        super().__init__(policy, threads, samples, candidates=False, seed=seed, split=split,
                         polish=False, time_limit=time_limit, refills=refills)
