"""The committed policy and cost model ship in the wheel; the ppo sharder takes a policy folder
of its own and is available whenever that folder is, wherever the default one is."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cli_helpers import run_cli as run

import autoshard
import autoshard.sharders.ppo.sharder as ppo
from autoshard.errors import InputError
from autoshard.extras import EXTRAS
from autoshard.sharders import get_sharder, sharder_info
from autoshard.tables import Table, save_tables

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = Path(autoshard.__file__).resolve().parent / "data" / "ppo_policy"


@pytest.fixture
def no_default_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default policy folder made missing (as in an install without it); returns a copy
    of the shipped policy elsewhere."""
    own = tmp_path / "my-policy"
    shutil.copytree(SHIPPED, own)
    monkeypatch.setattr(ppo, "DEFAULT_POLICY", tmp_path / "absent")
    return own


def test_policy_given_is_used_when_the_default_is_missing(no_default_policy: Path) -> None:
    assert sharder_info("ppo").unavailable is not None
    assert sharder_info("ppo", policy=str(no_default_policy)).unavailable is None
    sharder = get_sharder("ppo", policy=str(no_default_policy))
    assert sharder.policy == no_default_policy  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="missing"):
        get_sharder("ppo", policy=str(no_default_policy.parent / "nowhere"))


def test_plan_and_demo_take_a_policy(tmp_path: Path, no_default_policy: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "t.yaml"
    save_tables(tables, [Table("a", 1000, 8, pooling_factor=2.0), Table("b", 500, 8)])
    out = tmp_path / "plan.json"
    args = ["plan", "-t", str(tables), "--devices", "2", "-s", "ppo", "-o", str(out)]
    code, _, err = run(args, capsys)
    assert code == 2 and "unavailable" in err and not out.exists(), err
    code, _, err = run([*args, "--policy", str(no_default_policy)], capsys)
    assert code == 0 and out.is_file(), err
    demo = tmp_path / "demo"
    code, _, err = run(["demo", "--out", str(demo), "--policy", str(tmp_path / "nowhere")],
                       capsys)
    assert code == 2 and "--policy" in err and "nowhere" in err, err
    assert not demo.exists()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """autoshard's wheel, built once for this module's tests."""
    folder = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "--no-build-isolation", "-w", str(folder), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (built,) = folder.glob("autoshard-*.whl")
    return built


@pytest.mark.slow
def test_wheel_ships_the_policy_and_cost_model(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = ROOT / "autoshard" / "data"
    shipped = {str(p.relative_to(ROOT)) for p in data.rglob("*") if p.is_file()}
    assert {"autoshard/data/ppo_policy/weights.pt", "autoshard/data/ppo_policy/config.json",
            "autoshard/data/ppo_policy_tuned/weights.pt",
            "autoshard/data/ppo_policy_tuned/config.json",
            "autoshard/data/cost_model/model.txt"} <= shipped
    assert shipped <= names
    for package in ("autoshard/cli/__init__.py", "autoshard/cost_models/model.py",
                    "autoshard/training/train.py", "autoshard/envs/__init__.py"):
        assert package in names
    # Installing autoshard adds no other top-level name than the package and its metadata.
    assert {n.split("/")[0] for n in names} == {"autoshard", wheel.name.split("-")[0]
                                                + "-" + wheel.name.split("-")[1] + ".dist-info"}


@pytest.mark.slow
def test_wheel_requires_the_core_alone_and_offers_each_extra(wheel: Path) -> None:
    """The wheel's metadata: the core's packages unconditionally, every other one under the
    extra that needs it (autoshard/extras.py names them), torch under no exact pin."""
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(meta).decode().splitlines()
    requires = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    offered = {ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Provides-Extra:")}
    unconditional = {re.match(r"[A-Za-z0-9_.-]+", r).group().lower()  # type: ignore[union-attr]
                     for r in requires if "extra ==" not in r}
    assert unconditional == {"numpy", "pyyaml", "typer", "rich", "click", "scipy", "highspy"}
    assert offered == {*EXTRAS, "all", "dev"}
    torch = [r for r in requires if re.match(r"torch[<>=!~; ]", r)]
    assert torch and all(not r.startswith("torch==") and "extra ==" in r for r in torch), torch
    assert any(r.startswith("autoshard[") and 'extra == "all"' in r for r in requires)
