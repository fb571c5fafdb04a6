"""The placement policy network, its safe on-disk format (weights + JSON config) and its
decoding over placement episodes (greedy and sampled rollouts, batched).

The network scores every (device, bucket) option of the next table with shared weights, so one
set of weights serves any number of devices and tables (as DreamShard's policy does):

1. each device's state (which already holds sums and maxima over the tables on it: load by
   component, table count, costliest table) is encoded by one MLP shared by all devices;
2. a context vector reads the next table, the summary of work left, and the mean and max of the
   device encodings over the task's devices (padding excluded);
3. each option is scored from its own features (price, load after, fit...), its device's
   encoding, the context and a learned bucket embedding, giving one logit per (device, bucket);
   padded devices get a large negative logit.

The value head reads the context only. Saved as ``weights.pt`` (a plain state dict, loaded with
``torch.load(weights_only=True)``) and ``config.json``; nothing is unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from autoshard.cost import CostModel
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text
from autoshard.policy.choice import GRIDS, ChoiceEpisode, SplitOffer, choice_layout
from autoshard.policy.episode import LIMIT, PlacementEpisode, PricedTask
from autoshard.policy.features import DEVICE, OPTION, SUMMARY, TABLE, ObsLayout
from autoshard.shards import ShardGeometry
from autoshard.task import ShardingTask

FORMAT = "autoshard-placement-policy"
#: 2: ``grids`` (option grids per device: 1, or 2 with the split choice). Version 1 policies
#: (one grid) are read as they are, and :func:`regrid` maps them onto two grids.
FORMAT_VERSION = 2
WEIGHTS, CONFIG = "weights.pt", "config.json"
#: Logit of an option on a padded device slot.
PADDED = -1e8


def _mlp(inputs: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU())


class PlacementNet(nn.Module):
    """Option logits and a value latent from the flat observation of
    :mod:`autoshard.policy.features`.

    Args:
        buckets: HBM-split buckets per device (per grid).
        hidden: Width of every hidden layer.
        grids: Option grids per device: 1 (place the next table), or 2 (also: split it, see
            :mod:`autoshard.policy.choice`); each (grid, bucket) has its own embedding.
    """

    def __init__(self, buckets: int, hidden: int = 64, grids: int = 1) -> None:
        super().__init__()
        self.buckets, self.hidden, self.grids = buckets, hidden, grids
        self.options = buckets * grids
        self.device_enc = _mlp(len(DEVICE), hidden)
        self.context = _mlp(len(TABLE) + len(SUMMARY) + 2 * hidden, hidden)
        # The option scorer's first layer, split by input so each part is computed once.
        self.opt_in = nn.Linear(len(OPTION), hidden)
        self.opt_device = nn.Linear(hidden, hidden, bias=False)
        self.opt_context = nn.Linear(hidden, hidden, bias=False)
        self.opt_bucket = nn.Parameter(torch.zeros(self.options, hidden))
        narrow = max(hidden // 4, 8)  # the scorer runs once per option: keep it cheap
        self.opt_out = nn.Sequential(nn.ReLU(), nn.Linear(hidden, narrow), nn.ReLU(),
                                     nn.Linear(narrow, 1))
        self.value = _mlp(hidden, hidden)
        with torch.no_grad():  # start near uniform over the allowed options
            last = self.opt_out[-1]
            assert isinstance(last, nn.Linear)
            last.weight.mul_(0.01)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, devices x buckets], value latent [B, hidden]) for observations [B, N]."""
        n_head = len(TABLE) + len(SUMMARY)
        n_dev, n_opt, k = len(DEVICE), len(OPTION), self.options
        block = 1 + n_dev + k * n_opt
        b = obs.shape[0]
        devices = obs[:, n_head:].reshape(b, -1, block)
        valid = devices[:, :, :1]
        enc = self.device_enc(devices[:, :, 1:1 + n_dev])
        count = valid.sum(dim=1).clamp(min=1.0)
        mean = (enc * valid).sum(dim=1) / count
        top = enc.masked_fill(valid == 0, -1e9).max(dim=1).values
        ctx = self.context(torch.cat([obs[:, :n_head], mean, top], dim=1))
        d = devices.shape[1]
        options = devices[:, :, 1 + n_dev:].reshape(b * d * k, n_opt)
        # The scorer's first layer as one matrix product over all options, its per-device,
        # context and bucket parts added once as the product's bias.
        shared = ((self.opt_device(enc) + self.opt_context(ctx)[:, None, :])[:, :, None, :]
                  + (self.opt_bucket + self.opt_in.bias)).reshape(-1, self.hidden)
        middle, last = self.opt_out[1], self.opt_out[3]
        assert isinstance(middle, nn.Linear) and isinstance(last, nn.Linear)
        if torch.is_grad_enabled():
            h = torch.addmm(shared, options, self.opt_in.weight.t()).relu()
            h = torch.addmm(middle.bias, h, middle.weight.t()).relu()
        else:  # planning: in place, which saves two allocations of [options, hidden]
            h = shared.addmm_(options, self.opt_in.weight.t()).relu_()
            h = torch.addmm(middle.bias, h, middle.weight.t()).relu_()
        logits = torch.addmm(last.bias, h, last.weight.t()).reshape(b, d, k)
        return logits.masked_fill(valid == 0, PADDED).reshape(b, -1), self.value(ctx)

    def config(self) -> dict[str, Any]:
        return {"buckets": self.buckets, "hidden": self.hidden, "grids": self.grids}


def regrid(net: PlacementNet, grids: int) -> PlacementNet:
    """``net`` on ``grids`` option grids (``net`` itself when it has as many). A one-grid
    policy is widened: every grid's bucket embeddings start as grid 0's, so an option of
    another grid scores as the same option of grid 0 would with the same features, and grid
    0's scores are unchanged. A wider policy is narrowed to its first ``grids`` grids."""
    if net.grids == grids:
        return net
    if net.grids != 1 and grids != 1:
        raise ValueError(f"cannot map a policy of {net.grids} grids onto {grids}")
    out = PlacementNet(net.buckets, net.hidden, grids)
    state = net.state_dict()
    bucket = state["opt_bucket"]
    state["opt_bucket"] = (bucket.repeat(grids, 1) if net.grids == 1
                           else bucket[:grids * net.buckets].clone())
    out.load_state_dict(state)
    out.train(net.training)
    return out


def save_policy(net: PlacementNet, folder: str | Path, multipliers: tuple[float, ...],
                extra: dict[str, Any] | None = None) -> None:
    """Writes ``weights.pt`` (state dict) and ``config.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": FORMAT_VERSION, **net.config(),
           "multipliers": [str(m) for m in multipliers],
           "features": ObsLayout(1, net.buckets).features(), **(extra or {})}
    tmp = folder / (WEIGHTS + ".tmp")
    torch.save(net.state_dict(), tmp)
    tmp.replace(folder / WEIGHTS)
    atomic_write_text(folder / CONFIG, json.dumps(doc, indent=2) + "\n")


def load_policy(folder: str | Path) -> tuple[PlacementNet, tuple[float, ...], dict[str, Any]]:
    """(network in eval mode, bucket multipliers, config) from a folder of :func:`save_policy`.

    Raises:
        InputError: Missing files, another format, or features that differ from this version's
            observation.
    """
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG, folder / WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            raise InputError("policy file missing", source=str(path))
    try:
        doc = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON ({exc})", source=str(config_path)) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"expected format '{FORMAT}'", source=str(config_path), field="format",
                         value=doc.get("format") if isinstance(doc, dict) else doc)
    if doc.get("version") not in range(1, FORMAT_VERSION + 1):
        raise InputError(f"expected version 1..{FORMAT_VERSION}", source=str(config_path),
                         field="version", value=doc.get("version"))
    if doc.get("features") != ObsLayout(1, 1).features():
        raise InputError("the policy was trained on other observation features; retrain it",
                         source=str(config_path), field="features")
    try:
        net = PlacementNet(int(doc["buckets"]), int(doc["hidden"]), int(doc.get("grids", 1)))
        multipliers = tuple(float(m) for m in doc["multipliers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"bad policy config ({exc})", source=str(config_path)) from exc
    if len(multipliers) + 1 != net.buckets:  # the value buckets and the fill bucket
        raise InputError(f"{len(multipliers)} multipliers for {net.buckets} buckets",
                         source=str(config_path), field="multipliers")
    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise InputError(f"weights do not match the config ({exc})",
                         source=str(weights_path)) from exc
    net.eval()
    return net, multipliers, doc


def decode(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
           cost_model: CostModel, samples: int = 0, seed: int = 0) -> list[PlacementEpisode]:
    """The policy's greedy episode on ``task``, then ``samples`` sampled ones (see
    :func:`rollouts`), over one pricing of the task."""
    layout = ObsLayout(task.num_devices, len(multipliers) + 1)
    priced = PricedTask.prepare(task, cost_model, layout, multipliers)
    return rollouts(regrid(net, 1), priced, samples, greedy=True, seed=seed)


def decode_choice(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
                  cost_model: CostModel, geometry: ShardGeometry, samples: int = 0,
                  seed: int = 0) -> list[ChoiceEpisode]:
    """Like :func:`decode`, with the split choice: the policy may split each table that
    ``geometry`` splits, as it splits it (:mod:`autoshard.policy.choice`). A policy of
    one grid is widened (:func:`regrid`)."""
    buckets = len(multipliers) + 1
    base = ObsLayout(task.num_devices, buckets)
    layout = choice_layout(task.num_devices, buckets)
    priced = PricedTask.prepare(task, cost_model, base, multipliers)
    offer = SplitOffer.prepare(priced, geometry, base)
    wide = regrid(net, GRIDS)
    count = 1 + samples
    episodes = [ChoiceEpisode(priced, layout, offer) for _ in range(count)]
    _play(wide, episodes, layout, samples, True, seed)
    return episodes


def rollouts(net: PlacementNet, priced: PricedTask, samples: int = 0, greedy: bool = True,
             seed: int = 0) -> list[PlacementEpisode]:
    """Plays the policy over ``priced``: one greedy episode (the most likely allowed action at
    every step) if ``greedy``, and ``samples`` episodes that sample each action from the
    policy's masked distribution (seeded by ``seed``). The episodes run in lockstep, so each
    step is one batched call of the network for all of them.

    Returns:
        The finished episodes, the greedy one first.
    """
    layout = ObsLayout(priced.task.num_devices, len(priced.multipliers) + 1)
    count = int(greedy) + samples
    if count < 1:
        raise ValueError("need the greedy episode or at least one sample")
    episodes = [PlacementEpisode(priced, layout) for _ in range(count)]
    _play(net, episodes, layout, samples, greedy, seed)
    return episodes


def _play(net: PlacementNet, episodes: list[Any], layout: ObsLayout, samples: int,
          greedy: bool, seed: int) -> None:
    """Steps ``episodes`` in lockstep until all are done (the greedy one first when
    ``greedy``, the others sampled), one network call per step for those still running."""
    count = len(episodes)
    generator = torch.Generator().manual_seed(seed)
    obs = np.empty((count, layout.size), dtype=np.float32)
    masks = np.empty((count, layout.max_devices * layout.buckets), dtype=bool)
    with torch.inference_mode():
        while not all(ep.done for ep in episodes):
            live = [i for i, ep in enumerate(episodes) if not ep.done]
            for i in live:
                obs[i] = episodes[i].obs
                masks[i] = episodes[i].mask
            logits, _ = net(torch.from_numpy(np.clip(obs[live], -LIMIT, LIMIT)))
            logits = logits.masked_fill(~torch.from_numpy(masks[live]), -torch.inf)
            actions = logits.argmax(dim=1)
            if samples:  # Gumbel-max: argmax of logits + Gumbel noise samples the softmax
                noise = torch.rand(samples, logits.shape[1], generator=generator)
                noise.clamp_(min=1e-12).log_().neg_().log_()
                rows = [r for r, i in enumerate(live) if i >= int(greedy)]
                picked = [i - int(greedy) for i in live if i >= int(greedy)]
                if rows:
                    actions[rows] = (logits[rows] - noise[picked]).argmax(dim=1)
            for i, a in zip(live, actions.tolist(), strict=True):
                episodes[i].step(a)
