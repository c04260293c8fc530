"""autotune.host.gpus: from an NVML inventory (written as data) to the environment vLLM gets.

The inventories have the shape of autotune.host.machine.gpu_facts(). The reference machine is
our reference user's: a GTX 1660 SUPER (cc 7.5) in the first slot beside an RTX 3090 (cc 8.6).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.host import gpus
from autotune.host.gpus import (
    check_visible_env,
    mixed_capability_warning,
    pinning_env,
    plan_gpus,
    resolve_selector,
    visible_gpus,
)
from tests.helpers.gpu_cards import GTX_1660S, REFERENCE, RTX_3090, RTX_4090, TWINS, gpu

# --- resolve_selector ----------------------------------------------------------------


@pytest.mark.parametrize("selector,expected", [
    ("1", [1]),
    ("0", [0]),
    ("GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5", [1]),  # full UUID
    ("GPU-af7b61d8", [1]),  # short UUID (vLLM 0.33 still fails on these)
    ("gpu-AF7B61D8", [1]),  # case does not matter
    ("GPU-5d", [0]),  # any unambiguous prefix
    ("00000000:02:00.0", [1]),  # NVML / nvidia-smi spelling
    ("0000:02:00.0", [1]),  # sysfs, lspci -D, CUDA
    ("02:00.0", [1]),  # lspci
    ("2:0.0", [1]),
    ("02:00", [1]),  # function 0 implied
    ("0000:01:00.0", [0]),
    ("1,0", [1, 0]),  # tensor parallel, order kept
    (" 0 , 1 ", [0, 1]),
    ("GPU-af7b61d8,01:00.0", [1, 0]),  # forms mix
])
def test_resolve_selector_forms(selector, expected):
    assert resolve_selector(selector, REFERENCE) == expected


def test_resolve_selector_pci_is_case_insensitive_hex():
    assert resolve_selector("0000:0a:00.0", TWINS) == [0]
    assert resolve_selector("0000:0B:00.0", TWINS) == [1]
    assert resolve_selector("0b:00.0", TWINS) == [1]


def test_short_uuid_of_duplicate_models():
    assert resolve_selector("GPU-af7b61d8", TWINS) == [1]
    assert resolve_selector("GPU-af7b0", TWINS) == [0]
    with pytest.raises(ValueError, match=r"--gpu GPU-af7b is ambiguous: it starts the UUIDs of GPUs 0, 1; give more characters"):
        resolve_selector("GPU-af7b", TWINS)


@pytest.mark.parametrize("selector,message", [
    ("2", r"--gpu 2: there is no GPU 2\. GPUs here: 0 = NVIDIA GeForce GTX 1660 SUPER GPU-5d3c9a0e"),
    ("GPU-ffffffff", r"no GPU has a UUID starting with GPU-ffffffff\. GPUs here:"),
    ("0,0", r"--gpu 0,0 names GPU 0 twice"),
    ("1,01:00.0,GPU-af7b", r"names GPU 1 twice"),
    ("", r"--gpu needs a value"),
    ("   ", r"--gpu needs a value"),
    ("0,,1", r"has an empty item"),
    ("gpu0", r"'gpu0' is not a GPU index \(0\), UUID \(GPU-af7b61d8\) or PCI bus id \(01:00\.0\)"),
    ("cuda:1", r"is not a GPU index"),
    ("-1", r"is not a GPU index"),
    ("05:00.0", r"no GPU at PCI bus id 05:00\.0"),
    ("GPU-", r"give at least the first characters"),
    ("MIG-4f2a0c1e-2b3c-5d6e-7f80-91a2b3c4d5e6", r"MIG instance UUID; autotune pins whole GPUs"),
])
def test_bad_selectors_say_what_is_wrong(selector, message):
    with pytest.raises(ValueError, match=message):
        resolve_selector(selector, REFERENCE)


def test_selector_on_a_machine_without_gpus():
    with pytest.raises(ValueError, match=r"NVML sees no NVIDIA GPU on this machine \(see `autotune gpus`\)"):
        resolve_selector("0", [])


def test_pci_bus_id_spellings_normalise_alike():
    spellings = ["00000000:02:00.0", "0000:02:00.0", "02:00.0", "2:0.0", "02:00", "0000:02:00.0 "]
    assert {gpus.normalise_pci_bus_id(s) for s in spellings} == {(0, 2, 0, 0)}
    assert gpus.normalise_pci_bus_id("0001:65:00.1") == (1, 0x65, 0, 1)
    for bad in ("", "pci", "1:2:3:4", "zz:00.0", "02:00.9"):
        assert gpus.normalise_pci_bus_id(bad) is None


# --- pinning_env -----------------------------------------------------------------------


def test_pinning_env_uses_indices_and_pci_order():
    assert pinning_env([1], REFERENCE) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert pinning_env([1, 0], REFERENCE) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,0"}


def test_pinning_env_never_gives_a_uuid():
    env = pinning_env(resolve_selector("GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5", REFERENCE), REFERENCE)
    assert "GPU-" not in "".join(env.values())
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_pinning_env_counts_in_pci_order_even_if_nvml_did_not():
    # NVML index 0 sits on the later bus: under PCI_BUS_ID, CUDA calls it 1.
    odd = [dict(RTX_3090, index=0), dict(GTX_1660S, index=1)]
    assert pinning_env([0], odd)["CUDA_VISIBLE_DEVICES"] == "1"
    assert pinning_env([1], odd)["CUDA_VISIBLE_DEVICES"] == "0"


def test_pinning_env_unknown_index():
    with pytest.raises(ValueError, match="no GPU 5 on this machine"):
        pinning_env([5], REFERENCE)


_names = st.sampled_from([("NVIDIA GeForce RTX 3090", "8.6"), ("NVIDIA GeForce GTX 1660 SUPER", "7.5"),
                          ("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA GeForce RTX 4090", "8.9")])


@st.composite
def inventories(draw):
    count = draw(st.integers(min_value=1, max_value=8))
    buses = draw(st.lists(st.integers(min_value=1, max_value=255), min_size=count, max_size=count, unique=True))
    order = draw(st.permutations(range(count)))  # NVML index need not follow the bus here
    inventory = []
    for i, bus in enumerate(buses):
        name, cc = draw(_names)
        inventory.append(gpu(order[i], name, cc, f"00000000:{bus:02X}:00.0", f"GPU-{i:08x}-{bus:04x}-0000-0000-000000000000"))
    return inventory


@settings(max_examples=200, deadline=None)
@given(inventories(), st.data())
def test_pinning_round_trip(inventory, data):
    """Whatever GPUs are chosen, the env names them with digits only, and a process given that env
    sees exactly those GPUs in that order."""
    chosen = data.draw(st.lists(st.sampled_from([g["index"] for g in inventory]), min_size=1, unique=True))
    env = pinning_env(chosen, inventory)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert all(part.isdigit() for part in env["CUDA_VISIBLE_DEVICES"].split(","))
    seen = visible_gpus(env, inventory)
    assert seen is not None and seen.order_known
    assert [g["index"] for g in seen.gpus] == chosen


# --- check_visible_env: a CUDA_VISIBLE_DEVICES the user set ----------------------------------


def test_full_uuid_in_env_is_translated():
    changes, warnings = check_visible_env({"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5"}, REFERENCE)
    assert changes == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert len(warnings) == 1
    assert "invalid literal for int()" in warnings[0]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 instead" in warnings[0]
    assert "GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6)" in warnings[0]


def test_short_uuid_and_mixed_entries_are_translated():
    changes, _ = check_visible_env({"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8"}, REFERENCE)
    assert changes["CUDA_VISIBLE_DEVICES"] == "1"
    changes, _ = check_visible_env({"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8,0"}, REFERENCE)
    assert changes == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,0"}


def test_uuid_of_another_machine_is_not_translated():
    changes, warnings = check_visible_env({"CUDA_VISIBLE_DEVICES": "GPU-52a3a85d-3c55-ca3a-a955-82c69ed360fc"}, REFERENCE)
    assert changes == {}
    assert "no GPU has a UUID starting with GPU-52a3a85d" in warnings[0]
    assert "nvidia-smi -L" in warnings[0]


def test_uuid_without_nvml():
    changes, warnings = check_visible_env({"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8"}, [])
    assert changes == {}
    assert "NVML sees no GPU to translate them" in warnings[0]


def test_indices_on_differing_gpus_without_device_order_warn_fastest_first():
    changes, warnings = check_visible_env({"CUDA_VISIBLE_DEVICES": "0"}, REFERENCE)
    assert changes == {}
    assert len(warnings) == 1
    assert "FASTEST_FIRST" in warnings[0]
    assert "nvidia-smi: 0 = NVIDIA GeForce GTX 1660 SUPER; 1 = NVIDIA GeForce RTX 3090" in warnings[0]


@pytest.mark.parametrize("env,inventory", [
    ({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, REFERENCE),
    ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "pci_bus_id"}, REFERENCE),
    ({"CUDA_VISIBLE_DEVICES": "1"}, TWINS),  # identical GPUs: the order cannot surprise anyone
    ({"CUDA_VISIBLE_DEVICES": "0"}, [RTX_3090]),
    ({}, REFERENCE),  # not set: nothing to check here
])
def test_env_that_needs_no_change(env, inventory):
    assert check_visible_env(env, inventory) == ({}, [])


def test_empty_visible_devices_warns():
    changes, warnings = check_visible_env({"CUDA_VISIBLE_DEVICES": ""}, REFERENCE)
    assert changes == {}
    assert warnings == ["CUDA_VISIBLE_DEVICES is empty: vLLM will see no GPU at all (unset it, or use --gpu)"]


# --- visible_gpus -------------------------------------------------------------------------


def _idx(visible):
    return None if visible is None else ([g["index"] for g in visible.gpus], visible.order_known)


@pytest.mark.parametrize("env,inventory,expected", [
    ({}, REFERENCE, ([0, 1], False)),  # all visible, CUDA's numbering unknown
    ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, REFERENCE, ([0, 1], True)),
    ({}, TWINS, ([0, 1], True)),
    ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, REFERENCE, ([1], True)),
    ({"CUDA_VISIBLE_DEVICES": "1"}, REFERENCE, None),  # FASTEST_FIRST on differing GPUs: unknown
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, REFERENCE, ([0, 1], False)),  # every index: the set is known
    ({"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8"}, REFERENCE, ([1], True)),  # a UUID names one GPU
    ({"CUDA_VISIBLE_DEVICES": "GPU-nothere"}, REFERENCE, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, REFERENCE, ([], True)),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, TWINS, ([], True)),
    ({"CUDA_VISIBLE_DEVICES": "1,7,0"}, TWINS, ([1], True)),  # CUDA stops at the first invalid entry
    ({"CUDA_VISIBLE_DEVICES": "0,0"}, TWINS, ([0], True)),
])
def test_visible_gpus(env, inventory, expected):
    assert _idx(visible_gpus(env, inventory)) == expected


# --- mixed compute capabilities --------------------------------------------------------


def test_reference_machine_mixed_capability_warning():
    warning = mixed_capability_warning([0, 1], REFERENCE)
    assert warning.startswith("vLLM will see GPUs with different compute capabilities "
                              "(GPU 0 (NVIDIA GeForce GTX 1660 SUPER, cc 7.5), GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6))")
    assert "FlashAttention 2" in warning and "TRITON_ATTN" in warning
    assert warning.endswith("To use only the newest, pass --gpu 1.")
    assert "fp8" not in warning  # neither reaches 8.9


def test_no_warning_for_one_gpu_or_equal_capabilities():
    assert mixed_capability_warning([1], REFERENCE) is None
    assert mixed_capability_warning([0], REFERENCE) is None
    assert mixed_capability_warning([0, 1], TWINS) is None
    assert mixed_capability_warning([], REFERENCE) is None


def test_ampere_beside_ada_warns_about_fp8_only():
    warning = mixed_capability_warning([0, 1], [RTX_3090 | {"index": 0}, RTX_4090])
    assert "fp8 (e4m3) kernels need cc 8.9" in warning
    assert "FlashAttention 2" not in warning
    assert warning.endswith("--gpu 1.")


# --- plan_gpus: the one call the tune loop makes -----------------------------------------------


def test_plan_with_selector_pins_and_drops_the_1660():
    plan = plan_gpus("GPU-af7b61d8", {}, REFERENCE)
    assert plan.indices == (1,)
    assert plan.env_changes == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert plan.warnings == ()
    assert plan.source == "--gpu"


def test_plan_with_selector_replaces_the_users_visible_devices():
    plan = plan_gpus("1", {"CUDA_VISIBLE_DEVICES": "0,1"}, REFERENCE)
    assert plan.env_changes["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.warnings == ("--gpu 1 replaces CUDA_VISIBLE_DEVICES=0,1 from your environment",)


def test_plan_without_selector_on_the_reference_machine_warns_about_the_mix():
    plan = plan_gpus(None, {}, REFERENCE)
    assert plan.indices == (0, 1)
    assert plan.env_changes == {}
    assert len(plan.warnings) == 1 and "FlashAttention 2" in plan.warnings[0]
    assert plan.source == "all"


def test_plan_translates_a_planted_uuid():
    plan = plan_gpus(None, {"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5"}, REFERENCE)
    assert plan.indices == (1,)
    assert plan.env_changes == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert "invalid literal for int()" in plan.warnings[0]
    assert plan.source == "CUDA_VISIBLE_DEVICES"


def test_plan_tensor_parallel_on_twins():
    plan = plan_gpus("0,1", {}, TWINS)
    assert plan.indices == (0, 1)
    assert plan.env_changes["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.warnings == ()


def test_plan_without_gpus():
    assert plan_gpus(None, {"CUDA_VISIBLE_DEVICES": "0"}, []) == gpus.GpuPinning((), {}, (), "none")
    with pytest.raises(ValueError, match="NVML sees no NVIDIA GPU"):
        plan_gpus("0", {}, [])
    with pytest.raises(ValueError, match="there is no GPU 3"):
        plan_gpus("3", {}, REFERENCE)
