"""agent/web/config.py on literal YAML: every refusal one line naming file, line and key."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from nodecheck.agent.web.config import WebConfigError, load_web_config, parse_web_config
from tests.agent.test_daemon import free_port
from tests.conftest import Node
from tests.fixtures.certificates import make_certificate

SOURCE = Path("/etc/node_exporter/web-config.yml")
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("pem"), "localhost")


def tls(pem: tuple[Path, Path], *lines: str) -> str:
    return "\n".join(
        ["tls_server_config:", f"  cert_file: {pem[0]}", f"  key_file: {pem[1]}", *lines, ""]
    )


REFUSALS: list[tuple[str, str, str]] = [
    # (YAML, "line: key", a part of the reason)
    ("a: [", "1: ", "not YAML"),
    ("- tls_server_config\n", "1: ", "expected a mapping"),
    ("rate_limit:\n  interval: 1s\n", "1: rate_limit", "exporter-toolkit 0.11"),
    ("tls_server_config: {}\ntls_server_config: {}\n", "2: tls_server_config", "given twice"),
    ("tls_server_config: [a]\n", "1: tls_server_config", "expected a mapping"),
    ("tls_server_config:\n  cert_file: c.pem\n", "1: tls_server_config.key_file", "missing"),
    ("tls_server_config:\n  key_file: k.pem\n", "1: tls_server_config.cert_file", "missing"),
    ("tls_server_config:\n  min_version: TLS11\n", "2: tls_server_config.min_version", "TLS 1.0"),
    ("tls_server_config:\n  max_version: 1.3\n", "2: tls_server_config.max_version", "'1.3'"),
    ("tls_server_config:\n  cipher_suites: AES\n", "2: tls_server_config.cipher_suites", "list"),
    (
        "tls_server_config:\n  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
        "2: tls_server_config.cipher_suites",
        "unknown cipher",
    ),
    (
        "tls_server_config:\n  curve_preferences: [CurveP224]\n",
        "2: tls_server_config.curve_preferences",
        "unknown curve",
    ),
    (
        "tls_server_config:\n  prefer_server_cipher_suites: 1\n",
        "2: tls_server_config.prefer_server_cipher_suites",
        "true or false",
    ),
    (
        "tls_server_config:\n  client_allowed_sans: [a]\n",
        "2: tls_server_config.client_allowed_sans",
        "node_exporter 1.5.0",
    ),
    ("http_server_config:\n  http3: true\n", "2: http_server_config.http3", "unknown key"),
    ("http_server_config:\n  http2: maybe\n", "2: http_server_config.http2", "true or false"),
    (
        "http_server_config:\n  headers:\n    Server: x\n",
        "3: http_server_config.headers.Server",
        "cannot be set",
    ),
    (
        "http_server_config:\n  headers:\n    x-frame-options: deny\n",
        "3: http_server_config.headers.x-frame-options",
        "cannot be set",
    ),
    (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow-from\n",
        "3: http_server_config.headers.X-Frame-Options",
        "deny, sameorigin",
    ),
    (
        'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\r\\nb: c"\n',
        "3: http_server_config.headers.Content-Security-Policy",
        "control character",
    ),
    (
        "http_server_config:\n  headers:\n"
        '    Content-Security-Policy: "default-src \u2019self\u2019"\n',
        "3: http_server_config.headers.Content-Security-Policy",
        "only ASCII",
    ),
    ("a: &x {b: 1}\nc:\n  <<: *x\n", "3: <<", "merge keys"),
    ('"tls\\x1b[2Jserver": {}\n', "1: tls\\x1b[2Jserver", "unknown key"),
    ("basic_auth_users: [a]\n", "1: basic_auth_users", "expected a mapping"),
    ("basic_auth_users:\n  p: plain\n", "2: basic_auth_users.p", "bcrypt"),
    (
        "basic_auth_users:\n  p: $2b$18$" + "a" * 53 + "\n",
        "2: basic_auth_users.p",
        "cost 18 is above 17",
    ),
    ("basic_auth_users:\n  p: [a]\n", "2: basic_auth_users.p", "expected a string"),
    ("basic_auth_users:\n  ? [a]\n  : b\n", "2: ", "not a name"),
]

TLS_REFUSALS: list[tuple[list[str], str, str]] = [
    # (lines under tls_server_config after cert_file and key_file, "line: key", reason)
    (["  client_auth_type: RequestClientCert"], "4: tls_server_config.client_auth_type", "ssl"),
    (["  client_auth_type: RequireAnyClientCert"], "4: tls_server_config.client_auth_type", ""),
    (["  client_auth_type: RequireClientCert"], "4: tls_server_config.client_auth_type", ""),
    (["  client_auth_type: Sometimes"], "4: tls_server_config.client_auth_type", "unknown"),
    (
        ["  client_auth_type: RequireAndVerifyClientCert"],
        "4: tls_server_config.client_auth_type",
        "without client_ca_file",
    ),
    (["  client_ca_file: ca.pem"], "4: tls_server_config.client_ca_file", "client_auth_type"),
    (
        ["  client_auth_type: VerifyClientCertIfGiven", "  client_ca_file: missing.pem"],
        "5: tls_server_config.client_ca_file",
        "missing.pem",
    ),
    (
        ["  min_version: TLS13", "  max_version: TLS12"],
        "4: tls_server_config.min_version",
        "above max_version",
    ),
    (
        ["  cipher_suites: [TLS_AES_128_GCM_SHA256]", "http_server_config:", "  http2: false"],
        "4: tls_server_config.cipher_suites",
        "only TLS 1.3 suites",
    ),
    (
        ["  cipher_suites: [TLS_RSA_WITH_AES_128_GCM_SHA256]"],
        "4: tls_server_config.cipher_suites",
        "HTTP/2",
    ),
    (
        ["  curve_preferences: [CurveP256, X25519]"],
        "4: tls_server_config.curve_preferences",
        "one curve",
    ),
]


def refusal(text: str, path: Path = SOURCE) -> str:
    with pytest.raises(WebConfigError) as raised:
        parse_web_config(text, path)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize(("text", "where", "reason"), REFUSALS)
def test_every_refusal_names_the_file_line_and_key(text: str, where: str, reason: str) -> None:
    message = refusal(text)
    assert message.startswith(f"{SOURCE}:{where}"), message
    assert reason in message, message


@pytest.mark.parametrize(("lines", "where", "reason"), TLS_REFUSALS)
def test_tls_refusals_name_the_file_line_and_key(
    pem: tuple[Path, Path], tmp_path: Path, lines: list[str], where: str, reason: str
) -> None:
    path = tmp_path / "web-config.yml"
    message = refusal(tls(pem, *lines), path)
    assert message.startswith(f"{path}:{where}"), message
    assert reason in message, message


def test_unusable_tls_files_are_named(pem: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("")
    path = tmp_path / "web-config.yml"
    message = refusal(f"tls_server_config:\n  cert_file: empty.pem\n  key_file: {pem[1]}\n", path)
    assert message.startswith(f"{path}:2: tls_server_config.cert_file: {tmp_path}/empty.pem"), (
        message
    )
    message = refusal(f"tls_server_config:\n  cert_file: {pem[0]}\n  key_file: {pem[0]}\n", path)
    assert message.startswith(f"{path}:3: tls_server_config.key_file: {pem[0]}"), message
    message = refusal(
        tls(pem, "  client_auth_type: RequireAndVerifyClientCert", "  client_ca_file: empty.pem"),
        path,
    )
    assert "client_ca_file" in message and "no PEM certificate" in message, message


def test_unreadable_files_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"web-config.yml: no such file$"):
        load_web_config(tmp_path / "web-config.yml")
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe")
    with pytest.raises(WebConfigError, match=r"binary.yml:1: not UTF-8"):
        load_web_config(tmp_path / "binary.yml")
    (tmp_path / "deep.yml").write_text("a: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(WebConfigError) as deep:
        load_web_config(tmp_path / "deep.yml")
    message = str(deep.value)
    assert message.startswith(f"{tmp_path}/deep.yml") and "\n" not in message


def test_what_is_accepted(pem: tuple[Path, Path], tmp_path: Path) -> None:
    assert parse_web_config("", SOURCE).tls is None  # empty: plain HTTP, as for Go
    # Values as yaml.v2 reads them into Go strings: a number's text.
    config = parse_web_config(
        f"http_server_config:\n  headers:\n    X-XSS-Protection: 0\nbasic_auth_users:\n"
        f"  prometheus: {HASH}\n  1234: '{HASH}'\n",
        SOURCE,
    )
    assert config.tls is None and config.headers == (("X-XSS-Protection", "0"),)
    assert [user for user, _ in config.users] == ["prometheus", "1234"]
    # TLS settings without files: no TLS (exporter-toolkit's errNoTLSConfig), but checked.
    assert parse_web_config("tls_server_config:\n  min_version: TLS13\n", SOURCE).tls is None
    config = parse_web_config(
        tls(
            pem,
            "  client_auth_type: VerifyClientCertIfGiven",
            f"  client_ca_file: {pem[0]}",
            "  min_version: TLS13",
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]",  # no effect, as in Go
            "  curve_preferences: [X25519]",
            "  prefer_server_cipher_suites: false",
        ),
        tmp_path / "web-config.yml",
    )
    assert config.tls is not None and config.context is not None
    assert config.context.verify_mode == ssl.CERT_OPTIONAL
    assert config.context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert not config.context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def run_agent(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, *args],
        env={**os.environ, **node.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_toml_keys_and_the_web_config_file_are_not_set_together(
    build: Callable[..., Node], pem: tuple[Path, Path], tmp_path: Path
) -> None:
    node = build("cpu-only")
    web = tmp_path / "web-config.yml"
    web.write_text(tls(pem))
    config = tmp_path / "config.toml"
    both = f'tls_cert_file = "{pem[0]}"\ntls_key_file = "{pem[1]}"\nweb_config_file = "{web}"\n'
    config.write_text(f'[agent]\nlisten = "127.0.0.1:{free_port()}"\n{both}')
    done = run_agent(node, "config", "check", str(config))
    assert done.returncode == 2
    assert (
        f"{config}:3: agent.tls_cert_file: set with web_config_file: write "
        "tls_server_config: cert_file, tls_server_config: key_file in" in done.stderr
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # The same through --web.config.file over a file with the TLS keys.
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'tls_cert_file = "{pem[0]}"\ntls_key_file = "{pem[1]}"\n'
    )
    done = run_agent(node, "agent", "--config", str(config), "--web.config.file", str(web))
    assert done.returncode == 2
    assert "agent.tls_cert_file: set with web_config_file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # A bad web configuration given on the command line: one line, the file and key.
    web.write_text("tls_server_config:\n  min_version: TLS10\n")
    done = run_agent(node, "agent", "--web.config.file", str(web))
    assert done.returncode == 2
    assert f"{web}:2: tls_server_config.min_version: TLS10" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # In the TOML: named under agent.web_config_file; and config show shows it.
    config.write_text(f'[agent]\nweb_config_file = "{web}"\n')
    done = run_agent(node, "config", "check", str(config))
    assert done.returncode == 2
    assert f"{config}:2: agent.web_config_file: {web}:2: tls_server_config" in done.stderr
    web.write_text(tls(pem))
    done = run_agent(node, "config", "show", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f'web_config_file = "{web}"' in done.stdout


def test_the_configured_headers_are_on_answers_http_server_writes_itself() -> None:
    """A 501 (a method the agent does not serve) and a 431 (over 100 header lines) are
    written by http.server's send_error, not by the agent's routes: the file's headers are
    on them too, as exporter-toolkit sets them on every response."""
    import socket

    from nodecheck.agent.web.server import serve

    web = parse_web_config("http_server_config:\n  headers:\n    X-Frame-Options: deny\n", SOURCE)
    port = free_port()
    server = serve(f"127.0.0.1:{port}", lambda: b"", dict, lambda: True, web=web)
    try:
        many = b"".join(b"X-%d: y\r\n" % n for n in range(101))
        for request in (
            b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + many + b"\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
                connection.sendall(request)
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = connection.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
            assert head.split(" ", 2)[1] in ("431", "501"), head
            assert "\r\nX-Frame-Options: deny" in head, head
    finally:
        server.shutdown()
        server.server_close()
