"""`gpuwarden lint --objects`: GPUPolicy objects with the chart's policy files, as the webhook serves
them, and what each one overrides in the files (issue 29, item 10). Writing GPUPolicy is
cluster-wide GPU admin: an object can take a Kubeflow namespace from the files' tenant with higher
limits, and take pods from a file's rule by naming them more narrowly, in every namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.policy import load_paths
from gpuwarden.policy.lint import object_overrides, object_scope_warnings
from gpuwarden.policy.render.scope import review_scope
from gpuwarden.policy.spec.loader import load_objects
from gpuwarden.policy.spec.model import WorkloadRule
from gpuwarden.policy.spec.precedence import rules_overlap

from .support import EXAMPLES, POLICIES

DEFAULT = POLICIES / "default.yaml"
TEAM_VISION = EXAMPLES / "teams" / "team-vision.yaml"
KUBEFLOW_LABELS = {"app.kubernetes.io/part-of": "kubeflow-profile"}


def gpupolicy(name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuwarden.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


# A research team's object: its tenant names its namespace (beating the default's Kubeflow
# selector) with a higher GPU limit and privileged pods allowed; one rule gives pods a GPU by a
# label of the team's choosing, one takes a Katib experiment by its exact name.
TAKEOVER = gpupolicy(
    "takeover",
    {
        "tenants": [
            {
                "name": "research",
                "namespaces": ["research"],
                "limits": {"maxGpusPerPod": 16},
                "enforcement": {"privileged": False},
            }
        ],
        "workloads": [
            {
                "name": "labelled-gpus",
                "match": {
                    "kind": "selector",
                    "labels": {"matchLabels": {"example.com/gpu": "yes"}},
                },
                "profile": "heavy-training",
            },
            {
                "name": "detector-hpo",
                "match": {"kind": "katib-trial", "experiments": ["vision-detector"]},
                "profile": "batch-hpo",
                "requireGpuRequest": True,
            },
        ],
    },
    uid="0a0a0a0a-0000-4000-8000-000000000001",
    generation=2,
    resourceVersion="7",
)


def kubectl_list(tmp_path: Path, *items: dict[str, Any]) -> Path:
    """What `kubectl get gpupolicies -o yaml` writes."""
    path = tmp_path / "gpupolicies.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return path


def lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(["lint", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_lint_shows_the_tenant_an_object_takes_over_and_the_limits_it_raises(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    objects = kubectl_list(tmp_path, TAKEOVER)
    code, out, _ = lint(capsys, str(DEFAULT), str(TEAM_VISION), "--objects", str(objects))
    assert code == 0
    assert (
        "override: gpupolicy/takeover: tenant research takes namespace research from tenant "
        "kubeflow-profiles (policy kubeflow-default), wherever that tenant's namespaceSelector "
        "(app.kubernetes.io/part-of=kubeflow-profile) selects it: listing a namespace by name "
        "beats selecting it by labels; there it raises maxGpusPerPod 8 -> 16, "
        "enforcement.privileged true -> false"
    ) in out


def test_lint_shows_the_file_rules_an_exact_name_takes_pods_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    objects = kubectl_list(tmp_path, TAKEOVER)
    _, out, _ = lint(capsys, str(DEFAULT), str(TEAM_VISION), "--objects", str(objects))
    taken = [line for line in out if "rule detector-hpo takes" in line]
    assert taken == [
        # katib-trials takes only pods asking for at most one GPU (maxGpuRequest: 1)
        "override: gpupolicy/takeover: rule detector-hpo takes the pods both match from rule "
        "katib-trials (policy kubeflow-default), in every namespace: rule detector-hpo is "
        "narrower: it names experiments exactly, rule katib-trials names no experiments; they "
        "get the same profile batch-hpo, with this rule's other settings",
        "override: gpupolicy/takeover: rule detector-hpo takes every pod it matches from rule "
        "katib-multi-gpu-trials (policy kubeflow-default), in every namespace: rule "
        "detector-hpo is narrower: it names experiments exactly, rule katib-multi-gpu-trials "
        "names no experiments; they get profile batch-hpo instead of profile batch-hpo-whole",
        "override: gpupolicy/takeover: rule detector-hpo takes every pod it matches from rule "
        "vision-hpo (policy team-vision), in every namespace: rule detector-hpo is narrower: it "
        "names experiments exactly, rule vision-hpo names experiments by glob; they get profile "
        "batch-hpo instead of profile batch-hpo-whole",
    ]
    assert out[-1] == (
        # The second warning: rule labelled-gpus, a selector, loses the pods the files' rules of
        # other kinds also match (issue 32 item 5); the third: the object's tenant lists
        # namespace research, which the chart's webhooks select by label only (issue 32 item 2).
        "ok: 3 policies, 14 profiles, 20 rules, 5 tenants, 3 warnings, 13 notes (info: what the "
        "nodes or namespaces must provide), 4 overrides by GPUPolicy objects"
    )


def test_lint_warns_when_an_object_rule_needs_pods_the_charts_cel_never_sends(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The chart renders its CEL from its own policy files: a pod that asks for no GPU and
    carries only the object's label is admitted without a call, so the rule never applies."""
    objects = kubectl_list(tmp_path, TAKEOVER)
    code, _, err = lint(capsys, str(DEFAULT), "--objects", str(objects))
    assert (
        "warning: gpupolicy/takeover: rule labelled-gpus may give GPUs to pods that ask for "
        "none, but the webhooks' CEL, which the chart renders from its policy files alone, "
        "does not send pods known only by label example.com/gpu: such pods are admitted "
        "without gpuwarden and the rule never applies to them; put the rule in the chart's "
        "policies, or set requireGpuRequest"
    ) in err
    # detector-hpo asks for a GPU request: every pod it matches names a GPU, and is sent
    assert not [line for line in err if "rule detector-hpo may give" in line]
    assert lint(capsys, str(DEFAULT), "--strict", "--objects", str(objects))[0] == 1
    assert code == 0


def test_the_scope_warning_is_what_the_rendered_cel_leaves_out() -> None:
    """Held against render/scope.py itself: the files' scope does not send the object rule's
    pod, the scope of files and objects would."""
    files = load_paths([DEFAULT])
    served = load_objects(files, [("gpupolicy/takeover", TAKEOVER)])
    pod = {"metadata": {"name": "p", "labels": {"example.com/gpu": "yes"}}, "spec": {}}
    assert not review_scope(files).needs_review(pod)
    assert review_scope(served).needs_review(pod)
    [warning] = object_scope_warnings(files, served)
    assert warning.startswith("gpupolicy/takeover: rule labelled-gpus may give GPUs")
    assert object_scope_warnings(files, files) == [] and object_overrides(files, files) == []


def test_an_object_the_webhook_would_refuse_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = gpupolicy("broken", {"profiles": [{"name": "light-training", "gpuShare": False}]})
    objects = kubectl_list(tmp_path, broken)
    code, out, err = lint(capsys, str(DEFAULT), "--objects", str(objects))
    assert code == 1
    assert (
        "error: gpupolicy/broken is not served: spec.profiles[0].name: profile "
        "'light-training' is defined twice: here and in policy files"
    ) in err
    assert out[-1].startswith("failed: ")


def test_an_object_that_overrides_nothing_shows_no_override(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A tenant that only selects namespaces no file tenant claims takes nothing from one."""
    outside_kubeflow = {
        "matchLabels": {"lab": "yes"},
        "matchExpressions": [{"key": "app.kubernetes.io/part-of", "operator": "DoesNotExist"}],
    }
    quiet = gpupolicy(
        "quiet",
        {
            "tenants": [
                {
                    "name": "lab",
                    "namespaceSelector": outside_kubeflow,
                    "limits": {"maxGpusPerPod": 1},
                }
            ]
        },
    )
    path = tmp_path / "quiet.yaml"
    path.write_text(yaml.safe_dump(quiet))
    code, out, _ = lint(capsys, str(DEFAULT), "--objects", str(path))
    assert code == 0 and not [line for line in out if line.startswith("override:")]
    assert out[-1].endswith(", 0 overrides by GPUPolicy objects")


def test_a_more_specific_selector_takes_the_namespaces_both_select(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wider = gpupolicy(
        "wider",
        {
            "tenants": [
                {
                    "name": "gpu-teams",
                    "namespaceSelector": {"matchLabels": {**KUBEFLOW_LABELS, "gpu": "many"}},
                    "limits": {"allowResourceClaims": True},
                }
            ]
        },
    )
    path = tmp_path / "wider.yaml"
    path.write_text(yaml.safe_dump(wider))
    _, out, _ = lint(capsys, str(DEFAULT), "--objects", str(path))
    assert (
        "override: gpupolicy/wider: tenant gpu-teams takes the namespaces both select "
        "(app.kubernetes.io/part-of=kubeflow-profile,gpu=many; "
        "app.kubernetes.io/part-of=kubeflow-profile) from tenant kubeflow-profiles (policy "
        "kubeflow-default): its selector is more specific (2 requirements to 1); there it "
        "raises maxGpusPerPod 8 -> unlimited, allowResourceClaims false -> true"
    ) in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "kind: ConfigMap\nmetadata: {name: x}\n",
            "document 1: not a GPUPolicy (kind 'ConfigMap')",
        ),
        (
            "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nspec: {}\n",
            "document 1: a GPUPolicy object needs metadata.name",
        ),
    ],
)
def test_objects_that_are_not_gpupolicies_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(content)
    code, _, err = lint(capsys, str(DEFAULT), "--objects", str(path))
    assert code == 1
    assert err == [f"error: {path}: {message}"]


def _rule(match: dict[str, Any]) -> WorkloadRule:
    return WorkloadRule.model_validate({"name": "r", "match": match, "profile": "p"})


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ({"kind": "katib-trial", "experiments": ["a"]}, {"kind": "katib-trial"}, True),
        (
            {"kind": "katib-trial", "experiments": ["a"]},
            {"kind": "katib-trial", "experiments": ["b"]},
            False,
        ),
        (
            {"kind": "katib-trial", "experiments": ["vision-a"]},
            {"kind": "katib-trial", "experiments": ["vision-*"]},
            True,
        ),
        (
            {"kind": "katib-trial", "experiments": ["nlp-a"]},
            {"kind": "katib-trial", "experiments": ["vision-*"]},
            False,
        ),
        (
            {"kind": "katib-trial", "experiments": ["vision-*"]},
            {"kind": "katib-trial", "experiments": ["vis*"]},
            True,
        ),
        (
            {"kind": "katib-trial", "experiments": ["vision-*"]},
            {"kind": "katib-trial", "experiments": ["nlp-*"]},
            False,
        ),
        ({"kind": "katib-trial"}, {"kind": "notebook"}, False),
        ({"kind": "notebook"}, {"kind": "selector", "labels": {"matchLabels": {"a": "1"}}}, True),
        (
            {"kind": "selector", "labels": {"matchLabels": {"a": "1"}}},
            {"kind": "selector", "labels": {"matchLabels": {"a": "2"}}},
            False,
        ),
        (
            {"kind": "selector", "namespaces": ["x"]},
            {"kind": "selector", "namespaces": ["y"]},
            False,
        ),
        (
            {"kind": "selector", "annotations": {"k": "1"}},
            {"kind": "selector", "annotations": {"k": "1"}, "namespaces": ["y"]},
            True,
        ),
    ],
)
def test_rules_overlap_unless_no_pod_can_match_both(
    first: dict[str, Any], second: dict[str, Any], overlap: bool
) -> None:
    assert rules_overlap(_rule(first), _rule(second)) is overlap
    assert rules_overlap(_rule(second), _rule(first)) is overlap


def test_lint_warns_that_an_object_tenant_listed_namespace_is_selected_by_label_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The chart's webhooks select namespaces by name only from its policy files (issue 32,
    item 2): a namespace only a GPUPolicy object lists reaches them only through the label."""
    objects = kubectl_list(tmp_path, TAKEOVER)
    _, _, err = lint(capsys, str(DEFAULT), str(TEAM_VISION), "--objects", str(objects))
    (warning,) = [line for line in err if "by name only from its policy files" in line]
    assert warning.startswith("warning: gpupolicy/takeover: tenant research lists research by name")
    assert "webhook.namespaceSelector" in warning
