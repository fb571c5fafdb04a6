"""Experiment tracking with Weights & Biases (offline by default; never needs an account), and a
reader for offline run files.

wandb is imported only when tracking is on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training.config import TrainConfig


class Tracker:
    """Logs a run to W&B in ``cfg.wandb_mode``; every method is a no-op when disabled.

    Args:
        cfg: The run's configuration (logged in full).
        run_dir: The run folder; W&B writes under ``run_dir/wandb``.
        name: The run's display name.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, name: str) -> None:
        self.run: Any = None
        self.name = name
        if cfg.wandb_mode == "disabled":
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_DIR"] = str(run_dir)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        mode: Any = cfg.wandb_mode
        settings = wandb.Settings(console="off", x_disable_stats=True)
        self.run = wandb.init(project=cfg.wandb_project, name=name, dir=str(run_dir), mode=mode,
                              config=cfg.to_dict(), settings=settings)

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=list[Any](columns), data=rows)}, step=step)

    def image(self, key: str, path: Path, step: int) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path))}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            for k, v in values.items():
                self.run.summary[k] = v

    def finish(self) -> None:
        if self.run is not None:
            import wandb

            self.run.finish()
            self.run = None
            wandb.teardown()  # stops the W&B service, which flushes the run files


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
