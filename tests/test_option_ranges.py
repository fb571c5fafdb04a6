"""Every numeric option, of the commands and of the sharders, against its stated range: out of
range is exit 2 naming the option and the value, before any work, nothing written; profiles
reject unknown fields and state upper limits."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from cli_helpers import run_cli

from autoshard.cli import app
from autoshard.errors import InputError, PlannerError
from autoshard.hardware import BUNDLED, load_hardware
from autoshard.limits import QPS, SEED, TIME_LIMIT_S, Range, names_in
from autoshard.serving.cluster import BUNDLED as SERVING
from autoshard.serving.cluster import FIELD_RANGES, ServingProfile
from autoshard.sharders import (
    check_sharder_options,
    get_sharder,
    option_ranges,
    sharder_class,
    sharder_names,
)

TABLES = {"tables": [{"name": "a", "rows": 1000, "dim": 16}, {"name": "b", "rows": 500, "dim": 8}]}


def _tables(tmp_path: Path) -> str:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(TABLES))
    return str(path)


def _rejected(argv: list[str], option: str, capsys: pytest.CaptureFixture[str],
              written: Path) -> str:
    """Runs the CLI; asserts exit 2 with one error line naming ``option``, nothing written."""
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    assert option in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert not written.exists()
    return err


# -- seeds ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["plan", "synth", "demo", "compare", "serve simulate",
                                     "serve plan", "serve compare", "train", "cost-model fit",
                                     "calibrate"])
@pytest.mark.parametrize("seed", ["-1", str(2**40)])
def test_a_seed_out_of_range_is_refused_by_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, seed: str) -> None:
    out = tmp_path / "out"
    args = {"plan": ["-t", _tables(tmp_path), "-s", "random", "-o", str(out)],
            "synth": ["--tables", "2", "--batch-size", "4", "-o", str(out)],
            "demo": ["--out", str(out)],
            "compare": ["--sharders", "random", "--out", str(out), "--wandb-mode", "disabled"],
            "serve simulate": ["-o", str(out)], "serve plan": ["--p99-ms", "3", "--qps", "10",
                                                               "-o", str(out)],
            "serve compare": ["-o", str(out)], "train": ["--out", str(out)],
            "cost-model fit": ["results/microbench/cpu_default.csv", "-o", str(out)],
            "calibrate": ["--out", str(out)]}[command]
    err = _rejected([*command.split(), "--seed", seed, *args], "--seed", capsys, out)
    assert seed in err.replace(",", "")


def test_the_seed_range_is_said_once_and_shown_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert SEED.low == 0 and SEED.integer
    assert option_ranges("random")["seed"] is SEED and option_ranges("recshard")["seed"] is SEED
    assert option_ranges("ppo")["seed"] is SEED
    for command in (["plan"], ["synth"], ["serve", "simulate"], ["demo"]):
        assert SEED.help() in _help(command, "seed")


def _help(command: list[str], name: str) -> str:
    """The help text of option ``name`` of ``command`` (as ``--help`` prints it)."""
    group = typer.main.get_command(app)
    for part in command:
        group = group.commands[part]  # type: ignore[attr-defined]
    return next(str(p.help) for p in group.params if p.name == name)


# -- sharder options ------------------------------------------------------------------------

def _numeric(annotation: object) -> bool:
    """Whether a constructor option's annotation (``int``, ``float | None``, ...) is a
    number."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return bool({part.strip() for part in str(text).split("|")} & {"int", "float"})


def test_every_numeric_option_of_every_sharder_has_a_declared_range() -> None:
    for name in sharder_names():
        try:
            ranges = option_ranges(name)
        except PlannerError:  # an extra not installed here: its class cannot be read
            continue
        parameters = inspect.signature(sharder_class(name)).parameters
        numeric = {key for key, p in parameters.items() if _numeric(p.annotation)}
        assert numeric <= set(ranges), f"{name}: no range for {sorted(numeric - set(ranges))}"
        assert set(ranges) <= set(parameters), f"{name}: range for an option it does not take"
        for key, rng in ranges.items():
            default = parameters[key].default
            assert default is None or default in rng, (name, key, default, rng)


@pytest.mark.parametrize(("sharder", "option", "value"), [
    ("recshard", "max_lines", -3), ("recshard", "max_lines", 2.5),
    ("recshard", "time_limit", -1), ("recshard", "time_limit", 0),
    ("recshard", "max_pairs", -1), ("recshard", "stall", -1), ("recshard", "mip_rel_gap", -0.5),
    ("recshard", "group_devices", 1), ("recshard", "split_search_cap", 0),
    ("torchrec", "cache_load_factor", -1), ("torchrec", "cache_load_factor", 5),
    ("torchrec", "time_limit", 0), ("torchrec", "full_strength_cells", 0),
    ("ppo", "threads", 0), ("ppo", "samples", 1001), ("random", "seed", -1),
])
def test_a_sharder_option_out_of_range_exits_2_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sharder: str, option: str,
        value: float) -> None:
    out = tmp_path / "plan.json"
    err = _rejected(["plan", "-t", _tables(tmp_path), "-s", sharder, "--opt",
                     f"{option}={value}", "-o", str(out)], f"{sharder}.{option}", capsys, out)
    assert str(value) in err


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_registry_refuses_non_finite_options(value: float) -> None:
    with pytest.raises(InputError, match="finite") as info:
        get_sharder("recshard", mip_rel_gap=value)
    assert info.value.field == "recshard.mip_rel_gap"
    with pytest.raises(InputError, match="finite"):
        check_sharder_options("random", {"seed": value})


def test_a_sharder_option_in_range_or_none_where_allowed_passes() -> None:
    check_sharder_options("recshard", {"max_lines": None, "time_limit": 1e6, "stall": 0,
                                       "mip_rel_gap": 1, "seed": SEED.high})
    with pytest.raises(InputError, match=r"\[2, 10000\] or null"):
        check_sharder_options("recshard", {"max_lines": 1})


# -- numeric options of the commands --------------------------------------------------------

@pytest.mark.parametrize(("argv", "option"), [
    (["cost-model", "fit", "results/microbench/cpu_default.csv", "--n-estimators", "0"],
     "--n-estimators"),
    (["cost-model", "compare", "results/microbench/cpu_default.csv", "--test-share", "1"],
     "--test-share"),
    (["cost-model", "calibrate", "autoshard/data/cost_model", "--budget-s", "nan"], "--budget-s"),
    (["bench", "--threads", "0"], "--threads"),
    (["bench", "--every", "0"], "--every"),
    (["demo", "--time-limit", "0"], "--time-limit"),
    (["demo", "--hbm-fraction", "nan"], "--hbm-fraction"),
    (["profile", "trace.pt", "--dim", "0"], "--dim"),
    (["serve", "simulate", "--qps", "1e-12"], "--qps"),
    (["serve", "simulate", "--qps", "nan"], "--qps"),
    (["serve", "simulate", "--servers", "-1"], "--servers"),
    (["serve", "plan", "--p99-ms", "3", "--qps", "1e-300"], "--qps"),
    (["serve", "plan", "--p99-ms", "inf", "--qps", "10"], "--p99-ms"),
    (["serve", "plan", "--p99-ms", "3", "--qps", "10", "--span", "0"], "--span"),
    (["serve", "bench", "--qps", "100,1e-9"], "--qps"),
    (["serve", "calibrate", "--calls", "2"], "--calls"),
    (["plan", "-t", "default", "--time-limit", "1e300"], "--time-limit"),
])
def test_a_numeric_option_out_of_range_exits_2_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], option: str) -> None:
    out = tmp_path / "out"
    _rejected([*argv, "-o" if argv[0] != "demo" else "--out", str(out)], option, capsys, out)


def test_ranges_appear_in_the_help() -> None:
    assert QPS.help() in _help(["serve", "simulate"], "qps")
    assert TIME_LIMIT_S.help() == "[0 < x <= 1000000]"
    assert TIME_LIMIT_S.help() in _help(["demo"], "time_limit")
    assert TIME_LIMIT_S.help() in _help(["plan"], "time_limit")
    assert "[1 <= x <= 256]" in _help(["bench"], "threads")
    assert "[1 <= x <= 100000]" in _help(["cost-model", "fit"], "n_estimators")


def test_range_messages_state_the_range() -> None:
    assert str(Range(0, 1, open_low=True)) == "a number in (0, 1]"
    assert str(Range(0, 1, open_low=True, open_high=True)) == "a number in (0, 1)"
    assert str(Range(2, 10_000, integer=True)) == "an integer in [2, 10000]"
    assert 1.0 not in Range(0, 1, open_high=True) and 0 not in Range(0, 1, open_low=True)
    assert True not in SEED and 2.0 not in SEED and np.nan not in QPS


# -- choices naming nothing, overrides that disagree ----------------------------------------

def test_an_empty_choice_is_an_error_naming_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    err = _rejected(["serve", "plan", "--p99-ms", "3", "--qps", "10", "--strategies", ",",
                     "-o", str(out)], "--strategies", capsys, out)
    assert "names no serving strategy" in err
    err = _rejected(["compare", "--sharders", ",", "--out", str(out), "--wandb-mode",
                     "disabled"], "--sharders", capsys, out)
    assert "names no sharder" in err and "random" in err
    with pytest.raises(InputError, match="unknown thing"):
        names_in("a,c", ["a", "b"], "--x", "thing")
    assert names_in(None, ["a", "b"], "--x", "thing") == ["a", "b"]


def test_nodes_and_devices_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    err = _rejected(["plan", "-t", _tables(tmp_path), "--nodes", "2", "--devices", "3", "-o",
                     str(out)], "--nodes", capsys, out)
    assert "--devices 3" in err and "16 devices" in err
    assert load_hardware("8xH100-80GB", nodes=2, devices=16).num_devices == 16


# -- hardware profiles ----------------------------------------------------------------------

def _hardware(tmp_path: Path, **changes: object) -> Path:
    doc = BUNDLED["8xH100-80GB"].to_dict()
    for key, value in changes.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_misspelt_hardware_field_is_an_error_not_a_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The original probe: `num_device: 16` was read as the default 8 devices.
    path = _hardware(tmp_path, num_devices=None, num_device=16)
    out = tmp_path / "plan.json"
    err = _rejected(["plan", "-t", _tables(tmp_path), "-H", str(path), "-o", str(out)],
                    "num_device", capsys, out)
    assert "num_devices" in err  # the known fields are listed


@pytest.mark.parametrize(("changes", "field"), [
    ({"device": {"hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "host_gb": 256,
                 "host_bandwidth_gbps": 64, "hbm_gbs": 1}}, "device.hbm_gbs"),
    ({"device": {"hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "host_gb": 256,
                 "host_bandwidth_gbps": 64, "node": 3}}, "device.node"),
    ({"device": None, "num_devices": None,
      "devices": [{"hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "host_gb": 256,
                   "host_bandwidth_gbps": 64, "nodes": 0}]}, "devices[0].nodes"),
    ({"devices": [{"hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "host_gb": 256,
                   "host_bandwidth_gbps": 64}]}, "device"),
    ({"device": None, "num_devices": 4,
      "devices": [{"hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "host_gb": 256,
                   "host_bandwidth_gbps": 64}]}, "num_devices"),
    ({"intra_node_gbps": 1e300}, "intra_node_gbps"),
    ({"kernel_overhead_us": 1e7}, "kernel_overhead_us"),
])
def test_hardware_fields_unknown_conflicting_or_too_large_are_named(
        tmp_path: Path, changes: dict[str, object], field: str) -> None:
    path = _hardware(tmp_path, **changes)
    with pytest.raises(InputError) as info:
        load_hardware(str(path))
    assert info.value.field == field and info.value.source == str(path)


def test_a_written_profile_reads_back(tmp_path: Path) -> None:
    profile = load_hardware("8xA100-40GB", devices=12)
    path = _hardware(tmp_path)
    path.write_text(yaml.safe_dump(profile.to_dict()))
    assert load_hardware(str(path)) == profile


# -- serving profiles -----------------------------------------------------------------------

def test_every_serving_profile_field_has_an_upper_limit() -> None:
    numeric = {f for f in ServingProfile.__dataclass_fields__ if f != "name"}
    assert set(FIELD_RANGES) == numeric
    assert all(math.isfinite(r.high) for r in FIELD_RANGES.values())


@pytest.mark.parametrize("field", sorted(FIELD_RANGES))
def test_a_serving_profile_field_over_its_limit_is_named(tmp_path: Path, field: str) -> None:
    doc = SERVING["cpu-256gb"].to_dict()
    doc[field] = FIELD_RANGES[field].high * 10 + 1
    if FIELD_RANGES[field].integer:
        doc[field] = int(doc[field])
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as info:
        ServingProfile.from_dict(yaml.safe_load(path.read_text()), str(path))
    assert info.value.field == field


def test_huge_lookup_cost_is_refused_and_the_largest_allowed_prices_finitely(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The original probe: lookup_ns 1e308 gave NaN and Infinity latencies.
    doc = SERVING["cpu-256gb"].to_dict()
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(dict(doc, lookup_ns=1e308)))
    out = tmp_path / "mapping.json"
    _rejected(["serve", "simulate", "-P", str(path), "-o", str(out)], "lookup_ns", capsys, out)
    path.write_text(yaml.safe_dump(dict(doc, **{k: r.high for k, r in FIELD_RANGES.items()
                                                if not r.integer})))
    code, stdout, err = run_cli(["serve", "simulate", "-P", str(path), "--qps", str(QPS.high),
                                 "--requests", "1000", "--json"], capsys)
    assert code == 0, err
    row = json.loads(stdout)
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))


def test_an_unknown_serving_profile_field_is_named(tmp_path: Path) -> None:
    doc = dict(SERVING["cpu-256gb"].to_dict(), lookup_nss=60)
    with pytest.raises(InputError, match=r"known: .*lookup_ns") as info:
        ServingProfile.from_dict(doc, "p.yaml")
    assert info.value.field == "lookup_nss"
