"""Imitation of the MILP: the placement policy trained on ``recshard``'s plans (behaviour
cloning), then on the states its own decodes reach, labelled with those plans (DAgger-style
correction).

Expert plans. Each training task (drawn from the ``train`` family, with and without TorchRec's
room) is solved by ``recshard``'s placement solve (:func:`autoshard.sharders.recshard_tables.
solve_tables`) once over the tables whole and once over the split choice the policy's split
decode places (:func:`autoshard.policy.geometries.split_geometries`), so that both decodes of
the policy alone have an expert to copy. A plan gives each item (table or shard) a device and
its HBM rows.

Labels. The policy places items one by one (:class:`autoshard.policy.episode.
PlacementEpisode`); at each step the expert's action is the bucket of the expert's device whose
HBM rows are nearest the expert's (of the allowed ones). Buckets that keep those same rows, and
devices whose observation blocks are identical (the same load, memory and option features:
interchangeable at this step), are equally right, so the target is the set of those (device,
bucket) actions and the loss is ``-log`` of the probability the policy puts on the set
(:func:`set_loss`).

Rounds. Round 0 follows the expert's actions (behaviour cloning); each later round follows
the policy's own greedy actions and labels every state it reaches with the expert's action
for that item (the expert's device and rows from its whole plan; where that is not allowed
any more, the nearest allowed action), adding those samples to all earlier ones; the network
is trained on the union after each round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from autoshard.errors import PlannerError
from autoshard.layout.shards import ShardGeometry, pricing_task, split_pins, whole_tables
from autoshard.policy.episode import LIMIT, PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.geometries import split_geometries
from autoshard.policy.network import PlacementNet
from autoshard.pricing.cost import CostModel
from autoshard.sharders.recshard_tables import SolveSettings, solve_tables
from autoshard.task import ShardingTask

#: The expert's settings (``recshard``'s defaults, a shorter time limit per solve).
EXPERT = SolveSettings(time_limit=5.0, mip_rel_gap=5e-3, max_lines=None, max_pairs=2400,
                       group_devices=2, seed=0, stall=5e-3)


@dataclass(frozen=True)
class Demo:
    """One expert plan: the items (a task, or a split choice's pricing task) and, per item,
    the expert's device and HBM rows."""

    items: ShardingTask
    device: np.ndarray
    rows: np.ndarray


@dataclass
class Samples:
    """Observations, allowed actions and target action sets, one row per placement step."""

    obs: list[np.ndarray]
    mask: list[np.ndarray]
    target: list[np.ndarray]

    def add(self, obs: np.ndarray, mask: np.ndarray, target: np.ndarray) -> None:
        self.obs.append(obs)
        self.mask.append(mask)
        self.target.append(target)

    def __len__(self) -> int:
        return len(self.obs)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(np.stack(self.obs)), torch.from_numpy(np.stack(self.mask)),
                torch.from_numpy(np.stack(self.target)))


def demo_geometries(task: ShardingTask, cost_model: CostModel) -> list[ShardGeometry]:
    """What the expert solves of ``task``: its tables whole, and the split choice the policy's
    split decode places where some table dominates."""
    split = split_geometries(task, cost_model, fine=False, variants=False)
    return [whole_tables(task), *split.values()]


def expert_demos(task: ShardingTask, cost_model: CostModel, seconds: float = 5.0
                 ) -> list[Demo]:
    """``recshard``'s plans of each of :func:`demo_geometries` (each solve within
    ``seconds``)."""
    settings = replace(EXPERT, time_limit=seconds)
    out = []
    for g in demo_geometries(task, cost_model):
        items = pricing_task(task, g)
        found = solve_tables(settings, items, cost_model, time.perf_counter() + seconds,
                             split_pins(task, g))
        out.append(Demo(items, found.device, found.rows))
    return out


def expert_action(ep: PlacementEpisode, demo: Demo) -> tuple[int, np.ndarray]:
    """(the expert's action at ``ep``'s next step, the target set of equally right actions)."""
    t, buckets = ep.table, ep.buckets
    d = int(demo.device[t])
    allowed = np.flatnonzero(ep.mask[d * buckets:(d + 1) * buckets])
    if not allowed.size:  # the expert's device has no room here any more
        action = ep.nearest_legal(d * buckets)
        return action, same_actions(ep, action)
    rows = np.array([ep.rows_of(t, d, int(k)) for k in allowed])
    miss = np.abs(rows - int(demo.rows[t]))
    # Buckets that keep the same rows (a cold table's value buckets, "all rows" and "fill"
    # where everything fits) are the same choice: each is right.
    tied = allowed[miss == miss.min()]
    target = np.zeros_like(ep.mask)
    for k in tied:
        target |= same_actions(ep, d * buckets + int(k))
    return d * buckets + int(tied[0]), target


def same_actions(ep: PlacementEpisode, action: int) -> np.ndarray:
    """[slots x buckets] bool: ``action`` and the same bucket on every device whose observation
    block equals its device's (interchangeable devices at this step)."""
    layout = ep.layout
    d, k = divmod(action, ep.buckets)
    blocks = ep.obs[layout.head:].reshape(layout.max_devices, layout.device_block)
    alike = np.flatnonzero((blocks == blocks[d]).all(axis=1))
    out = np.zeros(layout.max_devices * ep.buckets, dtype=bool)
    out[alike * ep.buckets + k] = True
    return out & ep.mask


def collect(demos: list[Demo], cost_model: CostModel, multipliers: tuple[float, ...],
            max_devices: int, net: PlacementNet | None = None) -> Samples:
    """The labelled steps of one episode per demo: following the expert (``net`` None) or the
    policy's greedy actions (DAgger; an episode whose actions leave an item no room ends
    there)."""
    out = Samples([], [], [])
    layout = ObsLayout(max_devices, len(multipliers) + 1)
    for demo in demos:
        if demo.items.num_devices > max_devices:
            continue
        priced = PricedTask.prepare(demo.items, cost_model, layout, multipliers)
        ep = PlacementEpisode(priced, layout)
        while not ep.done:
            action, target = expert_action(ep, demo)
            obs = ep.bounded_obs()
            out.add(obs, ep.mask.copy(), target)
            if net is not None:
                with torch.inference_mode():
                    logits, _ = net(torch.from_numpy(obs[None, :]))
                logits = logits[0].masked_fill(~torch.from_numpy(ep.mask), -torch.inf)
                action = int(logits.argmax())
            try:
                ep.step(action)
            except PlannerError:  # the policy's own actions left the next item no room
                break
    return out


def set_loss(logits: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``-log P(target set)`` under the policy's masked softmax."""
    allowed = logits.masked_fill(~mask, -torch.inf)
    right = logits.masked_fill(~target, -torch.inf)
    return (torch.logsumexp(allowed, dim=1) - torch.logsumexp(right, dim=1)).mean()


def fit(net: PlacementNet, samples: Samples, epochs: int, batch: int = 256, lr: float = 3e-4,
        seed: int = 0) -> list[float]:
    """Trains ``net`` on ``samples`` (Adam); returns the mean loss of each epoch."""
    obs, mask, target = samples.tensors()
    obs = obs.clamp(-LIMIT, LIMIT)
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    history = []
    for _ in range(epochs):
        order = torch.randperm(obs.shape[0], generator=generator)
        total = 0.0
        for lo in range(0, obs.shape[0], batch):
            idx = order[lo:lo + batch]
            logits, _ = net(obs[idx])
            loss = set_loss(logits, mask[idx], target[idx])
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimiser.step()
            total += loss.item() * idx.numel()
        history.append(total / obs.shape[0])
    net.eval()
    return history
