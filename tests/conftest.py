"""Fixtures every suite shares: one real etcd + kube-apiserver per test session (e2e/fixtures.py).

Defining them here, once, is what makes the session scope real: a star import into several
conftest files would give each its own control plane.
"""

from e2e.fixtures import *  # noqa: F403
