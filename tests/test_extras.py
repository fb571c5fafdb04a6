"""The core installs and runs without any extra (autoshard/extras.py, pyproject.toml).

The dev environment has every extra installed, so the end-to-end checks run the command line in
a fresh interpreter whose first meta-path finder answers for every optional package as if it
were not installed (``import`` raises ModuleNotFoundError); the wheel itself is installed without
extras by scripts/wheel_smoke.sh.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from test_structure import MODULES

from autoshard import extras
from autoshard.errors import PlannerError
from autoshard.extras import EXTRAS, missing, missing_module_error, pip_command, require
from autoshard.tables import Table, save_tables

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: What the core imports beside the standard library (``yaml`` is pyyaml's module).
CORE_MODULES = {"numpy", "yaml", "typer", "rich", "click", "scipy", "highspy"}
CORE_REQUIREMENTS = {"numpy", "pyyaml", "typer", "rich", "click", "scipy", "highspy"}
OPTIONAL = sorted({m for e in EXTRAS.values() for m in e.modules})
#: What the command-line checks make absent: every extra's modules, and scikit-learn, which no
#: module imports (it was once a dependency).
BLOCKED = frozenset({*OPTIONAL, "sklearn"})
#: Modules that import optional packages as they are imported (the rest import them inside the
#: functions that use them): the learned sharder's network, its environment and its training.
LEARNED_LAYER = ("autoshard.policy.network", "autoshard.envs", "autoshard.training")
#: The torchrec extra's pins (scripts/setup.sh installs the same versions).
TORCHREC_PINS = ["torchrec==1.8.0", "fbgemm-gpu-cpu==1.8.0", "tensordict", "torchmetrics==1.0.3",
                 "tqdm", "pyre-extensions"]
#: What torchrec needs, listed in its extra because setup.sh installs torchrec without its
#: dependencies; autoshard imports none of them.
TORCHREC_NEEDS = {"tensordict", "torchmetrics", "tqdm", "pyre-extensions"}

BLOCKER = """
import sys

class Absent:
    \"\"\"Answers for the optional packages as if they were not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from autoshard.cli import main
main(sys.argv[1:])
"""


def requirement_name(spec: str) -> str:
    """``dask[distributed]>=2024.1`` -> ``dask``, normalised as distribution names are."""
    name = re.match(r"[A-Za-z0-9._-]+", spec)
    assert name is not None, spec
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def without_extras(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``autoshard ARGS`` in a fresh interpreter where no optional package can be imported."""
    code = BLOCKER.format(blocked=repr(BLOCKED))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "COLUMNS": "300"})


# The table of extras and pyproject.toml --------------------------------------------------------

def test_core_dependencies_are_the_core_imports() -> None:
    assert {requirement_name(d) for d in PYPROJECT["dependencies"]} == CORE_REQUIREMENTS


def test_every_extra_is_declared_and_all_holds_every_one_but_torchrec() -> None:
    declared = PYPROJECT["optional-dependencies"]
    assert set(declared) == {*EXTRAS, "all", "dev"}
    assert declared["torchrec"] == TORCHREC_PINS
    (everything,) = declared["all"]
    named = re.fullmatch(r"autoshard\[([a-z,]+)\]", everything)
    assert named is not None and set(named.group(1).split(",")) == set(EXTRAS) - {"torchrec"}
    assert not any(requirement_name(d) == "torch" and "==" in d
                   for deps in declared.values() for d in deps), "torch is pinned by the scripts"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_an_extras_packages_are_those_its_modules_come_from(extra: str) -> None:
    """pyproject's distributions for ``extra`` each provide one of its modules, and each of its
    modules comes from one of them or from what they require (distributed: dask[distributed])."""
    declared = {requirement_name(d) for d in PYPROJECT["optional-dependencies"][extra]}
    providers = metadata.packages_distributions()
    pulled = set(declared)
    for dist in declared:
        try:
            pulled |= {requirement_name(r) for r in metadata.requires(dist) or []}
        except metadata.PackageNotFoundError:
            continue
    installed = [m for m in EXTRAS[extra].modules if m in providers]
    if not installed:
        pytest.skip(f"the {extra} extra is not installed here")
    for module in installed:
        assert {requirement_name(d) for d in providers[module]} & pulled, module
    found = {requirement_name(d) for m in installed for d in providers[m]}
    assert declared - TORCHREC_NEEDS <= found


def test_every_third_party_import_is_core_or_in_an_extra() -> None:
    found: dict[str, str] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and not node.level else [])
            for top in {n.partition(".")[0] for n in names}:
                found.setdefault(top, name)
    third_party = {t: m for t, m in found.items()
                   if t not in sys.stdlib_module_names and t != "autoshard"}
    unowned = {t: m for t, m in third_party.items() if t not in CORE_MODULES
               and not extras.extras_of(t)}
    assert unowned == {}
    assert set(third_party) >= CORE_MODULES  # the check sees the imports it looks for


def _module_level_imports(name: str) -> set[str]:
    """Modules imported when ``name`` is (outside functions; TYPE_CHECKING blocks left out),
    each with its parent packages."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                visit(node.orelse)
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                           for a in node.names]
            for target in targets:
                parts = target.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            for field in ("body", "orelse", "finalbody", "handlers"):  # class bodies run too
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(ast.parse(path.read_text()).body)
    return out


def optional_reached() -> dict[str, set[str]]:
    """For each module, the optional packages its import loads (through every module it
    imports as it is imported)."""
    direct = {n: _module_level_imports(n) for n in MODULES}
    reached: dict[str, set[str]] = {}
    for start in MODULES:
        seen, todo, hits = {start}, [start], set()
        while todo:
            for dep in direct.get(todo.pop(), ()):
                if dep.partition(".")[0] in OPTIONAL:
                    hits.add(dep.partition(".")[0])
                elif dep in MODULES and dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        reached[start] = hits
    return reached


def test_only_the_learned_layer_imports_optional_packages_as_it_is_imported() -> None:
    reached = {n: hits for n, hits in optional_reached().items() if hits}
    outside = {n: hits for n, hits in reached.items() if not n.startswith(LEARNED_LAYER)}
    assert outside == {}
    assert set().union(*reached.values()) <= set(EXTRAS["learned"].modules)
    assert "autoshard.training.train" in reached  # the check sees what it looks for
    for core in ("autoshard.cli", "autoshard.sharders", "autoshard.sharders.recshard",
                 "autoshard.sharders.ppo.sharder", "autoshard.torchrec.export",
                 "autoshard.pricing.evaluator"):
        assert core in MODULES and core not in reached


# require, missing and the error's message -------------------------------------------------------

def test_require_imports_an_installed_module() -> None:
    assert require("matplotlib.pyplot", "plots") is sys.modules["matplotlib.pyplot"]


class _Absent:
    """A meta-path finder answering for ``names`` as if they were not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.fixture
def hide(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Makes top-level packages absent for one test (imported ones are put back after)."""
    def hide_them(*names: str) -> None:
        monkeypatch.setattr(sys, "meta_path", [_Absent(names), *sys.meta_path])
        for name in names:
            monkeypatch.delitem(sys.modules, name, raising=False)
    return hide_them


def test_a_missing_module_names_its_extra_and_the_pip_command(hide: Callable[..., None]
                                                              ) -> None:
    hide("wandb")
    with pytest.raises(PlannerError, match=re.escape(
            "wandb is not installed (it comes with autoshard's 'tracking' extra): "
            "pip install 'autoshard[tracking]', or turn it off")) as caught:
        require("wandb", "tracking", "or turn it off")
    assert caught.value.kind == "missing_extra"
    assert missing("wandb", "tracking") == (
        "wandb is not installed (it comes with autoshard's 'tracking' extra): "
        "pip install 'autoshard[tracking]'")
    assert missing("matplotlib", "plots") is None


def test_require_all_names_every_extra_in_one_command(hide: Callable[..., None]) -> None:
    hide("gymnasium", "sb3_contrib", "datasketches")
    with pytest.raises(PlannerError) as caught:
        extras.require_all({"gymnasium": "learned", "sb3_contrib": "learned",
                            "datasketches": "data", "matplotlib": "plots"})
    assert str(caught.value) == (
        "gymnasium and sb3_contrib are not installed (they come with autoshard's 'learned' "
        "extra); datasketches is not installed (it comes with autoshard's 'data' extra): "
        "pip install 'autoshard[learned,data]'")


def test_an_unknown_module_or_extra_is_the_callers_mistake() -> None:
    with pytest.raises(AssertionError):
        require("torch", "plots")
    with pytest.raises(AssertionError):
        require("json", "nope")


def test_a_module_not_found_is_named_with_every_extra_that_installs_it() -> None:
    torch_missing = ModuleNotFoundError("No module named 'torch'", name="torch")
    arrow_missing = ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")
    assert str(missing_module_error(torch_missing)) == (
        "torch is not installed (autoshard's extras learned, costmodel, data and run each "
        "install it): pip install 'autoshard[learned]'")
    assert str(missing_module_error(arrow_missing)) == (
        "pyarrow is not installed (it comes with autoshard's 'data' extra): "
        "pip install 'autoshard[data]'")
    assert missing_module_error(ModuleNotFoundError("no", name="autoshard.nope")) is None


# The command line with no optional package importable ------------------------------------------

@pytest.fixture
def small_tables(tmp_path: Path) -> Path:
    path = tmp_path / "tables.yaml"
    save_tables(path, [Table("a", 100_000, 64, pooling_factor=4.0, zipf_alpha=1.1),
                       Table("b", 50_000, 32, pooling_factor=2.0),
                       Table("c", 20_000, 16)])
    return path


def test_the_blocker_makes_the_optional_packages_absent(tmp_path: Path) -> None:
    done = without_extras(["synth", "-o", "trace.pt", "--tables", "2", "--batch-size", "8"],
                          tmp_path)
    assert done.returncode == 2, done.stderr
    assert "torch is not installed" in done.stderr and pip_command("data") in done.stderr
    assert not (tmp_path / "trace.pt").exists()


@pytest.mark.slow
def test_the_core_plans_evaluates_and_exports_without_extras(tmp_path: Path,
                                                            small_tables: Path) -> None:
    steps = [
        ["--help"],
        ["sharders"],
        ["hardware", "list"],
        ["plan", "-t", str(small_tables), "--devices", "2", "--hbm-gb", "0.01", "--overhead",
         "none", "-s", "recshard", "--time-limit", "10", "-o", "plan.json"],
        ["plan", "-t", str(small_tables), "--devices", "2", "-s", "random", "-o", "r.yaml"],
        ["plan", "-t", str(small_tables), "--devices", "2", "-s", "size_lookup_greedy",
         "-o", "g.json"],
        ["evaluate", "plan.json", "--json"],
        ["export", "g.json", "-o", "torchrec_plan.json"],
        ["export", "r.yaml", "-o", "torchrec_plan.yaml"],
    ]
    for args in steps:
        done = without_extras(args, tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        if args[-1] == "plan.json":  # HiGHS solved the MILP (highspy is core)
            said = " ".join(done.stdout.split())
            assert "its MILP over the splits it chose solved" in said, done.stdout
        if args[0] == "sharders":
            listing = " ".join(done.stdout.split())
            assert re.search(r"\brecshard\s*│\s*available", listing), listing
            assert pip_command("learned") in listing and pip_command("torchrec") in listing
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["sharder"] == "recshard" and len(plan["placements"]) == 3
    assert json.loads((tmp_path / "torchrec_plan.json").read_text())["kind"] == (
        "torchrec_sharding_plan")
    assert (tmp_path / "torchrec_plan.yaml").is_file()


def test_ppo_without_the_learned_extra_exits_2_naming_it(tmp_path: Path,
                                                         small_tables: Path) -> None:
    done = without_extras(["plan", "-t", str(small_tables), "--devices", "2", "-s", "ppo",
                           "-o", "plan.json"], tmp_path)
    assert done.returncode == 2
    assert "torch is not installed" in done.stderr, done.stderr
    assert pip_command("learned") in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "plan.json").exists()
