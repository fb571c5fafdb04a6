"""The learned sharder: a trained placement policy, decoded greedily and by sampling, with the
greedy sharders' plans as candidates; the plan with the lowest step cost wins.

Splits: the tables that dominate are split as ``split_lookup_greedy`` and ``recshard`` split them
(:func:`autoshard.layout.splitting.split_heavy_tables`), and the policy also places the resulting
shards as items (each shard priced like a table through the cost model); its split decodes compete
with its whole-table ones. In one more decode the policy chooses the splits itself
(:mod:`autoshard.policy.choice`): at each dominant table it either places the table whole
or splits it as the heuristic would and places its shards (``ppo-choice-greedy``). On tasks
over :data:`SMALL_TASK` (table, device) pairs only the main split choice is offered (node-local
on hardware of several nodes, as ``recshard`` splits), through the policy's choice decode (its
plain decode only where that made no plan), with no whole-table decode where tables dominate
and :data:`FALLBACK` the only rival, where it is made (see the time limit below).

Time limit: ``time_limit`` seconds (the CLI's ``--time-limit``) for the whole run. The fallback
is made first (on tasks over :data:`SMALL_TASK` pairs only where the first decode might not end
in time: :data:`FALLBACK_MARGIN`; elsewhere only if no decode made a plan); a decode starts
only when its estimated time fits before :data:`DECODE_SHARE` of the limit, and stops at
:data:`DECODE_STOP_SHARE` (a first decode without a fallback, as in ``ppo-policy``, runs to
its end); the polish and the search stage's steps get time guards within what is left, and
the group re-solve that ends the stage on tasks of up to :data:`SMALL_TASK` pairs runs until
the limit at most.
:attr:`PPOSharder.last_notes` says what the limit cut.

The policy is read safely: a JSON config and a plain state dict of tensors
(``torch.load(weights_only=True)``), never a pickle. By default it is the policy committed
as package data under ``autoshard/data/ppo_policy``, with its fine-tuned second
(:data:`TUNED_POLICY`) decoded beside it on tasks of up to :data:`SMALL_TASK` pairs that keep
HBM room per table;
``policy=`` names another folder (e.g. the ``policy`` folder of an ``autoshard train`` run),
decoded alone.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import autoshard
from autoshard.errors import DeadlineReached, InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardGeometry, ShardLayout, pricing_task
from autoshard.limits import SEED, THREADS, TIME_LIMIT_S, Range
from autoshard.policy.geometries import split_geometries
from autoshard.policy.refill import decode_modes
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import step_cost_ms, task_bound_ms
from autoshard.search.enforce import enforce
from autoshard.search.stage import refine
from autoshard.sharders.ppo_names import TUNED_SUFFIX, provenance
from autoshard.sharders.ppo_stage import (
    Clock,
    add_greedy,
    filled,
    polish_candidates,
    refined_starts,
    resolve,
    settle,
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
#: Sampled rollouts by default: none. With the improvement stage polishing the cheapest
#: candidate, one rollout lowers the held-out families' mean cost by under 1% for about a third
#: more planning time (``benchmarks/bench_ppo.py --samples 1``, ``results/ppo/README.md``).
SAMPLES = 0
#: Tasks of up to this many (table, device) pairs get every split decode and candidate; larger
#: ones the main split choice only (the policy's own choice over it; ``ppo-split`` where that
#: fails), and ``lookup_greedy`` alone of the greedy family (its plan is the fallback, made
#: only where a decode might not end in time: :data:`FALLBACK_MARGIN`).
SMALL_TASK = 20_000
#: Over this many pairs (856 x 128 has 109,568) the search stage runs no re-split and no
#: kicks, only the polish and its settle: on the eight 856 x 128 tasks of
#: ``benchmarks/bench_large.py`` the re-split's quick mode took about 0.3 s of ppo's 2.0-2.5 s,
#: and without it the settle's plans were as cheap or cheaper on all eight at 60 s and on
#: seven at 10 s (the eighth 0.2% dearer); at 2,000 x 256 as cheap at 10 s, 0.05% dearer at
#: 60 s (a development comparison, one run each, 2-core Intel Xeon VM; not a committed
#: benchmark).
HUGE_TASK = 100_000
#: Shares of the time limit: a decode starts only if its estimate ends before the first, and
#: stops at the second (one begun in time may overrun it: at 2,000 x 256 and 10 s it ends near 6 s).
DECODE_SHARE, DECODE_STOP_SHARE = 0.6, 0.8
#: With the search stage (``polish``), the tuned policy's decodes start only if their estimate
#: ends before this share of the limit, so that they do not take the search's time where the
#: first policy's decodes already filled most of theirs.
TUNED_SHARE = 0.3
#: A decode is started only if this estimate of its seconds per (item, device) pair (the
#: pricing of its options and one network call per item; about 5e-6 to 8.5e-6 on this
#: project's 2-core machine in one run, more on a slower day) times its pairs fits before the
#: decodes' deadline. A running decode stops once its pace projects its end past the decodes'
#: stop, and its plan is dropped.
DECODE_SECONDS_PER_PAIR = 1e-5
#: On tasks over :data:`SMALL_TASK` pairs, where :data:`FALLBACK` is the only rival, its plan is
#: made before the decodes only when this many times the first decode's estimate does not fit
#: before the decodes' deadline; else only if no decode made a plan (at 856 x 128 it took
#: 0.11-0.17 s of ppo's 1.9-2.3 s and never won, in a development timing on a 2-core Intel
#: Xeon VM).
FALLBACK_MARGIN = 2.0


def decode_seconds(items: int, devices: int, samples: int) -> float:
    """A decode's estimated seconds: :data:`DECODE_SECONDS_PER_PAIR` per (item, device) pair,
    a quarter more per sampled rollout (they run in lockstep with the greedy one)."""
    return DECODE_SECONDS_PER_PAIR * items * devices * (1 + 0.25 * samples)


def _small(task: ShardingTask) -> bool:
    """Whether ``task`` has at most :data:`SMALL_TASK` (table, device) pairs."""
    return task.num_tables * task.num_devices <= SMALL_TASK


def policy_folders(policy: str | Path | None) -> list[Path]:
    """The policy folders a sharder given ``policy`` loads: that one alone, or, for None, the
    committed policy and the tuned one (:data:`TUNED_POLICY`)."""
    return [Path(policy)] if policy is not None else [DEFAULT_POLICY, TUNED_POLICY]


def policy_missing(folder: Path) -> str | None:
    """Why no policy can be loaded from ``folder`` (None if the files are there)."""
    if importlib.util.find_spec("torch") is None:
        return "the 'torch' package is not installed"
    for name in ("config.json", "weights.pt"):
        if not (folder / name).is_file():
            return (f"no trained policy: {folder / name} is missing (train one with "
                    f"`autoshard train --export results/ppo`, or pass policy=<folder>)")
    return None


@dataclass(frozen=True)
class Choice:
    """Which candidate won the last plan, and every candidate's step cost (ms)."""

    winner: str
    costs: dict[str, float]


class PPOSharder:
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
    (:data:`REFINED`; the winner alone over :data:`SMALL_TASK` pairs) then have their
    heaviest tables' splits re-chosen (:mod:`autoshard.search.resplit`) and kicks around
    them (:mod:`autoshard.search.kick`), winning as ``<name>+resplit`` / ``+kick`` where that
    lowers their cost; on tasks over :data:`HUGE_TASK` pairs neither runs, and the winner's
    polish runs on instead (``+settle``). On tasks of up to :data:`SMALL_TASK` pairs the
    winner then goes through ``recshard``'s large-neighbourhood search, the MILP re-solved on
    the most loaded device and a lighter one at a time while it improves, in the time left
    (:func:`autoshard.sharders.ppo_stage.resolve`, ``+lns``; with at least
    :data:`~autoshard.sharders.ppo_stage.MIN_RESOLVE_S` left). The cheapest step cost wins
    (ties: the earlier candidate).
    :attr:`last_choice` says which won. ``samples=0, candidates=False, polish=False`` is the
    policy alone: its greedy decodes (whole tables, shards where tables were split, and the
    decode in which it chooses the splits), each with its HBM water-filled.

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
        self.last_choice: Choice | None = None
        self.last_notes: list[str] = []
        self._net: Any = None  # the first policy (its refill mode names the decodes' modes)
        self._nets: list[tuple[Any, Any]] = []  # each policy on one grid and on two
        self._multipliers: tuple[float, ...] = ()
        self._load()  # load (and import torch) now, so that shard() is planning only

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

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        start = time.perf_counter()
        clock = Clock(*(start + share * self.time_limit
                        for share in (DECODE_SHARE, DECODE_STOP_SHARE, 1.0,
                                      TUNED_SHARE if self.polish else DECODE_SHARE)))
        self.last_notes = []
        rival_costs: dict[str, float] = {}
        rival_plans: dict[str, Plan] = {}
        # First: the plan kept if no decode ends before its deadline.
        fallback_first = self.candidates and (_small(task) or FALLBACK_MARGIN * decode_seconds(
            task.num_tables, task.num_devices, self._samples) > clock.left(clock.decodes_end))
        if fallback_first:
            add_greedy(task, cost_model, rival_costs, rival_plans, _small(task))
        curves: dict[bytes, Curves] = {}
        costs, plans, dominated = self._policy_plans(task, cost_model, clock, bool(rival_costs),
                                                     curves)
        if self.candidates and not fallback_first and not costs:  # no decode made a plan
            add_greedy(task, cost_model, rival_costs, rival_plans, _small(task))
        costs.update(rival_costs)
        plans.update(rival_plans)
        first_s = (polish_candidates(task, cost_model, costs, plans, clock, curves, _small(task))
                   if self.polish else 0)
        winner = min(costs, key=costs.__getitem__)
        huge = task.num_tables * task.num_devices > HUGE_TASK
        if self.polish and not huge and (dominated or (not _small(task) and self.split)):
            bound = task_bound_ms(task, cost_model)  # the steps' time goes where the gap is
            for name in refined_starts(costs) if _small(task) else [winner]:
                if name != winner and not clock.left():
                    break
                refined = refine(plans[name], task, cost_model, costs[name], seed=self.seed,
                                 seconds=clock.left(), bound_ms=bound)
                for tag, cost in refined.steps:
                    name = f"{name}+{tag}"
                    costs[name], plans[name] = cost, refined.plan
            winner = min(costs, key=costs.__getitem__)
        if self.polish and _small(task):
            winner = resolve(task, cost_model, winner, costs, plans, clock, self.seed)
        elif self.polish:
            winner = settle(task, cost_model, winner, costs, plans, clock, curves, first_s,
                            self.time_limit)
        self.last_choice = Choice(winner, costs)
        return replace(plans[winner], sharder=self.name,
                       provenance=provenance(winner, costs))

    @property
    def _samples(self) -> int:
        """The sampled rollouts each decode plays (``samples``, or :data:`SAMPLES`)."""
        return SAMPLES if self.samples is None else self.samples

    def _policy_plans(self, task: ShardingTask, cost_model: CostModel, clock: Clock,
                      fallback: bool, curves: dict[bytes, Curves]
                      ) -> tuple[dict[str, float], dict[str, Plan], bool]:
        """The policies' decodes (:meth:`_policies`), named, with their step costs; and whether
        some table dominates (the split decodes ran). Each decode's HBM rows are water-filled
        over the items it placed on each device (:func:`~autoshard.sharders.ppo_stage.filled`;
        the curves priced go into ``curves``). Once some plan exists (``fallback``: a rival's;
        else the first decode's, which runs to its end) a decode runs only if ``clock`` says it
        can end before the decodes' deadline (:data:`DECODE_SECONDS_PER_PAIR`); one that does
        not is dropped, and :attr:`last_notes` says so."""
        import torch

        samples = self._samples
        costs: dict[str, float] = {}
        plans: dict[str, Plan] = {}
        if fallback and not self._in_time(clock, "ppo", task.num_tables, task.num_devices,
                                          samples):
            return costs, plans, False  # no decode would end in time: no split priced either
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            geometries = (split_geometries(task, cost_model, variants=_small(task))
                          if self.split else {})
            # On large tasks where tables dominate, whole-table plans are far behind split ones
            # (31.4 against 11.0 ms on constrained-856x128): no whole-table decode there.
            whole = _small(task) or not geometries
            def timed() -> Clock | None:
                return clock if fallback or costs else None

            decoded = (self._decode(task, cost_model, samples, "ppo", timed(), clock) if whole
                       else [])
            for name, ep in decoded:
                plans[name] = ep.plan(self.name)
                costs[name] = step_cost_ms(task, cost_model, ep.state.device, ep.state.hbm_rows)
            if "ppo-split" in geometries:
                self._choose_splits(task, cost_model, geometries["ppo-split"], samples, costs,
                                    plans, timed(), clock)
            for prefix, geometry in geometries.items():
                if not _small(task) and any(n.startswith("ppo-choice") for n in plans):
                    break  # large tasks: the policy's own split choice stands for this decode
                shards = pricing_task(task, geometry)
                try:
                    episodes = self._decode_or_greedy(shards, cost_model, samples, prefix,
                                                      timed(), clock)
                except PlannerError:  # some shard fits nowhere once others are placed
                    continue
                for name, ep in episodes:
                    layout = enforce(task, ShardLayout(geometry, ep.state.device,
                                                       ep.state.hbm_rows).even_shares(task),
                                     cost_model)
                    plans[name] = layout.to_plan(task, self.name)
                    costs[name] = step_cost_ms(shards, cost_model, layout.device,
                                               layout.hbm_rows)
        finally:
            torch.set_num_threads(before)
        for name in plans:
            plans[name], costs[name] = filled(plans[name], task, cost_model, costs[name], curves)
        # Some table dominates where a split ran (replicas alone do not say so).
        return costs, plans, any(name != "ppo-replicas" for name in geometries)

    def _choose_splits(self, task: ShardingTask, cost_model: CostModel, geometry: ShardGeometry,
                       samples: int, costs: dict[str, float], plans: dict[str, Plan],
                       clock: Clock | None, later: Clock) -> None:
        """Adds the decodes in which the policy chooses which tables of ``geometry``'s split to
        split (``ppo-choice-greedy``, ``ppo-choice-sample-i``; those in the other refill modes
        on ``later``'s clock)."""
        from autoshard.policy.network import decode_choice, price_choice

        priced = None  # one pricing of the task and its offer for every mode
        for (mode, suffix), (_, choice_net, tag) in self._policies(task):
            name, timed = f"ppo-choice{suffix}", self._timed(clock, later, suffix, tag)
            if not self._in_time(timed, name + tag, geometry.num_shards, task.num_devices,
                                 samples):
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
                self.last_notes.append(f"{name}{tag}: stopped, it would not end in time; "
                                       "dropped")
                return
            names = [f"{name}-greedy{tag}"] + [f"{name}-sample-{i}{tag}" for i in range(samples)]
            for name, ep in zip(names, episodes, strict=True):
                layout = ep.shard_layout().even_shares(task)
                plans[name] = layout.to_plan(task, self.name)
                costs[name] = step_cost_ms(pricing_task(task, layout.geometry), cost_model,
                                           layout.device, layout.hbm_rows)

    def _decode_or_greedy(self, task: ShardingTask, cost_model: CostModel, samples: int,
                          prefix: str, clock: Clock | None, later: Clock
                          ) -> list[tuple[str, Any]]:
        """:meth:`_decode`, or its greedy decode alone where a sampled rollout places some
        item nowhere (the samples run in lockstep: one failure ends them all)."""
        try:
            return self._decode(task, cost_model, samples, prefix, clock, later)
        except PlannerError:
            if samples == 0:
                raise
            return self._decode(task, cost_model, 0, prefix, clock, later)

    def _decode(self, task: ShardingTask, cost_model: CostModel, samples: int, prefix: str,
                clock: Clock | None, later: Clock) -> list[tuple[str, Any]]:
        """The policy's greedy and ``samples`` sampled episodes on ``task``, named; none when
        ``clock`` says they would not end in time, or they do not. On small tasks the same in
        the other refill modes, on ``later``'s clock, over one pricing of the task."""
        from autoshard.policy.network import decode, price_task

        out: list[tuple[str, Any]] = []
        priced = None
        for (mode, suffix), (net, _, tag) in self._policies(task):
            name, timed = f"{prefix}{suffix}", self._timed(clock, later, suffix, tag)
            if not self._in_time(timed, name + tag, task.num_tables, task.num_devices, samples):
                break
            priced = priced or price_task(task, cost_model, self._multipliers)
            try:
                episodes = decode(net, self._multipliers, task, cost_model, samples,
                                  self.seed, None if timed is None else timed.decodes_stop, mode,
                                  priced)
            except DeadlineReached:
                self.last_notes.append(f"{name}{tag}: stopped, it would not end in time; "
                                       "dropped")
                break
            except PlannerError:  # the first policy's own mode raises; another is left out
                if not suffix and not tag:
                    raise
                continue
            names = [f"{name}-greedy{tag}"] + [f"{name}-sample-{i}{tag}" for i in range(samples)]
            out += zip(names, episodes, strict=True)
        return out

    def _policies(self, task: ShardingTask) -> list[tuple[tuple[str, str], tuple[Any, Any, str]]]:
        """The decodes to play, in order: each refill mode (its name suffix) by each policy
        (whole-table network, split-choice network, name tag); the tuned policy
        (:data:`TUNED_POLICY`, tag :data:`TUNED_SUFFIX`) on tasks of up to :data:`SMALL_TASK`
        pairs that keep HBM room per table (TorchRec's buffers), right after the first in each
        mode, so that both get the modes that fit. On the validation tasks it was better than
        the first with the room and no better without (``results/ppo-tuned-train``)."""
        nets = [(*self._nets[0], "")]
        if _small(task) and task.reservation.keeps_room:
            nets += [(*pair, TUNED_SUFFIX) for pair in self._nets[1:]]
        return [(m, n) for m in decode_modes(self._net.refill, self.refills and _small(task))
                for n in nets]

    @staticmethod
    def _timed(clock: Clock | None, later: Clock, suffix: str, tag: str) -> Clock | None:
        """The clock of a decode: ``clock`` for the first policy's own mode, ``later`` for its
        other modes, and ``later`` ending by :data:`TUNED_SHARE` for the tuned policy's."""
        if tag:
            return replace(later, decodes_end=min(later.decodes_end, later.tuned_end))
        return later if suffix else clock

    def _in_time(self, clock: Clock | None, name: str, items: int, devices: int,
                 samples: int) -> bool:
        """Whether a decode of ``items`` on ``devices`` may start (always without ``clock``);
        a skipped one is noted."""
        if clock is None:
            return True
        need = decode_seconds(items, devices, samples)
        if need <= clock.left(clock.decodes_end):
            return True
        self.last_notes.append(f"{name}: not decoded, its estimated {need:.1f} s exceeds the "
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
