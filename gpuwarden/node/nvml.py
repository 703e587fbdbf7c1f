"""NVML behind a small interface: the GPUs of this node and the compute processes on them.

``PynvmlNvml`` is the real implementation (NVIDIA's ``nvidia-ml-py``, imported as ``pynvml``);
``gpuwarden.node.fake.FakeNvml`` is the in-process stand-in the tests use.
"""

from __future__ import annotations

import contextlib
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
class DriverInfo:
    driver_version: str
    cuda_version: str


class Nvml(Protocol):
    def driver(self) -> DriverInfo: ...

    def devices(self) -> tuple[GpuDevice, ...]: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...

    def memory_used(self, index: int) -> int: ...

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
