"""Checkpoints a resumed run continues from, without unpickling: the policy's and the
optimizer's state dicts as tensors (``last.pt``, read with ``torch.load(weights_only=True)``)
and the run state as JSON (``state.json``), which holds the SHA-256 of ``last.pt``; the digest
is checked before anything is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text

WEIGHTS, STATE = "last.pt", "state.json"


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
    tmp = folder / (WEIGHTS + ".tmp")
    torch.save({"policy": model.policy.state_dict(),
                "optimizer": model.policy.optimizer.state_dict()}, tmp)
    os.replace(tmp, folder / WEIGHTS)
    doc = {"num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
           "sha256": sha256(folder / WEIGHTS), **state}
    atomic_write_text(folder / STATE, json.dumps(doc, indent=1) + "\n")


def read_state(folder: Path) -> dict[str, Any]:
    """The run state of ``folder``'s checkpoint (InputError if missing or not JSON)."""
    path = folder / STATE
    if not path.is_file() or not (folder / WEIGHTS).is_file():
        raise InputError("nothing to resume: no checkpoint", source=str(folder))
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON ({exc})", source=str(path)) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), str):
        raise InputError("checkpoint state without a digest", source=str(path), field="sha256")
    return doc


def load_checkpoint(model: Any, folder: Path) -> dict[str, Any]:
    """Restores ``model``'s policy, optimizer and counters from ``folder``; returns the state.

    Raises:
        InputError: ``last.pt`` does not match the digest in ``state.json``, or holds anything
            but plain tensors and containers (nothing is unpickled).
    """
    doc = read_state(folder)
    weights = folder / WEIGHTS
    if sha256(weights) != doc["sha256"]:
        raise InputError("checkpoint does not match the digest recorded with it",
                         source=str(weights), field="sha256")
    try:
        saved = torch.load(weights, map_location="cpu", weights_only=True)
        model.policy.load_state_dict(saved["policy"])
        model.policy.optimizer.load_state_dict(saved["optimizer"])
    except pickle.UnpicklingError as exc:  # something other than tensors and containers
        raise InputError(f"refused: not plain tensors ({str(exc)[:200]})",
                         source=str(weights)) from exc
    except (RuntimeError, KeyError, TypeError, ValueError, EOFError, OSError) as exc:
        raise InputError(f"not a checkpoint of this policy ({str(exc)[:200]})",
                         source=str(weights)) from exc
    model.num_timesteps = int(doc["num_timesteps"])
    model._n_updates = int(doc.get("n_updates", 0))
    return doc
