"""Which pod a host process belongs to: ``/proc/<pid>/cgroup`` -> pod UID and container ID.

Handles cgroup v1 and v2 files and both kubelet cgroup drivers:

* cgroupfs: ``/kubepods/burstable/pod<uid>/<container-id>`` (Guaranteed pods sit directly
  under ``/kubepods``);
* systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``
  (also ``crio-<id>.scope``, ``docker-<id>.scope``, and containerd's
  ``...pod<uid>.slice:cri-containerd:<id>`` form).

Everything is read under an injectable root (``/proc`` by default, or ``/host/proc`` when the host's
proc is mounted elsewhere) so tests can use a temporary directory. Nothing here writes anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# A pod's cgroup component: "pod<uid>" (cgroupfs) or "[kubelet-]kubepods[-<qos>]-pod<uid_>.slice"
# (systemd); it counts only below (or as) a component naming kubepods.
_POD_COMPONENT = re.compile(rf"^(?:[a-z0-9]+-)*pod(?P<uid>{_UUID})(?:\.slice)?(?::.*)?$")
_CONTAINER_ID = re.compile(r"(?<![0-9a-f])(?P<id>[0-9a-f]{64})(?![0-9a-f])")
_CONMON = re.compile(r"^crio-conmon-")


@dataclass(frozen=True)
class CgroupOwner:
    """The pod (and container, where the path names one) that a cgroup path belongs to."""

    pod_uid: str
    container_id: str | None
    # The pod-level cgroup path, relative to the hierarchy root (e.g. "/kubepods/burstable/pod<uid>").
    pod_cgroup: str
    unified: bool  # from a cgroup v2 ("0::") line


def owner_of_path(path: str, *, unified: bool = False) -> CgroupOwner | None:
    components = [c for c in path.split("/") if c]
    for position, component in enumerate(components):
        match = _POD_COMPONENT.match(component)
        if match is None:
            continue
        if not any("kubepods" in c for c in components[: position + 1]):
            continue
        uid = match["uid"].replace("_", "-")
        container: str | None = None
        # containerd's systemd form keeps the container in the same component after ':'.
        tail = components[position + 1 :] or [component.partition(":")[2]]
        for part in tail:
            if not part or _CONMON.match(part):
                continue
            found = _CONTAINER_ID.search(part)
            if found is not None:
                container = found["id"]
                break
        pod_component = component.partition(":")[0]
        pod_cgroup = "/" + "/".join([*components[:position], pod_component])
        return CgroupOwner(
            pod_uid=uid, container_id=container, pod_cgroup=pod_cgroup, unified=unified
        )
    return None


def owner_from_cgroup(text: str) -> CgroupOwner | None:
    """Parse a ``/proc/<pid>/cgroup`` file; None for a process outside any pod.

    The cgroup v2 line (``0::<path>``) wins; on v1 (or hybrid) hosts the first controller line
    that names a pod is used.
    """
    v1: CgroupOwner | None = None
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        if not sep:
            continue
        controllers, sep, path = rest.partition(":")
        if not sep:
            continue
        if hierarchy == "0" and controllers == "":
            owner = owner_of_path(path, unified=True)
            if owner is not None:
                return owner
        elif v1 is None:
            v1 = owner_of_path(path)
    return v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None  # the process exited, or we may not read it


class ProcFs:
    """Reads ``<root>/<pid>/{cgroup,status,comm}``; a vanished process reads as None."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def owner(self, pid: int) -> CgroupOwner | None:
        text = _read(self.root / str(pid) / "cgroup")
        return None if text is None else owner_from_cgroup(text)

    def uid(self, pid: int) -> int | None:
        """The real UID (first field of the ``Uid:`` line of ``status``)."""
        text = _read(self.root / str(pid) / "status")
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    return int(fields[1])
        return None

    def comm(self, pid: int) -> str | None:
        text = _read(self.root / str(pid) / "comm")
        return None if text is None else text.strip()


def _walk(root: Path, depth: int, *, inside: bool = False) -> Iterator[Path]:
    """Directories under root, descending only into the kubepods part of the tree."""
    if depth < 0:
        return
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        yield path
        below = inside or "kubepods" in entry.name
        # One level of non-kubepods parents is allowed (kubelet.slice, a --cgroup-root).
        if below or depth >= 4:
            yield from _walk(path, depth - 1, inside=below)


def find_pod_cgroups(cgroup_root: Path, pod_uids: set[str]) -> dict[str, Path]:
    """Pod-level cgroup directories on a cgroup v2 host, found by reading (never writing) the tree.

    Kubelet creates a pod's cgroup before its containers, so a limit keyed on it can be in place
    before the first CUDA context. Empty on cgroup v1 hosts (no ``cgroup.controllers`` at the root).
    """
    if not pod_uids or not (cgroup_root / "cgroup.controllers").is_file():
        return {}
    found: dict[str, Path] = {}
    for path in _walk(cgroup_root, 4):
        owner = owner_of_path("/" + path.relative_to(cgroup_root).as_posix(), unified=True)
        if owner is not None and owner.container_id is None and owner.pod_uid in pod_uids:
            found.setdefault(owner.pod_uid, path)
    return found
