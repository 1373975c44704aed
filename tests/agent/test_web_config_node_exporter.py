"""One web-config.yml, two servers: Debian's node_exporter (1.5.0, the exporter toolkit's
own reading of the file) and the agent. The same requests get the same outcome from both:
the status code, or the TLS handshake refused; the custom headers alike."""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from tests.agent.test_daemon import free_port, wait_for
from tests.conftest import Node
from tests.fixtures.certificates import make_certificate

NODE_EXPORTER = Path("/usr/bin/prometheus-node-exporter")
START_S = 90.0  # the machine is shared: a Python start on a loaded machine is slow
PASSWORD = "s3cret"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
REFUSED = "refused"  # the TLS handshake, or the connection right after it, refused


@pytest.fixture(scope="module")
def node_exporter() -> Path:
    if not NODE_EXPORTER.is_file():
        pytest.fail(
            f"{NODE_EXPORTER} is missing: install Debian's node_exporter "
            "(apt-get install prometheus-node-exporter; `make test` installs it)"
        )
    return NODE_EXPORTER


@dataclass
class Certificates:
    server: tuple[Path, Path]
    client: tuple[Path, Path]  # its own CA: the client_ca_file
    stranger: tuple[Path, Path]  # another CA's


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("certificates")
    return Certificates(
        make_certificate(directory, "localhost"),
        make_certificate(directory, "scraper"),
        make_certificate(directory, "stranger"),
    )


@dataclass
class Client:
    """One way of asking: TLS versions, a client certificate, credentials."""

    versions: tuple[ssl.TLSVersion, ssl.TLSVersion] = (
        ssl.TLSVersion.TLSv1_2,
        ssl.TLSVersion.TLSv1_3,
    )
    certificate: tuple[Path, Path] | None = None
    user: str | None = None
    password: str = ""

    def context(self, server_cert: Path) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(server_cert))
        with warnings.catch_warnings():  # ssl deprecates TLS 1.1: refused is what is tested
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version, context.maximum_version = self.versions
        if self.versions[1] < ssl.TLSVersion.TLSv1_2:
            context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 speaks TLS 1.1 only so
        if self.certificate is not None:
            context.load_cert_chain(*self.certificate)
        return context


Outcome = tuple[object, dict[str, str | None]]
HEADERS = ("X-Frame-Options", "X-Content-Type-Options", "Strict-Transport-Security")


def ask(port: int, server_cert: Path, client: Client) -> Outcome:
    """(status code or REFUSED, the custom headers' values) of GET /metrics."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=30, context=client.context(server_cert)
    )
    headers = {}
    if client.user is not None:
        token = base64.b64encode(f"{client.user}:{client.password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        response.read()
    except TimeoutError:
        return "no answer within 30 s", {}
    except (ssl.SSLError, ConnectionError) as err:
        return REFUSED, {"error": type(err).__name__}
    finally:
        connection.close()
    return response.status, {name: response.getheader(name) for name in HEADERS}


def listening(port: int, process: subprocess.Popen[bytes], log: Path) -> bool:
    assert process.poll() is None, log.read_text(errors="replace")
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@dataclass
class Pair:
    exporter_port: int
    agent_port: int
    agent: subprocess.Popen[bytes]
    agent_log: Path
    server_cert: Path
    headers: tuple[str, ...]  # the custom headers the file sets

    def both(self, client: Client) -> tuple[Outcome, Outcome]:
        return ask(self.exporter_port, self.server_cert, client), ask(
            self.agent_port, self.server_cert, client
        )


@contextmanager
def side_by_side(
    exporter: Path,
    node: Node,
    directory: Path,
    web_config: Path,
    server_cert: Path,
    in_toml: bool = False,
) -> Iterator[Pair]:
    """node_exporter and the agent, each on a free loopback port, with `web_config`
    (the agent's through --web.config.file, or its TOML's web_config_file)."""
    exporter_port, agent_port = free_port(), free_port()
    textfiles = directory / "textfile"
    textfiles.mkdir(exist_ok=True)
    exporter_log, agent_log = directory / "node_exporter.log", directory / "agent.log"
    toml = directory / "config.toml"
    toml.write_text(
        f'[agent]\nlisten = "127.0.0.1:{agent_port}"\nresults_file = ""\n'
        + (f'web_config_file = "{web_config}"\n' if in_toml else "")
    )
    flag = [] if in_toml else ["--web.config.file", str(web_config)]
    with open(exporter_log, "wb") as exporter_out, open(agent_log, "wb") as agent_out:
        exporter_process = subprocess.Popen(
            [
                str(exporter),
                f"--web.listen-address=127.0.0.1:{exporter_port}",
                f"--web.config.file={web_config}",
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfiles}",
            ],
            stdout=exporter_out,
            stderr=exporter_out,
        )
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodecheck.agent",
                *node.cli_args,
                "--log-level",
                "debug",
                "agent",
                "--config",
                str(toml),
                *flag,
            ],
            env={**os.environ, **node.env},
            stderr=agent_out,
        )
    try:
        wait_for(
            lambda: listening(exporter_port, exporter_process, exporter_log),
            START_S,
            "node_exporter to listen",
        )
        wait_for(lambda: listening(agent_port, agent, agent_log), START_S, "the agent to listen")
        configured = tuple(name for name in HEADERS if f"{name}:" in web_config.read_text())
        yield Pair(exporter_port, agent_port, agent, agent_log, server_cert, configured)
    finally:
        for process in (exporter_process, agent):
            process.terminate()
        for process in (exporter_process, agent):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def assert_same(pair: Pair, client: Client, expected: object) -> None:
    exporter, agent = pair.both(client)
    assert exporter[0] == expected, f"node_exporter: {exporter} for {client}"
    assert agent[0] == exporter[0], f"agent {agent} but node_exporter {exporter} for {client}"
    if expected != REFUSED:  # the headers the file sets (Go adds nosniff to every error)
        configured = {name: exporter[1][name] for name in pair.headers}
        assert {name: agent[1][name] for name in pair.headers} == configured, (agent, exporter)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TLS11 = (ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1)
TLS12 = (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)
TLS13 = (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)


def test_basic_auth_over_tls(
    node_exporter: Path, build: Callable[..., Node], certificates: Certificates, tmp_path: Path
) -> None:
    cert, key = certificates.server
    # Relative paths: relative to the file's folder for both.
    shutil.copy(cert, tmp_path / "server.crt")
    shutil.copy(key, tmp_path / "server.key")
    config = write(
        tmp_path / "web-config.yml",
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "  min_version: TLS12\n"
        "http_server_config:\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
        "    X-Content-Type-Options: nosniff\n"
        "    Strict-Transport-Security: max-age=31536000\n"
        "basic_auth_users:\n"
        f"  prometheus: {HASH}\n"
        f"  grafana: '{HASH}'\n",
    )
    with side_by_side(node_exporter, build("cpu-only"), tmp_path, config, cert) as pair:
        assert_same(pair, Client(user="prometheus", password=PASSWORD), 200)
        assert_same(pair, Client(user="grafana", password=PASSWORD), 200)
        assert_same(pair, Client(user="prometheus", password="wrong"), 401)
        assert_same(pair, Client(), 401)
        assert_same(pair, Client(user="nobody", password=PASSWORD), 401)
        assert_same(pair, Client(versions=TLS11, user="prometheus", password=PASSWORD), REFUSED)
        assert_same(pair, Client(versions=TLS12, user="prometheus", password=PASSWORD), 200)
        exporter, agent = pair.both(Client(user="prometheus", password=PASSWORD))
        assert agent[1]["X-Frame-Options"] == "deny" == exporter[1]["X-Frame-Options"]

        # Changed: node_exporter reads it on every request, the agent on SIGHUP.
        config.write_text(config.read_text().replace("deny", "sameorigin"))
        pair.agent.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            exporter, agent = pair.both(Client(user="prometheus", password=PASSWORD))
            assert exporter[1]["X-Frame-Options"] == "sameorigin"
            return agent[1]["X-Frame-Options"] == "sameorigin"

        wait_for(reloaded, START_S, "the agent to send the reloaded header")
        # A bad file: node_exporter answers 500; the agent keeps the one in force.
        config.write_text(config.read_text().replace("sameorigin", "allow-from"))
        pair.agent.send_signal(signal.SIGHUP)
        wait_for(
            lambda: "event=reload_failed" in pair.agent_log.read_text(errors="replace"),
            START_S,
            "the agent to log the failed reload",
        )
        log = pair.agent_log.read_text(errors="replace")
        failed = [line for line in log.splitlines() if "event=reload_failed" in line]
        assert len(failed) == 1 and "X-Frame-Options" in failed[0], failed
        assert "Traceback" not in log
        # (node_exporter now refuses every request: it reads the file for each.)
        agent = ask(pair.agent_port, cert, Client(user="prometheus", password=PASSWORD))
        assert agent[0] == 200 and agent[1]["X-Frame-Options"] == "sameorigin"


def test_mutual_tls_require_and_verify(
    node_exporter: Path, build: Callable[..., Node], certificates: Certificates, tmp_path: Path
) -> None:
    cert, key = certificates.server
    client_cert, _ = certificates.client
    config = write(
        tmp_path / "web-config.yml",
        "tls_server_config:\n"
        f"  cert_file: {cert}\n"
        f"  key_file: {key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {client_cert}\n"
        "  min_version: TLS13\n"
        "http_server_config:\n"
        "  headers:\n"
        "    X-Content-Type-Options: nosniff\n",
    )
    node = build("cpu-only")
    with side_by_side(node_exporter, node, tmp_path, config, cert, in_toml=True) as pair:
        assert_same(pair, Client(certificate=certificates.client), 200)
        assert_same(pair, Client(), REFUSED)
        assert_same(pair, Client(certificate=certificates.stranger), REFUSED)
        assert_same(pair, Client(versions=TLS12, certificate=certificates.client), REFUSED)
        exporter, agent = pair.both(Client(certificate=certificates.client))
        nosniff = "X-Content-Type-Options"
        assert agent[1][nosniff] == "nosniff" == exporter[1][nosniff]


def test_verify_client_certificate_if_given(
    node_exporter: Path, build: Callable[..., Node], certificates: Certificates, tmp_path: Path
) -> None:
    cert, key = certificates.server
    client_cert, _ = certificates.client
    config = write(
        tmp_path / "web-config.yml",
        "tls_server_config:\n"
        f"  cert_file: {cert}\n"
        f"  key_file: {key}\n"
        "  client_auth_type: VerifyClientCertIfGiven\n"
        f"  client_ca_file: {client_cert}\n"
        "  max_version: TLS12\n"
        "  cipher_suites:\n"
        "    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n"
        "    - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n"
        "  curve_preferences: [CurveP256]\n"
        "basic_auth_users:\n"
        f"  prometheus: {HASH}\n",
    )
    with side_by_side(node_exporter, build("cpu-only"), tmp_path, config, cert) as pair:
        good = {"user": "prometheus", "password": PASSWORD}
        assert_same(pair, Client(**good), 200)  # type: ignore[arg-type]
        assert_same(pair, Client(), 401)
        assert_same(pair, Client(certificate=certificates.client), 401)
        assert_same(pair, Client(certificate=certificates.client, **good), 200)  # type: ignore[arg-type]
        assert_same(pair, Client(certificate=certificates.stranger, **good), REFUSED)  # type: ignore[arg-type]
        assert_same(pair, Client(versions=TLS13, **good), REFUSED)  # type: ignore[arg-type]
        assert_same(pair, Client(user="prometheus", password="wrong"), 401)
        assert_same(pair, Client(user="nobody", password=PASSWORD), 401)


def test_both_refuse_the_same_files(
    node_exporter: Path, certificates: Certificates, tmp_path: Path
) -> None:
    """What node_exporter will not start with, the agent refuses in one line naming the
    file and key (it refuses more: agent/web/config.py says what and why)."""
    from nodecheck.agent.web.config import WebConfigError, load_web_config

    cert, key = certificates.server
    tls = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    refused = {
        "client_allowed_sans": tls + "  client_allowed_sans: [scraper]\n",
        "cipher_suites": tls + "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA256]\n",
        "http2 cipher": tls + "  cipher_suites: [TLS_RSA_WITH_AES_128_GCM_SHA256]\n",
        "header": "http_server_config:\n  headers:\n    Server: nodecheck\n",
        "header value": "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        "user": "basic_auth_users:\n  prometheus: plain\n",
        "twice": "basic_auth_users: {}\nbasic_auth_users: {}\n",
        "client CA alone": tls + f"  client_ca_file: {cert}\n",
        "no key": f"tls_server_config:\n  cert_file: {cert}\n",
        "version": tls + "  min_version: TLS14\n",
        "curve": tls + "  curve_preferences: [CurveP224]\n",
    }
    for name, text in refused.items():
        config = write(tmp_path / "web-config.yml", text)
        done = subprocess.run(
            [
                str(node_exporter),
                f"--web.listen-address=127.0.0.1:{free_port()}",
                f"--web.config.file={config}",
                "--collector.disable-defaults",
            ],
            capture_output=True,
            timeout=START_S,
            check=False,
        )
        assert done.returncode != 0, f"node_exporter accepted {name}: {text}"
        with pytest.raises(WebConfigError) as refusal:
            load_web_config(config)
        message = str(refusal.value)
        assert message.startswith(f"{config}:") and "\n" not in message, message
    # And what both accept: every cipher suite name node_exporter takes maps to OpenSSL's.
    from nodecheck.agent.web.config import CIPHER_SUITES

    suites = "".join(f"    - {name}\n" for name in CIPHER_SUITES)
    config = write(
        tmp_path / "web-config.yml",
        tls + f"  cipher_suites:\n{suites}http_server_config:\n  http2: false\n",
    )
    port, log = free_port(), tmp_path / "node_exporter.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [
                str(node_exporter),
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.config.file={config}",
                "--collector.disable-defaults",
            ],
            stdout=output,
            stderr=output,
        )
    try:
        wait_for(lambda: listening(port, process, log), START_S, "node_exporter to listen")
    finally:
        process.terminate()
        process.wait(30)
    assert load_web_config(config).tls is not None
