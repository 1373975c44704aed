"""Fault matrix, the HTTP server: hostile or broken clients get a status code or a
closed connection within a deadline, one key=value log line at most, never a
traceback; the other clients are served meanwhile and the agent lives."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import re
import selectors
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import bcrypt
import pytest

from nodecheck.agent.web.auth import parse_basic_auth
from nodecheck.agent.web.server import serve
from nodecheck.agent.web.tls import tls_context
from tests.agent.test_daemon import free_port, wait_for
from tests.conftest import Node
from tests.fixtures.certificates import make_certificate

PASSWORD = b"s3cret"
COST = 10  # about 50-100 ms a check: wrong passwords are measurably slow


@dataclass
class Agent:
    process: subprocess.Popen[bytes]
    port: int
    cert: Path
    log: Path
    tls: bool

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def connection(
        self, source: str = "127.0.0.1", timeout: float = 30
    ) -> http.client.HTTPConnection:
        if self.tls:
            return http.client.HTTPSConnection(
                "127.0.0.1",
                self.port,
                timeout=timeout,
                context=self.context(),
                source_address=(source, 0),
            )
        return http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=timeout, source_address=(source, 0)
        )

    def get(
        self, path: str, headers: dict[str, str] | None = None, source: str = "127.0.0.1"
    ) -> http.client.HTTPResponse:
        connection = self.connection(source)
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        response.read()
        connection.close()
        return response

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def basic(user: str | bytes, password: bytes) -> str:
    raw = (user.encode() if isinstance(user, str) else user) + b":" + password
    return "Basic " + base64.b64encode(raw).decode()


GOOD = basic("prometheus", PASSWORD)
NOT_UTF8_USER = bytes([0xFF, 0xFE])


def start_agent(node: Node, directory: Path, tls: bool) -> Agent:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = make_certificate(directory, "localhost")
    hashed = bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=COST)).decode()
    users = directory / "users"
    users.write_text(f"prometheus:{hashed}\n")
    port = free_port()
    config = directory / "config.toml"
    tls_lines = f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n' if tls else ""
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{port}"\n{tls_lines}basic_auth_file = "{users}"\n'
    )
    log = directory / "agent.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodecheck.agent",
                *node.cli_args,
                "--log-level",
                "debug",
                "agent",
                "--config",
                str(config),
            ],
            env={**os.environ, **node.env},
            stderr=log_file,
        )
    agent = Agent(process, port, cert, log, tls)

    def up() -> bool:
        assert process.poll() is None, agent.stderr()
        try:
            return agent.get("/healthz").status == 200
        except OSError:
            return False

    wait_for(up, 30, "the agent to answer /healthz")
    return agent


def stop(agent: Agent) -> None:
    agent.process.terminate()
    agent.process.wait(10)


@pytest.fixture(scope="module")
def tls_agent(
    build: Callable[..., Node], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    agent = start_agent(build("cpu-only"), tmp_path_factory.mktemp("tls-agent"), tls=True)
    yield agent
    stop(agent)


@pytest.fixture(scope="module")
def plain_agent(
    build: Callable[..., Node], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    agent = start_agent(build("cpu-only"), tmp_path_factory.mktemp("plain-agent"), tls=False)
    yield agent
    stop(agent)


def assert_alive_without_traceback(agent: Agent) -> None:
    assert agent.process.poll() is None
    assert agent.get("/metrics", {"Authorization": GOOD}).status == 200
    assert "Traceback" not in agent.stderr(), agent.stderr()[-3000:]


def raw_request(agent: Agent, request: bytes, source: str) -> bytes:
    """Send bytes as they are (http.client would refuse them) and read the answer."""
    sock = socket.create_connection(
        ("127.0.0.1", agent.port), timeout=30, source_address=(source, 0)
    )
    if agent.tls:
        sock = agent.context().wrap_socket(sock, server_hostname="127.0.0.1")
    with sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def status_of(answer: bytes) -> int:
    if not answer.startswith(b"HTTP/"):
        # a request line that is no HTTP/1.x one is answered the HTTP/0.9 way: a body
        # without a status line (http.server), which says the code
        found = re.search(rb"Error code: (\d+)", answer)
        assert found, answer[:200]
        return int(found.group(1))
    return int(answer.split(b" ", 2)[1])


# Each: an Authorization header (or a request) no client with the password sends.
HOSTILE_HEADERS: list[tuple[str, bytes, int]] = [
    ("a password over 72 bytes", f"Authorization: {basic('prometheus', b'x' * 100)}".encode(), 401),
    (
        "a good user, 72 good bytes then more",
        f"Authorization: {basic('prometheus', PASSWORD + b'y' * 80)}".encode(),
        401,
    ),
    ("non-ASCII bytes", b"Authorization: Basic \xff\xfe\xc3\xa9", 401),
    (
        "base64 of a user not UTF-8",
        b"Authorization: " + basic(NOT_UTF8_USER, PASSWORD).encode(),
        401,
    ),
    ("base64 with junk inside", b"Authorization: Basic cHJvbW!!V0aGV1czpzM2NyZXQ=", 401),
    (
        "no colon in the credentials",
        b"Authorization: Basic " + base64.b64encode(b"prometheus"),
        401,
    ),
    ("another scheme", b"Authorization: Bearer abc", 401),
    ("an empty header", b"Authorization:", 401),
    ("a header line without a colon", b"Authorization", 401),
    ("a header line of 70 kB", b"Authorization: Basic " + b"A" * 70_000, 431),
    ("101 header lines", b"\r\n".join(b"X-%d: y" % i for i in range(101)), 431),
]


@pytest.mark.parametrize("agent_kind", ["tls", "plain"])
def test_hostile_authorization_headers_get_4xx_never_a_traceback(
    request: pytest.FixtureRequest, agent_kind: str
) -> None:
    """Passwords over bcrypt's 72 bytes, bytes that are no text, broken base64, a header
    with no colon, a huge one: 401 (431 for the oversized), the agent alive, no
    traceback in its log."""
    agent: Agent = request.getfixturevalue(f"{agent_kind}_agent")
    for number, (fault, header, expected) in enumerate(HOSTILE_HEADERS):
        # each from its own loopback address: the per-client failure budget stays out of it
        source = f"127.0.1.{number + 1}"
        answer = raw_request(
            agent,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header + b"\r\n\r\n",
            source,
        )
        assert answer, f"{fault}: the connection closed with no answer"
        assert status_of(answer) == expected, f"{fault}: {answer[:200]!r}"
    assert_alive_without_traceback(agent)


def median_seconds(agent: Agent, header: str, source: str, expected: int = 401) -> float:
    times = 5
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        assert agent.get("/metrics", {"Authorization": header}, source).status == expected
        spent.append(time.perf_counter() - started)
    return sorted(spent)[times // 2]


def test_unknown_users_cost_the_same_bcrypt_as_wrong_passwords(plain_agent: Agent) -> None:
    """A wrong user is checked against a dummy hash of the same cost: its answer takes
    as long as a wrong password's, so timing does not tell which users exist."""
    wrong_password = median_seconds(plain_agent, basic("prometheus", b"wrong"), "127.0.2.1")
    unknown_user = median_seconds(plain_agent, basic("nobody", b"wrong"), "127.0.2.2")
    baseline = median_seconds(plain_agent, GOOD, "127.0.2.3", 200)  # cached after the first
    assert wrong_password > 3 * baseline, (wrong_password, baseline)  # bcrypt shows
    assert unknown_user > 0.5 * wrong_password, (unknown_user, wrong_password)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_password_guessing_is_bounded_and_good_scrapes_pass_at_once(plain_agent: Agent) -> None:
    """Eight clients guessing passwords as fast as they can: answered 401, then 429 with
    Retry-After once bcrypt is busy or their budget is spent; the agent spends about a
    core at most; a scrape with the good (remembered) password passes at once meanwhile."""
    agent = plain_agent
    assert agent.get("/metrics", {"Authorization": GOOD}, "127.0.3.1").status == 200  # remembered
    stop_guessing = threading.Event()
    answers: list[tuple[int, str | None]] = []

    def guess(source: str) -> None:
        attempt = 0
        while not stop_guessing.is_set():
            attempt += 1
            response = agent.get(
                "/metrics", {"Authorization": basic("prometheus", b"guess%d" % attempt)}, source
            )
            answers.append((response.status, response.getheader("Retry-After")))

    guessers = [
        threading.Thread(target=guess, args=(f"127.0.4.{n}",), daemon=True) for n in range(1, 9)
    ]
    before, started = cpu_seconds(agent.process.pid), time.monotonic()
    for guesser in guessers:
        guesser.start()
    try:
        time.sleep(1)  # the guessing under way
        scrape_started = time.monotonic()
        assert agent.get("/metrics", {"Authorization": GOOD}, "127.0.3.1").status == 200
        assert time.monotonic() - scrape_started < 5
        wait_for(lambda: len(answers) >= 200, 60, "200 answers to guesses")
    finally:
        stop_guessing.set()
        for guesser in guessers:
            guesser.join(30)
    cores = (cpu_seconds(agent.process.pid) - before) / (time.monotonic() - started)
    statuses = {status for status, _ in answers}
    assert statuses <= {401, 429} and 429 in statuses, statuses
    assert all(after for status, after in answers if status == 429)
    assert cores < 1.5, cores
    assert_alive_without_traceback(agent)


def client_hello_bytes() -> bytes:
    """The first bytes a real TLS client sends (captured from ssl over a socketpair)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        client = ssl.create_default_context().wrap_bio(
            ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="x"
        )
        with contextlib.suppress(ssl.SSLWantReadError):
            client.do_handshake()
        return outgoing.read()


def test_connection_failures_on_the_tls_port_are_one_log_line_each(tls_agent: Agent) -> None:
    """Plain HTTP to the TLS port, a client hanging up mid-handshake, one resetting after
    the request line, one closing after the handshake: each one key=value
    event=connection_error line (debug), never a traceback; the agent serves on."""
    agent = tls_agent
    hello = client_hello_bytes()
    reset = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST

    def plain_http() -> None:
        with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            while sock.recv(65536):
                pass

    def hang_up_mid_handshake() -> None:
        with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
            sock.sendall(hello[: len(hello) // 2])

    def reset_mid_handshake() -> None:
        sock = socket.create_connection(("127.0.0.1", agent.port), timeout=30)
        sock.sendall(hello)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        sock.close()

    def reset_after_request_line() -> None:
        raw = socket.create_connection(("127.0.0.1", agent.port), timeout=30)
        sock = agent.context().wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(b"GET /results HTTP/1.1\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        sock.close()

    def close_after_handshake() -> None:
        raw = socket.create_connection(("127.0.0.1", agent.port), timeout=30)
        agent.context().wrap_socket(raw, server_hostname="127.0.0.1").close()

    def garbage() -> None:
        with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
            sock.sendall(os.urandom(4096))
            try:
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass

    faults = [plain_http, hang_up_mid_handshake, reset_mid_handshake]
    faults += [reset_after_request_line, close_after_handshake, garbage]
    lines_before = agent.stderr().count("event=connection_error")
    for fault in faults:
        fault()
    # Plain HTTP, half a ClientHello and random bytes always reach the server's TLS layer
    # and fail there. A reset may come before accept() (the kernel then drops the
    # connection, and socketserver ignores the failed accept) or after the request was
    # answered: those leave at most one line, and which depends on timing.
    wait_for(
        lambda: agent.stderr().count("event=connection_error") - lines_before >= 3,
        30,
        "connection_error lines",
    )
    lines = [line for line in agent.stderr().splitlines() if "event=connection_error" in line]
    assert all(line.startswith("level=debug ") and " client=127.0.0.1:" in line for line in lines)
    assert_alive_without_traceback(agent)


def drip(port: int, context: ssl.SSLContext | None, closed_after: list[float]) -> None:
    """A request line, then a header line every 2 s, for as long as the server listens."""
    started = time.monotonic()
    raw = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        for number in range(40):
            time.sleep(2)
            sock.sendall(b"X-Drip-%d: y\r\n" % number)
    except OSError:
        pass
    finally:
        closed_after.append(time.monotonic() - started)
        sock.close()


def idle_after_one_request(port: int, closed_after: list[float]) -> None:
    """One whole request on a kept-alive connection, then silence."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            while sock.recv(65536):
                pass
    except OSError:
        pass
    finally:
        closed_after.append(time.monotonic() - started)


def drip_handshake(port: int, closed_after: list[float]) -> None:
    """A TLS ClientHello one byte every 2 s."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            for byte in client_hello_bytes()[:40]:
                sock.sendall(bytes([byte]))
                time.sleep(2)
    except OSError:
        pass
    finally:
        closed_after.append(time.monotonic() - started)


def test_dripping_clients_are_cut_off_at_the_request_deadline(
    tls_agent: Agent, plain_agent: Agent
) -> None:
    """A header line every 2 s (TLS and plain), a ClientHello byte every 2 s, a kept-alive
    connection left idle: each is closed by the server within 30 s (the deadline is 5 s
    from accept() to the end of the headers, handshake included, and from one response
    to the next request); scrapes pass meanwhile."""
    closed_after: list[float] = []
    drippers = [
        threading.Thread(target=drip, args=(tls_agent.port, tls_agent.context(), closed_after)),
        threading.Thread(target=drip, args=(plain_agent.port, None, closed_after)),
        threading.Thread(target=drip_handshake, args=(tls_agent.port, closed_after)),
        threading.Thread(target=idle_after_one_request, args=(plain_agent.port, closed_after)),
    ]
    for dripper in drippers:
        dripper.daemon = True
        dripper.start()
    time.sleep(1)
    for agent in (tls_agent, plain_agent):
        started = time.monotonic()
        assert agent.get("/metrics", {"Authorization": GOOD}).status == 200
        assert time.monotonic() - started < 5
    for dripper in drippers:
        dripper.join(60)
    assert len(closed_after) == 4 and max(closed_after) < 30, closed_after
    for agent in (tls_agent, plain_agent):
        assert_alive_without_traceback(agent)


def test_a_hundred_simultaneous_connections_are_all_served(plain_agent: Agent) -> None:
    """100 clients connecting at once: every connection accepted (the listen backlog is
    not socketserver's 5) and every one answered. Each from its own address: one address
    may hold CONNECTIONS_PER_CLIENT connections, so 100 from one would be cut to 8 as
    soon as the server is slower than the burst (a loaded machine)."""
    sockets = []
    try:
        for n in range(100):
            sock = socket.socket()
            sock.bind((f"127.0.20.{n + 1}", 0))
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", plain_agent.port))
            sockets.append(sock)
        answers = []
        for sock in sockets:
            sock.settimeout(60)
            sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        for sock in sockets:
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            answers.append(answer)
        assert [status_of(answer) for answer in answers] == [200] * 100
    finally:
        for sock in sockets:
            sock.close()
    assert_alive_without_traceback(plain_agent)


# -- TLS files: tls_context and reload_tls ----------------------------------------------


def test_unusable_tls_files_are_a_value_error_naming_the_file(tmp_path: Path) -> None:
    """Missing, a directory, a FIFO (never opened blocking), empty, not PEM, an encrypted
    key (never a pass-phrase prompt), a key of another certificate: ValueError naming the
    file and why."""
    cert, key = make_certificate(tmp_path, "a")
    other_cert, other_key = make_certificate(tmp_path, "b")
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        [
            "openssl",
            "pkey",
            "-in",
            str(key),
            "-aes256",
            "-passout",
            "pass:x",
            "-out",
            str(encrypted),
        ],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    binary = tmp_path / "binary"
    binary.write_bytes(os.urandom(512))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    cases = [
        (tmp_path / "missing.crt", key, "missing.crt: cannot read the certificate: No such file"),
        (tmp_path, key, f"{tmp_path}: the certificate is a directory"),
        (fifo, key, "fifo: the certificate is a FIFO"),
        (cert, fifo, "fifo: the private key is a FIFO"),
        (empty, key, "empty: not a PEM certificate"),
        (binary, key, "binary: not a PEM certificate"),
        (garbage, key, "garbage.crt: not a usable PEM certificate"),
        (cert, empty, "empty: not a PEM private key"),
        (cert, cert, "a.crt: not a PEM private key"),
        (cert, encrypted, "encrypted.key: the private key is encrypted"),
        (cert, other_key, f"b.key: the private key does not match the certificate {cert}"),
    ]
    for cert_file, key_file, says in cases:
        with pytest.raises(ValueError) as raised:
            tls_context(cert_file, key_file)
        assert says in str(raised.value), (cert_file, key_file, str(raised.value))
    context = tls_context(other_cert, other_key)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


def served_certificate(port: int) -> str:
    return ssl.get_server_certificate(("127.0.0.1", port), timeout=10)


def test_reload_tls_swaps_the_certificate_and_keeps_the_old_on_bad_files(tmp_path: Path) -> None:
    """reload_tls after cert-manager replaced the files: new connections get the new
    certificate; files that are unusable: ValueError naming the file, the old ones kept
    and served. Plain HTTP: nothing to reload."""
    cert, key = make_certificate(tmp_path, "old")
    new_cert, new_key = make_certificate(tmp_path, "new")
    port = free_port()
    server = serve(f"127.0.0.1:{port}", lambda: b"", dict, lambda: True, (cert, key))
    try:
        old_pem = served_certificate(port)
        assert old_pem.strip() == cert.read_text().strip()
        os.replace(new_cert, cert)
        os.replace(new_key, key)
        server.reload_tls()
        assert served_certificate(port).strip() == cert.read_text().strip() != old_pem.strip()
        good_pem = cert.read_text()
        key.write_text("not a key\n")
        with pytest.raises(ValueError, match=f"{key}: not a PEM private key"):
            server.reload_tls()
        assert served_certificate(port).strip() == good_pem.strip()
    finally:
        server.shutdown()
        server.server_close()
    port = free_port()
    plain = serve(f"127.0.0.1:{port}", lambda: b"", dict, lambda: True)
    try:
        plain.reload_tls()  # no-op
    finally:
        plain.shutdown()
        plain.server_close()


def test_a_slow_reader_of_a_large_response_is_cut_off(tmp_path: Path) -> None:
    """A TLS client reading a 40 MB /results a few kB at a time holds its thread for the
    response deadline at most (30 s, here 3 s), not as long as it keeps reading; others
    are served meanwhile. It reads slowly past the deadline, then as fast as it can:
    what the kernel had buffered arrives, then the end, far short of 40 MB (closed
    sockets still deliver what they had sent: the server's thread is long free)."""
    cert, key = make_certificate(tmp_path, "slow")
    port = free_port()
    blob = "x" * 40_000_000
    deadline_s = 3.0
    server = serve(
        f"127.0.0.1:{port}",
        lambda: b"",
        lambda: {"blob": blob},
        lambda: True,
        (cert, key),
        response_deadline_s=deadline_s,
    )
    context = ssl.create_default_context(cafile=str(cert))
    try:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(60)
        raw.connect(("127.0.0.1", port))
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(b"GET /results HTTP/1.1\r\nHost: x\r\n\r\n")
        started, received, ended = time.monotonic(), 0, False
        with sock:
            while time.monotonic() - started < 120:
                slow = time.monotonic() - started < 2 * deadline_s
                try:
                    chunk = sock.recv(4096 if slow else 65536)
                except (ConnectionResetError, ssl.SSLError):
                    ended = True
                    break
                if not chunk:
                    ended = True
                    break
                received += len(chunk)
                if slow:
                    time.sleep(0.05)  # about 80 kB/s: 40 MB would take over 8 minutes
        assert ended and received < len(blob), (received, time.monotonic() - started)
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context) as ok:
            assert ok.status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_malformed_requests_get_4xx_never_a_traceback(plain_agent: Agent) -> None:
    """A request line over 64 kB (414), binary garbage, an unknown method, HTTP/2's
    preface on an HTTP/1 port (505), a method not served (501): a status code, the agent alive."""
    requests = [
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"\x00\x01\x02\xff\xfe garbage\r\n\r\n", 400),
        (b"BREW /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", 501),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 501),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ]
    for number, (request, expected) in enumerate(requests):
        answer = raw_request(plain_agent, request, f"127.0.5.{number + 1}")
        assert answer and status_of(answer) == expected, (request[:30], answer[:100])
    assert_alive_without_traceback(plain_agent)


def test_a_truncated_bcrypt_hash_is_refused_naming_the_line() -> None:
    """A users file with a cut-off hash (bcrypt would raise on every request): refused
    when read, naming the file, line and user."""
    with pytest.raises(ValueError, match=r"users:2: prometheus: not a whole bcrypt hash"):
        parse_basic_auth("# scrapers\nprometheus:$2b$12$tooshort\n", "users")
    with pytest.raises(ValueError, match=r"users:1: p: not a whole bcrypt hash"):
        parse_basic_auth("p:$2b$99$" + "a" * 53 + "\n", "users")  # cost past 31


# -- starving the handler threads ------------------------------------------------------

CHEAP = basic("prometheus", PASSWORD)


@contextlib.contextmanager
def guarded(results: Callable[[], dict[str, object]] = dict) -> Iterator[int]:
    """An in-process server behind basic auth (cost 4: bcrypt is not what is tested)."""
    from nodecheck.agent.web.auth import BasicAuth

    hashed = bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=4))
    port = free_port()
    server = serve(
        f"127.0.0.1:{port}",
        lambda: b"# metrics\n",
        results,
        lambda: True,
        auth=BasicAuth({"prometheus": hashed}),
    )
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def guarded_server() -> Iterator[int]:
    with guarded() as port:
        yield port


def read_response(sock: socket.socket) -> bytes | None:
    """One response's headers and body (Content-Length), or None when the server closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?i)content-length: *(\d+)", head)
    length = int(found.group(1)) if found else 0
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


def scrape_seconds(port: int, source: str = "127.0.0.1", limit: float = 60) -> float:
    """How long a good scrape from `source` takes to be answered 200 (AssertionError past
    `limit`)."""
    started = time.monotonic()
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=limit, source_address=(source, 0)
    )
    try:
        connection.request("GET", "/metrics", headers={"Authorization": GOOD})
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    except TimeoutError:
        raise AssertionError(f"a good scrape from {source} not answered in {limit:g} s") from None
    finally:
        connection.close()
    return time.monotonic() - started


class Hammer:
    """Kept-alive connections from one source address, each sending a request every
    `every_s` seconds (with `header`, if any) until the server closes it or the test
    ends; or, with `silent`, half a request line and nothing more."""

    def __init__(self, port: int, source: str, count: int, every_s: float = 5.0) -> None:
        self.port, self.source, self.count, self.every_s = port, source, count, every_s
        self.stop = threading.Event()
        self.sent_first = threading.Semaphore(0)
        self.heads: list[bytes] = []
        self.closed_by_server = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(count)]

    def start(self, header: str | None = None, silent: bool = False) -> Hammer:
        self.header, self.silent = header, silent
        for thread in self.threads:
            thread.start()
        for _ in self.threads:
            assert self.sent_first.acquire(timeout=60)
        return self

    def _client(self) -> None:
        auth = f"Authorization: {self.header}\r\n" if self.header else ""
        request = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
        try:
            with socket.create_connection(
                ("127.0.0.1", self.port), timeout=120, source_address=(self.source, 0)
            ) as sock:
                if self.silent:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
                    self.sent_first.release()
                    gone = not sock.recv(1)
                else:
                    first = True
                    while True:
                        sock.sendall(request)
                        if first:
                            self.sent_first.release()
                            first = False
                        head = read_response(sock)
                        if head is None:
                            gone = True
                            break
                        with self._lock:
                            self.heads.append(head)
                        if self.stop.wait(self.every_s):
                            gone = False
                            break
                        # the server may close between two requests (Connection: close)
                        if b"connection: close" in head.lower():
                            gone = not sock.recv(1)
                            break
        except OSError:
            gone = True
            with contextlib.suppress(ValueError):
                self.sent_first.release()
        with self._lock:
            self.closed_by_server += int(gone)

    def finish(self, seconds: float) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(seconds)


def test_an_unauthenticated_client_cannot_hold_the_threads(guarded_server: int) -> None:
    """72 kept-alive connections from one address, each asking without a password every
    5 s: every 401 says Connection: close and the server
    closes the connection; beyond 8 connections from one address the server closes at
    once; a good scrape from another address is answered within 15 s, repeatedly.
    (Before: the 401s kept the connections, 64 of them held every handler thread and the
    scrape waited in the backlog for ever.)"""
    hammer = Hammer(guarded_server, "127.0.9.1", 72).start()
    try:
        for _ in range(3):
            assert scrape_seconds(guarded_server, limit=15) < 15
        wait_for(lambda: hammer.closed_by_server == 72, 60, "every hostile connection closed")
    finally:
        hammer.finish(30)
    assert hammer.heads, "no 401 at all"
    for head in hammer.heads:
        assert head.startswith(b"HTTP/1.1 401"), head
        assert b"connection: close" in head.lower(), head


def test_silent_connections_from_many_addresses_do_not_starve_a_scraper(
    guarded_server: int,
) -> None:
    """640 connections that send half a request line and wait, from 16 addresses (40
    each): the server keeps 8 per address (128, none on a handler thread) and closes the
    others at once; a scraper from a 17th address is answered within 30 s. (Before: it
    queued behind the 640 in the backlog, 64 every 10 s: about 100 s.)"""
    hammers = [Hammer(guarded_server, f"127.0.10.{n}", 40) for n in range(1, 17)]
    try:
        for hammer in hammers:
            hammer.start(silent=True)
        assert scrape_seconds(guarded_server, source="127.0.0.1", limit=30) < 30
        # closed at once, or at their deadline
        wait_for(
            lambda: sum(hammer.closed_by_server for hammer in hammers) >= 640 - 128,
            60,
            "the connections beyond 8 per address closed",
        )
    finally:
        for hammer in hammers:
            hammer.finish(0)
    for hammer in hammers:
        for thread in hammer.threads:
            thread.join(60)


class SilentCrowd:
    """`per_address` connections from each of `addresses` that send half a request line
    and nothing more; one the server closes is opened again (as a slowloris tool does),
    a round a second, until `stop`. One thread, the sockets polled by a selector."""

    def __init__(self, port: int, addresses: list[str], per_address: int = 8) -> None:
        self.port, self.addresses, self.per_address = port, addresses, per_address
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._keep, daemon=True)

    def _open(self, source: str) -> None:
        try:
            sock = socket.create_connection(
                ("127.0.0.1", self.port), timeout=10, source_address=(source, 0)
            )
        except OSError:
            return  # the next round tries again
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, source)

    def start(self) -> SilentCrowd:
        for source in self.addresses:
            for _ in range(self.per_address):
                self._open(source)
        self.thread.start()
        return self

    def _keep(self) -> None:
        while not self.stopped.wait(1.0):
            closed = []
            for key, _ in self.selector.select(0):
                sock = cast(socket.socket, key.fileobj)
                try:
                    gone = not sock.recv(1)
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.selector.unregister(sock)
                    sock.close()
                    closed.append(key.data)
            for source in closed:
                self._open(source)
                self.reopened += 1

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)
        for key in list(self.selector.get_map().values()):
            cast(socket.socket, key.fileobj).close()
        self.selector.close()


def test_silent_connections_from_a_hundred_addresses_starve_no_scraper(
    guarded_server: int,
) -> None:
    """100 addresses each keeping 8 silent connections open (half a request line, opened
    again when closed): a scraper that was answered before and one from a fresh address
    are both answered within 30 s, three times each, and the server's threads stay
    bounded: a connection without a whole request holds no handler thread, and is closed
    within 5 s of its accept or when 512 such are open. (Before: the scrapers queued
    behind the silent connections, 64 at a time for 10 s each: over a minute.)"""
    from nodecheck.agent.web.server import HANDLER_THREADS, RESERVED_THREADS

    assert scrape_seconds(guarded_server, source="127.0.0.150", limit=30) < 30
    threads_before = threading.active_count()
    crowd = SilentCrowd(guarded_server, [f"127.0.0.{n}" for n in range(2, 102)]).start()
    try:
        for round_ in range(3):
            assert scrape_seconds(guarded_server, source="127.0.0.150", limit=30) < 30
            assert scrape_seconds(guarded_server, source=f"127.0.0.{200 + round_}", limit=30) < 30
            handlers = [t for t in threading.enumerate() if t.name == "http-connection"]
            assert len(handlers) <= HANDLER_THREADS + RESERVED_THREADS, len(handlers)
            # the server's handler threads and the crowd's one thread, nothing per connection
            allowed = threads_before + HANDLER_THREADS + RESERVED_THREADS + 1
            assert threading.active_count() <= allowed, threading.active_count()
        wait_for(lambda: crowd.reopened > 0, 60, "the server closing silent connections")
    finally:
        crowd.stop()


def test_a_known_scraper_is_answered_while_every_thread_is_busy() -> None:
    """64 authenticated requests for a /results that does not return yet hold every
    handler thread: a scraper answered before gets one of the threads reserved for known
    good clients and is answered within 15 s; the 64 and a fresh scraper are answered
    once /results returns. (Before: the known scraper waited for the 64.)"""
    from nodecheck.agent.web.server import HANDLER_THREADS

    release = threading.Event()

    def slow_results() -> dict[str, object]:
        release.wait(120)
        return {}

    busy: list[socket.socket] = []
    with guarded(slow_results) as port:
        try:
            assert scrape_seconds(port, source="127.0.0.150", limit=30) < 30
            request = f"GET /results HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD}\r\n\r\n"
            for n in range(HANDLER_THREADS):
                sock = socket.create_connection(
                    ("127.0.0.1", port), timeout=60, source_address=(f"127.0.12.{n // 8 + 1}", 0)
                )
                busy.append(sock)
                sock.sendall(request.encode())
            wait_for(
                lambda: (
                    sum(t.name == "http-connection" for t in threading.enumerate())
                    >= HANDLER_THREADS
                ),
                60,
                "every handler thread busy",
            )
            assert scrape_seconds(port, source="127.0.0.150", limit=15) < 15
            release.set()
            for sock in busy:
                head = read_response(sock)
                assert head is not None and head.startswith(b"HTTP/1.1 200"), head
            assert scrape_seconds(port, source="127.0.0.151", limit=30) < 30
        finally:
            release.set()
            for sock in busy:
                sock.close()


def test_kept_alive_connections_that_keep_asking_yield_their_threads(guarded_server: int) -> None:
    """64 kept-alive connections with the password, from 8 addresses, each asking every
    3 s, hold every handler thread between their requests: a scrape from another address
    is answered within 15 s all the same (idle kept-alive connections are closed while
    others wait for a thread). (Before: it waited for ever.)"""
    hammers = [Hammer(guarded_server, f"127.0.11.{n}", 8, every_s=3.0) for n in range(1, 9)]
    try:
        for hammer in hammers:
            hammer.start(header=GOOD)
        for _ in range(3):
            assert scrape_seconds(guarded_server, source="127.0.0.1", limit=15) < 15
    finally:
        for hammer in hammers:
            hammer.finish(30)


def test_a_kept_alive_connection_is_closed_after_100_requests(guarded_server: int) -> None:
    """The 100th response on one connection says Connection: close and the server closes
    it: no client keeps a thread for ever by asking in time. (Before: never.)"""
    with socket.create_connection(("127.0.0.1", guarded_server), timeout=30) as sock:
        for number in range(1, 151):
            sock.sendall(
                f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD}\r\n\r\n".encode()
            )
            head = read_response(sock)
            assert head is not None and head.startswith(b"HTTP/1.1 200"), (number, head)
            if b"connection: close" in head.lower():
                break
        assert number == 100
        assert sock.recv(1) == b""


def test_bcrypt_costs_above_17_are_refused_naming_file_line_and_user() -> None:
    """htpasswd -B's maximum is 17: a cost of 18 or more (minutes per check at 20) is
    refused when read. (Before: accepted, and start-up paid it.)"""
    salt_and_hash = "a" * 53
    parse_basic_auth(f"ok:$2b$17${salt_and_hash}\n", "users")
    with pytest.raises(ValueError, match=r"users:2: slow: bcrypt cost 18 is above 17"):
        parse_basic_auth(f"ok:$2b$12${salt_and_hash}\nslow:$2b$18${salt_and_hash}\n", "users")
    with pytest.raises(ValueError, match=r"users:1: p: bcrypt cost 31 is above 17"):
        parse_basic_auth(f"p:$2y$31${salt_and_hash}\n", "users")


def test_the_dummy_hash_is_computed_once_per_cost_across_reloads() -> None:
    """An unknown user's dummy hash costs a whole bcrypt run at the users' cost: made once
    per cost, not again at each reload (SIGHUP) or BasicAuth. (Before: every time.)"""
    from nodecheck.agent.web.auth import BasicAuth

    at_5 = {"a": bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=5))}
    at_6 = {"b": bcrypt.hashpw(b"y", bcrypt.gensalt(rounds=6))}
    first = BasicAuth(at_5)
    dummy = first._dummy
    assert BasicAuth(dict(at_5))._dummy == dummy
    first.users = dict(at_5)  # a reload with the same users
    assert first._dummy == dummy
    first.users = at_6
    assert first._dummy != dummy and first._dummy.startswith(b"$2b$06$")
    first.users = dict(at_5)
    assert first._dummy == dummy


def test_tls_files_that_are_no_regular_file_are_never_opened(tmp_path: Path) -> None:
    """A FIFO as the certificate or key (a writer blocked on it would be woken), a device
    node: ValueError naming it, without opening it. (Before: opened, then refused.)"""
    from tests.faults.test_config import BlockedWriter

    cert, key = make_certificate(tmp_path, "a")
    for make_pair in (lambda f: (f, key), lambda f: (cert, f)):
        fifo_path = tmp_path / f"fifo-{len(list(tmp_path.iterdir()))}"
        writer = BlockedWriter(fifo_path)
        try:
            with pytest.raises(ValueError, match=f"{fifo_path}: the .* is a FIFO"):
                tls_context(*make_pair(fifo_path))
            assert not writer.opened.wait(2), "the FIFO was opened"
        finally:
            writer.release()
    with pytest.raises(ValueError, match="/dev/null: the certificate is a character device"):
        tls_context(Path("/dev/null"), key)
