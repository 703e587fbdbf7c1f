"""GPUPolicy objects served with the policy files: precedence, the last good version, status.

The webhook here is the real server; its GPUPolicy objects come from a fake source (the API
server's watch is gpuwarden.kube.gpupolicies, exercised by tests/e2e/test_gpupolicies.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.client.exceptions import ApiException

from gpuwarden.cli import build_parser
from gpuwarden.commands.serve import config_from
from gpuwarden.kube.cluster import StaticCluster
from gpuwarden.kube.gpupolicies import (
    ObjectVerdict,
    PolicyObject,
    StatusWriter,
    policy_object,
)
from gpuwarden.webhook.server import WebhookServer

from .support import (
    BAD_POLICY,
    Webhook,
    Workdir,
    apply_response,
    base_config,
    client_context,
    notebook_pod,
    review,
)

TENANT = "gpuwarden.io/tenant"
CAP = "gpuwarden.io/gpu-memory-limit"


def team_spec(cap: str = "4Gi", profile: str = "light-training") -> dict[str, Any]:
    """A tenant for the namespace "plain" (in no tenant of the files) with its own cap."""
    return {
        "tenants": [
            {
                "name": "plain-team",
                "namespaces": ["plain"],
                "overrides": {profile: {"maxMemory": cap}},
            }
        ]
    }


@dataclass
class FakeObjects:
    """GPUPolicy objects as the API server would hold them; generations move as it moves them."""

    items: dict[str, PolicyObject] = field(default_factory=dict)
    synced: bool = True
    problems: list[str] = field(default_factory=list)
    reported: list[dict[str, ObjectVerdict]] = field(default_factory=list)

    def apply(self, name: str, spec: Mapping[str, Any]) -> PolicyObject:
        """Create or update (a new generation when the spec changes), as `kubectl apply`."""
        old = self.items.get(name)
        uid = old.uid if old is not None else str(uuid.uuid4())
        generation = 1 if old is None else old.generation + (old.document["spec"] != spec)
        obj = policy_object(
            {
                "apiVersion": "gpuwarden.io/v1alpha1",
                "kind": "GPUPolicy",
                "metadata": {
                    "name": name,
                    "uid": uid,
                    "generation": generation,
                    "resourceVersion": str(uuid.uuid4().int % 10**6),
                },
                "spec": dict(spec),
                "status": dict(old.status) if old is not None else {},  # kept by spec updates
            }
        )
        assert obj is not None
        self.items[name] = obj
        return obj

    def delete(self, name: str) -> None:
        del self.items[name]

    # ObjectSource
    def objects(self) -> Mapping[str, PolicyObject]:
        return dict(self.items)

    def report(self, verdicts: Mapping[str, ObjectVerdict]) -> None:
        self.reported.append(dict(verdicts))

    def missing(self) -> list[str]:
        return list(self.problems)

    def notes(self) -> list[str]:
        return []

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def verdict(self, name: str) -> ObjectVerdict:
        return self.reported[-1][name]


@contextlib.asynccontextmanager
async def serving(workdir: Workdir, objects: FakeObjects) -> AsyncIterator[Webhook]:
    server = WebhookServer(
        base_config(workdir), cluster=StaticCluster(workdir.namespaces), policy_objects=objects
    )
    await server.start()
    hook = Webhook(
        server,
        aiohttp.ClientSession(),
        workdir.certs.ca_cert,
        client_context(workdir.certs.ca_cert),
    )
    try:
        yield hook
    finally:
        await hook.session.close()
        await server.stop()


@pytest.fixture
async def served(workdir: Workdir) -> AsyncIterator[tuple[Webhook, FakeObjects]]:
    objects = FakeObjects()
    async with serving(workdir, objects) as hook:
        yield hook, objects


async def notebook_in_plain(hook: Webhook) -> tuple[str | None, str]:
    """The tenant and GPU-memory cap the webhook gives a notebook in namespace "plain"."""
    hook.server.tick()
    pod = notebook_pod("plain")
    annotations = apply_response(pod, await hook.admit("mutate", review(pod, namespace="plain")))[
        "metadata"
    ]["annotations"]
    return annotations.get(TENANT), annotations[CAP]


async def test_an_object_is_served_with_the_files(served: tuple[Webhook, FakeObjects]) -> None:
    hook, objects = served
    assert await notebook_in_plain(hook) == (None, "16Gi")  # the files alone
    objects.apply("plain-team", team_spec("4Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    assert objects.verdict("plain-team") == ObjectVerdict(
        uid=objects.items["plain-team"].uid, generation=1, valid=True, serving=1
    )
    status, ready = await hook.get("/readyz")
    assert status == 200 and "gpupolicy" not in ready


async def test_apply_break_fix_delete(served: tuple[Webhook, FakeObjects]) -> None:
    hook, objects = served
    objects.apply("plain-team", team_spec("4Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")

    # Broken: the last good generation stays in force, and the verdict names the field.
    objects.apply("plain-team", team_spec("4Gi", profile="no-such-profile"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    verdict = objects.verdict("plain-team")
    assert (verdict.valid, verdict.generation, verdict.serving) == (False, 2, 1)
    assert verdict.message == (
        "gpupolicy/plain-team: spec.tenants[0].overrides['no-such-profile']: "
        "unknown profile 'no-such-profile' (known: light-training)"
    )
    status, ready = await hook.get("/readyz")
    assert status == 200  # a bad object never takes the webhook out
    assert "gpupolicy/plain-team generation 2 is invalid (generation 1 still serves)" in ready
    assert "overrides['no-such-profile']" in ready

    # Fixed: the new generation serves.
    objects.apply("plain-team", team_spec("8Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "8Gi")
    assert objects.verdict("plain-team").valid
    assert "gpupolicy" not in (await hook.get("/readyz"))[1]

    # Deleted: gone, with its last good version.
    objects.delete("plain-team")
    assert await notebook_in_plain(hook) == (None, "16Gi")
    assert objects.reported[-1] == {}


async def test_an_object_invalid_from_the_start_is_not_served(
    served: tuple[Webhook, FakeObjects],
) -> None:
    hook, objects = served
    objects.apply("plain-team", team_spec(profile="no-such-profile"))
    assert await notebook_in_plain(hook) == (None, "16Gi")
    verdict = objects.verdict("plain-team")
    assert (verdict.valid, verdict.serving) == (False, None)
    assert (
        "gpupolicy/plain-team generation 1 is invalid (not served)"
        in (await hook.get("/readyz"))[1]
    )


async def test_the_files_win_over_an_object(served: tuple[Webhook, FakeObjects]) -> None:
    hook, objects = served
    objects.apply(
        "a-redefines",
        {
            "profiles": [{"name": "light-training", "gpuShare": True, "maxMemory": "2Gi"}],
            **team_spec("2Gi"),
        },
    )
    assert await notebook_in_plain(hook) == (None, "16Gi")
    assert objects.verdict("a-redefines").message == (
        "gpupolicy/a-redefines: spec.profiles[0].name: profile 'light-training' is defined twice: "
        "here and in policy files"
    )


async def test_between_objects_the_first_name_wins(served: tuple[Webhook, FakeObjects]) -> None:
    hook, objects = served
    objects.apply("b-team", team_spec("8Gi"))
    objects.apply("a-team", team_spec("4Gi"))  # created later, named first
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    assert objects.verdict("a-team").valid
    later = objects.verdict("b-team")
    assert (later.valid, later.serving) == (False, None)
    assert (
        later.message
        == "gpupolicy/b-team: spec.tenants[0].name: tenant 'plain-team' is defined twice: "
        "here and in gpupolicy/a-team"
    )


async def test_an_object_may_use_the_profiles_of_another(
    served: tuple[Webhook, FakeObjects],
) -> None:
    hook, objects = served
    # Named before the object that defines its profile: the set is loaded as one.
    objects.apply("a-team", team_spec("4Gi", profile="tiny"))
    objects.apply(
        "z-profiles",
        {"profiles": [{"name": "tiny", "gpuShare": True, "maxMemory": "1Gi", "priority": 10}]},
    )
    hook.server.tick()
    assert objects.verdict("a-team").valid and objects.verdict("z-profiles").valid


async def test_a_recreated_object_does_not_bring_back_the_deleted_ones_version(
    served: tuple[Webhook, FakeObjects],
) -> None:
    hook, objects = served
    objects.apply("plain-team", team_spec("4Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    objects.delete("plain-team")
    objects.apply("plain-team", team_spec(profile="no-such-profile"))  # a new uid
    assert await notebook_in_plain(hook) == (None, "16Gi")
    assert objects.verdict("plain-team").serving is None


async def test_broken_files_keep_serving_their_last_good_version_with_the_objects(
    served: tuple[Webhook, FakeObjects], workdir: Workdir
) -> None:
    hook, objects = served
    workdir.write_policy(BAD_POLICY)
    objects.apply("plain-team", team_spec("4Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    status, ready = await hook.get("/readyz")
    assert status == 200 and "last policy reload failed" in ready


async def test_a_file_change_can_invalidate_an_object_and_its_last_good_version(
    served: tuple[Webhook, FakeObjects], workdir: Workdir
) -> None:
    hook, objects = served
    objects.apply("plain-team", team_spec("4Gi"))
    assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
    policy = (workdir.policies / "policy.yaml").read_text()
    workdir.write_policy(
        policy.replace("name: light-training", "name: renamed")
        .replace("profile: light-training", "profile: renamed")
        .replace("defaultProfile: light-training", "defaultProfile: renamed")
    )
    hook.server.tick()
    verdict = objects.verdict("plain-team")
    assert (verdict.valid, verdict.serving) == (False, None)
    assert "unknown profile 'light-training' (known: renamed)" in verdict.message


async def test_not_ready_until_the_objects_are_known(workdir: Workdir) -> None:
    objects = FakeObjects(synced=False, problems=["GPUPolicy objects not synced yet: 403 ..."])
    objects.apply("plain-team", team_spec("4Gi"))
    async with serving(workdir, objects) as hook:
        status, ready = await hook.get("/readyz")
        assert status == 503 and "GPUPolicy objects not synced yet: 403 ..." in ready
        hook.server.tick()
        assert objects.reported == []  # no status is judged from a partial list
        objects.synced, objects.problems = True, []
        assert (await hook.get("/readyz"))[0] == 503  # known, but not served yet
        assert await notebook_in_plain(hook) == ("plain-team", "4Gi")
        assert (await hook.get("/readyz"))[0] == 200
        assert objects.verdict("plain-team").valid


# --- status ----------------------------------------------------------------------------------


@dataclass
class FakeStatusApi:
    """The status subresource: merge patches with a resourceVersion precondition."""

    objects: FakeObjects
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refuse: int | None = None

    def patch(self, name: str, body: Mapping[str, Any]) -> object:
        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="Refused")
        stored = self.objects.items[name]
        if body["metadata"]["resourceVersion"] != stored.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append((name, dict(body["status"])))
        self.objects.items[name] = PolicyObject(
            **{**stored.__dict__, "status": body["status"], "resource_version": uuid.uuid4().hex}
        )
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer_for(objects: FakeObjects, clock: Clock) -> tuple[StatusWriter, FakeStatusApi]:
    api = FakeStatusApi(objects)
    times = iter(f"2026-01-01T00:00:{second:02d}Z" for second in range(60))
    writer = StatusWriter(
        api.patch, objects.objects, retry_after=30.0, clock=clock, now=lambda: next(times)
    )
    return writer, api


def verdict_for(obj: PolicyObject, *, valid: bool, message: str = "") -> ObjectVerdict:
    return ObjectVerdict(obj.uid, obj.generation, valid, message, obj.generation if valid else None)


def test_status_is_written_once_per_judgement() -> None:
    objects = FakeObjects()
    obj = objects.apply("team", team_spec())
    writer, api = writer_for(objects, Clock())
    writer.report({"team": verdict_for(obj, valid=True)})
    writer.write_due()
    writer.write_due()  # the watch's echo of the write: nothing differs
    writer.report({"team": verdict_for(obj, valid=True)})  # judged alike again
    writer.write_due()
    assert api.patches == [
        (
            "team",
            {
                "observedGeneration": 1,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "observedGeneration": 1,
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "reason": "Valid",
                        "message": "in force: served with the policy files and the other valid "
                        "GPUPolicy objects",
                    }
                ],
            },
        )
    ]


def test_a_new_generation_gets_its_own_status_and_transition_time() -> None:
    objects = FakeObjects()
    first = objects.apply("team", team_spec())
    writer, api = writer_for(objects, Clock())
    writer.report({"team": verdict_for(first, valid=True)})
    writer.write_due()
    second = objects.apply("team", team_spec(profile="nope"))
    writer.write_due()  # the verdict is for generation 1: not written onto generation 2
    assert len(api.patches) == 1
    writer.report({"team": verdict_for(second, valid=False, message="gpupolicy/team: bad")})
    writer.write_due()
    status = api.patches[-1][1]
    (condition,) = status["conditions"]
    assert status["observedGeneration"] == condition["observedGeneration"] == 2
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Invalid",
        "gpupolicy/team: bad",
    )
    assert (
        condition["lastTransitionTime"] != api.patches[0][1]["conditions"][0]["lastTransitionTime"]
    )
    # Invalid again, for another reason: Ready has not changed, nor has its transition time.
    third = objects.apply("team", team_spec(profile="other"))
    writer.report({"team": verdict_for(third, valid=False, message="gpupolicy/team: worse")})
    writer.write_due()
    later = api.patches[-1][1]["conditions"][0]
    assert (later["observedGeneration"], later["message"]) == (3, "gpupolicy/team: worse")
    assert later["lastTransitionTime"] == condition["lastTransitionTime"]


def test_two_replicas_that_disagree_do_not_overwrite_each_other_in_a_loop() -> None:
    objects = FakeObjects()
    obj = objects.apply("team", team_spec())
    clock = Clock()
    one, one_api = writer_for(objects, clock)
    two, two_api = writer_for(objects, clock)  # another replica, on the same objects
    one.report({"team": verdict_for(obj, valid=True)})
    two.report({"team": verdict_for(obj, valid=False, message="gpupolicy/team: elsewhere")})
    for _ in range(3):  # each sees the other's write through the watch
        one.write_due()
        two.write_due()
    assert (len(one_api.patches), len(two_api.patches)) == (1, 1)
    clock.now += 31
    one.write_due()
    assert len(one_api.patches) == 2
    assert objects.items["team"].status["conditions"][0]["reason"] == "Valid"


def test_a_refused_write_is_retried_later_and_shown() -> None:
    objects = FakeObjects()
    obj = objects.apply("team", team_spec())
    clock = Clock()
    writer, api = writer_for(objects, clock)
    api.refuse = 403
    writer.report({"team": verdict_for(obj, valid=True)})
    writer.write_due()
    assert writer.last_error is not None and "403" in writer.last_error
    assert "patch on gpupolicies/status" in writer.last_error
    api.refuse = None
    writer.write_due()
    assert api.patches == []
    clock.now += 31
    writer.write_due()
    assert len(api.patches) == 1 and writer.last_error is None


# --- serve's flag ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "watched"),
    [
        ([], True),
        (["--no-watch-policies"], False),
        (["--namespaces=ns.yaml"], False),
        (["--namespaces=ns.yaml", "--watch-policies"], True),
    ],
)
def test_gpupolicy_objects_are_watched_by_default_with_a_cluster(
    flags: list[str], watched: bool, tmp_path: Path
) -> None:
    args = build_parser().parse_args(["serve", "--policies=p", f"--cert-dir={tmp_path}", *flags])
    assert config_from(args).watch_policies is watched
