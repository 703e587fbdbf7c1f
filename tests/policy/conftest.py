"""Fixtures for the policy-core tests: the bundled default policies and the example namespaces."""

from __future__ import annotations

import pytest

from gpuwarden.policy import ClusterView, PolicySet, load_paths

from .support import EXAMPLES, POLICIES, namespace_labels


@pytest.fixture(scope="session")
def default_policies() -> PolicySet:
    return load_paths([POLICIES])


@pytest.fixture(scope="session")
def cluster() -> ClusterView:
    return ClusterView(namespace_labels=namespace_labels())


@pytest.fixture(scope="session")
def classic_policies() -> PolicySet:
    """The old default (examples/policies): pipeline steps with fixed GPU counts, 0 included."""
    return load_paths([EXAMPLES / "policies" / "kubeflow-classic.yaml"])
