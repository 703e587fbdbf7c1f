"""An ApiClient from a kubeconfig file or the pod's service account."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException


class KubeConfigError(Exception):
    """No usable cluster credentials; the message says where gpuwarden looked."""


def api_client(kubeconfig: Path | None = None) -> k8s_client.ApiClient:
    """From ``kubeconfig`` if given, else in-cluster, else the default kubeconfig."""
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is not None:
            if not kubeconfig.is_file():
                raise KubeConfigError(f"{kubeconfig}: no such kubeconfig file")
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except ConfigException:
                k8s_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        raise KubeConfigError(
            f"no cluster credentials ({exc}); pass --kubeconfig, run in a pod, "
            "or pass --namespaces FILE to run without a cluster"
        ) from exc
    # TCP keepalive on the pooled connections: a peer that vanished (a NAT or load balancer
    # that dropped the flow) is noticed instead of a request hanging on it.
    configuration.keep_alive = True
    return k8s_client.ApiClient(configuration)
