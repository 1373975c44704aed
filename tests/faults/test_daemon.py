"""Fault matrix, the agent: a real `nodecheck agent` process on the CPU-only replica.

A SIGHUP with a bad configuration (or a bad file it names) keeps the old configuration,
logs event=reload_failed naming the file, reports nodecheck_config_last_reload_successful
0 and keeps serving; an address it cannot listen on is exit 2 naming the address; what
the command line says wins over the file; the agent says where it listens."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import bcrypt
import pytest

from tests.agent.test_daemon import free_port, wait_for
from tests.conftest import Node
from tests.faults.test_config import certificate
from tests.faults.test_exposition import NEEDS_PROMTOOL, promtool_problems

T = TypeVar("T")
MIB = 1 << 20
AGENT = [sys.executable, "-m", "nodecheck.agent"]
PASSWORD = "s3cret"
TOKEN = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
RELOAD_OK = "nodecheck_config_last_reload_successful 1.0"
RELOAD_FAILED = "nodecheck_config_last_reload_successful 0.0"


@dataclass
class Agent:
    process: subprocess.Popen[str]
    url: str
    config: Path
    users: Path
    context: ssl.SSLContext | None = None
    log: list[str] = field(default_factory=list)

    def get(self, path: str) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path)
        request.add_header("Authorization", f"Basic {TOKEN}")
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        return body if status == 200 else ""

    def hup(self) -> int:
        """Send SIGHUP; the number of log lines before it (to look only after)."""
        mark = len(self.log)
        self.process.send_signal(signal.SIGHUP)
        return mark

    def logged(self, since: int, *words: str) -> list[str]:
        return [line for line in self.log[since:] if all(word in line for word in words)]


def node_args(node: Node) -> list[str]:
    """The node's roots and NVML library, without its --nvml-timeout: the tests set the
    deadline in the file, or on the command line themselves."""
    args = list(node.cli_args)
    if "--nvml-timeout" in args:
        at = args.index("--nvml-timeout")
        del args[at : at + 2]
    return args


def start_agent(
    node: Node, work: Path, port: int, text: str, *args: str, tls: bool = False
) -> Agent:
    """The agent with `text` as its configuration; returns once /healthz answers."""
    config = work / "config.toml"
    config.write_text(text)
    process = subprocess.Popen(
        [*AGENT, *node_args(node), "agent", "--config", str(config), *args],
        env={**os.environ, **node.env},
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    context = None
    if tls:
        context = ssl.create_default_context(cafile=str(work / "a.crt"))
    agent = Agent(
        process,
        f"{'https' if tls else 'http'}://127.0.0.1:{port}",
        config,
        work / "users",
        context,
    )

    def read_log() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            agent.log.append(line.rstrip("\n"))

    threading.Thread(target=read_log, daemon=True).start()

    def serving() -> bool:
        if process.poll() is not None:
            pytest.fail("the agent exited:\n" + "\n".join(agent.log[-20:]))
        return agent.get("/healthz")[0] == 200

    wait_for(serving, 60, "the agent to serve")
    return agent


def stop_agent(agent: Agent) -> None:
    if agent.process.poll() is None:
        agent.process.send_signal(signal.SIGTERM)
        try:
            agent.process.wait(20)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait()


def good_config(work: Path, port: int, extra: str = "") -> str:
    return (
        f'[agent]\nlisten = "127.0.0.1:{port}"\nbasic_auth_file = "{work / "users"}"\n'
        f"nvml_timeout = 2\n{extra}\n[checks.cpu]\ninterval = 5\n"
    )


@pytest.fixture(scope="module")
def cpu_only(build: Callable[..., Node]) -> Node:
    return build("cpu-only")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("agent")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (work / "users").write_text(f"prometheus:{hashed}\n")
    return work


@pytest.fixture(scope="module")
def shared_agent(cpu_only: Node, workdir: Path) -> Iterator[list[Agent]]:
    """One agent for the reload cases, started again if a case killed it (so each case
    fails on its own)."""
    holder: list[Agent] = []
    yield holder
    for agent in holder:
        stop_agent(agent)


@pytest.fixture
def agent(shared_agent: list[Agent], cpu_only: Node, workdir: Path) -> Agent:
    if not shared_agent or shared_agent[0].process.poll() is not None:
        port = free_port()
        shared_agent[:] = [start_agent(cpu_only, workdir, port, good_config(workdir, port))]
    return shared_agent[0]


def replace_with(path: Path, make: Callable[[Path], object]) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.is_symlink() or path.exists():
        path.unlink()
    make(path)


def deep_dotted(path: Path, good: str) -> None:
    path.write_text(good + "\n[checks.numa]\nenabled" + ".y" * 20000 + " = true\n")


RELOAD_CASES: list[tuple[str, str, Callable[[Path, Path, str], object]]] = [
    # (what, which file is named in the log: "config" or "users", how to spoil it)
    ("config not UTF-8", "config", lambda c, u, g: c.write_bytes(g.encode() + b"# \xff\n")),
    (
        "config nested arrays",
        "config",
        lambda c, u, g: c.write_text(g + "x = " + "[" * 5000 + "]" * 5000 + "\n"),
    ),
    ("config dotted keys 20,000 deep", "config", lambda c, u, g: deep_dotted(c, g)),
    ("config over 1 MiB", "config", lambda c, u, g: c.write_text(g + "#" * (2 * MIB) + "\n")),
    ("config a FIFO", "config", lambda c, u, g: replace_with(c, os.mkfifo)),
    ("config a directory", "config", lambda c, u, g: replace_with(c, os.mkdir)),
    ("interval = nan", "config", lambda c, u, g: c.write_text(g.replace("= 5", "= nan"))),
    ("nvml_timeout = nan", "config", lambda c, u, g: c.write_text(g.replace("= 2", "= nan"))),
    (
        "expected_gpus huge",
        "config",
        lambda c, u, g: c.write_text(g.replace("[agent]", "[agent]\nexpected_gpus = 1" + "0" * 20)),
    ),
    (
        "listen garbage",
        "config",
        lambda c, u, g: c.write_text(re.sub(r'listen = ".*"', 'listen = "garbage"', g)),
    ),
    (
        "listen unresolvable",
        "config",
        lambda c, u, g: c.write_text(re.sub(r'listen = ".*"', 'listen = "nohost.invalid:1"', g)),
    ),
    ("users not UTF-8", "users", lambda c, u, g: u.write_bytes(u.read_bytes() + b"# \xe9\n")),
    ("users over 1 MiB", "users", lambda c, u, g: u.write_text(u.read_text() + "#" * 2 * MIB)),
    ("users a FIFO", "users", lambda c, u, g: replace_with(u, os.mkfifo)),
]


@pytest.mark.parametrize(
    ("what", "named", "spoil"), RELOAD_CASES, ids=[case[0] for case in RELOAD_CASES]
)
def test_sighup_with_a_bad_file_keeps_serving_the_old_config(
    agent: Agent, what: str, named: str, spoil: Callable[[Path, Path, str], object]
) -> None:
    """reload_failed (naming the file), reload_successful 0, /healthz and /metrics still
    answer; the good file back and another SIGHUP: 1 again. Today the first three kill the
    agent (exit 3), the FIFOs block the reload for ever, the others are accepted."""
    good = agent.config.read_text()
    users = agent.users.read_bytes()
    try:
        spoil(agent.config, agent.users, good)
        mark = agent.hup()
        wait_for(lambda: RELOAD_FAILED in agent.metrics(), 30, f"reload to fail ({what})")
        assert agent.process.poll() is None
        assert agent.get("/healthz")[0] == 200
        path = agent.config if named == "config" else agent.users
        [line] = wait_for(lambda: agent.logged(mark, "event=reload_failed"), 10, "the log line")
        assert "level=error" in line and str(path) in line, line
        assert not [line for line in agent.log[mark:] if "Traceback" in line]
    finally:
        replace_with(agent.config, lambda p: p.write_text(good))
        replace_with(agent.users, lambda p: p.write_bytes(users))
    mark = agent.hup()
    wait_for(lambda: agent.logged(mark, "event=reloaded"), 30, "the good file to load again")
    assert RELOAD_OK in agent.metrics()


def test_sighup_applies_a_new_nvml_timeout(agent: Agent) -> None:
    """Today the running NVML session keeps the old deadline and the reload reports
    success all the same."""
    good = agent.config.read_text()
    try:
        agent.config.write_text(good.replace("nvml_timeout = 2", "nvml_timeout = 0.5"))
        mark = agent.hup()
        [line] = wait_for(lambda: agent.logged(mark, "event=reloaded"), 30, "the reload")
        assert "nvml_timeout_s=0.5" in line, line
    finally:
        agent.config.write_text(good)
    mark = agent.hup()
    [line] = wait_for(lambda: agent.logged(mark, "event=reloaded"), 30, "the reload back")
    assert "nvml_timeout_s=2" in line, line


def test_the_command_line_nvml_timeout_wins_over_the_file(
    cpu_only: Node, tmp_path: Path, workdir: Path
) -> None:
    """--nvml-timeout 1.5 with nvml_timeout = 2 in the file: 1.5, also after a SIGHUP.
    Today the file's value wins."""
    (tmp_path / "users").write_text((workdir / "users").read_text())
    port = free_port()
    agent = start_agent(
        cpu_only, tmp_path, port, good_config(tmp_path, port), "--nvml-timeout", "1.5"
    )
    try:
        [started] = agent.logged(0, "event=starting")
        assert "nvml_timeout_s=1.5" in started, started
        mark = agent.hup()
        [line] = wait_for(lambda: agent.logged(mark, "event=reloaded"), 30, "the reload")
        assert "nvml_timeout_s=1.5" in line, line
    finally:
        stop_agent(agent)


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def test_sighup_reloads_replaced_tls_files(cpu_only: Node, tmp_path: Path, workdir: Path) -> None:
    """certbot or cert-manager replaced the files: new connections get the new certificate.
    Unusable new files: reload_failed naming the file, the old certificate still served.
    Needs the server's reload_tls() (the web branch); today the old certificate stays."""
    (tmp_path / "users").write_text((workdir / "users").read_text())
    cert, key = certificate(tmp_path, "a")
    port = free_port()
    extra = f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    agent = start_agent(cpu_only, tmp_path, port, good_config(tmp_path, port, extra), tls=True)
    try:
        assert served_certificate(port) == der(cert)
        new_cert, new_key = certificate(tmp_path, "renewed")
        original = der(cert)
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes(new_key.read_bytes())
        mark = agent.hup()
        wait_for(lambda: agent.logged(mark, "event=reload"), 30, "the reload")
        assert agent.logged(mark, "event=reloaded"), agent.log[mark:]
        assert served_certificate(port) == der(new_cert) != original
        # A key that does not belong to the certificate: refused, the renewed one kept.
        key.write_bytes(certificate(tmp_path, "other")[1].read_bytes())
        mark = agent.hup()
        [line] = wait_for(lambda: agent.logged(mark, "event=reload_failed"), 30, "refusal")
        assert str(key) in line or str(cert) in line, line
        assert served_certificate(port) == der(new_cert)
        assert agent.process.poll() is None
    finally:
        stop_agent(agent)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("garbage", "Invalid value for '--listen': expected host:port"),
        (":99999", "Invalid value for '--listen': port 99999 out of range"),
        ("[zz]:1", "Invalid value for '--listen': not an IPv6 address"),
        ("nosuchhost.invalid:19410", "cannot listen on nosuchhost.invalid:19410: host not found"),
        ("192.0.2.1:19410", "cannot listen on 192.0.2.1:19410: address not available"),
        ("127.0.0.1:BUSY", "cannot listen on 127.0.0.1:BUSY: address in use"),
    ],
)
def test_an_address_it_cannot_listen_on_is_exit_2_naming_it(
    cpu_only: Node, tmp_path: Path, busy_port: int, listen: str, message: str
) -> None:
    """Today: exit 3 "internal error" without the address. 192.0.2.1 is TEST-NET-1 (RFC
    5737): no interface here has it. For the configuration's listen too."""
    listen = listen.replace("BUSY", str(busy_port))
    message = message.replace("BUSY", str(busy_port))
    for args in (["--listen", listen], []):
        config = tmp_path / "config.toml"
        config.write_text(f'[agent]\nlisten = "{listen}"\n' if not args else "")
        done = subprocess.run(
            [*AGENT, *cpu_only.cli_args, "agent", "--config", str(config), *args],
            env={**os.environ, **cpu_only.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        expected = message if args or "cannot listen" in message else f"{config}:2: agent.listen"
        assert expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def _healthy(port: int) -> bool:
    """/healthz answers 200; a 503 (the agent up, its first checks not yet run: on a loaded
    machine they take a while) is "not yet"."""
    if not _connects(port):
        return False
    try:
        return bool(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
        )
    except urllib.error.HTTPError as err:
        if err.code == 503:
            return False
        raise


def test_the_agent_says_where_it_listens_and_that_it_is_open(
    cpu_only: Node, tmp_path: Path
) -> None:
    """`make run` printed nothing: now the listening address at the default level, and a
    warning when it serves every interface without TLS or basic auth."""
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text("")
    process = subprocess.Popen(
        [*AGENT, *cpu_only.cli_args, "agent", "--config", str(config), "--listen", f":{port}"],
        env={**os.environ, **cpu_only.env},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def read_log() -> None:
        assert process.stderr is not None
        lines.extend(line.rstrip("\n") for line in process.stderr)

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: _healthy(port),
            60,
            "the agent to serve",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        reader.join(10)
    listening = [line for line in lines if "event=listening" in line]
    assert listening == [
        f"level=info logger=nodecheck.agent.daemon.agent event=listening "
        f"address=http://0.0.0.0:{port}/metrics"
    ], lines
    [warning] = [line for line in lines if "event=unprotected" in line]
    assert warning.startswith("level=warning") and "without TLS or basic auth on all" in warning
    assert not [line for line in lines if "Traceback" in line or not line.startswith("level=")]


def test_an_empty_listen_says_that_no_server_runs(cpu_only: Node, tmp_path: Path) -> None:
    """`--listen ""` (as `listen = ""`) runs the checks and serves nothing: it said
    `event=ready` and nothing else, as if it served. Now `event=no_server` says so."""
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nresults_file = "{tmp_path / "results.json"}"\n')
    log = tmp_path / "agent.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*AGENT, *cpu_only.cli_args, "agent", "--config", str(config), "--listen", ""],
            env={**os.environ, **cpu_only.env},
            stdin=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        wait_for(lambda: "event=ready" in log.read_text(), 60, "the agent to be ready")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    lines = log.read_text().splitlines()
    [no_server] = [line for line in lines if "event=no_server" in line]
    assert no_server.startswith("level=info logger=nodecheck.agent.daemon.agent event=no_server")
    assert not [line for line in lines if "event=listening" in line or "Traceback" in line]
    shown = subprocess.run([*AGENT, "agent", "--help"], capture_output=True, text=True, check=True)
    assert '"" for no server' in " ".join(shown.stdout.split())


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def test_a_garbage_watchdog_interval_costs_nothing(cpu_only: Node, tmp_path: Path) -> None:
    """WATCHDOG_USEC=abc: ignored with one warning (its value not logged). Today int()
    raises in the background thread, which dies with a traceback on stderr, and with it
    the textfile writer: nodecheck.prom never appears."""
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nlisten = "127.0.0.1:{port}"\ntextfile_dir = "{textfile}"\n')
    process = subprocess.Popen(
        [*AGENT, *node_args(cpu_only), "agent", "--config", str(config)],
        env={**os.environ, **cpu_only.env, "WATCHDOG_USEC": "abc"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for((textfile / "nodecheck.prom").exists, 60, "the textfile")
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert "Traceback" not in stderr, stderr
    assert "event=watchdog_ignored" in stderr and "abc" not in stderr, stderr


BAG_ATTRIBUTES = "Bag Attributes\n    friendlyName: café\n    localKeyID: 01 02\n"


def test_a_certificate_with_utf8_bag_attributes_is_served_and_a_broken_one_named(
    cpu_only: Node, tmp_path: Path, workdir: Path
) -> None:
    """openssl pkcs12's "Bag Attributes: friendlyName: café" before the certificate: the
    agent starts and serves it. A certificate with a non-ASCII byte inside its block: at
    start, exit 2 naming the file; on SIGHUP, reload_failed naming it, the old one kept.
    (Before: start and reload failed on a TypeError: exit 3 "internal error".)"""
    (tmp_path / "users").write_text((workdir / "users").read_text())
    cert, key = certificate(tmp_path, "a")
    served = der(cert)
    original = cert.read_text()
    cert.write_text(BAG_ATTRIBUTES + original, encoding="utf-8")
    port = free_port()
    extra = f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    agent = start_agent(cpu_only, tmp_path, port, good_config(tmp_path, port, extra), tls=True)
    try:
        assert served_certificate(port) == served
        lines = original.splitlines(keepends=True)
        cert.write_text("".join([*lines[:2], "é\n", *lines[2:]]), encoding="utf-8")
        mark = agent.hup()
        [line] = wait_for(lambda: agent.logged(mark, "event=reload_failed"), 30, "refusal")
        assert str(cert) in line and "TypeError" not in line, line
        assert served_certificate(port) == served
    finally:
        stop_agent(agent)
    done = subprocess.run(
        [*AGENT, *node_args(cpu_only), "agent", "--config", str(agent.config)],
        env={**os.environ, **cpu_only.env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{cert}: certificate 1 of the file has bytes outside ASCII" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


class BrokenCollector:
    """A collector with a bug: rendering the exposition raises something not an OSError."""

    def collect(self) -> Iterator[object]:
        raise RuntimeError("a bug in a collector")


def test_a_textfile_failure_of_any_kind_does_not_stop_the_watchdog_pings(
    cpu_only: Node,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """write_textfile raising something other than OSError: one event=textfile_failed
    line, and WATCHDOG=1 keeps coming (the same thread sends it). (Before: the exception
    ended the thread: no more pings, and systemd would restart the agent.)"""
    from prometheus_client.registry import CollectorRegistry

    from nodecheck.agent.daemon.agent import Agent as RealAgent

    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    messages: list[bytes] = []

    def collect() -> None:  # as systemd does: a full queue would block the agent's sends
        with contextlib.suppress(OSError):
            while True:
                messages.append(listener.recv(4096))

    threading.Thread(target=collect, daemon=True).start()
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_path))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{free_port()}"\ntextfile_dir = "{textfile}"\n'
        "[checks.cpu]\ninterval = 5\n"
    )
    library = str(cpu_only.nvml_library) if cpu_only.nvml_library else None
    agent = RealAgent(cpu_only.fs, config, library)
    broken = CollectorRegistry(auto_describe=False)
    broken.register(BrokenCollector())  # type: ignore[arg-type]
    agent.registry = broken
    caplog.set_level("ERROR", logger="nodecheck.agent.daemon.agent")
    agent.start()
    try:
        # One ping a second (half of WATCHDOG_USEC): the textfile fails after the first.
        wait_for(lambda: messages.count(b"WATCHDOG=1") >= 5, 60, "five watchdog pings")
        lines = [r.getMessage() for r in caplog.records if "textfile_failed" in r.getMessage()]
        assert lines and "RuntimeError: a bug in a collector" in lines[0], lines
    finally:
        agent.stop()
        listener.close()


@NEEDS_PROMTOOL
def test_results_that_cannot_be_written_make_healthz_503_until_they_can(
    cpu_only: Node, tmp_path: Path
) -> None:
    """The results file's folder is a file (root or not, nothing can be written under
    it): /healthz 503 saying why (/livez 200), nodecheck_results_last_write_successful 0 and the
    failures counted, one event=results_write_failed line however many runs fail; the
    folder made: /healthz 200, 1, the file written, one event=results_written line; a
    file in its place again: logged again. (Before: one log line, /healthz 200, nothing
    in /metrics.)"""
    from tests.agent.test_daemon import get
    from tests.fixtures.agent_process import start_agent as start_process

    folder = tmp_path / "results"
    folder.write_text("a file where the folder should be\n")
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{port}"\nnvml_timeout = 2\n'
        f'results_file = "{folder / "results.json"}"\n[checks.cpu]\ninterval = 1\n'
    )
    log = tmp_path / "agent.log"
    process = start_process(node_args(cpu_only), config, {**os.environ, **cpu_only.env}, log)
    url = f"http://127.0.0.1:{port}"

    def answer(path: str) -> tuple[int, str]:
        if process.poll() is not None:
            pytest.fail("the agent exited:\n" + log.read_text())
        try:
            status, body = get(url + path)
        except OSError:
            return 0, ""
        return status, body.decode()

    def failures() -> float:
        found = re.search(
            r"^nodecheck_results_write_failures_total (\S+)$", answer("/metrics")[1], re.M
        )
        return float(found.group(1)) if found else -1

    def lines(event: str) -> list[str]:
        return [line for line in log.read_text().splitlines() if f"event={event} " in line]

    try:
        wait_for(lambda: answer("/healthz")[0] == 503, 60, "/healthz 503")
        assert answer("/healthz")[1] == (
            "results file not written: a component of the path is not a directory\n"
        )
        assert answer("/livez") == (200, "ok\n")  # the liveness probe: no restart for it
        assert "nodecheck_results_last_write_successful 0.0" in answer("/metrics")[1]
        assert promtool_problems(answer("/metrics")[1]) == ""
        wait_for(lambda: failures() >= 3, 60, "three failed writes")
        assert len(lines("results_write_failed")) == 1, lines("results_write_failed")
        assert lines("results_write_failed")[0].startswith("level=error ")

        folder.unlink()
        folder.mkdir()
        wait_for(lambda: answer("/healthz") == (200, "ok\n"), 60, "/healthz 200 again")
        assert "nodecheck_results_last_write_successful 1.0" in answer("/metrics")[1]
        assert json.loads((folder / "results.json").read_text())["checks"]
        assert len(lines("results_written")) == 1

        (folder / "results.json").unlink()
        folder.rmdir()
        folder.write_text("a file again\n")
        wait_for(lambda: answer("/healthz")[0] == 503, 60, "/healthz 503 again")
        wait_for(lambda: len(lines("results_write_failed")) == 2, 60, "the failure logged again")
        assert "Traceback" not in log.read_text()
    finally:
        process.terminate()
        process.wait(20)
