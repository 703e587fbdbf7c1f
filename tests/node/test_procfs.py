"""/proc/<pid>/cgroup -> pod UID and container, for every layout kubelet and the runtimes produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.node.procfs import ProcFs, find_pod_cgroups, owner_from_cgroup

from .conftest import FakeProc

UID = "0b4f6c3e-9a1d-4c2b-8e7f-1a2b3c4d5e6f"
SLICE_UID = UID.replace("-", "_")
CID = "a" * 63 + "1"


@pytest.mark.parametrize(
    ("text", "pod_cgroup"),
    [
        # cgroup v2, systemd driver, containerd
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice",
        ),
        # cgroup v2, systemd driver, CRI-O, Guaranteed pod (no QoS slice)
        (
            f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/crio-{CID}.scope\n",
            f"/kubepods.slice/kubepods-pod{SLICE_UID}.slice",
        ),
        # cgroup v2, cgroupfs driver, BestEffort
        (
            f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
            f"/kubepods/besteffort/pod{UID}",
        ),
        # cgroup v1, cgroupfs driver, docker-era layout, several controllers
        (
            f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
            f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
            f"/kubepods/burstable/pod{UID}",
        ),
        # cgroup v1, systemd driver, docker
        (
            f"4:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice/docker-{CID}.scope\n",
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice",
        ),
        # kind / nested kubelet under kubelet.slice
        (
            f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{SLICE_UID}.slice",
        ),
        # containerd's systemd cgroupsPath form, container in the same component
        (
            f"0::/kubepods-besteffort-pod{SLICE_UID}.slice:cri-containerd:{CID}\n",
            f"/kubepods-besteffort-pod{SLICE_UID}.slice",
        ),
    ],
    ids=[
        "v2-systemd",
        "v2-crio-guaranteed",
        "v2-cgroupfs",
        "v1-cgroupfs",
        "v1-docker",
        "kind",
        "containerd-path",
    ],
)
def test_every_layout_names_the_pod_and_container(text: str, pod_cgroup: str) -> None:
    owner = owner_from_cgroup(text)
    assert owner is not None
    assert owner.pod_uid == UID
    assert owner.container_id == CID
    assert owner.pod_cgroup == pod_cgroup


def test_hybrid_host_prefers_the_unified_line() -> None:
    other = "11111111-2222-3333-4444-555555555555"
    text = f"5:memory:/kubepods/burstable/pod{other}/{CID}\n0::/kubepods/burstable/pod{UID}/{CID}\n"
    owner = owner_from_cgroup(text)
    assert owner is not None and owner.pod_uid == UID and owner.unified


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        # "pod" plus a UUID outside any kubepods hierarchy is not a pod
        f"0::/machine.slice/pod{UID}/{CID}\n",
        "0::/\n",
        "",
        "garbage without colons\n",
    ],
)
def test_processes_outside_pods_have_no_owner(text: str) -> None:
    assert owner_from_cgroup(text) is None


def test_pod_level_process_has_no_container() -> None:
    owner = owner_from_cgroup(f"0::/kubepods/burstable/pod{UID}\n")
    assert owner is not None and owner.container_id is None


def test_conmon_scope_is_not_taken_for_the_container() -> None:
    owner = owner_from_cgroup(
        f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/crio-conmon-{CID}.scope\n"
    )
    assert owner is not None and owner.container_id is None


def test_procfs_reads_owner_uid_and_comm_under_its_root(proc: FakeProc) -> None:
    proc.add_pod_process(4242, UID, CID, uid=1001)
    fs = ProcFs(proc.root)
    owner = fs.owner(4242)
    assert owner is not None and owner.pod_uid == UID
    assert fs.uid(4242) == 1001
    assert fs.comm(4242) == "python"
    # a process that exited between NVML's answer and our read
    assert fs.owner(999) is None and fs.uid(999) is None and fs.comm(999) is None


def test_find_pod_cgroups_reads_a_v2_tree(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "cgroup.controllers").parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    pod_dir = (
        root
        / "kubepods.slice/kubepods-burstable.slice"
        / f"kubepods-burstable-pod{SLICE_UID}.slice"
    )
    (pod_dir / f"cri-containerd-{CID}.scope").mkdir(parents=True)
    other = "99999999-8888-7777-6666-555555555555"
    (root / "kubepods/besteffort" / f"pod{other}").mkdir(parents=True)
    (root / "system.slice/containerd.service").mkdir(parents=True)
    found = find_pod_cgroups(root, {UID, other, "00000000-0000-0000-0000-000000000000"})
    assert found == {UID: pod_dir, other: root / "kubepods/besteffort" / f"pod{other}"}


def test_find_pod_cgroups_is_empty_on_cgroup_v1(tmp_path: Path) -> None:
    (tmp_path / "memory/kubepods" / f"pod{UID}").mkdir(parents=True)
    assert find_pod_cgroups(tmp_path, {UID}) == {}
