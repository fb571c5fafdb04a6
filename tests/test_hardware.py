"""Hardware profiles: bundled figures, overrides, files and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from handcase import hand_profile, hand_tables

from autoshard.errors import InputError
from autoshard.hardware import BUNDLED, GB, load_hardware, save_hardware
from autoshard.task import ShardingTask


def test_bundled_spec_sheet_figures() -> None:
    assert set(BUNDLED) >= {"8xV100-16GB", "8xA100-40GB", "8xH100-80GB", "8xH200-141GB"}
    figures = {"8xV100-16GB": (16, 900), "8xA100-40GB": (40, 1555), "8xH100-80GB": (80, 3350),
               "8xH200-141GB": (141, 4800)}
    for name, (gb, gbps) in figures.items():
        p = BUNDLED[name]
        assert p.num_devices == 8
        assert p.devices[0].hbm.capacity_bytes == gb * GB
        assert p.devices[0].hbm.bandwidth_gbps == gbps


def test_overrides_scale_to_nodes() -> None:
    p = load_hardware("8xH100-80GB", devices=20, hbm_gb=5)
    assert p.num_devices == 20 and p.name == "20xH100-80GB"
    assert [d.node for d in p.devices] == [0] * 8 + [1] * 8 + [2] * 4
    assert {d.hbm.capacity_bytes for d in p.devices} == {5 * GB}
    assert load_hardware("8xA100-40GB", nodes=3).num_devices == 24
    task = ShardingTask(hand_tables(), p)
    # A device in a full node has 7 of its 19 peers in its node.
    assert task.device_arrays.intra_share[0] == pytest.approx(7 / 19)
    assert task.device_arrays.intra_share[19] == pytest.approx(3 / 19)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_profile_file_round_trip(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"p{suffix}"
    profile = load_hardware("8xH200-141GB", devices=12, hbm_gb=7.5)
    save_hardware(path, profile)
    assert load_hardware(str(path)) == profile
    assert load_hardware(str(path), devices=2).num_devices == 2


def test_heterogeneous_profile_round_trip(tmp_path: Path) -> None:
    base = hand_profile(2)
    from dataclasses import replace

    odd = replace(base, devices=(base.devices[0], replace(base.devices[1], node=1)))
    path = tmp_path / "odd.yaml"
    save_hardware(path, odd)
    assert "devices:" in path.read_text()
    loaded = load_hardware(str(path))
    assert [d.node for d in loaded.devices] == [0, 1]
    assert loaded.devices[0].hbm == odd.devices[0].hbm


def test_user_yaml_profile(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: lab\nnum_devices: 4\ndevices_per_node: 2\nintra_node_gbps: 100\n"
                    "inter_node_gbps: 10\ndevice: {hbm_gb: 24, hbm_bandwidth_gbps: 1000, "
                    "host_gb: 64, host_bandwidth_gbps: 25}\n")
    p = load_hardware(str(path))
    assert p.name == "lab" and p.num_devices == 4 and p.kernel_overhead_us == 5.0
    assert [d.node for d in p.devices] == [0, 0, 1, 1]
    assert p.devices[0].host.capacity_bytes == 64 * GB


DEVICE = ("device: {hbm_gb: 24, hbm_bandwidth_gbps: 1000, host_gb: 64, "
          "host_bandwidth_gbps: 25}\n")


@pytest.mark.parametrize(("text", "pieces"), [
    ("intra_node_gbps: 1\n" + DEVICE, ["'inter_node_gbps'", "missing"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\n", ["'device'", "missing"]),
    ("intra_node_gbps: 1\ninter_node_gbps: fast\n" + DEVICE, ["'inter_node_gbps'", "'fast'"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\n" + DEVICE.replace("24", "-24"),
     ["'device.hbm_gb'", "-24"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\n" + DEVICE.replace("host_gb: 64, ", ""),
     ["'device.host_gb'", "missing"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\ndevices_per_node: 0\n" + DEVICE,
     ["'devices_per_node'", "0"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\nnum_devices: 0\n" + DEVICE,
     ["'num_devices'", "0"]),
    ("intra_node_gbps: 1\ninter_node_gbps: 1\ndevices: [3]\n", ["'devices[0]'", "3"]),
    ("schema_version: 2\n", ["'schema_version'", "2"]),
    ("intra_node_gbps: 0\ninter_node_gbps: 1\n" + DEVICE, ["'intra_node_gbps'", "0"]),
])
def test_bad_profile_files(tmp_path: Path, text: str, pieces: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_hardware(str(path))
    message = str(info.value)
    for piece in [str(path), *pieces]:
        assert piece in message


def test_bad_names_and_overrides() -> None:
    with pytest.raises(InputError, match="unknown hardware profile") as info:
        load_hardware("9xB200")
    assert info.value.field == "hardware" and info.value.value == "9xB200"
    with pytest.raises(InputError, match="devices"):
        load_hardware("8xH100-80GB", devices=0)
    with pytest.raises(InputError, match="hbm_gb"):
        load_hardware("8xH100-80GB", hbm_gb=-1)
    with pytest.raises(InputError, match="file not found"):
        load_hardware("no/such/profile.yaml")


def test_scaled_bundled_names_load() -> None:
    p = load_hardware("16xH100-80GB")
    assert p == load_hardware("8xH100-80GB", devices=16)
    assert load_hardware(p.name) == p
    with pytest.raises(InputError, match="unknown hardware profile"):
        load_hardware("0xH100-80GB")


@pytest.mark.parametrize(("devices", "spans", "local"),
                         [(4, False, 4), (8, False, 8), (9, True, 8), (128, True, 8)])
def test_the_devices_span_nodes_once_they_outgrow_one(devices: int, spans: bool,
                                                      local: int) -> None:
    """One node holds ``devices_per_node`` devices (8 on the bundled profile); past that, some
    links are inter-node: what node-local splits and the ring's bandwidth ask. A node's devices
    (TorchRec's local world size) are all of them where they fill less than one node."""
    profile = load_hardware("8xH100-80GB", devices=devices)
    assert profile.devices_per_node == 8
    assert profile.spans_nodes is spans
    assert profile.node_devices == local
