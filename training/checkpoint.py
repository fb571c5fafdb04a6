"""Checkpoints a resumed run continues from, without unpickling: the policy's and the
optimizer's state dicts as tensors (``last.pt``, read with ``torch.load(weights_only=True)``)
and the run state as JSON (``state.json``), which holds the SHA-256 of ``last.pt``.

Before anything is restored, the digest is checked, every field of ``state.json`` is checked
against its range, and the tensors must be exactly those of the model being resumed: the same
keys and shapes, every value finite (a digest only proves the two files belong together, not
that they are sound). SB3's own save format (a zip of pickles) is never written or read.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import torch

from autoshard.errors import InputError
from autoshard.fileio import (
    atomic_write_text,
    check_finite,
    json_text,
    read_structured,
    write_output,
)
from autoshard.limits import Range, number_in
from autoshard.policy.network import allowed_bytes, check_state_dict, read_tensors
from autoshard.training.config import MAX_STEPS

WEIGHTS, STATE = "last.pt", "state.json"
#: Steps a checkpoint may record: a run's whole-rollout overshoot past the largest
#: ``timesteps`` included.
MAX_CHECKPOINT_STEPS = 2 * MAX_STEPS
#: Adam's state per parameter: the step count and the two moment estimates.
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(model: Any, folder: Path, state: dict[str, Any]) -> None:
    """Writes ``last.pt`` (policy and optimizer tensors), then ``state.json`` (``state``, the
    step and update counts and the digest of ``last.pt``), each atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"policy": model.policy.state_dict(),
               "optimizer": model.policy.optimizer.state_dict()}
    write_output(folder / WEIGHTS, lambda fh: torch.save(tensors, fh))
    doc = {"num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
           "sha256": sha256(folder / WEIGHTS), **state}
    atomic_write_text(folder / STATE, json_text(doc, indent=1, source=str(folder / STATE)))


def read_state(folder: Path) -> dict[str, Any]:
    """The run state of ``folder``'s checkpoint, its counters and digest checked.

    Raises:
        InputError: No checkpoint, a ``state.json`` that is not strict JSON, or a counter or
            digest of the wrong type or out of range (naming the field).
    """
    path = folder / STATE
    if not path.is_file() or not (folder / WEIGHTS).is_file():
        raise InputError("nothing to resume: no checkpoint", source=str(folder))
    doc = read_structured(path)
    check_finite(doc, str(path))
    if not isinstance(doc, dict):
        raise InputError("expected a mapping of checkpoint fields", source=str(path))
    if not isinstance(doc.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", doc["sha256"]):
        raise InputError("checkpoint state without a SHA-256 digest (64 hex digits)",
                         source=str(path), field="sha256", value=doc.get("sha256"))
    for name, high in (("num_timesteps", MAX_CHECKPOINT_STEPS), ("n_updates", MAX_STEPS)):
        value = doc.get(name, 0 if name == "n_updates" else None)
        Range(0, high, integer=True).check(value, name, str(path))
    if not isinstance(doc.get("run_name", ""), str):
        raise InputError("must be text", source=str(path), field="run_name",
                         value=doc["run_name"])
    return doc


def load_checkpoint(model: Any, folder: Path) -> dict[str, Any]:
    """Restores ``model``'s policy, optimizer and counters from ``folder``; returns the state.

    Raises:
        InputError: ``last.pt`` does not match the digest in ``state.json``, holds anything
            but plain tensors and containers (nothing is unpickled), or tensors that are not
            this model's (keys, shapes) or not finite; naming the file and the field.
    """
    doc = read_state(folder)
    weights = folder / WEIGHTS
    if sha256(weights) != doc["sha256"]:
        raise InputError("checkpoint does not match the digest recorded with it",
                         source=str(weights), field="sha256")
    policy, optimizer = model.policy.state_dict(), model.policy.optimizer.state_dict()
    saved = read_tensors(weights, 4 * allowed_bytes(policy))  # weights and Adam's two moments
    if not isinstance(saved, dict) or set(saved) != {"policy", "optimizer"}:
        raise InputError("expected the policy's and the optimizer's state dicts",
                         source=str(weights))
    check_state_dict(saved["policy"], policy, str(weights), prefix="policy.")
    check_optimizer_state(saved["optimizer"], optimizer, model.policy.optimizer, str(weights))
    model.policy.load_state_dict(saved["policy"])
    model.policy.optimizer.load_state_dict(saved["optimizer"])
    model.num_timesteps = doc["num_timesteps"]
    model._n_updates = doc.get("n_updates", 0)
    return doc


def check_optimizer_state(saved: Any, fresh: dict[str, Any], optimizer: Any,
                          source: str) -> None:
    """Fails unless ``saved`` is an Adam state dict of ``optimizer``'s parameters: the same
    settings as the run's own (``fresh``; only the step size may differ, a schedule sets it)
    and, per parameter, a finite step count and moments of its shape (the second >= 0).

    Raises:
        InputError: Naming the field (``optimizer.param_groups[0].eps``, ...).
    """
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        raise InputError("expected an optimizer state dict", source=source, field="optimizer")
    groups = saved["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(fresh["param_groups"]):
        raise InputError("other parameter groups than this run's", source=source,
                         field="optimizer.param_groups")
    for i, (group, own) in enumerate(zip(groups, fresh["param_groups"], strict=True)):
        bad = ([k for k in own if k != "lr" and (k not in group or group[k] != own[k])]
               if isinstance(group, dict) and set(group) == set(own) else ["(keys)"])
        if bad or not number_in(group.get("lr"), 0, 1):
            raise InputError("differs from this run's optimizer settings", source=source,
                             field=f"optimizer.param_groups[{i}].{(bad or ['lr'])[0]}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = saved["state"]
    if not isinstance(state, dict) or not set(state) <= set(range(len(params))):
        raise InputError("state of parameters this run does not have", source=source,
                         field="optimizer.state")
    for index, entry in state.items():
        _check_adam_entry(entry, params[index], source, f"optimizer.state[{index}]")


def _check_adam_entry(entry: Any, param: torch.Tensor, source: str, field: str) -> None:
    """One parameter's Adam state: a finite step count >= 0 and finite moments of the
    parameter's shape, the second >= 0."""
    if not isinstance(entry, dict) or set(entry) != set(ADAM_STATE):
        raise InputError(f"expected {', '.join(ADAM_STATE)}", source=source, field=field)
    shapes = {"step": torch.Size([]), "exp_avg": param.shape, "exp_avg_sq": param.shape}
    for key, shape in shapes.items():
        value = entry[key]
        if (not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point
                or value.shape != shape):
            raise InputError(f"expected a floating-point tensor of shape {list(shape)}",
                             source=source, field=f"{field}.{key}")
        floor = -torch.inf if key == "exp_avg" else 0.0
        if not bool((torch.isfinite(value) & (value >= floor)).all()):
            raise InputError("holds NaN, infinite or negative values", source=source,
                             field=f"{field}.{key}")
