"""The policy core: pure functions from (pod, namespace, policies, cluster view) to decisions."""

from gpuwarden.policy.decision import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PriorityClassInfo,
)
from gpuwarden.policy.loader import PolicyError, PolicyIssue, load_paths, load_texts
from gpuwarden.policy.mutate import admitted_gpu_memory, mutate
from gpuwarden.policy.pipeline import Admission, admit, apply_patch
from gpuwarden.policy.policyset import PolicySet
from gpuwarden.policy.resolved import ResolvedProfile
from gpuwarden.policy.validate import validate

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
