"""The machine fingerprint: read from (fake) /proc and /sys files, never raising, never importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.common.fingerprint import Environment, Hardware, current_environment, read_hardware

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
"""


def _fake_root(tmp_path: Path, *, gpus: list[str] | None = None, cpu_max: str | None = None) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc/cpuinfo").write_text(CPUINFO)
    if cpu_max is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/cpu.max").write_text(cpu_max)
    if gpus is not None:
        for i, name in enumerate(gpus):
            d = tmp_path / f"proc/driver/nvidia/gpus/0000:0{i}:00.0"
            d.mkdir(parents=True)
            (d / "information").write_text(f"Model: \t\t {name}\nIRQ:   \t\t 42\nGPU UUID: GPU-1\n")
        (tmp_path / "proc/driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
            "GCC version:  gcc version 12.2.0\n"
        )
    return tmp_path


def test_cpu_only_machine(tmp_path: Path) -> None:
    hw = read_hardware(_fake_root(tmp_path))
    assert hw.cpu_model == "AMD EPYC 7B13"
    assert hw.cpu_count == 2
    assert hw.gpus == [] and hw.gpu_driver is None and hw.cpu_quota is None
    assert hw.describe() == "AMD EPYC 7B13 ×2 CPUs, no GPU"


def test_gpus_and_driver_from_proc(tmp_path: Path) -> None:
    hw = read_hardware(_fake_root(tmp_path, gpus=["NVIDIA H200", "NVIDIA H200"]))
    assert hw.gpus == ["NVIDIA H200", "NVIDIA H200"]
    assert hw.gpu_driver == "550.54.15"
    assert hw.describe() == "AMD EPYC 7B13 ×2 CPUs, 2× NVIDIA H200 (driver 550.54.15)"


def test_cgroup_quota_is_part_of_the_machine(tmp_path: Path) -> None:
    assert read_hardware(_fake_root(tmp_path, cpu_max="max 100000\n")).cpu_quota is None
    limited = read_hardware(_fake_root(tmp_path / "b", cpu_max="150000 100000\n"))
    assert limited.cpu_quota == 1.5
    assert "quota 1.5" in limited.key()


def test_unreadable_files_give_unknown_not_an_error(tmp_path: Path) -> None:
    hw = read_hardware(tmp_path)  # nothing there
    assert hw == Hardware(cpu_model=None, cpu_count=None, cpu_count_logical=None)
    assert "unknown CPU" in hw.describe()


def test_differences_name_the_field() -> None:
    a = Hardware(cpu_model="AMD EPYC 7B13", cpu_count=2)
    b = Hardware(cpu_model="Intel Xeon", cpu_count=2, gpus=["NVIDIA H200"], gpu_driver="550")
    assert a.differences(a) == []
    assert a.differences(b) == ["CPU model: AMD EPYC 7B13 vs Intel Xeon", "GPUs: none vs NVIDIA H200"]
    # The driver is recorded, not compared: a driver or torch upgrade is a change a gate must judge.
    assert b.differences(b.model_copy(update={"gpu_driver": "560"})) == []


def test_this_machine_round_trips_and_does_not_import_torch() -> None:
    env = current_environment()
    assert env.hardware.cpu_count and env.software.harness
    assert Environment.model_validate_json(env.model_dump_json()) == env
    code = (
        "import sys; from harness.common.fingerprint import current_environment as c; e = c(); "
        "print('torch' in sys.modules, e.software.torch is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
