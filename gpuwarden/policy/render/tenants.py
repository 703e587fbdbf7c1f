"""What a namespace a tenant selects by label needs: its ResourceQuota, Kueue LocalQueue and the
dra backend's ResourceClaimTemplates.

`gpuwarden render` writes these objects only for namespaces a tenant lists by name (it cannot
know the others); the tenant controller (:mod:`gpuwarden.kube.tenants`) asks this module for
each namespace it sees, so a new Kubeflow profile namespace gets them as it appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.policy.pod import keys
from gpuwarden.policy.render import kueue
from gpuwarden.policy.render.claims import claim_templates
from gpuwarden.policy.render.objects import (
    ANNOTATION_RENDERED_FROM,
    MANAGED_BY,
    resource_quota,
    tenant_plans,
    tenant_quota_hard,
)
from gpuwarden.policy.spec.model import Tenant
from gpuwarden.policy.spec.policyset import PolicySet


def label_selected_tenant(
    policies: PolicySet, namespace: str, labels: Mapping[str, str]
) -> Tenant | None:
    """The tenant that selects the namespace by its labels; None when one lists it by name
    (render writes its objects, through the chart) or none selects it."""
    if namespace in policies.tenant_by_namespace:
        return None
    return policies.tenant_for(namespace, labels)


def namespace_objects(
    policies: PolicySet, namespace: str, labels: Mapping[str, str], *, with_kueue: bool
) -> list[dict[str, Any]]:
    """The objects the tenant controller applies in a label-selected namespace, as render would
    write them had the tenant listed it by name; empty for every other namespace."""
    tenant = label_selected_tenant(policies, namespace, labels)
    if tenant is None:
        return []
    document = policies.tenant_policy(tenant)
    policy = document.metadata.name if document is not None else ""
    source = {ANNOTATION_RENDERED_FROM: f"{policy}/tenants/{tenant.name}"}
    tenant_labels = {**MANAGED_BY, keys.ANNOTATION_TENANT: tenant.name}
    objects: list[dict[str, Any]] = []
    hard = tenant_quota_hard(policies, tenant)
    if hard:
        objects.append(resource_quota(namespace, tenant, policy, hard))
    if with_kueue and (tenant.quota is not None or tenant.queue_spec is not None):
        queue = kueue.tenant_queue(tenant, tenant_plans(policies, tenant))
        if queue is not None:
            objects.append(
                kueue.local_queue(namespace, queue.name, labels=tenant_labels, annotations=source)
            )
    objects += claim_templates(policies, namespace, labels)
    return objects
