"""KWOK Stages (``kwok.x-k8s.io/v1alpha1``) for the lab: the lifecycle a kubelet would give nodes
and pods, written for KWOK's config file.

* a node KWOK manages becomes Ready and keeps the capacity and allocatable it was created with
  (the GPU counts a device plugin would advertise);
* a pod bound to such a node goes Running and Ready;
* a Running pod with the annotation :data:`COMPLETE_AFTER` (a Go duration, ``"90s"``, counted
  from the moment it went Running) turns Succeeded then; a pod without it runs until deleted;
* a pod with the annotation :data:`WORK_DONE` (set by `gpuwarden simulate` when the work model
  says its work is done) turns Succeeded as soon as it runs;
* a pod being deleted (a preemption victim, a removed pod) is removed at once, as a kubelet
  would after the containers stopped.

The selectors are KWOK's jq-style expressions; the templates are Go templates over the object.
"""

from __future__ import annotations

from typing import Any

STAGE_API_VERSION = "kwok.x-k8s.io/v1alpha1"
#: KWOK's own annotation for the pod-complete stage's delay (its kustomize/stage/pod/general).
COMPLETE_AFTER = "pod-complete.stage.kwok.x-k8s.io/delay"
#: The replay's word that a pod's work is done (its value: the simulated second it finished).
WORK_DONE = "lab.gpuwarden.io/work-done"
#: Nodes KWOK manages carry this annotation (KWOK's convention; kwok --manage-nodes-with-...).
NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_ANNOTATION_VALUE = "fake"

_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_NODE_READY = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "True"
  reason: KubeletReady
  message: kwok simulates this node's kubelet
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
capacity:
{{ YAML .status.capacity 1 }}
allocatable:
{{ YAML .status.allocatable 1 }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
conditions:
- type: PodScheduled
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_SUCCEEDED = """\
{{ $now := Now }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""


def _stage(name: str, kind: str, selector: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": STAGE_API_VERSION,
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": selector},
            **spec,
        },
    }


def lab_stages() -> list[dict[str, Any]]:
    """The Stage documents of the lab's KWOK, in the order KWOK should consider them."""
    return [
        _stage(
            "lab-node-ready",
            "Node",
            [
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                }
            ],
            next={"statusTemplate": _NODE_READY},
        ),
        _stage(
            "lab-pod-running",
            "Pod",
            [
                _NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            ],
            next={"statusTemplate": _POD_RUNNING},
        ),
        _stage(
            "lab-pod-complete",
            "Pod",
            [
                _NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": f'.metadata.annotations["{COMPLETE_AFTER}"]', "operator": "Exists"},
            ],
            # durationMilliseconds is the fallback KWOK uses when the expression gives nothing.
            delay={
                "durationMilliseconds": 0,
                "durationFrom": {"expressionFrom": f'.metadata.annotations["{COMPLETE_AFTER}"]'},
            },
            next={"statusTemplate": _POD_SUCCEEDED},
        ),
        _stage(
            "lab-pod-work-done",
            "Pod",
            [
                _NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": f'.metadata.annotations["{WORK_DONE}"]', "operator": "Exists"},
            ],
            next={"statusTemplate": _POD_SUCCEEDED},
        ),
        _stage(
            "lab-pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            next={"delete": True},
        ),
    ]


def go_duration(seconds: float) -> str:
    """A duration time.ParseDuration reads, to the millisecond ("1.25s")."""
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    return f"{round(seconds * 1000)}ms"
