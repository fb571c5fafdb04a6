"""Hostile policy folders and run checkpoints: each is refused with one line naming the file
and the field (exit code 2), nothing is unpickled, no network is built from unchecked numbers,
and nothing is written."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_cli

from autoshard.errors import InputError
from autoshard.policy import network
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.network import PlacementNet, load_policy, save_policy
from autoshard.training.checkpoint import STATE, WEIGHTS, sha256

#: A resumable run of 128 steps: two rollouts of 2 x 32, checkpointed.
RUN_ARGS = ["--n-envs", "2", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "1",
            "--train-tables", "4", "6", "--batch-sizes", "4096", "--modes", "train",
            "--eval-tables", "6", "--eval-devices", "2",
            "--eval-repeats", "1", "--hidden", "8", "--eval-every", "64",
            "--checkpoint-every", "64", "--wandb-mode", "disabled"]


class Marker:
    """Unpickling this creates a file: proof that a file's code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    save_policy(PlacementNet(N_BUCKETS, hidden=16), tmp_path / "policy", MULTIPLIERS)
    return tmp_path / "policy"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if a network is built (a config out of range must be refused first)."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a network was built from {args}")

    monkeypatch.setattr(network, "PlacementNet", refuse)


def plan_with(policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs `plan -s ppo --policy` and checks it fails cleanly; returns the error line."""
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "-t", "default", "-s", "ppo", "--policy", str(policy),
                            "-o", str(out)], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert not out.exists()
    return err


def test_a_truncated_weights_file_is_refused(policy: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = (policy / "weights.pt").read_bytes()
    (policy / "weights.pt").write_bytes(data[:len(data) // 2])
    err = plan_with(policy, tmp_path, capsys)
    assert f"{policy / 'weights.pt'}: not a readable tensor file: truncated or corrupt" in err


def test_a_pickle_payload_is_never_unpickled(policy: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "executed"
    torch.save({"opt_bucket": Marker(marker)}, policy / "weights.pt")
    err = plan_with(policy, tmp_path, capsys)
    assert f"{policy / 'weights.pt'}: refused: holds something other than tensors" in err
    assert not marker.exists()


@pytest.mark.parametrize("change", [
    lambda s: s.pop("value_net.weight" if "value_net.weight" in s else "opt_bucket"),
    lambda s: s.update(extra=torch.zeros(1)),
    lambda s: s.update(opt_bucket=torch.zeros(3, 3)),
    lambda s: s.update(opt_bucket=torch.zeros_like(s["opt_bucket"], dtype=torch.int64)),
    lambda s: s.update(opt_bucket=torch.full_like(s["opt_bucket"], float("nan"))),
    lambda s: s.update(opt_bucket=[1.0, 2.0]),
], ids=["missing", "extra", "shape", "integers", "nan", "not-a-tensor"])
def test_weights_must_be_the_configs_network_key_for_key(
        policy: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    state = torch.load(policy / "weights.pt", weights_only=True)
    change(state)
    torch.save(state, policy / "weights.pt")
    with pytest.raises(InputError, match=r"weights\.pt, field '(opt_bucket|extra|value)"):
        load_policy(policy)


def test_a_weights_file_too_large_for_its_config_is_not_read(policy: Path) -> None:
    with (policy / "weights.pt").open("ab") as fh:
        fh.write(b"\0" * (3 << 20))
    with pytest.raises(InputError, match="more than the"):
        load_policy(policy)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("buckets", -1, r"must be an integer in \[2, 64\]"),
    ("hidden", 1e9, r"must be an integer in \[1, 1024\]"),
    ("hidden", "64", r"must be an integer"),
    ("grids", 3, r"must be an integer in \[1, 2\]"),
    ("version", True, "expected version"),
    ("multipliers", ["inf", "nan", "2", "1.4", "1", "0.7", "0.5", "0"], "multipliers"),
    ("multipliers", ["inf"], "expected 8 multipliers"),
])
def test_config_fields_are_checked_before_any_network_is_built(
        policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_network: None,
        field: str, value: Any, message: str) -> None:
    doc = json.loads((policy / "config.json").read_text())
    (policy / "config.json").write_text(json.dumps({**doc, field: value}))
    err = plan_with(policy, tmp_path, capsys)
    assert f"{policy / 'config.json'}, field '{field}'" in err
    assert re.search(message, err), err


def test_a_config_with_nan_is_refused(policy: Path) -> None:
    text = (policy / "config.json").read_text().replace('"hidden": 16', '"hidden": NaN')
    (policy / "config.json").write_text(text)
    with pytest.raises(InputError, match=r"config\.json, field 'hidden'"):
        load_policy(policy)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run with a checkpoint at 128 steps (made once)."""
    import autoshard.cli

    out = tmp_path_factory.mktemp("base") / "run"
    autoshard.cli.main(["train", "--timesteps", "128", "--out", str(out), *RUN_ARGS])
    return out


def resume_fails(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Resumes ``run`` to 256 steps, expecting a clean refusal that changes no file."""
    before = snapshot(run)
    code, _, err = run_cli(["train", "--timesteps", "256", "--out", str(run), "--resume",
                            *RUN_ARGS], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert snapshot(run) == before
    return err


def edit_state(run: Path, **changes: Any) -> None:
    path = run / "checkpoints" / STATE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_weights(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Changes the checkpoint's tensors and records their new digest (so the digest check
    passes and the contents must be checked)."""
    path = run / "checkpoints" / WEIGHTS
    saved = torch.load(path, weights_only=True)
    change(saved)
    torch.save(saved, path)
    edit_state(run, sha256=sha256(path))


def first_key(d: dict[str, Any]) -> str:
    return next(iter(d))


@pytest.mark.parametrize(("edit", "where"), [
    (lambda r: edit_state(r, num_timesteps=-100), "state.json, field 'num_timesteps'"),
    (lambda r: edit_state(r, num_timesteps="abc"), "state.json, field 'num_timesteps'"),
    (lambda r: edit_state(r, num_timesteps=1e30), "state.json, field 'num_timesteps'"),
    (lambda r: edit_state(r, best_ratio="abc"), "state.json, field 'best_ratio'"),
    (lambda r: edit_state(r, history="x"), "state.json, field 'history'"),
    (lambda r: edit_state(r, sha256=None), "state.json, field 'sha256'"),
    (lambda r: (r / "checkpoints" / STATE).write_text('{"num_timesteps": NaN}'),
     "state.json, field 'num_timesteps'"),
    (lambda r: edit_weights(r, lambda s: s["policy"].update(
        {first_key(s["policy"]): s["policy"][first_key(s["policy"])] * float("nan")})),
     "last.pt, field 'policy.features_extractor.net.opt_bucket'"),
    (lambda r: edit_weights(r, lambda s: s["optimizer"]["state"][0].update(
        exp_avg_sq=-s["optimizer"]["state"][0]["exp_avg_sq"] - 1)),
     "last.pt, field 'optimizer.state[0].exp_avg_sq'"),
    (lambda r: edit_weights(r, lambda s: s["optimizer"]["param_groups"][0].update(eps=1e3)),
     "last.pt, field 'optimizer.param_groups[0].eps'"),
    (lambda r: (r / "config.json").write_text('{"hidden": "wide", "gamma": [1]}'),
     "config.json, field 'gamma'"),
    (lambda r: (r / "config.json").write_text("[1, 2"), "config.json: cannot parse"),
    (lambda r: (r / "config.json").write_text('{"learning_rate": NaN}'),
     "config.json, field 'learning_rate'"),
    (lambda r: (r / "policy" / "weights.pt").write_bytes(b"PK\x03\x04 truncated"),
     "policy/weights.pt: not a readable tensor file"),
], ids=["negative-steps", "text-steps", "huge-steps", "text-best", "text-history",
        "no-digest", "nan-state", "nan-weights", "negative-moment", "other-eps",
        "garbage-config", "broken-config", "nan-config", "kept-policy"])
def test_hostile_run_files_are_refused_on_resume(
        finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        edit: Callable[[Path], None], where: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    edit(run)
    err = resume_fails(run, capsys)
    assert where in err, err


def test_a_sound_checkpoint_resumes_from_a_moved_folder(
        finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "moved"
    shutil.copytree(finished_run, run)
    code, out, err = run_cli(["train", "--timesteps", "192", "--out", str(run), "--resume",
                              *RUN_ARGS], capsys)
    assert code == 0, err
    assert " ".join(out.split()).startswith("trained 192 steps in")
    state = json.loads((run / "checkpoints" / STATE).read_text())
    assert state["num_timesteps"] == 192
