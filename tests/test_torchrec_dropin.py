"""AutoshardPlanner as a drop-in for TorchRec's planner: TorchRec's default storage reservation
or the one given, every rank within TorchRec's own storage estimate under it (planned again
where TorchRec counts more than our model), ``timeout_seconds`` and ``debug`` as TorchRec's,
TorchRec's ``PlannerError`` with its type, and the statistics table TorchRec prints."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.torchrec import torchrec_unavailable

pytestmark = pytest.mark.skipif(torchrec_unavailable(load=True) is not None,
                                reason=f"torchrec not importable: {torchrec_unavailable()}")
MIB = 2**20
LOGGER = "autoshard.torchrec.autoshard_planner"


def topology(world: int = 2, hbm_mib: int = 1024, local: int | None = None,
             device: str = "cuda", **fields: Any) -> Any:
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world, compute_device=device, hbm_cap=hbm_mib * MIB,
                    local_world_size=local or world, **fields)


def ebc(dims: tuple[int, ...] = (16, 32, 48, 64), rows: int = 4000, features: int = 1,
        prefix: str = "t") -> Any:
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    return EmbeddingBagCollection(device=torch.device("meta"), tables=[EmbeddingBagConfig(
        name=f"{prefix}{i}", embedding_dim=d, num_embeddings=rows,
        feature_names=[f"f{prefix}{i}_{j}" for j in range(features)])
        for i, d in enumerate(dims)])


def many_collections(count: int = 12) -> Any:
    """``count`` collections of two tables each: 571 MiB of weights for 12."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    model = torch.nn.Module()
    for e in range(count):
        model.add_module(f"ebc{e}", EmbeddingBagCollection(device=torch.device("meta"), tables=[
            EmbeddingBagConfig(name=f"t{e}_{j}", embedding_dim=32 * (1 + (e + j) % 4),
                               num_embeddings=20_000 * (1 + (3 * e + j) % 7),
                               feature_names=[f"f{e}_{j}"]) for j in range(2)]))
    return model


def planner(top: Any = None, **options: Any) -> Any:
    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    return AutoshardPlanner(top if top is not None else topology(), **{"time_limit": 20,
                                                                       **options})


def sharders() -> list[Any]:
    from torchrec.distributed.sharding_plan import get_default_sharders

    return get_default_sharders()


def heuristic(percentage: float = 0.15) -> Any:
    from torchrec.distributed.planner.storage_reservations import (
        HeuristicalStorageReservation,
    )

    return HeuristicalStorageReservation(percentage=percentage)


def test_the_default_reservation_is_torchrecs_and_what_it_keeps_is_shown() -> None:
    chosen = planner()
    reservation = chosen.storage_reservation
    assert type(reservation).__name__ == "HeuristicalStorageReservation"
    assert reservation._percentage == 0.15
    chosen.plan(ebc(), sharders())
    kjt = 20 * 8 * 4 * 512  # twenty copies of 8-byte ids: 4 tables, 1 id a sample, 512 samples
    left = int((1 - 0.15) * 1024 * MIB) - kjt  # no dense parameters in the model
    assert chosen.plan_stats.reserved.hbm_left_bytes == (left, left)
    assert [d.hbm.capacity_bytes for d in chosen.result.task.hardware.devices] == [left, left]
    recorded = chosen.result.plan.context.hardware_spec["storage_reservation"]
    assert recorded["policy"] == "HeuristicalStorageReservation"
    assert (recorded["percentage"], recorded["kjt_hbm_bytes"]) == (0.15, kjt)
    assert "15% of HBM" in chosen.plan_stats.render()


@pytest.mark.parametrize("kind", ["percentage", "absolute"])
def test_a_given_reservation_is_honoured(kind: str) -> None:
    from torchrec.distributed.planner.storage_reservations import (
        FixedAbsoluteStorageReservation,
        FixedPercentageStorageReservation,
    )

    given, left = ((FixedPercentageStorageReservation(0.5), 512 * MIB) if kind == "percentage"
                   else (FixedAbsoluteStorageReservation(300 * MIB), 724 * MIB))
    chosen = planner(storage_reservation=given)
    assert chosen.storage_reservation is given
    chosen.plan(ebc(), sharders())
    assert [d.hbm.capacity_bytes for d in chosen.result.task.hardware.devices] == [left, left]
    assert chosen.plan_stats.reserved.kept_hbm_bytes == (1024 * MIB - left,) * 2


def test_a_reservation_that_is_not_torchrecs_is_refused() -> None:
    with pytest.raises(InputError, match="StorageReservation"):
        planner(storage_reservation=0.15)


def test_a_plan_of_many_collections_fits_torchrecs_estimate_under_its_reservation() -> None:
    """Every rank's shards, under TorchRec's own storage estimator, within the HBM that
    ``HeuristicalStorageReservation(0.15)`` leaves it; planned without a reservation, the
    same model overfills it."""
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    from autoshard.torchrec.model_rating import rate_plan

    model, top = many_collections(), topology(world=4, local=2, hbm_mib=64)

    def rank_hbm(plan: Any) -> list[int]:
        used = [0] * 4
        for option in rate_plan(plan, model, sharders(), top, 512):
            for shard in option.shards:
                used[shard.rank] += shard.storage.hbm
        return used

    left = [d.storage.hbm for d in heuristic().reserve(top, 512, model, sharders()).devices]
    ours = rank_hbm(planner(top, time_limit=10).plan(model, sharders()))
    assert all(u <= c for u, c in zip(ours, left, strict=True)), (ours, left)
    unreserved = planner(top, time_limit=10,
                         storage_reservation=FixedPercentageStorageReservation(0.0))
    assert any(u > c for u, c in zip(rank_hbm(unreserved.plan(model, sharders())), left,
                                     strict=True))


def test_where_torchrec_counts_more_than_our_model_the_task_is_planned_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """Tables of 32 features write 32 pooled outputs a sample under TorchRec's count, ours
    one: the first plan overfills TorchRec's estimate, a later one fits it."""
    from torchrec.distributed.planner import ParameterConstraints

    given = {f"t{i}": ParameterConstraints(pooling_factors=[1.0] * 32) for i in range(6)}
    chosen = planner(topology(hbm_mib=256), constraints=given)
    with caplog.at_level(logging.INFO, LOGGER):
        chosen.plan(ebc((512,) * 6, rows=40_000, features=32), sharders())
    assert any("planning again" in r.getMessage() for r in caplog.records)
    assert chosen.plan_stats.fits
    assert all(r.hbm_bytes <= r.hbm_left_bytes for r in chosen.plan_stats.ranks)


def test_timeout_seconds_is_the_sharders_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard import planning

    seen: list[Any] = []
    real = planning.plan

    def plan(*args: Any, **options: Any) -> Any:
        seen.append(options)
        return real(*args, **options)

    monkeypatch.setattr(planning, "plan", plan)
    chosen = planner(time_limit=None, timeout_seconds=7)
    assert chosen.time_limit == 7.0
    chosen.plan(ebc(), sharders())
    assert seen[0]["time_limit"] == 7.0
    assert planner(time_limit=None).time_limit == 60.0
    for options in ({"time_limit": 5, "timeout_seconds": 7}, {"timeout_seconds": 0}):
        with pytest.raises(InputError, match="timeout_seconds"):
            planner(**options)


@pytest.mark.parametrize("debug", [True, False])
def test_debug_lists_every_table_as_torchrecs_does(caplog: pytest.LogCaptureFixture,
                                                   debug: bool) -> None:
    with caplog.at_level(logging.INFO, LOGGER):
        planner(debug=debug).plan(ebc(), sharders())
    logged = [r.getMessage() for r in caplog.records]
    assert any("Planner Statistics" in line for line in logged)
    assert sum(line.lstrip("# ").startswith("Rank") for line in logged) == 1
    assert any("Parameter Info:" in line for line in logged) is debug
    assert any("HBM Imbalance Statistics" in line for line in logged) is debug


def test_the_statistics_of_two_tables_on_two_cpu_ranks() -> None:
    """On a CPU, TorchRec counts a table's weights and its I/O in DDR: t0 (4000 x 16 FP32)
    256,000 B + 8,192 B of ids (512 samples x 2 ranks x 8 B) + 65,536 B of output (1,024
    samples x 16 x 4 B); t1 (4000 x 32) 512,000 + 8,192 + 131,072 B."""
    from torchrec.distributed.planner import ParameterConstraints

    given = {t: ParameterConstraints(sharding_types=["table_wise"]) for t in ("t0", "t1")}
    chosen = planner(topology(device="cpu"), constraints=given)
    chosen.plan(ebc((16, 32)), sharders())
    stats = chosen.plan_stats
    assert [(t.fqn, t.sharding_type, t.ddr_bytes, t.hbm_bytes) for t in stats.tables] == [
        ("t0", "TW", 329_728, 0), ("t1", "TW", 651_264, 0)]
    assert sorted(r.ddr_bytes for r in stats.ranks) == [329_728, 651_264]
    assert all(r.input_mib == pytest.approx(8192 / MIB) for r in stats.ranks)
    assert sorted(r.output_mib for r in stats.ranks) == pytest.approx([0.0625, 0.125])
    assert [r.shards for r in stats.ranks] == [(("TW", 1),), (("TW", 1),)]
    assert stats.fits and stats.step_ms == max(r.perf.total_ms for r in stats.ranks)
    text = stats.render()
    assert "Parameter Info:" in text and "Parameter Info:" not in stats.render(debug=False)
    assert all(line.startswith("#") and line.endswith("#") for line in text.splitlines())


def test_errors_are_torchrecs_planner_error_of_its_type() -> None:
    import torch
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
    from torchrec.distributed.planner.types import PlannerErrorType

    def failure(action: Any) -> Any:
        with pytest.raises(TorchRecPlannerError) as caught:
            action()
        return caught.value

    strict = failure(lambda: planner(topology(device="cpu"), constraints={
        "t2": ParameterConstraints(sharding_types=["row_wise"])}).plan(ebc(), sharders()))
    assert strict.error_type == PlannerErrorType.STRICT_CONSTRAINTS
    assert isinstance(strict, PlannerError) and strict.kind == "constraint"
    assert "'t2'" in str(strict)
    reserved = failure(lambda: planner(storage_reservation=heuristic(1.0)).plan(ebc(),
                                                                             sharders()))
    assert reserved.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    full = failure(lambda: planner(topology(hbm_mib=1, ddr_cap=MIB)).plan(
        ebc(rows=400_000), sharders()))
    assert full.error_type == PlannerErrorType.INSUFFICIENT_STORAGE and full.kind == "capacity"
    model = torch.nn.Sequential(ebc(), ebc())  # the same table names twice
    named = failure(lambda: planner().plan(model, sharders()))
    assert named.error_type == PlannerErrorType.INPUT_VALIDATION
    assert isinstance(named, InputError) and "two tables of this name" in str(named)
    alone = failure(lambda: planner().collective_plan(ebc()))
    assert alone.error_type == PlannerErrorType.OTHER and alone.kind == "distributed"


def test_the_errors_pickle_with_their_kind_and_type() -> None:
    from torchrec.distributed.planner.types import PlannerErrorType

    from autoshard.torchrec.planner_errors import AutoshardInputError, AutoshardPlannerError

    error = pickle.loads(pickle.dumps(AutoshardPlannerError("capacity", "rank 0 holds 3 GiB")))
    assert (error.kind, error.error_type, str(error)) == (
        "capacity", PlannerErrorType.INSUFFICIENT_STORAGE, "rank 0 holds 3 GiB")
    wrong = pickle.loads(pickle.dumps(AutoshardInputError("bad", field="rows", value=-1)))
    assert (wrong.field, wrong.value, wrong.error_type) == (
        "rows", -1, PlannerErrorType.INPUT_VALIDATION)
