"""What installing the chart asks of the user, checked with the real helm binary: a policy the
loader would refuse fails `helm template` with the field named, whether it comes as a mapping
(values.schema.json) or as YAML text (--set-file, the chart's own check); every policy the
loader accepts renders; NOTES name the prerequisites the values call for; and the install
steps, in full in docs/install.md and short in the README, run as written."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuwarden.policy import PolicyError, load_paths, load_texts
from gpuwarden.policy.spec.loader import policy_files

from .support import CHART, NAMESPACE, RELEASE, REPO, Rendering, helm, run_helm, template

pytestmark = pytest.mark.helm

INSTALL_DOC = REPO / "docs" / "install.md"
# The install steps: the README's short list and the full one, each under its heading.
INSTALL_STEPS = [
    (REPO / "README.md", "## Installing on a cluster"),
    (INSTALL_DOC, "## Prerequisites and steps"),
]
KEY = "kubeflow.yaml"
POLICY: dict[str, Any] = {
    "apiVersion": "gpuwarden.io/v1alpha1",
    "kind": "GPUPolicy",
    "metadata": {"name": "kubeflow"},
    "spec": {
        "backend": {"type": "volcano"},
        "profiles": [
            {
                "name": "small",
                "maxMemory": "8Gi",
                "overcommitRatio": 2,
                "priority": 100,
                "preemptible": True,
            }
        ],
        "workloads": [{"name": "steps", "match": {"kind": "kfp-step"}, "profile": "small"}],
    },
}


def _with(change: dict[str, Any]) -> dict[str, Any]:
    """POLICY with its first profile updated by ``change`` (a None value removes the field)."""
    doc = copy.deepcopy(POLICY)
    profile = doc["spec"]["profiles"][0]
    for name, value in change.items():
        if value is None:
            profile.pop(name)
        else:
            profile[name] = value
    return doc


def _spec(**spec: Any) -> dict[str, Any]:
    return {**copy.deepcopy(POLICY), "spec": spec}


def _template_text(text: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm template` with the policy file given as text, as the install steps do (--set-file)."""
    path = tmp_path / KEY
    path.write_text(text)
    key = KEY.replace(".", "\\.")
    return run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set-file",
        f"policies.{key}={path}",
        *args,
        check=False,
    )


def _template_mapping(doc: Any, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`helm template` with the policy given as a mapping in a values file."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policies": {KEY: doc}}))
    return run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values), check=False
    )


def _loader_refuses(text: str) -> bool:
    try:
        load_texts([(KEY, text)])
    except PolicyError:
        return True
    return False


# --- a policy with a mistake fails the render, with the field named --------------------------


def test_a_typo_in_a_policy_file_fails_helm_template(tmp_path: Path) -> None:
    result = _template_text(
        yaml.safe_dump(_with({"maxMemory": None, "maxMemroy": "8Gi"})), tmp_path
    )
    assert result.returncode != 0
    assert f"policies.{KEY}: spec.profiles[0].maxMemroy: unknown field" in result.stderr
    assert "maxMemory" in result.stderr  # the allowed fields, to spot the typo against
    assert "webhook would never become ready" in result.stderr


def test_a_typo_in_a_policy_mapping_fails_helm_template(tmp_path: Path) -> None:
    result = _template_mapping(_with({"maxMemory": None, "maxMemroy": "8Gi"}), tmp_path)
    assert result.returncode != 0
    assert f"at '/policies/{KEY}/spec/profiles/0'" in result.stderr
    assert "additional properties 'maxMemroy' not allowed" in result.stderr


def test_the_install_page_shows_the_error_helm_prints(tmp_path: Path) -> None:
    shown = [line.strip() for line in INSTALL_DOC.read_text().splitlines() if "maxMemroy:" in line]
    assert len(shown) == 1, "docs/install.md shows one maxMemroy error line"
    result = _template_text(
        yaml.safe_dump(_with({"maxMemory": None, "maxMemroy": "8Gi"})), tmp_path
    )
    assert shown[0] in [line.strip() for line in result.stderr.splitlines()]


MISTAKES: dict[str, tuple[Any, str]] = {
    # id: (document, what the --set-file error names)
    "unknown-field": (_with({"gpuShares": True}), "spec.profiles[0].gpuShares: unknown field"),
    "wrong-type": (_with({"priority": "high"}), "spec.profiles[0].priority: must be integer"),
    "enum": (
        _with({"preemptionPolicy": "Sometimes"}),
        "spec.profiles[0].preemptionPolicy: must be one of",
    ),
    "maximum": (
        _with({"overcommitRatio": 20}),
        "spec.profiles[0].overcommitRatio: must be at most",
    ),
    "minimum": (
        _with({"threadPercentage": 0}),
        "spec.profiles[0].threadPercentage: must be at least",
    ),
    "integer": (_with({"gpus": 1.5}), "spec.profiles[0].gpus: must be integer or null, got number"),
    "pattern": (_with({"gpuTypes": ["A100,H100"]}), "spec.profiles[0].gpuTypes[0]: must match"),
    "required": (_with({"name": None}), 'spec.profiles[0]: missing required field "name"'),
    "backend-tag": (_spec(backend={"type": "slurm"}), "spec.backend.type: must be one of"),
    "backend-shorthand": (_spec(backend="slurm"), "spec.backend: must be one of"),
    "backend-no-tag": (
        _spec(backend={"queue": "q"}),
        'spec.backend: missing required field "type"',
    ),
    "backend-variant-field": (
        _spec(backend={"type": "hami", "queue": "q"}),
        "spec.backend.queue: unknown field",
    ),
    "match-tag": (
        _spec(workloads=[{"name": "r", "match": {"kind": "pods"}, "skip": True}]),
        "spec.workloads[0].match.kind: must be one of",
    ),
    "match-no-shorthand": (
        _spec(workloads=[{"name": "r", "match": "notebook", "skip": True}]),
        "spec.workloads[0].match: must be an object, got string",
    ),
    "list-type": (
        _spec(tenants=[{"name": "t", "namespaces": "team-a"}]),
        "spec.tenants[0].namespaces: must be array",
    ),
    "nested-enum": (
        _spec(
            tenants=[
                {
                    "name": "t",
                    "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]},
                }
            ]
        ),
        "spec.tenants[0].namespaceSelector.matchExpressions[0].operator: must be one of",
    ),
    "kind": ({**POLICY, "kind": "GPUPolicey"}, 'kind: must be "GPUPolicy", got "GPUPolicey"'),
    "bare-spec": (
        {"profiles": [{"name": "a"}], "profile": "a"},
        "profile: unknown field (allowed here: backend, defaultProfile, enforcementAction, "
        "gpuDeviceClasses, mps, profiles",
    ),
}


@pytest.mark.parametrize("case", MISTAKES, ids=str)
def test_a_policy_the_loader_refuses_fails_helm_template_both_ways(
    case: str, tmp_path: Path
) -> None:
    doc, named = MISTAKES[case]
    text = yaml.safe_dump(doc)
    assert _loader_refuses(text), "the loader accepts it: not a mistake"
    as_text = _template_text(text, tmp_path)
    assert as_text.returncode != 0 and f"policies.{KEY}: {named}" in as_text.stderr
    as_mapping = _template_mapping(doc, tmp_path)
    assert as_mapping.returncode != 0
    assert f"at '/policies/{KEY}" in as_mapping.stderr, as_mapping.stderr


def test_the_chart_schemas_are_json_schema_2020_12() -> None:
    for name in ("values.schema.json", "files/gpupolicy.schema.json"):
        schema = json.loads((CHART / name).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
    values = jsonschema.Draft202012Validator(json.loads((CHART / "values.schema.json").read_text()))
    assert not list(values.iter_errors(yaml.safe_load((CHART / "values.yaml").read_text())))


def test_every_document_of_a_file_is_checked_and_numbered(tmp_path: Path) -> None:
    good = yaml.safe_dump(POLICY)
    bad = yaml.safe_dump(_with({"gpuShares": True}))
    result = _template_text(f"---\n{good}---\n{bad}", tmp_path)
    assert f"policies.{KEY}: document 2: spec.profiles[0].gpuShares: unknown field" in (
        result.stderr
    )
    assert "document 1" not in result.stderr


# --- a policy the loader accepts renders ------------------------------------------------------

# Policy sets of the repository, each as the loader reads it (a directory is one set: its files
# may refer to each other's profiles) and as the chart gets it (a file per key, --set-file).
CORPUS = [
    REPO / "policies",
    # Each example is a policy set of its own, an alternative to the default.
    *sorted((REPO / "examples" / "policies").glob("*.yaml")),
    REPO / "tests" / "e2e" / "policies",
    REPO / "tests" / "lab" / "policies",
    REPO / "tests" / "policy" / "fixtures" / "seed-profiles.yaml",  # a bare spec
    REPO / "tests" / "policy" / "fixtures" / "seed-configmap.yaml",  # a ConfigMap of policies
]
ACCEPTED: dict[str, Any] = {
    "quantities-as-numbers": _with({"maxMemory": 8, "cpu": 2, "hostMemory": "16Gi"}),
    "explicit-nulls": _spec(
        profiles=[{"name": "a", "gpuShare": False, "gpus": None, "backend": None, "cpu": None}]
    ),
    "backend-shorthand": _spec(
        backend="nvidia", profiles=[{"name": "a", "gpuShare": False, "backend": "hami"}]
    ),
    "backend-rows": yaml.safe_load(
        (REPO / "tests" / "policy" / "fixtures" / "backend-rows.yaml").read_text()
    )["policy"],
    "unknown-metadata": {**POLICY, "metadata": {"name": "kubeflow", "uid": "x", "generation": 2}},
}


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_policy_set_the_loader_accepts_renders(path: Path) -> None:
    load_paths([path])  # the loader accepts it
    files = policy_files([path])
    assert files
    args: list[str] = []
    for file in files:
        key = file.name.replace(".", "\\.")
        args += ["--set-file", f"policies.{key}={file}"]
    result = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", ACCEPTED, ids=str)
def test_every_policy_mapping_the_loader_accepts_renders(case: str, tmp_path: Path) -> None:
    doc = ACCEPTED[case]
    text = yaml.safe_dump(doc)
    assert not _loader_refuses(text)
    for result in (_template_text(text, tmp_path), _template_mapping(doc, tmp_path)):
        assert result.returncode == 0, result.stderr


# --- NOTES name the prerequisites the values call for -----------------------------------------


def _notes(*args: str) -> str:
    result = run_helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args
    )
    return result.stdout.split("NOTES:", 1)[1]


@pytest.fixture(scope="module")
def default_notes() -> str:
    return _notes()


def test_notes_name_cert_manager_only_when_tls_needs_it(default_notes: str) -> None:
    assert "cert-manager, installed before this release" in default_notes
    assert "tls.mode=self-managed needs no cert-manager" in default_notes
    self_managed = _notes("--set", "tls.mode=self-managed")
    assert "cert-manager, installed before" not in self_managed
    assert "no cert-manager needed" in self_managed


def test_notes_name_the_backends_the_policies_use() -> None:
    notes = _notes("-f", str(REPO / "tests" / "chart" / "values" / "backend-hami.yaml"))
    assert "hami: HAMi: its scheduler, webhook and device plugin" in notes
    shorthand = _notes("--set-json", "policies=" + json.dumps({KEY: _spec(backend="nvidia")}))
    assert "nvidia: NVIDIA's device plugin with MPS sharing" in shorthand
    assert "volcano:" not in shorthand


def test_notes_say_how_to_get_the_image(default_notes: str) -> None:
    assert "The image gpuwarden/gpuwarden:0.1.0, pullable by every node" in default_notes
    assert "docker build -t REGISTRY/gpuwarden:TAG . && docker push REGISTRY/gpuwarden:TAG" in (
        default_notes
    )
    assert (REPO / "Dockerfile").is_file()


def test_notes_ask_for_privileged_pod_security_when_the_node_agent_needs_it(
    default_notes: str,
) -> None:
    label = f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged"
    agent = template().one("DaemonSet")["spec"]["template"]["spec"]
    # Host namespaces and root: only the privileged Pod Security level admits the pod (hostIPC
    # too where it runs MPS: the nvidia backend; issue 32 item 4).
    assert agent["hostPID"] and not agent["hostIPC"]
    assert "runs with hostPID and as root" in default_notes
    assert agent["containers"][0]["securityContext"]["runAsUser"] == 0
    assert agent["runtimeClassName"] == "nvidia"
    assert label in default_notes
    assert "RuntimeClass nvidia must exist" in default_notes
    without = _notes("--set", "nodeAgent.enabled=false")
    assert not template(sets={"nodeAgent.enabled": "false"}).all("DaemonSet")
    assert "pod-security.kubernetes.io/enforce" not in without


def test_notes_say_the_tenant_objects_are_a_second_step(tmp_path: Path) -> None:
    values = str(REPO / "tests" / "chart" / "values" / "tenants-quotas.yaml")
    assert "NOT INSTALLED YET: the tenant ResourceQuotas and Volcano Queues of the policies' 2" in (
        _notes("-f", values)
    )
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: q, namespace: nlp}\n"
    )
    given = _notes("-f", values, "--set-file", f"renderedObjects={rendered}")
    assert "NOT INSTALLED YET" not in given
    assert "--set-file renderedObjects=rendered.yaml" in given
    assert "--kueue" not in given
    queued = _notes("-f", values, "--set", "kueue.enabled=true")
    assert "Kueue's ClusterQueues, LocalQueues and ResourceFlavors of the policies' 2" in queued
    assert "render --policies policies.yaml --no-priority-classes --kueue > rendered.yaml" in queued


def test_notes_say_monitoring_is_off_and_what_it_needs(default_notes: str) -> None:
    assert not {"ServiceMonitor", "PrometheusRule"} & template().kinds()
    assert "Monitoring is off: monitoring.serviceMonitor.enabled=true" in default_notes
    on = _notes(
        "--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true"
    )
    assert "The Prometheus Operator's CRDs (monitoring.coreos.com/v1)" in on


# --- the install steps (README.md and docs/install.md) -----------------------------------------


def _install_section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize(("path", "heading"), INSTALL_STEPS, ids=["README", "docs-install"])
def test_install_steps_list_the_prerequisites_in_order(path: Path, heading: str) -> None:
    section = _install_section(path, heading)
    steps = [
        "**Kubernetes 1.30 or newer**",
        "**cert-manager**",
        "**The scheduler backend**",
        "docker build -t REGISTRY/gpuwarden:0.1.0 .",
        "pod-security.kubernetes.io/enforce=privileged",
        "gpuwarden render --policies policies/ --no-priority-classes > rendered.yaml",
        "helm install gpuwarden charts/gpuwarden",
        "**Monitoring**, optional and off by default",
    ]
    positions = [section.index(step) for step in steps]
    assert positions == sorted(positions)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    assert "the monitoring rules" not in section  # off by default, not installed unasked


@pytest.mark.parametrize(("path", "heading"), INSTALL_STEPS, ids=["README", "docs-install"])
def test_install_command_renders_the_image_policies_and_tenant_objects(
    tmp_path: Path, path: Path, heading: str
) -> None:
    section = _install_section(path, heading)
    render = re.search(r"^ *(gpuwarden render [^\n]*?) > rendered\.yaml$", section, re.M)
    install = re.search(r"^ *(helm install gpuwarden (?:[^\n]*\\\n)*[^\n]*)$", section, re.M)
    assert render and install
    rendered = tmp_path / "rendered.yaml"
    printed = subprocess.run(
        [sys.executable, "-m", "gpuwarden", *shlex.split(render.group(1))[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rendered.write_text(printed)
    args = shlex.split(install.group(1).replace("\\\n", " "))
    assert args[:2] == ["helm", "install"]
    args = [arg.replace("=rendered.yaml", f"={rendered}") for arg in args[2:]]
    result = subprocess.run(
        [str(helm()), "template", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    rendering = Rendering(tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc))
    webhook = rendering.one("Deployment", "gpuwarden-webhook")
    assert webhook["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "REGISTRY/gpuwarden:0.1.0"
    )
    expected = [doc for doc in yaml.safe_load_all(printed) if doc]
    assert expected, "the default policies imply tenant objects"
    passed = [o for o in rendering.objects if o["kind"] in {e["kind"] for e in expected}]
    assert passed == expected


def test_notes_say_when_the_webhook_only_audits(default_notes: str) -> None:
    assert "enforcementAction:" not in default_notes
    audit = _notes("--set", "webhook.enforcementAction=audit")
    assert "enforcementAction: audit (webhook.enforcementAction)" in audit
    assert "pods the policies would deny are admitted" in audit
    assert "left as sent" not in audit
    dryrun = _notes("--set", "webhook.enforcementAction=dryrun")
    assert "pods are left as sent, their patch only reported" in dryrun
