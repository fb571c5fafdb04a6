"""Training: the policy network, its safe format, tiny runs with W&B offline, resume, CLI."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from autoshard.cli import main
from autoshard.envs import PlacementEnv, TaskSampler
from autoshard.errors import InputError
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.features import ObsLayout
from autoshard.policy.network import PADDED, PlacementNet, load_policy, save_policy
from autoshard.training.config import TrainConfig
from autoshard.training.train import train
from autoshard.training.wandb_runs import offline_history

#: A run small enough for a test: tasks of one workload, two held-out tasks.
TINY = {"timesteps": 256, "n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
        "train_tables": (4, 8), "batch_sizes": (4096,), "modes": ("train",),
        "eval_tables": (8,), "eval_devices": (2, 3), "eval_repeats": 1, "eval_every": 128,
        "checkpoint_every": 128, "hidden": 16}


def observation(devices: int, slots: int, seed: int = 0) -> np.ndarray:
    sampler = TaskSampler(tables=(6, 6), devices=(devices,))
    env = PlacementEnv(sampler, max_devices=slots)
    obs, _ = env.reset(seed=seed)
    return obs


def test_config_rejects_bad_values() -> None:
    with pytest.raises(InputError, match="wandb_mode"):
        TrainConfig(wandb_mode="cloud")
    with pytest.raises(InputError, match="more devices than max_devices"):
        TrainConfig(train_devices=(2, 16), max_devices=8)


def test_one_net_scores_any_device_count_and_pads() -> None:
    net = PlacementNet(N_BUCKETS, hidden=16)
    k = N_BUCKETS
    for devices, slots in ((2, 4), (8, 8), (5, 16)):
        logits, value = net(torch.from_numpy(observation(devices, slots))[None])
        assert logits.shape == (1, slots * k) and value.shape == (1, 16)
        assert (logits[0, devices * k:] == PADDED).all()
        assert (logits[0, :devices * k] > PADDED / 2).all()


def test_net_is_equivariant_to_device_order() -> None:
    """Shared weights: swapping two devices' blocks swaps their logits, same value."""
    net = PlacementNet(N_BUCKETS, hidden=16)
    obs = observation(4, 4, seed=3)
    layout = ObsLayout(4, N_BUCKETS)
    blocks = obs[layout.head:].reshape(4, layout.device_block).copy()
    blocks[0, 5] = 0.3  # make device 0 differ from device 2 (free host share)
    swapped = blocks[[2, 1, 0, 3]]
    a = np.concatenate([obs[:layout.head], blocks.ravel()])
    b = np.concatenate([obs[:layout.head], swapped.ravel()])
    la, va = net(torch.from_numpy(a)[None])
    lb, vb = net(torch.from_numpy(b)[None])
    la, lb = la.reshape(4, -1), lb.reshape(4, -1)
    assert torch.allclose(la[[2, 1, 0, 3]], lb, atol=1e-6)
    assert not torch.allclose(la[0], la[2])
    assert torch.allclose(va, vb, atol=1e-6)


def test_policy_files_round_trip_and_refuse_bad_input(tmp_path: Path) -> None:
    net = PlacementNet(N_BUCKETS, hidden=16)
    save_policy(net, tmp_path / "p", MULTIPLIERS, {"trained": {"steps": 3}})
    loaded, multipliers, doc = load_policy(tmp_path / "p")
    assert multipliers == MULTIPLIERS and doc["trained"]["steps"] == 3
    obs = torch.from_numpy(observation(3, 4))[None]
    assert torch.equal(net(obs)[0], loaded(obs)[0])
    with pytest.raises(InputError, match="policy file missing"):
        load_policy(tmp_path / "nothing")
    config = tmp_path / "p" / "config.json"
    doc["features"]["option"] = ["price"]
    config.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="other observation features"):
        load_policy(tmp_path / "p")
    doc["format"] = "something-else"
    config.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="expected format"):
        load_policy(tmp_path / "p")


class Payload:
    """An arbitrary object: a weights file holding one must not be unpickled."""


def test_weights_that_are_not_plain_tensors_are_refused(tmp_path: Path) -> None:
    net = PlacementNet(N_BUCKETS, hidden=16)
    save_policy(net, tmp_path, MULTIPLIERS)
    torch.save({"opt_bucket": Payload()}, tmp_path / "weights.pt")
    with pytest.raises(InputError, match=r"weights\.pt: refused: holds something other than"):
        load_policy(tmp_path)


@pytest.mark.slow
def test_tiny_run_logs_to_offline_wandb(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="offline", **TINY)  # type: ignore[arg-type]
    result = train(cfg)
    assert result.steps == 256
    config, history, summary = offline_history(tmp_path / "run")
    assert json.loads(config["timesteps"]) == 256
    assert json.loads(config["wandb_mode"]) == "offline"
    keys = set().union(*history)
    assert {"charts/train_cost_ratio", "eval/policy_cost_ratio", "eval/best_greedy_cost_ratio",
            "eval/cost_ratio_by_sharder/_type", "final/comparison/_type"} <= keys
    evals = [json.loads(h["eval/policy_cost_ratio"]) for h in history
             if "eval/policy_cost_ratio" in h]
    assert len(evals) == 2 and all(r >= 1.0 for r in evals)  # at steps 128 and 256
    ppo = np.mean([r.cost_ratio for r in result.results if r.sharder == "ppo-policy"])
    assert json.loads(summary["final/policy_cost_ratio"]) == pytest.approx(ppo)
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    tables = list(runs[0].glob("files/media/table/eval/*.table.json"))
    rows = json.loads(tables[0].read_text())
    assert rows["columns"] == ["task", "sharder", "cost_ratio"]
    assert {r[1] for r in rows["data"]} == {"ppo-policy", "size_greedy", "dim_greedy",
                                           "lookup_greedy", "size_lookup_greedy"}


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
def test_batched_and_single_environments_train_the_same_policy(tmp_path: Path,
                                                               split: bool) -> None:
    """The batched environment plays the single environments' episodes, so a few hundred
    steps of MaskablePPO (two updates) through either give the same weights, bit for bit
    (with the split choice in the actions too)."""
    weights = {}
    for vec, steps in (("batched", 256), ("dummy", 256), ("batched", 128)):
        out = tmp_path / f"{vec}-{steps}"
        cfg = TrainConfig(out=str(out), wandb_mode="disabled", vec_env=vec, split=split,
                          **{**TINY, "n_envs": 4, "timesteps": steps, "n_steps": 32,
                             "eval_every": 10_000})  # type: ignore[arg-type]
        result = train(cfg)
        assert result.steps == steps
        summary = json.loads((out / "summary.json").read_text())
        assert summary["vec_env"] == vec and summary["n_envs"] == 4
        weights[vec, steps] = torch.load(result.policy_dir / "weights.pt", weights_only=True)
    batched, dummy = weights["batched", 256], weights["dummy", 256]
    earlier = weights["batched", 128]
    assert batched.keys() == dummy.keys()
    for name, value in batched.items():
        assert torch.equal(value, dummy[name]), name
    # ... and the runs did learn: one more update moved the weights.
    assert not all(torch.equal(value, earlier[name]) for name, value in batched.items())


@pytest.mark.slow
def test_a_run_from_a_policy_evaluates_it_first(tmp_path: Path) -> None:
    save_policy(PlacementNet(N_BUCKETS, hidden=16), tmp_path / "start", MULTIPLIERS)
    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="disabled",
                      init_policy=str(tmp_path / "start"), **TINY)  # type: ignore[arg-type]
    result = train(cfg)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    evals = [h for h in history if "eval_ratio" in h]
    assert [h["step"] for h in evals] == [0, 128, 256]
    best = None  # an evaluation counts as better by at least min_delta
    for h in evals:
        if best is None or h["eval_ratio"] < best - cfg.min_delta:
            best = h["eval_ratio"]
    assert result.best_ratio == best


@pytest.mark.slow
def test_resume_continues_from_the_last_checkpoint(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="disabled", **TINY)  # type: ignore[arg-type]
    first = train(cfg)
    assert first.wall_seconds > 0
    with pytest.raises(InputError, match="already holds a checkpoint"):
        train(cfg)
    with pytest.raises(InputError, match="field 'seed'"):
        train(TrainConfig(**{**cfg.to_dict(), "seed": 1}), resume=True)
    longer = TrainConfig(**{**cfg.to_dict(), "timesteps": 384})
    result = train(longer, resume=True)
    assert result.steps == 384
    assert result.wall_seconds > first.wall_seconds  # the first session's time is kept
    state = json.loads((tmp_path / "run" / "checkpoints" / "state.json").read_text())
    assert state["num_timesteps"] == 384
    steps = [h["step"] for h in state["history"] if "eval_ratio" in h]
    assert steps == [128, 256, 384]  # the first session's evaluations are kept
    with pytest.raises(InputError, match="nothing to resume"):
        train(TrainConfig(**{**cfg.to_dict(), "out": str(tmp_path / "none")}), resume=True)


@pytest.mark.slow
def test_cli_train_smoke(tmp_path: Path) -> None:
    main(["train", "--timesteps", "128", "--n-envs", "2", "--n-steps", "64", "--batch-size",
          "64",
          "--out", str(tmp_path / "run"), "--wandb-mode", "disabled", "--eval-every", "64",
          "--train-tables", "4", "8", "--batch-sizes", "4096", "--modes", "train",
          "--eval-tables", "8", "--eval-devices", "2", "--eval-repeats", "1",
          "--export", str(tmp_path / "export"), "--export-policy", str(tmp_path / "policy")])
    for name in ("training_curve.png", "train_history.json", "train_eval.csv"):
        assert (tmp_path / "export" / name).is_file(), name
    net, multipliers, doc = load_policy(tmp_path / "policy")
    assert doc["trained"]["steps"] in (64, 128) and multipliers == MULTIPLIERS
    assert net(torch.from_numpy(observation(2, 2))[None])[0].shape == (1, 2 * N_BUCKETS)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--timesteps", "128", "--out", str(tmp_path / "run"),
              "--wandb-mode", "disabled"])
    assert exc.value.code == 2


class Marker:
    """Unpickling this creates a file: proof that a checkpoint executed code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


@pytest.mark.slow
def test_resume_never_unpickles_a_crafted_checkpoint(tmp_path: Path) -> None:
    from autoshard.training.checkpoint import WEIGHTS, sha256

    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="disabled", **TINY)  # type: ignore[arg-type]
    train(cfg)
    ckpt = tmp_path / "run" / "checkpoints"
    assert not list(ckpt.glob("*.zip"))  # no SB3 pickle zip is written
    marker = tmp_path / "executed"
    # A pickle zip named like SB3's checkpoint is never read.
    with zipfile.ZipFile(ckpt / "last.zip", "w") as zf:
        zf.writestr("data", pickle.dumps(Marker(marker)))
        zf.writestr("policy.pth", pickle.dumps(Marker(marker)))
    longer = TrainConfig(**{**cfg.to_dict(), "timesteps": 384})
    assert train(longer, resume=True).steps == 384
    assert not marker.exists()
    # A tensor file swapped for a pickle payload is refused, before and after fixing the digest.
    torch.save({"policy": Marker(marker)}, ckpt / WEIGHTS)
    with pytest.raises(InputError, match="digest"):
        train(TrainConfig(**{**cfg.to_dict(), "timesteps": 512}), resume=True)
    state = json.loads((ckpt / "state.json").read_text())
    state["sha256"] = sha256(ckpt / WEIGHTS)
    (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(InputError, match="refused: holds something other than tensors"):
        train(TrainConfig(**{**cfg.to_dict(), "timesteps": 512}), resume=True)
    assert not marker.exists()


@pytest.mark.slow
def test_cli_exposes_every_config_field_with_its_documented_default(tmp_path: Path) -> None:
    from dataclasses import fields

    import typer

    from autoshard.cli import app
    from autoshard.training.config import field_help

    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    options = {opt: p for p in command.params for opt in p.opts}
    for f in fields(TrainConfig):
        option = options["--" + f.name.replace("_", "-")]
        assert field_help()[f.name] and field_help()[f.name] in option.help, f.name
    main(["train", "--timesteps", "64", "--n-envs", "1", "--n-steps", "64", "--batch-size", "32",
          "--learning-rate", "0.001", "--gamma", "0.9", "--hidden", "8", "--no-anneal-lr",
          "--train-devices", "2", "--train-devices", "3", "--max-devices", "3",
          "--train-tables", "4", "6", "--eval-tables", "6", "--eval-devices", "2",
          "--eval-repeats", "1", "--out", str(tmp_path / "run"), "--wandb-mode", "disabled"])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["learning_rate"] == 0.001 and saved["gamma"] == 0.9 and saved["hidden"] == 8
    assert saved["anneal_lr"] is False and saved["train_devices"] == [2, 3]
    assert saved["n_epochs"] == TrainConfig().n_epochs  # untouched fields keep their default


def test_reservations_in_training_need_an_environment_that_models_them() -> None:
    # The batched environment plays tasks without HBM reserved per table: a run that draws
    # TorchRec's reservations is refused there (the config names the field), and so is such a
    # sampler given to the environment directly.
    with pytest.raises(InputError, match="overheads"):
        TrainConfig(overheads=("none", "torchrec"))
    assert TrainConfig(overheads=("none", "torchrec"), vec_env="dummy").overheads == (
        "none", "torchrec")
    with pytest.raises(InputError, match=r"overheads.*nvidia"):
        TrainConfig(overheads=("nvidia",), vec_env="dummy")
    with pytest.raises(InputError, match="overheads"):
        TrainConfig(overheads=(), vec_env="dummy")
    from autoshard.envs.batched import BatchedPlacementEnv

    with pytest.raises(InputError, match="overheads"):
        BatchedPlacementEnv(2, TaskSampler(overheads=("torchrec",)))


@pytest.mark.slow
def test_a_run_with_reservations_trains_and_evaluates_on_both(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="disabled",
                      **{**TINY, "vec_env": "dummy", "overheads": ("none", "torchrec")})  # type: ignore[arg-type]
    result = train(cfg)
    assert result.steps == 256
    names = {r.task for r in result.results}
    assert any(n.endswith("-torchrec") for n in names)
    assert any(not n.endswith("-torchrec") for n in names)


def test_a_filled_reward_needs_an_environment_that_fills() -> None:
    with pytest.raises(InputError, match="fill"):
        TrainConfig(fill=True)  # the batched environment prices the plan as the episode left it
    assert TrainConfig(fill=True, vec_env="dummy").fill
