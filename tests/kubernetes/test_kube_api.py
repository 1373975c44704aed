"""agent/kubernetes/api.py against the API double: token, CA, deadlines, errors as values."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodecheck.agent.kubernetes.api import KubeClient
from tests.agent.test_daemon import free_port
from tests.fixtures.certificates import make_certificate
from tests.fixtures.kube_api import KubeApiDouble

RBAC = Path(__file__).resolve().parent.parent.parent / "deploy" / "kubernetes" / "rbac.yaml"


@pytest.fixture
def double(tmp_path: Path) -> Iterator[KubeApiDouble]:
    api = KubeApiDouble(RBAC, tmp_path)
    api.start()
    api.add_node("n1")
    try:
        yield api
    finally:
        api.stop()


def client(api_url: str, tmp_path: Path, ca: Path, timeout_s: float = 5) -> KubeClient:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("token-1\n")
    return KubeClient(api_url, token, ca, timeout_s, token_reread_s=60)


def test_a_rotated_token_is_read_again_after_a_401(double: KubeApiDouble, tmp_path: Path) -> None:
    kube = client(double.url, tmp_path, double.cert)
    assert kube.get_node("n1").ok
    double.tokens = {"token-2"}
    (tmp_path / "token").write_text("token-2\n")
    reply = kube.get_node("n1")  # within token_reread_s: the 401 makes it read the file
    assert reply.ok and reply.body is not None and reply.body["metadata"]["name"] == "n1"
    assert double.count("GET", "/nodes/n1", 401) == 1


def test_errors_are_values_with_the_api_servers_message(
    double: KubeApiDouble, tmp_path: Path
) -> None:
    kube = client(double.url, tmp_path, double.cert)
    watching = kube.request("GET", "/api/v1/nodes?watch=true")
    assert watching.status == 403 and not watching.ok
    assert 'cannot watch resource "nodes"' in (watching.error or "")
    assert watching.describe().startswith("403 Forbidden: ")
    missing = kube.get_node("n2")
    assert missing.status == 404 and missing.error == 'nodes "n2" not found'
    (tmp_path / "token").unlink()
    fresh = KubeClient(double.url, tmp_path / "token", double.cert, 5, 60)
    assert fresh.get_node("n1").status == 0
    assert "no such file" in (fresh.get_node("n1").error or "")


def test_no_answer_wrong_ca_and_a_hung_server(double: KubeApiDouble, tmp_path: Path) -> None:
    refused = client(f"https://127.0.0.1:{free_port()}", tmp_path, double.cert).get_node("n1")
    assert refused.status == 0 and "Connection refused" in (refused.error or "")
    (tmp_path / "other").mkdir()
    other_ca, _ = make_certificate(tmp_path / "other", "kube-apiserver")
    untrusted = client(double.url, tmp_path, other_ca).get_node("n1")
    assert untrusted.status == 0 and "CERTIFICATE_VERIFY_FAILED" in (untrusted.error or "")
    kube = client(double.url, tmp_path, double.cert, timeout_s=0.5)
    with double.hung():
        started = time.monotonic()
        reply = kube.get_node("n1")
        elapsed = time.monotonic() - started
    assert reply.status == 0 and reply.error == "timed out after 0.5 s"
    assert elapsed < 3
