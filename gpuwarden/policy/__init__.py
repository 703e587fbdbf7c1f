"""The policy core: pure functions from (pod, namespace, policies, cluster view) to decisions."""

from gpuwarden.policy.admission.decision import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PriorityClassInfo,
)
from gpuwarden.policy.admission.mutate import admitted_gpu_memory, mutate
from gpuwarden.policy.admission.pipeline import Admission, admit, apply_patch
from gpuwarden.policy.admission.validate import validate
from gpuwarden.policy.spec.loader import PolicyError, PolicyIssue, load_paths, load_texts
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

__all__ = [
    "Admission",
    "AdmissionRequest",
    "ClusterView",
    "Decision",
    "PolicyError",
    "PolicyIssue",
    "PolicySet",
    "PriorityClassInfo",
    "ResolvedProfile",
    "admit",
    "admitted_gpu_memory",
    "apply_patch",
    "load_paths",
    "load_texts",
    "mutate",
    "validate",
]
