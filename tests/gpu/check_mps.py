#!/usr/bin/env python3
"""The node agent against a real GPU and the real MPS control daemon (issue 6, steps 1-4).

Run on a machine with an NVIDIA GPU (not MIG-enabled), its driver's ``nvidia-cuda-mps-control``
on PATH, and a Python with this project installed plus ``torch`` built for CUDA::

    python tests/gpu/check_mps.py            # prints one line per check, exits 0 when all pass

1. start the MPS control daemon through the agent's code (``ProcessMpsControl``), in private pipe
   and log directories so nothing else on the machine is disturbed;
2. let the agent apply a 2 GiB cap: one tick over a pod whose ``gpuwarden.io/gpu-memory-limit`` is
   2Gi must send ``set_default_device_pinned_mem_limit 0 2048M``, and the daemon must report it;
3. a CUDA process (torch) allocating 3 GiB must fail while one allocating 1 GiB succeeds; neither
   sets ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, so the limit is the daemon's, not the client's;
4. NVML must see the 1 GiB client, MPS must list it as a client of its server, and the agent must
   attribute it to the pod. No kubelet runs here, so the client's ``/proc/<pid>/cgroup`` is
   presented to the agent as that pod's container (the only stand-in; NVML, MPS and the CUDA
   process are real). With the pod's cap lowered to 512Mi the same tick must report a violation.

The daemon is quit at the end, whatever happened.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpuwarden.node import mps  # noqa: E402
from gpuwarden.node.agent import AgentConfig, NodeAgent  # noqa: E402
from gpuwarden.node.nvml import NvmlError, PynvmlNvml  # noqa: E402
from gpuwarden.node.procfs import CgroupOwner, ProcFs  # noqa: E402

MiB = 2**20
GiB = 2**30
POD_UID = "0a0a0a0a-1b1b-4c2c-8d3d-4e4e4e4e4e4e"
CONTAINER_ID = "c" * 64

# The client: allocate N bytes on cuda:0, print the outcome as JSON, optionally hold until stdin.
CLIENT = r"""
import json, os, sys
import torch
size, hold = int(sys.argv[1]), sys.argv[2] == "hold"
try:
    block = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    result = {"ok": True, "pid": os.getpid()}
except Exception as exc:  # torch.OutOfMemoryError or a CUDA error from the MPS limit
    result = {"ok": False, "pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"[:400]}
print(json.dumps(result), flush=True)
if hold and result["ok"]:
    sys.stdin.readline()
"""


@dataclass
class Checks:
    results: list[tuple[bool, str]] = field(default_factory=list)

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        self.results.append((ok, what))
        print(f"{'PASS' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for ok, _ in self.results)


class PodProcFs(ProcFs):
    """The real /proc, except that the chosen PIDs read as the pod's container."""

    def __init__(self, pids: set[int]) -> None:
        super().__init__(Path("/proc"))
        self.pids = pids

    def owner(self, pid: int) -> CgroupOwner | None:
        if pid in self.pids:
            slice_uid = POD_UID.replace("-", "_")
            return CgroupOwner(
                pod_uid=POD_UID,
                container_id=CONTAINER_ID,
                pod_cgroup=f"/kubepods.slice/kubepods-burstable-pod{slice_uid}.slice",
                unified=True,
            )
        return super().owner(pid)


def pod(cap: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-check",
            "namespace": "gpuwarden-check",
            "uid": POD_UID,
            "annotations": {
                "gpuwarden.io/gpu-memory-limit": cap,
                "gpuwarden.io/mps-thread-percentage": "100",
                "gpuwarden.io/containers": "main",
                "gpuwarden.io/gpu-count": "1",
            },
        },
        "spec": {"containers": [{"name": "main", "image": "local"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CONTAINER_ID}"}],
        },
    }


def client_env(control: mps.ProcessMpsControl) -> dict[str, str]:
    env = control.env()
    env.pop("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", None)
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


def allocate(control: mps.ProcessMpsControl, size: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(size), "once"],
        env=client_env(control),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    checks = Checks()
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        print("FAIL nvidia-cuda-mps-control is not on PATH")
        return 1
    if importlib.util.find_spec("torch") is None:
        print(f"FAIL torch is not importable by {sys.executable}")
        return 1
    try:
        nvml = PynvmlNvml.open()
    except NvmlError as exc:
        print(f"FAIL {exc}")
        return 1
    work = Path(tempfile.mkdtemp(prefix="gpuwarden-mps-check-"))
    control = mps.ProcessMpsControl(
        binary=binary, pipe_dir=work / "pipe", log_dir=work / "log", timeout=30.0
    )
    holder: subprocess.Popen[str] | None = None
    try:
        driver = nvml.driver()
        devices = nvml.devices()
        print(f"driver {driver.driver_version}, CUDA {driver.cuda_version}")
        for device in devices:
            print(
                f"GPU {device.index}: {device.name} {device.uuid} "
                f"{device.memory_total / GiB:.1f} GiB, compute mode {device.compute_mode}, "
                f"MIG {'on' if device.mig_enabled else 'off'}"
            )
        if not devices or devices[0].mig_enabled:
            print("FAIL GPU 0 is missing or MIG-enabled: the agent refuses MPS there")
            return 1

        # 1. the daemon, through the agent
        procfs = PodProcFs(set())
        agent = NodeAgent(AgentConfig(node_name="gpu-check"), nvml, control, procfs)
        messages = agent.start()
        for message in messages:
            print(f"agent: {message}")
        checks.check(agent.started_daemon, "1. the agent started the MPS control daemon")
        reply = control.send(mps.GET_DEFAULT_THREADS).strip()
        checks.check(
            mps.parse_percentage(reply) is not None, "1. the daemon answers", f"reply {reply!r}"
        )

        # 2. a 2 GiB cap
        report = agent.tick([pod("2Gi")])
        checks.check(
            "set_default_device_pinned_mem_limit 0 2048M" in report.commands,
            "2. the agent set the 2 GiB default limit on GPU 0",
            f"commands {list(report.commands)} errors {list(report.errors)}",
        )
        limit = control.send("get_default_device_pinned_mem_limit 0").strip()
        checks.check("2048" in limit or limit.startswith("2G"), "2. the daemon reports it", limit)

        # 3. 3 GiB fails, 1 GiB succeeds, with no client-side limit in the environment
        big = allocate(control, 3 * GiB)
        checks.check(not big["ok"], "3. a 3 GiB allocation fails", str(big.get("error", big)))
        small = allocate(control, 1 * GiB)
        checks.check(small["ok"], "3. a 1 GiB allocation succeeds", str(small.get("error", "")))

        # 4. NVML sees a live client and the agent attributes it
        holder = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(1 * GiB), "hold"],
            env=client_env(control),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        started = json.loads(holder.stdout.readline() or '{"ok": false}')
        checks.check(bool(started.get("ok")), "4. a client holds 1 GiB", str(started))
        pid = holder.pid
        procfs.pids.add(pid)
        deadline = time.monotonic() + 20
        seen = []
        while time.monotonic() < deadline:
            seen = [p for p in nvml.processes(0) if p.pid == pid]
            if seen:
                break
            time.sleep(0.2)
        checks.check(bool(seen), "4. NVML lists the client on GPU 0", str(seen))
        report = agent.tick([pod("2Gi")])
        attributed = [p for p in report.processes if p.pid == pid]
        checks.check(
            bool(attributed) and attributed[0].pod is not None,
            "4. the agent attributes it to the pod",
            str(attributed),
        )
        checks.check(
            bool(attributed) and attributed[0].server is not None,
            "4. MPS lists it as a client of its server",
            str([(s.pid, s.uid, s.clients) for s in report.servers]),
        )
        usage = [u for u in report.usage if u.pod.uid == POD_UID]
        checks.check(
            bool(usage) and usage[0].used >= GiB,
            "4. its used memory counts against the pod",
            str(usage),
        )
        report = agent.tick([pod("512Mi")])
        checks.check(
            any(v.pod.uid == POD_UID for v in report.violations),
            "4. above a 512Mi cap it is a violation",
            str([a.message for a in report.actions if hasattr(a, "message")]),
        )
        print(json.dumps(report.to_json(), indent=1, default=str)[:4000])
    except (mps.MpsError, NvmlError, OSError, subprocess.TimeoutExpired) as exc:
        checks.check(False, "the check ran to the end", f"{type(exc).__name__}: {exc}")
    finally:
        if holder is not None and holder.poll() is None:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            try:
                holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                holder.kill()
        try:
            control.send(mps.QUIT)
        except mps.MpsError as exc:
            print(f"quit: {exc}")
        log = work / "log" / "control.log"
        if log.exists():
            print("--- MPS control.log (tail) ---")
            print("\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        nvml.close()
        if not os.environ.get("GPUWARDEN_CHECK_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    print("ALL PASSED" if checks.passed else "SOME CHECKS FAILED")
    return 0 if checks.passed else 1


if __name__ == "__main__":
    sys.exit(main())
