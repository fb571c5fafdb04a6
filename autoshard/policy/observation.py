"""The arithmetic of a placement episode's observation, written once for one episode or a batch.

Every function here takes arrays with any leading batch axes. The single episode
(:class:`autoshard.policy.episode.PlacementEpisode`, and the choice episode) calls them on its
own arrays, with no batch axis; the batched environment (:mod:`autoshard.envs.batched_arrays`)
calls them on (episodes, ...) arrays. Both therefore compute every device feature, summary entry,
option feature and fill price with the same operations, and their numbers agree bit for bit.

A step cost passed in (``top``, over the bound) must already broadcast against the array it
meets (a scalar for one episode, ``top[:, None]`` for a batch): it is not converted, as
numpy's promotion of the float32 observation depends on its type.
"""

from __future__ import annotations

import numpy as np

from autoshard.policy.features import CLIP, ObsLayout

#: Device features kept unnormalised (``raw``) and scaled into the observation at each update
#: (all but ``slack``), and their columns in the unnormalised arrays.
SCALED = ("load_hbm", "load_uvm", "load_comm", "load", "free_hbm", "free_host", "tables",
          "max_table")
RAW = {name: i for i, name in enumerate(SCALED)}
#: The columns of the load's components (HBM, host, communication ms).
LOAD_PARTS = [RAW["load_hbm"], RAW["load_uvm"], RAW["load_comm"]]


def initial_devices(hbm_capacity: np.ndarray, host_capacity: np.ndarray, tables: int,
                    lower_bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The unnormalised features of empty devices and their scales, each [devices, SCALED].

    Args:
        hbm_capacity: Each device's HBM (bytes).
        host_capacity: Each device's host memory (bytes).
        tables: The task's tables (the ``tables`` feature's unit).
        lower_bound: The task's lower bound (ms; the unit of the costs).
    """
    n_d = hbm_capacity.size
    raw = np.zeros((n_d, len(SCALED)))
    raw[:, RAW["free_hbm"]] = hbm_capacity
    raw[:, RAW["free_host"]] = host_capacity
    scale = np.full((n_d, len(SCALED)), 1.0 / lower_bound)
    scale[:, RAW["free_hbm"]] = 1.0 / np.maximum(hbm_capacity, 1.0)
    scale[:, RAW["free_host"]] = 1.0 / np.maximum(host_capacity, 1.0)
    scale[:, RAW["tables"]] = 1.0 / tables
    return raw, scale


def record_placement(raw: np.ndarray, parts: np.ndarray, price: np.ndarray | float,
                     load: np.ndarray | float, free_hbm: np.ndarray | float,
                     free_host: np.ndarray | float) -> None:
    """Updates ``raw`` ([..., SCALED], the devices that just took an item) in place.

    Args:
        raw: The unnormalised features of the devices placed on.
        parts: [..., 3] the item's HBM, host and communication ms there.
        price: The item's price (ms).
        load, free_hbm, free_host: The devices' load (ms) and free memory (bytes) after it.
    """
    raw[..., LOAD_PARTS] += parts
    raw[..., RAW["load"]] = load
    raw[..., RAW["free_hbm"]] = free_hbm
    raw[..., RAW["free_host"]] = free_host
    raw[..., RAW["tables"]] += 1.0
    raw[..., RAW["max_table"]] = np.maximum(raw[..., RAW["max_table"]], price)


def write_slack(devices: np.ndarray, top: np.ndarray | float, layout: ObsLayout,
                where: np.ndarray | bool = True) -> None:
    """Writes each device's slack, step cost less its load, both over the bound.

    Args:
        devices: The device features [..., devices, DEVICE] (a view of the observation).
        top: The step cost so far over the bound, broadcastable against [..., devices].
        layout: The observation layout.
        where: Which devices to write (the others keep their slack).
    """
    dn = layout.device
    np.subtract(top, devices[..., dn["load"]], out=devices[..., dn["slack"]], where=where)


def write_summary(summary: np.ndarray, layout: ObsLayout, base: np.ndarray,
                  bytes_left: np.ndarray | float, free_hbm: np.ndarray | float,
                  load: np.ndarray | float, top: np.ndarray | float,
                  devices: np.ndarray | int, lower_bound: np.ndarray | float) -> None:
    """Writes the summary of the work left ([..., SUMMARY], a view of the observation).

    Args:
        summary: Where to write.
        layout: The observation layout.
        base: The entries that depend on the step alone (:attr:`PricedTask.summary`'s row).
        bytes_left: Relaxation bytes still to place (the step's).
        free_hbm: Free HBM summed over the devices (bytes).
        load: Load summed over the devices (ms).
        top: The step cost so far over the bound.
        devices: The task's devices.
        lower_bound: The task's lower bound (ms).
    """
    s = layout.summary
    summary[...] = base
    summary[..., s["bytes_left"]] = np.minimum(bytes_left / np.maximum(free_hbm, 1.0), CLIP)
    summary[..., s["max_load"]] = top
    summary[..., s["mean_load"]] = load / (devices * lower_bound)


def write_fill_option(option: np.ndarray, price_ms: np.ndarray, hbm_bytes: np.ndarray,
                      lower_bound: np.ndarray | float, hbm_cap: np.ndarray,
                      layout: ObsLayout) -> None:
    """Writes the fill bucket's static features on every device; its others zero.

    Args:
        option: The fill bucket's features [..., devices, OPTION] (a view of the observation).
        price_ms: [..., devices] its price shown.
        hbm_bytes: [..., devices] its HBM bytes shown.
        lower_bound: The bound (ms), broadcastable against [..., devices].
        hbm_cap: [..., devices] each device's HBM capacity (at least 1 byte).
        layout: The observation layout.
    """
    o = layout.option
    option[...] = 0.0
    option[..., o["price"]] = np.minimum(price_ms / lower_bound, CLIP)
    option[..., o["hbm_bytes"]] = np.minimum(hbm_bytes / hbm_cap, CLIP)


def write_dynamic_options(options: np.ndarray, devices: np.ndarray, top: np.ndarray | float,
                          fits: np.ndarray, layout: ObsLayout) -> None:
    """Writes the option features that depend on the devices' state: the load after, the step
    cost's increase, the free HBM after, and whether the option fits.

    Args:
        options: [..., devices, buckets, OPTION] (a view of the observation), their price and
            HBM bytes written.
        devices: [..., devices, DEVICE], the device features.
        top: The step cost so far over the bound, broadcastable against [..., devices,
            buckets].
        fits: [..., devices, buckets] whether each option fits.
        layout: The observation layout.
    """
    o, dn = layout.option, layout.device
    after, increase = options[..., o["load_after"]], options[..., o["increase"]]
    np.add(devices[..., dn["load"]][..., None], options[..., o["price"]], out=after)
    np.minimum(after, CLIP, out=after)
    np.subtract(after, top, out=increase)
    np.maximum(increase, 0.0, out=increase)
    free_after = options[..., o["free_after"]]
    np.subtract(devices[..., dn["free_hbm"]][..., None], options[..., o["hbm_bytes"]],
                out=free_after)
    np.maximum(free_after, -CLIP, out=free_after)
    options[..., o["fits"]] = fits


def bucket_parts(rows: np.ndarray, bucket_rows: np.ndarray, parts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The cost parts of an item with ``rows`` HBM rows on each device, where those rows are
    one of its value buckets (all rows where the whole table fits, none where HBM is full, ...).

    Args:
        rows: [..., devices] HBM rows on each device.
        bucket_rows: [..., value buckets] the value buckets' HBM rows.
        parts: [..., devices, value buckets, 3] their HBM, host and communication ms.

    Returns:
        [..., devices, 3] the parts of the first equal bucket (of bucket 0 where none is), and
        [..., devices] where none is (the rows the caller prices).
    """
    same = rows[..., :, None] == bucket_rows[..., None, :]
    bucket = same.argmax(axis=-1)
    taken = np.take_along_axis(parts, bucket[..., None, None], axis=-2)[..., 0, :]
    return taken, ~same.any(axis=-1)


def bounded(obs: np.ndarray, limit: float) -> np.ndarray:
    """A copy of ``obs`` with every entry within [-limit, limit] (np.clip's result, without
    its per-call overhead)."""
    out = np.minimum(obs, limit)
    np.maximum(out, -limit, out=out)
    return out
