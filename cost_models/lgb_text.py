"""Learned-model files checked before LightGBM sees them.

LightGBM's text loader trusts its input: a truncated ``model.txt`` crashes the process
(segmentation fault), other edits abort it, and an edited leaf value can turn predictions into
NaN. So a model file is accepted only when

- its SHA-256 equals the digest recorded in the model's metadata (:func:`verify_digest`), and
- it parses as the regression-tree model this package writes (:func:`checked_model_text`): one
  class, the expected feature count, every tree's arrays of the right lengths with children in
  range and every number finite, and ``tree_sizes`` equal to the trees' real sizes.

The checked text is rebuilt from the validated header and trees only (the free-form trailer of
parameters is dropped), so LightGBM parses nothing that was not checked.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from autoshard.errors import InputError

_INT_ARRAYS = ("split_feature", "decision_type", "left_child", "right_child")
_END = "end of trees"
#: Largest |leaf value| accepted: trees learn log latency per byte, a few tens at most.
MAX_LEAF = 1e3


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def verify_digest(path: Path, expected: object, source: str) -> None:
    """Raises InputError unless ``path`` hashes to ``expected`` (as :func:`file_digest`)."""
    if not isinstance(expected, str) or not expected.startswith("sha256:"):
        raise InputError("metadata records no model digest (refit or re-save the model)",
                         source=source, field="model_sha256", value=expected)
    got = file_digest(path)
    if got != expected:
        raise InputError(f"{path.name} does not match the digest in the metadata (damaged or "
                         f"edited: its digest is {got})", source=source, field="model_sha256",
                         value=expected)


def checked_model_text(path: Path, num_features: int) -> str:
    """The text of a LightGBM regression model file, validated and rebuilt (module docstring).

    Raises:
        InputError: naming the file, the field (tree and array) and the bad value.
    """
    src = str(path)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"unreadable model file ({exc})", source=src) from exc
    if _END not in text:
        raise InputError("truncated LightGBM model (no 'end of trees')", source=src,
                         field="end of trees")
    body = text[: text.index(_END)]
    head, *trees = body.split("Tree=")
    header = _key_values(head, src, "header")
    _expect(header, "version", "v4", src)
    _expect(header, "num_class", "1", src)
    _expect(header, "num_tree_per_iteration", "1", src)
    _expect(header, "max_feature_idx", str(num_features - 1), src)
    if not trees:
        raise InputError("model has no trees", source=src, field="Tree")
    sizes = header.get("tree_sizes", "").split()
    blocks = ["Tree=" + t for t in trees]
    real = [len(b.encode()) for b in blocks]
    if [str(s) for s in real] != sizes:
        raise InputError("tree_sizes do not match the trees in the file", source=src,
                         field="tree_sizes", value=" ".join(sizes[:5]))
    for i, block in enumerate(blocks):
        _check_tree(block, i, num_features, src)
    return head + "".join(blocks) + _END + "\n\npandas_categorical:null\n"


def _key_values(block: str, src: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        if not line or line == "tree":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InputError("malformed line", source=src, field=where, value=line[:60])
        out[key] = value
    return out


def _expect(values: dict[str, str], key: str, want: str, src: str) -> None:
    if values.get(key) != want:
        raise InputError(f"expected {want}", source=src, field=key, value=values.get(key))


def _numbers(values: dict[str, str], key: str, count: int, kind: type, src: str,
             tree: int) -> list[float]:
    field = f"Tree={tree}.{key}"
    parts = values.get(key, "").split()
    if len(parts) != count:
        raise InputError(f"expected {count} values", source=src, field=field, value=len(parts))
    try:
        nums = [kind(p) for p in parts]
    except ValueError as exc:
        raise InputError("not a number", source=src, field=field, value=str(exc)[:60]) from exc
    bad = next((n for n in nums if not math.isfinite(n)), None)
    if bad is not None:
        raise InputError("not finite", source=src, field=field, value=bad)
    return nums


def _check_tree(block: str, i: int, num_features: int, src: str) -> None:
    first, _, rest = block.partition("\n")
    if first != f"Tree={i}":
        raise InputError("trees out of order", source=src, field="Tree", value=first[:40])
    v = _key_values(rest, src, f"Tree={i}")
    leaves = int(_numbers(v, "num_leaves", 1, int, src, i)[0])
    if leaves < 1:
        raise InputError("must be >= 1", source=src, field=f"Tree={i}.num_leaves", value=leaves)
    if v.get("num_cat", "0") != "0" or v.get("is_linear", "0") != "0":
        raise InputError("categorical or linear trees are not used by this model", source=src,
                         field=f"Tree={i}")
    values = _numbers(v, "leaf_value", leaves, float, src, i)
    if max(abs(x) for x in values) > MAX_LEAF:
        raise InputError(f"leaf value beyond +-{MAX_LEAF:g}", source=src,
                         field=f"Tree={i}.leaf_value", value=max(values, key=abs))
    _numbers(v, "shrinkage", 1, float, src, i)
    if leaves == 1:
        return
    arrays = {k: _numbers(v, k, leaves - 1, int, src, i) for k in _INT_ARRAYS}
    _numbers(v, "threshold", leaves - 1, float, src, i)
    if any(not 0 <= f < num_features for f in arrays["split_feature"]):
        raise InputError("feature index out of range", source=src,
                         field=f"Tree={i}.split_feature", value=arrays["split_feature"][:8])
    _check_structure(arrays["left_child"], arrays["right_child"], leaves, src, i)


def _check_structure(left: list[float], right: list[float], leaves: int, src: str,
                     i: int) -> None:
    """Every node reached exactly once from the root: a tree, no cycles, nothing out of range."""
    seen_nodes, seen_leaves, stack = {0}, set(), [0]
    while stack:
        node = stack.pop()
        for child in (int(left[node]), int(right[node])):
            if child >= 0:
                if child >= leaves - 1 or child in seen_nodes:
                    raise InputError("not a tree (child out of range or reached twice)",
                                     source=src, field=f"Tree={i}.left_child", value=child)
                seen_nodes.add(child)
                stack.append(child)
            else:
                leaf = ~child
                if leaf >= leaves or leaf in seen_leaves:
                    raise InputError("not a tree (leaf out of range or reached twice)",
                                     source=src, field=f"Tree={i}.left_child", value=child)
                seen_leaves.add(leaf)
    if len(seen_nodes) != leaves - 1 or len(seen_leaves) != leaves:
        raise InputError("not a tree (unreached nodes)", source=src, field=f"Tree={i}")
