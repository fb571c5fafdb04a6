"""Table sets of published recommendation models: a few huge, hot tables among small ones.

Shapes come from public model configurations:

- **DLRM-DCNv2 on Criteo 1TB** (MLPerf Training v3 recommendation benchmark, the TorchRec
  ``torchrec_dlrm`` reference): 26 categorical features hashed into at most 40M rows
  (``num_embeddings_per_feature``), embedding dim 128, multi-hot pooling per feature
  (``multi_hot_sizes``, up to 100 lookups per sample).
- **DLRM on Criteo 1TB, one-hot** (MLPerf Training v1-v2): the same hash sizes and dim 128, one
  lookup per feature per sample.

Neither configuration publishes a row-access distribution. Criteo's categorical values are
heavily skewed; we assume Zipf access with exponent 1.05 for every table (the ``access``
column of every report says so), the same assumption for every sharder.
"""

from __future__ import annotations

from autoshard.errors import InputError
from autoshard.tables import Table

#: Rows per feature (MLPerf DLRM-DCNv2 reference, hash sizes capped at 40M).
CRITEO_1TB_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
                   405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000,
                   590152, 12973, 108, 36)
#: Lookups per sample per feature in DCNv2's synthetic multi-hot Criteo 1TB.
DCNV2_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1,
                 1)
#: Embedding dimension of both models.
CRITEO_DIM = 128
#: Zipf exponent assumed for row access (no published distribution; see the module docstring).
ZIPF_ALPHA = 1.05


def dcnv2_tables() -> tuple[Table, ...]:
    """The 26 tables of DLRM-DCNv2 (MLPerf, Criteo 1TB multi-hot)."""
    return tuple(Table(f"cat{i}", rows=rows, dim=CRITEO_DIM, pooling_factor=float(pool),
                       zipf_alpha=ZIPF_ALPHA)
                 for i, (rows, pool) in enumerate(zip(CRITEO_1TB_ROWS, DCNV2_POOLING,
                                                      strict=True)))


def criteo1tb_tables() -> tuple[Table, ...]:
    """The 26 tables of DLRM on Criteo 1TB (MLPerf, one-hot)."""
    return tuple(Table(f"cat{i}", rows=rows, dim=CRITEO_DIM, zipf_alpha=ZIPF_ALPHA)
                 for i, rows in enumerate(CRITEO_1TB_ROWS))


MODEL_TABLES = {"dcnv2": dcnv2_tables, "criteo1tb": criteo1tb_tables}


def model_tables(name: str) -> tuple[Table, ...]:
    """The table set of a published model by name (see :data:`MODEL_TABLES`)."""
    if name not in MODEL_TABLES:
        raise InputError(f"unknown model (known: {', '.join(MODEL_TABLES)})", field="model",
                         value=name)
    return MODEL_TABLES[name]()
