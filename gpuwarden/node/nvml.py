"""NVML behind a small interface: the GPUs of this node and the compute processes on them.

``PynvmlNvml`` is the real implementation (NVIDIA's ``nvidia-ml-py``, imported as ``pynvml``);
``gpuwarden.node.fake.FakeNvml`` is the in-process stand-in the tests use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

ComputeMode = Literal["default", "exclusive-thread", "prohibited", "exclusive-process", "unknown"]

# nvmlComputeMode_t, in NVML's numbering.
_COMPUTE_MODES: dict[int, ComputeMode] = {
    0: "default",
    1: "exclusive-thread",
    2: "prohibited",
    3: "exclusive-process",
}


class NvmlError(Exception):
    """NVML is missing or refused a call; the message says which and why."""


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    memory_total: int  # bytes
    compute_mode: ComputeMode
    mig_enabled: bool


@dataclass(frozen=True)
class GpuProcess:
    """One process holding a context on one GPU, as NVML reports it."""

    pid: int
    # Bytes; None where NVML cannot tell (it reports "not available").
    used_memory: int | None
    # True when NVML lists it among the MPS clients of the device.
    mps_client: bool = False


@dataclass(frozen=True)
class Utilization:
    """Percentages (0-100) of a sample period: SM (3D/compute) time and memory-bandwidth
    (frame-buffer read/write) time."""

    sm: float
    memory: float


@dataclass(frozen=True)
class ProcessSamples:
    """NVML's per-process utilization since the last read (nvmlDeviceGetProcessUtilization).

    ``by_pid`` holds the mean of each process's samples; a process absent from it had no
    non-zero utilization in the period (NVML returns samples only for those). ``last_seen`` is the
    newest sample's CPU timestamp (microseconds), to pass to the next read.
    """

    by_pid: Mapping[int, Utilization]
    last_seen: int


@dataclass(frozen=True)
class DriverInfo:
    driver_version: str
    cuda_version: str


class Nvml(Protocol):
    def driver(self) -> DriverInfo: ...

    def devices(self) -> tuple[GpuDevice, ...]: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...

    def memory_used(self, index: int) -> int: ...

    def utilization(self, index: int) -> Utilization:
        """The device's SM and memory-bandwidth utilization (nvmlDeviceGetUtilizationRates)."""
        ...

    def process_utilization(self, index: int, last_seen: int) -> ProcessSamples | None:
        """Per-process samples newer than ``last_seen``; None where the GPU or driver has none
        (NVML_ERROR_NOT_SUPPORTED)."""
        ...

    def set_cgroup_memory_limit(self, index: int, cgroup: str, limit: int) -> None:
        """Hard GPU-memory limit for a cgroup (nvmlDeviceSetMemoryLimits_v1, driver r615+)."""
        ...

    def close(self) -> None: ...


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as CUDA writes it ("12.4")."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def merge_processes(
    compute: list[tuple[int, int | None]], mps: list[tuple[int, int | None]]
) -> tuple[GpuProcess, ...]:
    """One entry per PID: NVML can list an MPS client both as a compute process and a client."""
    merged: dict[int, GpuProcess] = {}
    for source, is_client in ((compute, False), (mps, True)):
        for pid, used in source:
            known = merged.get(pid)
            if known is None:
                merged[pid] = GpuProcess(pid=pid, used_memory=used, mps_client=is_client)
                continue
            best = known.used_memory
            if used is not None and (best is None or used > best):
                best = used
            merged[pid] = GpuProcess(
                pid=pid, used_memory=best, mps_client=known.mps_client or is_client
            )
    return tuple(merged[pid] for pid in sorted(merged))


def mean_samples(
    samples: Iterable[tuple[int, int, float, float]], last_seen: int
) -> ProcessSamples:
    """(pid, timestamp, sm, memory) samples as one mean per PID; samples not newer than
    ``last_seen`` are dropped (a driver may return the buffer's older entries too)."""
    sums: dict[int, tuple[int, float, float]] = {}
    newest = last_seen
    for pid, stamp, sm, memory in samples:
        if stamp <= last_seen:
            continue
        newest = max(newest, stamp)
        count, sm_sum, memory_sum = sums.get(pid, (0, 0.0, 0.0))
        sums[pid] = (count + 1, sm_sum + sm, memory_sum + memory)
    return ProcessSamples(
        by_pid={
            pid: Utilization(sm=sm_sum / count, memory=memory_sum / count)
            for pid, (count, sm_sum, memory_sum) in sorted(sums.items())
        },
        last_seen=newest,
    )


class PynvmlNvml:
    """The real NVML, through nvidia-ml-py. Open with :meth:`open`; close when done."""

    def __init__(self, module: Any) -> None:
        self._nvml = module

    @classmethod
    def open(cls) -> PynvmlNvml:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise NvmlError(f"nvidia-ml-py is not installed: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(
                f"NVML is not available ({exc}): is the NVIDIA driver installed, and does the "
                "agent's container see libnvidia-ml.so.1 (NVIDIA container runtime, or the "
                "driver root mounted)?"
            ) from exc
        return cls(pynvml)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlError(f"NVML {what} failed: {exc}") from exc

    def _handle(self, index: int) -> Any:
        return self._call(
            f"nvmlDeviceGetHandleByIndex({index})", self._nvml.nvmlDeviceGetHandleByIndex, index
        )

    def driver(self) -> DriverInfo:
        driver = self._call("nvmlSystemGetDriverVersion", self._nvml.nvmlSystemGetDriverVersion)
        cuda = self._call(
            "nvmlSystemGetCudaDriverVersion", self._nvml.nvmlSystemGetCudaDriverVersion
        )
        return DriverInfo(driver_version=str(driver), cuda_version=cuda_version_text(int(cuda)))

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError:
            return False  # NVML_ERROR_NOT_SUPPORTED: a GPU without MIG
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def devices(self) -> tuple[GpuDevice, ...]:
        count = int(self._call("nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount))
        found = []
        for index in range(count):
            handle = self._handle(index)
            memory = self._call(
                "nvmlDeviceGetMemoryInfo", self._nvml.nvmlDeviceGetMemoryInfo, handle
            )
            try:
                mode = _COMPUTE_MODES.get(
                    int(self._nvml.nvmlDeviceGetComputeMode(handle)), "unknown"
                )
            except self._nvml.NVMLError:
                mode = "unknown"
            found.append(
                GpuDevice(
                    index=index,
                    uuid=str(self._call("nvmlDeviceGetUUID", self._nvml.nvmlDeviceGetUUID, handle)),
                    name=str(self._call("nvmlDeviceGetName", self._nvml.nvmlDeviceGetName, handle)),
                    memory_total=int(memory.total),
                    compute_mode=mode,
                    mig_enabled=self._mig_enabled(handle),
                )
            )
        return tuple(found)

    @staticmethod
    def _pairs(raw: Any) -> list[tuple[int, int | None]]:
        out: list[tuple[int, int | None]] = []
        for info in raw:
            used = info.usedGpuMemory
            out.append((int(info.pid), None if used is None else int(used)))
        return out

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        handle = self._handle(index)
        compute = self._call(
            "nvmlDeviceGetComputeRunningProcesses",
            self._nvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
        )
        try:
            clients = self._nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
        except self._nvml.NVMLError:
            clients = []  # drivers or GPUs without the MPS process query
        return merge_processes(self._pairs(compute), self._pairs(clients))

    def memory_used(self, index: int) -> int:
        memory = self._call(
            "nvmlDeviceGetMemoryInfo", self._nvml.nvmlDeviceGetMemoryInfo, self._handle(index)
        )
        return int(memory.used)

    def utilization(self, index: int) -> Utilization:
        rates = self._call(
            "nvmlDeviceGetUtilizationRates",
            self._nvml.nvmlDeviceGetUtilizationRates,
            self._handle(index),
        )
        return Utilization(sm=float(rates.gpu), memory=float(rates.memory))

    def process_utilization(self, index: int, last_seen: int) -> ProcessSamples | None:
        handle = self._handle(index)
        try:
            raw = self._nvml.nvmlDeviceGetProcessUtilization(handle, last_seen)
        except self._nvml.NVMLError_NotFound:
            # No sample newer than last_seen: no process used the GPU since then.
            return ProcessSamples(by_pid={}, last_seen=last_seen)
        except self._nvml.NVMLError_NotSupported:
            return None
        except self._nvml.NVMLError as exc:
            raise NvmlError(f"NVML nvmlDeviceGetProcessUtilization failed: {exc}") from exc
        return mean_samples(
            ((int(s.pid), int(s.timeStamp), float(s.smUtil), float(s.memUtil)) for s in raw),
            last_seen,
        )

    def set_cgroup_memory_limit(self, index: int, cgroup: str, limit: int) -> None:
        limits = self._nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        limits.softLimit = 0
        limits.hardLimit = limit
        self._call(
            f"nvmlDeviceSetMemoryLimits_v1({index}, {cgroup})",
            self._nvml.nvmlDeviceSetMemoryLimits_v1,
            self._handle(index),
            limits,
        )

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
