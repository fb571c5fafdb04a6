"""Domain-randomised table families for training and held-out evaluation of the policy.

Each family is a pool of tables drawn from two sources, with seeds that no other family, suite
or the demo uses:

- a parametric generator spread far wider than any one model: 100 to 50 M rows, dims 8-512,
  fp32 and fp16, one-hot (pooling 1) and multi-hot features (pooling up to 300), coverage from
  2% to 100%, access skews from uniform (Zipf 0) to very steep (1.6), and for two in five
  tables partial use (only 0.01%-100% of the rows are ever touched, as short profiled traces
  show);
- profiled synthetic traces (:mod:`autoshard.synth`): tables of the calibrated generator with
  wider skew and size ranges, traced at 256-8,192 samples and profiled
  (:func:`autoshard.stats.table_stats.profile_table`), so their access curves, rows used and pooling
  are measured, as ``autoshard demo`` measures its tables.

``train``, ``validation`` and ``test`` are disjoint (different seeds and table names). The
public models' table lists and the generated 856-table pool of the suites are not in any
family: they are evaluation only.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from autoshard.access import AccessCurve
from autoshard.errors import InputError
from autoshard.synth import SynthConfig, draw_tables, iter_lookups
from autoshard.tables import Table

#: Seed base of each family (far from the seeds of the suites, the demo and the pool).
FAMILY_SEEDS = {"train": 1_000_003, "validation": 2_000_003, "test": 3_000_017}
DIMS = (8, 16, 32, 64, 128, 256, 512)
DIM_WEIGHTS = (0.05, 0.15, 0.2, 0.25, 0.2, 0.1, 0.05)
#: Tables per family from the parametric generator, and profiled (traces, samples each).
GENERATED = 2400
TRACES = ((100, 256), (100, 1024), (100, 4096), (100, 8192))


def generated_tables(count: int, rng: np.random.Generator, prefix: str) -> list[Table]:
    """``count`` tables of the parametric generator (see the module docstring)."""
    rows = np.round(10 ** rng.uniform(2.0, 7.7, count)).astype(np.int64)
    dims = rng.choice(DIMS, size=count, p=DIM_WEIGHTS)
    one_hot = rng.random(count) < 0.35
    pooling = np.where(one_hot, 1.0, np.exp(rng.uniform(0.0, np.log(300.0), count)))
    coverage = np.where(rng.random(count) < 0.3, 1.0,
                        np.clip(rng.beta(2.0, 1.0, count), 0.02, 1.0))
    alpha = rng.uniform(0.0, 1.6, count)
    partial = rng.random(count) < 0.4
    used = 10 ** rng.uniform(-4.0, 0.0, count)
    half = rng.random(count) < 0.25
    out = []
    for i in range(count):
        kwargs: dict[str, object] = {}
        if partial[i]:
            used_rows = max(int(np.ceil(used[i] * rows[i])), 1)
            kwargs["access_cdf"] = _partial_curve(float(alpha[i]), used_rows, int(rows[i]))
            kwargs["rows_used"] = used_rows
        else:
            kwargs["zipf_alpha"] = round(float(alpha[i]), 3)
        out.append(Table(name=f"{prefix}g{i}", rows=int(rows[i]), dim=int(dims[i]),
                         bytes_per_element=2 if half[i] else 4,
                         pooling_factor=round(float(pooling[i]), 3),
                         coverage=round(float(coverage[i]), 3), **kwargs))  # type: ignore[arg-type]
    return out


def _partial_curve(alpha: float, used_rows: int, rows: int) -> AccessCurve:
    """Zipf(alpha) over the ``used_rows`` hottest rows of ``rows``; the others never touched."""
    zipf = AccessCurve.zipf(alpha, used_rows)
    scale = used_rows / rows
    return AccessCurve(tuple(x * scale for x in zipf.row_fraction), zipf.lookup_share)


def profiled_tables(seed: int, prefix: str) -> list[Table]:
    """Tables measured by profiling synthetic traces (see the module docstring)."""
    from autoshard.stats.table_stats import profile_table

    config = SynthConfig(log10_rows=(5.0, 1.0), rows_range=(2.0, 7.7), alpha=(0.3, 1.4))
    out = []
    for j, (count, samples) in enumerate(TRACES):
        specs = draw_tables(count, seed + j, config, prefix=f"{prefix}p{j}-")
        for spec, (idx, lengths) in zip(specs, iter_lookups(specs, samples, seed + j),
                                        strict=True):
            profile = profile_table(spec.name, idx, lengths, spec.rows)
            out.append(profile.to_table(spec.dim) if profile.lookups else spec.to_table())
    return out


@cache
def family_pool(family: str) -> tuple[Table, ...]:
    """The tables of ``family`` (``train``, ``validation`` or ``test``), generated once."""
    if family not in FAMILY_SEEDS:
        raise InputError(f"unknown family (known: {', '.join(FAMILY_SEEDS)})", field="family",
                         value=family)
    seed = FAMILY_SEEDS[family]
    prefix = f"{family[:2]}-"
    rng = np.random.default_rng(seed)
    return tuple(generated_tables(GENERATED, rng, prefix) + profiled_tables(seed, prefix))
