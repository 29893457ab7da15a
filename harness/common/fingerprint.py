"""Where a run was measured: the machine (CPU, GPU) and the software (Python, torch, harness).

Absolute latencies belong to the machine that measured them: a P95 TTFT calibrated on one CPU says
nothing about another. The load stage records an :class:`Environment` in every ``summary.json``
(``environment``) and a baseline keeps the one it was calibrated on, so ``harness gate`` can tell
"slower code" from "another machine" (docs/gates.md, *Fingerprint*).

What counts as *the machine* is :meth:`Hardware.key`: the CPU model, the CPUs this process may use
(affinity, and a cgroup CPU quota when one is set) and the GPU models. The GPU driver and the
software versions are recorded and shown, but do not make two machines different: a torch upgrade
that slows decode is exactly the regression a gate must catch, not a reason to stop judging.

Reading is cheap (a few small files under ``/proc`` and ``/sys``, ``nvidia-smi`` only when the
driver's ``/proc`` files are absent, with a short timeout), cached per process, never imports torch
(a Locust process must not pay seconds for it) and never raises: what cannot be read is ``None``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from pydantic import ConfigDict, Field

from harness import __version__
from harness.common.model import StrictModel

NVIDIA_SMI_TIMEOUT_S = 3.0


class _Frozen(StrictModel):
    model_config = ConfigDict(frozen=True)  # merged with StrictModel's extra="forbid"


class Hardware(_Frozen):
    """The machine a run was measured on (``None``: could not be read)."""

    cpu_model: str | None = None
    """``model name`` of ``/proc/cpuinfo`` (else ``platform.processor()`` / the machine type)."""
    cpu_count: int | None = None
    """CPUs this process may run on (``os.sched_getaffinity``): what the run actually had."""
    cpu_count_logical: int | None = None
    """Logical CPUs of the machine (``os.cpu_count()``)."""
    cpu_quota: float | None = None
    """CPUs' worth of time the cgroup allows (``cpu.max``, cgroup v2); ``None``: no quota."""
    gpus: list[str] = Field(default_factory=list)
    """GPU model names, one per GPU (empty: none seen)."""
    gpu_driver: str | None = None
    """The NVIDIA driver version, when there is one."""

    def key(self) -> str:
        """What must be equal for absolute latencies to compare: CPU model, usable CPUs, quota, GPUs."""
        quota = f"; quota {self.cpu_quota:g}" if self.cpu_quota is not None else ""
        gpus = ", ".join(self.gpus) if self.gpus else "no GPU"
        return f"{self.cpu_model or 'unknown CPU'} ×{self.cpu_count or '?'}{quota}; {gpus}"

    def describe(self) -> str:
        """For messages: ``AMD EPYC 7B13 ×2 CPUs, no GPU``, ``… ×16 CPUs, 1× NVIDIA H200 (driver 550.54)``."""
        cpus = f"{self.cpu_model or 'unknown CPU'} ×{self.cpu_count if self.cpu_count else '?'} CPUs"
        if self.cpu_quota is not None:
            cpus += f" (quota {self.cpu_quota:g})"
        if not self.gpus:
            return f"{cpus}, no GPU"
        names: dict[str, int] = {}
        for g in self.gpus:
            names[g] = names.get(g, 0) + 1
        gpus = ", ".join(f"{n}× {name}" for name, n in names.items())
        driver = f" (driver {self.gpu_driver})" if self.gpu_driver else ""
        return f"{cpus}, {gpus}{driver}"

    def differences(self, other: Hardware) -> list[str]:
        """The fields of :meth:`key` that differ, as ``field: this vs other`` (empty: same machine)."""
        out: list[str] = []
        for name, a, b in (
            ("CPU model", self.cpu_model, other.cpu_model),
            ("usable CPUs", self.cpu_count, other.cpu_count),
            ("CPU quota", self.cpu_quota, other.cpu_quota),
            ("GPUs", ", ".join(self.gpus) or "none", ", ".join(other.gpus) or "none"),
        ):
            if a != b:
                out.append(
                    f"{name}: {a if a is not None else 'unknown'} vs {b if b is not None else 'unknown'}"
                )
        return out


class Software(_Frozen):
    """The software a run was measured with (``None``: not installed / unknown)."""

    python: str | None = None
    torch: str | None = None
    """The installed torch distribution's version (read from its metadata, never imported)."""
    harness: str | None = None


class Environment(_Frozen):
    """:class:`Hardware` and :class:`Software` together (``summary.json``: ``environment``)."""

    hardware: Hardware
    software: Software

    def describe(self) -> str:
        return self.hardware.describe()


# ------------------------------------------------------------------------------------------ reading


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cpu_model(root: Path) -> str | None:
    text = _read(root / "proc/cpuinfo")
    if text:
        for key in ("model name", "Model", "Hardware", "cpu model", "Processor"):
            for line in text.splitlines():
                name, sep, value = line.partition(":")
                if sep and name.strip() == key and value.strip():
                    return " ".join(value.split())
    if root == Path("/"):
        return platform.processor() or platform.machine() or None
    return None


def _cpu_quota(root: Path) -> float | None:
    text = _read(root / "sys/fs/cgroup/cpu.max")
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return round(quota / period, 2) if period > 0 else None


def _gpus_from_proc(root: Path) -> tuple[list[str], str | None] | None:
    gpu_dir = root / "proc/driver/nvidia/gpus"
    if not gpu_dir.is_dir():
        return None
    names: list[str] = []
    with contextlib.suppress(OSError):
        for info in sorted(gpu_dir.glob("*/information")):
            for line in (_read(info) or "").splitlines():
                key, sep, value = line.partition(":")
                if sep and key.strip() == "Model":
                    names.append(" ".join(value.split()))
                    break
    driver = None
    version = _read(root / "proc/driver/nvidia/version") or ""
    for token in version.split():
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 …": the first dotted number
        if token[:1].isdigit() and "." in token and token.replace(".", "").isdigit():
            driver = token
            break
    return names, driver


def _gpus_from_smi() -> tuple[list[str], str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return [], None
    if out.returncode != 0:
        return [], None
    names: list[str] = []
    driver = None
    for line in out.stdout.splitlines():
        name, _, drv = line.partition(",")
        if name.strip():
            names.append(name.strip())
            driver = drv.strip() or driver
    return names, driver


def read_hardware(root: Path = Path("/")) -> Hardware:
    """The machine's :class:`Hardware`; ``root`` lets tests point at a fake ``/proc`` and ``/sys``
    (then the process's own affinity, ``platform`` and ``nvidia-smi`` are not consulted)."""
    real = root == Path("/")
    count: int | None = None
    if real:
        try:
            count = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            count = os.cpu_count()
    else:
        text = _read(root / "proc/cpuinfo") or ""
        count = sum(1 for line in text.splitlines() if line.partition(":")[0].strip() == "processor") or None
    gpus = _gpus_from_proc(root)
    if gpus is None:
        gpus = _gpus_from_smi() if real else ([], None)
    return Hardware(
        cpu_model=_cpu_model(root),
        cpu_count=count,
        cpu_count_logical=os.cpu_count() if real else count,
        cpu_quota=_cpu_quota(root),
        gpus=gpus[0],
        gpu_driver=gpus[1],
    )


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_software() -> Software:
    return Software(python=platform.python_version(), torch=_version("torch"), harness=__version__)


@lru_cache(maxsize=1)
def current_environment() -> Environment:
    """This machine's :class:`Environment`, read once per process; never raises."""
    try:
        hardware = read_hardware()
    except Exception:  # a fingerprint must never break a run; unknown is an honest answer
        hardware = Hardware()
    try:
        software = read_software()
    except Exception:
        software = Software(harness=__version__)
    return Environment(hardware=hardware, software=software)


def hardware_key() -> str:
    """This machine's :meth:`Hardware.key`."""
    return current_environment().hardware.key()


def describe() -> str:
    """This machine in words, for messages and baseline headers."""
    return current_environment().describe()
