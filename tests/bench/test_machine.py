"""What the reports record about the machine."""

from perf.machine import device_info, machine


def test_device_info_names_the_platform_cores_and_device():
    info = device_info("cpu")
    assert info["device"] == "cpu" and info["cpus"] >= 1 and info["python"] and "gpu" not in info


def test_machine_adds_the_usable_cores_and_the_load_without_a_device():
    info = machine()
    assert "device" not in info and info["cpus"] >= 1 and len(info["load_avg_start"]) == 3
