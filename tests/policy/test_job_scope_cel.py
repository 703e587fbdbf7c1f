"""The job webhooks' CEL (scope.JOB_CEL) tests sites that differ only in their last field (KServe's
components and model shorthands), or in their guards' values too (Katib's trials of each Training
Operator kind), in one clause each; evaluated, it gives every example job and
every variant of each site the verdict of the form with one clause per site, which the twin
job_needs_review follows."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import celpy
import pytest
import yaml

from gpuwarden.policy.pod import jobs
from gpuwarden.policy.render import scope

from .support import EXAMPLES, POLICIES
from .test_jobs import job_of

JOB_FILES = sorted(
    [*EXAMPLES.rglob("*.yaml"), *(POLICIES / "tests").rglob("*.yaml")], key=lambda p: str(p)
)
GPU = {"limits": {"nvidia.com/gpu": "1"}}
CPU = {"limits": {"cpu": "1"}}
MANY = {"limits": {f"example.com/r{i}": "1" for i in range(scope.MAX_ITEMS + 1)}}
MARKED = {"gpuwarden.io/profile": "inference"}
#: What each shape of site is set to in the variants: GPU and CPU, gpuwarden's labels, too large
#: to look into, empty, null and not an object (the last two an error in both forms).
PROBES: dict[str, list[Any]] = {
    "container": [{"resources": GPU}, {"resources": CPU}, {"resources": MANY}, {}, None, "x"],
    "resources": [GPU, CPU, MANY, {}, None],
    "podSpec": [
        {"containers": [{"resources": GPU}]},
        {"containers": [{"resources": CPU}]},
        {"initContainers": [{"resources": GPU}]},
        {"containers": [{"resources": CPU}], "labels": MARKED},
        {"containers": [{"resources": CPU}], "annotations": MARKED},
        {"containers": [{"resources": CPU}] * (scope.MAX_CONTAINERS + 1)},
        {},
        None,
        "x",
    ],
    "template": [
        {"spec": {"containers": [{"resources": GPU}]}},
        {"spec": {"containers": [{"resources": CPU}]}},
        {"metadata": {"labels": MARKED}, "spec": {"containers": [{"resources": CPU}]}},
        {},
    ],
}


def per_site_clauses(kind: jobs.JobKind) -> list[str]:
    """A kind's clauses as JOB_CEL was written before sites were grouped: one per site."""
    return [f"({scope._site_cel(kind, site)})" for site in kind.sites]


def per_site_cel() -> str:
    return " || ".join(
        dict.fromkeys(clause for kind in jobs.ALL_KINDS for clause in per_site_clauses(kind))
    )


@cache
def program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def verdict(clauses: list[str], job: dict[str, Any]) -> bool | str:
    """The clauses' answer, ORed, for a CREATE of ``job``: True, False, or 'error'."""
    group, _, version = str(job.get("apiVersion", "")).rpartition("/")
    request = {"kind": {"group": group, "version": version, "kind": job.get("kind", "")}}
    try:
        found = program(" || ".join(clauses)).evaluate(
            {"object": celpy.json_to_cel(job), "request": celpy.json_to_cel(request)}
        )
    except celpy.CELEvalError:
        return "error"
    return "error" if isinstance(found, celpy.CELEvalError) else bool(found)


def example_jobs() -> Iterator[dict[str, Any]]:
    """Every job in examples/ and the policies' suites, and the tests' builders' jobs."""
    for path in JOB_FILES:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and jobs.job_kind(doc) is not None:
                yield doc
    for kind in jobs.TRAINING_OPERATOR_KINDS:
        yield job_of(kind)


_ABSENT = object()


def put(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``obj`` with ``value`` at ``path`` (or nothing there, for _ABSENT)."""
    obj = copy.deepcopy(obj)
    node = obj
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if value is _ABSENT:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return obj


def variants(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The job, and each of its kind's sites set to each probe of its shape or taken away, on
    the job as written and on the job with its other sites taken away."""
    yield job
    kind = jobs.job_kind(job)
    assert kind is not None
    bare = job
    for site in kind.sites:
        if not site.when:
            bare = put(bare, site.path, _ABSENT)
    for start in (job, bare):
        for site in kind.sites:
            guarded = start
            for path, value in site.when:
                # A guarded site (Katib's trial of one kind) is probed with its guards holding,
                # and with another site's guards holding instead.
                guarded = put(guarded, path, value)
            probes = PROBES["template" if site.per_replica else site.shape]
            if site.per_replica:
                probes = [{"Worker": {"template": probe}} for probe in probes]
            for probe in [*probes, _ABSENT]:
                yield put(guarded, site.path, probe)
                if site.when:
                    yield put(put(guarded, site.path, probe), site.when[0][0], "OtherJob")


CASES = list(
    {json.dumps(v, sort_keys=True): v for job in example_jobs() for v in variants(job)}.values()
)


def test_the_grouped_clauses_are_fewer_and_shorter() -> None:
    assert len(scope.JOB_CEL) < len(per_site_cel())
    assert scope.JOB_CEL.count("(request.kind.group") < per_site_cel().count("(request.kind.group")


def test_each_clause_is_for_one_kind() -> None:
    """JOB_CEL is its kinds' clauses ORed, each opening with its kind's test, so the clauses of
    a request's kind alone give its verdict, in either form."""
    clauses = [clause for kind in jobs.ALL_KINDS for clause in scope._kind_clauses(kind)]
    assert " || ".join(dict.fromkeys(clauses)) == scope.JOB_CEL
    for kind in jobs.ALL_KINDS:
        opening = f'(request.kind.group == "{kind.group}" && request.kind.kind == "{kind.kind}" && '
        for clause in [*scope._kind_clauses(kind), *per_site_clauses(kind)]:
            assert clause.startswith(opening)


@pytest.mark.parametrize("start", range(0, len(CASES), 100))
def test_the_grouped_cel_gives_every_job_the_per_site_verdict(start: int) -> None:
    for case in CASES[start : start + 100]:
        kind = jobs.job_kind(case)
        assert kind is not None
        grouped = verdict(scope._kind_clauses(kind), case)
        per_site = verdict(per_site_clauses(kind), case)
        assert grouped == per_site, yaml.safe_dump(case)
        if grouped != "error":
            assert grouped is scope.job_needs_review(case), yaml.safe_dump(case)


def test_the_cases_send_each_site_of_each_kind() -> None:
    """Every site without guards (KServe's components and shorthands among them) is set in some
    case that is sent."""
    for kind in {jobs.job_kind(case) for case in CASES}:
        assert kind is not None
        for site in (site for site in kind.sites if not site.when):
            assert any(
                jobs.job_kind(case) == kind
                and _at(case, site.path) is not None
                and scope.job_needs_review(case)
                for case in CASES
            ), (kind.kind, site.path)


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj
