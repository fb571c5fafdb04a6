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

import pickle
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from autoshard.errors import DeadlineReached, InputError
from autoshard.fileio import (
    atomic_write_text,
    check_finite,
    json_text,
    read_structured,
    write_output,
)
from autoshard.layout.shards import ShardGeometry
from autoshard.limits import POLICY_HIDDEN, Range, int_in
from autoshard.policy.choice import GRIDS, ChoiceEpisode, SplitOffer, choice_layout
from autoshard.policy.episode import LIMIT, PlacementEpisode, PricedTask
from autoshard.policy.features import DEVICE, OPTION, SUMMARY, TABLE, ObsLayout
from autoshard.policy.refill import MODES, checked_mode
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask

FORMAT = "autoshard-placement-policy"
#: 2: ``grids`` (option grids per device: 1, or 2 with the split choice). Version 1 policies
#: (one grid) are read as they are, and :func:`regrid` maps them onto two grids. 3: ``refill``
#: (the refill mode the policy was trained in, :mod:`autoshard.policy.refill`; absent:
#: ``none``).
FORMAT_VERSION = 3
WEIGHTS, CONFIG = "weights.pt", "config.json"
#: Logit of an option on a padded device slot.
PADDED = -1e8
#: HBM-split buckets per grid a policy file may declare (the committed policy has 9).
MAX_BUCKETS = 64


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
        refill: The refill mode of the episodes the policy was trained on
            (:data:`autoshard.policy.refill.MODES`); its decodes play that mode by default.
    """

    def __init__(self, buckets: int, hidden: int = 64, grids: int = 1,
                 refill: str = "none") -> None:
        super().__init__()
        self.buckets, self.hidden, self.grids = buckets, hidden, grids
        self.refill = checked_mode(refill)
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
        return {"buckets": self.buckets, "hidden": self.hidden, "grids": self.grids,
                "refill": self.refill}


def regrid(net: PlacementNet, grids: int) -> PlacementNet:
    """``net`` on ``grids`` option grids (``net`` itself when it has as many). A one-grid
    policy is widened: every grid's bucket embeddings start as grid 0's, so an option of
    another grid scores as the same option of grid 0 would with the same features, and grid
    0's scores are unchanged. A wider policy is narrowed to its first ``grids`` grids."""
    if net.grids == grids:
        return net
    if net.grids != 1 and grids != 1:
        raise ValueError(f"cannot map a policy of {net.grids} grids onto {grids}")
    out = PlacementNet(net.buckets, net.hidden, grids, net.refill)
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
    state = net.state_dict()
    write_output(folder / WEIGHTS, lambda fh: torch.save(state, fh))
    atomic_write_text(folder / CONFIG, json_text(doc, source=str(folder / CONFIG)))


def load_policy(folder: str | Path) -> tuple[PlacementNet, tuple[float, ...], dict[str, Any]]:
    """(network in eval mode, bucket multipliers, config) from a folder of :func:`save_policy`.

    Nothing is unpickled and nothing is built from unchecked numbers: the config's fields are
    checked against their ranges before the network is made, and the weights are read with
    ``torch.load(weights_only=True)`` (:func:`read_tensors`) and must match that network's
    state dict key for key, shape for shape, every value finite (:func:`check_state_dict`).

    Raises:
        InputError: A missing or unreadable file, another format, features that differ from
            this version's observation, a config field out of its range, or weights that are
            not this network's finite tensors; naming the file and the field.
    """
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG, folder / WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            raise InputError("policy file missing", source=str(path))
    doc = _read_config(config_path)
    buckets, hidden, grids, multipliers = _policy_shape(doc, str(config_path))
    refill = doc.get("refill", "none")
    if refill not in MODES:
        raise InputError(f"expected one of {', '.join(MODES)}", source=str(config_path),
                         field="refill", value=refill)
    net = PlacementNet(buckets, hidden, grids, refill)
    expected = net.state_dict()
    state = read_tensors(weights_path, allowed_bytes(expected))
    check_state_dict(state, expected, str(weights_path))
    net.load_state_dict(state)
    net.eval()
    return net, multipliers, doc


def _read_config(path: Path) -> dict[str, Any]:
    """A policy's ``config.json``: strict JSON of this format, version and features."""
    doc = read_structured(path)
    source = str(path)
    check_finite(doc, source)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"expected format '{FORMAT}'", source=source, field="format",
                         value=doc.get("format") if isinstance(doc, dict) else None)
    if not int_in(doc.get("version"), 1, FORMAT_VERSION):
        raise InputError(f"expected version 1..{FORMAT_VERSION}", source=source,
                         field="version", value=doc.get("version"))
    if doc.get("features") != ObsLayout(1, 1).features():
        raise InputError("the policy was trained on other observation features; retrain it",
                         source=source, field="features")
    return doc


def _policy_shape(doc: dict[str, Any], source: str
                  ) -> tuple[int, int, int, tuple[float, ...]]:
    """(buckets, hidden, grids, multipliers) of a policy config, each within its range."""
    checks = (("buckets", Range(2, MAX_BUCKETS, integer=True)), ("hidden", POLICY_HIDDEN),
              ("grids", Range(1, GRIDS, integer=True)))
    for name, allowed in checks:
        allowed.check(doc.get(name, 1 if name == "grids" else None), name, source)
    raw = doc.get("multipliers")
    multipliers = _multipliers(raw)
    if multipliers is None or len(multipliers) + 1 != doc["buckets"]:
        raise InputError(f"expected {doc['buckets'] - 1} multipliers (one per value bucket; the "
                         "last bucket fills the free HBM), each a number >= 0 or 'inf'",
                         source=source, field="multipliers", value=raw)
    return doc["buckets"], doc["hidden"], doc.get("grids", 1), multipliers


def _multipliers(raw: Any) -> tuple[float, ...] | None:
    """The bucket multipliers of a config (numbers or their text), or None if any is not a
    number >= 0 (``inf`` allowed: no row in HBM)."""
    if not isinstance(raw, list):
        return None
    out = []
    for m in raw:
        if isinstance(m, bool) or not isinstance(m, (str, int, float)):
            return None
        try:
            value = float(m)
        except ValueError:
            return None
        if not value >= 0:  # also refuses NaN
            return None
        out.append(value)
    return tuple(out)


def allowed_bytes(expected: Mapping[str, torch.Tensor]) -> int:
    """The largest file that may hold ``expected``'s tensors: twice their bytes and 1 MiB for
    the archive's own records; anything larger is refused before it is read."""
    return 2 * sum(t.numel() * t.element_size() for t in expected.values()) + (1 << 20)


def read_tensors(path: Path, max_bytes: int) -> Any:
    """What a tensor file holds, read with ``torch.load(weights_only=True)``: tensors and
    plain containers only, never an arbitrary object (nothing is unpickled).

    Raises:
        InputError: The file is over ``max_bytes``, holds anything else (a pickled object),
            or is not a readable tensor file (truncated, corrupt); naming the file.
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{size:,} bytes, more than the {max_bytes:,} its network's tensors "
                         "can take; not this network's weights", source=str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # something other than tensors and containers
        detail = _first_sentence(str(exc).split("WeightsUnpickler error:")[-1])
        raise InputError(f"refused: holds something other than tensors, and nothing is "
                         f"unpickled ({detail})", source=str(path)) from exc
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError) as exc:
        detail = _first_sentence(str(exc)) or type(exc).__name__
        raise InputError(f"not a readable tensor file: truncated or corrupt ({detail})",
                         source=str(path)) from exc


def _first_sentence(text: str) -> str:
    """The first sentence of an error message (torch's run to several paragraphs)."""
    return text.strip().split("\n")[0].split(". ")[0][:160]


def check_state_dict(state: Any, expected: Mapping[str, torch.Tensor], source: str,
                     prefix: str = "") -> None:
    """Fails unless ``state`` holds exactly ``expected``'s keys, each a finite floating-point
    tensor of the same shape (the field named is ``prefix`` + the key).

    Raises:
        InputError: A missing or unexpected key, a value that is not such a tensor, another
            shape, or a NaN or an infinity.
    """
    if not isinstance(state, Mapping):
        raise InputError("expected a state dict of tensors", source=source, field=prefix or None)
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        key = (missing or extra)[0]
        raise InputError("missing from the weights" if missing else "not a weight of this "
                         "network", source=source, field=f"{prefix}{key}")
    for key, want in expected.items():
        value = state[key]
        field = f"{prefix}{key}"
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point != (
                want.dtype.is_floating_point):
            raise InputError(f"expected a {want.dtype} tensor", source=source, field=field)
        if value.shape != want.shape:
            raise InputError(f"shape {list(value.shape)}, expected {list(want.shape)} (the "
                             "config's network)", source=source, field=field)
        if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
            raise InputError("holds NaN or infinite values", source=source, field=field)


def decode(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
           cost_model: CostModel, samples: int = 0, seed: int = 0,
           deadline: float | None = None, refill: str | None = None,
           priced: PricedTask | None = None) -> list[PlacementEpisode]:
    """The policy's greedy episode on ``task``, then ``samples`` sampled ones (see
    :func:`rollouts`), over one pricing of the task (``priced``: one made by
    :func:`price_task` and shared, e.g. by the decodes in each refill mode). Past
    ``deadline`` (a ``time.perf_counter`` instant): :class:`autoshard.errors.DeadlineReached`.
    ``refill``: the episodes' refill mode (default: the policy's)."""
    if priced is None:
        priced = price_task(task, cost_model, multipliers)
    return rollouts(regrid(net, 1), priced, samples, greedy=True, seed=seed, deadline=deadline,
                    refill=refill)


def price_task(task: ShardingTask, cost_model: CostModel, multipliers: tuple[float, ...]
               ) -> PricedTask:
    """``task`` priced for :func:`decode` over the buckets of ``multipliers``."""
    layout = ObsLayout(task.num_devices, len(multipliers) + 1)
    return PricedTask.prepare(task, cost_model, layout, multipliers)


def price_choice(task: ShardingTask, cost_model: CostModel, multipliers: tuple[float, ...],
                 geometry: ShardGeometry) -> tuple[PricedTask, SplitOffer | None]:
    """``task`` priced for :func:`decode_choice`, with the offer of ``geometry``'s splits."""
    priced = price_task(task, cost_model, multipliers)
    base = ObsLayout(task.num_devices, len(multipliers) + 1)
    return priced, SplitOffer.prepare(priced, geometry, base)


def decode_choice(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
                  cost_model: CostModel, geometry: ShardGeometry, samples: int = 0,
                  seed: int = 0, deadline: float | None = None,
                  refill: str | None = None,
                  priced: tuple[PricedTask, SplitOffer | None] | None = None
                  ) -> list[ChoiceEpisode]:
    """Like :func:`decode`, with the split choice: the policy may split each table that
    ``geometry`` splits, as it splits it (:mod:`autoshard.policy.choice`), over one pricing
    of the task and its offer (``priced``: one made by :func:`price_choice` and shared). A
    policy of one grid is widened (:func:`regrid`)."""
    layout = choice_layout(task.num_devices, len(multipliers) + 1)
    task_priced, offer = (price_choice(task, cost_model, multipliers, geometry)
                          if priced is None else priced)
    wide = regrid(net, GRIDS)
    count = 1 + samples
    mode = wide.refill if refill is None else refill
    episodes = [ChoiceEpisode(task_priced, layout, offer, mode) for _ in range(count)]
    _play(wide, episodes, layout, samples, True, seed, deadline)
    return episodes


def rollouts(net: PlacementNet, priced: PricedTask, samples: int = 0, greedy: bool = True,
             seed: int = 0, deadline: float | None = None, refill: str | None = None
             ) -> list[PlacementEpisode]:
    """Plays the policy over ``priced``: one greedy episode (the most likely allowed action at
    every step) if ``greedy``, and ``samples`` episodes that sample each action from the
    policy's masked distribution (seeded by ``seed``), in refill mode ``refill`` (default: the
    policy's). The episodes run in lockstep, so each step is one batched call of the network
    for all of them.

    Returns:
        The finished episodes, the greedy one first.

    Raises:
        DeadlineReached: ``deadline`` (a ``time.perf_counter`` instant) passed first.
    """
    layout = ObsLayout(priced.task.num_devices, len(priced.multipliers) + 1)
    count = int(greedy) + samples
    if count < 1:
        raise ValueError("need the greedy episode or at least one sample")
    mode = net.refill if refill is None else refill
    episodes = [PlacementEpisode(priced, layout, mode) for _ in range(count)]
    _play(net, episodes, layout, samples, greedy, seed, deadline)
    return episodes


#: Share of a decode's tables after which its time so far projects its end (see :func:`_play`).
PROJECT_AFTER = 0.1


def _play(net: PlacementNet, episodes: list[Any], layout: ObsLayout, samples: int,
          greedy: bool, seed: int, deadline: float | None = None) -> None:
    """Steps ``episodes`` in lockstep until all are done (the greedy one first when
    ``greedy``, the others sampled), one network call per step for those still running;
    :class:`autoshard.errors.DeadlineReached` once ``deadline`` passes, or as soon as the
    steps so far say the episodes' tables (at least one step each) would not all be placed
    by then (after :data:`PROJECT_AFTER` of them: a machine slower than a decode's estimate
    assumed leaves the time to the search stage, not to a decode that would be dropped)."""
    count, steps, began = len(episodes), episodes[0].task.num_tables, time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    obs = np.empty((count, layout.size), dtype=np.float32)
    masks = np.empty((count, layout.max_devices * layout.buckets), dtype=bool)
    with torch.inference_mode():
        while not all(ep.done for ep in episodes):
            now, done = time.perf_counter(), episodes[0].step_index
            if deadline is not None and (now >= deadline or (
                    done >= PROJECT_AFTER * steps and began + (now - began) * steps / done
                    > deadline)):
                raise DeadlineReached("policy decode")
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
