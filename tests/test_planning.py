"""autoshard.plan (autoshard/planning.py), the sharders' declared results (Sharded) and
autoshard.export (autoshard/exporting.py), on the hand case: tables A (36,000 B), B and C
(18,000 B each) on two devices of 36,000 B of HBM, where A alone | B + C is the optimum."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli
from handcase import HAND_BATCH, hand_profile, hand_tables, hand_task_of, reference_price_ms

import autoshard
from autoshard.compare.harness import FixedTask, run_one
from autoshard.errors import InputError, PlannerError
from autoshard.layout.constraints import NO_CONSTRAINTS, Constraints, TableConstraint
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Plan
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder, sharder_class, sharder_info, sharder_names
from autoshard.sharders.base import Sharded, Sharder
from autoshard.sharders.recshard_tables import RecShardResult
from autoshard.tables import save_tables
from autoshard.task import ShardingTask

MODEL = AnalyticalCostModel()
GREEDY = ("random", "round_robin", "size_greedy", "dim_greedy", "lookup_greedy",
          "size_lookup_greedy", "split_lookup_greedy")
#: A at most half in HBM (the sharder below keeps all its rows there).
HALF_A = Constraints({"A": TableConstraint(hbm_share=(0.0, 0.5))})


class IgnoresConstraints(Sharder):
    """round_robin's plan of the task without its constraints: every table whole, all its rows
    in HBM (A on device 0, B and C on device 1), whatever the constraints say."""

    name = "ignores_constraints"
    summary = "round_robin blind to the constraints"

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[None]:
        free = replace(task, constraints=NO_CONSTRAINTS)
        return Sharded(get_sharder("round_robin").shard(free, cost_model), None)


def register_ignores_constraints(monkeypatch: pytest.MonkeyPatch) -> None:
    """:class:`IgnoresConstraints` in the sharders' registry for one test."""
    import autoshard.sharders as sharders

    monkeypatch.setitem(sharders._ENTRIES, IgnoresConstraints.name,
                        f"{__name__}:IgnoresConstraints")


def optimum_ms() -> float:
    """The hand optimum, B + C on one device all in HBM, by the formula written out."""
    tables = {t.name: t for t in hand_tables()}
    return sum(sum(reference_price_ms(tables[n], 1.0, 2)) for n in ("B", "C"))


def test_planned_fields_on_the_hand_case() -> None:
    task = hand_task_of()
    ticks = iter([10.0, 12.5])  # the clock is read before and after the sharder's run
    planned = autoshard.plan(task, "round_robin", clock=lambda: next(ticks))
    # round_robin: A on device 0 (fills it), B on 1, C on 0 (full), so on 1: the optimum.
    assert [(p.table, p.device, p.hbm_rows) for p in planned.plan.placements] == [
        ("A", 0, 1000), ("B", 1, 500), ("C", 1, 500)]
    assert planned.report.step_cost_ms == pytest.approx(optimum_ms(), rel=1e-12)
    assert planned.report.step_cost_ms == pytest.approx(0.03616, rel=1e-12)
    assert planned.report.lower_bound_ms == evaluate(planned.plan, task, MODEL).lower_bound_ms
    assert planned.seconds == 2.5
    assert planned.task is task and planned.plan.sharder == "round_robin"
    assert (planned.bound_ms, planned.notes, planned.details, planned.solver) == (
        None, (), None, None)
    with pytest.raises(AttributeError):
        planned.seconds = 0.0  # type: ignore[misc]  # a frozen value


@pytest.mark.usefixtures("step_clock")
def test_recshards_bound_reaches_the_report_unless_left_out() -> None:
    task = hand_task_of()
    planned = autoshard.plan(task, "recshard", "analytical", time_limit=5)
    assert planned.report.step_cost_ms == pytest.approx(optimum_ms(), rel=1e-9)
    assert isinstance(planned.details, RecShardResult)
    assert planned.bound_ms == planned.details.bound_ms
    assert planned.bound_ms <= planned.report.step_cost_ms * (1 + 1e-9)
    own = evaluate(planned.plan, task, MODEL).lower_bound_ms  # the task's own bound
    assert planned.report.lower_bound_ms == max(own, planned.bound_ms)
    assert planned.solver is not None and planned.solver["status"] == planned.details.status
    alike = autoshard.plan(task, "recshard", MODEL, own_bound=False, time_limit=5)
    assert alike.report.lower_bound_ms == own and alike.bound_ms == planned.bound_ms


def test_a_sharder_made_already_is_planned_and_takes_no_options() -> None:
    task = hand_task_of()
    sharder = get_sharder("lookup_greedy")
    assert autoshard.plan(task, sharder).plan == sharder.shard(task, MODEL)
    with pytest.raises(InputError, match="registry name"):
        autoshard.plan(task, sharder, split=True)
    with pytest.raises(InputError, match="unknown option"):
        autoshard.plan(task, "lookup_greedy", slpit=True)


@pytest.mark.usefixtures("step_clock")
@pytest.mark.slow
def test_the_sharder_interface_returns_recshards_bound_and_ppos_choice() -> None:
    task = hand_task_of()
    recshard = get_sharder("recshard", time_limit=5).solve(task, MODEL)
    assert isinstance(recshard, Sharded) and isinstance(recshard.details, RecShardResult)
    assert recshard.bound_ms == recshard.details.bound_ms > 0
    if sharder_info("ppo").unavailable:
        pytest.skip(f"ppo: {sharder_info('ppo').unavailable}")
    from autoshard.sharders.ppo.sharder import Choice

    ppo = get_sharder("ppo", time_limit=10).solve(task, MODEL)
    choice = ppo.details
    assert isinstance(choice, Choice) and choice.winner in choice.costs
    assert evaluate(ppo.plan, task, MODEL).step_cost_ms == pytest.approx(
        choice.costs[choice.winner], rel=1e-9)
    assert ppo.bound_ms is None


@pytest.mark.parametrize("name", sharder_names())
def test_every_sharder_answers_the_interface_and_keeps_no_last_result(name: str) -> None:
    try:
        cls = sharder_class(name)
    except PlannerError:
        pytest.skip(f"{name} cannot be imported here")
    assert Sharder in cls.__mro__  # subclasses the interface (shard comes with it)
    assert [a for a in dir(cls) if a.startswith("last_")] == []
    if name in GREEDY:
        sharder = get_sharder(name)
        sharded = sharder.solve(hand_task_of(), MODEL)
        assert sharder.shard(hand_task_of(), MODEL) == sharded.plan
        assert [a for a in vars(sharder) if a.startswith("last_")] == []


def test_constraints_are_enforced_and_a_plan_within_them_is_kept() -> None:
    task = replace(hand_task_of(), constraints=HALF_A)
    blind = IgnoresConstraints().shard(task, MODEL)
    assert next(p for p in blind.placements if p.table == "A").hbm_rows == 1000
    planned = autoshard.plan(task, IgnoresConstraints())
    a = next(p for p in planned.plan.placements if p.table == "A")
    assert a.hbm_rows == 500  # at most half of A's 1,000 rows in HBM
    assert planned.report.step_cost_ms > evaluate(blind, hand_task_of(), MODEL).step_cost_ms
    free = autoshard.plan(hand_task_of(), "round_robin")
    assert free.plan == get_sharder("round_robin").shard(hand_task_of(), MODEL)
    split_b = replace(hand_task_of(), constraints=Constraints(
        {"B": TableConstraint(kinds=frozenset({ShardingKind.ROW_WISE}))}))
    with pytest.raises(PlannerError, match="placed table 'B' whole"):
        autoshard.plan(split_b, "round_robin")


def _hand_files(tmp_path: Path) -> list[str]:
    """The hand tables and hardware as files, and the CLI options that make the hand task."""
    save_tables(tmp_path / "tables.yaml", list(hand_tables()))
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump(hand_profile().to_dict()))
    return ["-t", str(tmp_path / "tables.yaml"), "--hardware", str(tmp_path / "hand.yaml"),
            "--batch-size", str(HAND_BATCH), "--overhead", "none"]


def test_the_plan_command_enforces_the_tasks_constraints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.cli.core_cmds as core_cmds

    built = core_cmds.build_task
    rules: list[Constraints] = [HALF_A]

    def constrained(*args: object, **kwargs: object) -> ShardingTask:
        return replace(built(*args, **kwargs), constraints=rules[0])  # type: ignore[arg-type]

    monkeypatch.setattr(core_cmds, "build_task", constrained)
    register_ignores_constraints(monkeypatch)
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", *_hand_files(tmp_path), "-s", IgnoresConstraints.name, "-o",
                            str(out), "--json"], capsys)
    assert code == 0, err
    a = next(p for p in Plan.load(out).placements if p.table == "A")
    assert a.hbm_rows == 500  # the sharder kept all 1,000 in HBM
    rules[0] = Constraints({"B": TableConstraint(kinds=frozenset({ShardingKind.ROW_WISE}))})
    out.unlink()
    code, _, err = run_cli(["plan", *_hand_files(tmp_path), "-s", IgnoresConstraints.name, "-o",
                            str(out)], capsys)
    assert code == 2 and "placed table 'B' whole" in err and not out.exists()


def test_the_comparison_enforces_the_tasks_constraints(monkeypatch: pytest.MonkeyPatch) -> None:
    register_ignores_constraints(monkeypatch)
    task = replace(hand_task_of(), constraints=HALF_A)
    row, plan, report = run_one("s", FixedTask("hand", task), task, IgnoresConstraints.name,
                                MODEL, None, {})
    assert row.status == "ok" and plan is not None and report is not None
    assert next(p for p in plan.placements if p.table == "A").hbm_rows == 500
    assert row.step_cost_ms == report.step_cost_ms == evaluate(plan, task, MODEL).step_cost_ms


def test_export_writes_what_the_export_command_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = hand_task_of()
    planned = autoshard.plan(task, "round_robin")
    planned.plan.save(tmp_path / "plan.json")
    # The hand cluster's HBM cannot hold TorchRec's I/O buffers: exported without fitting.
    exported = autoshard.export(planned.plan, task, tmp_path / "lib.json", fit=False,
                                fitted_plan=tmp_path / "fitted.json")
    code, _, err = run_cli(["export", str(tmp_path / "plan.json"), *_hand_files(tmp_path),
                            "--no-fit", "-o", str(tmp_path / "cli.json")], capsys)
    assert code == 0, err
    assert (tmp_path / "lib.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    assert json.loads((tmp_path / "lib.json").read_text()) == exported.doc
    assert Plan.load(tmp_path / "fitted.json") == exported.plan
    assert exported.summary == "3 tables on 2 ranks (3 table_wise/fused); module path ''"
    assert exported.changed == () and exported.checked is None


def test_export_refuses_an_unknown_target_or_option(tmp_path: Path) -> None:
    task = hand_task_of()
    plan = autoshard.plan(task, "round_robin").plan
    with pytest.raises(InputError, match="must be one of torchrec"):
        autoshard.export(plan, task, tmp_path / "x.json", to="onnx")
    with pytest.raises(InputError, match="accepted: fit, check, fitted_plan"):
        autoshard.export(plan, task, tmp_path / "x.json", fti=False)
    assert not (tmp_path / "x.json").exists()
