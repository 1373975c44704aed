"""The `slurm_cluster` session fixture: a real one-node Slurm cluster on loopback.

Started once, for the first test of this folder that asks for it, and stopped after
the session (every daemon, and its folder removed) even when a test fails. Each test
that used it gets the node as a fresh cluster has it: idle before the test; after it,
jobs cancelled, the settings it set removed and the node idle again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.slurm_cluster import SlurmCluster, missing_reason, start_cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _restore_slurm_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around each test that uses the cluster: the node idle before, restored after."""
    if "slurm_cluster" not in request.fixturenames:
        yield
        return
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    cluster.wait_idle()
    yield
    cluster.reset()
