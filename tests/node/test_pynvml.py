"""PynvmlNvml's translation of NVML answers, with NVML itself replaced at the library boundary.

The stand-in module has pynvml's names and raises pynvml's own NVMLError classes; everything the
wrapper does with the answers (MIG detection, compute modes, merging MPS clients, errors) is real.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuwarden.node.nvml import (
    GpuProcess,
    NvmlError,
    ProcessSamples,
    PynvmlNvml,
    Utilization,
    cuda_version_text,
)

GiB = 2**30


def info(pid: int, used: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used)


class Library:
    """Two GPUs: a MIG-capable one with MIG on, and an older one without MIG or MPS queries."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    c_nvmlSetMemoryLimits_v1_t = pynvml.c_nvmlSetMemoryLimits_v1_t

    def __init__(self) -> None:
        self.limits: list[tuple[int, str, int, int]] = []
        self.shut = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "615.10"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13020

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=(80, 16)[handle] * GiB, used=(5, 1)[handle] * GiB)

    def nvmlDeviceGetComputeMode(self, handle: int) -> int:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return ("NVIDIA H100 80GB HBM3", "Tesla T4")[handle]

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        if handle == 0:
            # the MPS server, and a client NVML lists both as compute process and MPS client
            return [info(700, 300 * 2**20), info(9001, None)]
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [info(9001, 3 * GiB), info(9002, 1 * GiB)]

    def nvmlDeviceSetMemoryLimits_v1(self, handle: int, limits: Any) -> None:
        self.limits.append((handle, limits.nameSpace, limits.softLimit, limits.hardLimit))

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_devices_read_mig_and_compute_mode() -> None:
    nvml = PynvmlNvml(Library())
    first, second = nvml.devices()
    assert (first.name, first.memory_total, first.compute_mode, first.mig_enabled) == (
        "NVIDIA H100 80GB HBM3",
        80 * GiB,
        "exclusive-process",
        True,
    )
    assert (second.uuid, second.compute_mode, second.mig_enabled) == ("GPU-1", "unknown", False)
    driver = nvml.driver()
    assert (driver.driver_version, driver.cuda_version) == ("615.10", "13.2")


def test_processes_merge_compute_and_mps_client_lists() -> None:
    assert PynvmlNvml(Library()).processes(0) == (
        GpuProcess(pid=700, used_memory=300 * 2**20, mps_client=False),
        GpuProcess(pid=9001, used_memory=3 * GiB, mps_client=True),
        GpuProcess(pid=9002, used_memory=GiB, mps_client=True),
    )


def test_nvml_errors_name_the_call() -> None:
    nvml = PynvmlNvml(Library())
    with pytest.raises(NvmlError, match="nvmlDeviceGetComputeRunningProcesses failed: GPU is lost"):
        nvml.processes(1)
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetHandleByIndex\(5\) failed"):
        nvml.memory_used(5)


def test_hard_limit_goes_to_the_cgroup_path() -> None:
    library = Library()
    nvml = PynvmlNvml(library)
    nvml.set_cgroup_memory_limit(0, "/sys/fs/cgroup/kubepods.slice/x.slice", 8 * GiB)
    assert library.limits == [(0, "/sys/fs/cgroup/kubepods.slice/x.slice", 0, 8 * GiB)]
    nvml.close()
    assert library.shut


def test_opening_without_a_driver_explains_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    with pytest.raises(NvmlError, match=r"NVML is not available .*libnvidia-ml\.so\.1"):
        PynvmlNvml.open()


def test_cuda_version_text() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(11080) == "11.8"


class Sampling(Library):
    """Per-process samples on GPU 0 (one stale) up to timestamp 300; GPU 1 has no such query."""

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=80, memory=40)

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if last_seen >= 300:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        sample = SimpleNamespace
        return [
            sample(pid=9001, timeStamp=100, smUtil=90, memUtil=90),  # not newer than last_seen
            sample(pid=9001, timeStamp=200, smUtil=40, memUtil=10),
            sample(pid=9001, timeStamp=300, smUtil=20, memUtil=30),
            sample(pid=9002, timeStamp=250, smUtil=5, memUtil=1),
        ]


def test_process_utilization_is_the_mean_of_new_samples_per_process() -> None:
    nvml = PynvmlNvml(Sampling())
    assert nvml.utilization(0) == Utilization(sm=80.0, memory=40.0)
    read = nvml.process_utilization(0, 100)
    assert read is not None and read.last_seen == 300
    assert read.by_pid == {
        9001: Utilization(sm=30.0, memory=20.0),
        9002: Utilization(sm=5.0, memory=1.0),
    }
    # NOT_FOUND: nothing newer, so no process used the GPU; NOT_SUPPORTED: no per-process figure
    assert nvml.process_utilization(0, 300) == ProcessSamples(by_pid={}, last_seen=300)
    assert nvml.process_utilization(1, 0) is None
