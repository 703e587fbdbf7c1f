"""Loading policy sets: the seed's files unchanged, directories, and errors that say where."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest

from gpuwarden.policy import PolicyError, PolicySet, load_paths, load_texts

from .support import FIXTURES, POLICIES, policy_text

GI = 2**30
SEED_PROFILES = {
    # name: (shared, cap, ratio, priority, preemptible)
    "data-loading": (True, 8 * GI, 2.0, 50, True),
    "light-training": (True, 16 * GI, 1.5, 100, False),
    "heavy-training": (False, 80 * GI, 1.0, 200, False),
    "inference": (True, 20 * GI, 1.3, 300, False),
}


def load_error(texts: list[tuple[str, str]]) -> PolicyError:
    with pytest.raises(PolicyError) as err:
        load_texts(texts)
    return err.value


def messages(err: PolicyError) -> list[str]:
    return [str(issue) for issue in err.issues]


def assert_seed_profiles(policies: PolicySet) -> None:
    assert set(policies.profiles) == set(SEED_PROFILES)
    for name, (shared, cap, ratio, priority, preemptible) in SEED_PROFILES.items():
        resolved = policies.resolve(name, None)
        assert resolved.gpu_share is shared
        assert resolved.max_memory == cap
        assert resolved.overcommit_ratio == ratio
        assert resolved.priority == priority
        assert resolved.preemptible is preemptible
        assert resolved.reserved_memory == Decimal(cap) / Decimal(str(ratio))


# --- the seed's files ----------------------------------------------------------------------


def test_seed_configmap_manifest_loads_unchanged() -> None:
    policies = load_paths([FIXTURES / "seed-configmap.yaml"])
    assert_seed_profiles(policies)
    assert policies.names == ("gpu-profiles",)  # a bare file is named after its ConfigMap


def test_seed_bare_profiles_file_loads_unchanged() -> None:
    assert_seed_profiles(load_paths([FIXTURES / "seed-profiles.yaml"]))


def test_seed_configmap_and_bare_file_mean_the_same() -> None:
    from_configmap = load_paths([FIXTURES / "seed-configmap.yaml"])
    bare = load_paths([FIXTURES / "seed-profiles.yaml"])
    assert {n: p.model_dump() for n, p in from_configmap.profiles.items()} == {
        n: p.model_dump() for n, p in bare.profiles.items()
    }


def test_default_policies_load_and_skip_their_test_suites() -> None:
    policies = load_paths([POLICIES])
    assert policies.names == ("kubeflow-default",)
    assert {"batch-hpo", "kfp-training", *SEED_PROFILES} <= set(policies.profiles)


def test_fingerprint_follows_content() -> None:
    text = policy_text("profiles: [{name: a, maxMemory: 1Gi}]")
    same = load_texts([("a.yaml", text)]).fingerprint
    assert load_texts([("a.yaml", text)]).fingerprint == same
    changed = load_texts([("a.yaml", text.replace("1Gi", "2Gi"))]).fingerprint
    assert changed != same


# --- documents, files and directories ------------------------------------------------------


def test_multi_document_file_merges_policies(tmp_path: Path) -> None:
    text = (
        policy_text("profiles: [{name: a, maxMemory: 1Gi}]", name="one")
        + "---\n"
        + policy_text("profiles: [{name: b, gpuShare: false}]", name="two")
    )
    (tmp_path / "set.yaml").write_text(text)
    policies = load_paths([tmp_path / "set.yaml"])
    assert policies.names == ("one", "two")
    assert set(policies.profiles) == {"a", "b"}
    assert policies.resolve("b", None).policy == "two"


def test_directory_loads_yaml_files_recursively_except_hidden_and_tests(tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a.yaml").write_text(policy_text("profiles: [{name: a, maxMemory: 1Gi}]", "a"))
    (tmp_path / "nested" / "b.yml").write_text(
        policy_text("profiles: [{name: b, maxMemory: 1Gi}]", "b")
    )
    # Neither of these is a policy; loading them would fail.
    (tmp_path / "tests" / "suite.yaml").write_text("kind: Test\n")
    (tmp_path / ".hidden" / "x.yaml").write_text("kind: Broken\n")
    (tmp_path / "README.md").write_text("# not yaml: [\n")
    policies = load_paths([tmp_path])
    assert set(policies.profiles) == {"a", "b"}


def test_configmap_volume_layout_with_data_symlinks(tmp_path: Path) -> None:
    """A mounted ConfigMap: each key a symlink into ..data, itself a link to a timestamped dir."""
    volume = tmp_path / "policies"
    stamp = volume / "..2026_12_02_15_12_28.123456789"
    stamp.mkdir(parents=True)
    (stamp / "profiles.yaml").write_text((FIXTURES / "seed-profiles.yaml").read_text())
    (stamp / "tenants.yaml").write_text(
        "tenants: [{name: tenant-a, namespaces: [tenant-a], overrides: "
        "{heavy-training: {gpus: 8}}}]\n"
    )
    os.symlink(stamp.name, volume / "..data")
    for key in ("profiles.yaml", "tenants.yaml"):
        os.symlink(f"..data/{key}", volume / key)
    policies = load_paths([volume])  # each key once: no "defined twice"
    assert_seed_profiles(policies)
    assert [tenant.name for tenant in policies.tenants] == ["tenant-a"]
    assert policies.resolve("heavy-training", policies.tenants[0]).gpus == 8


def test_configmap_with_several_policy_keys() -> None:
    text = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu}\ndata:\n"
        "  a.yaml: |\n    profiles: [{name: a, maxMemory: 1Gi}]\n"
        "  b.yaml: |\n    profiles: [{name: b, maxMemory: 2Gi}]\n"
        "  notes.txt: not a policy\n"
    )
    policies = load_texts([("cm.yaml", text)])
    assert set(policies.profiles) == {"a", "b"}
    assert policies.names == ("gpu-a", "gpu-b")


def test_configmap_without_policy_keys_is_an_error() -> None:
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu}\ndata: {notes.txt: hi}\n"
    assert messages(load_error([("cm.yaml", text)])) == [
        "cm.yaml: document 1: data: holds no *.yaml, *.yml or *.json key"
    ]


@pytest.mark.parametrize("meta", ["oops", "[1, 2]", "null"])
def test_configmap_with_odd_metadata_still_loads(meta: str) -> None:
    text = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {meta}\ndata:\n  profiles.yaml: |\n"
    text += "    profiles: [{name: a, maxMemory: 1Gi}]\n"
    assert load_texts([("cm.yaml", text)]).names == ("configmap",)


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such file or directory"):
        load_paths([tmp_path / "nope.yaml"])
    with pytest.raises(PolicyError, match="no policy files found"):
        load_paths([tmp_path])


def test_empty_documents_only_is_an_error() -> None:
    with pytest.raises(PolicyError, match="no GPUPolicy documents found"):
        load_texts([("empty.yaml", "---\n---\n")])


# --- errors: file, document index, field path ----------------------------------------------


def test_error_names_file_document_and_field(tmp_path: Path) -> None:
    good = policy_text("profiles: [{name: a, maxMemory: 1Gi}]", name="one")
    bad = policy_text(
        "profiles:\n  - {name: b, maxMemory: 1Gi}\n  - {name: c, maxMemory: 1GiB}", name="two"
    )
    path = tmp_path / "set.yaml"
    path.write_text(good + "---\n" + bad)
    with pytest.raises(PolicyError) as err:
        load_paths([path])
    (issue,) = err.value.issues
    assert (issue.source, issue.document, issue.path) == (
        str(path),
        2,
        "spec.profiles[1].maxMemory",
    )
    assert "'1GiB' is not a Kubernetes quantity" in issue.message
    assert str(err.value) == f"{path}: document 2: spec.profiles[1].maxMemory: {issue.message}"


def test_errors_inside_a_configmap_name_the_key_and_inner_document() -> None:
    text = (FIXTURES / "seed-configmap.yaml").read_text().replace("maxMemory: 16Gi", "maxMemory: x")
    (message,) = messages(load_error([("cm.yaml", text)]))
    assert message.startswith(
        "cm.yaml: document 1: data['profiles.yaml']: document 1: profiles[1].maxMemory: "
    )


def test_bare_file_paths_have_no_spec_prefix() -> None:
    text = "profiles:\n  - {name: a, gpuShare: false, overcommitRatio: 2.0}\n"
    (message,) = messages(load_error([("profiles.yaml", text)]))
    assert message.startswith("profiles.yaml: document 1: profiles[0].overcommitRatio: must be 1.0")


def test_every_problem_is_reported_at_once() -> None:
    text = policy_text(
        """
profiles:
  - {name: a, maxMemroy: 1Gi}
  - {name: B, maxMemory: 1Gi}
backend: {type: volcano, queueName: x}
workloads:
  - {name: r, match: {kind: kfp-step, tasknames: [a]}, profile: a}
  - {name: s, match: {kind: notebook}}
"""
    )
    paths = {issue.path for issue in load_error([("p.yaml", text)]).issues}
    assert paths == {
        "spec.profiles[0].maxMemroy",
        "spec.profiles[1].name",
        "spec.backend.queueName",
        "spec.workloads[0].match.tasknames",
        "spec.workloads[1]",
    }


@pytest.mark.parametrize(
    ("spec", "path", "text"),
    [
        ("profiles: [{name: a, maxMemory: 1Gi, colour: red}]", "spec.profiles[0].colour", "Extra"),
        ("bakend: volcano", "spec.bakend", "Extra"),
        ("backend: {type: slurm}", "spec.backend", "does not match any of the expected tags"),
        (
            "workloads: [{name: r, match: {kind: pod}, profile: a}]",
            "spec.workloads[0].match",
            "tag",
        ),
        (
            "tenants: [{name: t, namespaces: [t], limits: {maxGPUs: 1}}]",
            "spec.tenants[0].limits.maxGPUs",
            "Extra",
        ),
        (
            "tenants: [{name: t, namespaces: [t], enforcement: {hostpaths: false}}]",
            "spec.tenants[0].enforcement.hostpaths",
            "Extra",
        ),
        ("profiles: [{name: a, gpus: -1}]", "spec.profiles[0].gpus", "greater than or equal"),
        ("profiles: [{name: a, overcommitRatio: 0.5}]", "spec.profiles[0].overcommitRatio", ""),
        ("profiles: [{name: a, threadPercentage: 0}]", "spec.profiles[0].threadPercentage", ""),
        ("profiles: [{name: Heavy_Training}]", "spec.profiles[0].name", "DNS label"),
        ("profiles: [{name: a, maxMemory: true}]", "spec.profiles[0].maxMemory", "quantity"),
        ("profiles: [{name: a, maxMemory: -1Gi}]", "spec.profiles[0].maxMemory", "negative"),
        ("tenants: [{name: t}]", "spec.tenants[0]", "namespaces or a namespaceSelector"),
        (
            "workloads: [{name: r, match: {kind: notebook}, profile: a, skip: true}]",
            "spec.workloads[0]",
            "not both",
        ),
        (
            "workloads: [{name: r, match: {kind: selector, labels: {matchExpressions: "
            "[{key: app, operator: In}]}}, profile: a}]",
            "spec.workloads[0].match.labels.matchExpressions[0]",
            "at least one value",
        ),
    ],
)
def test_invalid_fields_are_located(spec: str, path: str, text: str) -> None:
    source = policy_text("profiles: [{name: a, maxMemory: 1Gi}]\n" + spec)
    if spec.startswith("profiles:"):
        source = policy_text(spec)
    issues = load_error([("p.yaml", source)]).issues
    assert [issue.path for issue in issues] == [path], issues
    assert text in issues[0].message


def test_unknown_kind_and_non_mapping_documents() -> None:
    text = "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n---\n- a list\n"
    assert messages(load_error([("p.yaml", text)])) == [
        "p.yaml: document 1: kind: expected apiVersion gpuwarden.io/v1alpha1 kind GPUPolicy "
        "(or a ConfigMap holding one), got v1/Pod",
        "p.yaml: document 2: expected a mapping, got list",
    ]


def test_unknown_top_level_field_in_a_bare_file() -> None:
    (message,) = messages(load_error([("profiles.yaml", "profile:\n  - {name: a}\n")]))
    assert message.startswith("profiles.yaml: document 1: profile: unknown field")


def test_invalid_yaml_names_the_line() -> None:
    (message,) = messages(load_error([("p.yaml", "profiles:\n  - {name: a\n")]))
    assert message.startswith("p.yaml: invalid YAML: line 3")


def test_exclusive_profile_with_overcommit_is_an_error() -> None:
    text = policy_text("profiles: [{name: whole, gpuShare: false, overcommitRatio: 1.5}]")
    (issue,) = load_error([("p.yaml", text)]).issues
    assert issue.path == "spec.profiles[0].overcommitRatio"
    assert "must be 1.0 for an exclusive profile" in issue.message


def test_shared_profile_needs_a_memory_cap() -> None:
    (issue,) = load_error([("p.yaml", policy_text("profiles: [{name: s, gpuShare: true}]"))]).issues
    assert issue.path == "spec.profiles[0].maxMemory"


# --- all or nothing ------------------------------------------------------------------------


def test_one_bad_file_refuses_the_whole_set(tmp_path: Path) -> None:
    (tmp_path / "a-good.yaml").write_text(policy_text("profiles: [{name: a, maxMemory: 1Gi}]", "a"))
    (tmp_path / "b-bad.yaml").write_text(policy_text("profiles: [{name: b, maxMemory: lots}]", "b"))
    (tmp_path / "c-good.yaml").write_text(policy_text("profiles: [{name: c, maxMemory: 1Gi}]", "c"))
    with pytest.raises(PolicyError) as err:
        load_paths([tmp_path])
    assert [issue.source for issue in err.value.issues] == [str(tmp_path / "b-bad.yaml")]


# --- cross-document references -------------------------------------------------------------


@pytest.mark.parametrize(
    ("second", "path", "text"),
    [
        (
            "profiles: [{name: a, maxMemory: 2Gi}]",
            "spec.profiles[0].name",
            "profile 'a' is defined twice",
        ),
        (
            "profiles: [{name: b, maxMemory: 1Gi}]\n"
            "workloads: [{name: r, match: {kind: notebook}, profile: b}]",
            "spec.workloads[0].name",
            "rule 'r' is defined twice",
        ),
        (
            "tenants: [{name: t, namespaces: [other]}]",
            "spec.tenants[0].name",
            "tenant 't' is defined twice",
        ),
    ],
)
def test_duplicate_names_across_files(second: str, path: str, text: str) -> None:
    first = policy_text(
        "profiles: [{name: a, maxMemory: 1Gi}]\n"
        "workloads: [{name: r, match: {kind: notebook}, profile: a}]\n"
        "tenants: [{name: t, namespaces: [t]}]",
        name="first",
    )
    (issue,) = load_error([("one.yaml", first), ("two.yaml", policy_text(second, "second"))]).issues
    assert (issue.source, issue.path) == ("two.yaml", path)
    assert text in issue.message


def test_duplicate_policy_names() -> None:
    text = policy_text("profiles: [{name: a, maxMemory: 1Gi}]", name="same")
    other = policy_text("profiles: [{name: b, maxMemory: 1Gi}]", name="same")
    (issue,) = load_error([("one.yaml", text), ("two.yaml", other)]).issues
    assert (issue.source, issue.path) == ("two.yaml", "metadata.name")
    assert "policy 'same' is defined twice" in issue.message


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            "workloads: [{name: r, match: {kind: notebook}, profile: nope}]",
            "spec.workloads[0].profile",
        ),
        (
            "tenants: [{name: t, namespaces: [t], overrides: {nope: {gpus: 2}}}]",
            "spec.tenants[0].overrides['nope']",
        ),
        (
            "tenants: [{name: t, namespaces: [t], limits: {allowedProfiles: [a, nope]}}]",
            "spec.tenants[0].limits.allowedProfiles[1]",
        ),
        ("defaultProfile: nope", "spec.defaultProfile"),
    ],
)
def test_unknown_profile_references(spec: str, path: str) -> None:
    text = policy_text("profiles: [{name: a, maxMemory: 1Gi}]\n" + spec)
    (issue,) = load_error([("p.yaml", text)]).issues
    assert issue.path == path
    assert issue.message == "unknown profile 'nope' (known: a)"


def test_references_resolve_across_files() -> None:
    profiles = policy_text("profiles: [{name: a, maxMemory: 1Gi}]", name="profiles")
    rules = policy_text(
        "workloads: [{name: r, match: {kind: notebook}, profile: a}]\ndefaultProfile: a",
        name="rules",
    )
    policies = load_texts([("profiles.yaml", profiles), ("rules.yaml", rules)])
    assert policies.default_profile == "a"


def test_only_one_default_profile() -> None:
    one = policy_text("profiles: [{name: a, maxMemory: 1Gi}]\ndefaultProfile: a", name="one")
    two = policy_text("defaultProfile: a", name="two")
    (issue,) = load_error([("one.yaml", one), ("two.yaml", two)]).issues
    assert (issue.source, issue.path, issue.message) == (
        "two.yaml",
        "spec.defaultProfile",
        "only one policy may set it",
    )


@pytest.mark.parametrize(
    ("override", "field", "text"),
    [
        ("{overcommitRatio: 2.0}", "overcommitRatio", "must be 1.0 for an exclusive profile"),
        ("{gpuShare: true}", "maxMemory", "a shared profile needs a GPU-memory cap"),
    ],
)
def test_tenant_override_that_makes_an_invalid_profile(
    override: str, field: str, text: str
) -> None:
    source = policy_text(
        f"""
profiles: [{{name: whole, gpuShare: false}}]
tenants:
  - name: tenant-a
    namespaces: [tenant-a]
    overrides: {{whole: {override}}}
"""
    )
    (issue,) = load_error([("p.yaml", source)]).issues
    assert issue.path == f"spec.tenants[0].overrides['whole'].{field}"
    assert issue.message.endswith("(after the override of profile whole)")
    assert text in issue.message


def test_tenant_override_applies_only_to_that_tenant(default_policies: PolicySet) -> None:
    by_name = {tenant.name: tenant for tenant in default_policies.tenants}
    a = default_policies.resolve("kfp-training", by_name["tenant-a"])
    b = default_policies.resolve("kfp-training", by_name["tenant-b"])
    plain = default_policies.resolve("kfp-training", by_name["kubeflow-profiles"])
    assert (a.gpus, a.host_memory, a.gpu_share, a.max_memory) == (
        8,
        "64Gi",
        False,
        Decimal(80 * GI),
    )
    assert (b.gpus, b.host_memory, b.gpu_share, b.max_memory) == (2, "16Gi", True, Decimal(40 * GI))
    # The default keeps a step's own count (gpus unset): 1 is what a step naming none gets.
    assert (plain.gpus, plain.host_memory, plain.gpu_share) == (1, "32Gi", False)
    assert a.overridden == ("gpus", "hostMemory")
    assert plain.overridden == ()
