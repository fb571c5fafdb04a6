"""Imitation of the MILP (:mod:`autoshard.training.imitation`): expert labels are legal and
name every interchangeable device, the set loss is what it says, and training on the labels
makes the policy follow the expert."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoshard.policy.buckets import MULTIPLIERS
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.network import PlacementNet
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.training.imitation import (
    collect,
    expert_action,
    expert_demos,
    fit,
    same_actions,
    set_loss,
)
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def _task():
    return constrained_task(dlrm_tables(12, seed=5), 4, hbm_fraction=0.4)


def test_the_expert_places_every_item_and_its_labels_are_allowed() -> None:
    demos = expert_demos(_task(), MODEL, seconds=2.0)
    assert demos and all((d.device >= 0).all() for d in demos)
    layout = ObsLayout(4, len(MULTIPLIERS) + 1)
    demo = demos[0]
    ep = PlacementEpisode(PricedTask.prepare(demo.items, MODEL, layout, MULTIPLIERS), layout)
    while not ep.done:
        action, target = expert_action(ep, demo)
        assert ep.mask[action] and target[action] and not (target & ~ep.mask).any()
        ep.step(action)


def test_empty_devices_are_interchangeable_at_the_first_step() -> None:
    task = _task()
    layout = ObsLayout(6, len(MULTIPLIERS) + 1)  # two padded slots
    ep = PlacementEpisode(PricedTask.prepare(task, MODEL, layout, MULTIPLIERS), layout)
    action = int(np.flatnonzero(ep.mask)[0])
    target = same_actions(ep, action)
    k = action % ep.buckets
    assert np.flatnonzero(target).tolist() == [d * ep.buckets + k for d in range(4)]


def test_the_set_loss_is_minus_log_of_the_probability_of_the_set() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[True, True, True, False]])
    target = torch.tensor([[False, True, True, False]])
    p = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), dim=0)
    assert float(set_loss(logits, mask, target)) == pytest.approx(float(-torch.log(p[1] + p[2])),
                                                                  rel=1e-5)


@pytest.mark.slow
def test_training_on_the_labels_makes_the_policy_follow_the_expert() -> None:
    torch.manual_seed(0)
    demos = expert_demos(_task(), MODEL, seconds=2.0)
    samples = collect(demos, MODEL, MULTIPLIERS, 4)
    net = PlacementNet(len(MULTIPLIERS) + 1, hidden=64)
    obs, mask, target = samples.tensors()

    def agreement() -> float:
        with torch.no_grad():
            logits, _ = net(obs)
        picked = logits.masked_fill(~mask, -torch.inf).argmax(dim=1)
        return float(target[torch.arange(len(picked)), picked].float().mean())

    before = agreement()
    losses = fit(net, samples, epochs=200, batch=64, lr=1e-2)
    assert losses[-1] < 0.2 * losses[0]
    assert agreement() >= max(0.9, before)


def test_expert_plans_are_written_once_and_read_back(tmp_path) -> None:
    from autoshard.training.imitate_run import demos_of

    first = demos_of(1, 0, tmp_path, 1.0)
    assert (tmp_path / "1.npz").is_file()
    again = demos_of(1, 0, tmp_path, 1.0)  # read, not solved again
    assert len(again) == len(first)
    for a, b in zip(first, again, strict=True):
        assert a.items.num_tables == b.items.num_tables
        assert np.array_equal(a.device, b.device) and np.array_equal(a.rows, b.rows)
