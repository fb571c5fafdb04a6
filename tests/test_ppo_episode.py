"""The placement episode under the policy and the environment: its named observation layout."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.policy.buckets import N_BUCKETS
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import DEVICE, OPTION, SUMMARY, TABLE, ObsLayout
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def named(obs: np.ndarray, layout: ObsLayout, devices: int) -> dict[str, np.ndarray]:
    """Every feature of an observation by name (device and option features per device)."""
    out = {f"table.{n}": obs[i] for n, i in layout.table.items()}
    head = len(layout.table)
    out |= {f"summary.{n}": obs[head + i] for n, i in layout.summary.items()}
    blocks = obs[layout.head:].reshape(layout.max_devices, layout.device_block)[:devices]
    out |= {f"device.{n}": blocks[:, 1 + i] for n, i in layout.device.items()}
    options = blocks[:, 1 + len(layout.device):].reshape(devices, layout.buckets, -1)
    out |= {f"option.{n}": options[:, :, i] for n, i in layout.option.items()}
    return out


def test_reordering_the_names_moves_features_without_scrambling_them() -> None:
    task = constrained_task(dlrm_tables(12, seed=2), 3, hbm_fraction=0.4)
    plain = ObsLayout(4, N_BUCKETS)
    shuffled = ObsLayout(4, N_BUCKETS, TABLE[::-1], SUMMARY[3:] + SUMMARY[:3], DEVICE[::-1],
                         OPTION[1:] + OPTION[:1])
    episodes = [PlacementEpisode(PricedTask.prepare(task, MODEL, lay), lay)
                for lay in (plain, shuffled)]
    rng = np.random.default_rng(0)
    while not episodes[0].done:
        a, b = (named(ep.obs, ep.layout, 3) for ep in episodes)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert not np.array_equal(episodes[0].obs, episodes[1].obs)  # positions did move
        action = int(rng.choice(np.flatnonzero(episodes[0].mask)))
        assert episodes[1].mask[action]
        for ep in episodes:
            ep.step(action)
    assert episodes[0].plan("x") == episodes[1].plan("x")


def test_a_layout_must_name_every_feature_once() -> None:
    with pytest.raises(ValueError, match="reordering"):
        ObsLayout(2, N_BUCKETS, TABLE[:-1])
    with pytest.raises(ValueError, match="reordering"):
        ObsLayout(2, N_BUCKETS, option_names=(*OPTION[:-1], "price"))


def test_when_hbm_holds_every_useful_row_buckets_keep_the_used_rows_not_all() -> None:
    from autoshard.access import AccessCurve
    from autoshard.policy.buckets import MULTIPLIERS, bucket_rows
    from autoshard.tables import Table

    # 1% of each table's rows are ever touched; the cluster's HBM holds half of all the bytes,
    # so every touched row fits and the relaxation's value threshold is 0.
    curve = AccessCurve((0.0, 0.001, 0.01), (0.0, 0.8, 1.0))
    tables = [Table(f"t{i}", rows=1_000_000, dim=64, access_cdf=curve, rows_used=10_000)
              for i in range(4)]
    task = constrained_task(tables, 2, hbm_fraction=0.5)
    rows = bucket_rows(task, MODEL)
    kept = [b for b, m in enumerate(MULTIPLIERS) if 0 < m < float("inf")]
    assert (rows[:, kept] == 10_000).all()  # the used rows, where before it was all 1,000,000
    assert (rows[:, 0] == 0).all() and (rows[:, -1] == 1_000_000).all()
    layout = ObsLayout(2, N_BUCKETS)
    episode = PlacementEpisode(PricedTask.prepare(task, MODEL, layout), layout)
    assert episode.rows_of(episode.table, 0, N_BUCKETS - 1) == 10_000  # fill: used rows at most
    while not episode.done:  # two tables a device, each with its fill bucket
        episode.step((episode.step_index % 2) * N_BUCKETS + N_BUCKETS - 1)
    assert episode.step_cost_ms / episode.lower_bound == pytest.approx(1.0, abs=0.02)


def test_each_kind_of_device_is_priced_once_with_every_devices_price() -> None:
    # Devices of one kind price alike, so a task is priced once per kind; the prices are those
    # of every (table, device, bucket) priced on its own device, here on two kinds of devices
    # (every other one with a third of the HBM and half the host link).
    from dataclasses import replace

    task = constrained_task(dlrm_tables(12, seed=5), 4, hbm_fraction=0.3, reservation="torchrec")
    hw = task.hardware
    devices = tuple(replace(d, hbm=replace(d.hbm, capacity_bytes=d.hbm.capacity_bytes // 3),
                            host=replace(d.host, bandwidth_gbps=d.host.bandwidth_gbps / 2))
                    if i % 2 else d for i, d in enumerate(hw.devices))
    mixed = replace(task, hardware=replace(hw, devices=devices))
    model = AnalyticalCostModel()
    priced = PricedTask.prepare(mixed, model, ObsLayout(4, N_BUCKETS))
    n_t, n_d, n_v = priced.parts.shape[:3]
    t = np.repeat(np.arange(n_t), n_d * n_v)
    d = np.tile(np.repeat(np.arange(n_d), n_v), n_t)
    k = np.broadcast_to(priced.rows[:, None, :], (n_t, n_d, n_v)).ravel()
    p = model.price(mixed, t, d, k)
    direct = np.stack([p.hbm_ms, p.uvm_ms, p.comm_ms], axis=-1).reshape(priced.parts.shape)
    np.testing.assert_array_equal(priced.parts, direct)
    assert not np.allclose(priced.parts[:, 0], priced.parts[:, 1])  # the kinds differ
