"""One-way layers: core autoshard (everything but the command line in autoshard/cli/) never
imports the packages built on it (cost_models, envs, training), not even inside a function.
They plug into core through string entries instead, as the sharders do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "autoshard"
UPPER = ("cost_models", "envs", "training")


def core_modules() -> list[str]:
    """Every Python module of core autoshard, as a path relative to the repository."""
    return sorted(str(p.relative_to(ROOT)) for p in CORE.rglob("*.py")
                  if "cli" not in p.relative_to(CORE).parts[:1])


def upper_imports(path: Path) -> list[str]:
    """``line: module`` for each import of an upper layer anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if name.split(".")[0] in UPPER]
    return found


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import os\n\ndef f():\n    from training.policy import load_policy\n"
                      "    import envs.placement as p\n    from . import training\n")
    assert upper_imports(sample) == ["4: training.policy", "5: envs.placement"]


def test_core_modules_are_found() -> None:
    modules = core_modules()
    assert "autoshard/task.py" in modules and "autoshard/sharders/recshard.py" in modules
    assert not [m for m in modules if m.startswith("autoshard/cli/")]
    assert {"autoshard/cost.py", "autoshard/sharders/ppo.py"} <= set(modules)


@pytest.mark.parametrize("module", core_modules())
def test_core_never_imports_an_upper_layer(module: str) -> None:
    assert upper_imports(ROOT / module) == [], f"{module} imports an upper layer"
