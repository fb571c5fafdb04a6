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
import re
from pathlib import Path

from autoshard.errors import InputError

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


_OBJECTIVES = ("regression", "regression_l1", "huber", "fair")
_INFO = re.compile(r"none|\[([-+0-9.eE]+):([-+0-9.eE]+)\]")
#: Per tree, the arrays LightGBM writes, with their element type and length (in internal nodes
#: ``n - 1`` or leaves ``n``), in the order it writes them.
_ARRAYS = (("split_feature", int, -1), ("split_gain", float, -1), ("threshold", float, -1),
           ("decision_type", int, -1), ("left_child", int, -1), ("right_child", int, -1),
           ("leaf_value", float, 0), ("leaf_weight", float, 0), ("leaf_count", int, 0),
           ("internal_value", float, -1), ("internal_weight", float, -1),
           ("internal_count", int, -1))
_TREE_KEYS = {"num_leaves", "num_cat", "is_linear", "shrinkage", *(a[0] for a in _ARRAYS)}


def checked_model_text(path: Path, feature_names: tuple[str, ...]) -> str:
    """A LightGBM regression model file, validated and rebuilt (module docstring).

    Only known keys are accepted; every value is parsed and written back canonically, so the
    text LightGBM reads holds nothing that was not checked.

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
    head, *trees = text[: text.index(_END)].split("\nTree=")
    header = _key_values(head, src, "header")
    _expect(header, "version", "v4", src)
    _expect(header, "num_class", "1", src)
    _expect(header, "num_tree_per_iteration", "1", src)
    _expect(header, "label_index", "0", src)
    _expect(header, "max_feature_idx", str(len(feature_names) - 1), src)
    objective = header.get("objective", "").split()
    if not objective or objective[0] not in _OBJECTIVES or any(
            not re.fullmatch(r"(alpha|fair_c):[0-9.eE+-]+", t) for t in objective[1:]):
        raise InputError(f"objective must be one of {', '.join(_OBJECTIVES)}", source=src,
                         field="objective", value=header.get("objective"))
    infos = header.get("feature_infos", "").split()
    if len(infos) != len(feature_names) or not all(_INFO.fullmatch(t) for t in infos):
        raise InputError("malformed", source=src, field="feature_infos", value=infos[:3])
    if not trees:
        raise InputError("model has no trees", source=src, field="Tree")
    blocks = [_tree_text(t, i, len(feature_names), src) for i, t in enumerate(trees)]
    sizes = " ".join(str(len(b)) for b in blocks)
    out_head = ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
                f"max_feature_idx={len(feature_names) - 1}\nobjective={' '.join(objective)}\n"
                f"feature_names={' '.join(feature_names)}\nfeature_infos={' '.join(infos)}\n"
                f"tree_sizes={sizes}\n\n")
    return out_head + "".join(blocks) + _END + "\n\npandas_categorical:null\n"


def _tree_text(block: str, i: int, num_features: int, src: str) -> str:
    """Tree ``i`` parsed, checked and written back canonically (with its trailing blank
    lines, as LightGBM writes it)."""
    first, _, rest = block.partition("\n")
    if first != str(i):
        raise InputError("trees out of order", source=src, field="Tree", value=first[:40])
    v = _key_values(rest, src, f"Tree={i}")
    unknown = sorted(set(v) - _TREE_KEYS)
    if unknown:
        raise InputError("unknown key", source=src, field=f"Tree={i}", value=unknown[0])
    leaves = int(_numbers(v, "num_leaves", 1, int, src, i)[0])
    if not 1 <= leaves <= 1 << 17:
        raise InputError("out of range", source=src, field=f"Tree={i}.num_leaves", value=leaves)
    if v.get("num_cat") != "0" or v.get("is_linear") != "0":
        raise InputError("categorical or linear trees are not used by this model", source=src,
                         field=f"Tree={i}")
    shrinkage = _numbers(v, "shrinkage", 1, float, src, i)[0]
    if leaves == 1:
        leaf = _numbers(v, "leaf_value", 1, float, src, i)[0]
        _check_leaves([leaf], src, i)
        empty = "".join(f"{k}=\n" for k, _, _ in _ARRAYS[:6])
        return (f"Tree={i}\nnum_leaves=1\nnum_cat=0\n{empty}leaf_value={leaf!r}\nleaf_weight=\n"
                "leaf_count=0\ninternal_value=\ninternal_weight=\ninternal_count=\n"
                f"is_linear=0\nshrinkage={shrinkage!r}\n\n\n")
    arrays = {k: _numbers(v, k, leaves + extra, kind, src, i) for k, kind, extra in _ARRAYS}
    _check_leaves(arrays["leaf_value"], src, i)
    if any(not 0 <= f < num_features for f in arrays["split_feature"]):
        raise InputError("feature index out of range", source=src,
                         field=f"Tree={i}.split_feature", value=arrays["split_feature"][:8])
    if any(not 0 <= t < 16 or int(t) & 1 for t in arrays["decision_type"]):
        raise InputError("not a numerical split", source=src,
                         field=f"Tree={i}.decision_type", value=arrays["decision_type"][:8])
    _check_structure(arrays["left_child"], arrays["right_child"], leaves, src, i)
    lines = [f"Tree={i}", f"num_leaves={leaves}", "num_cat=0"]
    lines += [f"{k}=" + " ".join(repr(kind(x)) for x in arrays[k]) for k, kind, _ in _ARRAYS]
    lines += ["is_linear=0", f"shrinkage={shrinkage!r}"]
    return "\n".join(lines) + "\n\n\n"


def _check_leaves(values: list[float], src: str, i: int) -> None:
    if max(abs(x) for x in values) > MAX_LEAF:
        raise InputError(f"leaf value beyond +-{MAX_LEAF:g}", source=src,
                         field=f"Tree={i}.leaf_value", value=max(values, key=abs))


def _key_values(block: str, src: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        if not line or line == "tree":
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[a-z_]+", key) or key in out:
            raise InputError("malformed line", source=src, field=where, value=line[:60])
        out[key] = value
    return out


def _expect(values: dict[str, str], key: str, want: str, src: str) -> None:
    if values.get(key) != want:
        raise InputError(f"expected {want}", source=src, field=key, value=values.get(key))


def _numbers(values: dict[str, str], key: str, count: int, kind: type, src: str,
             tree: int) -> list[float]:
    field = f"Tree={tree}.{key}"
    parts = values.get(key, "").split(" ") if values.get(key) else []
    if len(parts) != count:
        raise InputError(f"expected {count} values", source=src, field=field, value=len(parts))
    try:  # written back canonically, so any spelling Python accepts is harmless
        nums = [kind(p) for p in parts]
    except ValueError as exc:
        raise InputError("not a number", source=src, field=field, value=str(exc)[-40:]) from exc
    if kind is float and not all(math.isfinite(n) for n in nums):
        raise InputError("not finite", source=src, field=field,
                         value=next(n for n in nums if not math.isfinite(n)))
    return nums


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
