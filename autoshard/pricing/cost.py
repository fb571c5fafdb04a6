"""The one cost-model interface every pricing in autoshard goes through, and its registry.

Cost models are found by name: ``analytical`` (:mod:`autoshard.pricing.analytical`), ``torchrec``
(TorchRec's own perf estimator, :mod:`autoshard.torchrec.cost`; needs the torchrec extra), or
the folder of a learned model, whose metadata names its kind
(:mod:`autoshard.cost_models`). Entries are ``module:Class`` strings, imported only when a
model is loaded, so that the core imports none of the packages built on it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from autoshard.errors import InputError
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class Pricing:
    """Cost of placing tables on devices, one entry per queried (table, device, split) row, ms.

    Args:
        hbm_ms: Embedding work served from HBM (including fixed kernel overhead).
        uvm_ms: Embedding work served from host memory over the host link.
        comm_ms: The table's share of the device's all-to-all communication.
    """

    hbm_ms: np.ndarray
    uvm_ms: np.ndarray
    comm_ms: np.ndarray

    @property
    def compute_ms(self) -> np.ndarray:
        return self.hbm_ms + self.uvm_ms

    @property
    def total_ms(self) -> np.ndarray:
        return self.hbm_ms + self.uvm_ms + self.comm_ms


@runtime_checkable
class CostModel(Protocol):
    """Prices (table, device, HBM rows) rows of a task, vectorised.

    A device's step cost is the sum of its tables' prices; a plan's step cost is the maximum over
    devices. Implementations: :class:`autoshard.pricing.analytical.AnalyticalCostModel` and the
    learned LightGBM model in ``cost_models``.
    """

    name: str

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        """Prices each row: table ``table_idx[i]`` on device ``device_idx[i]`` with its
        ``hbm_rows[i]`` hottest rows in HBM and the rest in host memory."""
        ...


def prices_device_sets(model: CostModel) -> bool:
    """Whether ``model`` prices a device's whole table set (a ``device_compute_ms`` method, see
    :func:`device_compute`) rather than only each table on its own."""
    return callable(getattr(model, "device_compute_ms", None))


def device_compute(task: ShardingTask, model: CostModel, device: np.ndarray,
                   hbm_rows: np.ndarray, hbm_ms: np.ndarray, uvm_ms: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per-device compute by tier ([D] each) of a placement given in task order.

    ``hbm_ms`` and ``uvm_ms`` are the sums of the tables' prices per device. A model that prices
    a device's whole table set (an optional ``device_compute_ms(task, table_idx, device_idx,
    hbm_rows) -> [D]`` method, e.g. the set model in ``cost_models``) replaces their total,
    split between the tiers in the sums' proportion; for other models they are returned as is.
    """
    if not prices_device_sets(model):
        return hbm_ms, uvm_ms
    total = np.asarray(model.device_compute_ms(  # type: ignore[attr-defined]
        task, np.arange(task.num_tables), device, hbm_rows))
    summed = hbm_ms + uvm_ms
    share = np.divide(hbm_ms, summed, out=np.ones_like(summed), where=summed > 0)
    return total * share, total * (1.0 - share)


#: Built-in cost models by name. A class may say why it cannot run here (``unavailable()``).
_BUILTIN: dict[str, str] = {
    "analytical": "autoshard.pricing.analytical:AnalyticalCostModel",
    "torchrec": "autoshard.torchrec.cost:TorchRecCostModel",
}
#: Learned cost models by the ``kind`` their folder's metadata names. The class's
#: ``load(directory, communication=...)`` reads and verifies the folder.
_LEARNED: dict[str, str] = {
    "lightgbm": "autoshard.cost_models.model:LightGBMCostModel",
    "calibrated": "autoshard.cost_models.calibrate:CalibratedCostModel",
    "set": "autoshard.cost_models.set_model:SetCostModel",
}
#: Model folders written before metadata named a kind give their format instead.
_FORMAT_KINDS = {"autoshard-lightgbm-cost-model": "lightgbm"}
METADATA_FILE = "metadata.json"


def learned_kinds() -> list[str]:
    return list(_LEARNED)


def read_model_metadata(directory: str | Path) -> dict[str, Any]:
    """The JSON metadata of a learned-model folder, with its ``kind`` resolved.

    Raises:
        InputError: no folder, no or malformed metadata, an unknown kind.
    """
    src = Path(directory)
    path = src / METADATA_FILE
    if not src.is_dir():
        raise InputError("cost model must be 'analytical' or a model directory",
                         field="cost_model", value=str(directory))
    if not path.is_file():
        raise InputError("cost-model file missing", source=str(src), field=METADATA_FILE)
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid JSON ({exc})", source=str(path)) from exc
    if not isinstance(meta, dict):
        raise InputError("must be a JSON object", source=str(path))
    kind = meta.get("kind", _FORMAT_KINDS.get(str(meta.get("format"))))
    if kind not in _LEARNED:
        raise InputError(f"unknown cost-model kind (known: {', '.join(_LEARNED)})",
                         source=str(path), field="kind", value=kind)
    meta["kind"] = kind
    return meta


def builtin_model(spec: str | None) -> str | None:
    """The built-in cost model ``spec`` names (``analytical`` also for None or empty; another
    built-in name unless a folder of that name exists), or None for a learned model's folder."""
    if spec in (None, "", "analytical"):
        return "analytical"
    if spec in _BUILTIN and not Path(spec).exists():
        return spec
    return None


def builtin_names() -> list[str]:
    return list(_BUILTIN)


def _class(entry: str, spec: str | None) -> Any:
    """The class an entry names, imported now.

    Raises:
        InputError: It cannot be imported here (a missing dependency), naming ``spec``.
    """
    module, _, attr = entry.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cost model unavailable ({exc})", field="cost_model",
                         value=spec) from exc


def model_identity(spec: str | None) -> str:
    """What a cost model is, for resuming comparisons and for a plan's context: ``analytical``,
    ``torchrec@<version>`` (TorchRec's estimator), or a learned model's resolved folder and the
    SHA-256 (first 16 hex digits) of the names and contents of the files in it."""
    builtin = builtin_model(spec)
    if builtin == "analytical":
        return "analytical"
    if builtin == "torchrec":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"torchrec@{version('torchrec')}"
        except PackageNotFoundError:
            return "torchrec"
    assert spec is not None  # None is the analytical model
    folder = Path(spec).resolve()
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return f"{folder}@sha256:{digest.hexdigest()[:16]}"


def spec_of(identity: str) -> str:
    """The cost-model spec :func:`load_cost_model` takes for a :func:`model_identity`."""
    if "@sha256:" in identity:
        return identity.rpartition("@sha256:")[0]
    return identity.partition("@")[0]


def is_model_spec(spec: str) -> bool:
    """Whether ``spec`` names a built-in cost model or a folder with a model's metadata (a
    cheap check, before a model is loaded)."""
    return builtin_model(spec) is not None or (Path(spec) / METADATA_FILE).is_file()


def load_cost_model(spec: str | None) -> CostModel:
    """``analytical`` (or None) for the analytical model, ``torchrec`` for TorchRec's own perf
    estimator (:mod:`autoshard.torchrec.cost`; needs the torchrec extra), else a learned
    model's directory.

    A learned model's metadata names its ``kind`` (resolved through :data:`_LEARNED`) and the
    model that prices its communication (``communication``, default ``analytical``); the model
    verifies its files before use.

    Raises:
        InputError: unknown spec, a damaged or unverifiable model, a missing dependency.
    """
    builtin = builtin_model(spec)
    if builtin is not None:
        cls = _class(_BUILTIN[builtin], spec)
        check = getattr(cls, "unavailable", None)
        if check is not None and (reason := check()):
            raise InputError(f"cost model '{builtin}' is unavailable: {reason}",
                             field="cost_model", value=spec)
        built: CostModel = cls()
        return built
    assert spec is not None
    meta = read_model_metadata(spec)
    comm_spec = meta.get("communication", "analytical")
    if comm_spec != "analytical":
        raise InputError("only 'analytical' communication is known", field="communication",
                         source=str(Path(spec) / METADATA_FILE), value=comm_spec)
    cls = _class(_LEARNED[meta["kind"]], spec)
    model: CostModel = cls.load(spec, communication=load_cost_model("analytical"))
    return model


def machine_warning(model: CostModel) -> str | None:
    """A warning when a learned model was measured on another machine than this one (or on one
    it did not record); None for models that describe no machine (the analytical model)."""
    from autoshard.machine import machine_record, same_machine

    if not hasattr(model, "machine"):
        return None
    recorded = model.machine
    here = machine_record()
    if same_machine(recorded, here):
        return None
    return (f"cost model '{model.name}' was measured on {_recorded_machine(recorded)}; this "
            f"machine is {here['cpu_model']} (fingerprint {here['fingerprint']}): its latencies "
            "are that machine's; `autoshard cost-model calibrate MODEL` fits it to this one")


def _recorded_machine(recorded: object) -> str:
    """The machine a model records, in words; a field it lacks is said to be unrecorded."""
    if not isinstance(recorded, dict):
        return "a machine it did not record"
    cpu = recorded.get("cpu_model") or "a machine whose CPU it did not record"
    if recorded.get("fingerprint"):
        return f"{cpu} (fingerprint {recorded['fingerprint']}), not on this machine"
    return f"{cpu}, with no fingerprint recorded to tell that machine from this one"
