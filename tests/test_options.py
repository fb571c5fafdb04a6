"""Sharder options are never silently lost: strict checks, --opt, results keyed on options
and on the cost model's identity."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli as run
from handcase import hand_task_of

from autoshard.compare.harness import COLUMNS, FixedTask, read_rows, run_suite
from autoshard.errors import InputError
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import Pricing, model_identity
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask

TASKS = [FixedTask("hand", hand_task_of())]


@pytest.fixture
def tables_file(tmp_path: Path) -> Path:
    path = tmp_path / "tables.yaml"
    save_tables(path, [Table("a", 1000, 8, pooling_factor=2.0), Table("b", 500, 8),
                       Table("c", 200, 8)])
    return path


def test_plan_opt_reaches_the_sharder(tmp_path: Path, tables_file: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.cli.core_cmds as core_cmds

    made: list[dict[str, object]] = []
    real = core_cmds.get_sharder

    def spy(name: str, **options: object) -> object:
        made.append(options)
        return real(name, **options)

    monkeypatch.setattr(core_cmds, "get_sharder", spy)
    out = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(tables_file), "--devices", "2", "-s", "recshard",
                        "--opt", "time_limit=7", "--opt", "recshard.mip-rel-gap=0.01",
                        "--opt", "max_lines=null", "-o", str(out)], capsys)
    assert code == 0, err
    assert made == [{"seed": 0, "time_limit": 7, "mip_rel_gap": 0.01, "max_lines": None}]
    made.clear()
    code, _, err = run(["plan", "-t", str(tables_file), "-s", "random", "--seed", "4",
                        "--time-limit", "5", "-o", str(out)], capsys)
    assert code == 0 and made == [{"seed": 4}], err  # common options go where they are taken


@pytest.mark.parametrize(("args", "pieces"), [
    (["-s", "recshard", "--opt", "time_limt=1.0"],
     ["--opt recshard.time_limt", "accepted: time_limit, mip_rel_gap"]),
    (["-s", "round_robin", "--opt", "seed=3"], ["--opt round_robin.seed", "accepted: none"]),
    (["-s", "size_greedy", "--opt", "seed=3"], ["--opt size_greedy.seed", "accepted: split"]),
    (["-s", "recshard", "--opt", "time_limit=soon"], ["recshard.time_limit", "expected float"]),
    (["-s", "recshard", "--opt", "time_limit=NaN"], ["--opt", "finite"]),
    (["-s", "recshard", "--opt", "time_limit"], ["--opt", "KEY=VALUE"]),
    (["-s", "recshard", "--opt", "random.seed=1"], ["--opt", "not being run"]),
    (["-s", "recshard", "--opt", "seed=[1]"], ["--opt", "single value"]),
    (["-s", "size_greedy", "--policy", "x"], ["--policy", "ppo"]),
])
def test_plan_rejects_bad_opts(tmp_path: Path, tables_file: Path,
                               capsys: pytest.CaptureFixture[str], args: list[str],
                               pieces: list[str]) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(tables_file), *args, "-o", str(out)], capsys)
    assert code == 2 and err.count("\n") == 1, err
    for piece in pieces:
        assert piece in err, err
    assert not out.exists()


def test_compare_cli_opt_scoped_and_strict(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    base = ["compare", "--suite", "tiny", "--out", str(out), "--wandb-mode", "disabled",
            "--sharders", "random,size_greedy"]
    code, _, err = run([*base, "--opt", "random.seed=3"], capsys)
    assert code == 0, err
    rows = read_rows(out / "tiny.csv")
    assert {(r.sharder, r.options) for r in rows} == {("random", '{"seed": 3}'),
                                                       ("size_greedy", "{}")}
    for args, piece in ((["--opt", "seed=3"], "size_greedy.seed"),
                        (["--opt", "recshard.time_limit=5"], "not being run"),
                        (["--opt", "random.sed=3"], "random.sed")):
        code, _, err = run([*base, *args], capsys)
        assert code == 2 and piece in err, (args, err)
    assert len(read_rows(out / "tiny.csv")) == len(rows)  # nothing rewritten by a bad run


def test_rerun_with_other_options_recomputes_stale_rows(tmp_path: Path) -> None:
    model = AnalyticalCostModel()
    first = run_suite("s", TASKS, model, tmp_path, ["random", "size_greedy"], {"seed": 0})
    again = run_suite("s", TASKS, model, tmp_path, ["random", "size_greedy"], {"seed": 0})
    # Same options: resumed, nothing recomputed, each kept row marked with where it came from.
    assert [replace(r, reused_from="") for r in again] == first
    assert all(r.reused_from == str(tmp_path / "s.csv") for r in again)
    other = run_suite("s", TASKS, model, tmp_path, ["random", "size_greedy"], {"seed": 5})
    by = {r.sharder: r for r in other}
    assert len(other) == 2 and by["random"].options == '{"seed": 5}'
    assert by["random"] != {r.sharder: r for r in first}["random"]  # recomputed
    kept = replace(by["size_greedy"], reused_from="")  # takes no seed: kept
    assert kept == {r.sharder: r for r in first}["size_greedy"]
    given = run_suite("s", TASKS, model, tmp_path, ["recshard"], {"seed": 5},
                      given={"recshard": {"time_limit": 3.0}})
    assert [r.options for r in given if r.sharder == "recshard"] == [
        '{"seed": 5, "time_limit": 3.0}']
    with pytest.raises(InputError, match=r"recshard\.time_limt"):
        run_suite("s", TASKS, model, tmp_path, ["recshard"], given={"recshard": {
            "time_limt": 3.0}})


class Learned:
    """Stands in for a learned model: every one calls itself ``lightgbm``."""

    name = "lightgbm"

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.inner = AnalyticalCostModel()

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        p = self.inner.price(task, table_idx, device_idx, hbm_rows)
        return Pricing(p.hbm_ms * self.scale, p.uvm_ms * self.scale, p.comm_ms * self.scale)


def test_rows_keyed_on_model_identity_not_name(tmp_path: Path) -> None:
    one = tmp_path / "m1"
    one.mkdir()
    (one / "model.txt").write_text("tree 1")
    two = tmp_path / "m2"
    shutil.copytree(one, two)
    assert model_identity("analytical") == "analytical"
    assert model_identity(str(one)) != model_identity(str(two))  # another folder
    before = model_identity(str(one))
    (one / "model.txt").write_text("tree 2")
    assert model_identity(str(one)) != before  # same folder, other contents
    out = tmp_path / "out"
    a = run_suite("s", TASKS, Learned(1.0), out, ["size_greedy"], cost_model_id="A")  # type: ignore[arg-type]
    b = run_suite("s", TASKS, Learned(2.0), out, ["size_greedy"], cost_model_id="B")  # type: ignore[arg-type]
    new = [r for r in b if r.cost_model_id == "B"]
    assert len(new) == 1 and new[0].step_cost_ms == pytest.approx(2 * a[0].step_cost_ms)


def test_results_written_before_the_key_columns_still_read(tmp_path: Path) -> None:
    old = [c for c in COLUMNS if c not in ("cost_model_id", "options")]
    values = {"suite": "s", "task": "hand", "tables": "3", "devices": "2", "mode": "train",
              "sharder": "size_greedy", "status": "ok", "reason": "", "cost_model": "analytical"}
    line = ",".join(values.get(c, "1.0") for c in old)
    path = tmp_path / "s.csv"
    path.write_text(",".join(old) + "\n" + line + "\n")
    (row,) = read_rows(path)
    assert (row.cost_model_id, row.options, row.step_cost_ms) == ("analytical", "", 1.0)
    rows = run_suite("s", TASKS, AnalyticalCostModel(), tmp_path, ["size_greedy"])
    assert len(rows) == 1 and rows[0].options == "{}"  # options unknown: recomputed
    assert json.loads(rows[0].options) == {}


def test_run_one_rejects_an_option_instead_of_recording_a_failure() -> None:
    from autoshard.compare.harness import run_one

    with pytest.raises(InputError, match=r"size_greedy\.seed"):
        run_one("s", TASKS[0], TASKS[0].task, "size_greedy", AnalyticalCostModel(), None,
                {"seed": 0})


@pytest.mark.slow
def test_compare_cli_recomputes_rows_for_another_learned_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shipped = Path(__file__).resolve().parents[1] / "autoshard" / "data" / "cost_model"
    one, two = tmp_path / "model-one", tmp_path / "model-two"
    shutil.copytree(shipped, one)
    shutil.copytree(shipped, two)
    out = tmp_path / "cmp"
    base = ["compare", "--suite", "tiny", "--out", str(out), "--wandb-mode", "disabled",
            "--sharders", "size_greedy"]
    for model in (one, two, one):
        code, _, err = run([*base, "--cost-model", str(model)], capsys)
        assert code == 0, err
    rows = read_rows(out / "tiny.csv")
    ids = {r.cost_model_id for r in rows}
    assert {r.cost_model for r in rows} == {"lightgbm"}  # the name alone cannot tell them apart
    assert ids == {model_identity(str(one)), model_identity(str(two))}
    assert len(rows) == 2 * len({r.task for r in rows})  # the third run resumed
