"""HTTPS and basic auth in front of /metrics and /results."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from tests.agent.test_daemon import free_port
from tests.conftest import Node
from tests.fixtures.certificates import make_certificate


def fetch(url: str, context: ssl.SSLContext, user: str | None = None, password: str = "") -> int:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_https_with_basic_auth(build: Callable[..., Node], tmp_path: Path) -> None:
    node = build("cpu-only")
    cert, key = make_certificate(tmp_path, "localhost")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    users = tmp_path / "users"
    users.write_text(f"# scrapers\nprometheus:{hashed}\n")
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{port}"\ntls_cert_file = "{cert}"\n'
        f'tls_key_file = "{key}"\nbasic_auth_file = "{users}"\n'
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "agent", "--config", str(config)],
        env={**os.environ, **node.env},
        stderr=subprocess.PIPE,
    )
    context = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert fetch(f"{base}/healthz", context) == 200  # no auth: no data in it
                break
            except urllib.error.URLError:
                assert agent.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        # A client that connects and says nothing holds up nobody (the TLS handshake
        # runs on its own request thread, not in accept()).
        silent = socket.create_connection(("127.0.0.1", port))
        try:
            started = time.monotonic()
            assert fetch(f"{base}/healthz", context) == 200
            assert time.monotonic() - started < 5
        finally:
            silent.close()
        assert fetch(f"{base}/metrics", context) == 401
        assert fetch(f"{base}/metrics", context, "prometheus", "wrong") == 401
        assert fetch(f"{base}/metrics", context, "nobody", "s3cret") == 401
        assert fetch(f"{base}/metrics", context, "prometheus", "s3cret") == 200
        assert fetch(f"{base}/results", context, "prometheus", "s3cret") == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        agent.terminate()
        agent.wait(10)


def test_a_bad_users_file_is_refused(build: Callable[..., Node], tmp_path: Path) -> None:
    node = build("cpu-only")
    users = tmp_path / "users"
    users.write_text("prometheus:plaintext\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nlisten = "127.0.0.1:{free_port()}"\nbasic_auth_file = "{users}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "agent", "--config", str(config)],
        env={**os.environ, **node.env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert (
        f"{config}:3: agent.basic_auth_file: {users}:1: expected user:<bcrypt hash>" in done.stderr
    )


def test_new_users_forget_old_passwords() -> None:
    from nodecheck.agent.web.auth import BasicAuth

    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"old", bcrypt.gensalt(rounds=4))})
    header = "Basic " + base64.b64encode(b"prometheus:old").decode()
    assert auth.allows(header) and auth.allows(header)  # the second from the cache
    auth.users = {"prometheus": bcrypt.hashpw(b"new", bcrypt.gensalt(rounds=4))}
    assert not auth.allows(header)


def test_ipv6_listen_address() -> None:
    from nodecheck.agent.web.server import serve

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = serve(f"[::1]:{port}", lambda: b"", lambda: {}, lambda: True)
    try:
        with urllib.request.urlopen(f"http://[::1]:{port}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        server.shutdown()
        server.server_close()
