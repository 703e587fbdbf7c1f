"""`gpuwarden render --kueue`: tenant queues as Kueue's ClusterQueues, ResourceFlavors and
LocalQueues, checked against the CRD schemas Kueue v0.17.0 ships in its Go module."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuwarden.cli import main as gpuwarden
from gpuwarden.lab.cluster.kueue import crd_manifests, crd_schema, module_dir
from gpuwarden.policy import PolicyError, PolicySet, load_texts
from gpuwarden.policy.lint import lint_warnings
from gpuwarden.policy.pod.resources import GPU_COUNT_RESOURCES
from gpuwarden.policy.render.kueue import (
    DEFAULT_LOCAL_QUEUE,
    KUEUE_API,
    configuration_requirements,
    excluded_resource_prefixes,
)
from gpuwarden.policy.render.objects import Rendering, RenderOptions, render
from gpuwarden.policy.spec.backends import plan_for

from .support import NO_DRA_GPUS

Obj = dict[str, Any]
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue")
ONLY_KUEUE = RenderOptions(priority_classes=False, quotas=False, queues=False, kueue=True)


def _policy(spec: str) -> PolicySet:
    text = "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n" + spec
    return load_texts([("p.yaml", text)])


# Three tenants share one cohort of whole GPUs: vision lends and may borrow up to 8, nlp keeps its
# 2 to itself (guarantee = quota), research has no quota of its own and only borrows.
TEAMS = """
  backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared, mpsReplicas: 4}
  profiles:
    - {name: training, gpuShare: false, gpus: 1, priority: 200}
    - {name: batch, gpuShare: false, gpus: 1, priority: 10, preemptible: true}
    - {name: notebook, gpuShare: true, maxMemory: 16Gi, priority: 100}
  tenants:
    - name: vision
      namespaces: [vision]
      queue: vision
      quota: {gpus: 4}
      queueSpec: {weight: 2, capability: {nvidia.com/gpu: "8"}}
    - name: nlp
      namespaces: [nlp, nlp-dev]
      queue: nlp
      quota: {gpus: 2}
      queueSpec: {guarantee: {nvidia.com/gpu: "2"}}
    - name: research
      namespaces: [research]
      queue: research
      limits: {allowedProfiles: [training]}
      queueSpec: {weight: 1}
    - name: everyone
      namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}
"""

# Every backend and pool: NVIDIA MPS replicas under the same name as whole GPUs, Volcano vGPU,
# HAMi, native; a tenant known only by label.
EVERY_POOL = """
  backend: {type: nvidia}
  profiles:
    - {name: whole, gpuShare: false, gpus: 2, priority: 5}
    - {name: mps, gpuShare: true, maxMemory: 8Gi, priority: 5}
    - {name: vgpu, gpuShare: true, maxMemory: 8Gi, backend: volcano}
    - {name: hami, gpuShare: true, maxMemory: 8Gi, backend: hami}
    - {name: plain, gpuShare: false, backend: native}
  tenants:
    - {name: mixed, namespaces: [mixed], quota: {gpus: 3}}
    - name: labelled
      namespaceSelector:
        matchLabels: {team: labelled}
        matchExpressions: [{key: tier, operator: In, values: [gpu]}]
      limits: {allowedProfiles: [whole, mps]}
      quota: {gpus: 1}
"""


@pytest.fixture(scope="module")
def kueue_crds() -> list[Obj]:
    """Kueue v0.17.0's CRDs from its Go module (fetched through the module proxy if needed)."""
    return crd_manifests(module_dir())


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as the API server's strict field validation does
    (a structural schema would prune them silently)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def schema_errors(crds: Sequence[Obj], obj: Mapping[str, Any]) -> list[str]:
    group, version = str(obj["apiVersion"]).split("/")
    assert group == "kueue.x-k8s.io"
    schema = _strict(crd_schema(crds, str(obj["kind"]), version))
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(dict(obj))
    ]


def _kueue_objects(rendering: Rendering) -> Iterator[Obj]:
    return (o for o in rendering.objects if o["apiVersion"] == KUEUE_API)


def _queues(rendering: Rendering) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in rendering.of_kind("ClusterQueue")}


def _quotas(queue: Mapping[str, Any]) -> dict[tuple[str, str], Obj]:
    """(flavor, resource) -> the quota entry, over every resource group."""
    return {
        (flavor["name"], entry["name"]): entry
        for group in queue["spec"]["resourceGroups"]
        for flavor in group["flavors"]
        for entry in flavor["resources"]
    }


@pytest.mark.parametrize("spec", [TEAMS, EVERY_POOL], ids=["teams", "every-pool"])
def test_rendered_objects_fit_kueues_crd_schemas(kueue_crds: list[Obj], spec: str) -> None:
    rendering = render(_policy(spec), ONLY_KUEUE)
    objects = list(_kueue_objects(rendering))
    assert {o["kind"] for o in objects} == set(KUEUE_KINDS)
    assert len(objects) == len(rendering.objects)
    for obj in objects:
        assert schema_errors(kueue_crds, obj) == [], obj


def test_the_schema_check_catches_what_kueue_would_refuse(kueue_crds: list[Obj]) -> None:
    """The check is not vacuous: an unknown field, a bad enum and a bad quantity each fail."""
    queue = _queues(render(_policy(TEAMS), ONLY_KUEUE))["vision"]
    typo = copy.deepcopy(queue)
    typo["spec"]["cohort"] = typo["spec"].pop("cohortName")  # v1beta1's name
    assert any("cohort" in e for e in schema_errors(kueue_crds, typo))
    enum = copy.deepcopy(queue)
    enum["spec"]["preemption"]["reclaimWithinCohort"] = "Always"
    assert any("Always" in e for e in schema_errors(kueue_crds, enum))
    quantity = copy.deepcopy(queue)
    quantity["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "4 GPUs"
    assert any("nominalQuota" in e for e in schema_errors(kueue_crds, quantity))


def test_kueue_objects_only_when_asked() -> None:
    assert not list(_kueue_objects(render(_policy(TEAMS))))


def test_a_cluster_queue_per_tenant_from_its_quota_and_queue_spec() -> None:
    rendering = render(_policy(TEAMS), ONLY_KUEUE)
    queues = _queues(rendering)
    # The tenant with neither quota nor queueSpec is not queued by Kueue.
    assert set(queues) == {"vision", "nlp", "research"}
    assert {q["spec"]["cohortName"] for q in queues.values()} == {"gpuwarden"}

    vision = _quotas(queues["vision"])
    # capability 8 = the quota of 4 plus 4 it may borrow; no guarantee: it lends all 4.
    assert vision[("gpuwarden-whole-gpus", "nvidia.com/gpu")] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "4",
        "borrowingLimit": "4",
    }
    # Shared slices are their own resource here (renamed), in their own pool, unbounded
    # borrowing: 4 GPUs of 4 MPS replicas each, as no sharedGpus splits the quota.
    assert vision[("gpuwarden-mps-gpus", "nvidia.com/gpu.shared")] == {
        "name": "nvidia.com/gpu.shared",
        "nominalQuota": "16",
    }
    assert queues["vision"]["spec"]["fairSharing"] == {"weight": 2}

    # nlp's guarantee is its whole quota: it lends nothing, and may still borrow.
    nlp = _quotas(queues["nlp"])
    assert nlp[("gpuwarden-whole-gpus", "nvidia.com/gpu")] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "2",
        "lendingLimit": "0",
    }
    assert queues["nlp"]["spec"]["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["nlp", "nlp-dev"]}
        ]
    }

    # research has no quota: it owns nothing and borrows what the others lend.
    assert _quotas(queues["research"]) == {
        ("gpuwarden-whole-gpus", "nvidia.com/gpu"): {"name": "nvidia.com/gpu", "nominalQuota": "0"}
    }

    local = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in rendering.of_kind("LocalQueue")
    }
    assert set(local) == {
        (ns, DEFAULT_LOCAL_QUEUE) for ns in ("vision", "nlp", "nlp-dev", "research")
    }
    assert local[("nlp-dev", "default")]["spec"] == {"clusterQueue": "nlp"}
    assert not rendering.warnings
    # Without sharedGpus each pool holds the whole quota, which render says.
    assert (
        "tenant vision: its quota holds each GPU pool on its own (nvidia.com/gpu.shared in "
        "gpuwarden-mps-gpus 16 (4 GPUs x 4), nvidia.com/gpu in gpuwarden-whole-gpus 4), so "
        "together they may hold more than quota.gpus (4) GPUs; quota.sharedGpus splits "
        "quota.gpus between whole GPUs and shared slices"
    ) in rendering.notes


def test_pools_are_flavors_with_gfd_node_labels() -> None:
    rendering = render(_policy(TEAMS), ONLY_KUEUE)
    flavors = {o["metadata"]["name"]: o["spec"] for o in rendering.of_kind("ResourceFlavor")}
    assert flavors == {
        "gpuwarden-mps-gpus": {"nodeLabels": {"nvidia.com/gpu.sharing-strategy": "mps"}},
        "gpuwarden-whole-gpus": {"nodeLabels": {"nvidia.com/gpu.sharing-strategy": "none"}},
    }


def test_one_resource_in_two_pools_shares_a_resource_group() -> None:
    rendering = render(_policy(EVERY_POOL), ONLY_KUEUE)
    mixed = _queues(rendering)["mixed"]
    groups = {
        tuple(g["coveredResources"]): [f["name"] for f in g["flavors"]]
        for g in mixed["spec"]["resourceGroups"]
    }
    # nvidia.com/gpu: MPS replicas (tried first by shared pods), whole GPUs of NVIDIA's and the
    # native backend, and HAMi's slices; Volcano's slices are another resource of the slice pool,
    # so the slice pool's resources share one group.
    assert groups == {
        ("nvidia.com/gpu", "volcano.sh/vgpu-number"): [
            "gpuwarden-mps-gpus",
            "gpuwarden-whole-gpus",
            "gpuwarden-gpu-slices",
        ]
    }
    quotas = _quotas(mixed)
    # Volcano vGPU: 3 GPUs of the device plugin's default 10 slices each.
    assert quotas[("gpuwarden-gpu-slices", "volcano.sh/vgpu-number")]["nominalQuota"] == "30"
    # A pool that does not serve a resource of its group holds none of it.
    assert quotas[("gpuwarden-whole-gpus", "volcano.sh/vgpu-number")] == {
        "name": "volcano.sh/vgpu-number",
        "nominalQuota": "0",
        "borrowingLimit": "0",
    }
    assert any(
        "tenant mixed: its quota holds each GPU pool on its own (nvidia.com/gpu in "
        "gpuwarden-mps-gpus 6 (3 GPUs x 2), nvidia.com/gpu in gpuwarden-whole-gpus 3, "
        "nvidia.com/gpu in gpuwarden-gpu-slices 30 (3 GPUs x 10), volcano.sh/vgpu-number in "
        "gpuwarden-gpu-slices 30 (3 GPUs x 10))" in note
        for note in rendering.notes
    )
    # The nvidia backend says no mpsReplicas: render assumes 2 and says so.
    assert any(
        "tenant mixed: profile mps shares GPUs on an nvidia backend that sets no mpsReplicas; "
        "the quota of nvidia.com/gpu in gpuwarden-mps-gpus assumes 2 MPS replicas per GPU" in w
        for w in rendering.warnings
    )
    # Volcano queues its pods itself: two queues for one pod is said.
    assert any("queued by Volcano's Queue as well" in w for w in rendering.warnings)


def test_a_tenant_known_by_label_gets_its_selector_and_no_local_queue() -> None:
    rendering = render(_policy(EVERY_POOL), ONLY_KUEUE)
    labelled = _queues(rendering)["labelled"]
    assert labelled["spec"]["namespaceSelector"] == {
        "matchLabels": {"team": "labelled"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}],
    }
    assert [o["metadata"]["namespace"] for o in rendering.of_kind("LocalQueue")] == ["mixed"]
    assert any(
        "tenant labelled selects its namespaces by label, so no LocalQueue" in n
        and "tenant-controller --kueue" in n
        for n in rendering.notes
    )


def test_reclaim_follows_the_borrowers_reclaimable() -> None:
    """Kueue reclaims on the lender's side: one unreclaimable borrower stops every lender."""
    base = """
  backend: {type: native}
  profiles: [{name: w, gpuShare: false, gpus: 1}]
  tenants:
    - {name: a, namespaces: [a], queue: a, quota: {gpus: 2}}
    - {name: b, namespaces: [b], queue: b, quota: {gpus: 2}, queueSpec: {reclaimable: %s}}
"""
    reclaim = {
        name: q["spec"]["preemption"]["reclaimWithinCohort"]
        for name, q in _queues(render(_policy(base % "true"), ONLY_KUEUE)).items()
    }
    assert reclaim == {"a": "Any", "b": "Any"}
    rendering = render(_policy(base % "false"), ONLY_KUEUE)
    reclaim = {
        n: q["spec"]["preemption"]["reclaimWithinCohort"] for n, q in _queues(rendering).items()
    }
    # a may not take back what b borrowed; b may still reclaim from a (a is reclaimable).
    assert reclaim == {"a": "Never", "b": "Any"}
    (warning,) = rendering.warnings
    assert "tenant b: queueSpec.reclaimable false" in warning
    # An unreclaimable tenant that cannot borrow (capability = quota) leaves reclaim on.
    capped = (base % "false").replace(
        "reclaimable: false", 'reclaimable: false, capability: {nvidia.com/gpu: "2"}'
    )
    rendering = render(_policy(capped), ONLY_KUEUE)
    assert {
        q["spec"]["preemption"]["reclaimWithinCohort"] for q in _queues(rendering).values()
    } == {"Any"}
    assert not rendering.warnings


def test_within_cluster_queue_preemption_follows_the_profiles_priorities() -> None:
    queues = _queues(render(_policy(TEAMS), ONLY_KUEUE))
    # vision's training (200, PreemptLowerPriority) may preempt its batch (10).
    assert queues["vision"]["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    # research has one profile: nothing to preempt by priority.
    assert queues["research"]["spec"]["preemption"]["withinClusterQueue"] == "Never"
    never = _policy(
        "  backend: {type: native}\n  profiles:\n"
        "    - {name: hi, gpuShare: false, priority: 9, preemptionPolicy: Never}\n"
        "    - {name: lo, gpuShare: false, priority: 1}\n"
        "  tenants: [{name: t, namespaces: [t], quota: {gpus: 1}}]\n"
    )
    (queue,) = render(never, ONLY_KUEUE).of_kind("ClusterQueue")
    assert queue["spec"]["preemption"]["withinClusterQueue"] == "Never"


def test_queue_spec_fields_a_cluster_queue_cannot_hold_are_said() -> None:
    policies = _policy(
        "  backend: {type: native}\n  profiles: [{name: w, gpuShare: false}]\n"
        "  tenants:\n    - name: t\n      namespaces: [t]\n      queue: t\n      quota: {gpus: 4}\n"
        '      queueSpec: {capability: {nvidia.com/gpu: "2", cpu: "8"}, guarantee: {nvidia.com/gpu: "6"}}\n'
    )
    rendering = render(policies, ONLY_KUEUE)
    (queue,) = rendering.of_kind("ClusterQueue")
    assert _quotas(queue)[("gpuwarden-whole-gpus", "nvidia.com/gpu")] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "4",
        "borrowingLimit": "0",
        "lendingLimit": "0",
    }
    text = "\n".join(rendering.warnings)
    assert (
        "capability nvidia.com/gpu 2 is below the nominal quota of nvidia.com/gpu in "
        "gpuwarden-whole-gpus (4)" in text
    )
    assert (
        "guarantee nvidia.com/gpu 6 is above the nominal quota of nvidia.com/gpu in "
        "gpuwarden-whole-gpus (4)" in text
    )
    assert "queueSpec.capability cpu is not in its ClusterQueue" in text


# --- quota.gpus over shared pools: slices per GPU and quota.sharedGpus ----------------------

SHARED_POOLS = """
  backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared, mpsReplicas: 4}
  profiles:
    - {name: whole, gpuShare: false, gpus: 1}
    - {name: mps, gpuShare: true, maxMemory: 8Gi}
    - {name: vgpu, gpuShare: true, maxMemory: 8Gi, backend: {type: volcano, deviceSplitCount: 5}}
    - {name: hami, gpuShare: true, maxMemory: 8Gi, backend: hami}
    - {name: hami-whole, gpuShare: false, backend: hami}
  tenants:
%s
"""


def _tenant(profiles: str, quota: str) -> str:
    """Tenant t of SHARED_POOLS, allowed ``profiles``, with ``quota``."""
    return (
        f"    - {{name: t, namespaces: [t], limits: {{allowedProfiles: [{profiles}]}}, "
        f"quota: {quota}}}"
    )


def _cell(resource: str, nominal: str, **limits: str) -> Obj:
    """A ClusterQueue's quota entry for ``resource``."""
    return {"name": resource, "nominalQuota": nominal, **limits}


def _one_queue(tenant: str) -> tuple[Rendering, dict[tuple[str, str], Obj]]:
    rendering = render(_policy(SHARED_POOLS % tenant), ONLY_KUEUE)
    (queue,) = rendering.of_kind("ClusterQueue")
    return rendering, _quotas(queue)


@pytest.mark.parametrize(
    ("profile", "cell", "nominal"),
    [
        # NVIDIA's device plugin: replicas per GPU, as backend.mpsReplicas says.
        ("mps", ("gpuwarden-mps-gpus", "nvidia.com/gpu.shared"), "16"),
        # volcano-vgpu device plugin: deviceSplitCount, set to 5 here.
        ("vgpu", ("gpuwarden-gpu-slices", "volcano.sh/vgpu-number"), "20"),
        # HAMi: its default deviceSplitCount, 10.
        ("hami", ("gpuwarden-gpu-slices", "nvidia.com/gpu"), "40"),
    ],
)
def test_a_shared_pool_counts_slices_per_gpu(
    profile: str, cell: tuple[str, str], nominal: str
) -> None:
    tenant = _tenant(profile, "{gpus: 4}")
    rendering, quotas = _one_queue(tenant)
    assert quotas == {cell: _cell(cell[1], nominal)}
    assert not [w for w in rendering.warnings if "Volcano's Queue as well" not in w]
    # The ResourceQuota charges the same slices.
    policies = _policy(SHARED_POOLS % tenant)
    (quota,) = render(policies, RenderOptions(priority_classes=False, queues=False)).of_kind(
        "ResourceQuota"
    )
    assert quota["spec"]["hard"][f"requests.{cell[1]}"] == nominal


def test_shared_gpus_split_the_quota_between_whole_gpus_and_slices() -> None:
    tenant = _tenant("whole, mps", "{gpus: 4, sharedGpus: 1}")
    rendering, quotas = _one_queue(tenant)
    # 3 whole GPUs and 1 GPU of 4 MPS replicas: 4 GPUs in all, not 4 of each.
    assert quotas == {
        ("gpuwarden-mps-gpus", "nvidia.com/gpu.shared"): _cell("nvidia.com/gpu.shared", "4"),
        ("gpuwarden-whole-gpus", "nvidia.com/gpu"): _cell("nvidia.com/gpu", "3"),
    }
    assert not rendering.warnings
    assert not [n for n in rendering.notes if "each GPU pool on its own" in n]
    (quota,) = render(_policy(SHARED_POOLS % tenant)).of_kind("ResourceQuota")
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "3",
        "requests.nvidia.com/gpu.shared": "4",
        **NO_DRA_GPUS,
    }


def test_one_resource_for_whole_gpus_and_slices_adds_both_parts() -> None:
    """HAMi asks for whole GPUs and slices by one resource in one pool: the nominal quota is the
    whole GPUs plus the shared GPUs' slices, and render says whole GPUs count as one slice."""
    rendering, quotas = _one_queue(_tenant("hami, hami-whole", "{gpus: 3, sharedGpus: 1}"))
    assert quotas == {("gpuwarden-gpu-slices", "nvidia.com/gpu"): _cell("nvidia.com/gpu", "12")}
    assert any(
        "tenant t: whole-GPU and shared pods both ask for nvidia.com/gpu in gpuwarden-gpu-slices, "
        "which counts a whole GPU as one, like a slice" in note
        for note in rendering.notes
    )


def test_limits_are_in_the_resources_units() -> None:
    """capability and guarantee count what the resource counts (slices for a shared one), as
    the nominal quota now does: 2 shared GPUs are 8 replicas; capability 12 borrows 4 more."""
    tenant = (
        "    - name: t\n      namespaces: [t]\n      queue: t\n"
        "      limits: {allowedProfiles: [whole, mps]}\n"
        "      quota: {gpus: 4, sharedGpus: 2}\n"
        '      queueSpec: {capability: {nvidia.com/gpu.shared: "12", nvidia.com/gpu: "4"}, '
        'guarantee: {nvidia.com/gpu.shared: "4"}}'
    )
    rendering, quotas = _one_queue(tenant)
    assert quotas == {
        ("gpuwarden-mps-gpus", "nvidia.com/gpu.shared"): _cell(
            "nvidia.com/gpu.shared", "8", borrowingLimit="4", lendingLimit="4"
        ),
        ("gpuwarden-whole-gpus", "nvidia.com/gpu"): _cell(
            "nvidia.com/gpu", "2", borrowingLimit="2"
        ),
    }
    assert not rendering.warnings


def test_without_mps_replicas_render_assumes_two_and_says_so() -> None:
    spec = (SHARED_POOLS % _tenant("whole, mps", "{gpus: 4}")).replace(", mpsReplicas: 4", "")
    rendering = render(_policy(spec), ONLY_KUEUE)
    (queue,) = rendering.of_kind("ClusterQueue")
    assert _quotas(queue)[("gpuwarden-mps-gpus", "nvidia.com/gpu.shared")]["nominalQuota"] == "8"
    assert (
        "tenant t: profile mps shares GPUs on an nvidia backend that sets no mpsReplicas; the "
        "quota of nvidia.com/gpu.shared in gpuwarden-mps-gpus assumes 2 MPS replicas per GPU, "
        "the least NVIDIA's device plugin accepts: set mpsReplicas to the device plugin's "
        "sharing.mps.resources[].replicas"
    ) in rendering.warnings


def test_shared_gpus_without_a_shared_profile_is_said_by_lint_and_render() -> None:
    policies = _policy(SHARED_POOLS % _tenant("whole", "{gpus: 4, sharedGpus: 1}"))
    said = (
        "tenant t: quota.sharedGpus 1, but none of its profiles shares GPUs: it holds only "
        "quota.gpus - quota.sharedGpus (3) whole GPUs"
    )
    assert said in lint_warnings(policies)
    rendering = render(policies, RenderOptions(priority_classes=False, kueue=True))
    assert rendering.warnings.count(said) == 1  # once, for the ResourceQuota and the queue
    (queue,) = rendering.of_kind("ClusterQueue")
    assert _quotas(queue)[("gpuwarden-whole-gpus", "nvidia.com/gpu")]["nominalQuota"] == "3"


@pytest.mark.parametrize(
    ("quota", "said"),
    [
        (
            "{gpus: 2, sharedGpus: 3}",
            "tenant t: quota.sharedGpus 3 is more than quota.gpus 2",
        ),
        ("{sharedGpus: 1}", "tenant t: quota.sharedGpus needs quota.gpus"),
        ("{gpus: 2, sharedGpus: -1}", "spec.tenants[0].quota.sharedGpus: Input should be"),
    ],
)
def test_shared_gpus_must_be_part_of_gpus(quota: str, said: str) -> None:
    with pytest.raises(PolicyError) as err:
        _policy(SHARED_POOLS % f"    - {{name: t, namespaces: [t], quota: {quota}}}")
    assert any(said in str(issue) for issue in err.value.issues), err.value.issues


def test_lint_says_what_kueue_cannot_mean() -> None:
    policies = _policy(
        "  backend: {type: nvidia}\n"
        "  profiles: [{name: s, gpuShare: true, maxMemory: 8Gi, overcommitRatio: 2}]\n"
        "  tenants:\n    - {name: t, namespaces: [t], queue: t, quota: {gpus: 2}, "
        'queueSpec: {deserved: {nvidia.com/gpu: "2"}}}\n'
    )
    kueue = [w for w in lint_warnings(policies) if "Kueue ClusterQueue" in w]
    assert len(kueue) == 2
    assert "overcommitRatio (s 2) has no Kueue equivalent" in kueue[0]
    assert "queueSpec.deserved has no Kueue field" in kueue[1]
    # On Volcano the same queueSpec is a Volcano Queue, which Kueue's words do not concern.
    volcano = _policy(
        "  backend: {type: volcano}\n"
        "  profiles: [{name: s, gpuShare: true, maxMemory: 8Gi, overcommitRatio: 2}]\n"
        "  tenants:\n    - {name: t, namespaces: [t], queue: t, "
        'queueSpec: {deserved: {volcano.sh/vgpu-number: "2"}}}\n'
    )
    assert not [w for w in lint_warnings(volcano) if "Kueue" in w]


def test_kueue_counts_only_what_its_queues_cover() -> None:
    """Every resource a governed pod asks for is either a device count a ClusterQueue covers or
    left out of Kueue's accounting by the Configuration the render note asks for."""
    excluded = excluded_resource_prefixes()
    assert configuration_requirements()["resources"]["excludeResourcePrefixes"] == list(excluded)
    policies = _policy(EVERY_POOL.replace("maxMemory: 8Gi", "maxMemory: 8Gi, threadPercentage: 50"))
    asked = {"cpu", "memory"}
    for name in policies.profiles:
        asked |= set(plan_for(policies.resolve(name, None)).resources)
    for resource in asked:
        counted = resource in GPU_COUNT_RESOURCES
        dropped = any(resource.startswith(prefix) for prefix in excluded)
        assert counted != dropped, resource


def test_cli_render_kueue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "teams.yaml"
    path.write_text(
        "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: teams}\nspec:\n"
        + TEAMS
    )
    assert gpuwarden(["render", "--policies", str(path), "--kueue"]) == 0
    captured = capsys.readouterr()
    kinds = [doc["kind"] for doc in yaml.safe_load_all(captured.out) if doc]
    assert {"PriorityClass", *KUEUE_KINDS} <= set(kinds)
    assert "integrations.frameworks: [pod]" in captured.err
    assert "note: ClusterQueue vision not schema-checked: Kueue's CRD schemas" in captured.err
    assert gpuwarden(["render", "--policies", str(path)]) == 0
    assert "ClusterQueue" not in capsys.readouterr().out
