"""Experiment tracking with Weights & Biases (offline by default; never needs an account), and a
reader for offline run files.

wandb is imported only when tracking is on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autoshard.tracking import Tracker
from autoshard.training.config import TrainConfig

__all__ = ["Tracker", "offline_history", "offline_records", "training_tracker"]


def training_tracker(cfg: TrainConfig, run_dir: Path, name: str) -> Tracker:
    """The tracker of a training run: ``cfg.wandb_mode``, the whole config, under ``run_dir``."""
    return Tracker(cfg.wandb_mode, run_dir, name, cfg.to_dict(), cfg.wandb_project, "train")


_BLOCK, _HEADER = 32768, 7


def offline_records(path: str | Path) -> Iterator[Any]:
    """The protobuf records of an offline W&B run file (``run-<id>.wandb``).

    The file is a ``:W&B`` header followed by a LevelDB-style log: 32 KiB blocks of records, each
    with a 7-byte header (checksum, length, type: full, first, middle, last).
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, buf = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(buf + chunk if kind == 4 else chunk)
            yield record
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        else:  # zero padding to the end of the block
            pos += left - _HEADER - length


def offline_history(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, str]],
                                                   dict[str, str]]:
    """(config, history rows, summary) of the one offline run under ``run_dir/wandb``; values
    are the JSON strings W&B stored."""
    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    if len(files) != 1:
        raise FileNotFoundError(f"expected one offline W&B run under {run_dir}, found "
                                f"{len(files)}")
    config: dict[str, Any] = {}
    history: list[dict[str, str]] = []
    summary: dict[str, str] = {}
    for record in offline_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({u.key: u.value_json for u in record.run.config.update})
        elif kind == "config":
            config.update({u.key: u.value_json for u in record.config.update})
        elif kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): i.value_json
                            for i in record.history.item})
        elif kind == "summary":
            summary.update({u.key: u.value_json for u in record.summary.update if u.key})
    return config, history, summary
