"""An in-process NVML for tests and dry runs: GPUs and processes you set, calls it records."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuwarden.node.nvml import (
    ComputeMode,
    DriverInfo,
    GpuDevice,
    GpuProcess,
    NvmlError,
    ProcessSamples,
    Utilization,
    mean_samples,
)


@dataclass
class FakeNvml:
    """Holds devices and per-device processes; records hard-limit calls in ``cgroup_limits``.

    Utilization is set per device (``set_utilization``) and per process (``sample``), as NVML's
    process samples are: one entry per sample period, only for processes that used the GPU in it.
    A device in ``no_process_samples`` answers NVML_ERROR_NOT_SUPPORTED to the per-process query.
    """

    gpus: list[GpuDevice] = field(default_factory=list)
    running: dict[int, list[GpuProcess]] = field(default_factory=dict)
    driver_info: DriverInfo = field(
        default_factory=lambda: DriverInfo(driver_version="570.86.15", cuda_version="12.8")
    )
    cgroup_limits: list[tuple[int, str, int]] = field(default_factory=list)
    # index -> message: calls for that device raise NvmlError (a GPU fallen off the bus).
    failing: dict[int, str] = field(default_factory=dict)
    closed: bool = False
    device_utilization: dict[int, Utilization] = field(default_factory=dict)
    # index -> (pid, CPU timestamp in microseconds, sm %, memory %) samples, oldest first.
    process_samples: dict[int, list[tuple[int, int, float, float]]] = field(default_factory=dict)
    no_process_samples: set[int] = field(default_factory=set)
    clock_us: int = 1_000_000

    def add_gpu(
        self,
        memory_total: int,
        *,
        name: str = "NVIDIA A100-SXM4-40GB",
        mig_enabled: bool = False,
        compute_mode: ComputeMode = "exclusive-process",
    ) -> GpuDevice:
        index = len(self.gpus)
        device = GpuDevice(
            index=index,
            uuid=f"GPU-{index:08d}-fake-0000-0000-{index:012d}",
            name=name,
            memory_total=memory_total,
            compute_mode=compute_mode,
            mig_enabled=mig_enabled,
        )
        self.gpus.append(device)
        self.running[index] = []
        return device

    def run(
        self, index: int, pid: int, used_memory: int | None, *, mps_client: bool = True
    ) -> None:
        """Put (or update) a process on a GPU."""
        procs = [p for p in self.running[index] if p.pid != pid]
        procs.append(GpuProcess(pid=pid, used_memory=used_memory, mps_client=mps_client))
        self.running[index] = procs

    def exit(self, pid: int) -> None:
        for index, procs in self.running.items():
            self.running[index] = [p for p in procs if p.pid != pid]

    def set_utilization(self, index: int, sm: float, memory: float = 0.0) -> None:
        """The device's figure, as nvmlDeviceGetUtilizationRates reports it."""
        self.device_utilization[index] = Utilization(sm=sm, memory=memory)

    def sample(self, index: int, pid: int, sm: float, memory: float = 0.0) -> None:
        """One per-process sample on a GPU, stamped after every earlier one."""
        self.clock_us += 1_000_000
        self.process_samples.setdefault(index, []).append((pid, self.clock_us, sm, memory))

    def set_mig(self, index: int, enabled: bool) -> None:
        self.gpus[index] = replace(self.gpus[index], mig_enabled=enabled)

    def _check(self, index: int) -> None:
        if self.closed:
            raise NvmlError("NVML is shut down")
        if index in self.failing:
            raise NvmlError(f"NVML call on GPU {index} failed: {self.failing[index]}")
        if not 0 <= index < len(self.gpus):
            raise NvmlError(f"NVML call failed: no GPU {index}")

    def driver(self) -> DriverInfo:
        return self.driver_info

    def devices(self) -> tuple[GpuDevice, ...]:
        return tuple(self.gpus)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        self._check(index)
        return tuple(sorted(self.running[index], key=lambda p: p.pid))

    def memory_used(self, index: int) -> int:
        self._check(index)
        return sum(p.used_memory or 0 for p in self.running[index])

    def utilization(self, index: int) -> Utilization:
        self._check(index)
        return self.device_utilization.get(index, Utilization(sm=0.0, memory=0.0))

    def process_utilization(self, index: int, last_seen: int) -> ProcessSamples | None:
        self._check(index)
        if index in self.no_process_samples:
            return None
        return mean_samples(self.process_samples.get(index, []), last_seen)

    def set_cgroup_memory_limit(self, index: int, cgroup: str, limit: int) -> None:
        self._check(index)
        self.cgroup_limits.append((index, cgroup, limit))

    def close(self) -> None:
        self.closed = True
