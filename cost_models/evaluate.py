"""Held-out comparison of three latency models on microbenchmark data.

The data are split by configuration (all samples of a configuration, inference and training,
fall on one side), and on the same split we fit and score:

- ``lightgbm``: :class:`autoshard.cost_models.model.LightGBMCostModel`;
- ``analytical``: the analytical model's form, bytes moved / bandwidth + a fixed overhead per
  pass, with one effective bandwidth and one overhead fitted to the training split by
  non-negative least squares on relative error (the analytical model's spec-sheet constants
  describe a GPU, not the benchmark machine, so they are refitted for a fair comparison);
- ``mlp``: a small multilayer perceptron on the same features predicting log latency, in the
  style of DreamShard's cost network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.cost_models.features import FEATURE_NAMES
from autoshard.fileio import save_figure

_COL = {name: i for i, name in enumerate(FEATURE_NAMES)}
#: Optimizer state per row, bytes (row-wise Adagrad: one float), as autoshard.tables.Table.
_OPTIMIZER_BYTES = 4.0


def group_split(groups: np.ndarray, test_share: float = 0.2, seed: int = 0) -> np.ndarray:
    """Boolean test mask drawing ``test_share`` of the distinct groups (configurations): at
    least one, and one fewer than all, so both sides hold a group when there are two."""
    unique = np.unique(groups)
    rng = np.random.default_rng(seed)
    n_test = max(1, min(round(test_share * unique.size), unique.size - 1))
    test = rng.choice(unique, size=n_test, replace=False)
    return np.isin(groups, test)


def metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, Any]:
    """MAPE, median and 90th-percentile absolute percentage error, Spearman rank correlation,
    samples.

    A figure that is undefined is None (null in JSON), never NaN, and a ``note`` says why: all
    of them with no samples; Spearman's correlation with fewer than two samples (a one-row CSV
    scored per mode) or when the predictions or the measurements are all equal (no ranking).
    """
    from scipy.stats import spearmanr

    if true.size == 0:
        return {"mape": None, "median_ape": None, "p90_ape": None, "spearman": None,
                "samples": 0, "note": "no samples: every figure undefined"}
    ape = np.abs(pred - true) / true
    out: dict[str, Any] = {
        "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
        "p90_ape": float(np.percentile(ape, 90)), "spearman": None, "samples": int(true.size)}
    if true.size < 2:
        out["note"] = "Spearman undefined: fewer than 2 samples"
    elif np.ptp(pred) == 0 or np.ptp(true) == 0:
        out["note"] = "Spearman undefined: the predictions or the measurements are all equal"
    else:
        out["spearman"] = float(spearmanr(pred, true).statistic)
    return out


def shown(value: float | None, spec: str = ".4f", scale: float = 1.0) -> str:
    """A figure of :func:`metrics` for a report: formatted by ``spec`` (times ``scale``), or
    ``n/a`` when undefined."""
    return "n/a" if value is None else format(value * scale, spec)


@dataclass
class AnalyticalFit:
    """ms = passes x overhead_ms + bytes / bandwidth, fitted to measurements.

    Bytes follow :class:`autoshard.pricing.analytical.AnalyticalCostModel`: per lookup the row (and
    in training the row's gradient read-modify-write and its optimizer state), plus the pooled
    output per pass; without its narrow-row factor, a GPU kernel's lane use that CPU kernels do
    not share.
    """

    overhead_ms: float = 0.0
    ms_per_byte: float = 0.0

    @staticmethod
    def design(X: np.ndarray) -> np.ndarray:
        """[passes, bytes] columns of each partition."""
        lookups = np.exp2(X[:, _COL["log2_lookups"]]) - 1.0
        dim = np.exp2(X[:, _COL["log2_dim"]])
        batch = np.exp2(X[:, _COL["log2_batch"]])
        row = dim * X[:, _COL["bytes_per_element"]]
        train = X[:, _COL["train"]] > 0
        per_lookup = row + np.where(train, 2.0 * row + 2.0 * _OPTIMIZER_BYTES, 0.0)
        passes = np.where(train, 2.0, 1.0)
        tables = X[:, _COL["num_tables"]]
        return np.column_stack([passes, tables * (lookups * per_lookup + passes * batch * row)])

    def fit(self, X: np.ndarray, y: np.ndarray) -> AnalyticalFit:
        from scipy.optimize import nnls

        A = self.design(X)
        coef, _ = nnls(A / y[:, None], np.ones_like(y))
        self.overhead_ms, self.ms_per_byte = float(coef[0]), float(coef[1])
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.design(X) @ np.array([self.overhead_ms, self.ms_per_byte])

    @property
    def bandwidth_gbps(self) -> float:
        return 1e-6 / self.ms_per_byte if self.ms_per_byte > 0 else float("inf")


@dataclass
class MLPFit:
    """Features -> 128 -> 64 -> 1 ReLU network predicting log latency (standardised I/O).

    Args:
        epochs: Passes over the training split.
        batch_size: Minibatch size.
        lr: Adam learning rate.
        seed: Torch seed for initialisation and shuffling.
    """

    epochs: int = 300
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0

    def fit(self, X: np.ndarray, y: np.ndarray) -> MLPFit:
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        torch.manual_seed(self.seed)
        self.mu_, self.sd_ = X.mean(0), X.std(0) + 1e-9
        t = np.log(y)
        self.t_mu_, self.t_sd_ = float(t.mean()), float(t.std() + 1e-9)
        xs = torch.tensor((X - self.mu_) / self.sd_, dtype=torch.float32)
        ts = torch.tensor((t - self.t_mu_) / self.t_sd_, dtype=torch.float32)
        self.net_ = torch.nn.Sequential(
            torch.nn.Linear(X.shape[1], 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
            torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for idx in torch.randperm(len(xs), generator=gen).split(self.batch_size):
                loss = torch.nn.functional.mse_loss(self.net_(xs[idx]).squeeze(1), ts[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            xs = torch.tensor((X - self.mu_) / self.sd_, dtype=torch.float32)
            out = self.net_(xs).squeeze(1).numpy().astype(np.float64)
        return np.exp(out * self.t_sd_ + self.t_mu_)


def compare(X: np.ndarray, y: np.ndarray, groups: np.ndarray, test_share: float = 0.2,
            seed: int = 0, mlp_epochs: int = 300, n_estimators: int = 600) -> dict[str, Any]:
    """Fits the three models on one group split; returns metrics and test predictions."""
    from autoshard.cost_models.model import LightGBMCostModel

    test = group_split(groups, test_share, seed)
    train = ~test
    models: dict[str, Any] = {
        "lightgbm": LightGBMCostModel(n_estimators=n_estimators, random_state=seed),
        "analytical": AnalyticalFit(),
        "mlp": MLPFit(epochs=mlp_epochs, seed=seed),
    }
    preds: dict[str, np.ndarray] = {}
    scores: dict[str, Any] = {}
    for name, model in models.items():
        model.fit(X[train], y[train])
        preds[name] = model.predict(X[test])
        scores[name] = metrics(preds[name], y[test])
        for mode, flag in (("infer", 0), ("train", 1)):
            sel = X[test, _COL["train"]] == flag
            scores[name][mode] = metrics(preds[name][sel], y[test][sel])
    analytical = models["analytical"]
    scores["analytical"]["fitted"] = {"overhead_ms_per_pass": analytical.overhead_ms,
                                      "bandwidth_gbps": analytical.bandwidth_gbps}
    split = {"configurations": int(np.unique(groups).size),
             "test_configurations": int(np.unique(groups[test]).size),
             "train_samples": int(train.sum()), "test_samples": int(test.sum()),
             "test_share": test_share, "seed": seed}
    return {"split": split, "models": scores, "measured": y[test], "predicted": preds}


def repeatability(first: Any, second: Any, stat: str = "p10") -> dict[str, Any]:
    """Disagreement between two measurements of the same configurations (pandas DataFrames),
    as the metrics of the first predicting the second: the floor under any model's error."""
    from autoshard.cost_models.features import dataset

    shared = sorted(set(first["config_id"]) & set(second["config_id"]))
    a = first.set_index("config_id").loc[shared].reset_index()
    b = second.set_index("config_id").loc[shared].reset_index()
    _, ya, _ = dataset(a, stat=stat)
    _, yb, _ = dataset(b, stat=stat)
    return dict(metrics(ya, yb), configurations=len(shared))


def plot(result: dict[str, Any], path: str, title: str) -> None:
    """Predicted-vs-measured scatter (log-log), one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["predicted"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.2), squeeze=False)
    y = result["measured"]
    lo, hi = y.min() / 2, y.max() * 2
    for ax, name in zip(axes[0], names, strict=True):
        m = result["models"][name]
        ax.loglog(y, result["predicted"][name], ".", ms=3, alpha=0.5)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms", ylabel="predicted ms",
               title=f"{name}: MAPE {shown(m['mape'], '.1f', 100)}%, "
                     f"rho {shown(m['spearman'], '.3f')}")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
