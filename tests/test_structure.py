"""The package's structure, as its design says it is:

- one-way layers: core autoshard (everything but the command line in autoshard/cli/) never
  imports the packages built on it (autoshard.cost_models, .envs, .training) nor the TorchRec
  integration (autoshard.torchrec), not even inside a function; they plug in through the
  registries (sharders, cost models, reservations) by name;
- no import cycle among the package's modules;
- the sharding kinds' names in at most three modules: the kinds module, the TorchRec mapping
  and the plan file's schema;
- one idea per module, so about 800 lines at most (a cap on modules, not a target to split
  at), and no function over 60 lines;
- the installed packages are exactly the package folders.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
#: Installed package name -> folder (envs/, cost_models/, training/ install inside autoshard).
FOLDERS = {"autoshard": ROOT / "autoshard", "autoshard.envs": ROOT / "envs",
           "autoshard.cost_models": ROOT / "cost_models", "autoshard.training": ROOT / "training"}
UPPER = ("autoshard.cost_models", "autoshard.envs", "autoshard.training", "autoshard.torchrec")
KIND_NAMES = ("table_wise", "row_wise", "table_row_wise", "column_wise", "table_column_wise",
              "data_parallel", "grid_shard")
KIND_OWNERS = {"autoshard/layout/kinds.py", "autoshard/torchrec/mapping.py",
               "autoshard/layout/plan.py"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 800, 60


def modules() -> dict[str, Path]:
    """Every module of the installed package by dotted name (a package by its own name)."""
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "autoshard" and parts and parts[0] in ("envs", "cost_models"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


MODULES = modules()


def imported(path: Path, name: str) -> list[tuple[int, str]]:
    """(line, module) of each import anywhere in the file (inside functions too), relative
    imports resolved against the module's ``name``; ``from a import b`` gives ``a.b`` where
    that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.append((node.lineno, whole if whole in MODULES else base))
    return found


def core_modules() -> list[str]:
    """Core autoshard: every module under autoshard/ but the command line, the TorchRec
    integration and the packages built on the core."""
    return sorted(n for n in MODULES if not n.startswith(("autoshard.cli", *UPPER)))


def cycles() -> list[list[str]]:
    """Import cycles among the package's modules (each as a path of module names)."""
    graph = {n: sorted({m for _, m in imported(p, n) if m in MODULES and m != n})
             for n, p in MODULES.items()}
    found, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state[nxt] == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif state[nxt] == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in graph:
        if state[start] == 0:
            visit(start, [start])
    return found


def kind_mentions(path: Path) -> list[str]:
    """``line: text`` of each code mention of a sharding kind's name: a string (docstrings
    aside) holding it as a word, or a name or attribute spelled as its constant."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    words = re.compile(r"\b(" + "|".join(KIND_NAMES) + r")\b")
    constants = {k.upper() for k in KIND_NAMES}
    out = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and words.search(node.value):
                text = node.value
        elif isinstance(node, ast.Name) and node.id in constants:
            text = node.id
        elif isinstance(node, ast.Attribute) and node.attr in constants:
            text = node.attr
        if text is not None:
            out.append(f"{node.lineno}: {text[:60]}")
    return out


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text('"""row_wise in a docstring is prose."""\nimport os\n\n\ndef f():\n'
                      "    from autoshard.training.train import train\n"
                      "    return 'row_wise' if ShardingKind.COLUMN_WISE else os\n")
    assert imported(sample, "autoshard.m") == [(2, "os"), (6, "autoshard.training.train")]
    assert sorted(kind_mentions(sample)) == ["7: COLUMN_WISE", "7: row_wise"]


def test_the_module_list_is_the_package() -> None:
    assert {"autoshard.task", "autoshard.sharders.recshard", "autoshard.envs.placement",
            "autoshard.training.train", "autoshard.cost_models.model"} <= set(MODULES)
    assert "autoshard.cli.core_cmds" not in core_modules()
    assert "autoshard.torchrec.export" not in core_modules()


@pytest.mark.parametrize("module", core_modules())
def test_core_never_imports_an_upper_layer(module: str) -> None:
    bad = [f"{line}: {name}" for line, name in imported(MODULES[module], module)
           if name.startswith(UPPER)]
    assert bad == [], f"{module} imports {bad}"


def test_no_import_cycle() -> None:
    assert cycles() == []


def test_kind_names_live_in_three_modules_at_most() -> None:
    named = {str(p.relative_to(ROOT)): kind_mentions(p) for p in MODULES.values()}
    named = {m: found for m, found in named.items() if found}
    assert set(named) <= KIND_OWNERS, {m: f for m, f in named.items() if m not in KIND_OWNERS}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_are_short(module: str) -> None:
    path = MODULES[module]
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_installed_packages_are_the_package_folders() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {n for n, p in MODULES.items() if p.name == "__init__.py"}
    assert set(setuptools["packages"]) == folders
    assert {k: ROOT / v for k, v in setuptools["package-dir"].items()} == {
        k: v for k, v in FOLDERS.items() if k != "autoshard"}
