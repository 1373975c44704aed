"""Prometheus exposition of the cached results: over HTTP and as a textfile.

Built fresh on every scrape from the ResultStore (the prometheus_client
custom-collector pattern): a scrape never runs a check, and one check's odd
sample never fails the scrape (it is left out, and logged).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from nodecheck.agent.report import check_document
from nodecheck.agent.scheduler import ResultStore
from nodecheck.checks.node.fs import write_atomically
from nodecheck.checks.result import MetricSpec, Sample, Status, worst

log = logging.getLogger(__name__)
STATUSES = [status.value for status in Status]
TEXTFILE_NAME = "nodecheck.prom"


class ResultCollector(Collector):
    def __init__(self, store: ResultStore, version: str, reload_ok: Callable[[], bool]) -> None:
        self.store = store
        self.version = version
        self.reload_ok = reload_ok

    def collect(self) -> Iterator[Metric]:
        runs = self.store.all()
        status = GaugeMetricFamily(
            "nodecheck_check_status",
            "1 for the status of the latest result of this check on this subject",
            labels=["check", "subject", "status"],
        )
        success = GaugeMetricFamily(
            "nodecheck_check_run_success",
            "1 when the check ran to completion (no crash, no timeout)",
            labels=["check"],
        )
        duration = GaugeMetricFamily(
            "nodecheck_check_duration_seconds", "How long the last run took", labels=["check"]
        )
        last = GaugeMetricFamily(
            "nodecheck_check_last_run_timestamp_seconds",
            "When the last run finished",
            labels=["check"],
        )
        interval = GaugeMetricFamily(
            "nodecheck_check_interval_seconds", "How often the check runs", labels=["check"]
        )
        families: dict[str, tuple[MetricSpec, list[Sample]]] = {}
        for stored in runs:
            run = stored.run
            name = run.check.name
            success.add_metric([name], 1 if run.completed else 0)
            duration.add_metric([name], run.duration_s)
            last.add_metric([name], stored.finished_at)
            interval.add_metric([name], stored.interval_s)
            # A check may judge one subject several ways (cpu: governor and SMT on
            # "node"): one series per subject, with the worst of its statuses.
            by_subject: dict[str, Status] = {}
            for result in run.results:
                previous = by_subject.get(result.subject, Status.SKIP)
                by_subject[result.subject] = worst([previous, result.status])
                for sample in result.samples:
                    families.setdefault(sample.metric.name, (sample.metric, []))[1].append(sample)
            for subject, current in by_subject.items():
                for value in STATUSES:
                    status.add_metric([name, subject, value], int(current.value == value))
        yield from (status, success, duration, last, interval)
        for spec, samples in families.values():
            family = _family(spec, samples)
            if family is not None:
                yield family
        info = GaugeMetricFamily(
            "nodecheck_build_info", "nodecheck's version, value 1", labels=["version", "python"]
        )
        info.add_metric([self.version, platform.python_version()], 1)
        yield info
        reload_ok = GaugeMetricFamily(
            "nodecheck_config_last_reload_successful",
            "1 when the last configuration (re)load succeeded",
        )
        reload_ok.add_metric([], 1 if self.reload_ok() else 0)
        yield reload_ok


def _family(spec: MetricSpec, samples: list[Sample]) -> Metric | None:
    """One family from a check's samples; None (logged) when they do not fit its labels."""
    from prometheus_client.core import CounterMetricFamily

    name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
    maker = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    family = maker(name, spec.help, labels=list(spec.labels))
    # The same series from two checks (the benchmarks' shared skip counters): the
    # larger value, which for a counter is the fresher.
    values: dict[tuple[str, ...], float] = {}
    for sample in samples:
        key = tuple(str(sample.labels.get(label, "")) for label in spec.labels)
        if set(sample.labels) - set(spec.labels):
            log.warning("event=bad_sample metric=%s labels=%r", spec.name, dict(sample.labels))
            continue
        values[key] = max(values.get(key, sample.value), sample.value)
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family


def make_registry(collector: ResultCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class CachedExposition:
    """The rendered /metrics, rebuilt only when a result changed: results change once per
    check interval, scrapes come far more often (and from several Prometheus servers).
    Every value in it is absolute (timestamps, not ages), so a cached copy is exact."""

    def __init__(self, registry: CollectorRegistry, store: ResultStore, key: Callable[[], object]):
        self.registry = registry
        self.store = store
        self.key = key  # anything else the text depends on (the reload flag)
        self._cached: tuple[object, bytes] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        key = (self.store.generation, self.key())
        with self._lock:
            if self._cached is None or self._cached[0] != key:
                self._cached = (key, exposition(self.registry))
            return self._cached[1]


def write_textfile(directory: Path, registry: CollectorRegistry) -> None:
    """node_exporter's textfile collector reads *.prom: replaced atomically, so it never
    reads half a file; world-readable, as node_exporter runs as another user."""
    write_atomically(directory / TEXTFILE_NAME, exposition(registry).decode(), mode=0o644)


def results_document(store: ResultStore, hostname: str) -> dict[str, Any]:
    """/results: the nodecheck.check/v1 document of `nodecheck check`, plus each check's age."""
    stored = store.all()
    document = check_document(hostname, [s.run for s in stored])
    now = time.time()
    ages = {s.run.check.name: round(now - s.finished_at, 3) for s in stored}
    results: list[dict[str, Any]] = document["results"]  # type: ignore[assignment]
    for result in results:
        result["age_seconds"] = ages.get(result["check"])
    return document


def parse_basic_auth(text: str, source: str) -> dict[str, bytes]:
    """ "user:<bcrypt hash>" lines (htpasswd -B; blank lines and # comments skipped)."""
    users: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, _, hashed = line.partition(":")
        if not user or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ValueError(f"{source}:{number}: expected user:<bcrypt hash>")
        users[user] = hashed.encode()
    if not users:
        raise ValueError(f"{source}: no users")
    return users


class BasicAuth:
    """Checks Authorization headers against bcrypt hashes; a good pair is remembered (by a
    salted digest, never the password) so each scrape does not pay bcrypt's cost again."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users
        self._good: set[bytes] = set()
        self._salt = os.urandom(16)
        self._lock = threading.Lock()

    @property
    def users(self) -> dict[str, bytes]:
        return self._users

    @users.setter
    def users(self, users: dict[str, bytes]) -> None:
        """New users (a reload): every remembered password is forgotten with the old ones."""
        with self._lock:
            self._users = users
            self._good.clear()

    def allows(self, header: str | None) -> bool:
        import base64
        import hashlib

        import bcrypt

        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        digest = hashlib.sha256(self._salt + header.encode()).digest()
        with self._lock:
            if digest in self._good:
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._good.add(digest)
        return True


def serve(
    listen: str,
    metrics: Callable[[], bytes],
    results: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
    tls: tuple[Path, Path] | None = None,
    auth: BasicAuth | None = None,
) -> ThreadingHTTPServer:
    """Start the HTTP(S) server on a thread: /metrics, /results (behind basic auth when
    configured) and /healthz (never: it tells nothing but whether the agent lives)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"

    class Handler(BaseHTTPRequestHandler):
        server_version = "nodecheck"
        timeout = 10  # a client that sends nothing does not hold a thread for ever

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if (
                auth is not None
                and path != "/healthz"
                and not auth.allows(self.headers.get("Authorization"))
            ):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="nodecheck"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path == "/metrics":
                self._send(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                ok = healthy()
                self._send(
                    200 if ok else 503, b"ok\n" if ok else b"scheduler stalled\n", "text/plain"
                )
            elif path == "/results":
                body = json.dumps(results(), indent=2, default=str).encode()
                self._send(200, body, "application/json")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /results\n", "text/plain")

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("event=http " + format, *args)

    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(tls[0]), str(tls[1]))

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

        def get_request(self) -> tuple[socket.socket, Any]:
            connection, address = self.socket.accept()
            if context is not None:
                # The handshake happens on the request's own thread at its first read,
                # never in accept(): a client that connects and stays silent must not
                # stop the server (or its shutdown).
                connection = context.wrap_socket(
                    connection, server_side=True, do_handshake_on_connect=False
                )
            return connection, address

    server = Server((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
