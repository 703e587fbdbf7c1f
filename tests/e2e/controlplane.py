"""The e2e suites' control plane: etcd plus kube-apiserver, from gpuwarden.lab.cluster.controlplane.

It moved into the package so that the scheduling lab (``gpuwarden simulate``) runs on the same
code; the suites keep importing it from here.
"""

from gpuwarden.lab.cluster.controlplane import (
    ADMISSION_PLUGINS,
    BUILD_SCRIPT,
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    Tools,
    ToolsMissingError,
    build_tools,
    cache_dir,
    free_ports,
)
from gpuwarden.lab.cluster.controlplane import die_with_parent as _die_with_parent

__all__ = [
    "ADMISSION_PLUGINS",
    "BUILD_SCRIPT",
    "REPO_ROOT",
    "ControlPlane",
    "ControlPlaneError",
    "Tools",
    "ToolsMissingError",
    "_die_with_parent",
    "build_tools",
    "cache_dir",
    "free_ports",
]
