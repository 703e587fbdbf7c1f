"""The tenant controller: a ResourceQuota, a Kueue LocalQueue and the dra backend's
ResourceClaimTemplates in every namespace a tenant selects by label, applied as the namespace
appears or changes.

`gpuwarden render` writes these objects only for the namespaces tenants list by name (the chart
installs them); a tenant that selects Kubeflow profile namespaces by label gets each new user's
namespace covered here, without a re-render and a ``helm upgrade``. What a namespace needs comes
from :func:`gpuwarden.policy.render.tenants.namespace_objects`; this module only talks to the API
server: a server-side apply with field manager ``gpuwarden``, never a delete (the objects carry
``app.kubernetes.io/managed-by: gpuwarden`` and go with their namespace).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer
from gpuwarden.policy import PolicySet
from gpuwarden.policy.admission.manifests import namespace_labels
from gpuwarden.policy.render.tenants import namespace_objects

FIELD_MANAGER = "gpuwarden"
APPLY_PATCH = "application/apply-patch+yaml"

log = logging.getLogger("gpuwarden.tenants")


def server_side_apply(api: k8s_client.ApiClient, obj: Mapping[str, Any]) -> None:
    """Apply ``obj`` (a ResourceQuota, a Kueue LocalQueue or a ResourceClaimTemplate) as field
    manager ``gpuwarden``,
    taking over fields another manager set."""
    meta = obj["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    if obj["kind"] == "ResourceQuota":
        k8s_client.CoreV1Api(api).patch_namespaced_resource_quota(
            name,
            namespace,
            dict(obj),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )
        return
    group, version = str(obj["apiVersion"]).split("/")
    plural = f"{str(obj['kind']).lower()}s"
    k8s_client.CustomObjectsApi(api).patch_namespaced_custom_object(
        group,
        version,
        namespace,
        plural,
        name,
        dict(obj),
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type=APPLY_PATCH,
    )


class TenantController:
    """Watches namespaces; applies what each label-selected one needs under the current policies.

    ``policies`` returns the set to apply (None: none valid yet, so nothing is applied). A
    namespace is applied again whenever it changes and at each re-list of the watch, so a policy
    change reaches every namespace within the watch timeout.
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        policies: Callable[[], PolicySet | None],
        *,
        with_kueue: bool,
        watch_timeout: int = 300,
        apply: Callable[[k8s_client.ApiClient, Mapping[str, Any]], None] = server_side_apply,
    ) -> None:
        self._api = api
        self._policies = policies
        self._with_kueue = with_kueue
        self._apply = apply
        self._lock = threading.Lock()
        self.applied = 0
        self.failed = 0
        self.informer: Informer[Mapping[str, str]] = Informer(
            "tenant-namespaces",
            k8s_client.CoreV1Api(api).list_namespace,
            namespace_labels,
            self,
            watch_timeout=watch_timeout,
        )

    # The informer's sink ------------------------------------------------------------------

    def replace(self, items: Mapping[str, Mapping[str, str]]) -> None:
        policies = self._policies()
        for namespace, labels in items.items():
            self._reconcile(policies, namespace, labels)

    def upsert(self, key: str, item: Mapping[str, str]) -> None:
        self._reconcile(self._policies(), key, item)

    def delete(self, key: str) -> None:
        """Nothing to do: a namespace's objects are deleted with it."""

    # -----------------------------------------------------------------------------------------

    def _reconcile(
        self, policies: PolicySet | None, namespace: str, labels: Mapping[str, str]
    ) -> None:
        if policies is None:
            return
        for obj in namespace_objects(policies, namespace, labels, with_kueue=self._with_kueue):
            what = f"{obj['kind']} {namespace}/{obj['metadata']['name']}"
            try:
                self._apply(self._api, obj)
            except ApiException as exc:
                with self._lock:
                    self.failed += 1
                reason = exc.reason or exc.status
                log.warning("tenant controller: cannot apply %s: %s", what, reason)
                continue
            with self._lock:
                self.applied += 1
            log.info("tenant controller: applied %s", what)

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()
