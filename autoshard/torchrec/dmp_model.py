"""The models a plan runs in DistributedModelParallel (:mod:`autoshard.torchrec.dmp`), and
their inputs.

- the built-in model (:func:`builtin_model`): an EmbeddingBagCollection of the plan's tables, one
  feature per table named like it, in FP32, under TorchRec's DLRM when the tables share one dim,
  else under an MLP over the concatenated pooled embeddings; a small dense arch either way;
- a user's model: a factory ``MODULE:FACTORY`` returning a module whose
  EmbeddingBagCollections hold exactly the plan's tables, matched by name, each at the plan's
  size (:func:`check_model`);
- inputs (:func:`feature_batches`): each rank's share of every global batch, a table's first
  feature drawing the lookups our runner draws for the table (same seed, or the same trace
  batches), ids passed through a fixed permutation per table as a deployment's id hashing does.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.runner.config import RunConfig
from autoshard.runner.data import global_batches, own_samples, synthetic_batch
from autoshard.tables import Table
from autoshard.torchrec.model_tables import load_factory

#: Dense features of the built-in models (as many as Criteo's), and their hidden layer's width.
DENSE_FEATURES = 13
DENSE_HIDDEN = 32
#: Path of the EmbeddingBagCollection in the built-in models.
BUILTIN_PATH = "sparse_arch.embedding_bag_collection"
#: Seed of the fixed permutation that hashes a table's popularity-ranked ids (as a deployment's
#: id hashing spreads hot rows over a row-split table's blocks).
HASH_SEED = 0x5EED


# --- models -------------------------------------------------------------------------------------

def builtin_name(tables: list[Table] | tuple[Table, ...]) -> str:
    """The built-in model for these tables: TorchRec's DLRM, which needs one embedding dim, or
    an MLP over the concatenated pooled embeddings when the dims differ."""
    if len({t.dim for t in tables}) == 1:
        return "torchrec.models.dlrm.DLRM"
    return "concat-MLP (tables of several dims; TorchRec's DLRM needs one)"


def builtin_model(tables: list[Table], device: Any, meta: bool) -> Any:
    """The built-in model: an EmbeddingBagCollection of ``tables`` (one feature per table,
    named like it, FP32) under a small dense arch, its collection on the meta device if
    ``meta``."""
    import torch
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                  feature_names=[t.name]) for t in tables]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta") if meta else device)
    dims = {t.dim for t in tables}
    if len(dims) == 1:
        return DLRM(ebc, dense_in_features=DENSE_FEATURES,
                    dense_arch_layer_sizes=[DENSE_HIDDEN, dims.pop()],
                    over_arch_layer_sizes=[DENSE_HIDDEN, 1], dense_device=device)
    return _concat_model(ebc, [t.name for t in tables], sum(t.dim for t in tables), device)


def _concat_model(ebc: Any, features: list[str], pooled_dim: int, device: Any) -> Any:
    """Dense MLP, concatenated with the pooled embeddings of ``features`` in that order, then
    an MLP to one logit. The order is the model's own: a sharded collection returns its
    features grouped by sharding and rank, so its ``values()`` are in another order than the
    unsharded collection's."""
    import torch
    from torchrec.modules.mlp import MLP

    class SparseArch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding_bag_collection = ebc

    class ConcatModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse_arch = SparseArch()
            self.dense_arch = MLP(DENSE_FEATURES, [DENSE_HIDDEN], device=device)
            self.over_arch = torch.nn.Sequential(
                MLP(DENSE_HIDDEN + pooled_dim, [DENSE_HIDDEN], device=device),
                torch.nn.Linear(DENSE_HIDDEN, 1, device=device))

        def forward(self, dense: Any, kjt: Any) -> Any:
            pooled = self.sparse_arch.embedding_bag_collection(kjt).to_dict()
            return self.over_arch(torch.cat([self.dense_arch(dense),
                                             *(pooled[f] for f in features)], dim=1))

    return ConcatModel()


def collections(module: Any) -> dict[str, Any]:
    """Every EmbeddingBagCollection of ``module`` by its path."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return {path: m for path, m in module.named_modules()
            if isinstance(m, EmbeddingBagCollection)}


def feature_tables(module: Any) -> dict[str, dict[str, Any]]:
    """Per collection path, its tables: name -> (rows, dim, feature names)."""
    return {path: {c.name: (int(c.num_embeddings), int(c.embedding_dim), list(c.feature_names))
                   for c in ebc.embedding_bag_configs()}
            for path, ebc in collections(module).items()}


def check_model(found: dict[str, dict[str, Any]], tables: list[Table], spec: str) -> None:
    """The model's collections hold exactly the plan's tables, each once, at its size.

    Raises:
        InputError: No collection, a table missing, extra, held twice or of another size.
    """
    if not found:
        raise InputError("the model holds no EmbeddingBagCollection", field="--torchrec-model",
                         value=spec)
    want = {t.name: (t.rows, t.dim) for t in tables}
    seen: dict[str, str] = {}
    for path, held in found.items():
        for name, (rows, dim, _) in held.items():
            if name in seen:
                raise InputError(f"table '{name}' is in two collections ('{seen[name]}' and "
                                 f"'{path}')", field="--torchrec-model", value=spec)
            seen[name] = path
            if name not in want:
                raise InputError(f"table '{name}' of collection '{path}' is not in the plan",
                                 field="--torchrec-model", value=spec)
            if (rows, dim) != want[name]:
                raise InputError(f"table '{name}' is {rows} x {dim} in the model, "
                                 f"{want[name][0]} x {want[name][1]} in the plan",
                                 field="--torchrec-model", value=spec)
    missing = sorted(set(want) - set(seen))
    if missing:
        raise InputError(f"the model lacks the plan's tables {missing[:5]}",
                         field="--torchrec-model", value=spec)


def build_models(spec: dict[str, Any], tables: list[Table], device: Any) -> tuple[Any, Any]:
    """(the unsharded reference on CPU, the module to shard), with the same structure; the
    reference is seeded, so every rank builds the same weights."""
    import torch

    torch.manual_seed(spec["config"]["seed"])
    if spec["model"] is None:
        cpu = torch.device("cpu")
        return builtin_model(tables, cpu, meta=False), builtin_model(tables, device, meta=True)
    reference = load_factory(spec["model"])()
    check_model(feature_tables(reference), tables, spec["model"])
    return reference, copy.deepcopy(reference)


def check_user_model(spec: str, tables: tuple[Table, ...]) -> str:
    """Builds the user's model once here and checks its tables against the plan's; its name.

    Raises:
        InputError: The factory cannot be loaded or fails, or its tables differ from the
            plan's.
    """
    factory = load_factory(spec)
    try:
        module = factory()
    except Exception as exc:  # any error of the user's code
        raise InputError(f"the factory failed ({type(exc).__name__}: {exc})",
                         field="--torchrec-model", value=spec) from exc
    check_model(feature_tables(module), list(tables), spec)
    return f"{spec} ({type(module).__name__})"


# --- batches ------------------------------------------------------------------------------------

@functools.cache
def _hash(position: int, rows: int) -> np.ndarray:
    return np.random.default_rng([HASH_SEED, position]).permutation(rows)


def feature_batches(spec: dict[str, Any], tables: list[Table], features: dict[str, list[str]],
                    rank: int) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The run's distinct batches of every feature for this rank: (ids, lengths) of its own
    block of each global batch.

    A table's first feature gets the global batches our runner draws for the table
    (:func:`autoshard.runner.data.global_batches`: the same seed, or the same trace batches);
    further features of a table draw their own (from the trace: the table's again). Ids are
    popularity ranks passed through a fixed permutation per table (hashed ids).
    """
    config = RunConfig.from_dict(spec["config"])
    local = config.batch_size // spec["world_size"]
    count = min(config.distinct_batches, config.warmup + config.iterations)
    drawn = global_batches(tables, range(len(tables)), config)
    out: list[dict[str, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(count)]
    for position, (t, first) in enumerate(zip(tables, drawn, strict=True)):
        for f, name in enumerate(features[t.name]):
            batches = first
            if f and not config.trace:
                rng = np.random.default_rng([config.seed, position, f])
                batches = [synthetic_batch(t, config.batch_size, rng) for _ in range(count)]
            for i, batch in enumerate(batches):
                mine = own_samples(batch, rank * local, (rank + 1) * local)
                out[i][name] = (_hash(position, t.rows)[mine.indices], mine.lengths)
    return out[:min((len(b) for b in drawn), default=0)]


def to_kjt(batch: dict[str, tuple[np.ndarray, np.ndarray]], keys: list[str], device: Any) -> Any:
    """The batch's ``keys`` as a KeyedJaggedTensor."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ids = np.concatenate([batch[k][0] for k in keys]) if keys else np.zeros(0, np.int64)
    lengths = np.concatenate([batch[k][1] for k in keys]) if keys else np.zeros(0, np.int64)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.from_numpy(ids.astype(np.int64)).to(device),
        lengths=torch.from_numpy(lengths.astype(np.int64)).to(device))


def dense_batch(seed: int, rank: int, index: int, local: int, device: Any) -> tuple[Any, Any]:
    """Dense features and 0/1 labels of one local batch (seeded per rank and batch)."""
    import torch

    rng = np.random.default_rng([seed, 1 << 20, rank, index])
    dense = torch.from_numpy(rng.standard_normal((local, DENSE_FEATURES)).astype(np.float32))
    labels = torch.from_numpy((rng.random(local) < 0.5).astype(np.float32))
    return dense.to(device), labels.to(device)
