"""Learned cost models are verified before use: damaged, edited or foreign model files stop
every command with exit 2 and nothing written, and a model from another machine is flagged."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autoshard.cost_models.features import partition_features
from autoshard.cost_models.lgb_text import file_digest
from autoshard.cost_models.model import LightGBMCostModel
from autoshard.errors import InputError
from autoshard.machine import machine_record
from autoshard.pricing.cost import load_cost_model, machine_warning
from tests.cli_helpers import run_cli


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    n = 400
    lookups = np.exp(rng.uniform(0, 10, n))
    X = partition_features(np.exp(rng.uniform(3, 12, n)), lookups, lookups * 0.5,
                           rng.choice([8, 32, 64], n), 512, 4, 1, rng.integers(0, 2, n),
                           rng.integers(0, 2, n), 0)
    y = 0.01 + np.exp2(X[:, -1]) * 1e-6
    out = tmp_path_factory.mktemp("model") / "m"
    LightGBMCostModel(n_estimators=30).fit(X, y).save(out)
    return out


@pytest.fixture()
def tables(tmp_path: Path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [{"name": f"t{i}", "rows": 1000 * (i + 1), "dim": 16,
                                            "pooling_factor": 4} for i in range(6)]}))
    return path


def damaged_copy(saved: Path, tmp_path: Path, edit: Callable[[str], str],
                 redigest: bool) -> Path:
    """A copy of the model with ``model.txt`` edited (and the digest updated if asked)."""
    out = tmp_path / "damaged"
    out.mkdir()
    (out / "model.txt").write_text(edit((saved / "model.txt").read_text()))
    meta = json.loads((saved / "metadata.json").read_text())
    if redigest:
        meta["model_sha256"] = file_digest(out / "model.txt")
    (out / "metadata.json").write_text(json.dumps(meta))
    return out


def plan_exit(model: Path, tables: Path, tmp_path: Path,
              capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    plan = tmp_path / "plan.json"
    code, _out, err = run_cli(["plan", "-t", str(tables), "--devices", "2", "-s", "size_greedy",
                               "--cost-model", str(model), "-o", str(plan)], capsys)
    assert not plan.exists()
    return code, err


def truncate(text: str) -> str:
    return text[: len(text) // 2]


def same_length_leaf_edit(value: str) -> Callable[[str], str]:
    """Replaces the first leaf value by ``value`` padded to the same length."""
    def edit(text: str) -> str:
        m = re.search(r"leaf_value=(\S+)", text)
        assert m is not None
        old = m.group(1)
        new = value.rjust(len(old), "0")
        return text[: m.start(1)] + new[: len(old)] + text[m.end(1):]
    return edit


def first_tree_leaves(value: str) -> Callable[[str], str]:
    """Sets every leaf of the first tree to ``value``."""
    def edit(text: str) -> str:
        m = re.search(r"leaf_value=([^\n]+)", text)
        assert m is not None
        count = len(m.group(1).split())
        return resized(text[: m.start(1)] + " ".join([value] * count) + text[m.end(1):])
    return edit


def resized(text: str) -> str:
    """The model text with ``tree_sizes`` recomputed (as an edit made with care would)."""
    body = text[: text.index("end of trees")]
    sizes = " ".join(str(len(("Tree=" + t).encode())) for t in body.split("Tree=")[1:])
    return re.sub(r"tree_sizes=[^\n]*", f"tree_sizes={sizes}", text, count=1)


@pytest.mark.parametrize("edit,redigest,expect", [
    (truncate, False, "digest"),
    (truncate, True, "truncated"),
    (same_length_leaf_edit("nan"), False, "digest"),
    (same_length_leaf_edit("nan"), True, "not a number"),
    (same_length_leaf_edit("9e99"), True, "leaf value"),
    (first_tree_leaves("700"), True, "prediction"),  # finite leaves, infinite latency
    (lambda t: resized(t.replace("left_child=", "left_child=5", 1)), True, "not a tree"),
    (lambda t: resized(t.replace("is_linear=0", "is_linear=0\nextra=1", 1)), True, "extra"),
    (lambda t: t.replace("objective=regression", "objective=regression sqrt", 1), True,
     "objective"),
])
def test_damaged_model_exits_2_and_writes_nothing(
        saved: Path, tables: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        edit: Callable[[str], str], redigest: bool, expect: str) -> None:
    model = damaged_copy(saved, tmp_path, edit, redigest)
    code, err = plan_exit(model, tables, tmp_path, capsys)
    assert code == 2, err
    assert expect in err and str(model) in err


def test_wrong_or_missing_digest_is_refused(saved: Path, tables: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = damaged_copy(saved, tmp_path, lambda t: t, redigest=False)
    meta = json.loads((model / "metadata.json").read_text())
    meta["model_sha256"] = "sha256:" + "0" * 64
    (model / "metadata.json").write_text(json.dumps(meta))
    code, err = plan_exit(model, tables, tmp_path, capsys)
    assert code == 2 and "model_sha256" in err
    del meta["model_sha256"]
    (model / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="no model digest"):
        load_cost_model(str(model))


def test_unknown_kind_is_refused(saved: Path, tmp_path: Path) -> None:
    model = damaged_copy(saved, tmp_path, lambda t: t, redigest=False)
    meta = json.loads((model / "metadata.json").read_text())
    (model / "metadata.json").write_text(json.dumps(dict(meta, kind="os:system")))
    with pytest.raises(InputError, match="kind"):
        load_cost_model(str(model))


def test_committed_model_verifies(tmp_path: Path) -> None:
    model = load_cost_model("autoshard/data/cost_model")
    assert model.name == "lightgbm"
    note = machine_warning(model)  # its machine carries no fingerprint: always flagged
    assert note is not None and "calibrate" in note
    assert "None" not in note and "no fingerprint recorded" in note


@pytest.mark.parametrize(("machine", "said"), [
    ({"cpu_model": "Some CPU", "fingerprint": None}, "Some CPU, with no fingerprint recorded"),
    ({"fingerprint": "0123456789ab"}, "whose CPU it did not record (fingerprint 0123456789ab)"),
    ({}, "whose CPU it did not record, with no fingerprint recorded"),
    (None, "a machine it did not record"),
])
def test_machine_warning_says_what_the_model_did_not_record(
        machine: object, said: str) -> None:
    class Model:
        name = "learned"

    model = Model()
    model.machine = machine  # type: ignore[attr-defined]
    note = machine_warning(model)  # type: ignore[arg-type]
    assert note is not None and said in note and "None" not in note


def test_plan_warns_when_the_model_was_measured_elsewhere(
        saved: Path, tables: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    here = damaged_copy(saved, tmp_path, lambda t: t, redigest=False)
    meta = json.loads((here / "metadata.json").read_text())
    (here / "metadata.json").write_text(json.dumps(dict(meta, machine=machine_record())))
    plan = tmp_path / "p.json"
    args = ["plan", "-t", str(tables), "--devices", "2", "--cost-model", str(here), "-o",
            str(plan)]
    code, _out, err = run_cli(args, capsys)
    assert code == 0 and "warning" not in err
    other = dict(machine_record(), fingerprint="0123456789ab")
    (here / "metadata.json").write_text(json.dumps(dict(meta, machine=other)))
    code, _out, err = run_cli(args, capsys)
    assert code == 0 and "warning" in err and "calibrate" in err
